"""Word boundaries for every token position, from the text: what whole-word masking reads.

A vocabulary can say where a word starts only in scripts written with spaces (a ``▁``
prefix in SentencePiece, no ``##`` in WordPiece, a byte space in byte-level BPE). Chinese,
Japanese, Thai, Lao, Khmer, Myanmar and Tibetan are written without spaces between words,
so there the vocabulary marks one "word" per run of text up to the next space. Preparation
therefore segments each sentence that holds such a script with a real segmenter and
stores, per token, whether it starts a word (``.word_starts.npy`` beside the shard's
tokens); every masking scheme reads those flags on device.

The rule, per token of a sentence:
  * its anchor is the first character of its span that is not a space; a token whose span
    is empty or all spaces (a lone SentencePiece ``▁``) joins the token after it, and
    carries that token's flag;
  * an anchor in a segmented script (``SCRIPTS``; full-width and CJK punctuation go with
    the Han and kana segmenters) starts a word where the segmenter's word starts there;
  * any other anchor keeps the vocabulary's flag (so spaced text is stored exactly as the
    vocabulary marks it: English masks do not change).
A token whose span has a segmenter word start strictly inside (it crosses a word
boundary) keeps the word it starts in; the words it joins are counted
(``pieces_crossing_words``). A sentence whose token spans cannot be aligned with its text
(offsets missing or out of order) keeps the vocabulary's flags and is counted
(``sentences_not_aligned_with_words``); a script with no segmenter set
(``word_segmenter``) is counted under ``sentences_without_segmenter``.

``config.data.word_segmenter``: ``auto`` (every script with its default: Chinese rjieba,
else jieba; Japanese sudachipy, else fugashi; Thai pythainlp), ``none`` (no flags stored:
masking takes word starts from the vocabulary, as for spaced text), or overrides
``SCRIPT=NAME`` (comma-separated; ``chinese=chars`` makes every Han character a word, as
google-research/bert does for Chinese). A bare ``NAME`` sets it for its scripts.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import re
from typing import Callable

import numpy as np

from encoder_jax.core import extras


@dataclasses.dataclass(frozen=True)
class Script:
  name: str  # Its key in config.data.word_segmenter ('chinese=...').
  letters: str  # A regex character class body.
  defaults: tuple[str, ...]  # Segmenters tried in order by 'auto'.


# Japanese before Chinese: a sentence with kana is Japanese, its Han characters too.
SCRIPTS = (
    Script('japanese', '\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f', ('sudachipy', 'fugashi')),
    Script('chinese', '\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f',
           ('rjieba', 'jieba')),
    Script('thai', '\u0e00-\u0e7f', ('pythainlp',)),
    Script('lao', '\u0e80-\u0eff', ()),
    Script('khmer', '\u1780-\u17ff\u19e0-\u19ff', ()),
    Script('myanmar', '\u1000-\u109f', ()),
    Script('tibetan', '\u0f00-\u0fff', ()),
)
_BY_NAME = {s.name: s for s in SCRIPTS}
_HAN, _KANA = _BY_NAME['chinese'].letters, _BY_NAME['japanese'].letters
_CJK_PUNCTUATION = '\u3000-\u303f\uff00-\uff65\u2014\u2018\u2019\u201c\u201d\u2026'
_ANY = re.compile('[' + ''.join(s.letters for s in SCRIPTS) + ']')
_HAS = {s.name: re.compile(f'[{s.letters}]') for s in SCRIPTS}
# The characters each script's segmenter decides for (CJK punctuation with Han and kana).
_DECIDES = {s.name: re.compile(f'[{s.letters}]') for s in SCRIPTS}
_DECIDES['chinese'] = re.compile(f'[{_HAN}{_CJK_PUNCTUATION}]')
_DECIDES['japanese'] = re.compile(f'[{_KANA}{_HAN}{_CJK_PUNCTUATION}]')


def _ranges(pattern: re.Pattern) -> np.ndarray:
  """The [lo, hi] code point ranges of a one-class pattern ``[a-bc...]``, [R, 2]."""
  body, out, i = pattern.pattern[1:-1], [], 0
  while i < len(body):
    if i + 2 < len(body) and body[i + 1] == '-':
      out.append((ord(body[i]), ord(body[i + 2])))
      i += 3
    else:
      out.append((ord(body[i]), ord(body[i])))
      i += 1
  return np.array(out, np.int64)


_DECIDES_RANGES = {name: _ranges(p) for name, p in _DECIDES.items()}
# What str.isspace() calls a space, as code points.
_SPACES = np.array([c for c in range(0x3001) if chr(c).isspace()], np.int64)


@functools.cache
def _lut(name: str) -> np.ndarray:
  """bool [0x110000]: the code points a script's segmenter decides ('space': the spaces)."""
  table = np.zeros(0x110000, bool)
  if name == 'space':
    table[_SPACES] = True
    return table
  for lo, hi in _DECIDES_RANGES[name]:
    table[lo:hi + 1] = True
  return table


