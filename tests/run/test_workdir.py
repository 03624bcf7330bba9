"""The workdir's guards: writability, one run at a time, refused resumes that change nothing."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from encoder_jax.config import schema as config_base
from encoder_jax.storage import locks
from encoder_jax.run import workdir as workdir_lib

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def _config():
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  return c


def _snapshot(directory):
  """Every file under ``directory`` with its bytes: 'byte-for-byte as it was'."""
  out = {}
  for root, _, files in os.walk(directory):
    for f in files:
      p = os.path.join(root, f)
      with open(p, 'rb') as fh:
        out[os.path.relpath(p, directory)] = fh.read()
  return out


# ---- config.json ----


def test_write_config_is_atomic(tmp_path, monkeypatch):
  c = _config()
  workdir_lib.write_config(str(tmp_path), c)
  before = (tmp_path / 'config.json').read_bytes()
  assert json.loads(before)['model']['hidden_size'] == 128

  def killed_mid_rename(src, dst):
    raise OSError('killed')

  c.model.hidden_size = 256
  monkeypatch.setattr(os, 'replace', killed_mid_rename)
  with pytest.raises(OSError, match='killed'):
    workdir_lib.write_config(str(tmp_path), c)
  monkeypatch.undo()
  assert (tmp_path / 'config.json').read_bytes() == before  # Old file whole, no temp left.
  assert sorted(os.listdir(tmp_path)) == ['config.json']
  workdir_lib.write_config(str(tmp_path), c)
  assert json.loads((tmp_path / 'config.json').read_text())['model']['hidden_size'] == 256


def test_resume_config_accepts_schedule_changes_and_lists_them(tmp_path):
  c = _config()
  assert workdir_lib.check_resume_config(str(tmp_path), c) == []  # New workdir.
  workdir_lib.write_config(str(tmp_path), c)
  assert workdir_lib.check_resume_config(str(tmp_path), c) == []  # Same config.
  c.optim.learning_rate = 5e-4
  c.train.num_steps = 600
  c.checkpoint.every_steps = 50
  c.mesh.fsdp = 2
  changes = workdir_lib.check_resume_config(str(tmp_path), c)
  assert [str(x) for x in changes] == [
      'checkpoint.every_steps: 100 -> 50', 'mesh.fsdp: 1 -> 2',
      'optim.learning_rate: 0.001 -> 0.0005', 'train.num_steps: 300 -> 600']


@pytest.mark.parametrize('key,value', [
    ('model.hidden_size', 256), ('model.vocab_size', 9000), ('train.batch_size', 64),
    ('data.sources', 'text:/corpus/*.txt'), ('seed', 1), ('train.seq_lens', (64, 256)),
    ('objective.names', ('mlm',)), ('tokenizer.kind', 'wordpiece'), ('optim.name', 'lamb')])
def test_refused_resume_names_the_keys_and_leaves_the_workdir_untouched(tmp_path, key, value):
  c = _config()
  workdir_lib.write_config(str(tmp_path), c)
  (tmp_path / 'metrics.jsonl').write_text('{"step": 1}\n')
  before = _snapshot(tmp_path)
  section, _, name = key.rpartition('.')
  (c[section] if section else c)[name] = value
  c.optim.learning_rate = 5e-4  # An accepted change does not hide the refused one.
  with pytest.raises(workdir_lib.WorkdirError) as e:
    workdir_lib.check_resume_config(str(tmp_path), c)
  message = str(e.value)
  assert f'config.{key}: ' in message and 'learning_rate' not in message.split('A resume')[0]
  assert 'A resume may change: optim.learning_rate' in message and 'another --workdir' in message
  assert _snapshot(tmp_path) == before


def test_resume_config_from_an_older_schema_and_a_damaged_file(tmp_path):
  c = _config()
  workdir_lib.write_config(str(tmp_path), c)
  saved = json.loads((tmp_path / 'config.json').read_text())
  del saved['model']['remat'], saved['model']['initializer_range']  # Keys added since.
  saved['model']['retired_key'] = 1  # A key removed since.
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  assert workdir_lib.check_resume_config(str(tmp_path), c) == []  # Defaults: accepted.
  c.model.initializer_range = 0.5
  with pytest.raises(workdir_lib.WorkdirError,
                     match=r"config.model.initializer_range: '<absent>' -> 0.5"):
    workdir_lib.check_resume_config(str(tmp_path), c)
  (tmp_path / 'config.json').write_text('{"model": ')
  with pytest.raises(workdir_lib.WorkdirError, match=r'config.json is not valid JSON'):
    workdir_lib.check_resume_config(str(tmp_path), c)


# ---- writability ----


def test_writable_workdir_is_not_created_by_the_check(tmp_path):
  workdir_lib.check_workdir_writable(str(tmp_path))
  new = tmp_path / 'a' / 'b'
  workdir_lib.check_workdir_writable(str(new))
  assert not (tmp_path / 'a').exists() and os.listdir(tmp_path) == []


def test_unwritable_workdirs_are_named(tmp_path):
  (tmp_path / 'file').write_text('x')
  for bad, match in [('/proc/x', r'--workdir=/proc/x: cannot write in /proc'),
                     (str(tmp_path / 'file'), 'exists and is not a directory'),
                     (str(tmp_path / 'file' / 'sub'), r'cannot create it, .*file is a file'),
                     ('', 'is empty')]:
    with pytest.raises(workdir_lib.WorkdirError, match=match):
      workdir_lib.check_workdir_writable(bad)


# ---- the lock ----


def _lock_info(tmp_path):
  return json.loads((tmp_path / workdir_lib.LOCK_FILE).read_text())


def test_second_run_is_refused_naming_the_first(tmp_path):
  with workdir_lib.WorkdirLock(str(tmp_path)) as lock:
    info = _lock_info(tmp_path)
    assert (info['host'], info['pid']) == (socket.gethostname(), os.getpid())
    with pytest.raises(workdir_lib.WorkdirError) as e:
      workdir_lib.WorkdirLock(str(tmp_path)).acquire()
    for part in (f'host {socket.gethostname()}', f'pid {os.getpid()}',
                 f'started {lock.info.start_time}', 'another --workdir'):
      assert part in str(e.value)
  assert not (tmp_path / workdir_lib.LOCK_FILE).exists()  # Released on exit.


def test_lock_is_released_on_an_exception_and_disabled_on_other_processes(tmp_path):
  with pytest.raises(RuntimeError):
    with workdir_lib.WorkdirLock(str(tmp_path)):
      raise RuntimeError('training failed')
  assert not (tmp_path / workdir_lib.LOCK_FILE).exists()
  with workdir_lib.WorkdirLock(str(tmp_path), enabled=False):  # Process 1 of a multi-host run.
    assert not (tmp_path / workdir_lib.LOCK_FILE).exists()


def _write_lock(tmp_path, **fields):
  now = time.time()
  info = dict(host=socket.gethostname(), pid=os.getpid(), start_time='2024-01-01T00:00:00+00:00',
              started=now, heartbeat=now, token='other', proc_start=None,
              boot_id=locks.boot_id())
  info.update(fields)
  (tmp_path / workdir_lib.LOCK_FILE).write_text(json.dumps(info))


def test_lock_of_a_dead_process_on_this_host_is_taken_over(tmp_path):
  dead = subprocess.Popen([sys.executable, '-c', 'pass'])
  dead.wait()
  _write_lock(tmp_path, pid=dead.pid)
  with workdir_lib.WorkdirLock(str(tmp_path)) as lock:
    assert lock.took_over.pid == dead.pid and _lock_info(tmp_path)['pid'] == os.getpid()
  # A live pid with another start time is a reused pid: its run is gone too.
  _write_lock(tmp_path, pid=os.getpid(), proc_start=1)
  with workdir_lib.WorkdirLock(str(tmp_path)) as lock:
    assert lock.took_over is not None
  # A lock file a run died writing (empty, a minute old) is taken over as well.
  (tmp_path / workdir_lib.LOCK_FILE).write_text('')
  old = time.time() - 120
  os.utime(tmp_path / workdir_lib.LOCK_FILE, (old, old))
  with workdir_lib.WorkdirLock(str(tmp_path)):
    assert _lock_info(tmp_path)['pid'] == os.getpid()


def test_lock_from_another_host_is_kept_until_its_heartbeat_is_stale(tmp_path):
  _write_lock(tmp_path, host='tpu-worker-7', pid=12345, heartbeat=time.time() - 60)
  with pytest.raises(workdir_lib.WorkdirError, match=r'host tpu-worker-7, pid 12345, started'):
    workdir_lib.WorkdirLock(str(tmp_path), wait_s=0).acquire()
  _write_lock(tmp_path, host='tpu-worker-7', pid=12345,
              heartbeat=time.time() - workdir_lib.STALE_AFTER_S - 60)
  with workdir_lib.WorkdirLock(str(tmp_path)) as lock:
    assert lock.took_over.host == 'tpu-worker-7'


def test_a_restart_waits_out_the_lock_of_a_run_hard_killed_elsewhere(tmp_path, capsys):
  """The killed run's lock is fresh and names a machine whose pid this one cannot check
  (another host, or this host name before a reboot): the restart waits, saying so in one
  line, and takes it over once it has gone unrefreshed for the horizon."""
  _write_lock(tmp_path, host=socket.gethostname(), pid=12345, boot_id='before-the-reboot')
  began = time.monotonic()
  with workdir_lib.WorkdirLock(str(tmp_path), heartbeat_s=0.1, stale_after_s=1.0) as lock:
    assert lock.wait_s == pytest.approx(1.3) and lock.took_over.pid == 12345
  assert 1.0 <= time.monotonic() - began < 5.0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      f'Waiting up to 1 s for the lock {tmp_path / workdir_lib.LOCK_FILE}: it is held by '
      f'host {socket.gethostname()}, pid 12345, started 2024-01-01T00:00:00+00:00, last '
      'refreshed 0 s ago, a run this machine cannot check'), lines
  assert 'Taken over once unrefreshed for 1 s; refused at once if refreshed' in lines[0]


def test_a_run_refreshing_its_lock_elsewhere_is_refused_while_the_restart_waits(tmp_path):
  _write_lock(tmp_path, host='tpu-worker-7', pid=12345)
  beating = threading.Event()

  def beat():  # The holder is alive on another host.
    while not beating.wait(0.05):
      _write_lock(tmp_path, host='tpu-worker-7', pid=12345)

  thread = threading.Thread(target=beat)
  thread.start()
  try:
    began = time.monotonic()
    with pytest.raises(workdir_lib.WorkdirError, match=r'host tpu-worker-7, pid 12345.*it was '
                       r'refreshed while this process waited: that run is alive'):
      workdir_lib.WorkdirLock(str(tmp_path), wait_s=60.0).acquire()
    assert time.monotonic() - began < 5.0
  finally:
    beating.set()
    thread.join()


def test_a_lost_lock_stops_the_run_at_its_next_check(tmp_path):
  """Another run took the workdir (here: its lock written over ours): check() raises a
  LockLost naming the lock, and leaving the block normally raises it too."""
  with pytest.raises(locks.LockLost, match=r'\.lock is no longer ours \(now: host tpu-worker-7'
                     r'.*\. This run stops .*; rerun the same command to resume'):
    with workdir_lib.WorkdirLock(str(tmp_path), heartbeat_s=0.05) as lock:
      lock.check()
      _write_lock(tmp_path, host='tpu-worker-7', pid=12345)
      deadline = time.monotonic() + 10
      with pytest.raises(locks.LockLost):
        while time.monotonic() < deadline:  # The next beats find the lock replaced.
          lock.check()
          time.sleep(0.02)
  assert _lock_info(tmp_path)['host'] == 'tpu-worker-7'  # The successor's lock is kept.


def test_every_process_of_a_run_stops_when_process_0_lost_the_lock(tmp_path, monkeypatch):
  import jax
  import numpy as np
  from jax.experimental import multihost_utils
  lock = workdir_lib.WorkdirLock(str(tmp_path), enabled=False)  # Process 1: holds nothing.
  lock.check(everywhere=True)  # One process: nothing to learn.
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(multihost_utils, 'broadcast_one_to_all', lambda x: np.int32(0))
  lock.check(everywhere=True)  # Process 0 holds its lock.
  monkeypatch.setattr(multihost_utils, 'broadcast_one_to_all', lambda x: np.int32(1))
  lock.check()  # Not a collective: this process's own lock only.
  with pytest.raises(locks.LockLost, match=r'process 0 lost the lock of .*every process'):
    lock.check(everywhere=True)


def test_heartbeat_refreshes_the_lock(tmp_path):
  with workdir_lib.WorkdirLock(str(tmp_path), heartbeat_s=0.05):
    first = _lock_info(tmp_path)['heartbeat']
    deadline = time.time() + 10
    while _lock_info(tmp_path)['heartbeat'] == first and time.time() < deadline:
      time.sleep(0.05)
    assert _lock_info(tmp_path)['heartbeat'] > first
  assert not (tmp_path / workdir_lib.LOCK_FILE).exists()


# The gs:// store (locks._BucketStore): against the emulator in
# tests/storage/test_locks_on_a_bucket.py.

_RACER = '''
import glob, os, sys, time
from encoder_jax.run import workdir
workdir_path, start, flags = sys.argv[1], float(sys.argv[2]), sys.argv[3]
time.sleep(max(0.0, start - time.time()))
lock = workdir.WorkdirLock(workdir_path, heartbeat_s=0)
try:
  lock.acquire()
  print('got', flush=True)
except workdir.WorkdirError as e:
  print('refused', e, flush=True)
open(os.path.join(flags, str(os.getpid())), 'w').close()
deadline = time.time() + 60  # The winner holds the lock until every racer has tried.
while lock.info is not None and len(os.listdir(flags)) < 3 and time.time() < deadline:
  time.sleep(0.05)
lock.release()
'''


def test_of_runs_started_together_exactly_one_gets_the_lock(tmp_path):
  workdir, flags = tmp_path / 'w', tmp_path / 'tried'
  flags.mkdir()
  start = str(time.time() + 3)  # After every interpreter has imported the module.
  racers = [subprocess.Popen([sys.executable, '-c', _RACER, str(workdir), start, str(flags)],
                             stdout=subprocess.PIPE, text=True) for _ in range(3)]
  outputs = [r.communicate(timeout=120)[0] for r in racers]
  assert sorted(o.split()[0] for o in outputs) == ['got', 'refused', 'refused'], outputs
  assert not (workdir / workdir_lib.LOCK_FILE).exists()


def test_run_lock_is_taken_once_per_run_and_every_process_learns_a_refusal(tmp_path,
                                                                           monkeypatch):
  import jax
  import numpy as np
  from jax.experimental import multihost_utils
  with workdir_lib.run_lock(str(tmp_path)) as lock:  # One process: process 0 takes it.
    assert lock.enabled and _lock_info(tmp_path)['token'] == lock.info.token
  assert not (tmp_path / workdir_lib.LOCK_FILE).exists()

  _write_lock(tmp_path, host='tpu-worker-0', pid=4242)  # Another run's live lock.
  monkeypatch.setenv(workdir_lib.WAIT_ENV, '0')  # Refused at once, not waited for.
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(multihost_utils, 'broadcast_one_to_all', lambda x: np.int32(0))
  with pytest.raises(workdir_lib.WorkdirError, match=r'host tpu-worker-0, pid 4242'):
    workdir_lib.run_lock(str(tmp_path))  # Process 0 names the holder...
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  with pytest.raises(workdir_lib.WorkdirError, match=r'process 0 could not take its lock'):
    workdir_lib.run_lock(str(tmp_path))  # ...and process 1 stops too.
  (tmp_path / workdir_lib.LOCK_FILE).unlink()
  monkeypatch.setattr(multihost_utils, 'broadcast_one_to_all', lambda x: np.int32(1))
  with workdir_lib.run_lock(str(tmp_path)) as lock:  # Process 1 of a run that holds it.
    assert not lock.enabled and not (tmp_path / workdir_lib.LOCK_FILE).exists()
