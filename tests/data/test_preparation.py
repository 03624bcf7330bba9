"""Preparation: manifest, idempotency, changed-config detection, workers, tfds, held-out."""

import filecmp
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from encoder_jax import data as data_lib
from encoder_jax.storage import locks
from encoder_jax.data import preparation

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def test_manifest_and_shards(prepared_small, corpus_docs):
  c, prepared = prepared_small
  m = prepared.manifest
  train, held = m['splits']['train'], m['splits']['held_out']
  assert train['documents'] + held['documents'] == 400  # No document lost or duplicated.
  assert 0 < held['documents'] < 80  # held_out_fraction = 0.1, by hash.
  assert m['sources'][0]['documents_read'] == 400 and not m['skipped']
  assert train['sentences'] + held['sentences'] == sum(len(d) for d in corpus_docs[:400])
  for shard in train['shards']:
    tokens = np.load(os.path.join(prepared.directory, shard['name'] + '.tokens.npy'),
                     mmap_mode='r')
    assert tokens.dtype == np.uint16 and len(tokens) == shard['tokens']
  assert prepared.unigram_counts.shape == (c.model.vocab_size,)
  assert prepared.unigram_counts.sum() == train['tokens']
  assert prepared.unigram_counts[[0, 2, 3, 4]].sum() == 0  # Only [UNK] occurs in text.
  assert m['config_hash'] == preparation.config_hash(preparation.content_fields(c))
  assert m['tokenizer']['sha256'] == prepared.tokenizer.sha256()
  # A document decodes back to its text (case-folded by the tokenizer).
  split = prepared.split('train')
  tokens, bounds = split.document(0)
  first = prepared.tokenizer.decode(tokens[bounds[0]:bounds[1]])
  assert first in {d[0].lower() for d in corpus_docs[:400]}


def test_prepare_is_idempotent_and_detects_changes(prepared_small, monkeypatch):
  c, prepared = prepared_small

  def fail(*args, **kwargs):
    raise AssertionError('prepare must not run again for the same config')

  monkeypatch.setattr(preparation, 'prepare', fail)
  again = data_lib.load_or_prepare(c)
  assert again.manifest['created'] == prepared.manifest['created']
  # Fields that do not change the content (batch, pair kind, workers) reuse it too.
  c2 = c.copy_and_resolve_references()
  c2.data.update(pair_kind='sop', num_workers=2)
  c2.train.batch_size = 64
  assert data_lib.load_or_prepare(c2).directory == prepared.directory
  # A content field changed with the same prepared_dir: refused, naming the field.
  c3 = c.copy_and_resolve_references()
  c3.data.held_out_fraction = 0.2
  with pytest.raises(ValueError, match=r'different config.*data.held_out_fraction: '
                                       r'prepared 0.1 != config 0.2'):
    data_lib.load_or_prepare(c3)
  c4 = c.copy_and_resolve_references()
  c3.data.prepared_dir = c4.data.prepared_dir = ''
  assert preparation.prepared_directory(c3) != preparation.prepared_directory(c4)
  assert preparation.prepared_directory(c4).startswith(os.path.join('data', 'prepared'))


def test_changed_tokenizer_file_is_detected(tmp_path, make_config, sp_model_path):
  c = make_config(str(tmp_path / 'p'), sources='embedded;max_documents=20',
                  held_out_fraction=0.0)
  c.tokenizer.path = sp_model_path
  prepared = data_lib.load_or_prepare(c)
  with open(os.path.join(prepared.directory, 'tokenizer.model'), 'ab') as f:
    f.write(b'\0')
  with pytest.raises(ValueError, match='changed after preparation'):
    data_lib.load_or_prepare(c)


@pytest.mark.parametrize('start_method', ['fork', 'spawn'])  # spawn: when JAX is loaded.
def test_workers_give_identical_shards(tmp_path, make_config, sp_model_path, monkeypatch,
                                       start_method):
  monkeypatch.setattr(preparation, '_CHUNK_CHARS', 20_000)  # Many chunks from 120 docs.
  monkeypatch.setattr(preparation, '_start_method', lambda: start_method)
  dirs = []
  for workers in (1, 2):
    c = make_config(str(tmp_path / f'w{workers}'), sources='embedded;max_documents=120',
                    num_workers=workers, shard_max_tokens=5000)
    c.tokenizer.path = sp_model_path
    dirs.append(data_lib.load_or_prepare(c).directory)
  m = [data_lib.load_or_prepare(c).manifest]
  names = sorted(f for f in os.listdir(dirs[0]) if f.endswith('.npy'))
  assert len(names) > 6 and names == sorted(f for f in os.listdir(dirs[1])
                                            if f.endswith('.npy'))
  _, mismatch, errors = filecmp.cmpfiles(dirs[0], dirs[1], names, shallow=False)
  assert not mismatch and not errors
  assert m[0]['throughput']['workers'] == 2


