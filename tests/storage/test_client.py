"""encoder_jax.storage.client: one variable points every layer at an endpoint."""

import os
import subprocess
import sys

import pytest

from encoder_jax.storage import client as storage_client

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ROOT = support.ROOT
_DERIVED = ('TENSORSTORE_GCS_HTTP_URL', 'GOOGLE_AUTH_TOKEN_FOR_TESTING',
            'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'GOOGLE_CLOUD_PROJECT')


def test_storage_emulator_host_alone_points_every_layer_at_the_endpoint():
  environ = {storage_client.EMULATOR_HOST: '127.0.0.1:4443', 'GOOGLE_CLOUD_PROJECT': 'mine'}
  storage_client.configure_environment(environ)
  assert environ['TENSORSTORE_GCS_HTTP_URL'] == 'http://127.0.0.1:4443'  # Orbax's arrays.
  assert environ['GOOGLE_AUTH_TOKEN_FOR_TESTING']  # tensorstore asks for no credentials.
  assert environ['EPATH_USE_TF'] == 'false'  # etils.epath on gcsfs, not tf.io.gfile.
  assert environ['GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT'] == 'false'  # No gRPC probe.
  assert environ['GOOGLE_CLOUD_PROJECT'] == 'mine'  # What is set is kept.
  production = {}
  storage_client.configure_environment(production)
  assert production == {'EPATH_USE_TF': 'false'}


_IMPORT_EVERYTHING = '''
import os, sys
import jax  # Sets TPU_* variables itself: not the package's doing.
before = dict(os.environ)
import encoder_jax, encoder_jax.main, encoder_jax.api, encoder_jax.storage_emulator
from encoder_jax import cli
from encoder_jax.storage import client as storage_client
from encoder_jax.run import workdir
from encoder_jax.run import metrics_log
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print('changed:', changed)
'''


def test_importing_the_package_writes_no_environment():
  env = {k: v for k, v in os.environ.items() if k not in _DERIVED + ('EPATH_USE_TF',)}
  env[storage_client.EMULATOR_HOST] = 'http://127.0.0.1:9'
  proc = subprocess.run([sys.executable, '-c', _IMPORT_EVERYTHING], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=True)
  assert 'changed: []' in proc.stdout, proc.stdout + proc.stderr[-2000:]


_LOAD_FROM_A_NOTEBOOK = '''
import os, encoder_jax
try:
  encoder_jax.load(%r)
except FileNotFoundError as e:
  print('refused:', e)
print('tensorstore:', os.environ.get('TENSORSTORE_GCS_HTTP_URL'))
'''


def test_a_library_user_reaches_the_emulator_without_a_command(gcs_emulator, bucket):
  """encoder_jax.load in a notebook: no command set the environment up; the first gs:// path
  does, so the emulator STORAGE_EMULATOR_HOST names is what answers."""
  env = {k: v for k, v in os.environ.items() if k not in _DERIVED + ('EPATH_USE_TF',)}
  env[storage_client.EMULATOR_HOST] = gcs_emulator.url
  proc = subprocess.run([sys.executable, '-c', _LOAD_FROM_A_NOTEBOOK % f'{bucket}/nothing'],
                        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
                        check=True)
  assert f"refused: '{bucket}/nothing' does not exist" in proc.stdout, proc.stderr[-2000:]
  assert f'tensorstore: {gcs_emulator.url}' in proc.stdout


_LOCAL_PATH_FIRST = '''
import os
import tensorflow  # Installed: etils.epath would serve gs:// through tf.io.gfile.
from etils import epath
epath.Path(os.getcwd()).exists()  # A workdir on disk used first fixes epath's choice...
from encoder_jax.storage import client as storage_client
storage_client.configure()  # ...which configure makes it take again.
path = epath.Path(%r)
path.write_text('through gcsfs')
print('read:', path.read_text())
'''


def test_a_local_path_used_first_does_not_send_gs_through_tensorflow(gcs_emulator, bucket):
  """tf.io.gfile reaches neither an emulator nor gcsfs's retries: a process that used
  etils.epath on a local path before configuring storage must still reach the bucket."""
  env = {k: v for k, v in os.environ.items() if k not in _DERIVED + ('EPATH_USE_TF',)}
  env[storage_client.EMULATOR_HOST] = gcs_emulator.url
  proc = subprocess.run([sys.executable, '-c', _LOCAL_PATH_FIRST % f'{bucket}/x.txt'],
                        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert 'read: through gcsfs' in proc.stdout, proc.stderr[-2000:]
