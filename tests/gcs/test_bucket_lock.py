"""Locks on a bucket, against the emulator: generation preconditions make them atomic
(create-if-absent, conditional take-over, heartbeat and release of our own generation
only). The workdir lock and the prepared-data lock, each raced by several processes."""

import json
import os
import subprocess
import sys
import time

import pytest

from encoder_jax import locks
from encoder_jax import storage
from encoder_jax import workdir as workdir_lib


def _lock(url: str, heartbeat_s: float = 0.0) -> locks.BucketLock:
  return locks.BucketLock(url, heartbeat_s=heartbeat_s, horizon_s=60.0)


def test_the_bucket_lock_is_created_once_refreshed_and_released(bucket):
  url = f'{bucket}/run/{workdir_lib.LOCK_FILE}'
  ours, other = _lock(url, heartbeat_s=0.05), _lock(url)
  assert ours.try_acquire() and not other.try_acquire()
  holder = other.read()
  assert holder.info.token == ours.info.token and other.stale_reason(holder) is None
  deadline = time.time() + 10
  while other.read().info.heartbeat == holder.info.heartbeat and time.time() < deadline:
    time.sleep(0.02)
  assert other.read().info.heartbeat > holder.info.heartbeat
  assert not other.take_over(holder)  # Refreshed since it was judged: left alone.
  assert ours.release() and storage.Blob(url).read() is None


def test_a_stale_lock_is_taken_over_by_exactly_one_of_two(bucket):
  url = f'{bucket}/run/{workdir_lib.LOCK_FILE}'
  dead = locks.LockInfo(host='tpu-worker-9', pid=4242, heartbeat=time.time() - 3600,
                           token='dead')
  assert storage.Blob(url).write(dead.to_text(), if_generation=0)
  first, second = _lock(url), _lock(url)
  judged = [lock.read() for lock in (first, second)]  # Both judge the same stale lock...
  assert all(lock.stale_reason(h) for lock, h in zip((first, second), judged))
  assert first.take_over(judged[0]) and first.try_acquire()
  assert not second.take_over(judged[1]) and not second.try_acquire()  # ...one wins.
  assert json.loads(storage.Blob(url).read().text)['token'] == first.info.token
  assert not second.release() and first.release()


def test_the_heartbeat_never_overwrites_a_successor(bucket):
  url = f'{bucket}/run/{workdir_lib.LOCK_FILE}'
  lost = []
  ours = locks.BucketLock(url, heartbeat_s=0.05, horizon_s=60.0, on_lost=lost.append)
  assert ours.try_acquire()
  version = storage.Blob(url).read()
  successor = locks.LockInfo.new()
  assert storage.Blob(url).write(successor.to_text(), if_generation=version.generation)
  deadline = time.time() + 10
  while not lost and time.time() < deadline:
    time.sleep(0.02)
  assert lost and lost[0].token == successor.token
  assert not ours.release()
  assert json.loads(storage.Blob(url).read().text)['token'] == successor.token


_RACER = '''
import os, sys, time
from encoder_jax import workdir
root, flags, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def barrier(name):  # Every racer has reached `name` (files in a local directory).
  open(os.path.join(flags, f'{name}-{os.getpid()}'), 'w').close()
  while sum(f.startswith(name + '-') for f in os.listdir(flags)) < n:
    time.sleep(0.005)

for r in range(rounds):
  barrier(f'start{r}')
  lock = workdir.WorkdirLock(f'{root}/round{r}', heartbeat_s=0)
  try:
    lock.acquire()
    print(r, 'got', flush=True)
  except workdir.WorkdirError as e:
    print(r, 'refused', str(e).replace(chr(10), ' '), flush=True)
  barrier(f'tried{r}')  # The winner holds the lock until every racer has tried.
  lock.release()
'''

PROCESSES, ROUNDS = 5, 10


def test_of_runs_started_together_on_a_bucket_exactly_one_gets_the_lock(bucket, tmp_path):
  racers = [subprocess.Popen([sys.executable, '-c', _RACER, f'{bucket}/race', str(tmp_path),
                              str(PROCESSES), str(ROUNDS)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ))
            for _ in range(PROCESSES)]
  outputs = [r.communicate(timeout=120) for r in racers]
  assert all(r.returncode == 0 for r in racers), [err[-2000:] for _, err in outputs]
  lines = [line.split(' ', 2) for out, _ in outputs for line in out.splitlines()]
  for r in range(ROUNDS):
    outcomes = sorted(line[1] for line in lines if line[0] == str(r))
    assert outcomes == ['got'] + ['refused'] * (PROCESSES - 1), (r, outcomes)
  refusals = {line[2].split(' (host')[0] for line in lines if line[1] == 'refused'}
  assert refusals == {f'{bucket}/race/round{r} is in use by another run' for r in range(ROUNDS)}
  for r in range(ROUNDS):  # Every winner released its lock.
    assert storage.Blob(f'{bucket}/race/round{r}/{workdir_lib.LOCK_FILE}').read() is None


_PREPARER = '''
import os, sys, time
from encoder_jax import storage
from encoder_jax.data import prepare_once
root, flags, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def barrier(name):
  open(os.path.join(flags, f'{name}-{os.getpid()}'), 'w').close()
  while sum(f.startswith(name + '-') for f in os.listdir(flags)) < n:
    time.sleep(0.005)

for r in range(rounds):
  barrier(f'start{r}')
  directory = f'{root}/round{r}'
  manifest = f'{directory}/manifest.json'
  def prepare():
    time.sleep(0.3)  # The others arrive meanwhile and wait.
    storage.Blob(manifest).write(str(os.getpid()), if_generation=0)
  print(r, 'prepared' if prepare_once.prepare_once(directory, manifest, prepare) else 'waited',
        flush=True)
'''


def test_of_processes_asking_at_once_for_data_on_a_bucket_exactly_one_prepares(bucket,
                                                                                tmp_path):
  processes, rounds = 4, 4
  racers = [subprocess.Popen([sys.executable, '-c', _PREPARER, f'{bucket}/prepared',
                              str(tmp_path), str(processes), str(rounds)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(processes)]
  outputs = [r.communicate(timeout=120) for r in racers]
  assert all(r.returncode == 0 for r in racers), [err[-2000:] for _, err in outputs]
  lines = [line.split() for out, _ in outputs for line in out.splitlines()]
  for r in range(rounds):
    outcomes = sorted(line[1] for line in lines if line[0] == str(r))
    assert outcomes == ['prepared'] + ['waited'] * (processes - 1), (r, outcomes)
    assert not storage.exists(f'{bucket}/prepared/round{r}.lock')  # Released.
