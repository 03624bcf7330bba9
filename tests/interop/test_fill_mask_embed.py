"""fill_mask (top-k per [MASK], as transformers computes it) and embed (padding-invariant)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from encoder_jax import embed
from encoder_jax import fill_mask
from encoder_jax.interop import checkpoint_io

import hf_fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
  return checkpoint_io.load_hf_dir(hf_dir_and_model[0])


def test_fill_mask_matches_transformers(hf_dir_and_model, loaded):
  _, model = hf_dir_and_model
  text = 'The [MASK] sat on the mat in [MASK].'
  ids, positions = fill_mask.tokenize_with_masks(loaded.tokenizer, text)
  assert [ids[p] for p in positions] == [loaded.tokenizer.mask_id] * 2
  got = fill_mask.fill_mask(loaded.params, loaded.model_config, loaded.tokenizer, text, top_k=4)
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
    fill_mask.fill_mask(loaded.params, loaded.model_config, loaded.tokenizer, 'no mask here')


@pytest.mark.parametrize('pooling', embed.POOLINGS)
def test_padding_never_changes_an_embedding(loaded, pooling):
  short = 'the cat sat.'
  long = 'john works at google in london and lives in paris, the capital of france.'
  alone = embed.embed_sentences(loaded.params, loaded.model_config, loaded.tokenizer, [short],
                                pooling=pooling)
  with_long = embed.embed_sentences(loaded.params, loaded.model_config, loaded.tokenizer,
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
  raw = {p: embed.embed_sentences(loaded.params, loaded.model_config, tok, texts, pooling=p,
                                  normalize=False) for p in embed.POOLINGS}
  for i, t in enumerate(texts):
    ids = [tok.cls_id, *tok.encode(t), tok.sep_id]
    with torch.no_grad():
      h = model.bert(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
    np.testing.assert_allclose(raw['cls'][i], h[0], atol=1e-4)
    np.testing.assert_allclose(raw['mean'][i], h.mean(0), atol=1e-4)


def test_cli_outputs(hf_dir_and_model, tmp_path):
  hf_dir, _ = hf_dir_and_model
  sentences = tmp_path / 'sentences.txt'
  sentences.write_text('the cat sat on the mat.\nparis is the capital of france.\n\nhi\n')
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='')
  out = subprocess.run([sys.executable, '-m', 'encoder_jax.embed', f'--hf_dir={hf_dir}',
                        f'--input={sentences}', f'--output={tmp_path / "e.npy"}',
                        '--pooling=cls', '--batch_size=2'],
                       capture_output=True, text=True, env=env, cwd=ROOT, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  emb = np.load(tmp_path / 'e.npy')
  assert emb.shape == (4, 30) and emb.dtype == np.float32  # Row i = line i, blank included.
  assert '1 of 4 inputs are blank (lines 3)' in out.stderr, out.stderr[-3000:]
  assert 'truncated' not in out.stderr
  out = subprocess.run([sys.executable, '-m', 'encoder_jax.fill_mask', f'--hf_dir={hf_dir}',
                        '--text=the [MASK] sat.', '--top_k=3'],
                       capture_output=True, text=True, env=env, cwd=ROOT, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert '[MASK] #1:' in out.stdout


def test_blank_and_truncated_inputs_are_reported(loaded):
  tok = loaded.tokenizer
  long = ' '.join(['the cat sat on the mat'] * 10)
  encoded = embed.encode_sentences(tok, ['the cat.', '', '  \t', long], max_len=16)
  assert encoded.blank == [1, 2] and encoded.truncated == [3]
  assert [len(r) for r in encoded.rows] == [len(tok.encode('the cat.')) + 2, 2, 2, 16]
  assert encoded.rows[1] == [tok.cls_id, tok.sep_id]
  assert encoded.longest == len(tok.encode(long)) + 2
  blank, cut = encoded.warnings()
  assert '2 of 4 inputs are blank (lines 2, 3)' in blank
  assert f'1 of 4 inputs are longer than max_len=16 tokens and were truncated (lines 4; the ' \
         f'longest has {encoded.longest} tokens' in cut
  emb = embed.embed_sentences(loaded.params, loaded.model_config, tok, ['the cat.', '', long])
  assert emb.shape == (3, 30) and np.isfinite(emb).all()


def test_cli_logging_hides_orbax_notes_only():
  import logging  # pylint: disable=g-import-not-at-top
  def record(path, level):
    return logging.LogRecord('absl', level, path, 1, 'msg', None, None)
  keep = checkpoint_io._not_orbax_chatter  # pylint: disable=protected-access
  assert not keep(record('/site-packages/orbax/checkpoint/manager.py', logging.WARNING))
  assert keep(record('/site-packages/orbax/checkpoint/manager.py', logging.ERROR))
  assert keep(record('/work/encoder_jax/interop/tokenizer.py', logging.WARNING))
