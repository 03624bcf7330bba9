"""Faults a run must survive (issue 10): SIGKILL during a checkpoint save, a damaged newest
checkpoint, a refused resume, a second run on the same workdir, metrics after a resume.

The run killed mid-save is ``python -m encoder_jax.main`` in a subprocess (the tiny config:
12 steps, a 32 -> 64 token phase switch at step 6, checkpoints every 4); the uninterrupted
reference and the reruns go through the same ``pretrain.run`` in this process
(what they test is what the earlier run left in the workdir), saving a Python and JAX start
each. A run that survived a fault must end
bit-exact with the uninterrupted one: the same params, optimizer state and data-iterator
state in its last checkpoint, the same logged losses, each step logged once.

The kill during a save is injected, not timed: ``INJECT`` runs main with Orbax's final
rename of checkpoint ``STEP`` (its temporary directory fully written, not yet committed)
replaced by a wait, so the run is caught mid-save, alive and holding the workdir's lock.
"""

import functools
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from encoder_jax.api import pretrain

from encoder_jax.run import checkpointing
from encoder_jax import data as data_lib
from encoder_jax.core import sharding
from encoder_jax.run import pretraining
from encoder_jax.config import validation
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.data import prepare_once

import support
from support import held_run
from support import tiny_config

ROOT = support.ROOT

NUM_STEPS = 12  # tiny_config: checkpoints 4, 8, 12; evals at 6 and 12.
# Losses and norms the runs log: a resumed run must log the very same numbers.
EXACT_KEYS = ('loss', 'mlm_loss', 'mlm_accuracy', 'pair_loss', 'pair_accuracy', 'grad_norm',
              'learning_rate', 'mlm_predictions')

INJECT = '''
"""python inject.py STEP MARKER MAIN_FLAGS...: encoder_jax.main, stopped inside the save of
checkpoint STEP just before Orbax renames its written temporary directory into place; the
temporary directory's path goes to MARKER, then the run waits to be killed."""
import runpy, sys, time
from orbax.checkpoint._src.path import atomicity

STEP, MARKER = sys.argv[1:3]
del sys.argv[1:3]
_finalize = atomicity.AtomicRenameTemporaryPath.finalize


async def finalize(self):
  if self.get_final().name == STEP:
    with open(MARKER, 'w') as f:
      f.write(str(self.get()))
    while True:
      time.sleep(1)
  return await _finalize(self)


atomicity.AtomicRenameTemporaryPath.finalize = finalize
runpy.run_module('encoder_jax.main', run_name='__main__')
'''


def _once(tmp_path_factory, name: str, make) -> str:
  """A directory that ``make(directory)`` filled once per test session.

  Under pytest-xdist the tests of this module may run in several workers, each with its own
  module fixtures: they share the first worker's result (through the session's common temp
  directory, under a file lock) instead of each training the same reference run.
  """
  if not os.environ.get('PYTEST_XDIST_WORKER'):
    directory = str(tmp_path_factory.mktemp(name))
    make(directory)
    return directory
  directory = tmp_path_factory.getbasetemp().parent / f'test_faults-{name}'
  done = f'{directory}.done'

  def fill():
    shutil.rmtree(directory, ignore_errors=True)  # A worker that died while filling it.
    directory.mkdir()
    make(str(directory))
    open(done, 'w').close()

  # The first worker fills it, the others wait for `done` (prepare_once, under its lock
  # '<directory>.once.lock'; not '<directory>.lock', which make() may take to prepare data
  # into the directory).
  prepare_once.prepare_once(f'{directory}.once', done, fill)
  return str(directory)


@pytest.fixture(scope='module')
def env():
  """The subprocesses' environment: this process's, whose XLA compilation cache
  (``tests/conftest.py``) already holds the programs of the in-process reference run."""
  return dict(os.environ)


@pytest.fixture(scope='module')
def prepared_dir(tmp_path_factory):
  return _once(tmp_path_factory, 'prepared', lambda d: data_lib.load_or_prepare(
      tiny_config.get_config(f'prepared_dir={d}')))


def _config(prepared_dir):
  return tiny_config.get_config(f'prepared_dir={prepared_dir}')


