"""fill_mask (top-k per [MASK], as transformers computes it) and embed (padding-invariant)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import numpy as np
import pytest
import torch
import transformers

from encoder_jax import convert
from encoder_jax import fill_mask
from encoder_jax.loading import inference
from encoder_jax.loading import loaded as loading
from encoder_jax.interop import hf_import

from support import hf_fixtures
from support import in_process


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

SHAPE = dict(hidden_size=30, num_layers=2, num_heads=5, intermediate_size=37, max_positions=40)


@pytest.fixture(scope='module')
def hf_dir_and_model(tmp_path_factory):
  hf_dir = str(tmp_path_factory.mktemp('hf'))
  vocab_size = hf_fixtures.write_vocab(os.path.join(hf_dir, 'vocab.txt'))
  model = hf_fixtures.random_hf_model(vocab_size=vocab_size, **SHAPE)
  model.save_pretrained(hf_dir)
  return hf_dir, model


@pytest.fixture(scope='module')
def loaded(hf_dir_and_model):
  return hf_import.load_hf_dir(hf_dir_and_model[0])


def test_fill_mask_matches_transformers(hf_dir_and_model, loaded):
  _, model = hf_dir_and_model
  text = 'The [MASK] sat on the mat in [MASK].'
  ids, _, positions = inference.tokenize_with_masks(loaded.tokenizer, text)
  assert [ids[p] for p in positions] == [loaded.tokenizer.mask_id] * 2
  got = inference.fill_mask(loaded.params, loaded.model_config, loaded.tokenizer, text, top_k=4)
  with torch.no_grad():
    logits = model(input_ids=torch.tensor([ids])).prediction_logits[0, positions]
  probs, top = torch.softmax(logits, -1).topk(4)
  assert len(got) == 2
  for row, p_row, i_row in zip(got, probs.numpy(), top.numpy()):
    assert [piece for piece, _ in row] == [loaded.tokenizer.id_to_piece(i) for i in i_row]
    np.testing.assert_allclose([p for _, p in row], p_row, atol=1e-5)
  assert '[MASK] #2' in fill_mask.format_predictions(text, got)


def test_fill_mask_needs_a_mask(loaded):
  with pytest.raises(ValueError, match=r'no \[MASK\]'):
    inference.fill_mask(loaded.params, loaded.model_config, loaded.tokenizer, 'no mask here')


@pytest.mark.parametrize('pooling', inference.POOLINGS)
def test_padding_never_changes_an_embedding(loaded, pooling):
  short = 'the cat sat.'
  long = 'john works at google in london and lives in paris, the capital of france.'
  alone = inference.embed_sentences(loaded.params, loaded.model_config, loaded.tokenizer, [short],
                                pooling=pooling)
  with_long = inference.embed_sentences(loaded.params, loaded.model_config, loaded.tokenizer,
                                    [long, short, long], pooling=pooling, batch_size=3)
  np.testing.assert_allclose(with_long[1], alone[0], atol=1e-5)
  np.testing.assert_allclose(with_long[0], with_long[2], atol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(with_long, axis=1), 1.0, atol=1e-5)
  assert not np.allclose(with_long[0], with_long[1], atol=1e-3)


def test_pooling_definitions(loaded, hf_dir_and_model):
  """cls = the [CLS] hidden state; mean = mean over real tokens (transformers' hidden states)."""
  _, model = hf_dir_and_model
  texts = ['the cat sat.', 'paris is a city.']
  tok = loaded.tokenizer
  raw = {p: inference.embed_sentences(loaded.params, loaded.model_config, tok, texts, pooling=p,
                                  normalize=False) for p in inference.POOLINGS}
  for i, t in enumerate(texts):
    ids = [tok.cls_id, *tok.encode(t), tok.sep_id]
    with torch.no_grad():
      h = model.bert(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
    np.testing.assert_allclose(raw['cls'][i], h[0], atol=1e-4)
    np.testing.assert_allclose(raw['mean'][i], h.mean(0), atol=1e-4)


def test_cli_outputs(hf_dir_and_model, tmp_path, capsys):
  """embed and fill_mask as ``python -m`` runs them, in this process (what they write and
  print is the point, not their process)."""
  hf_dir, _ = hf_dir_and_model
  sentences = tmp_path / 'sentences.txt'
  sentences.write_text('the cat sat on the mat.\nparis is the capital of france.\n\nhi\n')
  out = in_process.command(capsys, 'embed', f'--hf_dir={hf_dir}', f'--input={sentences}',
                           f'--output={tmp_path / "e.npy"}', '--pooling=cls', '--batch_size=2')
  assert out.returncode == 0, out.stderr[-3000:]
  emb = np.load(tmp_path / 'e.npy')
  assert emb.shape == (4, 30) and emb.dtype == np.float32  # Row i = line i, blank included.
  assert '1 of 4 inputs are blank (lines 3)' in out.stderr, out.stderr[-3000:]
  assert 'truncated' not in out.stderr
  assert "max_len 40 (the model's position limit) with cls pooling (--pooling)" in out.stdout, (
      out.stdout)
  out = in_process.command(capsys, 'fill_mask', f'--hf_dir={hf_dir}', '--text=the [MASK] sat.',
                           '--top_k=3')
  assert out.returncode == 0, out.stderr[-3000:]
  assert '[MASK] #1:' in out.stdout
  assert 'MLM head' not in out.stderr  # BertForPreTraining: its own head, no warning.


def test_blank_and_truncated_inputs_are_reported(loaded):
  tok = loaded.tokenizer
  long = ' '.join(['the cat sat on the mat'] * 10)
  encoded = inference.encode_sentences(tok, ['the cat.', '', '  \t', long], max_len=16)
  assert encoded.blank == [1, 2] and encoded.truncated == [3]
  assert [len(r) for r in encoded.rows] == [len(tok.encode('the cat.')) + 2, 2, 2, 16]
  assert encoded.rows[1] == [tok.cls_id, tok.sep_id]
  assert encoded.longest == len(tok.encode(long)) + 2
  blank, cut = encoded.warnings()
  assert '2 of 4 inputs are blank (lines 2, 3)' in blank
  assert f'1 of 4 inputs are longer than max_len=16 tokens and were truncated (lines 4; the ' \
         f'longest has {encoded.longest} tokens' in cut
  emb = inference.embed_sentences(loaded.params, loaded.model_config, tok, ['the cat.', '', long])
  assert emb.shape == (3, 30) and np.isfinite(emb).all()


def test_cli_logging_hides_orbax_notes_only():
  import logging  # pylint: disable=g-import-not-at-top
  def record(path, level):
    return logging.LogRecord('absl', level, path, 1, 'msg', None, None)
  keep = loading.not_orbax_chatter  # pylint: disable=protected-access
  assert not keep(record('/site-packages/orbax/checkpoint/manager.py', logging.WARNING))
  assert keep(record('/site-packages/orbax/checkpoint/manager.py', logging.ERROR))
  assert keep(record('/work/encoder_jax/interop/tokenizer.py', logging.WARNING))


# ------------------------------------------ a sentence-transformers model without an MLM head

ST_MAX_SEQ_LENGTH = 24  # Of the model's 40 positions, as all-MiniLM-L6-v2 uses 256 of 512.


def _write_sentence_transformers_files(hf_dir, pooling_config):
  """The files sentence-transformers saves beside the transformer's (all-MiniLM-L6-v2's set)."""
  with open(os.path.join(hf_dir, 'sentence_bert_config.json'), 'w') as f:
    json.dump({'max_seq_length': ST_MAX_SEQ_LENGTH, 'do_lower_case': False}, f)
  modules = [{'idx': 0, 'name': '0', 'path': '',
              'type': 'sentence_transformers.models.Transformer'},
             {'idx': 1, 'name': '1', 'path': '1_Pooling',
              'type': 'sentence_transformers.models.Pooling'},
             {'idx': 2, 'name': '2', 'path': '2_Normalize',
              'type': 'sentence_transformers.models.Normalize'}]
  with open(os.path.join(hf_dir, 'modules.json'), 'w') as f:
    json.dump(modules, f)
  os.makedirs(os.path.join(hf_dir, '1_Pooling'))
  with open(os.path.join(hf_dir, '1_Pooling', 'config.json'), 'w') as f:
    json.dump(pooling_config, f)


@pytest.fixture(scope='module')
def st_base_model(tmp_path_factory):
  """(hf_dir, workdir, Loaded of each): a random BertModel (no MLM head) saved as a
  sentence-transformers model with [CLS] pooling, and its import into a workdir."""
  root = tmp_path_factory.mktemp('st')
  hf_dir, workdir = str(root / 'hf'), str(root / 'workdir')
  os.makedirs(hf_dir)
  vocab_size = hf_fixtures.write_vocab(os.path.join(hf_dir, 'vocab.txt'))
  hf_fixtures.random_hf_model(transformers.BertModel, vocab_size=vocab_size,
                              **SHAPE).save_pretrained(hf_dir)
  _write_sentence_transformers_files(hf_dir, {
      'word_embedding_dimension': 30, 'pooling_mode_cls_token': True,
      'pooling_mode_mean_tokens': False, 'pooling_mode_max_tokens': False,
      'pooling_mode_mean_sqrt_len_tokens': False})
  convert.hf_to_workdir(hf_dir, workdir)
  return hf_dir, workdir, hf_import.load_hf_dir(hf_dir), loading.load_workdir(workdir)


LONG = ' '.join(['john works at google in london and lives in paris.'] * 4)


def test_sentence_transformers_settings_are_the_embedding_defaults(st_base_model):
  hf_dir, workdir, from_hf, from_workdir = st_base_model
  assert from_hf.sentence_settings == dict(
      max_seq_length=ST_MAX_SEQ_LENGTH, do_lower_case=False, pooling='cls', normalize=True,
      files=['sentence_bert_config.json', 'modules.json', os.path.join('1_Pooling',
                                                                       'config.json')])
  assert (from_hf.default_max_len, from_hf.default_pooling) == (ST_MAX_SEQ_LENGTH, 'cls')
  # Kept in the workdir at import (and said in the import report), read back with it.
  kept = json.load(open(os.path.join(workdir, loading.SENTENCE_SETTINGS)))
  assert kept['max_seq_length'] == ST_MAX_SEQ_LENGTH and kept['source'] == hf_dir
  report = open(os.path.join(workdir, loading.IMPORT_REPORT)).read()
  assert 'max_seq_length=24, pooling=cls' in report and 'defaults of encoder_jax.embed' in report
  assert (from_workdir.default_max_len, from_workdir.default_pooling) == (24, 'cls')
  texts = [LONG, 'the cat sat.']
  assert len(from_hf.tokenizer.encode(LONG)) + 2 > 40  # Cut either way: at 24, not 40.
  expected = inference.embed_sentences(from_hf.encoder_params, from_hf.model_config,
                                   from_hf.tokenizer, texts, pooling='cls', max_len=24)
  np.testing.assert_allclose(from_hf.embed(texts), expected, atol=1e-6)
  np.testing.assert_allclose(from_workdir.embed(texts), expected, atol=1e-5)
  assert not np.allclose(from_hf.embed(texts, max_len=40)[0], expected[0], atol=1e-3)
  # A limit above the positions is capped; no settings: the position limit, mean pooling.
  wide = dataclasses.replace(from_hf, sentence_settings=dict(from_hf.sentence_settings,
                                                             max_seq_length=512))
  assert wide.default_max_len == 40
  plain = dataclasses.replace(from_hf, sentence_settings=None)
  assert (plain.default_max_len, plain.default_pooling) == (40, 'mean')


def test_pooling_configs_old_and_new():
  pooling_mode = hf_import._pooling_mode  # pylint: disable=protected-access
  assert pooling_mode({'pooling_mode_mean_tokens': True, 'pooling_mode_cls_token': False}) == (
      'mean')
  assert pooling_mode({'pooling_mode': 'cls', 'include_prompt': True}) == 'cls'
  assert pooling_mode({'pooling_mode': ['mean', 'max']}) == 'mean+max'
  assert pooling_mode({'pooling_mode_max_tokens': True}) == 'max'
  assert pooling_mode({'word_embedding_dimension': 30}) is None


def test_fill_mask_says_when_the_mlm_head_is_random(st_base_model, loaded, tmp_path, caplog):
  hf_dir, workdir, from_hf, from_workdir = st_base_model
  assert loaded.untrained_heads == []  # BertForPreTraining: every head imported.
  assert 'mlm_head' in from_hf.untrained_heads
  assert from_workdir.untrained_heads == ['mlm_head', 'pair_head']  # import_report.json.
  with caplog.at_level(logging.WARNING):
    from_workdir.fill_mask('the [MASK] sat.')
    from_workdir.fill_mask('the [MASK] sat.')
  assert caplog.text.count('has no MLM head') == 1, caplog.text  # Once per loaded model.
  assert 'imported from ' + hf_dir in caplog.text and 'random' in caplog.text
  # Pretrained on after the import: the heads are trained, nothing to say.
  assert dataclasses.replace(from_workdir, step=4).untrained_heads == []
  # A workdir imported before import_report.json: its text report is read back.
  old = tmp_path / 'old'
  old.mkdir()
  (old / loading.IMPORT_REPORT).write_text(
      open(os.path.join(workdir, loading.IMPORT_REPORT)).read())
  report = loading.read_import_report(str(old))
  assert report.initialised_groups == ['mlm_head', 'pair_head']
  assert report.architectures == ('BertModel',) and report.source == hf_dir
  assert loading.read_import_report(str(tmp_path)) is None  # Not an import.


def test_cli_defaults_and_warnings_of_an_imported_workdir(st_base_model, tmp_path, capsys):
  """embed with default flags cuts at the model's max_seq_length with its pooling; fill_mask
  on the workdir of a headless import warns that its predictions are random. The commands
  run as ``python -m`` runs them, in this process (``in_process.command``)."""
  _, workdir, _, from_workdir = st_base_model
  sentences = tmp_path / 'sentences.txt'
  sentences.write_text(f'{LONG}\nthe cat sat.\n')
  out = in_process.command(capsys, 'embed', f'--workdir={workdir}', f'--input={sentences}',
                           f'--output={tmp_path / "e.npy"}')
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'longer than max_len=24 tokens and were truncated (lines 1' in out.stderr, out.stderr
  files = 'sentence_bert_config.json, modules.json, 1_Pooling/config.json'
  assert (f'max_len 24 (max_seq_length of {files}) with cls pooling ({files})' in out.stdout), (
      out.stdout)
  np.testing.assert_allclose(np.load(tmp_path / 'e.npy'),
                             from_workdir.embed([LONG, 'the cat sat.']), atol=1e-5)
  out = in_process.command(capsys, 'fill_mask', f'--workdir={workdir}', '--text=the [MASK] sat.')
  assert out.returncode == 0, out.stderr[-3000:]
  assert '[MASK] #1:' in out.stdout
  assert 'has no MLM head' in out.stderr and 'predictions are random' in out.stderr, out.stderr
  assert out.stderr.count('has no MLM head') == 1
