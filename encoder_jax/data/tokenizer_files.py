"""The files of the tokenizer kinds: their fixed pieces and ids, reading and checking them,
building RoBERTa's byte-level BPE, and where the specials go around texts (``Template``).

Each kind's reader (``read_sentencepiece``, ``read_wordpiece``, ``read_bytelevel_bpe``,
``read_hf``) checks its file and returns its :class:`Contents`: a backend that encodes and
decodes (:class:`SentencePieceBackend` or :class:`TokenizersBackend`, one interface), the
pieces, the ids never masked, the word starts, and for the hf kind the roles, template and
padding side its file records. ``tokenizer_kinds`` names the reader of each kind.

Below ``tokenizer`` (the one ``Tokenizer`` interface) and ``tokenizer_training``; imports no
other module of encoder_jax.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from encoder_jax.storage import paths as storage

SPECIAL_PIECES = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
SENTENCEPIECE_IDS = {'[PAD]': 0, '[UNK]': 1, '[CLS]': 2, '[SEP]': 3, '[MASK]': 4}
ROBERTA_PIECES = ('<pad>', '<unk>', '<s>', '</s>', '<mask>')  # In role order, as above.
# Fixed ids of a byte-level BPE vocabulary (RoBERTa's); <mask> is the last id instead.
BYTELEVEL_BPE_IDS = {'<s>': 0, '<pad>': 1, '</s>': 2, '<unk>': 3}
BYTELEVEL_BPE_MASK = '<mask>'
ROLES = ('pad', 'unk', 'cls', 'sep', 'mask')
# The pieces that can play each role (in ROLES order) in a fixed-layout vocabulary; the
# first present wins. BERT-named vocabularies accept <pad>/<unk> for [PAD]/[UNK], as in
# ALBERT's released models; byte-level BPE ones have RoBERTa's names.
BERT_ROLES = (('[PAD]', '<pad>'), ('[UNK]', '<unk>'), ('[CLS]',), ('[SEP]',), ('[MASK]',))
ROBERTA_ROLES = tuple((p,) for p in ROBERTA_PIECES)
HF_KIND = 'hf'  # A Hugging Face tokenizer.json with its roles and layout (see the docstring).
HF_FORMAT = 'encoder_jax.hf_tokenizer/1'  # The ``format`` of an hf kind's file.
HF_FILE = 'hf_tokenizer.json'  # The hf kind's file (a bundle; see interop.tokenizer.hf_bundle).
BERT_ALIASES = {names[0]: names for names in BERT_ROLES}
BYTE_SPACE = '\u0120'  # 'Ġ': the space byte in GPT-2's byte alphabet.


def file_sha256(path: str) -> str:
  """The sha256 of the file (or ``gs://`` object) ``path``, hex."""
  h = hashlib.sha256()
  with storage.open_read(path) if path.startswith('gs://') else open(path, 'rb') as f:
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

  @classmethod
  def xlnet(cls, cls_id: int, sep_id: int) -> 'Template':
    """``A <sep> <cls>`` and ``A <sep> B <sep> <cls>`` (segments 0 then 1, and 2 for the
    summary token, which comes last), as Hugging Face's XLNet tokenizer frames texts."""
    return cls((('A', 0), (sep_id, 0), (cls_id, 2)),
               (('A', 0), (sep_id, 0), ('B', 1), (sep_id, 1), (cls_id, 2)))

  def num_added(self, pair: bool = False) -> int:
    return sum(not isinstance(t, str) for t, _ in (self.pair if pair else self.single))

  def around_pieces(self) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...],
                                   tuple[tuple[int, int], ...]]:
    """``(head, closing, tail)`` of a row of any number of texts, read from ``pair``.

    ``head``: the ``(token_id, type_id)`` specials before the first text; ``closing``: the
    ids of the specials that close every text, each in that text's segment; ``tail``: the
    specials after the last text's closing. A row is ``head``, then each text followed by
    ``closing``, then ``tail``: pretraining rows hold one text or several (sentence pairs,
    packed documents), so the layout must not depend on how many. ``[CLS] A [SEP] B [SEP]``
    gives ``(([CLS], 0),), ([SEP],), ()``; XLNet's ``A <sep> B <sep> <cls>`` gives ``(),
    (<sep>,), ((<cls>, 2),)``.

    Raises:
      ValueError: ``pair`` does not close both texts alike, each in its own segment
        (RoBERTa's ``<s> A </s></s> B </s>``), so it has no such layout.
    """
    items = self.pair
    at = [i for i, (item, _) in enumerate(items) if isinstance(item, str)]
    if [items[i][0] for i in at] == ['A', 'B']:
      a, b = at
      closing = items[a + 1:b]
      n = len(closing)
      if (all(k == items[a][1] for _, k in closing)
          and items[b + 1:b + 1 + n] == tuple((t, items[b][1]) for t, _ in closing)):
        return items[:a], tuple(t for t, _ in closing), items[b + 1 + n:]
    raise ValueError(f'The pair frame {self.pair} does not close each text alike in its '
                     'own segment; a row of several texts cannot be laid out with it.')

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


