"""Data on a bucket: ``text:gs://...`` and ``jsonl:gs://...`` sources prepare the same data
as the same files on a local disk (gcsfs: glob, ranged reads, gzip), and so does a tfds
dataset with ``data_dir=gs://...``; a ``gs://`` prepared directory is prepared once for all
hosts and copied to each."""

import gzip
import json
import os
import subprocess
import sys

import pytest

from encoder_jax.config import schema as config_base
from encoder_jax import data as data_lib
from encoder_jax.storage import paths as storage
from encoder_jax.storage import client as storage_client
from encoder_jax.data import embedded
from encoder_jax.data import prepare_once
from encoder_jax.data import sources

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def _config(prepared_dir: str, sources: str):
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  c.model.vocab_size = 400
  c.data.update(sources=sources, prepared_dir=prepared_dir, num_workers=1,
                held_out_fraction=0.1)
  c.tokenizer.train_sentences = 5_000
  return c


def _files(directory: str) -> dict[str, bytes]:
  out = {}
  for root, _, names in os.walk(directory):
    for name in names:
      if name.endswith(('.npy', '.bin', '.model', '.idx')):
        with open(os.path.join(root, name), 'rb') as f:
          out[os.path.relpath(os.path.join(root, name), directory)] = f.read()
  return out


def test_text_and_jsonl_globs_on_a_bucket_prepare_what_local_files_do(bucket, tmp_path):
  docs = embedded.embedded_corpus()[:120]
  files = {
      'a.txt': ('\n\n'.join('\n'.join(d) for d in docs[:60]) + '\n').encode(),
      'b.txt.gz': gzip.compress(('\n\n'.join('\n'.join(d) for d in docs[60:]) + '\n').encode()),
      'c.jsonl': ''.join(json.dumps({'text': '\n'.join(d)}) + '\n' for d in docs[:40]).encode(),
  }
  local = tmp_path / 'corpus'
  local.mkdir()
  client = storage_client.client()
  for name, data in files.items():
    (local / name).write_bytes(data)
    bucket_name, prefix = storage.split(f'{bucket}/corpus/{name}')
    client.bucket(bucket_name).blob(prefix).upload_from_string(data)
  assert storage.glob(f'{bucket}/corpus/*.txt*') == [f'{bucket}/corpus/a.txt',
                                                     f'{bucket}/corpus/b.txt.gz']
  prepared = {}
  for where, root in (('local', str(local)), ('bucket', f'{bucket}/corpus')):
    c = _config(str(tmp_path / where), f'text:{root}/*.txt*,jsonl:{root}/*.jsonl')
    if 'local' in prepared:  # The same tokenizer: its training samples by path.
      c.tokenizer.path = os.path.join(prepared['local'].directory, 'tokenizer.model')
    prepared[where] = data_lib.load_or_prepare(c)
  local_files = _files(prepared['local'].directory)
  assert len(local_files) > 2 and _files(prepared['bucket'].directory) == local_files


_HOST = '''
import importlib.util, sys
spec = importlib.util.spec_from_file_location('preparation_on_a_bucket', sys.argv[2])
this = importlib.util.module_from_spec(spec)
spec.loader.exec_module(this)
from encoder_jax import data as data_lib
config = this._config(sys.argv[1], 'embedded;max_documents=150')
prepared = data_lib.load_or_prepare(config)
print('directory', prepared.directory, flush=True)
'''


@pytest.mark.slow
def test_hosts_prepare_once_through_the_bucket_and_each_reads_its_copy(bucket, tmp_path):
  """Three processes, each a host with its own disk (cache), ask for the same gs://
  prepared_dir at once: one prepares and uploads, every host copies it and loads it."""
  url = f'{bucket}/prepared'
  hosts = [subprocess.Popen(
      [sys.executable, '-c', _HOST, url, os.path.abspath(__file__)],
      env=dict(os.environ, **{prepare_once.CACHE_ENV: str(tmp_path / f'host{i}')}),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
  outputs = [h.communicate(timeout=300) for h in hosts]
  assert all(h.returncode == 0 for h in hosts), [err[-3000:] for _, err in outputs]
  assert sum(out.count('Prepared ') for out, _ in outputs) == 1, [o for o, _ in outputs]
  directories = [out.split('directory ')[1].split()[0] for out, _ in outputs]
  assert sorted(os.path.dirname(d) for d in directories) == [
      str(tmp_path / f'host{i}') for i in range(3)]
  copies = [_files(d) for d in directories]
  assert len(copies[0]) > 2 and copies[0] == copies[1] == copies[2]
  objects = {b.name.split('/', 1)[1] for b in storage_client.client().list_blobs(
      storage.split(url)[0], prefix='prepared/')}
  assert 'manifest.json' in objects and set(copies[0]) <= objects
  assert not storage.exists(prepare_once.lock_path(url))  # Released.


def test_a_tfds_dataset_on_a_bucket_prepares_what_its_local_data_dir_does(bucket, tmp_path,
                                                                         monkeypatch):
  """A tiny tfds dataset built here, copied to the bucket, read with data_dir=gs://...: the
  prepared token ids equal those from the local data_dir (the dataset's directory is copied
  to the local cache once, and again only when the bucket's copy changes)."""
  tfds = pytest.importorskip('tensorflow_datasets')
  docs = embedded.embedded_corpus()[:40]

  class BucketArticles(tfds.core.GeneratorBasedBuilder):  # pylint: disable=unused-variable
    """Articles of running text from the embedded corpus."""
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {'text': tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {'train': self._generate_examples()}

    def _generate_examples(self):
      for i, doc in enumerate(docs):
        yield i, {'text': ' '.join(doc)}

  local = str(tmp_path / 'tfds')
  BucketArticles(data_dir=local).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  storage.upload_tree(local, f'{bucket}/tfds')
  monkeypatch.setenv(prepare_once.CACHE_ENV, str(tmp_path / 'cache'))
  prepared = {}
  for where, data_dir in (('local', local), ('bucket', f'{bucket}/tfds')):
    c = _config(str(tmp_path / where), 'tfds:bucket_articles:train')
    c.data.tfds_data_dir = data_dir
    if 'local' in prepared:  # The same tokenizer.
      c.tokenizer.path = os.path.join(prepared['local'].directory, 'tokenizer.model')
    prepared[where] = data_lib.load_or_prepare(c)
  local_files = _files(prepared['local'].directory)
  assert len(local_files) > 2 and _files(prepared['bucket'].directory) == local_files
  splits = prepared['bucket'].manifest['splits']
  assert splits['train']['documents'] + splits['held_out']['documents'] == len(docs)
  copy = sources.tfds_local_data_dir(f'{bucket}/tfds', 'bucket_articles')
  info = os.path.join(copy, 'bucket_articles', '1.0.0', 'dataset_info.json')
  assert copy.startswith(str(tmp_path / 'cache')) and os.path.isfile(info)
  os.remove(info)  # Kept while the bucket's objects are the ones copied; copied again after.
  assert sources.tfds_local_data_dir(f'{bucket}/tfds', 'bucket_articles') == copy
  assert not os.path.exists(info)
  storage.upload_tree(local, f'{bucket}/tfds', overwrite=True)
  assert sources.tfds_local_data_dir(f'{bucket}/tfds', 'bucket_articles') == copy
  assert os.path.isfile(info)
  with pytest.raises(FileNotFoundError, match=r'gs://.*/tfds/no_such_dataset does not exist'):
    sources.tfds_local_data_dir(f'{bucket}/tfds', 'no_such_dataset')