@dataclasses.dataclass(frozen=True)
class Segmenter:
  """A word segmenter: ``load() -> segment(text) -> [(start, stop)]`` character spans."""
  name: str
  scripts: tuple[str, ...]
  extra: str  # The extra that brings it ('' = nothing to install).
  distributions: tuple[str, ...]  # Whose versions identify it (in the manifest and hash).
  load: Callable[[], Callable[[str], list[tuple[int, int]]]]


def _scripts(text: str) -> list[str]:
  """The segmented scripts of ``text``'s letters (Han in a sentence with kana is Japanese)."""
  present = [s.name for s in SCRIPTS if _HAS[s.name].search(text)]
  if 'japanese' in present and 'chinese' in present:
    present.remove('chinese')
  return present


def _spans(words) -> list[tuple[int, int]]:
  """Spans of consecutive words that spell the text (jieba, pythainlp keep every char)."""
  out, pos = [], 0
  for w in words:
    out.append((pos, pos + len(w)))
    pos += len(w)
  return out


def _load_rjieba():
  rjieba = extras.require('rjieba', extra='chinese', what='Chinese word segmentation')
  return lambda text: [(s, e) for _, s, e in rjieba.tokenize(text)]


def _load_jieba():
  jieba = extras.require('jieba', extra='chinese', what='Chinese word segmentation')
  jieba.setLogLevel(60)  # Its dictionary-loading lines are not ours to print.
  return lambda text: _spans(jieba.cut(text))


def _load_chars():
  han = _DECIDES['chinese']
  return lambda text: [(i, i + 1) for i, ch in enumerate(text) if han.match(ch)]


def _load_sudachipy():
  dictionary = extras.require('sudachipy.dictionary', extra='japanese',
                              what='Japanese word segmentation')
  extras.require('sudachidict_core', extra='japanese', what='Japanese word segmentation')
  split = extras.require('sudachipy', extra='japanese',
                         what='Japanese word segmentation').SplitMode.C
  tokenizer = dictionary.Dictionary(dict='core').create(split)
  return lambda text: [(m.begin(), m.end()) for m in tokenizer.tokenize(text)]


def _load_fugashi():
  fugashi = extras.require('fugashi', extra='japanese', what='Japanese word segmentation')
  extras.require('unidic_lite', extra='japanese', what='Japanese word segmentation')
  tagger = fugashi.Tagger()

  def segment(text):
    out, pos = [], 0
    for word in tagger(text):
      start = text.find(word.surface, pos)
      if start < 0:
        return []  # Not aligned: the caller counts it.
      out.append((start, start + len(word.surface)))
      pos = start + len(word.surface)
    return out
  return segment


def _load_pythainlp():
  tokenize = extras.require('pythainlp.tokenize', extra='thai', what='Thai word segmentation')
  return lambda text: _spans(tokenize.word_tokenize(text, engine='newmm',
                                                    keep_whitespace=True))


SEGMENTERS: dict[str, Segmenter] = {s.name: s for s in (
    Segmenter('rjieba', ('chinese',), 'chinese', ('rjieba',), _load_rjieba),
    Segmenter('jieba', ('chinese',), 'chinese', ('jieba',), _load_jieba),
    Segmenter('chars', ('chinese',), '', (), _load_chars),
    Segmenter('sudachipy', ('japanese',), 'japanese', ('sudachipy', 'sudachidict-core'),
              _load_sudachipy),
    Segmenter('fugashi', ('japanese',), 'japanese', ('fugashi', 'unidic-lite'),
              _load_fugashi),
    Segmenter('pythainlp', ('thai',), 'thai', ('pythainlp',), _load_pythainlp),
)}
_IMPORT_NAME = {'sudachidict-core': 'sudachidict_core', 'unidic-lite': 'unidic_lite'}


def _installed(segmenter: Segmenter) -> bool:
  return all(importlib.util.find_spec(_IMPORT_NAME.get(d, d)) is not None
             for d in segmenter.distributions)


def _version(segmenter: Segmenter) -> str:
  if not segmenter.distributions:
    return segmenter.name
  return ' '.join(f'{d}=={importlib.metadata.version(d)}' for d in segmenter.distributions)


