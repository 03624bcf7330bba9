"""encoder_jax.storage.paths: a file replaced whole, on disk and on a bucket."""

import os

import pytest
from etils import epath

from encoder_jax.storage import paths as storage
from encoder_jax.storage import client as storage_client

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def test_a_file_is_replaced_whole_on_disk_and_on_a_bucket(bucket, tmp_path):
  """``write_atomically`` leaves the new text and nothing beside it, wherever the file is."""
  for where, listing in ((str(tmp_path), lambda: sorted(os.listdir(tmp_path))),
                         (bucket, lambda: [b.name for b in storage_client.client().list_blobs(
                             storage.split(bucket)[0])])):
    target = f'{where}/config.json'
    storage.write_atomically(target, '{"a": 1}')
    storage.write_atomically(target, '{"a": 2}')
    assert epath.Path(target).read_text() == '{"a": 2}', where
    assert listing() == ['config.json'], where
