"""The files of the tokenizer kinds: their fixed pieces and ids, reading and checking them,
building RoBERTa's byte-level BPE, and where the specials go around texts (``Template``).

Below ``tokenizer`` (the one ``Tokenizer`` interface) and ``tokenizer_training``; imports no
other module of encoder_jax.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

SPECIAL_PIECES = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
SENTENCEPIECE_IDS = {'[PAD]': 0, '[UNK]': 1, '[CLS]': 2, '[SEP]': 3, '[MASK]': 4}
ROBERTA_PIECES = ('<pad>', '<unk>', '<s>', '</s>', '<mask>')  # In role order, as above.
# Fixed ids of a byte-level BPE vocabulary (RoBERTa's); <mask> is the last id instead.
BYTELEVEL_BPE_IDS = {'<s>': 0, '<pad>': 1, '</s>': 2, '<unk>': 3}
BYTELEVEL_BPE_MASK = '<mask>'
ROLES = ('pad', 'unk', 'cls', 'sep', 'mask')
# The pieces that can play each role (in ROLES order), per kind; the first present wins.
# BERT-named vocabularies accept <pad>/<unk> for [PAD]/[UNK], as in ALBERT's released models.
_BERT_ROLES = (('[PAD]', '<pad>'), ('[UNK]', '<unk>'), ('[CLS]',), ('[SEP]',), ('[MASK]',))
ROLE_PIECES = {
    'sentencepiece': _BERT_ROLES,
    'wordpiece': _BERT_ROLES,
    'bytelevel_bpe': tuple((p,) for p in ROBERTA_PIECES),
}
HF_KIND = 'hf'  # A Hugging Face tokenizer.json with its roles and layout (see the docstring).
HF_FORMAT = 'encoder_jax.hf_tokenizer/1'  # The ``format`` of an hf kind's file.
BERT_ALIASES = {names[0]: names for names in _BERT_ROLES}
BYTE_SPACE = '\u0120'  # 'Ġ': the space byte in GPT-2's byte alphabet.


def file_sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


def byte_alphabet() -> list[str]:
  """The 256 one-character pieces that spell every byte (GPT-2's printable byte mapping)."""
  from tokenizers import pre_tokenizers  # pylint: disable=g-import-not-at-top
  return pre_tokenizers.ByteLevel.alphabet()


def bpe_merges(spec: dict) -> list[tuple[str, str]]:
  """The merges of a BPE ``tokenizer.json`` dict, as pairs (files store "a b" or [a, b])."""
  return [tuple(m) if isinstance(m, (list, tuple)) else tuple(m.split(' ', 1))
          for m in spec['model']['merges']]


def check_bytelevel_bpe(spec: dict, path: str) -> None:
  """Raises unless ``spec`` (a parsed tokenizer.json) tokenizes as RoBERTa's byte-level BPE.

  Checked: a plain BPE model (no dropout, no subword prefix/suffix, no byte fallback), no
  normalizer, the ByteLevel pre-tokenizer with GPT-2's regex and ``add_prefix_space=False``,
  the ByteLevel decoder, and no added tokens besides the five special pieces (HF would match
  those in the text). The post-processor is not checked: ``encode`` adds no specials, and the
  HF export writes RoBERTa's.
  """
  def fail(what):
    raise ValueError(f'{path!r}: {what}; encoder_jax\'s bytelevel_bpe kind needs RoBERTa\'s '
                     'byte-level BPE tokenizer.json (BPE model, ByteLevel pre-tokenizer with '
                     'add_prefix_space=false, ByteLevel decoder, no normalizer).')

  model = spec.get('model') or {}
  if model.get('type') != 'BPE':
    fail(f'tokenizer model type {model.get("type")!r}, not \'BPE\'')
  for key in ('dropout', 'continuing_subword_prefix', 'end_of_word_suffix', 'byte_fallback'):
    if model.get(key):
      fail(f'BPE {key}={model[key]!r}')
  if spec.get('normalizer'):
    fail(f'normalizer {spec["normalizer"].get("type")!r}')
  pre = spec.get('pre_tokenizer') or {}
  if (pre.get('type') != 'ByteLevel' or pre.get('add_prefix_space', True)
      or not pre.get('use_regex', True)):
    fail(f'pre_tokenizer {pre!r}')
  if (spec.get('decoder') or {}).get('type') != 'ByteLevel':
    fail(f'decoder {spec.get("decoder")!r}')
  extra = [t.get('content') for t in spec.get('added_tokens') or []
           if t.get('content') not in ROBERTA_PIECES or not t.get('special')]
  if extra:
    fail(f'added tokens {extra[:5]} besides the special pieces {list(ROBERTA_PIECES)}')


def build_bytelevel_bpe(vocab: dict[str, int], merges: list[tuple[str, str]]):
  """RoBERTa's byte-level BPE ``tokenizers.Tokenizer`` over ``vocab`` (specials included).

  The one definition of the file layout, shared by training and HF import: ByteLevel
  pre-tokenizer (``add_prefix_space=False``) and decoder, RoBERTa's post-processor
  (``<s> A </s>`` and ``<s> A </s></s> B </s>``), and the five special pieces as special
  added tokens (``<mask>`` with ``lstrip``, as roberta-base, so "a <mask>" works in HF).
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top,g-multiple-import
  hf = tokenizers.Tokenizer(models.BPE(dict(vocab), [tuple(m) for m in merges], dropout=None,
                                       unk_token=None, fuse_unk=False, byte_fallback=False))
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                              use_regex=True)
  hf.decoder = decoders.ByteLevel()
  hf.add_special_tokens([
      tokenizers.AddedToken(p, special=True, normalized=False,
                            lstrip=p == BYTELEVEL_BPE_MASK)
      for p in sorted(ROBERTA_PIECES, key=lambda p: vocab.get(p, len(vocab)))])
  cls_piece, sep_piece = ROBERTA_PIECES[2], ROBERTA_PIECES[3]
  hf.post_processor = processors.RobertaProcessing(
      (sep_piece, hf.token_to_id(sep_piece)), (cls_piece, hf.token_to_id(cls_piece)),
      trim_offsets=True, add_prefix_space=False)
  return hf


@dataclasses.dataclass(frozen=True)
class Template:
  """Where the specials go around one text (``single``) or two (``pair``).

  Items are ``('A', type_id)`` / ``('B', type_id)`` for the texts' ids and
  ``(token_id, type_id)`` for a special token, in order; the type ids are the segment ids.
  """
  single: tuple[tuple[str | int, int], ...]
  pair: tuple[tuple[str | int, int], ...]

  @classmethod
  def bert(cls, cls_id: int, sep_id: int) -> 'Template':
    """``[CLS] A [SEP]`` and ``[CLS] A [SEP] B [SEP]`` (segments 0 then 1)."""
    return cls(((cls_id, 0), ('A', 0), (sep_id, 0)),
               ((cls_id, 0), ('A', 0), (sep_id, 0), ('B', 1), (sep_id, 1)))

  @classmethod
  def roberta(cls, cls_id: int, sep_id: int) -> 'Template':
    """``<s> A </s>`` and ``<s> A </s></s> B </s>`` (one segment)."""
    return cls(((cls_id, 0), ('A', 0), (sep_id, 0)),
               ((cls_id, 0), ('A', 0), (sep_id, 0), (sep_id, 0), ('B', 0), (sep_id, 0)))

  def num_added(self, pair: bool = False) -> int:
    return sum(not isinstance(t, str) for t, _ in (self.pair if pair else self.single))

  def frame(self, a, b=None) -> tuple[list[int], list[int]]:
    """(ids, segment ids) of ``a`` (and ``b``) with the specials in place."""
    ids, types = [], []
    for item, type_id in (self.single if b is None else self.pair):
      part = a if item == 'A' else b if item == 'B' else [item]
      ids.extend(int(i) for i in part)
      types.extend([type_id] * len(part))
    return ids, types

  def to_json(self) -> dict:
    return {'single': [list(t) for t in self.single], 'pair': [list(t) for t in self.pair]}

  @classmethod
  def from_json(cls, d: dict) -> 'Template':
    return cls(tuple((t, int(k)) for t, k in d['single']),
               tuple((t, int(k)) for t, k in d['pair']))


def word_start_scheme(spec: dict) -> tuple[str, str]:
  """How a ``tokenizer.json`` marks word starts: ('prefix', '▁') for Metaspace
  (SentencePiece), ('prefix', 'Ġ') for ByteLevel, ('not_prefix', '##') for WordPiece
  continuations, else ('all', '') (every piece starts a word)."""
  def walk(node):
    if not node:
      return
    yield node
    for key in ('pretokenizers', 'decoders'):
      for child in node.get(key) or ():
        yield from walk(child)
  model = spec.get('model') or {}
  if model.get('type') == 'WordPiece':
    return 'not_prefix', model.get('continuing_subword_prefix') or '##'
  for node in (*walk(spec.get('pre_tokenizer')), *walk(spec.get('decoder'))):
    if node.get('type') == 'Metaspace':
      return 'prefix', node.get('replacement') or '\u2581'
    if node.get('type') == 'ByteLevel':
      return 'prefix', BYTE_SPACE
  if model.get('continuing_subword_prefix'):
    return 'not_prefix', model['continuing_subword_prefix']
  return 'all', ''


def read_tokenizer_json(path: str, what: str, expected: str):
  """The JSON of a tokenizer file; a clear error when it is missing or not JSON."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{what} {path!r} does not exist.')
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise ValueError(f'{path!r} is not {expected}: {e}') from e
