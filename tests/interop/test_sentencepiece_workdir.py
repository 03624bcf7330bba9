"""A workdir trained with the default SentencePiece tokenizer: pinned tokenizer, HF round trip."""

from __future__ import annotations

import json
import os
import shutil
import types

import jax
import numpy as np
import pytest
import torch
import transformers

from encoder_jax.api import pretrain

from encoder_jax import convert
from encoder_jax import evaluate
from encoder_jax.loading import inference
from encoder_jax.loading import loaded as loading
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.interop import hf_import
from encoder_jax.models import bert

import support
from support import tiny_config

ROOT = support.ROOT

pytestmark = [pytest.mark.slow,  # Every test reads the module's training run (``run``).
              pytest.mark.any_device_count]  # tests/support/device_workers.py

SENTENCES = [
    'The quick brown fox jumps over the lazy dog.',
    'Python is a programming language; its standard library is large.',
    "Don't panic:  it's only 3.14% of the data, naïve café résumé!",
    'UPPER and lower CASE, tabs\tand   spaces.',
]


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """(workdir, config, prepared_dir): tiny_config trained 2 steps, evaluated at step 2."""
  root = tmp_path_factory.mktemp('sentencepiece')
  prepared = str(root / 'prepared')
  config = tiny_config.get_config(f'prepared_dir={prepared}')
  config.train.update(num_steps=2, seq_lens=(32,), max_predictions=(5,), phase_fractions=(1.0,),
                      eval_every_steps=2, eval_batches=2)
  config.checkpoint.update(every_steps=2, async_save=False)
  workdir = str(root / 'workdir')
  pretrain.run(config, workdir)
  return workdir, config, prepared


def _ours(workdir):
  return loading.load_workdir(workdir)


def _ids(tok, text):
  return [tok.cls_id, *tok.encode(text), tok.sep_id]


def test_tools_read_the_pinned_tokenizer_without_the_prepared_data(run, tmp_path, monkeypatch):
  workdir, _, prepared = run
  pinned = json.loads(workdir_lib.path(workdir, 'tokenizer', 'tokenizer.json').read_text())
  assert pinned['kind'] == 'sentencepiece'
  moved = str(tmp_path / 'moved')
  shutil.move(prepared, moved)  # Whatever the cache holds now: the workdir is self-contained.
  monkeypatch.chdir(tmp_path)
  try:
    loaded = _ours(workdir)
    assert loaded.tokenizer.kind == 'sentencepiece'
    assert loaded.tokenizer.sha256() == pinned['sha256']
    assert not os.path.exists(prepared)  # Nothing was prepared.
    got = inference.fill_mask(loaded.params, loaded.model_config, loaded.tokenizer,
                              'The [MASK] is here.', top_k=2)
    assert len(got) == 1 and len(got[0]) == 2
  finally:
    shutil.move(moved, prepared)


def test_evaluate_matches_the_training_time_eval(run):
  workdir, config, _ = run
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    logged = [r for r in map(json.loads, f) if r.get('split') == 'eval' and r['step'] == 2][-1]
  got = evaluate.evaluate_checkpoint(loading.read_run_config(workdir), workdir)
  assert got['step'] == 2 and got['batches'] == 2 and got['batch_size'] == 8
  for k in ('mlm_loss', 'mlm_accuracy', 'mlm_predictions', 'pair_loss'):
    assert np.isclose(got[k], logged[k], rtol=1e-6), (k, got[k], logged[k])
  small = evaluate.evaluate_checkpoint(config, workdir, batch_size=4, eval_batches=1,
                                       devices=jax.devices()[:1])
  assert (small['batches'], small['batch_size'], small['sequences']) == (1, 4, 4)


