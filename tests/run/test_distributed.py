"""Multi-process runs on localhost: the same run on any topology, and elastic resume.

The end-to-end tests start ``launch/local_multiprocess.py`` (jax.distributed with the gloo CPU
collectives) on the tiny config, unpatched: 2 processes x 2 CPU devices, with the workdir on
a bucket of the Cloud Storage emulator as on a pod, against the same config run in this
process (1 process x 8 devices), and a 2 x 2 run killed after a checkpoint and resumed in
this process (1 x 8). The global
batch of a step depends on the config and the step only (each process builds the example
streams of its rows), masks are drawn on device from the step over the global batch, so the
runs must agree up to float reassociation in the collectives (another device count adds the
gradient's partial sums in another order).
"""

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

from etils import epath
import jax
import numpy as np
import pytest

from encoder_jax.api import pretrain

from encoder_jax.run import checkpointing
from encoder_jax import data as data_lib
from encoder_jax.run import distributed
from encoder_jax.core import sharding
from encoder_jax.storage import paths as storage
from encoder_jax.storage import client as storage_client
from encoder_jax.run import pretraining
from encoder_jax.data import prepare_once

import support
from support import tiny_config

ROOT = support.ROOT
LAUNCHER = os.path.join(ROOT, 'launch', 'local_multiprocess.py')

# Metrics and params of runs on different topologies: the same computation, but the
# all-reduce (gloo across processes, or over another number of devices) may add in another
# order, so float32 rounding may differ.
RTOL = 1e-5
METRIC_KEYS = ('loss', 'mlm_loss', 'pair_loss', 'mlm_accuracy', 'pair_accuracy',
               'grad_norm', 'mlm_predictions')


# ------------------------------------------------------------------ distributed.plan (fast)


def test_explicit_coordinator_from_variables_or_flags():
  env = dict(JAX_COORDINATOR_ADDRESS='10.0.0.1:1234', JAX_NUM_PROCESSES='2',
             JAX_PROCESS_ID='1', SLURM_JOB_ID='7', SLURM_NTASKS='8')
  p = distributed.plan(environ=env)
  assert p.how == 'explicit' and p.kwargs == dict(
      coordinator_address='10.0.0.1:1234', num_processes=2, process_id=1,
      cluster_detection_method='deactivate')
  p = distributed.plan('h:9', 4, 3, environ=env)  # Flags win over the variables.
  assert p.kwargs['coordinator_address'] == 'h:9' and p.kwargs['num_processes'] == 4
  assert distributed.plan(environ=dict(JAX_NUM_PROCESSES='1', SLURM_JOB_ID='7',
                                       SLURM_NTASKS='8')).how == 'single'
  assert distributed.plan(environ={}).how == 'single' or distributed._on_tpu_vm()


