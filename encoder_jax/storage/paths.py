"""Path I/O on Cloud Storage (``gs://``): objects read and written with generation
preconditions (:class:`Blob`, what a lock needs), globs and ranged reads, and whole trees
copied up and down.

Which client library serves which path, and the emulator switch, are
``encoder_jax.storage.client``'s; appends (``metrics.jsonl``, TensorBoard's event files) are
``encoder_jax.storage.appends``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import tempfile
import uuid

from encoder_jax.storage import client as storage_client


# What the functions here raise, and how they split a URL, for their callers.
StorageError = storage_client.StorageError
split = storage_client.split


@dataclasses.dataclass(frozen=True)
class Version:
  """An object as read: its text, generation (Cloud Storage's version number) and mtime."""
  text: str
  generation: int
  mtime: float


class Blob:
  """One object, read and written with generation preconditions (what a lock needs)."""

  def __init__(self, url: str):
    self.url = str(url)
    self.bucket, self.name = storage_client.split(self.url)

  def _blob(self, generation: int | None = None):
    return storage_client.client().bucket(self.bucket).blob(self.name, generation=generation)

  def _exceptions(self):
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    return exceptions

  def read(self) -> Version | None:
    """The object now; None if there is none."""
    exceptions = self._exceptions()
    for _ in range(5):  # Replaced between the metadata and the content: read again.
      try:
        meta = storage_client.client().bucket(self.bucket).get_blob(self.name)
        if meta is None:
          return None
        data = self._blob(meta.generation).download_as_bytes(
            if_generation_match=meta.generation)
      except exceptions.NotFound as e:
        if 'bucket' in str(e).lower():
          raise storage_client.explain(self.url, e) from e
        continue  # That generation was replaced or deleted meanwhile.
      except exceptions.PreconditionFailed:
        continue
      except storage_client.failures() as e:
        raise storage_client.explain(self.url, e) from e
      return Version(data.decode('utf-8', 'replace'), int(meta.generation),
                     meta.updated.timestamp())
    return None

  def exists(self) -> bool:
    try:
      return storage_client.client().bucket(self.bucket).get_blob(self.name) is not None
    except storage_client.failures() as e:
      raise storage_client.explain(self.url, e) from e

  def write(self, text: str, if_generation: int) -> int | None:
    """Writes ``text`` only if the object's generation is ``if_generation`` now (0: only if
    there is no object). Returns the new generation, or None if the precondition failed."""
    exceptions = self._exceptions()
    try:  # A precondition makes the upload idempotent, so the client retries it on 5xx.
      blob = self._blob()
      blob.upload_from_string(text, if_generation_match=if_generation)
    except exceptions.PreconditionFailed:
      now = self.read()  # A retried upload of ours whose first try did land reads as ours.
      if now is not None and now.text == text:
        return now.generation
      return None
    except storage_client.failures() as e:
      raise storage_client.explain(self.url, e) from e
    return int(blob.generation)

  def delete(self, if_generation: int) -> bool:
    """Deletes the object only if its generation is ``if_generation``; True if it did."""
    exceptions = self._exceptions()
    try:
      self._blob().delete(if_generation_match=if_generation)
    except (exceptions.PreconditionFailed, exceptions.NotFound):
      return False
    except storage_client.failures() as e:
      raise storage_client.explain(self.url, e) from e
    return True


def forget_listings(url: str) -> None:
  """Drops this process's cached listings under ``url`` (a no-op for a local path). gcsfs
  keeps every directory listing it made, without expiry: where another host may have
  changed a prefix (a checkpoint step moved or deleted, data prepared), the next listing
  must ask the bucket."""
  if '://' not in str(url):
    return
  from etils.epath import backend as epath_backend  # pylint: disable=g-import-not-at-top
  prefix = str(url).split('://', 1)[1].rstrip('/')
  # Ours, and the one etils.epath holds for the process (Orbax lists through it; made with
  # other arguments, and kept by epath itself, so not always fsspec's current instance).
  for fs in {id(fs): fs for fs in (storage_client.gcsfs(url),
                                    epath_backend.fsspec_backend.fs(url))}.values():
    for key in [k for k in list(fs.dircache) if k.startswith(prefix + '/')]:
      fs.dircache.pop(key, None)  # gcsfs's own invalidation drops the path and its parents.
    fs.invalidate_cache(prefix)


def glob(pattern: str) -> list[str]:
  """The ``gs://`` objects matching ``pattern`` (``*``, ``?``, ``[...]``, ``**``), sorted."""
  try:
    found = storage_client.gcsfs(pattern).glob(pattern)
  except FileNotFoundError:
    return []
  return sorted(f'gs://{p}' for p in found)


def open_read(path: str):
  """A binary reader of a ``gs://`` object, as ``open(path, 'rb')`` gives (gcsfs's ranged
  reads, seekable; wrapped for ``readline(size)``, which gcsfs's file lacks)."""
  return io.BufferedReader(storage_client.gcsfs(path).open(path, 'rb', block_size=4 << 20),
                           1 << 20)


def size(path: str) -> int:
  return int(storage_client.gcsfs(path).size(path))


def exists(path: str) -> bool:
  """Whether the file (local) or object (``gs://``) ``path`` exists."""
  return Blob(path).exists() if str(path).startswith('gs://') else os.path.exists(path)


def upload_tree(local_dir: str, url: str, last: str = '', overwrite: bool = False) -> None:
  """Copies every file under ``local_dir`` to objects under ``url``, the file ``last``
  (a manifest: its presence says the copy is complete) after all the others. Existing
  objects are an error unless ``overwrite``."""
  from google.cloud.storage import retry  # pylint: disable=g-import-not-at-top
  names = sorted(os.path.relpath(os.path.join(root, f), local_dir)
                 for root, _, files in os.walk(local_dir) for f in files)
  bucket_name, prefix = storage_client.split(url.rstrip('/'))
  try:
    bucket = storage_client.client().bucket(bucket_name)
    for name in sorted(names, key=lambda n: n == last):  # Idempotent: retried on 5xx.
      bucket.blob(f'{prefix}/{name}').upload_from_filename(
          os.path.join(local_dir, name), if_generation_match=None if overwrite else 0,
          retry=retry.DEFAULT_RETRY)
  except storage_client.failures() as e:
    raise storage_client.explain(url, e) from e


@contextlib.contextmanager
def staged(out: str):
  """A directory to write ``out`` into with local file functions: ``out`` itself when it is
  local; for ``gs://``, a temporary directory uploaded to ``out`` when the block succeeds
  (for writers that only know local files: the Hugging Face export)."""
  if not str(out).startswith('gs://'):
    yield out
    return
  with tempfile.TemporaryDirectory(prefix='staged_') as local:
    yield local
    upload_tree(local, out, overwrite=True)


def generations(url: str) -> dict[str, int]:
  """Every object under ``url`` (a directory on a bucket): its name relative to ``url`` ->
  its generation (which changes whenever the object is written)."""
  bucket_name, prefix = storage_client.split(url.rstrip('/'))
  try:
    return {b.name[len(prefix) + 1:]: int(b.generation)
            for b in storage_client.client().list_blobs(bucket_name, prefix=prefix + '/')}
  except storage_client.failures() as e:
    raise storage_client.explain(url, e) from e


def download_tree(url: str, local_dir: str, last: str) -> int:
  """Copies every object under ``url`` into ``local_dir`` (made), ``last`` after all the
  others; returns the bytes copied."""
  bucket_name, prefix = storage_client.split(url.rstrip('/'))
  total = 0
  try:
    blobs = sorted(storage_client.client().list_blobs(bucket_name, prefix=prefix + '/'),
                   key=lambda b: b.name == f'{prefix}/{last}')
    for blob in blobs:
      target = os.path.join(local_dir, blob.name[len(prefix) + 1:])
      os.makedirs(os.path.dirname(target), exist_ok=True)
      blob.download_to_filename(target)  # Checksummed; retried on 5xx.
      total += int(blob.size or 0)
  except storage_client.failures() as e:
    raise storage_client.explain(url, e) from e
  return total


@contextlib.contextmanager
def local_copy(path: str):
  """A local directory holding what ``path`` holds, for readers of local files only (the
  Hugging Face import): ``path`` itself when it is local; for ``gs://``, a temporary copy of
  every object under it, removed when the block ends."""
  if not str(path).startswith('gs://'):
    yield path
    return
  with tempfile.TemporaryDirectory(prefix='copy_') as local:
    if not download_tree(str(path), local, last=''):
      raise FileNotFoundError(f'{path} holds no objects; expected a directory on the bucket')
    yield local




def check_access(url: str) -> None:
  """Raises StorageError unless this machine may do in ``url``'s bucket what a run does:
  create, list and delete objects under ``url`` and read the bucket's metadata
  (``storage.buckets.get``: Orbax reads it to list and delete checkpoint steps, so a run
  without it trains, then fails at its first old checkpoint's deletion and at every
  resume). Each refusal names the permission it lacked; the probe object is removed."""
  bucket_name, prefix = storage_client.split(url.rstrip('/') + '/')
  probe = Blob(f'gs://{bucket_name}/{prefix}.write_test-{os.getpid()}-{uuid.uuid4().hex[:8]}')
  generation = probe.write('probe', if_generation=0)  # storage.objects.create
  try:
    for permission, call in (
        ('storage.objects.list', lambda: list(storage_client.client().list_blobs(
            bucket_name, prefix=prefix, max_results=1))),
        ('storage.buckets.get', lambda: storage_client.client().get_bucket(bucket_name))):
      try:
        call()
      except storage_client.failures() as e:
        raise storage_client.explain(url, e, permission=permission) from e
  finally:
    if generation is not None:
      probe.delete(if_generation=generation)  # storage.objects.delete


def beside(path: str, what: str) -> str:
  """A fresh hidden name next to ``path``: ``.<name>.<what>-<pid>-<random>``."""
  head, name = os.path.split(str(path))
  return os.path.join(head, f'.{name}.{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}')


def write_atomically(path, text: str) -> None:
  """Writes ``text`` to a temporary file next to ``path``, renamed over it: a reader (or a
  process killed mid-write) sees the old file or the new one whole, never a part (on a
  bucket the rename is a copy of the whole object). The package's one writer of a file
  replaced whole: a lock file's heartbeat, the workdir's files, the embedded-corpus cache."""
  if '://' in str(path):
    from etils import epath  # pylint: disable=g-import-not-at-top
    target = epath.Path(str(path))
    tmp = target.with_name(os.path.basename(beside(target.name, 'tmp')))
    try:
      tmp.write_text(text)
      tmp.replace(target)
    finally:
      if tmp.exists():
        tmp.unlink()
    return
  tmp = beside(path, 'tmp')
  try:
    with open(tmp, 'w', encoding='utf-8') as f:
      f.write(text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
