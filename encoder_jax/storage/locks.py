"""The package's one lock: a small object taken atomically, kept alive by a heartbeat, taken
over once its holder is gone, and removed only by its holder.

Two parts:
  * a store (``Store``): four atomic operations on one lock object, create / read /
    rewrite / remove-if, each naming the version it expects. ``_FileStore`` (a local or
    network file system: O_EXCL create, rename-aside removal) and ``_BucketStore`` (Cloud
    Storage: generation preconditions) are the two; ``store_for`` picks one by the path,
    the one place the choice is made;
  * the policy (``Lock``): who the holder is (``LockInfo``), when it is gone, take-over,
    the heartbeat, and one ``acquire`` that refuses a live holder or waits for it, as its
    caller chooses.

Its users:
  encoder_jax.run.workdir.WorkdirLock   one training run per workdir (``<workdir>/.lock``)
  encoder_jax.data.prepare_once     one preparer per prepared-data directory
                                    (``<directory>.lock``);
                                    tests/run/test_pretraining_faults.py shares its
                                    session fixtures between pytest-xdist workers with it
  encoder_jax.data.preparation      its ``.partial-<host>-<pid>-<start>`` directories, whose
                                    owner ``pid_running`` judges (the one "is this process
                                    alive" of the package)
A file lock's heartbeat replaces the file whole (``paths.write_atomically``).

The lock holds JSON (``LockInfo``): host, boot id, pid, the process's start time (Linux,
from /proc: tells a reused pid from its first owner), a random token (ours or a
successor's), when it was taken and its last heartbeat, which a daemon thread rewrites
every ``heartbeat_s``. A holder is gone, and its lock may be taken over, when
  * on this machine (the same host name AND boot id: host names repeat on orchestrated
    pods, and a machine rebooted since has no process of the lock's): its pid no longer
    runs, or now belongs to a process started at another time (``horizon_on_this_host``
    also holds a live pid to the rule below);
  * otherwise: it was not refreshed for ``horizon_s``, by the age of its heartbeat on this
    host's clock and by how long this process has seen it unchanged (``IdleClock``), the
    larger of the two; a lock made with ``trust_holder_clock=False`` uses only the latter;
  * it is unreadable (created, never written: its holder died in between) for
    ``UNREADABLE_S``.
A heartbeat that cannot refresh the lock retries at its next beat; once it has not confirmed
the lock for ``lost_after_s`` (two beats short of the horizon, so before another process
may take it over), or finds it replaced, the lock is lost: ``on_lost`` runs and ``check()``
raises ``LockLost`` in the thread that calls it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import random
import socket
import sys
import threading
import time
import uuid
from typing import Callable, Protocol

from encoder_jax.storage import paths as storage

UNREADABLE_S = 60.0  # A lock is written right after its creation: unreadable longer, dead.

_log = logging.getLogger(__name__)


def process_start(pid: int) -> int | None:
  """The process's start time in clock ticks since boot (Linux); None where unknown."""
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      stat = f.read()
    return int(stat[stat.rindex(b')') + 2:].split()[19])
  except (OSError, ValueError, IndexError):
    return None


def boot_id() -> str:
  """This boot of this machine (Linux: a random id made at boot); '' where unknown."""
  try:
    with open('/proc/sys/kernel/random/boot_id', encoding='ascii') as f:
      return f.read().strip()
  except OSError:
    return ''


def pid_running(pid: int, start: int | None = None) -> bool:
  """Whether ``pid`` runs on this host (and, if ``start`` is known, is the process that
  started then rather than a later one given the same pid)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # Alive, owned by another user.
  now = process_start(pid)
  return start is None or now is None or now == start


@dataclasses.dataclass(frozen=True)
class LockInfo:
  """Who holds a lock: the JSON in the lock file."""
  host: str
  pid: int
  start_time: str = ''  # ISO 8601, UTC, for people.
  started: float = 0.0  # time.time() at acquisition.
  heartbeat: float | None = None  # time.time() of the last refresh.
  token: str = ''  # Random: tells our lock from a successor's.
  proc_start: int | None = None  # process_start(pid): detects a reused pid.
  argv: str = ''
  boot_id: str = ''  # boot_id(): tells this machine from another of the same name.

  @classmethod
  def new(cls) -> 'LockInfo':
    """This process, now, with a new token."""
    now = time.time()
    return cls(
        host=socket.gethostname(), pid=os.getpid(),
        start_time=datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(
            timespec='seconds'),
        started=now, heartbeat=now, token=uuid.uuid4().hex, proc_start=process_start(os.getpid()),
        argv=' '.join(sys.argv)[:500], boot_id=boot_id())

  def on_this_machine(self) -> bool:
    """Whether the holder ran on this machine since its last boot: only then can its pid be
    checked (a lock written where no boot id could be read cannot tell)."""
    return self.host == socket.gethostname() and self.boot_id == boot_id()

  def describe(self) -> str:
    return f'host {self.host}, pid {self.pid}, started {self.start_time or "?"}'

  def to_text(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=1)

  @classmethod
  def from_text(cls, text: str) -> 'LockInfo':
    """Raises ValueError or TypeError for a text that names no holder (host and pid)."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
      raise ValueError(f'not a lock: {text[:80]!r}')
    fields = {f.name for f in dataclasses.fields(cls)}
    info = cls(**{k: v for k, v in raw.items() if k in fields})
    if not isinstance(info.host, str) or type(info.pid) is not int or info.pid <= 0:
      raise ValueError(f'not a lock holder: {text[:80]!r}')
    return info


