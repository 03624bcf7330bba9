"""HF directory -> workdir checkpoint -> HF directory, and the workdir's clear errors."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest
import torch
import transformers

from encoder_jax.api import pretrain

from encoder_jax.run import checkpointing
from encoder_jax.config import schema as config_base
from encoder_jax import convert
from encoder_jax.loading import loaded as loading
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.interop import tokenizer as tokenizer_io
from encoder_jax.models import bert

from support import hf_fixtures


# intermediate_size is even so that tensor=2 can split it; the rest is odd.
SHAPE = dict(hidden_size=30, num_layers=2, num_heads=5, intermediate_size=38, max_positions=32)


@pytest.fixture(scope='module')
def imported(tmp_path_factory):
  """(hf_dir, workdir, HF model): a random BertForPreTraining with a small real vocab."""
  return hf_fixtures.make_workdir(str(tmp_path_factory.mktemp('convert')), **SHAPE)


def test_workdir_layout_and_config(imported):
  hf_dir, workdir, model = imported
  for name in ('config.json', 'config.py', 'vocab.txt', 'import_report.txt'):
    assert os.path.exists(os.path.join(workdir, name)), name
  config = loading.read_run_config(workdir)
  assert config.model.hidden_size == 30 and config.model.num_layers == 2
  assert config.model.vocab_size == model.config.vocab_size
  assert config.tokenizer.kind == 'wordpiece'
  assert config.tokenizer.path == os.path.join(os.path.abspath(workdir), 'vocab.txt')
  assert max(config.train.seq_lens) <= 32  # Fits the imported max_position_embeddings.
  tok, counts = workdir_lib.load_tokenizer(workdir)  # Pinned: the workdir is self-contained.
  assert tok.kind == 'wordpiece' and tok.sha256() == tokenizer_io.wordpiece(
      os.path.join(hf_dir, 'vocab.txt')).sha256() and counts is None


def test_restored_checkpoint_computes_what_transformers_computes(imported):
  _, workdir, model = imported
  loaded = loading.load_workdir(workdir)
  assert loaded.step == 0
  tok = loaded.tokenizer
  texts = ['the cat sat on the mat.', 'john works at google in london, not paris!']
  rows = [[tok.cls_id, *tok.encode(t), tok.sep_id] for t in texts]
  length = max(map(len, rows))
  ids = np.array([r + [tok.pad_id] * (length - len(r)) for r in rows], np.int32)
  mask = (np.arange(length)[None] < np.array([len(r) for r in rows])[:, None]).astype(np.int32)
  assert tok.unk_id not in ids
  out = bert.BertForPreTraining(loaded.model_config).apply(
      {'params': loaded.params}, ids, np.zeros_like(ids), mask)
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long())
  sel = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out['mlm_logits'])[sel],
                             theirs.prediction_logits.numpy()[sel], atol=1e-4)
  np.testing.assert_allclose(out['pair_logits'], theirs.seq_relationship_logits, atol=1e-4)


def test_workdir_to_hf_round_trip(imported, tmp_path):
  hf_dir, workdir, model = imported
  message = convert.workdir_to_hf(workdir, str(tmp_path))
  assert 'vocab.txt' in message
  loaded, info = transformers.BertForPreTraining.from_pretrained(str(tmp_path),
                                                                 output_loading_info=True)
  assert not any(info.values()), info
  for k, v in model.state_dict().items():
    np.testing.assert_array_equal(loaded.state_dict()[k].numpy(), v.numpy(), err_msg=k)
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  ours = loading.load_workdir(workdir).tokenizer
  text = 'The Cat sat on the mat in Paris.'
  assert hf_tok(text)['input_ids'] == [ours.cls_id, *ours.encode(text), ours.sep_id]
  del hf_dir


def test_import_refuses_a_non_empty_workdir(imported):
  hf_dir, workdir, _ = imported
  with pytest.raises(FileExistsError, match='already holds checkpoints'):
    convert.hf_to_workdir(hf_dir, workdir)


def test_missing_workdir_or_checkpoint(tmp_path):
  with pytest.raises(FileNotFoundError, match='does not exist'):
    loading.load_workdir(str(tmp_path / 'nope'))
  empty = tmp_path / 'empty'
  os.makedirs(empty / 'checkpoints')
  config = config_base.base_config()
  with pytest.raises(checkpointing.CheckpointError, match='holds no checkpoint'):
    loading.load_workdir(str(empty), config)
  with pytest.raises(FileNotFoundError, match='config.json not found'):
    loading.load_workdir(str(empty))


def test_config_of_another_shape_is_a_clear_error(imported):
  _, workdir, _ = imported
  config = loading.read_run_config(workdir)
  config.model.update(hidden_size=40, num_heads=4)
  with pytest.raises(checkpointing.CheckpointError,
                     match=r'does not match checkpoint step 0.*checkpoint \(.*30.*config.*40'):
    loading.load_workdir(workdir, config)
  config = loading.read_run_config(workdir)
  with pytest.raises(checkpointing.CheckpointError, match='no checkpoint for step 7'):
    loading.load_workdir(workdir, config, step=7)


def test_restores_onto_a_sharded_mesh(imported):
  """A checkpoint restores with this machine's shardings: here tensor=2 over 8 CPU devices."""
  _, workdir, _ = imported
  if jax.device_count() < 2:
    pytest.skip('needs several (simulated) devices')
  config = loading.read_run_config(workdir)
  config.mesh.update(data=-1, fsdp=1, tensor=2)
  loaded = loading.load_workdir(workdir, config)
  kernel = loaded.params['encoder']['layers']['intermediate']['kernel']
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, None, 'tensor')  # d_ff split.
  host = loading.load_workdir(workdir).params['encoder']['layers']['intermediate']['kernel']
  np.testing.assert_array_equal(np.asarray(kernel), np.asarray(host))


@pytest.mark.slow  # ~20 s: prepares a corpus and compiles a train step.
def test_main_continues_pretraining_from_the_import(imported, tmp_path):
  """pretrain.run (what main runs) resumes from the imported step 0."""
  _, workdir, _ = imported
  run = str(tmp_path / 'run')
  shutil.copytree(workdir, run)
  corpus = hf_fixtures.write_corpus(str(tmp_path / 'corpus.txt'))
  config = hf_fixtures.tiny_run_config(run, corpus, str(tmp_path / 'prepared'))
  metrics = pretrain.run(config, run).metrics
  assert metrics['mlm_predictions'] > 0 and np.isfinite(metrics['loss'])
  assert sorted(os.listdir(os.path.join(run, 'checkpoints'))) == ['0', '1', '2']
  before = loading.load_workdir(run, config, step=0, with_tokenizer=False).params
  after = loading.load_workdir(run, config, step=2, with_tokenizer=False).params
  diff = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                      before, after)
  # Two AdamW steps at lr <= 1e-4 move every weight a little: it continued, not restarted.
  assert 0 < max(jax.tree.leaves(diff)) < 1e-3
