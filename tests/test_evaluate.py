"""evaluate: held-out MLM / NSP metrics of a checkpoint, fixed masks, any mesh, JSON out."""

from __future__ import annotations

import json
import math
import os

import jax
import pytest

from encoder_jax import evaluate

from support import hf_fixtures
from support import in_process


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  root = tmp_path_factory.mktemp('evaluate')
  _, workdir, _ = hf_fixtures.make_workdir(str(root), hidden_size=30, num_layers=2,
                                           num_heads=5, intermediate_size=37, max_positions=32)
  corpus = hf_fixtures.write_corpus(str(root / 'corpus.txt'))
  config = hf_fixtures.tiny_run_config(workdir, corpus, str(root / 'prepared'))
  # The CLI reads the workdir's config.json: make it the tiny one.
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    f.write(config.to_json_best_effort(indent=2))
  return workdir, config


def test_metrics_are_consistent_and_deterministic(run):
  workdir, config = run
  a = evaluate.evaluate_checkpoint(config, workdir)
  assert a['step'] == 0 and a['seq_len'] == 24 and a['batches'] == 3
  assert a['mlm_predictions'] > 0 and 0.0 <= a['mlm_accuracy'] <= 1.0
  assert math.isclose(a['mlm_perplexity'], math.exp(a['mlm_loss']), rel_tol=1e-9)
  assert any(line.strip().startswith('NSP') for line in a['report'])
  assert 0.0 <= a['pair_accuracy'] <= 1.0
  b = evaluate.evaluate_checkpoint(config, workdir)
  for k in ('mlm_loss', 'mlm_accuracy', 'pair_loss', 'mlm_predictions'):
    assert a[k] == b[k], k


def test_same_numbers_on_one_device_and_on_a_mesh(run):
  workdir, config = run
  if jax.device_count() < 8:
    pytest.skip('needs 8 (simulated) devices')
  one = evaluate.evaluate_checkpoint(config, workdir, devices=jax.devices()[:1])
  eight = evaluate.evaluate_checkpoint(config, workdir, devices=jax.devices()[:8])
  assert one['mlm_predictions'] == eight['mlm_predictions']
  for k in ('mlm_loss', 'mlm_accuracy', 'pair_loss', 'pair_accuracy'):
    assert math.isclose(one[k], eight[k], rel_tol=1e-5, abs_tol=1e-6), (k, one[k], eight[k])


def test_cli_writes_json_and_summary(run, capsys):
  """evaluate as ``python -m`` runs it, in this process (on its 8 simulated devices: the
  batch is a multiple of 8): the summary printed, the JSON written, Orbax's notes hidden."""
  workdir, config = run
  assert config.train.batch_size != 16  # The flag, not the config's batch.
  out = in_process.command(capsys, 'evaluate', f'--workdir={workdir}', '--batch_size=16',
                           '--eval_batches=2', '--alsologtostderr')
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'MLM   loss' in out.stdout and 'perplexity' in out.stdout and 'NSP' in out.stdout
  assert '2 batches of 16' in out.stdout
  assert 'could not be restored' not in out.stderr, out.stderr[-3000:]  # Orbax notes hidden.
  with open(os.path.join(workdir, 'eval_0.json')) as f:
    metrics = json.load(f)
  assert {'mlm_loss', 'mlm_accuracy', 'mlm_perplexity', 'pair_accuracy'} <= set(metrics)
  assert (metrics['batches'], metrics['batch_size'], metrics['sequences']) == (2, 16, 32)


def test_batch_size_must_fit_the_mesh(run):
  workdir, config = run
  if jax.device_count() < 8:
    pytest.skip('needs 8 (simulated) devices')
  with pytest.raises(ValueError, match='--batch_size.*=4 is not divisible'):
    evaluate.evaluate_checkpoint(config, workdir, batch_size=4, devices=jax.devices()[:8])
  with pytest.raises(ValueError, match='--eval_batches=0; expected >= 1'):
    evaluate.evaluate_checkpoint(config, workdir, eval_batches=0)


def test_cli_errors_name_the_problem(tmp_path, capsys):
  out = in_process.command(capsys, 'evaluate', f'--workdir={tmp_path / "missing"}')
  assert out.returncode != 0
  assert 'does not exist' in out.stderr
