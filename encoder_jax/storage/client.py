"""Cloud Storage client setup: which library serves which ``gs://`` path; one emulator switch.

A TPU VM's disk goes away with its worker, so a pod run keeps its workdir in a bucket.
Three client libraries reach it, each where it is the one that can:

  etils.epath on fsspec's gcsfs    every file the package reads or writes whole by path:
                                   config, pinned tokenizer, checkpoint metadata (Orbax uses
                                   epath too), corpus globs (``storage.glob``, ranged reads),
                                   plots, evaluation reports. epath would
                                   pick TensorFlow's tf.io.gfile whenever TensorFlow is
                                   installed; :func:`configure_environment` turns that off
                                   (``EPATH_USE_TF=false``), because tf.io.gfile cannot be
                                   pointed at another endpoint (it always calls
                                   www.googleapis.com), so what the tests exercise would not
                                   be what a pod runs.
  tensorstore                      Orbax's array data (``checkpoints/<step>/``): Orbax opens
                                   its arrays with tensorstore's own ``gs://`` driver.
  google-cloud-storage             the workdir lock (``storage.Blob``): creating an object
                                   only if it is absent (``if_generation_match=0``) and
                                   replacing it only if it is the generation that was read are
                                   what make a lock on a bucket atomic; epath has no such
                                   call. Appending (``metrics.jsonl``, TensorBoard's event
                                   files through tensorboardX: ``storage_appends``) composes
                                   objects.

All three retry transient failures (HTTP 408/429/5xx, dropped connections) with backoff,
each for its own window: google-cloud-storage for 120 s (its default deadline), tensorstore
for up to 32 attempts with delays growing to 32 s, and gcsfs, which on its own gives up after
6 attempts (about 30 s: too short for the checkpoint metadata and commit marker Orbax writes
through epath), for :data:`RETRY_WINDOW_S` here (:func:`configure` registers gcsfs's
file system with that window for ``gs://``). When a window is spent the library's error
reaches the command, and :func:`failure_of` turns it (or the error raised from it) into one
line naming the object, which ``cli.run`` prints with what a rerun does.

**One switch.** Google's client libraries read ``STORAGE_EMULATOR_HOST`` (``host:port``
or a URL) and then talk to that endpoint without credentials; gcsfs does too. tensorstore
reads ``TENSORSTORE_GCS_HTTP_URL`` and ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` instead, and gcsfs
would first probe the bucket's type over gRPC (a minute against an emulator).
:func:`configure_environment` derives all of those from ``STORAGE_EMULATOR_HOST`` alone.
Nothing is set when a module is imported: :func:`configure` runs where a command starts
(``cli.run``), and again, lazily, before a client is first used (:func:`client`,
:func:`gcsfs`, ``workdir.path`` for a URL), so a library user (``encoder_jax.load`` in a
notebook) reaches an emulator too. So a pod run can be rehearsed on a laptop against a local
emulator::

    python -m encoder_jax.storage_emulator --bucket=bkt &   # prints STORAGE_EMULATOR_HOST=...
    STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT python -m encoder_jax.main \\
        --config=configs/crammed_small.py --workdir=gs://bkt/run

(the emulator is fake-gcs-server, which the ``test`` extra installs:
``encoder_jax.storage_emulator``). TensorFlow Datasets would read a ``data_dir=gs://...``
through TensorFlow's own file system (which always calls www.googleapis.com); the ``tfds:``
source copies the dataset's directory from the bucket to a local cache through
``encoder_jax.storage.paths`` instead (``data.sources.tfds_local_data_dir``), so it reaches an
emulator too.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
import random
import re
import sys
import time
import urllib.parse

from encoder_jax.core import extras

EMULATOR_HOST = 'STORAGE_EMULATOR_HOST'
# How long gcsfs keeps retrying one request through an outage (its own retries give up after
# about 30 s). Under the workdir lock's 15 minutes, so a run still retrying holds its lock.
# ENCODER_JAX_GCS_RETRY_S overrides it (the tests shorten it).
RETRY_WINDOW_S = 600.0
RETRY_WINDOW_VARIABLE = 'ENCODER_JAX_GCS_RETRY_S'


def configure() -> None:
  """Readies every storage layer for ``gs://``: the environment (:func:`configure_environment`)
  and gcsfs's retry window (:func:`gcsfs`). Cheap and idempotent: run where a command starts
  and before each first use of a client."""
  configure_environment()
  _epath_decides_again()
  _register_patient_gcsfs()


def _epath_decides_again() -> None:
  """etils.epath decides once per process, on its first use of any path, whether to serve
  ``gs://`` through TensorFlow (a cached check of ``EPATH_USE_TF``): a local path used before
  :func:`configure` (a workdir on disk, a test) would fix that choice to tf.io.gfile, which
  reaches neither an emulator nor gcsfs's retries. Its cached answer is dropped, so the
  next use reads the environment as configured."""
  gpath = sys.modules.get('etils.epath.gpath')
  cached = getattr(gpath, '_is_tf_installed', None)
  if cached is not None and hasattr(cached, 'cache_clear'):
    cached.cache_clear()


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
  configure()
  return _client(os.environ.get(EMULATOR_HOST, '').replace('default', ''))


class StorageError(OSError):
  """A Cloud Storage failure a user must act on; the message names the path and the fix."""


# What a run does in its bucket, and a role that grants each: roles/storage.objectAdmin
# grants the storage.objects.* permissions but not storage.buckets.get, which Orbax needs
# (listing and deleting checkpoint steps read the bucket's metadata); the legacy bucket
# reader role adds it, bucket-scoped.
PERMISSIONS = ('storage.objects.create', 'storage.objects.get', 'storage.objects.list',
               'storage.objects.delete', 'storage.buckets.get')
ROLES_ADVICE = ('grant this machine\'s account roles/storage.objectAdmin and '
                'roles/storage.legacyBucketReader on the bucket (or roles/storage.admin, or a '
                'custom role with ' + ', '.join(PERMISSIONS) + ')')


def explain(path: str, error: BaseException, permission: str = '') -> StorageError:
  """One line for a failure on ``path``: a missing bucket, missing credentials, a refused
  permission (``permission``: the one the failed call needs, if known), each with what to
  do, or the error as it came."""
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
    needs = f' (this needs {permission})' if permission else ''
    return StorageError(
        f'{path}: permission denied on bucket {bucket}{needs}: {text}. A run needs '
        f'{", ".join(PERMISSIONS)}: {ROLES_ADVICE}, or use another bucket.')
  if 'bucket' in text.lower() and (name == 'NotFound' or status == 404 or
                                   'does not exist' in text.lower()):
    return StorageError(f'{path}: the bucket {bucket} does not exist. Create it (gcloud storage '
                        f'buckets create gs://{bucket}) or fix the path.')
  if (status in TRANSIENT_STATUS or name == 'RetryError' or 'Connect' in name or
      'Timeout' in name or text.startswith(('UNAVAILABLE:', 'DEADLINE_EXCEEDED:')) or
      re.search(r'All \d+ retry attempts failed', text)):
    return StorageError(f'{path}: the bucket did not answer through all retries ({name}: '
                        f'{text})')
  return StorageError(f'{path}: {name}: {text}')


def failures() -> tuple[type[BaseException], ...]:
  """What google-cloud-storage raises once its retries are spent: API errors, credentials
  errors, and connection errors."""
  import requests  # pylint: disable=g-import-not-at-top
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top
  return exceptions.GoogleAPIError, auth.GoogleAuthError, requests.ConnectionError


# tensorstore's errors are ValueErrors whose text starts with an absl status code; these are
# the ones a storage failure gives (an outage, a refused or missing credential, a refusal).
_TENSORSTORE_STATUS = re.compile(
    r'^(UNAVAILABLE|ABORTED|DEADLINE_EXCEEDED|UNKNOWN|INTERNAL|RESOURCE_EXHAUSTED|'
    r'PERMISSION_DENIED|UNAUTHENTICATED): ')
# Its annotations ([tensorstore_spec='...'], [http_response_body='...'], [source_locations=...]):
# long, and not what a user acts on.
_TENSORSTORE_NOTE = re.compile(r"\s*\[[a-z_ ]+=('[^']*'|[^\]]*)\]")
_GS_URL = re.compile(r'gs://[^\s\'"\]:,]+')
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _library_failures() -> tuple[type[BaseException], ...]:
  """The error types the storage libraries raise that are already imported (one that is not
  imported raised nothing): google-api-core, google-auth, requests, gcsfs, aiohttp."""
  found = []
  for module, names in (('google.api_core.exceptions', ('GoogleAPIError',)),
                        ('google.auth.exceptions', ('GoogleAuthError',)),
                        ('requests.exceptions', ('ConnectionError', 'Timeout')),
                        ('gcsfs.retry', ('HttpError',)),
                        ('aiohttp.client_exceptions', ('ClientError',))):
    loaded = sys.modules.get(module)
    found += [getattr(loaded, name) for name in names if loaded and hasattr(loaded, name)]
  return tuple(found)


def gs_url(request_url: str) -> str:
  """The ``gs://`` path a JSON API request names (``.../b/BUCKET/o/NAME``, an upload's
  ``name=`` or a listing's ``prefix=``), ``gs://BUCKET`` when it names only the bucket, or ''
  when it names none."""
  parsed = urllib.parse.urlsplit(request_url)
  found = re.search(r'/b/([^/?]+)(?:/o/([^/?]+))?', parsed.path)
  if not found:
    return ''
  bucket, name = found.group(1), urllib.parse.unquote(found.group(2) or '')
  query = urllib.parse.parse_qs(parsed.query)
  name = name or (query.get('name') or query.get('prefix') or [''])[0]
  return f'gs://{bucket}/{name}'.rstrip('/')


def _url_in(error: BaseException) -> str:
  """Where ``error`` happened: the object the patient gcsfs noted on it, the ``gs://`` path
  in its text (tensorstore), or the object of the request URL in its text (google-cloud-
  storage names the request); '' if none."""
  noted = getattr(error, 'storage_url', '')
  if noted:
    return noted
  text = str(error)
  found = _GS_URL.search(text)
  if found:
    return found.group(0).rstrip('.')
  request = re.search(r'https?://\S+', text)
  return gs_url(request.group(0).rstrip(':')) if request else ''


def _tensorstore_failure(error: BaseException) -> bool:
  return (isinstance(error, (ValueError, RuntimeError)) and
          bool(_TENSORSTORE_STATUS.match(str(error))) and 'gs://' in str(error))


def failure_of(error: BaseException) -> tuple[BaseException, StorageError] | None:
  """The storage failure behind ``error``: ``error`` itself or one it was raised from (its
  cause or context), with one line for it (:func:`explain`) naming its ``gs://`` path;
  None when no storage library raised one.

  What counts: a :class:`StorageError` (as the project raises it), the errors of
  google-cloud-storage (google.api_core, google.auth, requests), gcsfs and aiohttp (each after
  its retries), and tensorstore's ValueErrors about a ``gs://`` path (its status code first:
  ``UNAVAILABLE: ...``). Used where a command ends (``cli.run``), so that an outage longer
  than every retry window ends a run with one line instead of a library's traceback.
  """
  kinds = _library_failures()
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, StorageError):
      return error, error
    if kinds and isinstance(error, kinds) or _tensorstore_failure(error) or getattr(
        error, 'storage_url', ''):
      url = _url_in(error) or 'a Cloud Storage request'
      if _tensorstore_failure(error):  # Its text, without the spec it dumps.
        return error, explain(url, type(error)(_TENSORSTORE_NOTE.sub('', str(error))))
      return error, explain(url, error)
    error = error.__cause__ or error.__context__
  return None


def retry_window_s() -> float:
  """:data:`RETRY_WINDOW_S`, or the ``ENCODER_JAX_GCS_RETRY_S`` environment variable."""
  value = os.environ.get(RETRY_WINDOW_VARIABLE, '')
  try:
    return float(value) if value else RETRY_WINDOW_S
  except ValueError:
    raise ValueError(f'{RETRY_WINDOW_VARIABLE}={value!r} is not a number; expected seconds '
                     f'(default {RETRY_WINDOW_S:g})') from None


def gcsfs(path: str):
  """gcsfs's file system for ``gs://`` (the one etils.epath uses), retrying for
  :func:`retry_window_s`; a one-line MissingExtra without the gcs extra."""
  require(path)
  configure()
  import fsspec  # pylint: disable=g-import-not-at-top
  return fsspec.filesystem('gs')


@functools.lru_cache(maxsize=None)
def _patient_gcsfs_class():
  """gcsfs's ``GCSFileSystem`` whose requests retry a transient failure (gcsfs's own retriable
  set: 408, 429, 5xx, dropped connections) with backoff for :func:`retry_window_s`, and no
  longer: each try is one request (gcsfs's own six tries, about 30 s, are bypassed), so the
  window is what ``ENCODER_JAX_GCS_RETRY_S`` says. gcsfs fixes its retry count when it is
  imported, so a subclass is the one place to change it. The error that ends the window
  carries the object it was for (``storage_url``, read by :func:`failure_of`): gcsfs's own
  errors do not name it."""
  import gcsfs as gcsfs_lib  # pylint: disable=g-import-not-at-top
  from gcsfs import retry  # pylint: disable=g-import-not-at-top
  # One try, without gcsfs's retry decorator (which keeps the undecorated function here).
  once = getattr(gcsfs_lib.GCSFileSystem._request, '__wrapped__', None)  # pylint: disable=protected-access

  def transient(error: BaseException) -> bool:
    return retry.is_retriable(error) and getattr(error, 'status', None) != 404

  class PatientGCSFileSystem(gcsfs_lib.GCSFileSystem):
    """gcsfs, retrying a transient failure for the project's window, not 30 s."""

    async def _request(self, method, path, *args, **kwargs):
      deadline = time.monotonic() + retry_window_s()
      delay = 1.0
      while True:
        try:
          if once is None:  # Another gcsfs: its own tries inside each of ours.
            return await super()._request(method, path, *args, **kwargs)
          return await once(self, method, path, *args, **kwargs)
        except Exception as e:  # pylint: disable=broad-except  (gcsfs's own retriable set)
          if not transient(e) or time.monotonic() + delay > deadline:
            if isinstance(e, retry.HttpError) and e.code == 400 and 'requester pays' in str(
                e.message):  # As gcsfs's own retries say it.
              raise ValueError('Bucket is requester pays. Set `requester_pays=True` when '
                               'creating the GCSFileSystem.') from e
            if not isinstance(e, (FileNotFoundError, FileExistsError)):
              try:
                e.storage_url = gs_url(self._format_path(path, args))
              except Exception:  # pylint: disable=broad-except  (a note, never a new error)
                pass
            raise
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(2 * delay, 32.0)

  return PatientGCSFileSystem


def forget_file_systems() -> None:
  """Drops this process's ``gs://`` file systems, fsspec's and the one etils.epath keeps for
  the process on its own (Orbax's metadata goes through it): each holds the endpoint and
  credentials of the environment it was made in, and its cached listings. The next use
  makes new ones from the environment as it is then (another endpoint, a test's fault
  proxy). Clearing fsspec's alone would leave epath on the old one."""
  if 'gcsfs' not in sys.modules:
    return
  import fsspec  # pylint: disable=g-import-not-at-top
  from etils.epath import backend  # pylint: disable=g-import-not-at-top
  fsspec.get_filesystem_class('gs').clear_instance_cache()
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access


def _register_patient_gcsfs() -> None:
  """Makes fsspec (and so etils.epath and Orbax's metadata) use the patient gcsfs for
  ``gs://``; nothing without the gcs extra. Registered by name: gcsfs (about half a second
  of imports) is imported at the first ``gs://`` use, so a run on local disk never does."""
  if importlib.util.find_spec('gcsfs') is None:
    return
  import fsspec  # pylint: disable=g-import-not-at-top
  for protocol in ('gs', 'gcs'):
    current = fsspec.registry.get(protocol)  # A class, once the protocol is used.
    if current is None:
      fsspec.register_implementation(protocol, f'{__name__}.PatientGCSFileSystem',
                                     clobber=True)
    elif current is not _patient_gcsfs_class():
      fsspec.register_implementation(protocol, _patient_gcsfs_class(), clobber=True)


def __getattr__(name: str):
  """``PatientGCSFileSystem``, built on first use (fsspec imports it by that name)."""
  if name == 'PatientGCSFileSystem':
    return _patient_gcsfs_class()
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