def test_tfds_source_end_to_end(tmp_path, corpus_docs, make_config, sp_model_path):
  tfds = pytest.importorskip('tensorflow_datasets')

  class EmbeddedArticles(tfds.core.GeneratorBasedBuilder):
    """Wikipedia-like articles (paragraphs of running text) from the embedded corpus."""
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {'title': tfds.features.Text(), 'text': tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {'train': self._generate_examples(0, 30),
              'validation': self._generate_examples(30, 35)}

    def _generate_examples(self, lo, hi):
      for i in range(lo, hi):
        doc = corpus_docs[i]
        paragraphs = [' '.join(doc[j:j + 3]) for j in range(0, len(doc), 3)]
        yield i, {'title': f'doc {i}', 'text': '\n'.join(paragraphs)}

  data_dir = str(tmp_path / 'tfds')
  EmbeddedArticles(data_dir=data_dir).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  c = make_config(str(tmp_path / 'p'), sources='tfds:embedded_articles:train',
                  tfds_data_dir=data_dir, held_out_fraction=0.0)
  c.tokenizer.path = sp_model_path
  prepared = data_lib.load_or_prepare(c)
  train = prepared.manifest['splits']['train']
  assert train['documents'] == 30
  assert train['sentences'] >= 0.8 * sum(len(d) for d in corpus_docs[:30])
  assert prepared.manifest['sources'][0]['raw_bytes'] > 0.9 * sum(
      len(s.encode()) for d in corpus_docs[:30] for s in d)
  # Per-source data_dir option and split; the other split of the same dataset.
  c = make_config(str(tmp_path / 'p2'), held_out_fraction=0.0,
                  sources=f'tfds:embedded_articles:validation;data_dir={data_dir}')
  c.tokenizer.path = sp_model_path
  assert data_lib.load_or_prepare(c).manifest['splits']['train']['documents'] == 5
  # Clear errors: missing data_dir, dataset not in data_dir, unknown name.
  for spec, data_dir_setting, msg in [
      ('tfds:embedded_articles', str(tmp_path / 'nope'), 'does not exist'),
      ('tfds:embedded_articles', str(tmp_path), 'not prepared'),
      ('tfds:no_such_dataset_xyz', data_dir, 'cannot find dataset')]:
    c = make_config(str(tmp_path / 'p3'), sources=spec, tfds_data_dir=data_dir_setting)
    c.tokenizer.path = sp_model_path
    with pytest.raises(FileNotFoundError, match=msg):
      data_lib.load_or_prepare(c)


def test_unfinished_preparations_of_dead_or_reused_pids_are_removed(tmp_path):
  """A partial directory names its owner (pid and start time) as a lock file does: one
  whose pid is gone, or runs a process started at another time (a reused pid), is removed;
  a live owner's is kept."""
  directory = str(tmp_path / 'prepared')
  prefix = f'{directory}.partial-{socket.gethostname()}-'
  live = subprocess.Popen(['sleep', '60'])
  try:
    start = locks.process_start(live.pid)
    if start is None:
      pytest.skip('no /proc: a reused pid cannot be told from its first owner here')
    dead = subprocess.Popen(['true'])
    dead.wait()
    kept, reused = f'{prefix}{live.pid}-{start}', f'{prefix}{live.pid}-{start + 1}'
    gone, old_style = f'{prefix}{dead.pid}-{start}', f'{prefix}{dead.pid}'
    for path in (kept, reused, gone, old_style):
      os.makedirs(path)
    mine = preparation._partial_directory(directory)
    assert mine == f'{prefix}{os.getpid()}-{locks.process_start(os.getpid())}'
    assert os.path.isdir(kept) and os.path.isdir(mine)
    assert not any(os.path.exists(p) for p in (reused, gone, old_style))
  finally:
    live.kill()
    live.wait()


UNGUARDED = '''
import jax  # JAX's threads: the workers are spawned.
from encoder_jax import data
from encoder_jax.config import schema as config_base
from encoder_jax.data import preparation
preparation._CHUNK_CHARS = 20_000  # Several chunks: the pool starts.
c = config_base.base_config()
c.model.vocab_size = {vocab}
c.data.update(sources='embedded;max_documents=120', num_workers=2, prepared_dir={out!r})
c.tokenizer.path = {model!r}
print('PREPARED', data.load_or_prepare(c).manifest['throughput']['workers'])
'''


@pytest.mark.slow
def test_a_script_without_a_main_guard_prepares_with_spawned_workers(tmp_path, make_config,
                                                                     sp_model_path):
  """A script that prepares at its top level: the spawned workers do not run it again
  (they would wait for ever on the preparation lock their parent holds)."""
  script = tmp_path / 'unguarded.py'
  script.write_text(UNGUARDED.format(vocab=make_config().model.vocab_size,
                                     out=str(tmp_path / 'p'), model=sp_model_path))
  done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                        cwd=tmp_path, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'PREPARED 2' in done.stdout