@pytest.mark.parametrize('env, flags, message', [
    (dict(JAX_COORDINATOR_ADDRESS='h:1'), (), 'missing --num_processes or JAX_NUM_PROCESSES, '
     '--process_id or JAX_PROCESS_ID'),
    (dict(JAX_NUM_PROCESSES='2', JAX_PROCESS_ID='0'), (), 'missing --coordinator_address or '
     'JAX_COORDINATOR_ADDRESS'),
    (dict(JAX_COORDINATOR_ADDRESS='h:1', JAX_NUM_PROCESSES='2', JAX_PROCESS_ID='2'), (),
     'JAX_PROCESS_ID = 2 is out of range for --num_processes / JAX_NUM_PROCESSES = 2'),
    (dict(JAX_COORDINATOR_ADDRESS='h:1', JAX_NUM_PROCESSES='two', JAX_PROCESS_ID='0'), (),
     'JAX_NUM_PROCESSES must be an integer >= 1'),
    (dict(JAX_NUM_PROCESSES='2', JAX_PROCESS_ID='0'), ('nohost', None, None),
     'JAX_COORDINATOR_ADDRESS must be host:port'),
    (dict(SLURM_JOB_ID='7', SLURM_NTASKS='4'), (), 'not an srun step'),
])
def test_half_specified_launch_is_an_error_naming_the_variable(env, flags, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    distributed.plan(*flags, environ=env)


def test_slurm_one_task_per_node_keeps_every_local_device():
  env = dict(SLURM_JOB_ID='4242', SLURM_NTASKS='4', SLURM_PROCID='2', SLURM_LOCALID='0',
             SLURM_STEP_NODELIST='gpu[007-010],gpu12', SLURM_STEP_NUM_NODES='4')
  p = distributed.plan(environ=env)
  assert p.how == 'slurm' and 'local_device_ids' not in p.kwargs
  assert p.kwargs == dict(coordinator_address=f'gpu007:{4242 % 4096 + 61440}',
                          num_processes=4, process_id=2, cluster_detection_method='deactivate')
  p = distributed.plan(environ=dict(env, SLURM_STEP_NUM_NODES='1', SLURM_LOCALID='3',
                                    JAX_COORDINATOR_PORT='1234'))
  assert p.kwargs['local_device_ids'] == [3] and p.kwargs['coordinator_address'] == 'gpu007:1234'


def test_tpu_pod_environment_is_detected():
  assert distributed.plan(environ=dict(TPU_WORKER_HOSTNAMES='t-0,t-1')).how == 'tpu'
  assert distributed.plan(environ=dict(MEGASCALE_COORDINATOR_ADDRESS='t-0')).how == 'tpu'


# ------------------------------------------------------------------ end to end (slow)


# Every run here trains the tiny config in one length phase (tiny_config.one_phase): the
# topology, the data state and resume do not depend on the phases; half the programs.


def _launch(workdir, prepared_dir, log_path, *flags, processes=2, devices=2):
  """The documented local launch (``processes`` x ``devices`` CPU devices), output to
  ``log_path``."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
             # The session's compilation cache (tests/conftest.py): process 0 of every later
             # run loads what process 0 of the first compiled (JAX writes the cache from
             # process 0 only, and a program's key holds its process's view of the
             # topology, so the others still compile).
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')
  for var in ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID'):
    env.pop(var, None)
  cmd = [sys.executable, LAUNCHER, f'--num_processes={processes}',
         f'--cpu_devices_per_process={devices}', '--',
         sys.executable, '-m', 'encoder_jax.main',
         f'--config={support.TINY_CONFIG}:{tiny_config.one_phase(prepared_dir)}',
         f'--workdir={workdir}', *flags]
  with open(log_path, 'a') as log:  # Its own session: _stop ends the launcher and its children.
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _stop(proc):
  if proc.poll() is None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read(path):
  with open(path, encoding='utf-8', errors='replace') as f:
    return f.read()


def _finish(proc, log_path, timeout=400):
  try:
    proc.wait(timeout=timeout)
  finally:
    _stop(proc)
  assert proc.returncode == 0, _read(log_path)[-6000:]
  return _read(log_path)


def _metric_lines(workdir):
  """metrics.jsonl's rows, of a local or ``gs://`` workdir."""
  text = (epath.Path(workdir) / 'metrics.jsonl').read_text()
  return [json.loads(line) for line in text.splitlines()]


def _objects(url):
  """The names of the objects under ``gs://`` ``url``, relative to it."""
  bucket, prefix = storage.split(url)
  return {b.name[len(prefix) + 1:]
          for b in storage_client.client().list_blobs(bucket, prefix=prefix + '/')}


@functools.lru_cache(maxsize=None)
def _abstract_params(prepared_dir):
  """(config, abstract params on this process's mesh) of the tiny config: traced once."""
  config = tiny_config.get_config(tiny_config.one_phase(prepared_dir))
  return config, pretraining.pieces(config, sharding.make_mesh(config.mesh)).abstract_state().params


# Every workdir compared is finished when first read: the two-process run's (read by two
# tests, from the bucket) is restored once.
@functools.lru_cache(maxsize=None)
def _final_params(workdir, prepared_dir):
  config, abstract = _abstract_params(prepared_dir)
  params, step = checkpointing.restore_params(workdir, abstract)
  assert step == config.train.num_steps
  return jax.device_get(params)


def _compare(got, want):
  """Every logged metric of ``got`` (metrics.jsonl rows) within RTOL of ``want``'s; returns
  the largest relative difference."""
  want = {(r['split'], r['step']): r for r in want}
  largest = 0.0
  for g in got:
    w = want[(g['split'], g['step'])]
    for key in METRIC_KEYS:
      if key in w:
        np.testing.assert_allclose(g[key], w[key], rtol=RTOL,
                                   err_msg=f'{g["split"]} step {g["step"]} {key}')
        largest = max(largest, abs(g[key] - w[key]) / max(abs(w[key]), 1e-30))
  return largest


def _same_params(workdir, other, prepared_dir):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-6),
               _final_params(workdir, prepared_dir), _final_params(other, prepared_dir))


