"""A simple, fast rule-based sentence splitter for raw text (tfds articles, JSONL, docstrings).

Rules, in order:
  * Newlines separate paragraphs; a sentence never spans two lines of the input text.
  * Inside a paragraph, a sentence ends after ``.``, ``!``, ``?`` or ``…`` (plus any closing
    quotes/brackets) when whitespace follows and the next character is an upper-case letter,
    a digit or an opening quote/bracket; after CJK full stops (``。！？``) always.
  * Not after a known abbreviation (``e.g.``, ``Mr.``, ``No.``, ...), a single letter
    (initials such as ``J. Smith``) or a number followed by ``.`` inside a list of numbers.
  * A "sentence" longer than ``max_chars`` characters (tables, code, unpunctuated text) is cut
    at whitespace into pieces of at most ``max_chars``; the number of cuts is reported.

This is not a linguistic parser (Punkt, spaCy); it is much faster, deterministic and has no
data files, and the pretraining recipes only need approximate sentence boundaries (NSP pairs
and packing work on "sentences" that are any contiguous span of text).
"""

from __future__ import annotations

import re

_ABBREVIATIONS = frozenset("""
    mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf al fig figs eq eqs no nos vol vols
    ed eds p pp ch sec approx dept est inc ltd co corp jan feb mar apr jun jul aug sep sept
    oct nov dec gen gov col lt sgt capt rev hon u.s u.k a.m p.m ca viz resp
""".split())

# Candidate boundary: terminal punctuation, optional closers, whitespace, then a plausible
# sentence start. The lookahead keeps the next sentence's first character.
_BOUNDARY = re.compile(r"""([.!?…]+["'”’»)\]]*)\s+(?=["'“‘«(\[]?[A-Z0-9À-ÖØ-ÞА-ЯΑ-Ω])""")
_CJK_BOUNDARY = re.compile(r'([。！？]+[」』”’)）]*)')
_LAST_WORD = re.compile(r'(\S+)$')
_WHITESPACE = re.compile(r'\s+')


def _is_abbreviation(prefix: str) -> bool:
  m = _LAST_WORD.search(prefix)
  if not m:
    return False
  word = m.group(1).lstrip('("\'“‘[').rstrip('.').lower()
  return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def _cut_long(sentence: str, max_chars: int) -> list[str]:
  out = []
  while len(sentence) > max_chars:
    cut = sentence.rfind(' ', 0, max_chars + 1)
    if cut <= 0:
      cut = max_chars
    out.append(sentence[:cut].strip())
    sentence = sentence[cut:].strip()
  if sentence:
    out.append(sentence)
  return [s for s in out if s]


def split_paragraph(text: str, max_chars: int) -> tuple[list[str], int]:
  """Sentences of one paragraph (whitespace normalised) and the number of long cuts."""
  text = _WHITESPACE.sub(' ', text).strip()
  if not text:
    return [], 0
  pieces = []
  start = 0
  for m in _BOUNDARY.finditer(text):
    end = m.end(1)
    if m.group(1)[-1] == '.' and len(m.group(1)) == 1 and _is_abbreviation(text[start:end]):
      continue
    pieces.append(text[start:end])
    start = m.end()
  pieces.append(text[start:])
  if any(c in text for c in '。！？'):
    pieces = [p for piece in pieces for p in _CJK_BOUNDARY.split(piece)]
    merged = []
    for p in pieces:  # re.split keeps the delimiters as separate items: re-attach them.
      if merged and _CJK_BOUNDARY.fullmatch(p):
        merged[-1] += p
      else:
        merged.append(p)
    pieces = merged
  out, cuts = [], 0
  for p in pieces:
    p = p.strip()
    if not p:
      continue
    if len(p) > max_chars:
      parts = _cut_long(p, max_chars)
      cuts += len(parts) - 1
      out.extend(parts)
    else:
      out.append(p)
  return out, cuts


def split_text(text: str, max_chars: int) -> tuple[list[str], int]:
  """Sentences of a raw document: lines are paragraphs, each split by ``split_paragraph``."""
  out, cuts = [], 0
  for line in text.split('\n'):
    sentences, c = split_paragraph(line, max_chars)
    out.extend(sentences)
    cuts += c
  return out, cuts


def document_sentences(lines, lines_are_sentences: bool, max_chars: int
                       ) -> tuple[list[str], int]:
  """Sentences of a raw document and the number of cuts of over-long ones.

  ``lines_are_sentences``: each line already is a sentence (bert layout, embedded corpus) and
  is only cut when longer than ``max_chars``; otherwise each line is a paragraph to split.
  """
  out, cuts = [], 0
  for line in lines:
    if lines_are_sentences and len(line) <= max_chars:
      out.append(line)
      continue
    parts, c = split_paragraph(line, max_chars) if lines_are_sentences else split_text(
        line, max_chars)
    out.extend(parts)
    cuts += c
  return out, cuts
