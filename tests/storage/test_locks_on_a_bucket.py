"""Locks on a bucket, against the emulator: generation preconditions make them atomic
(create-if-absent, conditional take-over, heartbeat and release of our own generation
only). The workdir lock and the prepared-data lock, each raced by several processes."""

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from encoder_jax.storage import locks
from encoder_jax.storage import paths as storage
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.data import prepare_once

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def _lock(url: str, heartbeat_s: float = 0.0) -> locks.Lock:
  return locks.Lock(url, heartbeat_s=heartbeat_s, horizon_s=60.0)


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


def test_the_bucket_lock_store_is_chosen_by_the_path(bucket, tmp_path):
  assert type(locks.store_for(f'{bucket}/x.lock')).__name__ == '_BucketStore'
  assert type(locks.store_for(str(tmp_path / 'x.lock'))).__name__ == '_FileStore'
  with pytest.raises(ValueError, match=r's3://b/x\.lock: a lock needs a local path or a gs://'):
    locks.store_for('s3://b/x.lock')


def test_the_heartbeat_adopts_its_own_write_whose_reply_was_lost(bucket):
  """A rewrite that landed while its caller saw an error leaves a newer generation of our
  own lock: the next beat finds its precondition failed, reads the lock, sees our token,
  and refreshes on from there instead of taking the lock as lost."""
  url = f'{bucket}/run/{workdir_lib.LOCK_FILE}'
  lost = []
  ours = locks.Lock(url, heartbeat_s=0.1, horizon_s=60.0, on_lost=lost.append)
  assert ours.try_acquire()
  version = storage.Blob(url).read()
  landed = dataclasses.replace(ours.info, heartbeat=time.time() + 1).to_text()
  assert storage.Blob(url).write(landed, if_generation=version.generation)
  deadline = time.time() + 10
  while storage.Blob(url).read().text == landed and time.time() < deadline:
    time.sleep(0.05)
  now = storage.Blob(url).read()
  assert now.text != landed and json.loads(now.text)['token'] == ours.info.token and not lost
  assert ours.release() and storage.Blob(url).read() is None


def test_a_heartbeat_on_a_bucket_rides_out_failures_then_stops_the_holder_in_time(
    bucket, faulty_proxy, monkeypatch):
  """Requests on the lock refused (403: not retried by the client) for a moment: the
  heartbeat tries again and recovers. Refused for good: the lock is lost, naming the
  storage error, before another process could take it over (horizon 3 s)."""
  refusing, name = threading.Event(), storage.split(bucket + '/x')[0]
  proxy = faulty_proxy(deny=lambda library, method, path: refusing.is_set() and name in path)
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', proxy.url)
  url, lost = f'{bucket}/run/{workdir_lib.LOCK_FILE}', []
  lock = locks.Lock(url, heartbeat_s=0.1, horizon_s=3.0, on_lost=lost.append)
  assert lock.try_acquire()
  refusing.set()
  time.sleep(0.5)
  refusing.clear()
  beat, deadline = lock.info.heartbeat, time.time() + 10
  while lock.info.heartbeat == beat and time.time() < deadline:
    time.sleep(0.02)
  assert lock.info.heartbeat > beat and not lost
  lock.check()
  refusing.set()
  last_refresh, deadline = lock.info.heartbeat, time.time() + 10
  while not lost and time.time() < deadline:
    time.sleep(0.02)
  assert lost and time.time() - last_refresh < lock.horizon_s
  assert 'could not be refreshed' in str(lost[0]) and 'permission denied' in str(lost[0])
  with pytest.raises(locks.LockLost):
    lock.check()
  refusing.clear()
  assert lock.release() and storage.Blob(url).read() is None


