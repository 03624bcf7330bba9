"""Cloud Storage faults the emulator alone never shows, made by the fault proxy in front of
it (tests/support/gcs_emulator.py): a write that landed but whose reply was lost, an outage longer
than a client's retries, a refused permission."""

import collections
import json
import time

import pytest

from encoder_jax.storage import locks
from encoder_jax.storage import paths as storage
from encoder_jax.storage import appends as storage_appends
from encoder_jax.storage import client as storage_client

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def _through(proxy, monkeypatch) -> None:
  """Every client made from now on in this process goes through ``proxy``."""
  monkeypatch.setenv(storage_client.EMULATOR_HOST, proxy.url)
  storage_client.forget_file_systems()  # gcsfs keeps one per endpoint.


@pytest.fixture(autouse=True)
def _fresh_gcsfs():
  yield
  storage_client.forget_file_systems()


def _losing(*which: tuple[str, int]):
  """A ``lose_reply`` that loses the reply of the n-th request of each kind named
  (``upload``, ``compose``, ``delete``), counting from 1."""
  seen = collections.Counter()

  def lose(library, method, path):
    del library
    bare = path.split('?')[0]
    kind = ('compose' if bare.endswith('/compose') else
            'upload' if method == 'POST' and bare.startswith('/upload/') else
            'delete' if method == 'DELETE' else None)
    if kind is None:
      return False
    seen[kind] += 1
    return (kind, seen[kind]) in which

  lose.seen = seen
  return lose


def test_appends_whose_replies_were_lost_land_once(bucket, faulty_proxy, monkeypatch):
  # Uploads: 1 the object's first bytes, 2 (its retry), 3 the second append's part; the
  # third append's compose.
  proxy = faulty_proxy(lose_reply=_losing(('upload', 1), ('upload', 3), ('compose', 1)))
  _through(proxy, monkeypatch)
  url = f'{bucket}/metrics.jsonl'
  writer = storage_appends.Appender(url)
  for line in ('1\n', '2\n', '3\n', '4\n'):
    writer.write(line)
    writer.flush()
  assert proxy.lost['gcloud-python'] == 3
  assert storage.Blob(url).read().text == '1\n2\n3\n4\n'
  names = [b.name for b in storage_client.client().list_blobs(storage.split(bucket)[0])]
  assert names == ['metrics.jsonl']  # No part left behind.


def test_a_lock_written_whose_reply_was_lost_is_held(bucket, faulty_proxy, monkeypatch):
  proxy = faulty_proxy(lose_reply=_losing(('upload', 1)))
  _through(proxy, monkeypatch)
  url = f'{bucket}/run/.lock'
  lock = locks.Lock(url, heartbeat_s=0, horizon_s=60.0)
  assert lock.try_acquire() and proxy.lost['gcloud-python'] == 1
  assert json.loads(storage.Blob(url).read().text)['token'] == lock.info.token
  assert lock.release() and storage.Blob(url).read() is None


def test_a_new_object_every_n_composes(bucket, faulty_proxy, monkeypatch):
  requests = _losing()  # Loses nothing; counts.
  _through(faulty_proxy(lose_reply=requests), monkeypatch)
  url = f'{bucket}/metrics.jsonl'
  writer = storage_appends.Appender(url, compact_every=3)
  for i in range(7):  # Made by: upload, compose, compose, upload, compose, compose, upload.
    writer.write(f'{i}\n')
    writer.flush()
  assert storage.Blob(url).read().text == ''.join(f'{i}\n' for i in range(7))
  assert requests.seen['compose'] == 4 and requests.seen['upload'] == 3 + 4  # 4 parts.


def test_an_outage_keeps_appends_for_the_next_flush(bucket, faulty_proxy, monkeypatch):
  """An appender whose flush fails (every retry spent) keeps its bytes: nothing is lost or
  doubled once the bucket answers again, and the background writer never raises."""
  proxy = faulty_proxy()
  _through(proxy, monkeypatch)
  url = f'{bucket}/metrics.jsonl'
  writer = storage_appends.BackgroundAppender(storage_appends.Appender(url), every_s=0.05,
                                             retry_s=0.05)
  writer.write('1\n')
  _wait(lambda: storage.Blob(url).read() is not None)
  proxy.down = True
  from google.cloud.storage import retry  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(retry.DEFAULT_RETRY, '_timeout', 0.5)  # Each flush gives up at once.
  monkeypatch.setattr(retry.DEFAULT_RETRY, '_deadline', 0.5)
  writer.write('2\n')
  _wait(lambda: writer.failures >= 2)
  writer.write('3\n')
  proxy.down = False
  writer.close()
  assert storage.Blob(url).read().text == '1\n2\n3\n'


def _wait(condition, timeout_s: float = 30.0) -> None:
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert time.monotonic() < deadline, 'timed out'
    time.sleep(0.02)


