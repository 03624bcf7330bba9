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

Every kind frames texts for the model the same way: :meth:`Tokenizer.frame` puts the
specials around the ids (with segment ids) and :meth:`Tokenizer.encode_inputs` tokenizes,
truncates (longest first, as Hugging Face) and pads a batch on the tokenizer's side.
"""

from __future__ import annotations

import json
import os

import numpy as np

from encoder_jax.data import tokenizer_files
from encoder_jax.data.tokenizer_files import (  # pylint: disable=unused-import
    BYTELEVEL_BPE_IDS, BYTELEVEL_BPE_MASK, HF_FORMAT, HF_KIND, ROBERTA_PIECES, ROLE_PIECES, ROLES,
    SENTENCEPIECE_IDS, SPECIAL_PIECES, Template, bpe_merges, build_bytelevel_bpe,
    check_bytelevel_bpe, file_sha256, word_start_scheme)

KINDS = (*ROLE_PIECES, HF_KIND)


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
    kind: 'sentencepiece', 'wordpiece', 'bytelevel_bpe' or 'hf'.
    path: the model file (.model, vocab.txt, tokenizer.json or hf_tokenizer.json).
    vocab_size, pad_id, unk_id, cls_id, sep_id, mask_id: ints. The roles have BERT's names
      ([CLS] ...) in SentencePiece/WordPiece vocabularies and RoBERTa's in byte-level BPE
      ones (cls = <s>, sep = </s>, pad = <pad>, unk = <unk>, mask = <mask>); ``ROLE_PIECES``.
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

  def __init__(self, kind: str, path: str, backend, pieces: list[str],
               special_ids: np.ndarray, is_word_start: np.ndarray, lowercase: bool,
               role_ids: dict[str, int] | None = None, template: Template | None = None,
               padding_side: str = 'right'):
    self.kind = kind
    self.path = path
    self.lowercase = lowercase
    self._backend = backend
    self._pieces = pieces
    self._piece_ids = {p: i for i, p in enumerate(pieces)}
    self.vocab_size = len(pieces)
    if kind not in KINDS:
      raise ValueError(f'tokenizer kind {kind!r} for {path!r}; expected one of {list(KINDS)}')
    if role_ids is None:  # A fixed-layout kind: the roles by piece name.
      role_ids = {}
      for role, names in zip(ROLES, ROLE_PIECES[kind]):
        role_ids[role] = next((self._piece_ids[a] for a in names if a in self._piece_ids), None)
        if role_ids[role] is None:
          raise ValueError(f'Tokenizer {path!r} has no {" or ".join(names)} piece ({role}); a '
                           f'{kind} tokenizer for encoder_jax needs all of '
                           f'{[n[0] for n in ROLE_PIECES[kind]]}.')
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        int(role_ids[r]) for r in ROLES)
    self.special_ids = np.asarray(special_ids, np.int32)
    self.is_word_start = np.asarray(is_word_start, np.bool_)
    if template is None:
      template = (Template.roberta if kind == 'bytelevel_bpe' else Template.bert)(
          self.cls_id, self.sep_id)
    if padding_side not in ('right', 'left'):
      raise ValueError(f'padding side {padding_side!r} for {path!r}; expected right or left')
    self.template = template
    self.padding_side = padding_side

  # ---- constructors ----

  @classmethod
  def from_file(cls, kind: str, path: str, lowercase: bool = True) -> 'Tokenizer':
    """A tokenizer file of ``kind``: 'sentencepiece' (.model), 'wordpiece' (vocab.txt) or
    'bytelevel_bpe' (tokenizer.json), 'hf' (an encoder_jax hf_tokenizer.json). ``lowercase``
    only matters for WordPiece."""
    if kind == 'wordpiece':
      return cls.from_wordpiece_vocab(path, lowercase=lowercase)
    if kind == 'sentencepiece':
      return cls.from_sentencepiece(path)
    if kind == 'bytelevel_bpe':
      return cls.from_bytelevel_bpe(path)
    if kind == HF_KIND:
      return cls.from_hf_json(path)
    raise ValueError(f'tokenizer kind {kind!r} for {path!r}; expected one of {list(KINDS)}')

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
      if got not in tokenizer_files.BERT_ALIASES.get(name, (name,)):
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

  @classmethod
  def from_bytelevel_bpe(cls, path: str) -> 'Tokenizer':
    """A byte-level BPE ``tokenizer.json`` (RoBERTa's layout; see ``check_bytelevel_bpe``).

    The backend encodes special-token strings in the text as plain bytes
    (``encode_special_tokens``), so the text "<mask>" never becomes the mask id and
    ``decode(encode(text)) == text`` for every text; HF's own tokenizer does match them.
    """
    import tokenizers  # pylint: disable=g-import-not-at-top
    spec = tokenizer_files.read_tokenizer_json(path, 'Byte-level BPE tokenizer',
                                               'a tokenizers tokenizer.json')
    check_bytelevel_bpe(spec, path)
    try:
      backend = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # The Rust loader raises its own exception type.
      raise ValueError(f'{path!r} is not a tokenizers tokenizer.json: {e}') from e
    backend.encode_special_tokens = True
    vocab = backend.get_vocab(with_added_tokens=True)
    n = len(vocab)
    if sorted(vocab.values()) != list(range(n)):
      raise ValueError(f'Byte-level BPE tokenizer {path!r}: the ids are not 0..{n - 1}.')
    pieces = [''] * n
    for piece, i in vocab.items():
      pieces[i] = piece
    want = dict(BYTELEVEL_BPE_IDS, **{BYTELEVEL_BPE_MASK: n - 1})
    wrong = {p: vocab.get(p) for p, i in want.items() if vocab.get(p) != i}
    if wrong:
      raise ValueError(
          f'Byte-level BPE tokenizer {path!r}: special pieces at ids {wrong}; encoder_jax '
          f'needs RoBERTa\'s {want} (<mask> = the last id). Train it with prepare (leave '
          'config.tokenizer.path empty) or use a RoBERTa-style vocabulary.')
    missing = sorted(set(tokenizer_files.byte_alphabet()) - set(vocab))
    if missing:
      raise ValueError(f'Byte-level BPE tokenizer {path!r} lacks {len(missing)} of the 256 '
                       f'byte pieces (e.g. {missing[:5]}); some text could not be encoded.')
    special = sorted(want.values())
    word_start = np.array([p.startswith(tokenizer_files.BYTE_SPACE) for p in pieces],
                          np.bool_)
    word_start[special] = False
    return cls('bytelevel_bpe', path, backend, pieces, np.array(special), word_start,
               lowercase=False)

  @classmethod
  def from_hf_json(cls, path: str) -> 'Tokenizer':
    """An ``hf`` kind file: a Hugging Face ``tokenizer.json`` with the checkpoint's roles,
    template and padding side (``interop.tokenizer.hf_bundle`` writes it).

    Literal special-token strings in a text stay text (``encode_special_tokens``), as with the
    other kinds; the ids of every other text equal ``AutoTokenizer``'s.
    """
    import tokenizers  # pylint: disable=g-import-not-at-top
    bundle = tokenizer_files.read_tokenizer_json(path, 'Hugging Face tokenizer file',
                                  'an encoder_jax hf tokenizer file')
    found = bundle.get('format') if isinstance(bundle, dict) else None
    if found != HF_FORMAT:
      raise ValueError(f'{path!r}: format {found!r}; expected an encoder_jax hf tokenizer file '
                       f'({HF_FORMAT!r}), as convert hf_to_workdir writes')
    spec = bundle['tokenizer']
    try:
      backend = tokenizers.Tokenizer.from_str(json.dumps(spec))
    except Exception as e:  # The Rust loader raises its own exception type.
      raise ValueError(f'{path!r}: its tokenizer does not load in tokenizers: {e}') from e
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = True
    vocab = backend.get_vocab(with_added_tokens=True)
    n = max(vocab.values()) + 1 if vocab else 0
    pieces = [''] * n
    for piece, i in vocab.items():
      pieces[i] = piece
    holes = [i for i, p in enumerate(pieces) if not p]
    if holes:
      raise ValueError(f'{path!r}: ids {holes[:5]} have no piece; expected ids 0..{n - 1}')
    roles = {r: int(bundle['roles'][r]) for r in ROLES}
    special = sorted({*roles.values(), *(int(t['id']) for t in spec.get('added_tokens') or ()
                                          if t.get('special'))})
    how, mark = bundle.get('word_start') or word_start_scheme(spec)
    if how == 'prefix':
      word_start = np.array([p.startswith(mark) for p in pieces], np.bool_)
    elif how == 'not_prefix':
      word_start = np.array([not p.startswith(mark) for p in pieces], np.bool_)
    else:
      word_start = np.ones(n, np.bool_)
    word_start[special] = False
    return cls(HF_KIND, path, backend, pieces, np.array(special), word_start,
               lowercase=False, role_ids=roles, template=Template.from_json(bundle['template']),
               padding_side=bundle.get('padding_side', 'right'))

  # ---- text <-> ids ----

  def encode(self, text: str) -> list[int]:
    """Ids of ``text`` without [CLS]/[SEP]."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    if self.kind == 'sentencepiece':
      return self._backend.Encode(list(texts))
    return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=False)]

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids of ``text`` (no specials) and each piece's [start, end) character span in
    ``text`` (for mapping answer spans; a piece that covers no character, e.g. a lone
    SentencePiece '▁', gets an empty span at its place)."""
    if self.kind == 'sentencepiece':
      try:  # Byte offsets per piece (sentencepiece >= 0.2.1; earlier: immutable_proto).
        proto = self._backend.encode(text, return_type='proto')
      except TypeError:
        proto = self._backend.encode(text, out_type='immutable_proto')
      raw = text.encode('utf-8')
      char_at = np.zeros(len(raw) + 1, np.int64)  # Byte offset -> character offset.
      pos = 0
      for i, ch in enumerate(text):
        n = len(ch.encode('utf-8'))
        char_at[pos:pos + n] = i
        pos += n
      char_at[len(raw)] = len(text)
      return ([p.id for p in proto.pieces],
              [(int(char_at[p.begin]), int(char_at[p.end])) for p in proto.pieces])
    e = self._backend.encode_batch([text], add_special_tokens=False)[0]
    return list(e.ids), [tuple(o) for o in e.offsets]

  def encode_with_masks(self, text: str, mask_literal: str) -> list[int]:
    """Ids of ``text`` (no specials added) with ``mask_id`` where ``mask_literal`` stands.

    An hf tokenizer reads it as Hugging Face does: the literal becomes the model's own mask
    token, matched by the tokenizer with its rules (e.g. ``<mask>``'s ``lstrip``). The other
    kinds tokenize the pieces between the masks; byte-level BPE gives the space before a
    mask to the mask, as RoBERTa's ``<mask>`` (lstrip) does.
    """
    if self.kind == HF_KIND:
      self._backend.encode_special_tokens = False
      try:
        return self._backend.encode(text.replace(mask_literal, self._pieces[self.mask_id]),
                                    add_special_tokens=False).ids
      finally:
        self._backend.encode_special_tokens = True
    parts, ids = text.split(mask_literal), []
    for i, part in enumerate(parts):
      if self.kind == 'bytelevel_bpe' and i < len(parts) - 1:
        part = part.rstrip(' ')
      ids.extend(self.encode(part) if part.strip() else [])
      if i < len(parts) - 1:
        ids.append(self.mask_id)
    return ids

  def decode(self, ids) -> str:
    ids = [int(i) for i in ids]
    if self.kind == 'sentencepiece':
      return self._backend.Decode(ids)
    return self._backend.decode(ids, skip_special_tokens=False)

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
    return self.vocab_size == vocab_size or (self.kind == HF_KIND and
                                             self.vocab_size < vocab_size)

  def check_vocab_size(self, vocab_size: int, setting: str = 'config.model.vocab_size'):
    if not self.fits(vocab_size):
      raise ValueError(
          f'Tokenizer {self.path!r} has {self.vocab_size} pieces but {setting} = '
          f'{vocab_size}; they must be equal (the embedding table is sized by the config'
          + ('; an imported Hugging Face tokenizer may also have fewer' if self.kind == HF_KIND
             else '') + ').')

  def __repr__(self):
    return (f'Tokenizer({self.kind}, {self.path!r}, vocab_size={self.vocab_size}, '
            f'pad={self.pad_id} unk={self.unk_id} cls={self.cls_id} sep={self.sep_id} '
            f'mask={self.mask_id})')