def test_the_bucket_lock_works_when_the_replies_to_its_writes_are_lost(bucket, faulty_proxy,
                                                                     monkeypatch):
  """Every other upload lands and is answered 503: its retry meets the write before it.
  Taking, refreshing and releasing the lock still work, and nothing is taken as lost."""
  uploads = itertools.count()
  proxy = faulty_proxy(lose_reply=lambda library, method, path: method == 'POST' and (
      '/upload/' in path) and next(uploads) % 2 == 0)
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', proxy.url)
  url, lost = f'{bucket}/run/{workdir_lib.LOCK_FILE}', []
  lock = locks.Lock(url, heartbeat_s=0.05, horizon_s=60.0, on_lost=lost.append)
  assert lock.try_acquire()
  first, deadline = lock.info.heartbeat, time.time() + 20
  while lock.info.heartbeat == first and time.time() < deadline:
    time.sleep(0.02)
  assert lock.info.heartbeat > first and not lost and sum(proxy.lost.values()) >= 2
  lock.check()
  assert lock.release() and storage.Blob(url).read() is None


def test_the_heartbeat_never_overwrites_a_successor(bucket):
  url = f'{bucket}/run/{workdir_lib.LOCK_FILE}'
  lost = []
  ours = locks.Lock(url, heartbeat_s=0.05, horizon_s=60.0, on_lost=lost.append)
  assert ours.try_acquire()
  version = storage.Blob(url).read()
  successor = locks.LockInfo.new()
  assert storage.Blob(url).write(successor.to_text(), if_generation=version.generation)
  deadline = time.time() + 10
  while not lost and time.time() < deadline:
    time.sleep(0.02)
  assert lost and lost[0].holder.token == successor.token
  assert not ours.release()
  assert json.loads(storage.Blob(url).read().text)['token'] == successor.token


_RACER = '''
import os, sys, time
from encoder_jax.run import workdir
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
from encoder_jax.storage import paths as storage
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


def test_a_half_uploaded_prepared_tree_is_replaced_by_the_next_preparer(bucket, tmp_path,
                                                                       monkeypatch):
  """A preparer killed mid-upload left objects and no manifest: the next one (holding the
  lock, the only writer) replaces them, and deletes those the new tree lacks."""
  monkeypatch.setenv(prepare_once.CACHE_ENV, str(tmp_path / 'cache'))
  url = f'{bucket}/prepared'
  for name, text in (('train/0.bin', 'half'), ('stale-shard.bin', 'old')):
    assert storage.Blob(f'{url}/{name}').write(text, if_generation=0)

  def prepare(local):
    os.makedirs(os.path.join(local, 'train'))
    for name, text in (('train/0.bin', 'whole'), ('tokenizer.model', 'vocab'),
                       ('manifest.json', '{"complete": true}')):
      with open(os.path.join(local, name), 'w', encoding='utf-8') as f:
        f.write(text)

  local = prepare_once.through_bucket(url, 'manifest.json', prepare)
  objects = {name: storage.Blob(f'{url}/{name}').read().text
             for name in storage.generations(url)}
  assert objects == {'train/0.bin': 'whole', 'tokenizer.model': 'vocab',
                     'manifest.json': '{"complete": true}'}
  with open(os.path.join(local, 'train', '0.bin'), encoding='utf-8') as f:
    assert f.read() == 'whole'
  assert not os.path.exists(os.path.join(local, 'stale-shard.bin'))
  assert not storage.exists(prepare_once.lock_path(url))


def test_waiting_hosts_poll_the_bucket_with_backoff(bucket, faulty_proxy, monkeypatch):
  """A host waiting 5 s for another's preparation sends a few requests, not the ~70 of a
  steady poll every 0.5 s (7 requests a look)."""
  url = f'{bucket}/prepared'
  holder = locks.Lock(prepare_once.lock_path(url), heartbeat_s=0, horizon_s=180.0)
  assert holder.try_acquire()  # A live preparer (this process): never stale here.
  proxy = faulty_proxy({})  # Forwards every request, counting them.
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', proxy.url)
  with pytest.raises(TimeoutError, match=r'Waited 5 s for process'):
    prepare_once.prepare_once(url, f'{url}/manifest.json', lambda: None, timeout_s=5.0)
  requests = sum(proxy.forwarded.values())
  assert 3 <= requests <= 30, proxy.forwarded
  monkeypatch.undo()
  assert holder.release()
