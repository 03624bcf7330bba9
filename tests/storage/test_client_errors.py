"""A bucket's failures stop with one line naming the path and what to do: a missing bucket,
missing credentials, a refused permission, and an outage that outlasts the retries (what a
rerun does said too)."""

import os
import subprocess
import sys
import threading
import time

import pytest

from encoder_jax import cli
from encoder_jax.storage import locks
from encoder_jax.storage import paths as storage
from encoder_jax.storage import client as storage_client
from encoder_jax.run import workdir as workdir_lib

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ROOT = support.ROOT


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
      [sys.executable, '-m', 'encoder_jax.main', f'--config={support.TINY_CONFIG}',
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


# ------------------------------------------------------------------ outages past the retries


def test_an_outage_past_the_retry_window_ends_a_run_with_one_line(bucket, faulty_proxy,
                                                                 prepared_dir):
  """``main`` on a bucket through the fault proxy, whose outage starts at the run's first
  gcsfs request (the resume check's read of config.json, after the lock is taken) and lasts
  3 s, longer than the 1 s gcsfs window set here (tensorstore's window, minutes, cannot be
  shortened, so the outage comes before any array is written). The run ends at once with one
  ``error:`` line naming the object and what a rerun does, no traceback, and its lock
  released once the bucket answers again (google-cloud-storage rides out the 3 s)."""
  outage_s, started = 3.0, []
  proxy = None

  def first_gcsfs_request_starts_the_outage(library, method, path):
    del method, path
    if library == 'python-gcsfs' and not started:
      started.append(time.monotonic())
      proxy.down = True  # This request is refused too.
      threading.Timer(outage_s, lambda: setattr(proxy, 'down', False)).start()
    return False

  proxy = faulty_proxy(lose_reply=first_gcsfs_request_starts_the_outage)
  env = dict(os.environ, **{storage_client.EMULATOR_HOST: proxy.url,
                            storage_client.RETRY_WINDOW_VARIABLE: '1'})
  env.pop('TENSORSTORE_GCS_HTTP_URL', None)  # Derived again, from the proxy.
  workdir = f'{bucket}/run'
  proc = subprocess.run(
      [sys.executable, '-m', 'encoder_jax.main',
       f'--config={support.TINY_CONFIG}:prepared_dir={prepared_dir}',
       f'--workdir={workdir}'], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=240, check=False)
  ended = time.monotonic()
  assert started and proxy.refused >= 2, (proxy.refused, proc.stderr[-3000:])
  assert proc.returncode == cli.USER_ERROR_EXIT, proc.stdout[-2000:] + proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.startswith('error:')]
  assert len(lines) == 1 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  assert lines[0].startswith(f'error: {workdir}/config.json: the bucket did not answer '
                             'through all retries (HttpError: '), lines[0]
  assert lines[0].endswith(cli.STORAGE_RERUN)
  # Ended soon after the outage: the lock's release waited for the bucket, nothing more.
  assert ended - started[0] < outage_s + 30, ended - started[0]
  bucket_name, prefix = storage.split(workdir)
  assert f'{prefix}/.lock' not in {b.name for b in storage_client.client().list_blobs(
      bucket_name, prefix=prefix)}


def test_each_storage_library_error_is_one_line_naming_the_object(bucket, faulty_proxy,
                                                                  monkeypatch):
  """What each library raises once its retries are spent (made here through a proxy that is
  down, each with a short window), and an error of the project raised from one, as
  ``cli.run`` prints them: one line naming the ``gs://`` object, with what a rerun does; a
  user error and a bug are left as they were."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  from google.api_core import retry  # pylint: disable=g-import-not-at-top
  from encoder_jax.run import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  proxy = faulty_proxy()
  monkeypatch.setenv(storage_client.EMULATOR_HOST, proxy.url)
  monkeypatch.setenv('TENSORSTORE_GCS_HTTP_URL', proxy.url)
  monkeypatch.setenv(storage_client.RETRY_WINDOW_VARIABLE, '1')
  storage_client.forget_file_systems()  # gcsfs keeps one per endpoint.
  proxy.down = True
  raised = {}

  def catch(name, call):
    began = time.monotonic()
    with pytest.raises(Exception) as e:
      call()
    raised[name] = (e.value, time.monotonic() - began)

  catch('gcsfs', lambda: workdir_lib.path(f'{bucket}/run', 'config.json').write_text('{}'))
  catch('google-cloud-storage', lambda: storage_client.client().bucket(
      storage.split(bucket)[0]).get_blob('run/.lock', retry=retry.Retry(timeout=1)))
  catch('tensorstore', lambda: ts.open(
      {'driver': 'zarr', 'kvstore': f'{bucket}/run/checkpoints/4/params/x'},
      context=ts.Context({'gcs_request_retries': {'max_retries': 2, 'initial_delay': '10ms',
                                                   'max_delay': '20ms'}})).result())
  proxy.down = False
  # gcsfs gives up when its window is spent (not after its own six tries, about 30 s).
  assert raised['gcsfs'][1] < 10, raised['gcsfs']
  expected = {'gcsfs': f'{bucket}/run/config.json: the bucket did not answer',
              'google-cloud-storage': f'{bucket}/run/.lock: the bucket did not answer',
              'tensorstore': f'{bucket}/run/checkpoints/4/params/x/.zarray: the bucket did not '
                             'answer through all retries (ValueError: '}
  for name, (error, _) in raised.items():
    line, status = cli.one_line(error)
    assert status == cli.USER_ERROR_EXIT and line.startswith(f'error: {expected[name]}'), (
        name, line, error)
    assert line.endswith(cli.STORAGE_RERUN) and '\n' not in line, line
    assert 'tensorstore_spec' not in line and len(line) < 700, line
  # An error of the project raised from one keeps its words, with what a rerun does.
  try:
    raise workdir_lib.WorkdirError('--workdir=gs://b/run: cannot write there') from (
        raised['gcsfs'][0])
  except workdir_lib.WorkdirError as e:
    assert cli.one_line(e) == ('error: --workdir=gs://b/run: cannot write there. '
                               f'{cli.STORAGE_RERUN}', cli.USER_ERROR_EXIT)
  assert cli.one_line(ValueError('config.train.batch_size: 0 is not > 0')) == (
      'error: config.train.batch_size: 0 is not > 0', cli.USER_ERROR_EXIT)
  assert cli.one_line(KeyError('a bug')) == (None, 0)