def _main(prepared_dir, workdir, env, *flags, inject=None):
  cmd = [sys.executable, '-m', 'encoder_jax.main'] if inject is None else [
      sys.executable, *inject]
  cmd += [f'--config={support.TINY_CONFIG}:prepared_dir={prepared_dir}',
          f'--workdir={workdir}', *flags]
  return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _rerun(prepared_dir, workdir, capsys, caplog) -> str:
  """What the command does, in this process (the test is about what the previous run left,
  not about this run's process): its console output and log."""
  capsys.readouterr()
  pretrain.run(_config(prepared_dir), workdir)
  return capsys.readouterr().out + caplog.text


def _lines(workdir, name='metrics.jsonl'):
  with open(os.path.join(workdir, name), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


@functools.lru_cache(maxsize=None)
def _abstract_state(prepared_dir):
  """The restore target of the tiny config on this process's mesh: traced once."""
  c = _config(prepared_dir)
  return pretraining.pieces(c, sharding.make_mesh(c.mesh)).abstract_state()


def _final_state(prepared_dir, workdir):
  """(params, opt_state, data_state, step) of the newest checkpoint, on the host."""
  ckpt = checkpointing.Checkpointer(workdir, _config(prepared_dir).checkpoint)
  try:
    params, opt_state, data_state, step = ckpt.restore(_abstract_state(prepared_dir))
  finally:
    ckpt.close()
  return jax.device_get(params), jax.device_get(opt_state), data_state, step


# The uninterrupted reference never changes after its fixture: the tests that compare
# against it restore it once.
_reference_state = functools.lru_cache(maxsize=None)(_final_state)


def _assert_same_run(prepared_dir, workdir, reference):
  """``workdir`` ended exactly as the uninterrupted ``reference``: state and metrics."""
  got, want = _final_state(prepared_dir, workdir), _reference_state(prepared_dir, reference)
  assert got[3] == want[3] == NUM_STEPS
  assert got[2] == want[2]  # Data-iterator state.
  for tree_got, tree_want in zip(got[:2], want[:2]):
    flat_got, flat_want = jax.tree_util.tree_leaves(tree_got), jax.tree_util.tree_leaves(
        tree_want)
    assert len(flat_got) == len(flat_want)
    for a, b in zip(flat_got, flat_want):
      assert np.array_equal(np.asarray(a), np.asarray(b))  # Bit-exact, not close.
  lines = _lines(workdir)
  keys = [(r['step'], r['split']) for r in lines]
  assert len(keys) == len(set(keys)), keys  # Each step once (redone steps superseded).
  expected = {(r['step'], r['split']): r for r in _lines(reference)}
  assert set(keys) == set(expected)
  for r in lines:
    for key in EXACT_KEYS:
      if key in r:
        assert r[key] == expected[(r['step'], r['split'])][key], (r['step'], r['split'], key)


def _hashes(directory) -> dict:
  """relative path -> sha256 of every file (hidden ones too), and '<dir>/' for each folder."""
  out = {}
  for root, dirs, files in os.walk(directory):
    for d in dirs:
      out[os.path.relpath(os.path.join(root, d), directory) + '/'] = ''
    for f in files:
      path = os.path.join(root, f)
      with open(path, 'rb') as fh:
        out[os.path.relpath(path, directory)] = hashlib.sha256(fh.read()).hexdigest()
  return out


@pytest.fixture(scope='module')
def uninterrupted(prepared_dir, tmp_path_factory):
  root = _once(tmp_path_factory, 'uninterrupted', lambda d: pretrain.run(
      _config(prepared_dir), os.path.join(d, 'w')))
  return os.path.join(root, 'w')


@pytest.mark.slow
def test_kill_during_a_save_then_rerun_is_bit_exact_and_a_second_run_is_refused(
    prepared_dir, env, uninterrupted, tmp_path, capsys, caplog):
  workdir = str(tmp_path / 'killed')
  marker = str(tmp_path / 'saving')
  (tmp_path / 'inject.py').write_text(INJECT)
  # The killed run does not evaluate (a resume may change the period; params do not depend
  # on it): one program less to trace in its process. The rerun evaluates at 6 and 12.
  proc = _main(prepared_dir, workdir, env, '--config.train.eval_every_steps=0',
               inject=[str(tmp_path / 'inject.py'), '8', marker])
  try:
    held_run.wait_for(lambda: os.path.exists(marker), proc)
    # Caught inside the save of step 8: written to a temporary directory, not committed.
    assert os.path.isdir(open(marker).read())
    assert sorted(os.listdir(checkpointing.checkpoint_dir(workdir)))[0] == '4'
    assert '8' not in os.listdir(checkpointing.checkpoint_dir(workdir))
    # A second run on the same workdir is refused, naming the first.
    with pytest.raises(workdir_lib.WorkdirError,
                       match=rf'in use by another run \(host {socket.gethostname()}, pid '
                             rf'{proc.pid}, started '):
      pretrain.run(_config(prepared_dir), workdir)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  out = _rerun(prepared_dir, workdir, capsys, caplog)
  assert 'Took over the lock' in out and f'pid {proc.pid}' in out  # The dead run's lock.
  assert 'resuming from checkpoint step 4' in out
  _assert_same_run(prepared_dir, workdir, uninterrupted)
  superseded = _lines(workdir, 'metrics_superseded.jsonl')  # Logged before the kill, redone.
  assert superseded and min(r['step'] for r in superseded) == 5


@pytest.mark.slow
def test_damaged_newest_checkpoint_is_set_aside_and_the_run_completes(prepared_dir, uninterrupted,
                                                                      tmp_path, capsys, caplog):
  workdir = str(tmp_path / 'damaged')
  shutil.copytree(uninterrupted, workdir)
  params = os.path.join(checkpointing.checkpoint_dir(workdir), str(NUM_STEPS), 'params')
  garbled = []
  for root, _, files in os.walk(params):  # Garble every array file of the newest params.
    for f in files:
      path = os.path.join(root, f)
      if not f.startswith('_') and os.path.getsize(path) > 0 and 'manifest' not in f:
        with open(path, 'r+b') as fh:
          fh.write(b'\xde\xad\xbe\xef' * 8)
        garbled.append(path)
  assert garbled
  out = _rerun(prepared_dir, workdir, capsys, caplog)
  assert f'checkpoint step {NUM_STEPS} is damaged (' in out, out[-3000:]
  assert 'resuming from checkpoint step 8' in out
  damaged = os.listdir(checkpointing.damaged_dir(workdir))
  (kept,) = [d for d in damaged if not d.endswith('.txt')]
  assert kept.startswith(f'{NUM_STEPS}-') and f'{kept}.txt' in damaged
  reason = open(os.path.join(checkpointing.damaged_dir(workdir), f'{kept}.txt')).read()
  assert f'step: {NUM_STEPS}' in reason and 'reason: ' in reason
  assert os.path.join('checkpoints', str(NUM_STEPS)) in reason  # The reason names a file.
  assert f'set aside in {checkpointing.damaged_dir(workdir)}/{kept}' in out
  _assert_same_run(prepared_dir, workdir, uninterrupted)


REFUSED = [
    ('model.hidden_size', 48, workdir_lib.WorkdirError, 'config.model.hidden_size: 32 -> 48'),
    ('model.vocab_size', 1200, workdir_lib.WorkdirError, 'config.model.vocab_size'),
    ('train.batch_size', 16, workdir_lib.WorkdirError, 'config.train.batch_size: 8 -> 16'),
    ('seed', 1, workdir_lib.WorkdirError, 'config.seed: 0 -> 1'),
    ('data.sources', 'embedded;max_documents=200', workdir_lib.WorkdirError,
     'config.data.sources'),
    ('optim.learning_rate', -1.0, validation.ConfigError, 'optim.learning_rate'),
    ('every checkpoint damaged', None, checkpointing.CheckpointError,
     'No checkpoint .* could be restored; refusing to start from scratch'),
]


@pytest.mark.slow
@pytest.mark.parametrize('key,value,error,match', REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_resume_leaves_the_workdir_byte_for_byte_unchanged(prepared_dir, uninterrupted,
                                                                   tmp_path, key, value, error,
                                                                   match):
  workdir = str(tmp_path / 'w')
  shutil.copytree(uninterrupted, workdir)
  c = _config(prepared_dir)
  c.train.num_steps = 20  # An accepted change besides the refused one.
  if value is None:  # Every checkpoint unreadable: nothing may be moved or started over.
    for step in os.listdir(checkpointing.checkpoint_dir(workdir)):
      shutil.rmtree(os.path.join(checkpointing.checkpoint_dir(workdir), step, 'params'))
  else:
    section, _, name = key.rpartition('.')
    (c[section] if section else c)[name] = value
  before = _hashes(workdir)
  with pytest.raises(error, match=match):
    pretrain.run(c, workdir)
  assert _hashes(workdir) == before
