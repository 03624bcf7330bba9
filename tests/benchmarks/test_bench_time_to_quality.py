"""benchmarks/bench_time_to_quality.py on a tiny network: its files, and that the comparison
is fair (the HF peer starts from the same weights and trains on the same corrupted batches)."""

import json

import jax
import numpy as np
import pytest

import support

ttq = support.benchmark('bench_time_to_quality')

pytestmark = [pytest.mark.slow, pytest.mark.any_device_count]

STEPS, EVAL_EVERY = 6, 3


def _argv(out, prepared):
  return [f'--out={out}', '--tiny', f'--steps={STEPS}', f'--eval_every={EVAL_EVERY}',
          '--eval_batches=1', f'--prepared_dir={prepared}', '--torch_threads=1']


@pytest.fixture(scope='module')
def bench(tmp_path_factory):
  """The benchmark's main, recording on the way the masks the ``bert`` run's compiled train
  step draws on device (a callback traced into that step only) and the masks the HF run's
  host-side ``train_corruption`` returns, by step."""
  out = tmp_path_factory.mktemp('ttq')
  on_device, on_host, tracing = [], {}, []
  compile_step, train_corruption = ttq.JaxRun._compile, ttq.train_corruption

  def recording_compile(self, batch):
    if self.name == 'bert':
      (mlm,) = self.objective.objectives
      corrupt = mlm.corrupt

      def recording_corrupt(b, rng, phase):
        drawn = corrupt(b, rng, phase)
        if tracing:  # Only in the train step's trace, not in the host's jit.
          jax.debug.callback(lambda **v: on_device.append(jax.tree.map(np.asarray, v)),
                             **{k: v for k, v in drawn.items() if k.startswith('masked_')})
        return drawn
      mlm.corrupt = recording_corrupt
    tracing.append(True)
    try:
      compile_step(self, batch)
    finally:
      tracing.clear()

  def recording_train_corruption(*args):
    host = train_corruption(*args)

    def corrupt(batch, step):
      drawn = host(batch, step)
      on_host[step] = drawn
      return drawn
    return corrupt

  with pytest.MonkeyPatch.context() as m:
    m.setattr(ttq.JaxRun, '_compile', recording_compile)
    m.setattr(ttq, 'train_corruption', recording_train_corruption)
    results = ttq.main(_argv(out, out / 'prepared'))
  jax.effects_barrier()
  return out, results, on_device, on_host


def test_writes_the_figures_and_starts_equal(bench):
  out, results, _, _ = bench
  for name in ('time_to_quality.png', 'time_to_quality.json', 'time_to_quality.md'):
    assert (out / name).stat().st_size > 0, name
  with open(out / 'time_to_quality.json') as f:
    assert json.load(f) == json.loads(json.dumps(results))
  runs = results['runs']
  assert list(runs) == list(ttq.RUNS)
  for name, r in runs.items():
    assert [e['step'] for e in r['evals']] == [0, 3, 6], name
    walls = [e['wall_s'] for e in r['evals']]
    assert walls[0] == 0 and walls[1] > 0 and walls[2] > walls[1], (name, walls)
    assert [e['flops'] for e in r['evals']] == [s * r['flops_per_step'] for s in (0, 3, 6)]
    assert all(np.isfinite(e['loss']) and 0 <= e['accuracy'] <= 1 for e in r['evals'])
  assert runs['hf_bert']['flops_per_step'] == runs['bert']['flops_per_step']
  # Same initial weights, same held-out batches, no dropout: the same loss before training.
  step0 = abs(runs['hf_bert']['evals'][0]['loss'] - runs['bert']['evals'][0]['loss'])
  print(f'|hf_bert - bert| held-out loss at step 0: {step0:.2e}')
  assert step0 < 1e-4
  assert results['checks']['same host batches (bert, hf_bert)'] is True
  assert float(results['checks']['step-1 batch: |train-step masks - host masks| loss']) == 0
  table = (out / 'time_to_quality.md').read_text()
  for name in ttq.RUNS:
    assert f'| {name} |' in table


def test_hf_trains_on_the_masks_the_train_step_draws(bench):
  """At every step, the HF run's masks (drawn on the host) are those the compiled
  encoder_jax train step of the ``bert`` run drew on device."""
  _, _, on_device, on_host = bench
  assert len(on_device) == STEPS and sorted(on_host) == list(range(STEPS))
  for step, drawn in enumerate(on_device):
    assert set(drawn) == {'masked_input_ids', 'masked_positions', 'masked_labels',
                          'masked_weights'}
    assert drawn['masked_weights'].sum() > 0
    for k, v in drawn.items():
      np.testing.assert_array_equal(v, on_host[step][k], err_msg=f'step {step}: {k}')
