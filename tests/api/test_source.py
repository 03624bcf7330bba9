"""``encoder_jax.load``: one API for workdirs and Hugging Face directories, any kind."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import encoder_jax

from support import hf_fixtures


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

SHAPE = dict(hidden_size=30, num_layers=2, num_heads=5, intermediate_size=38, max_positions=32)
TEXTS = ['the cat sat on the mat.', 'john works at google in london, not paris!']


@pytest.fixture(scope='module')
def dirs(tmp_path_factory):
  return hf_fixtures.make_workdir(str(tmp_path_factory.mktemp('load')), **SHAPE)


def _theirs(model, ids, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long(),
                 output_hidden_states=True)


@pytest.mark.parametrize('which', ['hf_dir', 'workdir'])
def test_load_gives_what_transformers_computes(dirs, which):
  hf_dir, workdir, model = dirs
  m = encoder_jax.load(hf_dir if which == 'hf_dir' else workdir)
  assert m.kind == 'bert' and m.step == (None if which == 'hf_dir' else 0)
  assert m.config.model.hidden_size == 30 and m.tokenizer.vocab_size == m.model_config.vocab_size
  x = m.encode(TEXTS)
  ids, mask = x['input_ids'], x['input_mask']
  assert ids.shape == mask.shape and ids[0, 0] == m.tokenizer.cls_id
  assert (x['segment_ids'] == 0).all()
  np.testing.assert_allclose(m.hidden_states(**x), m.hidden_states(ids, mask), atol=0)
  theirs = _theirs(model, ids, mask)
  real = mask.astype(bool)
  h = m.hidden_states(ids, mask)
  assert h.dtype == np.float32 and h.shape == (2, ids.shape[1], 30)
  np.testing.assert_allclose(h[real], theirs.hidden_states[-1].numpy()[real], atol=1e-5)
  layers = m.hidden_states(ids, mask, all_layers=True)
  assert len(layers) == 3
  np.testing.assert_allclose(layers[0][real], theirs.hidden_states[0].numpy()[real], atol=1e-5)
  logits = m.mlm_logits(ids, mask)
  np.testing.assert_allclose(logits[real], theirs.prediction_logits.numpy()[real], atol=1e-4)
  at = m.mlm_logits(ids, mask, positions=[[1, 2], [3, 4]])
  np.testing.assert_allclose(at[1], logits[1, 3:5], atol=1e-5)
  with torch.no_grad():
    pooled = model.bert(input_ids=torch.tensor(ids).long(),
                        attention_mask=torch.tensor(mask).long()).pooler_output.numpy()
  np.testing.assert_allclose(m.pooled(ids, mask), pooled, atol=1e-5)
  emb = m.embed(TEXTS)
  assert emb.shape == (2, 30)
  np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
  top = m.fill_mask('the cat [MASK] on the mat.', top_k=3)
  assert len(top) == 1 and len(top[0]) == 3


def test_load_errors_name_the_path(tmp_path, dirs):
  with pytest.raises(FileNotFoundError, match='nowhere.*workdir or a Hugging Face'):
    encoder_jax.load(str(tmp_path / 'nowhere'))
  with pytest.raises(ValueError, match='Hugging Face directory: it has no steps'):
    encoder_jax.load(dirs[0], step=3)


def test_loading_a_workdir_does_not_import_the_training_loop(dirs):
  code = ('import sys, encoder_jax; m = encoder_jax.load(sys.argv[1]); '
          'm.hidden_states(**m.encode(["the cat"])); '
          'print(sorted(n for n in ("encoder_jax.run.pretraining", "tensorflow") if n in sys.modules))')
  out = subprocess.run([sys.executable, '-c', code, dirs[1]], capture_output=True, text=True,
                       check=True, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert out.stdout.strip().splitlines()[-1] == '[]', out.stdout + out.stderr
  assert 'could not be restored' not in out.stderr  # No Orbax notes about skipped items.
