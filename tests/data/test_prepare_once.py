"""encoder_jax.data.prepare_once: one of the callers asking at once for a prepared directory
prepares it and the others wait; a dead or reused pid's lock is taken over, a live owner's
waited for until a timeout that names it, and a failed preparation stops its waiters. (On a
bucket: tests/storage/test_locks_on_a_bucket.py.)"""

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from encoder_jax.data import prepare_once
from encoder_jax.storage import locks


def _racers(tmp_path, n, work_s, **kw):
  directory, calls = str(tmp_path / 'prep'), []
  manifest = os.path.join(directory, 'manifest.json')

  def work():
    calls.append(1)
    time.sleep(work_s)
    os.makedirs(directory)
    open(manifest, 'w').close()

  results = [None] * n
  threads = [threading.Thread(target=lambda i=i: results.__setitem__(
      i, prepare_once.prepare_once(directory, manifest, work, **kw))) for i in range(n)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return results, calls, directory


def test_concurrent_callers_prepare_once_and_the_others_wait(tmp_path):
  results, calls, directory = _racers(tmp_path, 3, 1.0)
  assert len(calls) == 1 and sorted(results) == [False, False, True]
  assert not os.path.exists(prepare_once.lock_path(directory))


def test_lock_of_a_dead_process_is_taken_over(tmp_path):
  directory = str(tmp_path / 'prep')
  dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'],
                        capture_output=True, text=True, check=True).stdout.strip()
  with open(prepare_once.lock_path(directory), 'w') as f:
    json.dump(dict(host=socket.gethostname(), pid=int(dead), boot_id=locks.boot_id()), f)
  manifest = os.path.join(directory, 'manifest.json')
  assert prepare_once.prepare_once(directory, manifest, lambda: None)
  # Another host's lock that nobody touches is stale after stale_s.
  with open(prepare_once.lock_path(directory), 'w') as f:
    json.dump(dict(host='elsewhere', pid=1), f)
  assert prepare_once.prepare_once(directory, manifest, lambda: None, stale_s=1.0)


def test_lock_of_a_reused_pid_is_taken_over_at_once(tmp_path):
  """A lock naming a live pid of this host whose process started at another time (the pid
  was reused) is its dead owner's: taken over without waiting for stale_s."""
  start = locks.process_start(os.getpid())
  if start is None:
    pytest.skip('no /proc: a reused pid cannot be told from its first owner here')
  directory = str(tmp_path / 'prep')
  info = dataclasses.replace(locks.LockInfo.new(), token='other', proc_start=start + 1)
  with open(prepare_once.lock_path(directory), 'w') as f:
    f.write(info.to_text())
  manifest = os.path.join(directory, 'manifest.json')
  began = time.monotonic()
  assert prepare_once.prepare_once(directory, manifest, lambda: None, timeout_s=30.0)
  assert time.monotonic() - began < 10.0 and not os.path.exists(prepare_once.lock_path(directory))


def test_waiter_times_out_naming_the_lock_and_its_owner(tmp_path):
  directory = str(tmp_path / 'prep')
  with open(prepare_once.lock_path(directory), 'w') as f:
    json.dump(dict(host=socket.gethostname(), pid=os.getpid()), f)  # Alive: this process.
  with pytest.raises(TimeoutError, match=rf'Waited 1 s for process {os.getpid()} .*'
                     r'prep\.lock.*python -m encoder_jax\.prepare'):
    prepare_once.prepare_once(directory, os.path.join(directory, 'm'), lambda: None,
                              timeout_s=1.0)


def test_failed_preparation_stops_the_waiters(tmp_path):
  directory = str(tmp_path / 'prep')
  manifest = os.path.join(directory, 'manifest.json')
  errors = []

  def failing():
    time.sleep(1.0)
    raise ValueError('corpus is empty')

  def call(fn):
    try:
      prepare_once.prepare_once(directory, manifest, fn)
    except (ValueError, FileNotFoundError) as e:
      errors.append(e)

  owner = threading.Thread(target=call, args=(failing,))
  owner.start()
  time.sleep(0.3)
  call(lambda: pytest.fail('a waiter must not repeat a failed preparation'))
  owner.join()
  assert sorted(type(e).__name__ for e in errors) == ['FileNotFoundError', 'ValueError']
  assert re.search(rf'process {os.getpid()} on .* stopped preparing .* without writing .*'
                   'manifest.json', str(next(e for e in errors if isinstance(e, OSError))))