@dataclasses.dataclass(frozen=True)
class Holder:
  """A lock as read: its holder (None while unreadable), its text, mtime, and the store's
  version of it (what a conditional rewrite or removal names)."""
  info: LockInfo | None
  text: str
  mtime: float
  version: object = None

  @classmethod
  def parse(cls, text: str, mtime: float, version: object) -> 'Holder':
    try:
      info = LockInfo.from_text(text)
    except (ValueError, TypeError):
      info = None
    return cls(info, text, mtime, version)

  def heartbeat_age(self) -> float:
    """Seconds since the last heartbeat (the file's mtime if it has none), this host's clock."""
    beat = self.info.heartbeat if self.info is not None else None
    return time.time() - (self.mtime if beat is None else beat)


class LockHeld(Exception):
  """``Lock.acquire`` gave up: ``holder`` holds the lock and is not gone. ``why``: what
  ended the wait; ``waited_s``: how long it lasted."""

  def __init__(self, path: str, holder: Holder, why: str, waited_s: float):
    who = holder.info.describe() if holder.info else 'a lock being written'
    super().__init__(f'{path} is held by {who}: {why}')
    self.holder, self.why, self.waited_s = holder, why, waited_s


class LockLost(RuntimeError):
  """The lock is no longer ours (``holder``: whoever holds it now, if known), or could not be
  confirmed for so long that another process may take it over: the work it guards must
  stop."""

  def __init__(self, message: str, holder: LockInfo | None = None):
    super().__init__(message)
    self.holder = holder


class IdleClock:
  """How long a lock has stayed unchanged, timed on this process's monotonic clock.

  For a waiter that polls: ``lock.stale_reason(holder, idle(holder))`` judges heartbeats
  by what it saw, so another host's clock (or the file server's) cannot make a live holder
  look dead.
  """

  def __init__(self):
    self._seen: tuple[str, float] | None = None
    self._since = 0.0

  def __call__(self, holder: Holder) -> float:
    now = time.monotonic()
    if (holder.text, holder.mtime) != self._seen:
      self._seen, self._since = (holder.text, holder.mtime), now
    return now - self._since


class Backoff:
  """Delays between polls: from ``first_s``, 1.5 times longer each, up to ``max_s``, each
  drawn at random between half and all of it (jitter), so that the hosts of a pod that
  began waiting together do not poll together (64 hosts at a steady 0.5 s would send a
  bucket hundreds of requests a second)."""

  def __init__(self, first_s: float = 0.5, max_s: float = 30.0, rng: random.Random | None = None):
    self.max_s, self._next = max_s, min(first_s, max_s)
    self._rng = rng or random.Random()

  def __call__(self) -> float:
    delay = self._next * self._rng.uniform(0.5, 1.0)
    self._next = min(self._next * 1.5, self.max_s)
    return delay


def duration(seconds: float) -> str:
  """Seconds for people: ``45 s``, ``15 min``."""
  return f'{seconds:.0f} s' if seconds < 120 else f'{seconds / 60:.0f} min'


# ---------------------------------------------------------------------------------------
# Stores: where a lock lives.


class Store(Protocol):
  """One lock object and four atomic operations on it. A version is what the store wrote
  or read (a file's text; an object's generation); every write names the one it expects."""
  path: str

  def create(self, text: str) -> object | None:
    """Writes ``text`` if there is no lock; its version, or None if there is one."""

  def read(self) -> Holder | None:
    """The lock as it is now; None if there is none. Raises OSError when it cannot tell."""

  def rewrite(self, version: object, text: str) -> object | None:
    """Replaces the lock by ``text`` if it is still ``version``; the new version, or None."""

  def remove_if(self, version: object) -> bool:
    """Removes the lock if it is still ``version`` (never a successor's); True if it did."""


