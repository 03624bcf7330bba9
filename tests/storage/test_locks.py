"""encoder_jax.storage.locks, the one lock-file helper: exclusive acquisition, staleness and
take-over, the heartbeat, and a release that leaves a successor's lock alone."""

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from encoder_jax.storage import locks
from encoder_jax.storage import paths as storage

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def _lock(tmp_path, **kw):
  kw = dict(heartbeat_s=0, horizon_s=60.0) | kw
  return locks.Lock(str(tmp_path / 'x.lock'), **kw)


def _write(tmp_path, **fields) -> str:
  """Another holder's lock file; returns its text."""
  now = time.time()
  info = dataclasses.replace(locks.LockInfo.new(), token='other', started=now, heartbeat=now)
  text = dataclasses.replace(info, **fields).to_text()
  (tmp_path / 'x.tmp').write_text(text)
  os.replace(tmp_path / 'x.tmp', tmp_path / 'x.lock')  # Atomic, as a heartbeat reads it.
  return text


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


def test_of_callers_racing_exactly_one_acquires_and_the_others_see_it(tmp_path):
  contenders = [_lock(tmp_path) for _ in range(8)]
  barrier = threading.Barrier(len(contenders))
  got = [None] * len(contenders)

  def race(i):
    barrier.wait()
    got[i] = contenders[i].try_acquire()

  threads = [threading.Thread(target=race, args=(i,)) for i in range(len(contenders))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert sorted(got) == [False] * 7 + [True]
  winner, loser = contenders[got.index(True)], contenders[got.index(False)]
  holder = loser.read()
  assert holder.info == winner.info and holder.info.pid == os.getpid()
  assert holder.info.host == socket.gethostname() and holder.info.proc_start == (
      locks.process_start(os.getpid()))
  assert loser.stale_reason(holder) is None  # Its holder (this process) runs.
  assert not loser.take_over(dataclasses.replace(holder, version='{}'))  # Not what is there.
  assert loser.read() == holder and not loser.try_acquire()
  assert winner.release() and not (tmp_path / 'x.lock').exists()
  assert not winner.release()  # Twice: nothing left to do.
  assert loser.try_acquire() and loser.release()


def test_lock_of_a_dead_or_reused_pid_on_this_host_is_taken_over(tmp_path):
  lock = _lock(tmp_path)
  dead = _dead_pid()
  text = _write(tmp_path, pid=dead, heartbeat=time.time())  # Fresh heartbeat, dead pid.
  holder = lock.read()
  assert holder.info.pid == dead and holder.text == text
  assert lock.stale_reason(holder) == f'process {dead} on this host is no longer running'
  assert lock.take_over(holder) and not (tmp_path / 'x.lock').exists()
  assert lock.try_acquire() and lock.info.pid == os.getpid() and lock.release()

  if locks.process_start(os.getpid()) is None:
    pytest.skip('no /proc: a reused pid cannot be told from its first owner here')
  _write(tmp_path, proc_start=locks.process_start(os.getpid()) + 1)  # Our pid, reused.
  assert 'no longer running' in lock.stale_reason(lock.read())
  _write(tmp_path, proc_start=locks.process_start(os.getpid()))  # Us: alive.
  assert lock.stale_reason(lock.read()) is None


def test_another_hosts_lock_is_stale_only_past_the_horizon(tmp_path):
  lock = _lock(tmp_path, horizon_s=60.0, heartbeat_s=10.0)
  _write(tmp_path, host='elsewhere', pid=1, heartbeat=time.time() - 30)
  assert lock.stale_reason(lock.read()) is None
  _write(tmp_path, host='elsewhere', pid=1, heartbeat=time.time() - 90)
  assert lock.stale_reason(lock.read()) == (
      'it was last refreshed 90 s ago; the horizon is 60 s, a live holder refreshes it every '
      '10 s')
  # A waiter's own clock (IdleClock) overrides the holder's, in both directions.
  assert lock.stale_reason(lock.read(), idle_s=5.0) is None
  _write(tmp_path, host='elsewhere', pid=1)
  assert lock.stale_reason(lock.read(), idle_s=61.0) is not None
  # On this host a live pid decides, unless the horizon is asked for there too.
  _write(tmp_path, heartbeat=time.time() - 3600)
  assert lock.stale_reason(lock.read()) is None
  assert _lock(tmp_path, horizon_on_this_host=True).stale_reason(lock.read()) is not None


def test_an_unreadable_lock_is_waited_for_then_taken_over(tmp_path):
  lock = _lock(tmp_path, horizon_s=600.0)
  (tmp_path / 'x.lock').write_text('')  # Created, not yet written.
  holder = lock.read()
  assert holder.info is None and lock.stale_reason(holder) is None
  old = time.time() - locks.UNREADABLE_S - 5
  os.utime(tmp_path / 'x.lock', (old, old))
  holder = lock.read()
  assert lock.stale_reason(holder).startswith("unreadable ('') for 65 s")
  assert lock.take_over(holder) and lock.try_acquire() and lock.release()


@pytest.mark.parametrize('text', ['', '[]', '{"host": "h"}', '{"host": "h", "pid": 0}',
                                  '{"host": "h", "pid": "12"}', '{"host": 3, "pid": 12}'])
def test_a_text_naming_no_holder_is_not_a_lock(text):
  with pytest.raises((ValueError, TypeError)):
    locks.LockInfo.from_text(text)


def test_lock_info_round_trips_and_old_locks_with_host_and_pid_only_read():
  info = locks.LockInfo.new()
  assert locks.LockInfo.from_text(info.to_text()) == info
  old = locks.LockInfo.from_text('{"host": "h", "pid": 12, "started": 1.5, "extra": 1}')
  assert (old.host, old.pid, old.started, old.heartbeat, old.token) == ('h', 12, 1.5, None, '')


def test_heartbeat_refreshes_the_lock_and_stops_once_it_is_taken(tmp_path):
  lost = []
  lock = _lock(tmp_path, heartbeat_s=0.05, on_lost=lost.append)
  assert lock.try_acquire()
  first = lock.read().info
  deadline = time.time() + 10
  while lock.read().info.heartbeat == first.heartbeat and time.time() < deadline:
    time.sleep(0.02)
  now = lock.read().info
  assert now.heartbeat > first.heartbeat and now.token == first.token == lock.info.token
  assert now.started == first.started  # Only the heartbeat changes.
  successor = _write(tmp_path, token='successor')  # Taken over (wrongly) by another run.
  deadline = time.time() + 10
  while not lost and time.time() < deadline:
    time.sleep(0.02)
    if not lost and (tmp_path / 'x.lock').read_text() != successor:
      # A beat that had read its own lock just before rewrote it: take it over again.
      successor = _write(tmp_path, token='successor')
  assert [e.holder.token for e in lost] == ['successor']
  time.sleep(0.2)  # The heartbeat has stopped: it does not write over the successor's lock.
  assert (tmp_path / 'x.lock').read_text() == successor
  assert not lock.release() and (tmp_path / 'x.lock').read_text() == successor


def test_release_and_take_over_leave_a_successors_lock_alone(tmp_path):
  lock = _lock(tmp_path)
  assert lock.try_acquire()
  successor = _write(tmp_path, token='successor')
  assert not lock.release() and lock.info is None
  assert (tmp_path / 'x.lock').read_text() == successor
  # A take-over judged on an old read removes nothing once the lock has changed.
  judged = lock.read()
  newer = _write(tmp_path, token='newer')
  assert not lock.take_over(judged)
  assert (tmp_path / 'x.lock').read_text() == newer
  assert sorted(os.listdir(tmp_path)) == ['x.lock']  # No file set aside is left behind.


def test_idle_clock_restarts_when_the_lock_changes(tmp_path):
  lock, idle = _lock(tmp_path), locks.IdleClock()
  _write(tmp_path, heartbeat=1.0)
  holder = lock.read()
  assert idle(holder) < 0.05
  time.sleep(0.1)
  assert idle(holder) >= 0.1
  _write(tmp_path, heartbeat=2.0)
  assert idle(lock.read()) < 0.05


def test_a_pid_is_checked_only_on_this_machine_host_name_and_boot_id_alike(tmp_path):
  lock, dead = _lock(tmp_path, horizon_s=60.0), _dead_pid()
  _write(tmp_path, pid=dead)  # This host, this boot: the pid decides.
  assert lock.read().info.on_this_machine() and 'no longer running' in lock.stale_reason(
      lock.read())
  # The same host name on another machine (a pod's), or this one before a reboot: a pid
  # there cannot be checked here, so only the horizon frees the lock.
  for other in ('another-boot', ''):  # '': a lock written before boot ids were recorded.
    _write(tmp_path, pid=dead, boot_id=other)
    holder = lock.read()
    assert not holder.info.on_this_machine() and lock.stale_reason(holder) is None
    assert lock.stale_reason(holder, idle_s=61.0).startswith('it was last refreshed 61 s')
  if locks.boot_id():
    assert locks.LockInfo.new().boot_id == locks.boot_id()


def _until(condition, timeout_s=10.0):
  deadline = time.monotonic() + timeout_s
  while not condition() and time.monotonic() < deadline:
    time.sleep(0.01)
  return condition()


def test_a_heartbeat_whose_storage_fails_retries_then_stops_the_holder_before_the_horizon(
    tmp_path):
  """The lock file turned into a link to a directory: every read and rewrite fails. A short
  outage is ridden out; a long one loses the lock, naming why, before a waiter could take
  it over (horizon 2 s), and check() raises in the working thread."""
  lost = []
  lock = _lock(tmp_path, heartbeat_s=0.05, horizon_s=2.0, on_lost=lost.append)
  path, aside = tmp_path / 'x.lock', tmp_path / 'aside'
  assert lock.try_acquire() and lock.lost_after_s == pytest.approx(1.9)

  def break_storage():  # Atomically: the file is never missing (that would be a loss).
    shutil.copy(path, aside)
    os.symlink(tmp_path, tmp_path / 'link')
    os.replace(tmp_path / 'link', path)

  def mend_storage():
    os.replace(aside, path)

  break_storage()
  time.sleep(0.4)  # Several failed beats.
  mend_storage()
  beat = lock.info.heartbeat
  assert _until(lambda: lock.info.heartbeat > beat), (lost, os.listdir(tmp_path))  # Recovered.
  assert not lost and lock.lost is None
  lock.check()

  break_storage()
  last_refresh = lock.info.heartbeat
  assert _until(lambda: lost, timeout_s=10)
  noticed = time.time()
  assert noticed - last_refresh < lock.horizon_s  # Before anyone may take it over.
  assert 'could not be refreshed for' in str(lost[0]) and 'IsADirectoryError' in str(lost[0])
  with pytest.raises(locks.LockLost, match=r'x\.lock could not be refreshed'):
    lock.check()
  mend_storage()
  assert lock.release()  # Still ours on disk: removed.


def test_check_raises_when_the_heartbeat_is_stuck(tmp_path):
  """A heartbeat blocked in a storage call confirms nothing: check() says so by itself."""
  lock = _lock(tmp_path, heartbeat_s=3600.0, horizon_s=0.4)
  assert lock.try_acquire()
  lock.check()
  time.sleep(0.3)
  with pytest.raises(locks.LockLost, match=r'last confirmed 0 s ago; another process may '
                     r'take it over after 0 s'):
    lock.check()
  assert lock.release()


def test_a_heartbeat_adopts_its_own_write_whose_reply_was_lost(tmp_path):
  """The lock holds our token but not the text we last recorded (a rewrite that landed
  after its caller gave up on it): still ours, refreshed on, not lost."""
  lost = []
  lock = _lock(tmp_path, heartbeat_s=0.05, on_lost=lost.append)
  assert lock.try_acquire()
  landed = dataclasses.replace(lock.info, heartbeat=time.time() + 1)
  storage.write_atomically(str(tmp_path / 'x.lock'), landed.to_text())
  assert _until(lambda: lock.read().info.heartbeat not in (landed.heartbeat,))
  assert lock.read().info.token == lock.info.token and not lost
  assert lock.release() and not (tmp_path / 'x.lock').exists()


def test_backoff_grows_to_its_cap_with_jitter():
  import random  # pylint: disable=g-import-not-at-top
  backoff = locks.Backoff(0.5, 4.0, random.Random(0))
  delays = [backoff() for _ in range(12)]
  assert 0.25 <= delays[0] <= 0.5 and all(2.0 <= d <= 4.0 for d in delays[6:])
  assert sum(delays[:6]) < sum(delays[6:]) and len(set(delays[6:])) == 6  # Jittered.
  other = locks.Backoff(0.5, 4.0, random.Random(1))
  assert [other() for _ in range(12)] != delays  # Two hosts do not poll in step.


def test_acquire_refuses_a_holder_alive_on_this_machine_at_once(tmp_path):
  holder = _lock(tmp_path)
  assert holder.try_acquire()
  began = time.monotonic()
  with pytest.raises(locks.LockHeld, match='its process runs on this machine') as e:
    _lock(tmp_path).acquire(wait_s=60.0, refuse_alive=True)
  assert time.monotonic() - began < 1.0 and e.value.holder.info.token == holder.info.token
  with pytest.raises(locks.LockHeld, match='it is in use'):
    _lock(tmp_path).acquire()  # wait_s=0: refused whoever holds it.
  assert holder.release()


def test_acquire_waits_out_another_machines_lock_until_it_is_stale(tmp_path):
  """A hard-killed run elsewhere left a fresh lock: the waiter reports once, then takes it
  over when it has stayed unrefreshed for the horizon."""
  _write(tmp_path, host='tpu-worker-3', pid=4242)
  lock, waits = _lock(tmp_path, horizon_s=1.0), []
  began = time.monotonic()
  assert lock.acquire(wait_s=5.0, refuse_alive=True, on_wait=lambda h, s: waits.append(h))
  assert 1.0 <= time.monotonic() - began < 4.0
  assert lock.took_over.host == 'tpu-worker-3' and [h.info.pid for h in waits] == [4242]
  assert lock.release()
  _write(tmp_path, host='tpu-worker-3', pid=4242)  # A wait too short to outlast it.
  with pytest.raises(locks.LockHeld, match=r'still held after 0 s') as e:
    _lock(tmp_path, horizon_s=60.0).acquire(wait_s=0.3)
  assert 0.3 <= e.value.waited_s < 1.0


def test_acquire_refuses_a_holder_seen_refreshing_and_stops_when_asked(tmp_path):
  _write(tmp_path, host='tpu-worker-3', pid=4242, heartbeat=time.time() - 5)
  stop = threading.Event()

  def beat():  # Another machine's live run.
    while not stop.wait(0.05):
      _write(tmp_path, host='tpu-worker-3', pid=4242)

  thread = threading.Thread(target=beat)
  thread.start()
  try:
    with pytest.raises(locks.LockHeld, match='refreshed while this process waited'):
      _lock(tmp_path, horizon_s=60.0).acquire(wait_s=30.0, refuse_alive=True)
    done = threading.Timer(0.3, lambda: None)
    done.start()
    assert not _lock(tmp_path).acquire(wait_s=30.0, until=lambda: not done.is_alive())
  finally:
    stop.set()
    thread.join()


def test_acquire_tells_a_live_holder_that_let_go_from_one_taken_over(tmp_path):
  """prepare_once stops its waiters on this: a preparer that let go without a manifest."""
  holder = _lock(tmp_path)
  assert holder.try_acquire()
  token = holder.info.token
  threading.Timer(0.3, holder.release).start()
  lock = _lock(tmp_path, horizon_s=5.0)
  assert lock.acquire(wait_s=10.0)
  assert lock.released_by.token == token and lock.took_over is None and lock.release()
