"""A bucket's failures stop with one line naming the path and what to do."""

import os
import subprocess
import sys

import pytest

from encoder_jax import locks
from encoder_jax import storage
from encoder_jax import storage_client
from encoder_jax import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_missing_bucket_is_named_with_the_command_that_creates_it(gcs_emulator):
  with pytest.raises(workdir_lib.WorkdirError) as e:
    workdir_lib.check_workdir_writable('gs://no-such-bucket-x/run')
  assert str(e.value).startswith('--workdir=gs://no-such-bucket-x/run: cannot write there')
  assert 'the bucket no-such-bucket-x does not exist. Create it (gcloud storage buckets ' \
         'create gs://no-such-bucket-x)' in str(e.value)
  lock = locks.Lock('gs://no-such-bucket-x/run/.lock', heartbeat_s=0, horizon_s=60.0)
  with pytest.raises(storage.StorageError, match=r'bucket no-such-bucket-x does not exist'):
    lock.try_acquire()


def test_a_bucket_without_credentials_is_one_line_from_main(tmp_path):
  env = {k: v for k, v in os.environ.items()
         if k not in (storage_client.EMULATOR_HOST, 'GOOGLE_APPLICATION_CREDENTIALS',
                      'TENSORSTORE_GCS_HTTP_URL', 'GOOGLE_AUTH_TOKEN_FOR_TESTING')}
  env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path), NO_GCE_CHECK='True')
  proc = subprocess.run(
      [sys.executable, '-m', 'encoder_jax.main', f'--config={ROOT}/tests/tiny_config.py',
       '--workdir=gs://some-bucket/run'], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=300, check=False)
  assert proc.returncode != 0
  lines = [l for l in proc.stderr.splitlines() if l.startswith('error:')]
  assert len(lines) == 1, proc.stderr[-3000:]
  assert 'gs://some-bucket/run' in lines[0] and 'no Google Cloud credentials found' in lines[0]
  assert 'gcloud auth application-default login' in lines[0]


def test_a_refused_permission_names_the_bucket_and_the_role():
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  error = storage_client.explain('gs://bkt/run/.lock', exceptions.Forbidden(
      'POST https://storage.googleapis.com/upload/storage/v1/b/bkt/o: sa@p.iam does not '
      'have storage.objects.create access'))
  assert str(error).startswith('gs://bkt/run/.lock: permission denied on bucket bkt: ')
  assert '\n' not in str(error)
  # objectAdmin alone lacks storage.buckets.get, which Orbax needs: the advice adds a role
  # that grants it.
  assert 'storage.buckets.get' in str(error) and 'roles/storage.legacyBucketReader' in str(error)