@pytest.fixture(scope='module')
def two_process_run(tmp_path_factory, gcs_emulator):
  """A 2 x 2 run from scratch, preparing its data (locally) on the way, its workdir on a
  bucket of the emulator as on a pod: (workdir, prepared_dir, log)."""
  base = tmp_path_factory.mktemp('multihost')
  bucket = f'multihost-{uuid.uuid4().hex[:12]}'
  gcs_emulator.create_bucket(bucket)
  workdir, prepared_dir = f'gs://{bucket}/run', str(base / 'prepared')
  log_path = str(base / 'run.log')
  start = time.time()
  log = _finish(_launch(workdir, prepared_dir, log_path), log_path)
  print(f'2 x 2 run: {time.time() - start:.0f} s')
  return workdir, prepared_dir, log


def _in_process(workdir, prepared_dir):
  """The same run (the tiny config) in this process: 1 process x 8 devices (another mesh)."""
  config = tiny_config.get_config(tiny_config.one_phase(prepared_dir))
  pretrain.run(config, workdir)


@pytest.mark.slow
def test_the_same_run_on_another_topology(two_process_run, tmp_path):
  """The 2 x 2 run against 1 x 8 (another mesh, one process), this process's run of the
  same config. (1 x 1, 1 x 4, the same mesh in one process, and 2 x 4 agreed to 1.3e-7 when
  measured, and are left out of the suite for its time; the in-process test of the data
  covers 8 processes.)"""
  workdir, prepared_dir, log = two_process_run
  assert re.search(r'^\[p1\] process 1 of 2, coordinator localhost:\d+ \(explicit\): 2 local '
                   '/ 4 global cpu devices$', log, re.M), log[:3000]
  other = str(tmp_path / 'other')
  _in_process(other, prepared_dir)
  got, want = _metric_lines(other), _metric_lines(workdir)
  assert [(r['split'], r['step']) for r in got] == [(r['split'], r['step']) for r in want]
  assert {r['split'] for r in got} == {'train', 'eval'}
  print(f'1 x {jax.device_count()} vs 2 x 2: largest relative metric difference '
        f'{_compare(got, want):.1e}')
  _same_params(other, workdir, prepared_dir)


