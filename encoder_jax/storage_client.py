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
file system with that window for ``gs://``).

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
``encoder_jax.storage`` instead (``data.sources.tfds_local_data_dir``), so it reaches an
emulator too.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time

from encoder_jax import extras

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
  _register_patient_gcsfs()


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
  return StorageError(f'{path}: {name}: {text}')


def failures() -> tuple[type[BaseException], ...]:
  """What google-cloud-storage raises once its retries are spent: API errors, credentials
  errors, and connection errors."""
  import requests  # pylint: disable=g-import-not-at-top
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top
  return exceptions.GoogleAPIError, auth.GoogleAuthError, requests.ConnectionError



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
  """gcsfs's ``GCSFileSystem`` whose requests retry for :func:`retry_window_s`: each try is
  gcsfs's own six (about 30 s); a transient failure after them is tried again, with backoff,
  until the window is spent. gcsfs fixes its retry count when it is imported, so a subclass
  is the one place to lengthen it."""
  import gcsfs as gcsfs_lib  # pylint: disable=g-import-not-at-top
  from gcsfs import retry  # pylint: disable=g-import-not-at-top

  class PatientGCSFileSystem(gcsfs_lib.GCSFileSystem):
    """gcsfs, retrying a transient failure for the project's window, not 30 s."""

    async def _request(self, method, path, *args, **kwargs):
      deadline = time.monotonic() + retry_window_s()
      delay = 1.0
      while True:
        try:
          return await super()._request(method, path, *args, **kwargs)
        except Exception as e:  # pylint: disable=broad-except  (gcsfs's own retriable set)
          if not retry.is_retriable(e) or time.monotonic() + delay > deadline:
            raise
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(2 * delay, 32.0)

  return PatientGCSFileSystem


def _register_patient_gcsfs() -> None:
  """Makes fsspec (and so etils.epath and Orbax's metadata) use the patient gcsfs for
  ``gs://``; nothing without the gcs extra."""
  try:
    cls = _patient_gcsfs_class()
  except ImportError:
    return
  import fsspec  # pylint: disable=g-import-not-at-top
  if fsspec.get_filesystem_class('gs') is not cls:
    fsspec.register_implementation('gs', cls, clobber=True)
    fsspec.register_implementation('gcs', cls, clobber=True)
