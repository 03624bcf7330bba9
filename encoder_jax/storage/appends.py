"""Appends to Cloud Storage objects (which cannot be appended to): ``metrics.jsonl`` and
TensorBoard's event files (tensorboardX) on ``gs://`` compose objects.

How one append goes (:meth:`Appender.flush`):

  1. The new bytes are uploaded as a part object under a name only this writer uses, create-
     only: a retry of an upload whose reply was lost meets 412 and finds the part, ours.
  2. The object and the part are composed into the object, only if the object is still the
     generation this writer last wrote: a concurrent writer is an error, not lost lines. A
     retry after a lost reply finds the object grown by exactly the part and counts it done
     (checked here, and not left to compose's precondition, which emulators ignore).
  3. The part is deleted (best effort: a part left behind is only an orphan object).

Every :data:`COMPACT_EVERY` composes the object is uploaded whole instead, as a new
non-composite object: Cloud Storage allows 32 sources a compose, and a compose per flush
would otherwise grow one composite's component count without bound.

Cloud Storage allows about one update a second to one object, and every request is a round
trip: writers that append often go through :class:`BackgroundAppender`, which flushes from a
thread of its own, at most once a second, so a training step never waits on the bucket, and a
failed flush (an outage past every retry window) keeps its bytes for the next one instead
of ending the run. TensorBoard's event files are flushed from tensorboardX's own thread;
their appender never raises there (:class:`_EventFile`), since an exception would end that
thread, and then its queue would block the next ``add_scalar``.
"""

from __future__ import annotations

import os
import threading
import time

from absl import logging

from encoder_jax.storage import client as storage_client

COMPACT_EVERY = 1000  # Composes before the object is uploaded whole again.
FLUSH_EVERY_S = 1.0  # BackgroundAppender: at most one update of an object a second.


def open_append(path, background_s: float | None = None):
  """``path.open('a')`` for a local path; an :class:`Appender` for ``gs://`` (gcsfs would
  open it in overwrite mode, losing what the object held), flushed by a thread every
  ``background_s`` seconds if given (:class:`BackgroundAppender`)."""
  if not str(path).startswith('gs://'):
    return path.open('a')
  if background_s is None:
    return Appender(str(path))
  return BackgroundAppender(Appender(str(path)), background_s)


