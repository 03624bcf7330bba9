r"""Input-pipeline throughput on this machine, on the embedded corpus (not a timed test).

  python benchmarks/bench_data.py [--repeat=4] [--seconds=3] [--workdir=/tmp/bench_data]
      [--prepared_url=gs://BUCKET/prepared]

Prints:
  * preparation: MB/s of raw text and tokens/s with all cores, for the corpus repeated
    ``--repeat`` times as (a) google-research/bert layout text (one sentence per line) and
    (b) JSONL running text (sentence splitting included, like tfds Wikipedia articles), with a
    SentencePiece unigram model (vocab 8000) trained once beforehand (its time is printed).
    Reference: google-research/bert create_pretraining_data.py does ~0.28 MB/s (~120k
    tokens/s) per pass on a machine like this; the goal is >= 10x that (2.8 MB/s).
  * loading: tokens/s of finished batches from one iterator (= one core, it is
    single-threaded) for NSP at 128 and 512 and FULL-SENTENCES at 512, global batch 256;
    "positions" counts every slot of the [B, L] batch, "real" only tokens under input_mask.
    Goal: >= 1M tokens/s per core. Also the iterator creation and state-restore latency.
  * with ``--prepared_url=gs://...``: the JSONL data prepared into the bucket, as a pod
    run's ``config.data.prepared_dir=gs://...`` does (``data.load_or_prepare``: one process
    prepares and uploads, every host copies it into its local cache and memory-maps it).
    Timed: the first read (an empty cache filled from the bucket) and a warm one (the
    cache's manifest checked against the bucket's), as tokens/s of the prepared data, and
    the loader's tokens/s on the cached copy against the local directory. Point
    ``STORAGE_EMULATOR_HOST`` at an emulator (``python -m encoder_jax.storage_emulator --bucket=B``)
    to measure without a Cloud project; the cache is ``<workdir>/cache``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from encoder_jax.config import schema as config_base  # pylint: disable=g-import-not-at-top,wrong-import-position
from encoder_jax import data as data_lib  # pylint: disable=wrong-import-position
from encoder_jax.data import tokenizer_training  # pylint: disable=wrong-import-position
from encoder_jax.data import sources  # pylint: disable=wrong-import-position

BERT_MB_PER_S = 0.28  # create_pretraining_data.py, one pass, measured on a 2-core VM.


def _config(workdir: str, spec: str, name: str, tokenizer_path: str = ''):
  c = config_base.base_config()
  c.model.vocab_size = 8000
  prepared_dir = name if name.startswith('gs://') else os.path.join(workdir, name)
  c.data.update(sources=spec, prepared_dir=prepared_dir, num_workers=0)
  c.tokenizer.path = tokenizer_path
  return c


def _write_inputs(workdir: str, repeat: int) -> tuple[str, str]:
  docs = data_lib.embedded_corpus()
  text, jsonl = os.path.join(workdir, 'corpus.txt'), os.path.join(workdir, 'corpus.jsonl')
  with open(text, 'w') as f:
    for r in range(repeat):
      for d in docs:
        f.write('\n'.join(d) + '\n\n')
  with open(jsonl, 'w') as f:
    for r in range(repeat):
      for d in docs:
        f.write(json.dumps({'text': ' '.join(d)}) + '\n')
  return text, jsonl


def bench_prepare(workdir: str, repeat: int) -> str:
  t = time.time()
  c = _config(workdir, 'embedded', 'tokenizer')
  model = os.path.join(workdir, 'tokenizer.model')
  if not os.path.exists(model):
    tokenizer_training.train_sentencepiece(c, sources.parse_sources(c.data), model)
  print(f'tokenizer: SentencePiece unigram, vocab 8000, trained in {time.time() - t:.1f} s '
        f'(once; not part of the figures below)')
  text, jsonl = _write_inputs(workdir, repeat)
  for label, spec in (('bert-layout text', f'text:{text}'), ('JSONL running text',
                                                              f'jsonl:{jsonl}')):
    c = _config(workdir, spec, 'prepared-' + label.split()[0].lower(), model)
    shutil.rmtree(c.data.prepared_dir, ignore_errors=True)
    t = time.time()
    m = data_lib.prepare(c)
    seconds = time.time() - t
    mb = sum(s['raw_bytes'] for s in m['sources']) / 1e6
    tokens = m['splits']['train']['tokens'] + m['splits']['held_out']['tokens']
    print(f'PREPARE {label:20s}: {mb:6.1f} MB, {tokens / 1e6:5.2f} M tokens in {seconds:5.1f} s'
          f' = {mb / seconds:5.2f} MB/s, {tokens / seconds / 1e3:6.0f} k tokens/s '
          f'({mb / seconds / BERT_MB_PER_S:4.1f}x google-research/bert), '
          f"{m['throughput']['workers']} workers")
  return os.path.join(workdir, 'prepared-jsonl')


def _jsonl_config(workdir: str, prepared_dir: str = 'prepared-jsonl'):
  return _config(workdir, f"jsonl:{os.path.join(workdir, 'corpus.jsonl')}", prepared_dir,
                 os.path.join(workdir, 'tokenizer.model'))


def _load_rate(c, prepared, kind: str, seq_len: int, seconds: float, label: str = 'LOAD'):
  """Prints the loader's positions/s and real tokens/s for one layout; returns real/s."""
  c.data.pair_kind = kind
  c.train.update(seq_lens=(seq_len,), max_predictions=(20,), phase_fractions=(1.0,),
                 batch_size=256)
  t = time.time()
  it = data_lib.make_train_iterator(c, prepared)
  created = time.time() - t
  next(it)  # First pool.
  positions = real = 0
  t = time.time()
  while time.time() - t < seconds:
    b = next(it)
    positions += b['input_ids'].size
    real += int(b['input_mask'].sum())
  dt = time.time() - t
  state = it.get_state()
  t = time.time()
  data_lib.make_train_iterator(c, prepared).set_state(state)
  restore = time.time() - t
  print(f'{label} {kind:14s} L={seq_len:3d}: {positions / dt / 1e6:5.2f} M positions/s, '
        f'{real / dt / 1e6:5.2f} M real tokens/s per core (fill {real / positions:4.0%}); '
        f'create {created * 1e3:4.0f} ms, restore {restore * 1e3:4.0f} ms')
  return real / dt


