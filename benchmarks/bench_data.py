r"""Input-pipeline throughput on this machine, on the embedded corpus (not a timed test).

  python benchmarks/bench_data.py [--repeat=4] [--seconds=3] [--workdir=/tmp/bench_data]

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
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from encoder_jax import config_base  # pylint: disable=g-import-not-at-top,wrong-import-position
from encoder_jax import data as data_lib  # pylint: disable=wrong-import-position
from encoder_jax.data import tokenizer_training  # pylint: disable=wrong-import-position
from encoder_jax.data import sources  # pylint: disable=wrong-import-position

BERT_MB_PER_S = 0.28  # create_pretraining_data.py, one pass, measured on a 2-core VM.


def _config(workdir: str, spec: str, name: str, tokenizer_path: str = ''):
  c = config_base.base_config()
  c.model.vocab_size = 8000
  c.data.update(sources=spec, prepared_dir=os.path.join(workdir, name), num_workers=0)
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


def bench_load(workdir: str, seconds: float):
  c = _config(workdir, f"jsonl:{os.path.join(workdir, 'corpus.jsonl')}", 'prepared-jsonl',
              os.path.join(workdir, 'tokenizer.model'))
  prepared = data_lib.load_or_prepare(c)
  for kind, seq_len in (('nsp', 128), ('nsp', 512), ('full_sentences', 128),
                        ('full_sentences', 512)):
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
    print(f'LOAD {kind:14s} L={seq_len:3d}: {positions / dt / 1e6:5.2f} M positions/s, '
          f'{real / dt / 1e6:5.2f} M real tokens/s per core (fill {real / positions:4.0%}); '
          f'create {created * 1e3:4.0f} ms, restore {restore * 1e3:4.0f} ms')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repeat', type=int, default=4, help='copies of the embedded corpus')
  parser.add_argument('--seconds', type=float, default=3.0, help='per loader measurement')
  parser.add_argument('--workdir', default='/tmp/bench_data')
  args = parser.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  print(f'{os.cpu_count()} CPU cores; workdir {args.workdir}')
  bench_prepare(args.workdir, args.repeat)
  bench_load(args.workdir, args.seconds)


if __name__ == '__main__':
  main()
