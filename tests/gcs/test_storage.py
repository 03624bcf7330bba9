"""encoder_jax.storage_client: one variable points every layer at an endpoint;
encoder_jax.storage_appends: appends compose."""

import pytest

from encoder_jax import storage
from encoder_jax import storage_appends
from encoder_jax import storage_client


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