def parse(value: str) -> dict[str, str] | None:
  """``config.data.word_segmenter`` -> {script: segmenter name} overrides ('auto' = {}),
  or None for 'none'; errors name the field and what is valid."""
  value = str(value).strip()
  where = f'config.data.word_segmenter={value!r}'
  if value == 'none':
    return None
  if value in ('auto', ''):
    return {}
  out = {}
  for item in value.split(','):
    script, sep, name = (p.strip() for p in item.partition('='))
    if not sep:
      name = script
      if name not in SEGMENTERS:
        raise ValueError(f"{where}: {name!r} is not a segmenter; expected 'auto', 'none', one "
                         f'of {sorted(SEGMENTERS)} or SCRIPT=NAME')
      for s in SEGMENTERS[name].scripts:
        out[s] = name
      continue
    if script not in _BY_NAME:
      raise ValueError(f'{where}: unknown script {script!r}; expected one of '
                       f'{[s.name for s in SCRIPTS]}')
    if name not in SEGMENTERS or script not in SEGMENTERS[name].scripts:
      fits = [n for n, s in SEGMENTERS.items() if script in s.scripts]
      raise ValueError(f'{where}: {name!r} does not segment {script}; expected one of {fits}')
    out[script] = name
  return out


def _parses(value) -> bool:
  try:
    parse(value)
  except (ValueError, TypeError):
    return False
  return isinstance(value, str)


CHECK = (_parses, lambda: ("'auto', 'none', a segmenter of "
                           f'{sorted(SEGMENTERS)} or SCRIPT=SEGMENTER,... with a script of '
                           f'{[s.name for s in SCRIPTS]}'))


def resolve(value: str) -> dict[str, str] | None:
  """{script: 'segmenter distribution==version ...'} that preparation with ``value`` uses
  (what the manifest records and the config hash covers), or None for 'none'. A segmenter
  named explicitly must be installed (a one-line error names its extra); 'auto' takes the
  first installed default of each script and leaves out scripts with none installed (a
  sentence in one then stops preparation with the extra named: see ``Words``)."""
  chosen = parse(value)
  if chosen is None:
    return None
  out = {}
  for script in SCRIPTS:
    name = chosen.get(script.name)
    if name is not None:
      segmenter = SEGMENTERS[name]
      if segmenter.extra and not _installed(segmenter):
        missing = next(d for d in segmenter.distributions
                       if importlib.util.find_spec(_IMPORT_NAME.get(d, d)) is None)
        extras.require(_IMPORT_NAME.get(missing, missing), extra=segmenter.extra,
                       what=f'config.data.word_segmenter names {name} for {script.name}')
    else:
      name = next((n for n in script.defaults if _installed(SEGMENTERS[n])), None)
      if name is None:
        continue
    out[script.name] = f'{name} {_version(SEGMENTERS[name])}'.strip()
  return out


