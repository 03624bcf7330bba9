"""encoder_jax.storage.appends on a bucket: appends compose into one object, and a write by
another writer between two flushes is an error. (Appends through an outage, or whose replies
were lost: tests/storage/test_faults.py.)"""

import pytest

from encoder_jax.storage import paths as storage
from encoder_jax.storage import appends as storage_appends
from encoder_jax.storage import client as storage_client

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def test_appends_compose_and_a_concurrent_writer_is_an_error(bucket):
  url = f'{bucket}/metrics.jsonl'
  with storage_appends.open_append(url) as first:
    first.write('1\n')
    first.flush()
    first.writelines(['2\n', '3\n'])
  with storage_appends.open_append(url) as second:
    second.write(b'4\n')
  assert storage.Blob(url).read().text == '1\n2\n3\n4\n'
  names = [b.name for b in storage_client.client().list_blobs(storage.split(bucket)[0])]
  assert names == ['metrics.jsonl']  # The parts are gone.
  writer = storage_appends.open_append(url)
  writer.write('5\n')
  writer.flush()
  other = storage.Blob(url).read()
  assert storage.Blob(url).write(other.text + 'x\n', if_generation=other.generation)
  writer.write('6\n')
  with pytest.raises(storage.StorageError, match='changed by another writer'):
    writer.flush()
