"""One Cloud Storage emulator for the session (fake-gcs-server, from the test extra).

Each pytest-xdist worker starts its own (a start takes a fraction of a second), on a free
port with its objects in a temporary directory, removed at the end. The session's
environment points every storage layer at it through ``STORAGE_EMULATOR_HOST`` alone
(``encoder_jax.storage.configure_environment``), as a user rehearsing a pod run would; tests
use a bucket of their own (``bucket``) so they can share it.
"""

import os
import uuid

import pytest

from encoder_jax import storage

# The variables configure_environment derives from STORAGE_EMULATOR_HOST.
_DERIVED = ('TENSORSTORE_GCS_HTTP_URL', 'GOOGLE_AUTH_TOKEN_FOR_TESTING',
            'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'GOOGLE_CLOUD_PROJECT')


@pytest.fixture(scope='session')
def gcs_emulator():
  """The running emulator; the environment names it for this process and its children."""
  saved = {k: os.environ.get(k) for k in (storage.EMULATOR_HOST,) + _DERIVED}
  with storage.Emulator() as emulator:
    os.environ[storage.EMULATOR_HOST] = emulator.url
    for key in _DERIVED:
      os.environ.pop(key, None)
    storage.configure_environment()
    try:
      yield emulator
    finally:
      for key, value in saved.items():
        if value is None:
          os.environ.pop(key, None)
        else:
          os.environ[key] = value


@pytest.fixture
def bucket(gcs_emulator) -> str:
  """A new, empty bucket on the emulator: ``gs://<name>``."""
  name = f'test-{uuid.uuid4().hex[:12]}'
  gcs_emulator.create_bucket(name)
  return f'gs://{name}'