class Words:
  """Per-token word starts of tokenized sentences (see the module docstring); one per
  tokenization worker, segmenters loaded on first use. ``stats`` counts per script the
  sentences, tokens and words stored; ``report(reason, n)`` gets what was counted."""

  def __init__(self, value: str, resolved: dict[str, str], vocab_word_start=None):
    self.names = {s: v.split()[0] for s, v in resolved.items()}
    self.explicit = set(parse(value) or {})
    self.vocab = None if vocab_word_start is None else np.asarray(vocab_word_start, bool)
    self._loaded: dict[str, Callable] = {}

  def pretokenize(self, texts: list[str], delimiter: str) -> tuple[list[str], int]:
    """``texts`` with ``delimiter`` between the words of their segmented scripts (for a
    tokenizer trained not to learn pieces across words), and how many texts changed."""
    out, changed = [], 0
    for text in texts:
      cuts = set()
      if _ANY.search(text):
        for script in _scripts(text):
          segment = self._segment(script)
          if segment is not None:
            cuts.update(start for start, _ in segment(text) if start)
      if cuts:
        changed += 1
        text = ''.join(delimiter + ch if i in cuts else ch for i, ch in enumerate(text))
      out.append(text)
    return out, changed

  def _segment(self, script: str):
    name = self.names.get(script)
    if name is None:
      return None
    if name not in self._loaded:
      self._loaded[name] = SEGMENTERS[name].load()
    return self._loaded[name]

  def encode(self, texts: list[str], tokenizer, report) -> tuple[list, np.ndarray, dict]:
    """Token ids of ``texts`` (``tokenizer.encode_batch``'s), bool word starts of every token
    (flat, in order), and per-script counts {script: [sentences, tokens, words]}
    ('spaced' for sentences of no segmented script). Only sentences in a segmented script
    are tokenized with spans; ``report(reason, n)`` counts what fell back."""
    todo = [i for i, t in enumerate(texts) if _ANY.search(t)]
    ids: list = [None] * len(texts)
    scripts: dict[int, list[str]] = {}
    if todo:
      sub = [texts[i] for i in todo]
      sub_ids, spans = tokenizer.encode_batch_spans(sub)
      for i, tok_ids in zip(todo, sub_ids):
        ids[i] = list(tok_ids)
      for i in todo:
        scripts[i] = _scripts(texts[i])
    plain = [i for i in range(len(texts)) if ids[i] is None]
    for i, tok_ids in zip(plain, tokenizer.encode_batch([texts[i] for i in plain])
                          if plain else []):
      ids[i] = tok_ids
    lens = np.array([len(i) for i in ids], np.int64)
    flat = np.fromiter((t for seq in ids for t in seq), np.int64, count=int(lens.sum()))
    out = self.vocab[flat] if len(flat) else np.zeros(0, bool)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    if todo:
      todo_a = np.array(todo)
      # The flat positions of the segmented sentences' tokens, in order.
      where = np.repeat(offsets[todo_a] - np.concatenate([[0], np.cumsum(lens[todo_a])[:-1]]),
                        lens[todo_a]) + np.arange(int(lens[todo_a].sum()))
      out[where] = self._chunk(sub, [scripts[i] for i in todo], lens[todo_a], spans,
                               out[where], report)
    stats: dict[str, list[int]] = {}
    for i, n in enumerate(lens.tolist()):
      if not n:
        continue
      present = scripts.get(i)
      key = 'spaced' if not present else present[0] if len(present) == 1 else max(
          present, key=lambda s: len(_HAS[s].findall(texts[i])))
      entry = stats.setdefault(key, [0, 0, 0])
      entry[0] += 1
      entry[1] += n
      entry[2] += int(out[offsets[i]:offsets[i + 1]].sum())
    return ids, out, stats

  def _chunk(self, texts, scripts, lens, spans, vocab_flags, report) -> np.ndarray:
    """The flags of the tokens of ``texts`` (each in a segmented script; ``spans`` int
    [T, 2] relative to each text), computed over the chunk at once: the texts are joined by
    newlines (spaces: no anchor crosses them)."""
    ns = len(texts)
    sentence = np.repeat(np.arange(ns), lens)
    n_chars = np.array([len(t) for t in texts], np.int64)
    base = np.concatenate([[0], np.cumsum(n_chars + 1)])[:-1]
    flags = np.array(vocab_flags, bool)
    if not len(spans):
      return flags
    bad = (spans[:, 0] < 0) | (spans[:, 1] > n_chars[sentence]) | (spans[:, 0] > spans[:, 1])
    bad_sentence = np.bincount(sentence[bad], minlength=ns) > 0
    if len(spans) != len(flags):  # The tokenizer's spans do not match its ids.
      report('sentences_not_aligned_with_words', ns)
      return flags
    joined = '\n'.join(texts)
    cp = np.frombuffer(joined.encode('utf-32-le'), np.uint32)
    n = len(joined)
    idx = np.where(_lut('space')[cp], n, np.arange(n))
    after = np.append(np.minimum.accumulate(idx[::-1])[::-1], n)  # First non-space >= i.
    begin, end = spans[:, 0] + base[sentence], spans[:, 1] + base[sentence]
    anchor = after[begin]
    valid = anchor < end  # False: an empty or all-space span (a lone '▁').
    at = cp[np.minimum(anchor, n - 1)]
    decided = ~valid | bad_sentence[sentence]
    segmented = np.zeros(ns, bool)
    crossing = 0
    for script in SCRIPTS:
      has = np.array([script.name in s for s in scripts]) & ~bad_sentence
      if not has.any():
        continue
      segment = self._segment(script.name)
      if segment is None:
        if script.defaults and script.name not in self.explicit:  # 'auto': none installed.
          default = SEGMENTERS[script.defaults[0]]
          extras.require(_IMPORT_NAME.get(default.distributions[0], default.distributions[0]),
                         extra=default.extra, what=f'The corpus has {script.name} text, whose '
                         'words need a segmenter (config.data.word_segmenter)')
        report(f'sentences_without_segmenter:{script.name}', int(has.sum()))
        continue
      starts, word_starts = np.zeros(n + 1, bool), []
      for i in np.flatnonzero(has).tolist():
        words = segment(texts[i])
        if not words:
          has[i] = False
          report('sentences_not_aligned_with_words', 1)
          continue
        b = int(base[i])
        word_starts.extend(w[0] + b for w in words)
      starts[np.array(word_starts, np.int64)] = True
      starts[:n] &= ~_lut('space')[cp]  # A word of spaces starts nothing.
      mine = ~decided & has[sentence] & _lut(script.name)[at]
      flags[mine] = starts[anchor[mine]]
      before = np.concatenate([[0], np.cumsum(starts)])  # Word starts in [0, p).
      crossing += int((before[end[mine]] - before[anchor[mine] + 1]).sum())
      decided |= mine
      segmented |= has
    # A lone '▁' (its own word start) takes the token after it into its word.
    lone = ~valid & flags & segmented[sentence]
    follows = lone[:-1] & valid[1:] & (sentence[:-1] == sentence[1:])
    flags[1:][follows] = False
    if crossing:
      report('pieces_crossing_words', crossing)
    return flags
