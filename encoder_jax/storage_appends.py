"""Appends to Cloud Storage objects (which cannot be appended to): ``metrics.jsonl`` and
TensorBoard's event files (tensorboardX) on ``gs://`` compose objects."""

from __future__ import annotations

import os
import time

from encoder_jax import storage_client


def open_append(path):
  """``path.open('a')`` for a local path; an :class:`Appender` for ``gs://`` (gcsfs would
  open it in overwrite mode, losing what the object held)."""
  if str(path).startswith('gs://'):
    return Appender(str(path))
  return path.open('a')


class Appender:
  """An object on Cloud Storage opened for appending (objects cannot be appended to): text
  or bytes, as written.

  Each ``flush`` uploads what was written since as a new object and composes the object and
  it into the object (Cloud Storage's compose: a constant number of requests whatever the
  size), conditional on the generation last written, so a concurrent writer is an error
  rather than lost lines; every request is conditional, so the client retries it on
  transient errors. A writer killed between flushes loses only the unflushed part, as a
  local file's would. Also TensorBoard's event files on ``gs://`` (:func:`tensorboardx`).
  """

  def __init__(self, url: str):
    self.url = url
    self.bucket, self.name = storage_client.split(url)
    self._pending: list[bytes] = []
    self._generation: int | None = None  # Of the object as we last wrote it...
    self._size = 0  # ...and its size then.
    self.closed = False

  def write(self, data) -> int:
    self._pending.append(data.encode('utf-8') if isinstance(data, str) else bytes(data))
    return len(data)

  def writelines(self, lines) -> None:
    for line in lines:
      self.write(line)

  def flush(self) -> None:
    if not self._pending:
      return
    data, self._pending = b''.join(self._pending), []
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    try:
      bucket = storage_client.client().bucket(self.bucket)
      if self._generation is None:
        current = bucket.get_blob(self.name)
        self._generation = 0 if current is None else int(current.generation)
        self._size = 0 if current is None else int(current.size)
      self._append(bucket, data, exceptions)
    except exceptions.PreconditionFailed as e:
      raise storage_client.StorageError(
          f'{self.url} was changed by another writer while this one appended to it; is '
          'another run using the same workdir?') from e
    except storage_client.failures() as e:
      raise storage_client.explain(self.url, e) from e

  def _append(self, bucket, data: bytes, exceptions) -> None:
    target = bucket.blob(self.name)
    try:
      if self._generation == 0:
        target.upload_from_string(data, if_generation_match=0)
      else:
        part = bucket.blob(f'{self.name}.append-{os.getpid()}-{time.time_ns()}')
        part.upload_from_string(data, if_generation_match=0)
        try:  # Checked here too: emulators ignore compose's precondition.
          now = bucket.get_blob(self.name)
          if now is None or int(now.generation) != self._generation:
            raise exceptions.PreconditionFailed(f'{self.url} is not the one last written')
          target.compose([bucket.blob(self.name), part], if_generation_match=self._generation)
        finally:
          try:
            part.delete(if_generation_match=part.generation)
          except exceptions.NotFound:
            pass  # A retried delete whose first try did land.
    except exceptions.PreconditionFailed:
      # A retried request whose first try did land reads as done: the object has grown by
      # exactly this part since our last write.
      current = bucket.get_blob(self.name)
      if current is None or int(current.size) != self._size + len(data) or (
          current.download_as_bytes(start=self._size) != data):
        raise
      target = current
    self._generation, self._size = int(target.generation), self._size + len(data)

  def close(self) -> None:
    if not self.closed:
      self.flush()
      self.closed = True

  def __enter__(self) -> 'Appender':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class _EventFiles:
  """tensorboardX's writer factory for ``gs://``: event files appended by :class:`Appender`
  (tensorboardX's own uploads the whole file again at every flush, unconditionally, so a
  transient error there is not retried)."""

  def open(self, path: str) -> Appender:
    return Appender(path)

  def directory_check(self, path: str) -> None:
    """Called by tensorboardX's ``record_writer.directory_check`` before writing."""
    del path  # A bucket has no directories to create.


def tensorboardx(logdir: str) -> None:
  """Makes tensorboardX write ``gs://`` event files through :class:`Appender`; a one-line
  MissingExtra if the gcs extra is not installed."""
  storage_client.require(logdir)
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  record_writer.register_writer_factory('gs', _EventFiles())

