"""One ``Tokenizer`` interface over SentencePiece, WordPiece and byte-level BPE tokenizers.

SentencePiece models (trained by ``tokenizer_training`` or loaded) must have the fixed ids
``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4`` (``<pad>``/``<unk>`` are accepted for 0/1, as in
ALBERT's released models). WordPiece vocabularies (HF BERT checkpoints) keep their own ids,
e.g. ``[PAD]=0 [UNK]=100 [CLS]=101 [SEP]=102 [MASK]=103``, and are run by the HF
``tokenizers`` BertWordPiece implementation (BERT's basic + wordpiece tokenizer).
Byte-level BPE (GPT-2's scheme, as RoBERTa uses it) is one HF ``tokenizers`` ``tokenizer.json``
with RoBERTa's special pieces and ids ``<s>=0 <pad>=1 </s>=2 <unk>=3`` and ``<mask>`` = the last
id (50264 of 50265); its pieces are byte strings spelled in GPT-2's printable byte alphabet
(``Ġ`` = a space), so every text encodes losslessly and nothing is ever ``<unk>``.

The ``hf`` kind runs any Hugging Face ``tokenizer.json`` (WordPiece, BPE, Unigram: whatever a
checkpoint ships) with the ``tokenizers`` runtime, exactly as ``AutoTokenizer`` does. Its
special roles (pad, unk, cls, sep, mask), the layout of specials around one or two texts
(the post-processor: ``[CLS] A [SEP] B [SEP]``, ``<s> A </s></s> B </s>``, XLNet's
``A <sep> B <sep> <cls>``) and the padding side come from the checkpoint's own files,
never from a canonical checkpoint; all of it is kept in one self-contained JSON file (see
``interop/tokenizer.py``), so a workdir pins it like any other tokenizer file.

What differs between the kinds is declared once, in ``tokenizer_kinds`` (their files,
training, roles, template, masks, Hugging Face export); ``Tokenizer`` dispatches through it.
Every kind frames texts for the model the same way: :meth:`Tokenizer.frame` puts the
specials around the ids (with segment ids) and :meth:`Tokenizer.encode_inputs` tokenizes,
truncates (longest first, as Hugging Face) and pads a batch on the tokenizer's side.
"""

from __future__ import annotations

import numpy as np

from encoder_jax.data import tokenizer_files
from encoder_jax.data import tokenizer_kinds

# The kinds (``tokenizer_kinds``) and the file names callers use.
KINDS = tokenizer_kinds.KINDS
HF_KIND, HF_FORMAT = tokenizer_files.HF_KIND, tokenizer_files.HF_FORMAT
ROBERTA_PIECES = tokenizer_files.ROBERTA_PIECES
Template = tokenizer_files.Template
file_sha256 = tokenizer_files.file_sha256


def truncate_longest_first(a: list[int], b: list[int] | None, budget: int) -> int:
  """Cuts ``a`` (and ``b``) in place to fit ``budget`` tokens as Hugging Face's fast
  tokenizers do (``longest_first``): the shorter text stays whole when the longer can take
  the rest, else they get ``budget // 2`` and the remainder, the longer one the larger share.
  The number of tokens cut."""
  before = len(a) + len(b or ())
  if b is None:
    del a[max(budget, 0):]
    return before - len(a)
  if before <= budget:
    return 0
  n1, n2 = sorted((len(a), len(b)))
  n2 = n1 if n1 > budget else max(n1, budget - n1)
  if n1 + n2 > budget:
    n1, n2 = budget // 2, budget // 2 + budget % 2
  if len(a) > len(b):
    n1, n2 = n2, n1
  del a[n1:], b[n2:]
  return before - len(a) - len(b)


