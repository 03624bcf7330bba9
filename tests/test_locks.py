"""encoder_jax.locks, the one lock-file helper: exclusive acquisition, staleness and
take-over, the heartbeat, and a release that leaves a successor's lock alone."""

import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from encoder_jax import locks


def _lock(tmp_path, **kw):
  kw = dict(heartbeat_s=0, horizon_s=60.0) | kw
  return locks.FileLock(str(tmp_path / 'x.lock'), **kw)


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
  assert not loser.take_over(dataclasses.replace(holder, text='{}'))  # Not what is there.
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
  assert [h.token for h in lost] == ['successor']
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