class Appender:
  """An object on Cloud Storage opened for appending: text or bytes, as written.

  ``flush`` appends what was written since (see the module docstring); every request is
  conditional, so the client retries it on transient errors. A flush that fails keeps its
  bytes, and the next flush writes them first (or finds that they did land). A writer killed
  between flushes loses only the unflushed part, as a local file's would. ``write`` and
  ``flush`` may be called from different threads.
  """

  def __init__(self, url: str, compact_every: int = COMPACT_EVERY):
    self.url = url
    self.bucket, self.name = storage_client.split(url)
    self.compact_every = int(compact_every)
    self._pending: list[bytes] = []
    self._lock = threading.Lock()  # Guards _pending.
    self._flushing = threading.Lock()  # One flush at a time.
    self._generation: int | None = None  # Of the object as we last wrote it...
    self._size = 0  # ...its size then...
    self._components = 1  # ...and how many composes made it.
    self._unconfirmed = b''  # A failed flush's bytes, which may have landed all the same.
    self._inflight = b''  # What the flush under way has yet to append.
    self.closed = False

  def write(self, data) -> int:
    with self._lock:
      self._pending.append(data.encode('utf-8') if isinstance(data, str) else bytes(data))
    return len(data)

  def writelines(self, lines) -> None:
    for line in lines:
      self.write(line)

  def pending(self) -> int:
    """Bytes written and not yet appended."""
    with self._lock:
      return sum(len(p) for p in self._pending)

  def flush(self) -> None:
    with self._flushing:
      with self._lock:
        self._inflight, self._pending = b''.join(self._pending), []
      if not self._inflight:
        return
      try:
        self._flush(self._inflight)
      except BaseException:
        with self._lock:  # Kept, first; the next flush checks whether it landed.
          self._pending.insert(0, self._inflight)
        self._unconfirmed = self._inflight
        raise
      finally:
        self._inflight = b''

  def _flush(self, data: bytes) -> None:
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    try:
      bucket = storage_client.client().bucket(self.bucket)
      if self._generation is None:
        current = bucket.get_blob(self.name)
        self._generation = 0 if current is None else int(current.generation)
        self._size = 0 if current is None else int(current.size)
        self._components = 1 if current is None else int(current.component_count or 1)
      if self._unconfirmed:  # Did the bytes of the flush that failed land after all?
        unconfirmed, self._unconfirmed = self._unconfirmed, b''
        current = bucket.get_blob(self.name)
        if current is not None and int(current.generation) != self._generation and (
            self._grew_by(current, unconfirmed)):
          self._advance(current, len(unconfirmed),
                        int(current.component_count or self._components + 1))
          data = self._inflight = data[len(unconfirmed):]  # (It leads data: kept first.)
      if data:
        self._append(bucket, data, exceptions)
    except exceptions.PreconditionFailed as e:
      raise storage_client.StorageError(
          f'{self.url} was changed by another writer while this one appended to it; is '
          'another run using the same workdir?') from e
    except storage_client.failures() as e:
      raise storage_client.explain(self.url, e) from e

  def _grew_by(self, current, data: bytes) -> bool:
    """Whether ``current`` (the object now) is the object as we last wrote it plus ``data``:
    a write of ours whose reply was lost."""
    return (current is not None and int(current.size) == self._size + len(data) and
            current.download_as_bytes(start=self._size) == data)

  def _advance(self, current, appended: int, components: int) -> None:
    self._generation, self._size = int(current.generation), self._size + appended
    self._components = components  # Counted here: emulators report none.

  def _append(self, bucket, data: bytes, exceptions) -> None:
    target = bucket.blob(self.name)
    whole = self._generation == 0 or self._components >= self.compact_every
    try:
      if self._generation == 0:
        target.upload_from_string(data, if_generation_match=0)
      elif whole:  # A new, non-composite object.
        whole = target.download_as_bytes(if_generation_match=self._generation)
        target.upload_from_string(whole + data, if_generation_match=self._generation)
      else:
        target = self._compose(bucket, self._upload_part(bucket, data, exceptions), data,
                               exceptions)
    except exceptions.PreconditionFailed:
      current = bucket.get_blob(self.name)  # A retried write of ours that did land...
      if not self._grew_by(current, data):
        raise  # ...or another writer's.
      target = current
    self._advance(target, len(data), 1 if whole else self._components + 1)

  def _upload_part(self, bucket, data: bytes, exceptions):
    part = bucket.blob(f'{self.name}.append-{os.getpid()}-{time.time_ns()}')
    try:
      part.upload_from_string(data, if_generation_match=0)
    except exceptions.PreconditionFailed:
      # The name is this writer's alone: a retried upload whose first try landed.
      landed = bucket.get_blob(part.name)
      if landed is None or int(landed.size) != len(data):
        raise
      part = landed
    return part

  def _compose(self, bucket, part, data: bytes, exceptions):
    """Composes the object and ``part`` into the object; returns the object as written."""
    from google.cloud.storage import retry  # pylint: disable=g-import-not-at-top
    target = bucket.blob(self.name)

    def attempt():
      now = bucket.get_blob(self.name)
      if now is None or int(now.generation) != self._generation:
        if self._grew_by(now, data):  # An earlier attempt landed; its reply was lost.
          return now
        raise exceptions.PreconditionFailed(f'{self.url} is not the one last written')
      # Retried here, not by the client: each attempt first checks whether the last landed.
      target.compose([bucket.blob(self.name), part], if_generation_match=self._generation,
                     retry=None)
      return target

    try:
      return retry.DEFAULT_RETRY(attempt)()
    finally:
      try:
        part.delete(if_generation_match=part.generation)
      except exceptions.NotFound:
        pass  # A retried delete whose first try did land.
      except storage_client.failures() as e:  # An orphan part; the append stands.
        logging.warning('Could not delete %s (%s); it is a leftover of an append to %s and '
                        'may be deleted.', part.name, type(e).__name__, self.url)

  def close(self) -> None:
    if not self.closed:
      self.flush()
      self.closed = True

  def __enter__(self) -> 'Appender':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class BackgroundAppender:
  """An :class:`Appender` flushed by a daemon thread: ``write`` never waits on the bucket.

  The thread flushes soon after a write, but never sooner than ``every_s`` seconds after
  its previous flush (Cloud Storage allows about one update a second to an object); a
  failed flush is logged and tried again ``retry_s`` seconds later with what was written
  meanwhile, so neither a slow request nor an outage reaches the writer's thread. ``close``
  flushes what is left, waiting at most ``close_timeout_s``, and logs what could not be
  written.
  """

  def __init__(self, appender: Appender, every_s: float = FLUSH_EVERY_S,
               retry_s: float = 10.0, close_timeout_s: float = 300.0):
    self.appender, self.every_s, self.retry_s = appender, float(every_s), float(retry_s)
    self.close_timeout_s = close_timeout_s
    self.url = appender.url
    self.failures = 0  # Flushes that failed (each logged).
    self.closed = False
    self._stop, self._wake = threading.Event(), threading.Event()
    self._thread = threading.Thread(target=self._run, name=f'append {appender.name}',
                                    daemon=True)
    self._thread.start()

  def write(self, data) -> int:
    written = self.appender.write(data)
    self._wake.set()
    return written

  def writelines(self, lines) -> None:
    self.appender.writelines(lines)
    self._wake.set()

  def flush(self) -> None:
    """Nothing here: the thread flushes (at most every ``every_s`` seconds)."""

  def _run(self) -> None:
    while not self._stop.is_set():
      self._wake.wait()
      self._wake.clear()
      ok = self._flush_logged()
      self._stop.wait(self.every_s if ok else self.retry_s)
      if not ok:
        self._wake.set()  # Try again, with what came meanwhile.
    self._flush_logged()

  def _flush_logged(self) -> bool:
    try:
      self.appender.flush()
      return True
    except Exception as e:  # pylint: disable=broad-except  (kept, and tried again)
      self.failures += 1
      logging.warning('Appending to %s failed (%s); %d bytes are kept and tried again in '
                      '%gs.', self.url, e, self.appender.pending(), self.retry_s)
      return False

  def close(self) -> None:
    if self.closed:
      return
    self.closed = True
    self._stop.set()
    self._wake.set()
    self._thread.join(self.close_timeout_s)
    left = self.appender.pending()
    if self._thread.is_alive() or left:
      logging.error('%s: %d bytes could not be appended before closing (Cloud Storage '
                    'unreachable?); the rest of the file is whole.', self.url, left)

  def __enter__(self) -> 'BackgroundAppender':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class _EventFile(Appender):
  """An event file's appender, flushed by tensorboardX's writer thread: a failed flush is
  logged and its events kept for the next one, never raised (it would end that thread)."""

  def flush(self) -> None:
    try:
      super().flush()
    except Exception as e:  # pylint: disable=broad-except  (kept, and tried again)
      logging.warning('TensorBoard events to %s not written yet (%s); %d bytes are kept and '
                      'tried again at the next flush.', self.url, e, self.pending())

  def close(self) -> None:
    self.flush()
    self.closed = True


class _EventFiles:
  """tensorboardX's writer factory for ``gs://``: event files appended by :class:`_EventFile`
  (tensorboardX's own uploads the whole file again at every flush, unconditionally, so a
  transient error there is not retried)."""

  def open(self, path: str) -> Appender:
    return _EventFile(path)

  def directory_check(self, path: str) -> None:
    """Called by tensorboardX's ``record_writer.directory_check`` before writing."""
    del path  # A bucket has no directories to create.


def tensorboardx(logdir: str) -> None:
  """Makes tensorboardX write ``gs://`` event files through :class:`_EventFile`; a one-line
  MissingExtra if the gcs extra is not installed."""
  storage_client.require(logdir)
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  record_writer.register_writer_factory('gs', _EventFiles())
