"""One preparer per prepared directory, however many processes ask for it at the same time.

Every process of a multi-host run calls ``load_or_prepare`` with the same config, and
preparing is minutes to hours of work. The first process to create ``<directory>.lock``
(an atomic exclusive create on the file system that holds the directory) prepares; the
others wait for the manifest. So a shared file system prepares once, and hosts with local
disks (TPU VM workers) each prepare once, which each of them needs. No JAX is involved: the
lock also serialises unrelated runs (or test workers) that share a prepared directory.

The owner touches the lock every ``HEARTBEAT_S`` while it works. A lock whose owner died
(its pid is gone on this host, or nobody touched it for ``STALE_S``) is taken over, so a
run killed mid-preparation never blocks the next one; two waiters taking over at once both
prepare, which ``prepare`` tolerates (the first complete directory wins). A lock released
without a manifest means the owner's preparation failed: waiters stop with that, instead
of repeating the failure one after another. A waiter gives up after ``timeout_s``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Callable

HEARTBEAT_S = 10.0
STALE_S = 180.0  # Several missed heartbeats, with room for slow network file systems.
TIMEOUT_S = 12 * 3600.0  # A live preparer of a very large corpus; see the error message.
_POLL_S = 0.5
_REPORT_EVERY_S = 600.0


def lock_path(directory: str) -> str:
  return directory.rstrip('/') + '.lock'


def _owner() -> dict:
  return dict(host=socket.gethostname(), pid=os.getpid(), started=time.time())


def _try_lock(path: str) -> bool:
  try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, 'w') as f:
    json.dump(_owner(), f)
  return True


def _read_owner(path: str) -> dict | None:
  """The lock's owner, {} while it is being written, None once it is gone."""
  try:
    with open(path) as f:
      text = f.read()
  except FileNotFoundError:
    return None
  try:
    return json.loads(text)
  except ValueError:
    return {}


def _pid_dead_here(owner: dict) -> bool:
  if owner.get('host') != socket.gethostname() or not isinstance(owner.get('pid'), int):
    return False
  try:
    os.kill(owner['pid'], 0)
  except ProcessLookupError:
    return True
  except PermissionError:
    return False
  return False


class _Heartbeat:
  """Touches the lock in a thread while the owner prepares (the owner's sign of life)."""

  def __init__(self, path: str, every_s: float):
    self.path, self.every_s = path, every_s
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True, name='prepare-heartbeat')

  def _run(self):
    while not self._stop.wait(self.every_s):
      try:
        os.utime(self.path)
      except OSError:
        pass  # Taken over or removed: nothing left to keep alive.

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()


def prepare_once(directory: str, manifest: str, prepare: Callable[[], object], *,
                 timeout_s: float = TIMEOUT_S, stale_s: float = STALE_S,
                 heartbeat_s: float = HEARTBEAT_S) -> bool:
  """Runs ``prepare`` unless another process is (or was) preparing ``directory``.

  Returns True if this process prepared, False if it waited for (or found) ``manifest``.
  """
  path = lock_path(directory)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  start = time.monotonic()
  seen = None  # The lock's (owner, mtime) as last observed, and since when (our clock).
  seen_since = reported = start
  told = None  # The owner last reported as being waited for.
  while True:
    if os.path.exists(manifest):
      return False
    if seen is not None and not os.path.exists(path):  # Released: done, failed or taken over.
      time.sleep(1.0)  # A take-over recreates the lock at once.
      if not os.path.exists(manifest) and not os.path.exists(path):
        raise FileNotFoundError(
            f'{_who(seen[0])} stopped preparing {directory} without writing {manifest} '
            "(its preparation failed: see that process's log). Fix the cause and rerun.")
      seen = None
      continue
    if _try_lock(path):
      logging.info('No prepared data in %s: preparing it now (lock %s).', directory, path)
      try:
        with _Heartbeat(path, heartbeat_s):
          prepare()
      finally:
        try:
          os.remove(path)
        except FileNotFoundError:
          pass
      return True
    owner = _read_owner(path)
    if owner is None:  # Released since our attempt.
      continue
    try:
      mtime = os.stat(path).st_mtime
    except FileNotFoundError:
      continue
    now = time.monotonic()
    if seen != (owner, mtime):  # Host clocks may disagree: time staleness with ours.
      seen, seen_since = (owner, mtime), now
    idle = now - seen_since
    if _pid_dead_here(owner) or idle > stale_s:
      logging.warning('Taking over the preparation of %s from %s (%s).', directory,
                      _who(owner), f'lock {path} untouched for {idle:.0f} s'
                      if idle > stale_s else 'that process is not running')
      try:
        os.remove(path)
      except FileNotFoundError:
        pass
      seen = None
      continue
    if now - start > timeout_s:
      raise TimeoutError(
          f'Waited {timeout_s:.0f} s for {_who(owner)} to prepare {directory} (lock {path}, '
          f'still alive) and no {os.path.basename(manifest)} appeared. Prepare the data '
          'once beforehand with python -m encoder_jax.prepare --config=... (the same '
          f'config), or delete {path} if that process is stuck.')
    if now - reported >= _REPORT_EVERY_S or owner != told:  # Printed: shown at any verbosity.
      print(f'Waiting for {_who(owner)} to prepare {directory} ({now - start:.0f} s so far).',
            flush=True)
      reported, told = now, owner
    time.sleep(_POLL_S)


def _who(owner: dict) -> str:
  if not owner:
    return 'another process'
  return f"process {owner.get('pid')} on {owner.get('host')}"
