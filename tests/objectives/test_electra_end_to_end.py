"""ELECTRA end to end on the embedded corpus: configs/electra_small.py (runlocal, shrunk)
trains and its loss falls; held-out evaluation reports every metric; the workdir exports
to Hugging Face (discriminator at OUT, generator at OUT/generator) with the logits ours
computes; the export loads back (generator included) and as ``ElectraModel``. (Fine-tuning
the discriminator from an ELECTRA workdir: tests/finetune/test_probe_bakeoff.py's end-to-end
run, whose probes fine-tune its ELECTRA row's checkpoints.)"""

import importlib.util
import json
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
from encoder_jax.interop import hf_import

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATOL = 1e-5


def _config(prepared_dir):
  spec = importlib.util.spec_from_file_location('cfg', os.path.join(ROOT, 'configs',
                                                                    'electra_small.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config('runlocal=True')
  # Smaller still: 2 x 64 discriminator (E = 32), a 16-wide generator.
  c.model.update(vocab_size=1000, hidden_size=64, num_heads=2, intermediate_size=128,
                 embedding_size=32, max_position_embeddings=64)
  c.data.update(sources='embedded;max_documents=300', prepared_dir=prepared_dir)
  c.train.update(num_steps=12, batch_size=8, seq_lens=(32,), max_predictions=(5,),
                 phase_fractions=(1.0,), log_every_steps=2, eval_every_steps=12,
                 eval_batches=2)
  c.optim.update(learning_rate=2e-3, warmup_steps=2)
  c.checkpoint.update(every_steps=12, async_save=False)
  return c


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


@pytest.mark.slow  # 12 steps, evaluation, export (the tiny config's prepared data).
def test_electra_small_trains_evaluates_and_exports(prepared_dir, tmp_path):
  c = _config(prepared_dir)
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(c, workdir)
  losses = [r['loss'] for r in metrics_lib.read_metrics(workdir) if r['split'] == 'train']
  assert len(losses) == 6 and np.mean(losses[-2:]) < 0.9 * losses[0], losses  # 41.5 -> 34.2.

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
  ours = loaded.network.pretraining.apply({'params': loaded.encoder_params}, ids,
                                          np.zeros_like(ids), mask)
  disc = transformers.ElectraForPreTraining.from_pretrained(out).eval()
  sel = mask > 0
  diff = np.abs(np.asarray(ours['rtd_logits'])[sel] - _hf(disc, ids, mask).logits.numpy()[sel])
  assert diff.max() < ATOL
  gen = transformers.ElectraForMaskedLM.from_pretrained(os.path.join(out, 'generator')).eval()
  diff = np.abs(loaded.mlm_logits(ids, mask)[sel] - _hf(gen, ids, mask).logits.numpy()[sel])
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
  np.testing.assert_allclose(again.mlm_logits(ids, mask), loaded.mlm_logits(ids, mask),
                             atol=ATOL)