class Tokenizer:
  """Text <-> ids, the special ids, and per-piece tables for masking.

  Attributes:
    kind: 'sentencepiece', 'wordpiece', 'bytelevel_bpe' or 'hf'; spec: its
      ``tokenizer_kinds.TokenizerKind`` (what differs between kinds).
    path: the model file (.model, vocab.txt, tokenizer.json or hf_tokenizer.json).
    vocab_size, pad_id, unk_id, cls_id, sep_id, mask_id: ints. The roles have BERT's names
      ([CLS] ...) in SentencePiece/WordPiece vocabularies and RoBERTa's in byte-level BPE
      ones (cls = <s>, sep = </s>, pad = <pad>, unk = <unk>, mask = <mask>); see
      ``TokenizerKind.role_pieces``.
      An hf kind's roles are the checkpoint's own (its tokenizer_config.json).
    template: the specials around one or two texts (:class:`Template`); padding_side:
      'right', or 'left' (XLNet).
    special_ids: int32 ids never to mask (the five role pieces and any other control piece
      such as WordPiece's ``[unused*]``).
    is_word_start: bool [vocab_size], True where the piece starts a word (SentencePiece
      '▁' prefix; WordPiece: no '##'; byte-level BPE: 'Ġ', an encoded space, first, so the
      first word of a text and a word right after a newline are not marked, as in fairseq's
      RoBERTa whole-word masking); special pieces are False.
  """

  def __init__(self, kind: str, path: str, contents: tokenizer_files.Contents):
    self.spec = tokenizer_kinds.get(kind, f' for {path!r}')
    self.kind = kind
    self.path = path
    self.lowercase = contents.lowercase
    self._backend = contents.backend
    self._pieces = contents.pieces
    self._piece_ids = {p: i for i, p in enumerate(self._pieces)}
    self.vocab_size = len(self._pieces)
    role_ids = contents.role_ids or self._fixed_roles()
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        int(role_ids[r]) for r in tokenizer_files.ROLES)
    self.special_ids = np.asarray(contents.special_ids, np.int32)
    self.is_word_start = np.asarray(contents.is_word_start, np.bool_)
    self.template = contents.template or self.spec.template(self.cls_id, self.sep_id)
    if contents.padding_side not in ('right', 'left'):
      raise ValueError(f'padding side {contents.padding_side!r} for {path!r}; expected right '
                       'or left')
    self.padding_side = contents.padding_side

  def _fixed_roles(self) -> dict[str, int]:
    """The role ids of a fixed-layout kind, by piece name (``TokenizerKind.role_pieces``)."""
    role_ids = {}
    for role, names in zip(tokenizer_files.ROLES, self.spec.role_pieces):
      role_ids[role] = next((self._piece_ids[a] for a in names if a in self._piece_ids), None)
      if role_ids[role] is None:
        raise ValueError(f'Tokenizer {self.path!r} has no {" or ".join(names)} piece ({role}); '
                         f'a {self.kind} tokenizer for encoder_jax needs all of '
                         f'{[n[0] for n in self.spec.role_pieces]}.')
    return role_ids

  # ---- constructors ----

  @classmethod
  def from_file(cls, kind: str, path: str, lowercase: bool = True) -> 'Tokenizer':
    """A tokenizer file of ``kind`` (``tokenizer_kinds``): 'sentencepiece' (.model),
    'wordpiece' (vocab.txt), 'bytelevel_bpe' (tokenizer.json) or 'hf' (an encoder_jax
    hf_tokenizer.json). ``lowercase`` only matters for WordPiece."""
    return cls(kind, path, tokenizer_kinds.get(kind, f' for {path!r}').read(path, lowercase))

  @classmethod
  def from_sentencepiece(cls, path: str) -> 'Tokenizer':
    """A SentencePiece ``.model`` (``tokenizer_files.read_sentencepiece``)."""
    return cls.from_file('sentencepiece', path)

  @classmethod
  def from_wordpiece_vocab(cls, path: str, lowercase: bool = True) -> 'Tokenizer':
    """A WordPiece ``vocab.txt`` (``tokenizer_files.read_wordpiece``)."""
    return cls.from_file('wordpiece', path, lowercase)

  @classmethod
  def from_bytelevel_bpe(cls, path: str) -> 'Tokenizer':
    """A byte-level BPE ``tokenizer.json`` (``tokenizer_files.read_bytelevel_bpe``)."""
    return cls.from_file('bytelevel_bpe', path)

  @classmethod
  def from_hf_json(cls, path: str) -> 'Tokenizer':
    """An ``hf`` kind file (``tokenizer_files.read_hf``)."""
    return cls.from_file(HF_KIND, path)

  # ---- text <-> ids ----

  def encode(self, text: str) -> list[int]:
    """Ids of ``text`` without [CLS]/[SEP]."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    return self._backend.encode_batch(texts)

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids of ``text`` (no specials) and each piece's [start, end) character span in
    ``text`` (for mapping answer spans; a piece that covers no character, e.g. a lone
    SentencePiece '▁', gets an empty span at its place)."""
    return self._backend.encode_with_offsets(text)

  def encode_batch_with_offsets(self, texts: list[str]
                                ) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """:meth:`encode_with_offsets` of each text."""
    return self._backend.encode_batch_with_offsets(texts)

  def encode_batch_spans(self, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
    """Ids of each text and the character spans of all their pieces, int64 [pieces, 2],
    each relative to its own text (preparation's word starts read them)."""
    return self._backend.encode_batch_spans(texts)

  def encode_with_masks(self, text: str, mask_literal: str) -> list[int]:
    """Ids of ``text`` (no specials added) with ``mask_id`` where ``mask_literal`` stands.

    An hf tokenizer reads it as Hugging Face does: the literal becomes the model's own mask
    token, matched by the tokenizer with its rules (e.g. ``<mask>``'s ``lstrip``). The other
    kinds tokenize the pieces between the masks; byte-level BPE gives the space before a
    mask to the mask, as RoBERTa's ``<mask>`` (lstrip) does.
    """
    if self.spec.masks_in_backend:
      return self._backend.encode_matching_specials(
          text.replace(mask_literal, self._pieces[self.mask_id]))
    parts, ids = text.split(mask_literal), []
    for i, part in enumerate(parts):
      if self.spec.space_to_mask and i < len(parts) - 1:
        part = part.rstrip(' ')
      ids.extend(self.encode(part) if part.strip() else [])
      if i < len(parts) - 1:
        ids.append(self.mask_id)
    return ids

  def decode(self, ids) -> str:
    return self._backend.decode([int(i) for i in ids])

  # ---- model inputs ----

  def frame(self, a, b=None) -> tuple[list[int], list[int]]:
    """(ids, segment ids) of the ids ``a`` (and ``b``) with this tokenizer's specials."""
    return self.template.frame(a, b)

  def num_added(self, pair: bool = False) -> int:
    """How many specials :meth:`frame` adds around one text, or two."""
    return self.template.num_added(pair)

  @property
  def cls_index(self) -> int:
    """Where a padded row's summary token sits: 0 when the single-text frame starts with
    it, -1 when it ends the frame and rows are padded on the left (XLNet's ``<cls>``)."""
    last = self.template.single[-1][0]
    return -1 if last == self.cls_id and self.padding_side == 'left' else 0

  def pad(self, rows, segments=None, length: int | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int32 (ids, segment ids, mask) [B, length] of framed rows, padded on this tokenizer's
    side (``length`` defaults to the longest row)."""
    length = max((len(r) for r in rows), default=0) if length is None else length
    ids = np.full((len(rows), length), self.pad_id, np.int32)
    seg = np.zeros((len(rows), length), np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
      if len(r) > length:
        raise ValueError(f'a row of {len(r)} tokens does not fit length {length}')
      where = slice(length - len(r), length) if self.padding_side == 'left' else slice(0, len(r))
      ids[i, where], mask[i, where] = r, 1
      if segments is not None:
        seg[i, where] = segments[i]
    return ids, seg, mask

  def encode_inputs(self, texts, pairs=None, max_len: int | None = None, length=None
                    ) -> dict[str, np.ndarray]:
    """The model's inputs for ``texts`` (and second texts ``pairs``), as ``AutoTokenizer(
    texts, pairs, truncation=True, max_length=max_len, padding=True)`` gives them:
    int32 ``input_ids``, ``segment_ids``, ``input_mask`` [B, L] and ``truncated`` [B]
    (tokens cut per row)."""
    a_ids = self.encode_batch(list(texts)) if len(texts) else []
    b_ids = self.encode_batch(list(pairs)) if pairs is not None and len(pairs) else None
    rows, segs, cut = [], [], []
    for n, a in enumerate(a_ids):
      b = None if b_ids is None else b_ids[n]
      if max_len is not None:
        cut.append(truncate_longest_first(a, b, max_len - self.num_added(b is not None)))
      else:
        cut.append(0)
      r, s = self.frame(a, b)
      rows.append(r)
      segs.append(s)
    ids, seg, mask = self.pad(rows, segs, length)
    return {'input_ids': ids, 'segment_ids': seg, 'input_mask': mask,
            'truncated': np.asarray(cut, np.int32)}

  def id_to_piece(self, i: int) -> str:
    """The piece of id ``i``; ``<unused:N>`` for an id past the pieces (the extra rows of
    an imported embedding table larger than its tokenizer)."""
    i = int(i)
    return self._pieces[i] if 0 <= i < len(self._pieces) else f'<unused:{i}>'

  def piece_to_id(self, piece: str) -> int:
    """The id of ``piece``, or ``unk_id`` when it is not in the vocabulary."""
    return self._piece_ids.get(piece, self.unk_id)

  def sha256(self) -> str:
    return file_sha256(self.path)

  def fits(self, vocab_size: int) -> bool:
    """Whether a model with ``vocab_size`` embedding rows runs on this tokenizer's ids: the
    same size, or for an imported Hugging Face tokenizer (``hf``) a larger table whose
    extra rows no text produces (DeBERTa v3: 128,100 rows for 128,001 pieces)."""
    return self.vocab_size == vocab_size or (self.spec.larger_table_ok and
                                             self.vocab_size < vocab_size)

  def check_vocab_size(self, vocab_size: int, setting: str = 'config.model.vocab_size'):
    tokenizer_files.check_vocab_size(self.path, self.vocab_size, vocab_size,
                                     self.spec.larger_table_ok, setting)

  def __repr__(self):
    return (f'Tokenizer({self.kind}, {self.path!r}, vocab_size={self.vocab_size}, '
            f'pad={self.pad_id} unk={self.unk_id} cls={self.cls_id} sep={self.sep_id} '
            f'mask={self.mask_id})')