def check_vocab_size(path: str, num_pieces: int, vocab_size: int, larger_table_ok: bool,
                     setting: str = 'config.model.vocab_size') -> None:
  """Raises unless a model with ``vocab_size`` embedding rows runs on the ``num_pieces`` ids
  of the tokenizer file ``path`` (equal, or larger where ``larger_table_ok``)."""
  if num_pieces == vocab_size or (larger_table_ok and num_pieces < vocab_size):
    return
  raise ValueError(
      f'Tokenizer {path!r} has {num_pieces} pieces but {setting} = '
      f'{vocab_size}; they must be equal (the embedding table is sized by the config'
      + ('; an imported Hugging Face tokenizer may also have fewer' if larger_table_ok
         else '') + ').')


# ---------------------------------------------------------------------------- backends


class SentencePieceBackend:
  """Encodes and decodes with a ``sentencepiece.SentencePieceProcessor``."""

  def __init__(self, processor):
    self.processor = processor

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    return self.processor.Encode(list(texts))

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and each piece's character span (SentencePiece gives byte offsets)."""
    return self.encode_batch_with_offsets([text])[0]

  def encode_batch_with_offsets(self, texts: list[str]
                                ) -> list[tuple[list[int], list[tuple[int, int]]]]:
    ids, spans = self.encode_batch_spans(texts)
    out, pos = [], 0
    for tok_ids in ids:
      out.append((tok_ids, [tuple(map(int, sp)) for sp in spans[pos:pos + len(tok_ids)]]))
      pos += len(tok_ids)
    return out

  def encode_batch_spans(self, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
    """Ids of each text and the character spans of all their pieces, int64 [pieces, 2]
    (each relative to its own text), in one pass over the batch."""
    texts = list(texts)
    try:  # Byte offsets per piece (sentencepiece >= 0.2.1; earlier: immutable_proto).
      protos = self.processor.encode(texts, return_type='proto')
    except TypeError:
      protos = self.processor.encode(texts, out_type='immutable_proto')
    ids = [[p.id for p in q.pieces] for q in protos]
    pairs = np.array([(p.begin, p.end) for q in protos for p in q.pieces], np.int64
                     ).reshape(-1, 2)
    raw = np.frombuffer('\n'.join(texts).encode('utf-8'), np.uint8)
    # Byte offset -> character offset: a character starts at every non-continuation byte.
    char_at = np.append(np.cumsum((raw & 0xC0) != 0x80) - 1, sum(map(len, texts)) + max(
        len(texts) - 1, 0)).astype(np.int64)
    which = np.repeat(np.arange(len(texts)), [len(i) for i in ids])
    byte_base = np.concatenate([[0], np.cumsum([len(t.encode('utf-8')) + 1 for t in texts])])
    char_base = np.concatenate([[0], np.cumsum([len(t) + 1 for t in texts])])
    spans = char_at[pairs + byte_base[which][:, None]] - char_base[which][:, None]
    return ids, spans

  def decode(self, ids: list[int]) -> str:
    return self.processor.Decode(ids)


class TokenizersBackend:
  """Encodes and decodes with a Hugging Face ``tokenizers`` tokenizer (no specials added)."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    return self.encode_batch_with_offsets([text])[0]

  def encode_batch_with_offsets(self, texts: list[str]
                                ) -> list[tuple[list[int], list[tuple[int, int]]]]:
    return [(list(e.ids), [tuple(o) for o in e.offsets])
            for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

  def encode_batch_spans(self, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
    encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
    spans = np.array([o for e in encodings for o in e.offsets], np.int64).reshape(-1, 2)
    return [e.ids for e in encodings], spans

  def encode_matching_specials(self, text: str) -> list[int]:
    """Ids of ``text`` with its special-token strings matched as Hugging Face does (the
    other methods read them as plain text)."""
    self.tokenizer.encode_special_tokens = False
    try:
      return self.tokenizer.encode(text, add_special_tokens=False).ids
    finally:
      self.tokenizer.encode_special_tokens = True

  def decode(self, ids: list[int]) -> str:
    return self.tokenizer.decode(ids, skip_special_tokens=False)


# ---------------------------------------------------------------------------- readers


@dataclasses.dataclass(frozen=True)
class Contents:
  """What a tokenizer file holds, checked: see ``data.tokenizer.Tokenizer`` for the fields.

  ``role_ids``, ``template`` and ``padding_side``: recorded by an hf kind's file; None for
  a fixed-layout kind, whose roles and template its ``TokenizerKind`` declares.
  """
  backend: SentencePieceBackend | TokenizersBackend
  pieces: list[str]
  special_ids: np.ndarray
  is_word_start: np.ndarray
  lowercase: bool
  role_ids: dict[str, int] | None = None
  template: Template | None = None
  padding_side: str = 'right'


def _pieces_by_id(vocab: dict[str, int], n: int) -> list[str]:
  pieces = [''] * n
  for piece, i in vocab.items():
    pieces[i] = piece
  return pieces


def _word_starts(pieces: list[str], special, how: str, mark: str) -> np.ndarray:
  """True where a piece starts a word (``word_start_scheme``); specials are False."""
  if how == 'prefix':
    word_start = np.array([p.startswith(mark) for p in pieces], np.bool_)
  elif how == 'not_prefix':
    word_start = np.array([not p.startswith(mark) for p in pieces], np.bool_)
  else:
    word_start = np.ones(len(pieces), np.bool_)
  word_start[special] = False
  return word_start


def read_sentencepiece(path: str, lowercase: bool = False) -> Contents:
  """A SentencePiece ``.model`` with the fixed ids ``SENTENCEPIECE_IDS`` (``lowercase`` is
  the model's own normalisation, not a setting)."""
  del lowercase
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
    if got not in BERT_ALIASES.get(name, (name,)):
      raise ValueError(
          f'SentencePiece model {path!r}: id {want} must be {name} but is {got!r}; '
          f'encoder_jax needs {SENTENCEPIECE_IDS}. Train it with prepare (leave '
          'config.tokenizer.path empty) or with these control symbols.')
  special = [i for i in range(n) if sp.IsControl(i) or sp.IsUnknown(i) or sp.IsUnused(i)]
  special = sorted(set(special) | set(SENTENCEPIECE_IDS.values()))
  return Contents(SentencePieceBackend(sp), pieces, np.array(special),
                  _word_starts(pieces, special, 'prefix', '\u2581'), lowercase=False)


def read_wordpiece(path: str, lowercase: bool = True) -> Contents:
  """A WordPiece ``vocab.txt`` (one piece per line, line number = id), run by BERT's basic +
  wordpiece tokenizer; ``lowercase`` as the checkpoint was trained."""
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
  return Contents(TokenizersBackend(backend), pieces, np.array(special),
                  _word_starts(pieces, special, 'not_prefix', '##'), lowercase=lowercase)


def read_bytelevel_bpe(path: str, lowercase: bool = False) -> Contents:
  """A byte-level BPE ``tokenizer.json`` (RoBERTa's layout; see ``check_bytelevel_bpe``).

  The backend encodes special-token strings in the text as plain bytes
  (``encode_special_tokens``), so the text "<mask>" never becomes the mask id and
  ``decode(encode(text)) == text`` for every text; HF's own tokenizer does match them.
  """
  del lowercase
  import tokenizers  # pylint: disable=g-import-not-at-top
  spec = read_tokenizer_json(path, 'Byte-level BPE tokenizer', 'a tokenizers tokenizer.json')
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
  pieces = _pieces_by_id(vocab, n)
  want = dict(BYTELEVEL_BPE_IDS, **{BYTELEVEL_BPE_MASK: n - 1})
  wrong = {p: vocab.get(p) for p, i in want.items() if vocab.get(p) != i}
  if wrong:
    raise ValueError(
        f'Byte-level BPE tokenizer {path!r}: special pieces at ids {wrong}; encoder_jax '
        f'needs RoBERTa\'s {want} (<mask> = the last id). Train it with prepare (leave '
        'config.tokenizer.path empty) or use a RoBERTa-style vocabulary.')
  missing = sorted(set(byte_alphabet()) - set(vocab))
  if missing:
    raise ValueError(f'Byte-level BPE tokenizer {path!r} lacks {len(missing)} of the 256 '
                     f'byte pieces (e.g. {missing[:5]}); some text could not be encoded.')
  special = sorted(want.values())
  return Contents(TokenizersBackend(backend), pieces, np.array(special),
                  _word_starts(pieces, special, 'prefix', BYTE_SPACE), lowercase=False)


def read_hf(path: str, lowercase: bool = False) -> Contents:
  """An ``hf`` kind file: a Hugging Face ``tokenizer.json`` with the checkpoint's roles,
  template and padding side (``interop.tokenizer.hf_bundle`` writes it).

  Literal special-token strings in a text stay text (``encode_special_tokens``), as with the
  other kinds; the ids of every other text equal ``AutoTokenizer``'s.
  """
  del lowercase
  import tokenizers  # pylint: disable=g-import-not-at-top
  bundle = read_tokenizer_json(path, 'Hugging Face tokenizer file',
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
  pieces = _pieces_by_id(vocab, n)
  holes = [i for i, p in enumerate(pieces) if not p]
  if holes:
    raise ValueError(f'{path!r}: ids {holes[:5]} have no piece; expected ids 0..{n - 1}')
  roles = {r: int(bundle['roles'][r]) for r in ROLES}
  special = sorted({*roles.values(), *(int(t['id']) for t in spec.get('added_tokens') or ()
                                        if t.get('special'))})
  how, mark = bundle.get('word_start') or word_start_scheme(spec)
  return Contents(TokenizersBackend(backend), pieces, np.array(special),
                  _word_starts(pieces, special, how, mark), lowercase=False, role_ids=roles,
                  template=Template.from_json(bundle['template']),
                  padding_side=bundle.get('padding_side', 'right'))


def is_hf_file(path: str) -> bool:
  """Whether ``path`` is an hf kind's file (JSON with its ``format``), read cheaply."""
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f).get('format') == HF_FORMAT
  except (OSError, ValueError, AttributeError):
    return False