def bench_load(workdir: str, seconds: float):
  c = _jsonl_config(workdir)
  prepared = data_lib.load_or_prepare(c)
  for kind, seq_len in (('nsp', 128), ('nsp', 512), ('full_sentences', 128),
                        ('full_sentences', 512)):
    _load_rate(c, prepared, kind, seq_len, seconds)


def _timed_read(c, what: str):
  """``load_or_prepare`` of the bucket's data, timed; prints tokens/s and MB/s of it."""
  t = time.time()
  prepared = data_lib.load_or_prepare(c)
  seconds = time.time() - t
  splits = prepared.manifest['splits']
  tokens = splits['train']['tokens'] + splits['held_out']['tokens']
  mb = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in
           os.walk(prepared.directory) for f in files) / 1e6
  print(f'BUCKET {what:28s}: {mb:6.1f} MB, {tokens / 1e6:5.2f} M tokens in {seconds:6.2f} s = '
        f'{tokens / seconds / 1e6:7.2f} M tokens/s, {mb / seconds:7.1f} MB/s')
  return prepared


def bench_bucket(workdir: str, url: str, seconds: float):
  """The prepared JSONL data through a gs:// prepared_dir (the module docstring)."""
  from encoder_jax.storage import paths as storage  # pylint: disable=g-import-not-at-top
  from encoder_jax.data import prepare_once  # pylint: disable=g-import-not-at-top
  cache = os.path.join(workdir, 'cache')
  os.environ[prepare_once.CACHE_ENV] = cache
  c = _jsonl_config(workdir, url)
  endpoint = os.environ.get(storage.EMULATOR_HOST) or 'Cloud Storage'
  if not storage.exists(f'{url.rstrip("/")}/manifest.json'):
    shutil.rmtree(cache, ignore_errors=True)
    _timed_read(c, 'prepare, upload, copy')
  print(f'bucket data: {url} on {endpoint}')
  shutil.rmtree(cache, ignore_errors=True)
  from_bucket = _timed_read(c, 'first read (cache empty)')
  _timed_read(c, 'warm read (cache filled)')
  local = data_lib.load_or_prepare(_jsonl_config(workdir))
  for kind, seq_len in (('nsp', 128), ('full_sentences', 512)):
    _load_rate(c, local, kind, seq_len, seconds, 'LOAD local dir   ')
    _load_rate(c, from_bucket, kind, seq_len, seconds, 'LOAD bucket cache')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repeat', type=int, default=4, help='copies of the embedded corpus')
  parser.add_argument('--seconds', type=float, default=3.0, help='per loader measurement')
  parser.add_argument('--workdir', default='/tmp/bench_data')
  parser.add_argument('--prepared_url', default='',
                      help='gs://... : also time reads of prepared data from this bucket path')
  args = parser.parse_args()
  if args.prepared_url and not args.prepared_url.startswith('gs://'):
    parser.error(f'--prepared_url={args.prepared_url!r}; expected gs://BUCKET/PATH')
  os.makedirs(args.workdir, exist_ok=True)
  print(f'{os.cpu_count()} CPU cores; workdir {args.workdir}')
  bench_prepare(args.workdir, args.repeat)
  bench_load(args.workdir, args.seconds)
  if args.prepared_url:
    bench_bucket(args.workdir, args.prepared_url, args.seconds)


if __name__ == '__main__':
  main()