def test_evaluate_refuses_data_tokenized_otherwise(run, tmp_path):
  workdir, _, _ = run
  pinned = _ours(workdir).tokenizer
  other = tmp_path / 'tokenizer.model'
  other.write_bytes(open(pinned.path, 'rb').read() + b'\0')
  fake = types.SimpleNamespace(directory='/elsewhere', tokenizer=types.SimpleNamespace(
      path=str(other), sha256=lambda: 'f' * 64))
  with pytest.raises(ValueError, match=r'/elsewhere.*not with the tokenizer .* was trained'):
    evaluate.check_prepared_tokenizer(workdir, pinned, fake)


def test_hf_export_tokenizes_and_computes_as_we_do(run, tmp_path):
  workdir, _, _ = run
  out = str(tmp_path / 'hf')
  message = convert.workdir_to_hf(workdir, out)
  assert 'tokenizer.json' in message and 'tokenizer.model' in message
  ours = _ours(workdir)
  tok = ours.tokenizer
  hf_tok = transformers.AutoTokenizer.from_pretrained(out)
  assert (hf_tok.pad_token_id, hf_tok.unk_token_id, hf_tok.cls_token_id, hf_tok.sep_token_id,
          hf_tok.mask_token_id) == (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id)
  for text in SENTENCES:
    assert hf_tok(text)['input_ids'] == _ids(tok, text), text
  pair = hf_tok(SENTENCES[0], SENTENCES[1])
  a, b = tok.encode(SENTENCES[0]), tok.encode(SENTENCES[1])
  assert pair['input_ids'] == [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
  assert pair['token_type_ids'] == [0] * (len(a) + 2) + [1] * (len(b) + 1)

  model, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
  assert not any(info.values()), info
  batch = hf_tok(SENTENCES[:2], padding=True, return_tensors='np')
  with torch.no_grad():
    theirs = model.eval()(**{k: torch.tensor(v).long() for k, v in batch.items()})
  mine = bert.BertForPreTraining(ours.model_config).apply(
      {'params': ours.params}, batch['input_ids'], batch['token_type_ids'],
      batch['attention_mask'])
  real = batch['attention_mask'].astype(bool)
  np.testing.assert_allclose(np.asarray(mine['mlm_logits'])[real],
                             theirs.prediction_logits.numpy()[real], atol=1e-4)
  np.testing.assert_allclose(mine['pair_logits'], theirs.seq_relationship_logits, atol=1e-4)

  # --hf_dir loading reads the SentencePiece model.
  loaded = hf_import.load_hf_dir(out)
  assert loaded.tokenizer.kind == 'sentencepiece'
  assert loaded.tokenizer.encode(SENTENCES[2]) == tok.encode(SENTENCES[2])

  # And back: the same params and the same tokenizer, pinned.
  back = str(tmp_path / 'back')
  convert.hf_to_workdir(out, back)
  config = loading.read_run_config(back)
  assert config.tokenizer.kind == 'sentencepiece'
  assert workdir_lib.has_pinned_tokenizer(back)
  again = loading.load_workdir(back)
  assert again.tokenizer.sha256() == tok.sha256()
  for text in SENTENCES:
    assert _ids(again.tokenizer, text) == _ids(tok, text)
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(ours.params)[0],
                          jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))


def test_workdir_without_a_pinned_tokenizer(run, tmp_path):
  workdir, _, prepared = run
  old = str(tmp_path / 'old')
  shutil.copytree(workdir, old)
  shutil.rmtree(os.path.join(old, 'tokenizer'))  # As written before pinning existed.
  with pytest.raises(FileNotFoundError, match=r'no pinned tokenizer.*convert pin_tokenizer'):
    loading.load_workdir(old)
  with pytest.raises(FileNotFoundError, match='no pinned tokenizer'):
    evaluate.evaluate_checkpoint(loading.read_run_config(old), old)
  message = convert.pin_tokenizer(old, os.path.join(prepared, 'tokenizer.model'))
  assert 'Pinned' in message
  assert loading.load_workdir(old).tokenizer.sha256() == _ours(workdir).tokenizer.sha256()
