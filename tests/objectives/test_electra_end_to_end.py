"""ELECTRA end to end on the embedded corpus: the family's ELECTRA row (tests/support/family.py:
configs/electra_small.py's recipe at tiny size, on 8 simulated devices) trains and its loss
falls; held-out evaluation reports every metric; the workdir exports to Hugging Face
(discriminator at OUT, generator at OUT/generator) with the logits ours computes; the export
loads back (generator included) and as ``ElectraModel``. (Fine-tuning the discriminator from
an ELECTRA workdir: tests/test_bakeoff.py's end-to-end run, whose probes
fine-tune its ELECTRA row's checkpoints.)"""

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers

from encoder_jax import convert
from encoder_jax import evaluate
from encoder_jax.loading import loaded as loading
from encoder_jax.interop import hf_import

from support import family


ATOL = 1e-5


def _rows(tok, texts):
  rows = [[tok.cls_id, *tok.encode(t), tok.sep_id] for t in texts]
  length = max(map(len, rows))
  ids = np.array([r + [tok.pad_id] * (length - len(r)) for r in rows], np.int32)
  mask = (np.arange(length)[None] < np.array([len(r) for r in rows])[:, None]).astype(np.int32)
  return ids, mask


def _hf(model, ids, mask):
  t = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)
  with torch.no_grad():
    return model(input_ids=t(ids), attention_mask=t(mask), token_type_ids=t(np.zeros_like(ids)))


ROW = 'electra_rtd'


@pytest.mark.slow  # The row's run (shared with tests/test_family.py), evaluation, export.
@pytest.mark.xdist_group(family.group(ROW))
def test_electra_small_trains_evaluates_and_exports(family_root, tmp_path):
  run = family.trained(ROW, family_root)
  c, workdir, losses = run.config, run.workdir, run.logged('loss')
  assert len(losses) == 6 and np.mean(losses[-2:]) < 0.9 * losses[0], losses  # 41.6 -> 26.7.

  result = evaluate.evaluate_checkpoint(c, workdir)
  for key in ('generator_mlm_loss', 'generator_mlm_accuracy', 'rtd_loss', 'rtd_accuracy',
              'rtd_precision', 'rtd_recall', 'replaced_fraction'):
    assert np.isfinite(result[key]), key
  assert 0 < result['replaced_fraction'] < 0.15
  assert any('Discriminator' in line for line in result['report'])

  out = str(tmp_path / 'hf')
  convert.workdir_to_hf(workdir, out)
  with open(os.path.join(out, 'config.json')) as f:
    assert json.load(f)['architectures'] == ['ElectraForPreTraining']
  with open(os.path.join(out, 'generator', 'config.json')) as f:
    assert json.load(f)['architectures'] == ['ElectraForMaskedLM']
  loaded = loading.load_workdir(workdir)
  ids, mask = _rows(loaded.tokenizer, ['The cat sat on the mat.', 'Python is a language.'])
  # Jitted on host params (one device): applied op by op on the mesh, every primitive was a
  # program of its own to compile (about 50).
  ours = jax.jit(loaded.network.pretraining.apply)(
      {'params': loading.to_host(loaded.encoder_params)}, ids, np.zeros_like(ids), mask)
  disc = transformers.ElectraForPreTraining.from_pretrained(out).eval()
  sel = mask > 0
  diff = np.abs(np.asarray(ours['rtd_logits'])[sel] - _hf(disc, ids, mask).logits.numpy()[sel])
  assert diff.max() < ATOL
  gen = transformers.ElectraForMaskedLM.from_pretrained(os.path.join(out, 'generator')).eval()
  generated = loaded.mlm_logits(ids, mask)
  diff = np.abs(generated[sel] - _hf(gen, ids, mask).logits.numpy()[sel])
  assert diff.max() < ATOL
  base, info = transformers.ElectraModel.from_pretrained(out, output_loading_info=True)
  assert not info['missing_keys']
  np.testing.assert_allclose(_hf(base.eval(), ids, mask).last_hidden_state.numpy()[sel],
                             loaded.hidden_states(ids, mask)[sel], atol=ATOL)
  # Fill-mask uses the generator, sentence embeddings the discriminator.
  (predictions,) = loaded.fill_mask('The cat sat on the [MASK].', top_k=3)
  assert len(predictions) == 3 and all(0 <= p <= 1 for _, p in predictions)
  assert loaded.embed(['a cat.', 'a dog.']).shape == (2, c.model.hidden_size)
  # The export loads back whole: the generator comes from OUT/generator.
  again = hf_import.load_hf_dir(out)
  assert again.kind == 'electra' and again.report.initialised_groups == []
  np.testing.assert_allclose(again.mlm_logits(ids, mask), generated, atol=ATOL)
