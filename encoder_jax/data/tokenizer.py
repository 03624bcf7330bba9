"""One ``Tokenizer`` interface over SentencePiece models and WordPiece ``vocab.txt`` files.

SentencePiece models (trained by ``tokenizer_training`` or loaded) must have the fixed ids
``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4`` (``<pad>``/``<unk>`` are accepted for 0/1, as in
ALBERT's released models). WordPiece vocabularies (HF BERT checkpoints) keep their own ids,
e.g. ``[PAD]=0 [UNK]=100 [CLS]=101 [SEP]=102 [MASK]=103``, and are run by the HF
``tokenizers`` BertWordPiece implementation (BERT's basic + wordpiece tokenizer).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

SPECIAL_PIECES = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
SENTENCEPIECE_IDS = {'[PAD]': 0, '[UNK]': 1, '[CLS]': 2, '[SEP]': 3, '[MASK]': 4}
_ALIASES = {'[PAD]': ('[PAD]', '<pad>'), '[UNK]': ('[UNK]', '<unk>')}


def file_sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


class Tokenizer:
  """Text <-> ids, the special ids, and per-piece tables for masking.

  Attributes:
    kind: 'sentencepiece' or 'wordpiece'.
    path: the model file (.model or vocab.txt).
    vocab_size, pad_id, unk_id, cls_id, sep_id, mask_id: ints.
    special_ids: int32 ids never to mask ([PAD], [UNK], [CLS], [SEP], [MASK] and any other
      control piece such as WordPiece's ``[unused*]``).
    is_word_start: bool [vocab_size], True where the piece starts a word (SentencePiece
      '▁' prefix; WordPiece: no '##'); special pieces are False.
  """

  def __init__(self, kind: str, path: str, backend, pieces: list[str],
               special_ids: np.ndarray, is_word_start: np.ndarray, lowercase: bool):
    self.kind = kind
    self.path = path
    self.lowercase = lowercase
    self._backend = backend
    self._pieces = pieces
    self._piece_ids = {p: i for i, p in enumerate(pieces)}
    self.vocab_size = len(pieces)
    ids = {}
    for name in SPECIAL_PIECES:
      ids[name] = next((self._piece_ids[a] for a in _ALIASES.get(name, (name,))
                        if a in self._piece_ids), None)
      if ids[name] is None:
        raise ValueError(f'Tokenizer {path!r} has no {name} piece; a {kind} tokenizer for '
                         f'encoder_jax needs all of {list(SPECIAL_PIECES)}.')
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        ids[n] for n in SPECIAL_PIECES)
    self.special_ids = np.asarray(special_ids, np.int32)
    self.is_word_start = np.asarray(is_word_start, np.bool_)

  # ---- constructors ----

  @classmethod
  def from_file(cls, kind: str, path: str, lowercase: bool = True) -> 'Tokenizer':
    """A tokenizer file of ``kind``: 'sentencepiece' (.model) or 'wordpiece' (vocab.txt)."""
    if kind == 'wordpiece':
      return cls.from_wordpiece_vocab(path, lowercase=lowercase)
    if kind == 'sentencepiece':
      return cls.from_sentencepiece(path)
    raise ValueError(f"tokenizer kind {kind!r} for {path!r}; expected 'sentencepiece' or "
                     "'wordpiece'")

  @classmethod
  def from_sentencepiece(cls, path: str) -> 'Tokenizer':
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(path):
      raise FileNotFoundError(f'SentencePiece model {path!r} does not exist.')
    sp = spm.SentencePieceProcessor()
    try:
      sp.Load(path)
    except (OSError, RuntimeError) as e:
      raise ValueError(f'{path!r} is not a SentencePiece model: {e}') from e
    n = sp.GetPieceSize()
    pieces = [sp.IdToPiece(i) for i in range(n)]
    for name, want in SENTENCEPIECE_IDS.items():
      got = pieces[want] if want < n else None
      if got not in _ALIASES.get(name, (name,)):
        raise ValueError(
            f'SentencePiece model {path!r}: id {want} must be {name} but is {got!r}; '
            f'encoder_jax needs {SENTENCEPIECE_IDS}. Train it with prepare (leave '
            'config.tokenizer.path empty) or with these control symbols.')
    special = [i for i in range(n) if sp.IsControl(i) or sp.IsUnknown(i) or sp.IsUnused(i)]
    special = sorted(set(special) | set(SENTENCEPIECE_IDS.values()))
    word_start = np.array([p.startswith('\u2581') for p in pieces], np.bool_)
    word_start[special] = False
    return cls('sentencepiece', path, sp, pieces, np.array(special), word_start,
               lowercase=False)

  @classmethod
  def from_wordpiece_vocab(cls, path: str, lowercase: bool = True) -> 'Tokenizer':
    from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(path):
      raise FileNotFoundError(f'WordPiece vocabulary {path!r} does not exist.')
    with open(path, encoding='utf-8') as f:
      pieces = [line.rstrip('\n') for line in f]
    if not pieces:
      raise ValueError(f'WordPiece vocabulary {path!r} is empty.')
    if len(set(pieces)) != len(pieces):
      raise ValueError(f'WordPiece vocabulary {path!r} has duplicate lines.')
    missing = [p for p in SPECIAL_PIECES if p not in set(pieces)]
    if missing:
      raise ValueError(f'WordPiece vocabulary {path!r} has no {" ".join(missing)} piece(s); '
                       f'encoder_jax needs all of {list(SPECIAL_PIECES)}.')
    backend = BertWordPieceTokenizer(path, lowercase=lowercase, clean_text=True,
                                     handle_chinese_chars=True, strip_accents=None)
    special = [i for i, p in enumerate(pieces)
               if len(p) > 2 and p.startswith('[') and p.endswith(']')]
    word_start = np.array([not p.startswith('##') for p in pieces], np.bool_)
    word_start[special] = False
    return cls('wordpiece', path, backend, pieces, np.array(special), word_start,
               lowercase=lowercase)

  # ---- text <-> ids ----

  def encode(self, text: str) -> list[int]:
    """Ids of ``text`` without [CLS]/[SEP]."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    if self.kind == 'sentencepiece':
      return self._backend.Encode(texts)
    return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=False)]

  def decode(self, ids) -> str:
    ids = [int(i) for i in ids]
    if self.kind == 'sentencepiece':
      return self._backend.Decode(ids)
    return self._backend.decode(ids, skip_special_tokens=False)

  def id_to_piece(self, i: int) -> str:
    return self._pieces[int(i)]

  def piece_to_id(self, piece: str) -> int:
    """The id of ``piece``, or ``unk_id`` when it is not in the vocabulary."""
    return self._piece_ids.get(piece, self.unk_id)

  def sha256(self) -> str:
    return file_sha256(self.path)

  def check_vocab_size(self, vocab_size: int, setting: str = 'config.model.vocab_size'):
    if self.vocab_size != vocab_size:
      raise ValueError(
          f'Tokenizer {self.path!r} has {self.vocab_size} pieces but {setting} = '
          f'{vocab_size}; they must be equal (the embedding table is sized by the config).')

  def __repr__(self):
    return (f'Tokenizer({self.kind}, {self.path!r}, vocab_size={self.vocab_size}, '
            f'pad={self.pad_id} unk={self.unk_id} cls={self.cls_id} sep={self.sep_id} '
            f'mask={self.mask_id})')
