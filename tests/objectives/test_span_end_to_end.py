"""SpanBERT end to end on the embedded corpus: configs/spanbert_base.py (runlocal, shrunk)
trains with span masking + SBO and its losses fall; held-out evaluation reports MLM and
SBO; the workdir exports as ``BertForPreTraining`` (the SBO head, a pretraining-only part,
left out) with the MLM logits ours computes."""

import importlib.util
import os

import numpy as np
import pytest
import torch
import transformers

from encoder_jax import convert
from encoder_jax import evaluate
from encoder_jax import loading
from encoder_jax import metrics_log as metrics_lib
from encoder_jax import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(prepared_dir):
  spec = importlib.util.spec_from_file_location('cfg', os.path.join(ROOT, 'configs',
                                                                    'spanbert_base.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config('runlocal=True')
  c.model.update(vocab_size=1000, hidden_size=64, num_heads=2, intermediate_size=128,
                 max_position_embeddings=64)
  c.data.update(sources='embedded;max_documents=300', prepared_dir=prepared_dir)
  # 16 steps at a high rate: the losses fall by over 10% (the steps are cheap beside
  # compiling them, but there is no need for more).
  c.train.update(num_steps=16, batch_size=8, seq_lens=(32,), max_predictions=(5,),
                 phase_fractions=(1.0,), log_every_steps=2, eval_every_steps=16,
                 eval_batches=2)
  c.optim.update(learning_rate=1e-2, warmup_steps=2)
  c.checkpoint.update(every_steps=16, async_save=False)
  return c


@pytest.mark.slow  # ~25 s of CPU: data preparation, 16 steps, evaluation, export.
def test_spanbert_trains_evaluates_and_exports(tmp_path):
  c = _config(str(tmp_path / 'prepared'))
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(c, workdir)
  rows = [r for r in metrics_lib.read_metrics(workdir) if r['split'] == 'train']
  assert len(rows) == 8
  for key in ('loss', 'mlm_loss', 'sbo_loss'):  # From ~2 x ln(1000) = 13.8 down.
    values = [r[key] for r in rows]
    assert np.mean(values[-2:]) < 0.9 * values[0], (key, values)

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
