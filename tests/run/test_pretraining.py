"""The training loop on real data: phases, sharding equivalence, resume, preemption, NaNs."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.api import pretrain

from encoder_jax.run import checkpointing
from encoder_jax import data as data_lib
from encoder_jax.run import feeding
from encoder_jax.run import metrics_log as metrics_lib
from encoder_jax import objectives
from encoder_jax.core import length_phases
from encoder_jax.core import sharding
from encoder_jax.run import pretraining
from encoder_jax.run import workdir as workdir_lib

import support
from support import held_run
from support import tiny_config

ROOT = support.ROOT


def _config(prepared_dir, **train_overrides):
  c = tiny_config.get_config(f'prepared_dir={prepared_dir}')
  c.train.update(**train_overrides)
  return c


def _train_lines(workdir, split='train'):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [r for r in map(json.loads, f) if r['split'] == split]


@pytest.fixture(scope='module')
def uninterrupted(prepared_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('uninterrupted'))
  last = pretrain.run(_config(prepared_dir), workdir).metrics
  return workdir, last


def test_partial_metrics_line_from_a_killed_run_is_dropped(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  path.write_text('{"step": 1, "split": "train", "loss": 1.0}\n{"step": 2, "spl')
  writer = metrics_lib.MetricWriter(str(tmp_path))
  writer.write(2, {'loss': 0.5})
  writer.close()
  assert [r['step'] for r in _train_lines(str(tmp_path))] == [1, 2]


@pytest.mark.slow  # The module's training run (uninterrupted).
def test_run_goes_through_both_phases_and_logs_everything(uninterrupted):
  workdir, last = uninterrupted
  lines = _train_lines(workdir)
  assert [r['step'] for r in lines] == list(range(1, 13))
  assert all(np.isfinite(r['loss']) and r['nonfinite'] == 0 for r in lines)
  for key in ('mlm_loss', 'mlm_accuracy', 'pair_loss', 'pair_accuracy', 'learning_rate',
              'grad_norm'):
    assert key in last
  assert 'tokens_per_s' in lines[-1] and 'model_tflops_per_s_per_device' in lines[-1]
  evals = _train_lines(workdir, 'eval')
  assert [r['step'] for r in evals] == [6, 12] and 'mlm_perplexity' in evals[0]
  assert sorted(os.listdir(checkpointing.checkpoint_dir(workdir))) == ['12', '4', '8']
  assert os.listdir(os.path.join(workdir, 'tensorboard'))
  assert json.load(open(os.path.join(workdir, 'config.json')))['model']['hidden_size'] == 32


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits(prepared_dir, tmp_path):
  """A real SIGTERM to ``main`` mid-run (the tiny config, as the in-process runs, so its
  compiled steps are the suite's): the step logged, saved (off the checkpoint schedule),
  exit status 0."""
  workdir, marker = str(tmp_path / 'preempted'), str(tmp_path / 'at_step_3')
  proc = subprocess.Popen(
      [sys.executable, '-c', held_run.script('encoder_jax.main'), '3', marker,
       f'--config={support.TINY_CONFIG}:prepared_dir={prepared_dir}',
       f'--workdir={workdir}'], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)
  held_run.wait_for(lambda: os.path.exists(marker), proc)
  proc.send_signal(signal.SIGTERM)
  out = proc.communicate(timeout=300)[0]
  assert proc.returncode == 0, out
  assert 'Preempted at step 3: checkpoint saved' in out, out
  assert os.listdir(checkpointing.checkpoint_dir(workdir)) == ['3']
  assert [r['step'] for r in _train_lines(workdir)] == [1, 2, 3]


def _batch(prepared_dir, c):
  prepared = data_lib.load_or_prepare(c)
  return next(data_lib.make_train_iterator(c, prepared, 0, 1)), prepared


def _one_step(c, mesh, batch, prepared, state=None):
  pieces = pretraining.pieces(c, mesh, objectives.build(c, pretraining.vocab_tables(c, prepared)))
  state = pieces.create_state() if state is None else jax.device_put(state, pieces.shards)
  step = pieces.train_step(length_phases.phases(c.train)[0])
  new, m = step(state, feeding.to_global(batch, sharding.batch_sharding(mesh)))
  return jax.device_get(new), jax.device_get(m)


def test_same_loss_on_one_device_and_on_a_2x2x2_mesh(prepared_dir):
  c = _config(prepared_dir)
  batch, prepared = _batch(prepared_dir, c)
  c.mesh.update(data=1, fsdp=1, tensor=1)
  one = _one_step(c, sharding.make_mesh(c.mesh, jax.devices()[:1]), batch, prepared)
  c.mesh.update(data=2, fsdp=2, tensor=2)
  eight = _one_step(c, sharding.make_mesh(c.mesh), batch, prepared)
  for key in ('loss', 'mlm_loss', 'pair_loss', 'grad_norm'):
    np.testing.assert_allclose(one[1][key], eight[1][key], rtol=2e-5, err_msg=key)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               one[0].params, eight[0].params)


def test_gradient_accumulation_equals_the_full_batch(prepared_dir):
  c = _config(prepared_dir)
  c.objective.names = ('nsp',)  # No random masks, so both runs see identical inputs.
  c.model.update(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  batch, prepared = _batch(prepared_dir, c)
  mesh = sharding.make_mesh(c.mesh)
  full = _one_step(c, mesh, batch, prepared)
  c.train.update(grad_accum_steps=2, batch_size=16)  # 16 / 2 = 8 rows per micro-batch.
  batch2 = {k: np.concatenate([v, v]) for k, v in batch.items()}
  c.train.batch_size = 16
  accum = _one_step(c, mesh, batch2, prepared)
  np.testing.assert_allclose(full[1]['loss'], accum[1]['loss'], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               full[0].params, accum[0].params)


def test_evaluation_in_micro_batches_equals_the_whole_batch(prepared_dir):
  """With grad_accum_steps=2 the eval step runs two micro-batches (rows i, i+2, ...) and
  combines their metrics; with NSP alone (no random masks) the batch twice over in two
  micro-batches scores what the batch scores in one."""
  c = _config(prepared_dir)
  c.objective.names = ('nsp',)
  batch, prepared = _batch(prepared_dir, c)
  mesh = sharding.make_mesh(c.mesh)
  objective = objectives.build(c, pretraining.vocab_tables(c, prepared))
  pieces = pretraining.pieces(c, mesh, objective)
  shards, params = pieces.shards, pieces.create_state().params
  phase = length_phases.phases(c.train)[0]

  def scores(config, host_batch):
    step = pretraining.make_eval_step(config, objective, mesh, shards.params, phase)
    return jax.device_get(step(params, feeding.to_global(
        host_batch, sharding.batch_sharding(mesh)), 0))

  whole = scores(c, batch)
  c.train.update(grad_accum_steps=2, batch_size=16)
  parts = scores(c, {k: np.concatenate([v, v]) for k, v in batch.items()})
  assert set(whole) == set(parts)
  for key in whole:
    np.testing.assert_allclose(parts[key], whole[key], rtol=1e-5, err_msg=key)


def test_combined_metrics_weigh_each_part_by_its_count():
  per = {'mlm_accuracy': jnp.array([1.0, 0.0]), 'mlm_count': jnp.array([3.0, 1.0]),
         'pair_loss': jnp.array([2.0, 4.0])}
  out = pretraining.combine_metrics(per, {'mlm_accuracy': 'mlm_count'})
  assert float(out['mlm_accuracy']) == 0.75 and float(out['mlm_count']) == 4.0
  assert float(out['pair_loss']) == 3.0


def test_skip_policy_drops_a_nonfinite_update(prepared_dir):
  c = _config(prepared_dir, nonfinite_policy='skip')
  batch, prepared = _batch(prepared_dir, c)
  mesh = sharding.make_mesh(c.mesh)
  state = jax.device_get(pretraining.pieces(c, mesh).create_state())
  params = jax.tree.map(np.array, state.params)
  params['pooler']['kernel'][0, 0] = np.nan
  state = state.replace(params=params)
  new, m = _one_step(c, mesh, batch, prepared, state)
  assert m['nonfinite'] == 1.0 and int(new.step) == 1
  np.testing.assert_array_equal(new.params['encoder']['layers']['query']['kernel'],
                                params['encoder']['layers']['query']['kernel'])


@pytest.mark.slow  # A training run.
def test_stop_policy_names_the_step_and_last_good_checkpoint(prepared_dir, tmp_path):
  c = _config(prepared_dir)
  c.optim.learning_rate = 1e38  # The first update overflows the parameters.
  c.train.log_every_steps = 3
  with pytest.raises(FloatingPointError, match=r'at step \d+ .*No checkpoint was saved yet'):
    pretrain.run(c, str(tmp_path / 'nan'))


@pytest.mark.slow  # The module's training run (uninterrupted).
def test_checkpoint_of_another_shape_is_reported_not_ignored(prepared_dir, uninterrupted,
                                                              tmp_path):
  c = _config(prepared_dir)
  c.model.intermediate_size = 48
  mesh = sharding.make_mesh(c.mesh)
  ckpt = checkpointing.Checkpointer(uninterrupted[0], c.checkpoint)
  with pytest.raises(checkpointing.CheckpointError, match='No checkpoint .* could be restored'):
    ckpt.restore(pretraining.pieces(c, mesh).abstract_state())
  ckpt.close()
  with pytest.raises(checkpointing.CheckpointError, match='does not exist'):
    checkpointing.restore_params(str(tmp_path / 'nowhere'),
                                 pretraining.pieces(c, mesh).abstract_state().params)


def test_data_states_of_the_processes_are_saved_as_one_global_state(monkeypatch):
  from jax.experimental import multihost_utils
  fingerprint = {'batch_size': 8, 'streams': 4}
  states = [{'format': 2, 'step': 3, 'fingerprint': fingerprint, 'streams': {'0': None,
                                                                              '1': None}},
            {'format': 2, 'step': 3, 'fingerprint': fingerprint, 'streams': {'2': {'a': 1},
                                                                              '3': None}}]
  other = np.frombuffer(json.dumps(states[0]).encode(), np.uint8)

  def all_gather_with_process_0(x):  # What process 1 receives from a 2-process all-gather.
    x = np.asarray(x)
    if x.dtype == np.int32:
      return np.stack([np.array([other.size], np.int32), x])
    row0 = np.zeros_like(x)
    row0[:other.size] = other
    return np.stack([row0, x])

  monkeypatch.setattr(multihost_utils, 'process_allgather', all_gather_with_process_0)
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  gathered = checkpointing._gather_json(states[1])
  assert gathered == states
  merged = data_lib.merge_states(gathered)
  assert merged['streams'] == {'0': None, '1': None, '2': {'a': 1}, '3': None}
  assert checkpointing._data_state({'global': merged}, 7) == merged
  assert checkpointing._data_state({'global': {}}, 0) == {}  # Imported: start over.
  assert checkpointing._data_state({'processes': [{}]}, 0) == {}
  with pytest.raises(ValueError, match='disagree on step'):
    data_lib.merge_states([states[0], dict(states[1], step=4)])
  with pytest.raises(checkpointing.CheckpointError, match='2 processes in the format of an '
                     'older version'):
    checkpointing._data_state({'processes': states}, 7)


@pytest.mark.slow  # The module's training run (uninterrupted).
def test_workdir_pins_the_tokenizer_and_refuses_another(prepared_dir, uninterrupted):
  tok, counts = workdir_lib.load_tokenizer(uninterrupted[0])
  prepared = data_lib.load_or_prepare(_config(prepared_dir))
  assert tok.sha256() == prepared.tokenizer.sha256()
  np.testing.assert_array_equal(counts, prepared.unigram_counts)
  other = type('Tok', (), dict(path=__file__, kind='sentencepiece', lowercase=False,
                               vocab_size=1))
  with pytest.raises(ValueError, match='differs from the one .* was trained with'):
    workdir_lib.pin_tokenizer(uninterrupted[0], other, None)


def test_vocab_size_must_match_the_tokenizer(prepared_dir):
  c = _config(prepared_dir)
  prepared = data_lib.load_or_prepare(c)
  c.model.vocab_size = 1234
  with pytest.raises(ValueError, match='model.vocab_size=1234 but the tokenizer'):
    pretraining.vocab_tables(c, prepared)


@pytest.mark.slow  # A training run.
def test_a_run_whose_lock_another_run_took_stops_before_it_writes_again(
    prepared_dir, tmp_path, monkeypatch):
  """Another run took the workdir mid-run (its lock written over ours): the engine checks
  the lock before each log and save, so the run stops with LockLost at the next one and
  writes no further step."""
  from encoder_jax.storage import locks  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  # The run's own lock, beating every 50 ms instead of every minute.
  monkeypatch.setattr(workdir_lib, 'run_lock', lambda w, wait_s=None: _quick_lock(w))
  due = pretraining._Adapter.due  # pylint: disable=protected-access

  def taken_at_step_3(self, step, data_state):
    if step == 3:
      info = dict(locks.LockInfo.new().__dict__, host='tpu-worker-7', pid=12345, token='other')
      with open(os.path.join(workdir, workdir_lib.LOCK_FILE), 'w', encoding='utf-8') as f:
        json.dump(info, f)
      time.sleep(1.0)  # The next beats find it replaced.
    return due(self, step, data_state)

  monkeypatch.setattr(pretraining._Adapter, 'due',  # pylint: disable=protected-access
                      taken_at_step_3)
  with pytest.raises(locks.LockLost, match='no longer ours'):
    pretrain.run(_config(prepared_dir), workdir)
  assert [r['step'] for r in _train_lines(workdir)] == [1, 2]
  assert checkpointing.steps(workdir) == []


def _quick_lock(workdir):
  lock = workdir_lib.WorkdirLock(workdir, heartbeat_s=0.05, wait_s=0)
  lock.acquire()
  return lock