class _FileStore:
  """A lock file: O_EXCL creates it, a rename aside removes it (of several processes
  taking it over, one gets the file, and a successor's fresh lock is put back). A version
  is the file's text (a random token and a heartbeat make each one unique)."""

  def __init__(self, path: str):
    self.path = path

  def create(self, text: str) -> str | None:
    try:
      fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return None
    with os.fdopen(fd, 'w') as f:
      f.write(text)
    return text

  def read(self) -> Holder | None:
    try:
      with open(self.path, encoding='utf-8', errors='replace') as f:
        text = f.read()
        return Holder.parse(text, os.fstat(f.fileno()).st_mtime, text)
    except FileNotFoundError:
      return None

  def rewrite(self, version: object, text: str) -> str | None:
    # Checked, then replaced whole: only the holder rewrites, and a take-over removes the
    # file before it creates its own, so a successor's lock never holds our text.
    now = self.read()
    if now is None or now.text != version:
      return None
    storage.write_atomically(self.path, text)
    return text

  def remove_if(self, version: object) -> bool:
    aside = storage.beside(self.path, 'old')
    try:
      os.rename(self.path, aside)
    except FileNotFoundError:
      return False
    with open(aside, encoding='utf-8', errors='replace') as f:
      ours = f.read() == version
    if not ours:  # A successor's fresh lock: put it back (unless yet another one was made).
      try:
        os.link(aside, self.path)
      except FileExistsError:
        pass
    os.unlink(aside)
    return ours


class _BucketStore:
  """A lock object on Cloud Storage: every write names the generation it expects, so
  creating succeeds only while there is none, and of several processes removing a stale
  lock (or a holder and a successor rewriting it) exactly one succeeds."""

  def __init__(self, url: str):
    self.path = url
    self._blob = storage.Blob(url)

  def create(self, text: str) -> int | None:
    return self._blob.write(text, if_generation=0)

  def read(self) -> Holder | None:
    seen = self._blob.read()
    return None if seen is None else Holder.parse(seen.text, seen.mtime, seen.generation)

  def rewrite(self, version: object, text: str) -> int | None:
    return self._blob.write(text, if_generation=version)

  def remove_if(self, version: object) -> bool:
    # Claimed first by a conditional write, then deleted: Cloud Storage applies a generation
    # precondition to a delete as well, but fake-gcs-server (the tests') ignores it there.
    claimed = self._blob.write(f'removing {uuid.uuid4().hex}', if_generation=version)
    return claimed is not None and self._blob.delete(if_generation=claimed)


def store_for(path: str) -> Store:
  """The store of a lock at ``path``: a bucket's for ``gs://``, a file's for a local path.
  The one place a lock's backend is chosen."""
  path = str(path)
  if path.startswith('gs://'):
    return _BucketStore(path)
  if '://' in path:
    raise ValueError(f'{path}: a lock needs a local path or a gs:// URL')
  return _FileStore(path)


# ---------------------------------------------------------------------------------------
# The policy.