@pytest.mark.slow
def test_written_once_prepared_once_and_one_global_data_state(two_process_run):
  workdir, prepared_dir, log = two_process_run
  # One process prepared; the other waited for its manifest.
  assert len(re.findall(r'^\[p\d\] Prepared ', log, re.M)) == 1, log[-6000:]
  preparer = re.search(r'^\[p(\d)\] Prepared ', log, re.M).group(1)
  other = '1' if preparer == '0' else '0'
  assert re.search(rf'^\[p{other}\] Waiting for process \d+ on .* to prepare', log, re.M)
  assert not os.path.exists(prepare_once.lock_path(prepared_dir))
  # Checkpoints, metrics, TensorBoard, config: one copy in the bucket (two writers would
  # duplicate lines of metrics.jsonl and TensorBoard event files), the lock released.
  objects = _objects(workdir)
  assert {'checkpoints', 'config.json', 'metrics.jsonl', 'tensorboard',
          'tokenizer'} <= {n.split('/')[0] for n in objects}, sorted(objects)
  assert {n.split('/')[1] for n in objects if n.startswith('checkpoints/')} == {'4', '8', '12'}
  assert len([n for n in objects if n.startswith('tensorboard/')]) == 1
  assert '.lock' not in objects and not os.path.exists(os.path.join(ROOT, 'gs:'))
  # Both processes wrote their part of the checkpoint to the bucket (tensorstore, epath).
  assert {f'checkpoints/12/params/array_metadatas/process_{i}' for i in (0, 1)} <= objects
  lines = [(r['split'], r['step']) for r in _metric_lines(workdir)]
  assert sorted(lines) == sorted(set(lines)) and len(lines) == 12 + 2
  # The checkpoint holds one global data state: every stream, each process's 4 of 8 merged.
  state = json.loads(storage.Blob(f'{workdir}/checkpoints/12/data/metadata').read().text)[
      'global']
  assert state['step'] == 12 and sorted(map(int, state['streams'])) == list(range(8))
  config = tiny_config.get_config(tiny_config.one_phase(prepared_dir))
  prepared = data_lib.load_or_prepare(config)
  assert [data_lib.make_train_iterator(config, prepared, i, 2).streams
          for i in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.slow
def test_sigkill_then_resume_on_one_process_of_eight_devices(two_process_run, tmp_path, capsys):
  """A 2 x 2 run killed after a checkpoint, resumed by 1 x 8 (this process, the same config
  as the other tests' in-process run, whose compiled steps it may reuse): the uninterrupted
  run's metrics."""
  full_workdir, prepared_dir, _ = two_process_run
  workdir, log_path = str(tmp_path / 'killed'), str(tmp_path / 'killed.log')
  no_eval = '--config.train.eval_every_steps=0'  # Saves compiles; params do not depend on it.
  proc = _launch(workdir, prepared_dir, log_path, no_eval)
  try:
    done = os.path.join(checkpointing.checkpoint_dir(workdir), '4', '_CHECKPOINT_METADATA')
    end = time.time() + 300
    while not os.path.exists(done):
      assert proc.poll() is None, _read(log_path)[-6000:]
      assert time.time() < end, 'no checkpoint 4 after 300 s'
      time.sleep(0.1)
    pid = int(re.search(r'process 1 of 2: pid (\d+)', _read(log_path)).group(1))
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == 128 + signal.SIGKILL
  finally:
    _stop(proc)
  log = _read(log_path)
  assert 'process 1 exited with status 137; killing the others' in log
  killed_at = max(r['step'] for r in _metric_lines(workdir))

  capsys.readouterr()
  _in_process(workdir, prepared_dir)  # Evaluates again (a resume may change the period).
  log = capsys.readouterr().out
  resumed = re.findall(r'^ +resuming from checkpoint step (\d+)', log, re.M)
  assert len(resumed) == 1 and 4 <= int(resumed[0]) <= killed_at < 12, log[-3000:]
  got = _metric_lines(workdir)  # Steps logged before the kill and again after the resume too.
  assert {r['step'] for r in got if r['split'] == 'train'} == set(range(1, 13))
  evals = {6, 12} - set(range(int(resumed[0]) + 1))  # The resumed run's, after its start.
  assert {r['step'] for r in got if r['split'] == 'eval'} == evals
  largest = _compare(got, _metric_lines(full_workdir))
  print(f'2 x 2 killed at step {killed_at}, resumed from step {resumed[0]} by 1 x 8: largest '
        f'relative metric difference {largest:.1e}')
  _same_params(workdir, full_workdir, prepared_dir)
