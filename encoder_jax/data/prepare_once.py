"""One preparer per prepared directory, however many processes ask for it at the same time.

Every process of a multi-host run calls ``load_or_prepare`` with the same config, and
preparing is minutes to hours of work. The process that takes ``<directory>.lock``
(``locks.Lock``: an exclusive create on the file system that holds the directory, or on a
bucket with Cloud Storage's generation preconditions) prepares; the others wait for the
manifest, looking again after growing, jittered delays (``locks.Backoff``: a pod's hosts
do not poll a bucket in step). So a shared file system prepares once. Hosts with local
disks (TPU VM workers) share prepared data through a bucket instead (``through_bucket``,
for a ``gs://`` config.data.prepared_dir): one process of all of them prepares and uploads
it, and each host copies it once to its disk. No JAX is involved: the lock also
serialises unrelated runs (or test workers) that share a prepared directory.

The lock's owner refreshes it every ``HEARTBEAT_S`` while it works. A lock whose owner died
(its pid is gone on this machine, or a waiter saw it unrefreshed for ``STALE_S``) is taken
over, so a run killed mid-preparation never blocks the next one: the next preparer
replaces what a killed upload left on the bucket. Two waiters taking over at once both
prepare, which ``prepare`` tolerates (the first complete directory wins). A lock released
without a manifest means the owner's preparation failed: waiters stop with that, instead
of repeating the failure one after another. A waiter gives up after ``timeout_s``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from typing import Callable

from encoder_jax.storage import locks
from encoder_jax.storage import paths as storage

HEARTBEAT_S = 10.0
STALE_S = 180.0  # Several missed heartbeats, with room for slow network file systems.
TIMEOUT_S = 12 * 3600.0  # A live preparer of a very large corpus; see the error message.
_REPORT_EVERY_S = 600.0


def lock_path(directory: str) -> str:
  return directory.rstrip('/') + '.lock'


def prepare_once(directory: str, manifest: str, prepare: Callable[[], object], *,
                 timeout_s: float = TIMEOUT_S, stale_s: float = STALE_S,
                 heartbeat_s: float = HEARTBEAT_S) -> bool:
  """Runs ``prepare`` unless another process is (or was) preparing ``directory``.

  Returns True if this process prepared, False if it waited for (or found) ``manifest``.
  """
  path = lock_path(directory)
  if not directory.startswith('gs://'):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

  def lost(error: locks.LockLost) -> None:
    logging.warning('%s: %s may be preparing %s too (the first complete directory wins).',
                    error, _who(error.holder), directory)

  def waiting(holder: locks.Holder, waited_s: float) -> None:  # Printed: any verbosity.
    print(f'Waiting for {_who(holder.info)} to prepare {directory} ({waited_s:.0f} s so far).',
          flush=True)

  # Host clocks may disagree: staleness is timed by how long this process saw it unchanged.
  lock = locks.Lock(path, heartbeat_s=heartbeat_s, horizon_s=stale_s,
                    horizon_on_this_host=True, trust_holder_clock=False, on_lost=lost)
  try:
    if not lock.acquire(timeout_s, until=lambda: storage.exists(manifest), on_wait=waiting,
                        report_every_s=_REPORT_EVERY_S):
      return False
  except locks.LockHeld as e:
    raise TimeoutError(
        f'Waited {timeout_s:.0f} s for {_who(e.holder.info)} to prepare {directory} (lock '
        f'{path}, still alive) and no {os.path.basename(manifest)} appeared. Prepare the '
        'data once beforehand with python -m encoder_jax.prepare --config=... (the same '
        f'config), or delete {path} if that process is stuck.') from None
  try:
    if storage.exists(manifest):  # Written just before its preparer let the lock go.
      return False
    if lock.released_by is not None:
      raise FileNotFoundError(
          f'{_who(lock.released_by)} stopped preparing {directory} without writing {manifest} '
          "(its preparation failed: see that process's log). Fix the cause and rerun.")
    logging.info('No prepared data in %s: preparing it now (lock %s).', directory, path)
    prepare()
  finally:
    lock.release()
  return True


def _who(owner: locks.LockInfo | None) -> str:
  if owner is None:
    return 'another process'
  return f'process {owner.pid} on {owner.host}'


CACHE_ENV = 'ENCODER_JAX_PREPARED_CACHE'  # Where hosts keep their copy of bucket data.


def cache_root() -> str:
  return os.environ.get(CACHE_ENV) or os.path.expanduser('~/.cache/encoder_jax/prepared')


def through_bucket(url: str, manifest_name: str, prepare: Callable[[str], object]) -> str:
  """Prepared data shared through a bucket; returns this host's local copy of it.

  One process of all the hosts prepares (under the lock object ``<url>.lock``, atomic by
  generation preconditions) into a local staging directory and uploads it to ``url``,
  the manifest last; every host then downloads it once into ``cache_root()`` (processes of
  one host share that copy under a local lock) and memory-maps it there, as it would a
  local directory. A new slice of another size resumes from the same ``url``. A local copy
  whose manifest is not the bucket's (the data was prepared again) is replaced.
  """
  url = url.rstrip('/')

  def prepare_and_upload():
    with tempfile.TemporaryDirectory(prefix='prepared_upload_') as staging:
      local = os.path.join(staging, 'prepared')
      prepare(local)
      _replace_leftovers(local, url)
      storage.upload_tree(local, url, last=manifest_name, overwrite=True)

  if prepare_once(url, f'{url}/{manifest_name}', prepare_and_upload):
    logging.info('Prepared %s once for every host.', url)
  shared = storage.Blob(f'{url}/{manifest_name}').read().text
  local = os.path.join(cache_root(), hashlib.sha256(url.encode()).hexdigest()[:16])
  manifest = os.path.join(local, manifest_name)
  if os.path.exists(manifest):
    with open(manifest, encoding='utf-8') as f:
      if f.read() != shared:
        logging.warning('%s was prepared again; replacing the copy in %s.', url, local)
        shutil.rmtree(local, ignore_errors=True)

  def download():
    start = time.monotonic()
    size = storage.download_tree(url, local, last=manifest_name)
    logging.info('Copied %s to %s: %.1f MB in %.1f s.', url, local, size / 1e6,
                 time.monotonic() - start)

  prepare_once(local, manifest, download)
  return local


def _replace_leftovers(local: str, url: str) -> None:
  """Deletes the objects under ``url`` that ``local`` does not hold: an upload killed
  half-way left them (no manifest, so nothing reads them). The lock holder is the only
  writer of ``url``, so it may delete them, and overwrite the others."""
  ours = {os.path.relpath(os.path.join(root, f), local)
          for root, _, files in os.walk(local) for f in files}
  leftovers = {name: generation for name, generation in storage.generations(url).items()
               if name not in ours}
  if leftovers:
    logging.warning('Deleting %d objects an unfinished upload left in %s.', len(leftovers), url)
  for name, generation in leftovers.items():
    storage.Blob(f'{url}/{name}').delete(if_generation=generation)