class Lock:
  """One lock: ``acquire`` / ``check`` / ``release`` by this object; the rest judges others'.

    lock = Lock(path, heartbeat_s=60, horizon_s=900)
    lock.acquire(wait_s=...)  # Or LockHeld, naming a holder that is not gone.
    ...work, calling lock.check() between its steps (LockLost once the lock is lost)...
    lock.release()

  ``on_lost(error)`` runs in the heartbeat thread when the lock is lost (a ``LockLost``:
  replaced, removed, or unconfirmed for ``lost_after_s``); the heartbeat stops then.
  ``path``: a local path or a ``gs://`` URL (``store_for``), or a ``Store``.
  """

  def __init__(self, path: str | Store, *, heartbeat_s: float, horizon_s: float,
               horizon_on_this_host: bool = False, trust_holder_clock: bool = True,
               on_lost: Callable[[LockLost], None] | None = None):
    self.store = store_for(path) if isinstance(path, str) else path
    self.path = self.store.path
    self.heartbeat_s = heartbeat_s  # <= 0: no heartbeat thread.
    self.horizon_s = horizon_s
    self.lost_after_s = max(horizon_s / 2, horizon_s - 2 * heartbeat_s)
    self.horizon_on_this_host = horizon_on_this_host
    self.trust_holder_clock = trust_holder_clock
    self.on_lost = on_lost
    self.info: LockInfo | None = None  # Ours, while we hold the lock...
    self.version: object = None  # ...as last written (the store's version)...
    self.confirmed = 0.0  # ...at this time.monotonic() (written, or read back).
    self.lost: LockLost | None = None
    self.took_over: LockInfo | None = None  # The gone holder acquire() took the lock from.
    self.released_by: LockInfo | None = None  # A live holder acquire() saw let it go.
    self._heartbeat: _Heartbeat | None = None

  def try_acquire(self) -> bool:
    """Creates the lock, ours, unless one exists; then starts the heartbeat. True if held."""
    if self.info is not None:
      return True
    info = LockInfo.new()
    version = self.store.create(info.to_text())
    if version is None:
      return False
    self.info, self.version, self.confirmed, self.lost = info, version, time.monotonic(), None
    if self.heartbeat_s > 0:
      self._heartbeat = _Heartbeat(self)
    return True

  def acquire(self, wait_s: float = 0.0, *, refuse_alive: bool = False,
              until: Callable[[], bool] | None = None,
              on_wait: Callable[[Holder, float], None] | None = None,
              report_every_s: float | None = None) -> bool:
    """Takes the lock: True once ours, False if ``until()`` (asked before each look) is.

    A holder that is gone (``stale_reason``) is taken over (``took_over`` names it); one
    that is not is waited for, up to ``wait_s`` (0: not at all; a lock being written: until
    readable or stale), looking again after ``Backoff`` delays; then ``LockHeld``.
    ``refuse_alive``: a holder proven alive (its pid runs on this machine, or its lock was
    refreshed between two looks) ends the wait at once. ``on_wait(holder, waited_s)`` runs
    when a wait for a holder begins, and every ``report_every_s`` of it if given.
    """
    if self.info is not None:
      return True
    return _Acquisition(self, wait_s, refuse_alive, until, on_wait, report_every_s).run()

  def read(self) -> Holder | None:
    """The lock as it is now; None if there is none."""
    return self.store.read()

  def stale_reason(self, holder: Holder, idle_s: float | None = None) -> str | None:
    """Why ``holder`` is gone (its lock may be taken over), or None if it may still run.

    ``idle_s``: how long the lock has shown no sign of life; by default the age of its
    heartbeat by this host's clock.
    """
    age = holder.heartbeat_age() if idle_s is None else idle_s
    info = holder.info
    if info is None:
      if age > min(UNREADABLE_S, self.horizon_s):
        return (f'unreadable ({holder.text[:80]!r}) for {age:.0f} s: its holder died while '
                'writing it')
      return None
    if info.on_this_machine():
      if not pid_running(info.pid, info.proc_start):
        return f'process {info.pid} on this host is no longer running'
      if not self.horizon_on_this_host:
        return None
    if age > self.horizon_s:
      beat = (f', a live holder refreshes it every {duration(self.heartbeat_s)}'
              if self.heartbeat_s > 0 else '')
      return (f'it was last refreshed {duration(age)} ago; the horizon is '
              f'{duration(self.horizon_s)}{beat}')
    return None

  def take_over(self, holder: Holder) -> bool:
    """Removes a stale lock if it is still ``holder``'s; then ``try_acquire`` again."""
    return self.store.remove_if(holder.version)

  def check(self) -> None:
    """Raises ``LockLost`` once the lock is lost, or has gone unconfirmed for
    ``lost_after_s`` (also while the heartbeat is stuck in a storage call)."""
    if self.lost is None and self._heartbeat is not None and (
        time.monotonic() - self.confirmed > self.lost_after_s):
      self.lost = LockLost(f'the lock {self.path} was last confirmed '
                           f'{duration(time.monotonic() - self.confirmed)} ago; another '
                           f'process may take it over after {duration(self.horizon_s)}')
    if self.lost is not None:
      raise self.lost

  def release(self) -> bool:
    """Stops the heartbeat; removes the lock if it is still ours (True then). Safe twice."""
    if self._heartbeat is not None:
      self._heartbeat.stop()
      self._heartbeat = None
    info, self.info = self.info, None
    if info is None:
      return False
    if self.store.remove_if(self.version):
      return True
    holder = self.store.read()  # Ours still, as a write whose reply was lost left it?
    return bool(holder and holder.info and holder.info.token == info.token and
                self.store.remove_if(holder.version))