def _events(url: str) -> list:
  """The events of every TensorBoard event file under ``url``."""
  import struct  # pylint: disable=g-import-not-at-top
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  bucket, prefix = storage.split(url)
  events = []
  for blob in storage_client.client().list_blobs(bucket, prefix=prefix + '/'):
    data, at = blob.download_as_bytes(), 0
    while at < len(data):
      (length,) = struct.unpack('<Q', data[at:at + 8])
      events.append(event_pb2.Event.FromString(data[at + 12:at + 12 + length]))
      at += 12 + length + 4
  return events


def test_metrics_and_tensorboard_never_block_or_raise_through_an_outage(
    bucket, faulty_proxy, monkeypatch, caplog):
  """tensorboardX's writer thread flushes the event file; a flush that raised would end the
  thread, and its queue would then block ``add_scalar`` for good: training would hang.
  The bucket stays down until an event file's flush has failed. Flushes come every 0.2 s:
  after the outage the thread writes the events queued meanwhile one by one, flushing
  whenever the period has passed, and a flush here is four requests (about 0.2 s against
  the emulator): at 0.05 s, every queued event was flushed alone (12 s of waiting)."""
  import threading  # pylint: disable=g-import-not-at-top
  from google.cloud.storage import retry  # pylint: disable=g-import-not-at-top
  from encoder_jax.run import metrics_log  # pylint: disable=g-import-not-at-top
  proxy = faulty_proxy()
  _through(proxy, monkeypatch)
  monkeypatch.setattr(retry.DEFAULT_RETRY, '_timeout', 0.5)  # Each flush gives up at once.
  monkeypatch.setattr(metrics_log, 'TENSORBOARD_FLUSH_S', 0.2)
  monkeypatch.setattr(metrics_log, 'JSONL_FLUSH_S', 0.05)
  workdir = f'{bucket}/run'
  writer = metrics_log.MetricWriter(workdir, resume_step=0)
  writer.write(1, {'loss': 1.0})
  _wait(lambda: _events(f'{workdir}/tensorboard'))  # The file exists: later flushes append.
  proxy.down = True
  written = threading.Event()

  def train():
    for step in range(2, 41):
      writer.write(step, {'loss': 1.0 / step, 'lr': 0.1})
      time.sleep(0.01)
    written.set()

  threading.Thread(target=train, daemon=True).start()
  assert written.wait(60), 'MetricWriter.write blocked while the bucket was down'
  _wait(lambda: 'TensorBoard events to' in caplog.text)  # Failed, logged, kept.
  assert proxy.refused > 0
  proxy.down = False
  writer.close()
  assert [r['step'] for r in metrics_log.read_metrics(workdir)] == list(range(1, 41))
  steps = {e.step for e in _events(f'{workdir}/tensorboard') if e.summary.value}
  assert steps == set(range(1, 41))


@pytest.mark.parametrize('refused, permission', [
    ('bucket', 'storage.buckets.get'),  # What roles/storage.objectAdmin lacks.
    ('list', 'storage.objects.list'),
])
def test_a_run_checks_at_start_what_it_may_do_in_its_bucket(bucket, faulty_proxy, monkeypatch,
                                                             refused, permission):
  from encoder_jax.run import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  name = storage.split(bucket)[0]

  def deny(library, method, path):
    del library
    bare = path.split('?')[0]
    return method == 'GET' and bare == {'bucket': f'/storage/v1/b/{name}',
                                        'list': f'/storage/v1/b/{name}/o'}[refused]

  _through(faulty_proxy(deny=deny), monkeypatch)
  with pytest.raises(workdir_lib.WorkdirError) as e:
    workdir_lib.check_workdir_writable(f'{bucket}/run')
  assert f'permission denied on bucket {name} (this needs {permission})' in str(e.value)
  assert 'roles/storage.legacyBucketReader' in str(e.value)
  monkeypatch.undo()  # The emulator itself again.
  assert list(storage_client.client().list_blobs(name)) == []  # The probe is gone.


def test_gcsfs_rides_out_an_outage_within_the_project_window(bucket, faulty_proxy,
                                                            monkeypatch):
  """Orbax's metadata and commit marker go through etils.epath on gcsfs, whose own retries
  give up after six tries (about 30 s): the project's file system retries each request
  itself, one request a try, until storage_client.retry_window_s() is spent (here 20 s
  through a 3 s outage; tests/storage/test_client_errors.py has a window that runs out)."""
  import threading  # pylint: disable=g-import-not-at-top
  from encoder_jax.run import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(storage_client.RETRY_WINDOW_VARIABLE, '20')
  proxy = faulty_proxy()
  _through(proxy, monkeypatch)
  proxy.down = True
  threading.Timer(3.0, lambda: setattr(proxy, 'down', False)).start()
  marker = workdir_lib.path(f'{bucket}/run/checkpoints/12', 'commit_success.txt')
  marker.write_text('done')
  assert proxy.refused >= 2 and marker.read_text() == 'done'
