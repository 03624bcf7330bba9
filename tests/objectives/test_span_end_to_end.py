"""SpanBERT end to end on the embedded corpus: the family's SpanBERT row (tests/support/family.py:
configs/spanbert_base.py's recipe at tiny size, on 8 simulated devices) trains with span
masking + SBO and its losses fall; held-out evaluation reports MLM and SBO; the workdir
exports as ``BertForPreTraining`` (the SBO head, a pretraining-only part, left out) with the
MLM logits ours computes."""


import numpy as np
import pytest
import torch
import transformers

from encoder_jax import convert
from encoder_jax import evaluate
from encoder_jax.loading import loaded as loading

from support import family


ROW = 'spanbert_mlm_sbo'


@pytest.mark.slow  # The row's run (shared with tests/test_family.py), evaluation, export.
@pytest.mark.xdist_group(family.group(ROW))
def test_spanbert_trains_evaluates_and_exports(family_root, tmp_path):
  run = family.trained(ROW, family_root)
  c, workdir = run.config, run.workdir
  for key in ('loss', 'mlm_loss', 'sbo_loss'):  # The sum: 2 x ln(1000) = 13.8 -> 12.1.
    values = run.logged(key)
    assert len(values) == 6 and np.mean(values[-2:]) < 0.9 * values[0], (key, values)

  result = evaluate.evaluate_checkpoint(c, workdir)
  assert np.isfinite(result['sbo_loss']) and result['sbo_predictions'] > 0
  assert any(line.strip().startswith('SBO') for line in result['report'])

  out = str(tmp_path / 'hf')
  convert.workdir_to_hf(workdir, out)
  model, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  loaded = loading.load_workdir(workdir)
  assert 'sbo_head' in loaded.params and 'sbo_head' not in loaded.encoder_params
  tok = loaded.tokenizer
  ids = np.array([[tok.cls_id, *tok.encode('The cat sat on the mat.'), tok.sep_id]], np.int32)
  mask = np.ones_like(ids)
  with torch.no_grad():
    theirs = model.eval()(input_ids=torch.tensor(ids, dtype=torch.long)).prediction_logits
  np.testing.assert_allclose(loaded.mlm_logits(ids, mask), theirs.numpy(), atol=1e-5)