class _Heartbeat:
  """A lock's daemon thread: rewrites it every ``heartbeat_s``; a failed rewrite is tried
  again at the next beat until ``lost_after_s`` without one, then the lock is lost."""

  def __init__(self, lock: Lock):
    self.lock = lock
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name=f'heartbeat of {lock.path}',
                                    daemon=True)
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    self._thread.join()

  def _run(self) -> None:
    lock = self.lock
    while not self._stop.wait(lock.heartbeat_s):
      info = dataclasses.replace(lock.info, heartbeat=time.time())
      try:
        version = lock.store.rewrite(lock.version, info.to_text())
        if version is None:  # Not our last write: a write of ours whose reply was lost?
          holder = lock.store.read()
          now = holder.info if holder is not None else None
          if now is None or now.token != info.token:
            who = now.describe() if now else 'missing'
            return self._lose(LockLost(f'the lock {lock.path} is no longer ours (now: {who})',
                                       now))
          info, version = now, holder.version
      except Exception as e:  # pylint: disable=broad-except  (a heartbeat never dies quietly)
        unconfirmed = time.monotonic() - lock.confirmed
        if unconfirmed >= lock.lost_after_s:
          return self._lose(LockLost(
              f'the lock {lock.path} could not be refreshed for {duration(unconfirmed)} '
              f'({type(e).__name__}: {e}); another process may take it over after '
              f'{duration(lock.horizon_s)}'))
        _log.warning('Could not refresh the lock %s (%s: %s); trying again in %s.', lock.path,
                     type(e).__name__, e, duration(lock.heartbeat_s))
        continue
      lock.info, lock.version, lock.confirmed = info, version, time.monotonic()

  def _lose(self, error: LockLost) -> None:
    self.lock.lost = error
    if self.lock.on_lost is not None:
      self.lock.on_lost(error)
    else:
      _log.error('%s', error)


class _Acquisition:
  """One ``Lock.acquire``: looks at the lock until it is ours, polling while it is held."""

  def __init__(self, lock: Lock, wait_s, refuse_alive, until, on_wait, report_every_s):
    self.lock, self.wait_s, self.refuse_alive = lock, wait_s, refuse_alive
    self.until, self.on_wait, self.report_every_s = until, on_wait, report_every_s
    self.idle = IdleClock()
    self.backoff = Backoff(min(0.5, lock.horizon_s / 20), min(10.0, lock.horizon_s / 10))
    self.start = time.monotonic()

  def run(self) -> bool:
    lock = self.lock
    lock.took_over = lock.released_by = None
    seen = None  # The lock at the last look, while held by a holder that is not gone.
    told = (None, 0.0)  # Whose wait on_wait last reported, and when.
    races = 0  # Looks in a row that found no holder to wait for: others race for the lock.
    while races < 100:
      if self.until is not None and self.until():
        return False
      holder = lock.read()
      if holder is None:
        if seen is not None and seen.info is not None:  # Gone: released, or being taken
          time.sleep(min(1.0, lock.horizon_s / 10))  # over (removed, then created at once)?
          if lock.read() is not None:
            continue
          lock.released_by = seen.info
        seen, races = None, races + 1
        if lock.try_acquire():
          return True
        continue
      idle = self.idle(holder)
      why = lock.stale_reason(holder, max(idle, holder.heartbeat_age())
                              if lock.trust_holder_clock else idle)
      if why is not None:
        _log.warning('Taking over the lock %s of %s: %s.', lock.path,
                     holder.info.describe() if holder.info else 'no one', why)
        if lock.take_over(holder) and lock.try_acquire():
          lock.took_over = holder.info
          return True
        races += 1
        continue
      races, waited = 0, time.monotonic() - self.start
      proof = self._alive(holder, seen)
      if proof or (waited >= self.wait_s and holder.info is not None):
        raise LockHeld(lock.path, holder, proof or (
            f'still held after {duration(waited)}' if self.wait_s else 'it is in use'), waited)
      if self.on_wait is not None and holder.info is not None and (
          told[0] != holder.info.token or self.report_every_s is not None and
          waited - told[1] >= self.report_every_s):
        self.on_wait(holder, waited)
        told = (holder.info.token, waited)
      seen = holder if holder.info is not None else seen  # Not a lock being (re)written.
      time.sleep(min(self.backoff(), max(self.wait_s - waited, 0.01)))
    raise LockHeld(lock.path, holder or Holder(None, '', 0.0), 'other processes keep '
                   'replacing it', time.monotonic() - self.start)

  def _alive(self, holder: Holder, seen: Holder | None) -> str | None:
    """Why ``holder`` is proven alive, if ``refuse_alive`` asks; None otherwise."""
    info = holder.info
    if not self.refuse_alive or info is None:
      return None
    if info.on_this_machine() and pid_running(info.pid, info.proc_start):
      return 'its process runs on this machine'
    if seen is not None and seen.info is not None and seen.info.token == info.token and (
        seen.text != holder.text):
      return 'it was refreshed while this process waited: that run is alive'
    return None
