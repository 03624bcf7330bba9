"""The one lock-file helper of the package: a lock file taken atomically, kept alive by a
heartbeat, taken over once its holder is gone, and removed only by its holder.

Its users, each deciding what to do about a live holder (refuse, or wait):
  encoder_jax.workdir.WorkdirLock   one training run per workdir (``<workdir>/.lock``); it
                                    adds the ``gs://`` variant (written, then read back)
  encoder_jax.data.prepare_once     one preparer per prepared-data directory
                                    (``<directory>.lock``); tests/test_faults.py shares its
                                    session fixtures between pytest-xdist workers with it
  encoder_jax.data.preparation      its ``.partial-<host>-<pid>-<start>`` directories, whose
                                    owner ``pid_running`` judges (the one "is this process
                                    alive" of the package)
``write_atomically`` is the package's one writer of a file replaced whole (the heartbeat,
workdir files, the embedded-corpus cache).
It imports nothing from encoder_jax (it sits below ``data``, the lower of its users' layers)
and no TensorFlow; paths are local (a subclass replaces the storage methods for another store).

The lock file holds JSON (``LockInfo``): host, pid, the process's start time (Linux, from
/proc: tells a reused pid from its first owner), a random token (ours or a successor's),
when it was taken and its last heartbeat, which a daemon thread rewrites every
``heartbeat_s``. A holder is gone, and its lock may be taken over, when
  * on this host: its pid no longer runs, or now belongs to a process started at another
    time (``horizon_on_this_host`` also holds a live pid to the rule below);
  * otherwise: its heartbeat is older than ``horizon_s`` (a pid on another machine cannot
    be checked), by this host's clock or, for a waiter that polls, by how long it has seen
    the file unchanged (``IdleClock``: immune to host clocks that disagree);
  * it is unreadable (created, never written: its holder died in between) for
    ``UNREADABLE_S``.
Take-over and release remove the file only if it is still the one judged (a successor's
fresh lock is left alone).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from typing import Callable

from encoder_jax import storage

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

  @classmethod
  def new(cls) -> 'LockInfo':
    """This process, now, with a new token."""
    now = time.time()
    return cls(
        host=socket.gethostname(), pid=os.getpid(),
        start_time=datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(
            timespec='seconds'),
        started=now, heartbeat=now, token=uuid.uuid4().hex, proc_start=process_start(os.getpid()),
        argv=' '.join(sys.argv)[:500])

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
  """A lock file as read: its holder (None while unreadable), its text and mtime."""
  info: LockInfo | None
  text: str
  mtime: float

  def heartbeat_age(self) -> float:
    """Seconds since the last heartbeat (the file's mtime if it has none), this host's clock."""
    beat = self.info.heartbeat if self.info is not None else None
    return time.time() - (self.mtime if beat is None else beat)


class IdleClock:
  """How long a lock file has stayed unchanged, timed on this process's monotonic clock.

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


def _duration(seconds: float) -> str:
  return f'{seconds:.0f} s' if seconds < 120 else f'{seconds / 60:.0f} min'


class FileLock:
  """One lock file: ``try_acquire`` / ``release`` by this object; the rest judges others'.

    lock = FileLock(path, heartbeat_s=60, horizon_s=900)
    if not lock.try_acquire():
      holder = lock.read()  # None: released meanwhile.
      why = holder and lock.stale_reason(holder)
      ...refuse or wait while ``why`` is None; else ``lock.take_over(holder)``, try again
    ...
    lock.release()

  ``on_lost(holder)`` runs in the heartbeat thread when the file is no longer ours (taken
  over or removed; ``holder``: its new holder or None); the heartbeat stops then.
  """

  def __init__(self, path: str, *, heartbeat_s: float, horizon_s: float,
               horizon_on_this_host: bool = False,
               on_lost: Callable[[LockInfo | None], None] | None = None,
               thread_name: str = 'lock-heartbeat'):
    self.path = str(path)
    self.heartbeat_s = heartbeat_s  # <= 0: no heartbeat thread.
    self.horizon_s = horizon_s
    self.horizon_on_this_host = horizon_on_this_host
    self.on_lost = on_lost
    self.thread_name = thread_name
    self.info: LockInfo | None = None  # Ours, while we hold the lock.
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def try_acquire(self) -> bool:
    """Creates the lock, ours, unless one exists; then starts the heartbeat. True if held."""
    if self.info is not None:
      return True
    info = LockInfo.new()
    if not self._create(info.to_text()):
      return False
    self.info = info
    if self.heartbeat_s > 0:
      self._stop.clear()
      self._thread = threading.Thread(target=self._beat, name=self.thread_name, daemon=True)
      self._thread.start()
    return True

  def read(self) -> Holder | None:
    """The lock file as it is now; None if there is none."""
    text = self._read_text()
    mtime = self._mtime() if text is not None else None
    if mtime is None:
      return None
    try:
      info = LockInfo.from_text(text)
    except (ValueError, TypeError):
      info = None
    return Holder(info, text, mtime)

  def stale_reason(self, holder: Holder, idle_s: float | None = None) -> str | None:
    """Why ``holder`` is gone (its lock may be taken over), or None if it may still run.

    ``idle_s``: how long the lock has shown no sign of life (an ``IdleClock``); by default
    the age of its heartbeat by this host's clock.
    """
    age = holder.heartbeat_age() if idle_s is None else idle_s
    info = holder.info
    if info is None:
      if age > min(UNREADABLE_S, self.horizon_s):
        return (f'unreadable ({holder.text[:80]!r}) for {age:.0f} s: its holder died while '
                'writing it')
      return None
    if info.host == socket.gethostname():
      if not pid_running(info.pid, info.proc_start):
        return f'process {info.pid} on this host is no longer running'
      if not self.horizon_on_this_host:
        return None
    if age > self.horizon_s:
      beat = (f', a live holder refreshes it every {_duration(self.heartbeat_s)}'
              if self.heartbeat_s > 0 else '')
      return (f'it was last refreshed {_duration(age)} ago; the horizon is '
              f'{_duration(self.horizon_s)}{beat}')
    return None

  def take_over(self, holder: Holder) -> bool:
    """Removes a stale lock if it is still ``holder``'s; then ``try_acquire`` again."""
    return self._remove_if(holder.text)

  def release(self) -> bool:
    """Stops the heartbeat; removes the lock if it is still ours (True then). Safe twice."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    info, self.info = self.info, None
    if info is None:
      return False
    holder = self.read()
    if holder is None or holder.info is None or holder.info.token != info.token:
      return False
    return self._remove_if(holder.text)

  def _beat(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      holder = self.read()
      now = holder.info if holder is not None else None
      if now is None or now.token != self.info.token:
        if self.on_lost is not None:
          self.on_lost(now)
        else:
          _log.error('The lock %s is no longer ours (now: %s).', self.path,
                     now.describe() if now else 'missing')
        return
      info = dataclasses.replace(self.info, heartbeat=time.time())
      try:
        self._rewrite(info.to_text())
      except OSError as e:
        _log.warning('Could not refresh the lock %s: %s', self.path, e)
      else:
        self.info = info

  # Storage: a local file system. A subclass for another store replaces these five.

  def _create(self, text: str) -> bool:
    """Creates the file holding ``text`` if there is none (atomically); False if there is."""
    try:
      fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, 'w') as f:
      f.write(text)
    return True

  def _read_text(self) -> str | None:
    try:
      with open(self.path) as f:
        return f.read()
    except FileNotFoundError:
      return None

  def _mtime(self) -> float | None:
    try:
      return os.stat(self.path).st_mtime
    except FileNotFoundError:
      return None

  def _rewrite(self, text: str) -> None:
    """Replaces the file's text atomically (a reader sees the old text or the new)."""
    write_atomically(self.path, text)

  def _remove_if(self, text: str) -> bool:
    """Removes the file only if it still holds ``text`` (not a successor's new lock)."""
    # Rename first: of several processes taking over, one gets the file; check it is the old.
    aside = self._beside('old')
    try:
      os.rename(self.path, aside)
    except FileNotFoundError:
      return False
    with open(aside) as f:
      ours = f.read() == text
    if not ours:  # A successor's fresh lock: put it back (unless yet another one was made).
      try:
        os.link(aside, self.path)
      except FileExistsError:
        pass
    os.unlink(aside)
    return ours

  def _beside(self, what: str) -> str:
    return beside(self.path, what)


def beside(path: str, what: str) -> str:
  """A fresh hidden name next to ``path``: ``.<name>.<what>-<pid>-<random>``."""
  head, name = os.path.split(path)
  return os.path.join(head, f'.{name}.{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}')


def write_atomically(path: str, text: str) -> None:
  """Writes ``text`` to a temporary file next to ``path``, renamed over it: a reader (or a
  process killed mid-write) sees the old file or the new one whole, never a part. The one
  such writer of the package (local paths; ``workdir`` adds ``gs://``)."""
  tmp = beside(path, 'tmp')
  try:
    with open(tmp, 'w', encoding='utf-8') as f:
      f.write(text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


class BucketLock(FileLock):
  """A lock file on Cloud Storage (a ``gs://`` workdir's), atomic through generation
  numbers.

  Every write names the generation it expects (:class:`Blob`): creating the lock only
  succeeds while there is none (generation 0), so of runs started together exactly one
  gets it; a stale lock is taken over by replacing the generation that was judged stale
  (of several runs taking over, one succeeds); the heartbeat rewrites only our own
  generation and release deletes only it, so neither touches a successor's lock.
  """

  def __init__(self, path_: str, **kwargs):
    super().__init__(path_, **kwargs)
    self._blob = storage.Blob(path_)
    self._generation: int | None = None  # Of our lock, while we hold it.
    self._seen: storage.Version | None = None  # The lock as last read.
    self._adopted: int | None = None  # The generation a take-over wrote, to claim as ours.

  def _create(self, text: str) -> bool:
    expected, self._adopted = self._adopted or 0, None
    self._generation = self._blob.write(text, if_generation=expected)
    return self._generation is not None

  def _read_text(self) -> str | None:
    self._seen = self._blob.read()
    return None if self._seen is None else self._seen.text

  def _mtime(self) -> float | None:
    return None if self._seen is None else self._seen.mtime

  def take_over(self, holder: Holder) -> bool:
    """Replaces the stale lock, if it is still the generation read, by a placeholder that
    the next ``try_acquire`` (its ``_create``) replaces with our lock."""
    seen = self._seen
    if seen is None or seen.text != holder.text:
      return False
    placeholder = LockInfo.new().to_text()
    self._adopted = self._blob.write(placeholder, if_generation=seen.generation)
    return self._adopted is not None

  def _rewrite(self, text: str) -> None:
    generation = self._blob.write(text, if_generation=self._generation)
    if generation is None:
      raise OSError(f'{self.path} was replaced by another run')
    self._generation = generation

  def _remove_if(self, text: str) -> bool:
    now = self._blob.read()
    if now is None or now.text != text:
      return False
    return self._blob.delete(if_generation=now.generation)
