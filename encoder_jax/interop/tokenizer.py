"""Tokenizers for checkpoints: the one pinned in a workdir, and Hugging Face directories.

A workdir's tokenizer is the one pinned in ``<workdir>/tokenizer/`` when its run started
(``encoder_jax.workdir``), never one re-derived from the current config: the prepared-data
cache can change with the code or the config, and re-preparing a corpus to run fill-mask
would be slow anyway. Workdirs older than pinning fall back to ``config.tokenizer.path``.

Hugging Face directories, in and out:

* WordPiece (HF BERT): ``vocab.txt`` (+ ``tokenizer_config.json``), or only a WordPiece
  ``tokenizer.json`` (turned into a ``vocab.txt``, one piece per line, line number = id).
* SentencePiece (our default tokenizer): the raw ``tokenizer.model`` plus a ``tokenizer.json``
  for a fast tokenizer (the same pieces, scores, normalisation and ``[CLS] $A [SEP] $B [SEP]``
  template) and a ``tokenizer_config.json``, so ``AutoTokenizer.from_pretrained`` works.
  One difference: the HF tokenizer turns a literal ``[MASK]`` (or ``[CLS]``...) in the text
  into that special id, as HF tokenizers do; SentencePiece reads it as plain characters.
* Byte-level BPE (RoBERTa): ``tokenizer.json`` (RoBERTa's post-processor, ``<s> A </s>``) +
  ``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json`` (``RobertaTokenizer``) +
  ``special_tokens_map.json``, so ``AutoTokenizer`` gives RoBERTa's fast tokenizer with our
  ids. The same difference as above for a literal ``<mask>`` etc. in the text.

Import reads ``vocab.txt`` first, else our ``tokenizer.model``, else a ``tokenizer.json`` (a
BPE one is byte-level BPE, copied; a WordPiece one becomes a ``vocab.txt``), else
``vocab.json`` + ``merges.txt`` (a RoBERTa/GPT-2 directory; written out as a tokenizer.json).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import ml_collections
from absl import logging

from encoder_jax import workdir as workdir_lib

VOCAB_TXT = 'vocab.txt'
SENTENCEPIECE_MODEL = 'tokenizer.model'
TOKENIZER_JSON = 'tokenizer.json'
TOKENIZER_CONFIG = 'tokenizer_config.json'
VOCAB_JSON = 'vocab.json'
MERGES_TXT = 'merges.txt'
SPECIAL_TOKENS_MAP = 'special_tokens_map.json'
_SPECIAL_TOKENS = {'unk_token': '[UNK]', 'sep_token': '[SEP]', 'pad_token': '[PAD]',
                   'cls_token': '[CLS]', 'mask_token': '[MASK]'}


# --------------------------------------------------------------------- loading by kind


def wordpiece(vocab_path: str, lowercase: bool = True):
  """The input pipeline's tokenizer for a WordPiece ``vocab.txt``."""
  from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  return tokenizer_lib.Tokenizer.from_wordpiece_vocab(vocab_path, lowercase=lowercase)


def sentencepiece(model_path: str):
  """The input pipeline's tokenizer for a SentencePiece ``.model``."""
  from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  return tokenizer_lib.Tokenizer.from_sentencepiece(model_path)


def bytelevel_bpe(json_path: str):
  """The input pipeline's tokenizer for a byte-level BPE ``tokenizer.json``."""
  from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  return tokenizer_lib.Tokenizer.from_bytelevel_bpe(json_path)


def from_path(kind: str, path: str, lowercase: bool = True):
  """A tokenizer file of ``kind`` ('sentencepiece', 'wordpiece' or 'bytelevel_bpe')."""
  from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  return tokenizer_lib.Tokenizer.from_file(kind, path, lowercase)


def kind_of_file(path: str) -> str:
  """'sentencepiece' for a ``*.model`` file, 'bytelevel_bpe' for a ``*.json``
  (a tokenizer.json), else 'wordpiece' (a ``vocab.txt``)."""
  if path.endswith('.model'):
    return 'sentencepiece'
  return 'bytelevel_bpe' if path.endswith('.json') else 'wordpiece'


# ----------------------------------------------------------------------------- workdir


def no_pinned_tokenizer_message(workdir: str) -> str:
  info = workdir_lib.path(workdir, workdir_lib.TOKENIZER_DIR, workdir_lib.TOKENIZER_INFO)
  return (f'{workdir} has no pinned tokenizer ({info} does not exist: runs started before '
          'tokenizers were pinned have none) and its config has no tokenizer.path, so the '
          'ids its checkpoints were trained on are unknown. Pin the tokenizer the run trained '
          'with (the tokenizer.model, vocab.txt or tokenizer.json in the prepared-data '
          'directory it used): '
          f'python -m encoder_jax.convert pin_tokenizer --workdir={workdir} '
          '--tokenizer=PREPARED_DIR/tokenizer.model')


def for_workdir(workdir: str, config: ml_collections.ConfigDict):
  """The tokenizer a workdir's checkpoints were trained with.

  The pinned one (``<workdir>/tokenizer/``); for an older workdir without one,
  ``config.tokenizer.path`` if set (with a warning: it cannot be checked); else a clear
  error. A corpus is never prepared here.
  """
  if workdir_lib.has_pinned_tokenizer(workdir):
    tok = workdir_lib.load_tokenizer(workdir)[0]
  elif config.tokenizer.path:
    t = config.tokenizer
    if not os.path.exists(t.path):
      raise FileNotFoundError(f'{workdir} has no pinned tokenizer and config.tokenizer.path='
                              f'{t.path!r} does not exist')
    logging.warning('%s has no pinned tokenizer (an older run): using config.tokenizer.path=%s, '
                    'which cannot be checked against the one the run trained with.', workdir,
                    t.path)
    tok = from_path(t.kind, t.path, bool(t.lowercase))
  else:
    raise FileNotFoundError(no_pinned_tokenizer_message(workdir))
  if tok.vocab_size != int(config.model.vocab_size):
    raise ValueError(f'The tokenizer of {workdir} ({tok.path}) has {tok.vocab_size} pieces but '
                     f'config.model.vocab_size={config.model.vocab_size}: the checkpoint was '
                     'not trained with it')
  return tok


# --------------------------------------------------------------------------- HF import


def hf_lowercase(hf_dir: str) -> bool:
  """Whether the HF tokenizer lowercases (tokenizer_config.json, else tokenizer.json)."""
  path = os.path.join(hf_dir, TOKENIZER_CONFIG)
  if os.path.exists(path):
    with open(path) as f:
      cfg = json.load(f)
    if 'do_lower_case' in cfg:
      return bool(cfg['do_lower_case'])
  path = os.path.join(hf_dir, TOKENIZER_JSON)
  if os.path.exists(path):
    with open(path) as f:
      normalizer = json.load(f).get('normalizer') or {}
    if 'lowercase' in normalizer:
      return bool(normalizer['lowercase'])
  return True  # BertTokenizer's default.


def write_hf_vocab(hf_dir: str, out_dir: str) -> str:
  """Writes ``<out_dir>/vocab.txt`` from the HF directory's vocab.txt or tokenizer.json."""
  os.makedirs(out_dir, exist_ok=True)
  out = os.path.join(out_dir, VOCAB_TXT)
  src = os.path.join(hf_dir, VOCAB_TXT)
  if os.path.exists(src):
    if os.path.abspath(src) != os.path.abspath(out):
      shutil.copyfile(src, out)
    return out
  src = os.path.join(hf_dir, TOKENIZER_JSON)
  if not os.path.exists(src):
    raise FileNotFoundError(f'{hf_dir}: none of {VOCAB_TXT}, {SENTENCEPIECE_MODEL}, '
                            f'{TOKENIZER_JSON} or {VOCAB_JSON} + {MERGES_TXT}; expected the '
                            'WordPiece tokenizer of a BERT checkpoint, the byte-level BPE of a '
                            'RoBERTa one, or an encoder_jax SentencePiece export')
  with open(src) as f:
    model = json.load(f).get('model') or {}
  if model.get('type') != 'WordPiece':
    raise ValueError(f'{src}: tokenizer model type {model.get("type")!r}; expected '
                     f"'WordPiece' (a BERT tokenizer), or a {VOCAB_TXT} or an encoder_jax "
                     f'SentencePiece {SENTENCEPIECE_MODEL} beside it')
  by_id = sorted(model['vocab'].items(), key=lambda kv: kv[1])
  if [i for _, i in by_id] != list(range(len(by_id))):
    raise ValueError(f'{src}: WordPiece ids are not 0..{len(by_id) - 1}')
  with open(out, 'w', encoding='utf-8') as f:
    f.writelines(piece + '\n' for piece, _ in by_id)
  return out


def _hf_sentencepiece(path: str):
  try:
    return sentencepiece(path)
  except ValueError as e:
    raise ValueError(f'{path}: not an encoder_jax SentencePiece tokenizer ({e}); an HF '
                     f'directory needs a WordPiece {VOCAB_TXT} / {TOKENIZER_JSON} or the '
                     f'{SENTENCEPIECE_MODEL} of an encoder_jax export') from e


def _bpe_source(hf_dir: str) -> str | None:
  """Which file holds the HF directory's byte-level BPE, if it has one (and no vocab.txt or
  tokenizer.model): a BPE ``tokenizer.json``, else ``vocab.json`` (with ``merges.txt``)."""
  if any(os.path.exists(os.path.join(hf_dir, f)) for f in (VOCAB_TXT, SENTENCEPIECE_MODEL)):
    return None
  path = os.path.join(hf_dir, TOKENIZER_JSON)
  if os.path.exists(path):
    with open(path, encoding='utf-8') as f:
      model_type = (json.load(f).get('model') or {}).get('type')
    return TOKENIZER_JSON if model_type == 'BPE' else None
  if os.path.exists(os.path.join(hf_dir, VOCAB_JSON)):
    return VOCAB_JSON
  return None


def _hf_bytelevel_bpe(path: str):
  try:
    return bytelevel_bpe(path)
  except ValueError as e:
    raise ValueError(f'{path}: not a RoBERTa-style byte-level BPE tokenizer ({e})') from e


def write_hf_bytelevel_bpe(hf_dir: str, out_dir: str) -> str:
  """Writes ``<out_dir>/tokenizer.json`` from the HF directory's byte-level BPE.

  A ``tokenizer.json`` is copied as it is (after checking it); ``vocab.json`` + ``merges.txt``
  (GPT-2/RoBERTa's slow-tokenizer files) are built into one with RoBERTa's layout.
  """
  from tokenizers import models  # pylint: disable=g-import-not-at-top
  from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  out = os.path.join(os.path.abspath(out_dir), TOKENIZER_JSON)
  if _bpe_source(hf_dir) == TOKENIZER_JSON:
    src = os.path.join(hf_dir, TOKENIZER_JSON)
    _hf_bytelevel_bpe(src)  # Check before copying.
    if os.path.abspath(src) != out:
      shutil.copyfile(src, out)
    return out
  vocab_path, merges_path = (os.path.join(hf_dir, f) for f in (VOCAB_JSON, MERGES_TXT))
  if not os.path.exists(merges_path):
    raise FileNotFoundError(f'{hf_dir}: {VOCAB_JSON} without {MERGES_TXT}; a byte-level BPE '
                            'tokenizer needs both (or a tokenizer.json)')
  try:
    vocab, merges = models.BPE.read_file(vocab_path, merges_path)
  except Exception as e:  # The Rust reader raises its own exception type.
    raise ValueError(f'{hf_dir}: cannot read {VOCAB_JSON} + {MERGES_TXT} as BPE: {e}') from e
  partial = out + '.partial'  # Checked before it takes the name: no bad file left behind.
  try:
    tokenizer_lib.build_bytelevel_bpe(vocab, merges).save(partial)
    _hf_bytelevel_bpe(partial)
    os.replace(partial, out)
  finally:
    if os.path.exists(partial):
      os.remove(partial)
  return out


def import_hf_tokenizer(hf_dir: str, out_dir: str):
  """The HF directory's tokenizer, its file written into ``out_dir`` (vocab.txt, .model or
  tokenizer.json)."""
  os.makedirs(out_dir, exist_ok=True)
  spm = os.path.join(hf_dir, SENTENCEPIECE_MODEL)
  if not os.path.exists(os.path.join(hf_dir, VOCAB_TXT)) and os.path.exists(spm):
    out = os.path.join(os.path.abspath(out_dir), SENTENCEPIECE_MODEL)
    if os.path.abspath(spm) != out:
      shutil.copyfile(spm, out)
    return _hf_sentencepiece(out)
  if _bpe_source(hf_dir):
    return _hf_bytelevel_bpe(write_hf_bytelevel_bpe(hf_dir, out_dir))
  vocab = write_hf_vocab(hf_dir, out_dir)
  return wordpiece(os.path.abspath(vocab), hf_lowercase(hf_dir))


def load_hf_tokenizer(hf_dir: str):
  """The HF directory's tokenizer, read in place where it can be."""
  if os.path.exists(os.path.join(hf_dir, VOCAB_TXT)):
    return wordpiece(os.path.join(hf_dir, VOCAB_TXT), hf_lowercase(hf_dir))
  if os.path.exists(os.path.join(hf_dir, SENTENCEPIECE_MODEL)):
    return _hf_sentencepiece(os.path.join(hf_dir, SENTENCEPIECE_MODEL))
  if _bpe_source(hf_dir) == TOKENIZER_JSON:
    return _hf_bytelevel_bpe(os.path.join(hf_dir, TOKENIZER_JSON))
  return import_hf_tokenizer(hf_dir, tempfile.mkdtemp(prefix='vocab_'))


# --------------------------------------------------------------------------- HF export


def sentencepiece_to_hf(tok):
  """A ``tokenizers.Tokenizer`` that tokenizes as the SentencePiece ``tok`` does, BERT-style.

  Pieces and scores (Unigram) or merges (BPE), SentencePiece's own normalisation table, the
  '▁' word-boundary convention, the five special pieces, and ``[CLS] $A [SEP] $B [SEP]``.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, normalizers, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top,g-multiple-import
  proto = sentencepiece_model_pb2.ModelProto()
  with open(tok.path, 'rb') as f:
    proto.ParseFromString(f.read())
  if proto.trainer_spec.byte_fallback:
    raise ValueError(f'{tok.path}: byte_fallback SentencePiece models are not exported')
  vocab = [(p.piece, p.score) for p in proto.pieces]
  model_type = proto.trainer_spec.model_type
  if model_type == 1:  # UNIGRAM
    model = models.Unigram(vocab, unk_id=tok.unk_id, byte_fallback=False)
  elif model_type == 2:  # BPE: every split of a piece into two pieces, best piece first.
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}
    merges = []
    for piece, score in vocab:
      local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
               if piece[:k] in ids and piece[k:] in ids]
      merges += sorted(local, key=lambda m: (ids[m[0]], ids[m[1]]))
    merges.sort(key=lambda m: m[2], reverse=True)
    model = models.BPE({p: i for p, i in ids.items()}, [(a, b) for a, b, _ in merges],
                       unk_token=tok.id_to_piece(tok.unk_id), fuse_unk=True,
                       byte_fallback=False)
  else:
    raise ValueError(f'{tok.path}: SentencePiece model type {model_type}; only unigram (1) '
                     'and bpe (2) are exported')
  hf = tokenizers.Tokenizer(model)
  steps = [normalizers.Strip(left=False, right=True),
           normalizers.Replace(tokenizers.Regex(' {2,}'), '\u2581')]
  if proto.normalizer_spec.precompiled_charsmap:
    steps.insert(0, normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
  hf.normalizer = normalizers.Sequence(steps)
  prepend = 'always' if proto.normalizer_spec.add_dummy_prefix else 'never'
  hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement='\u2581', prepend_scheme=prepend)
  hf.decoder = decoders.Metaspace(replacement='\u2581', prepend_scheme=prepend)
  hf.add_special_tokens([tokenizers.AddedToken(tok.id_to_piece(i), normalized=False,
                                               special=True)
                         for i in (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id,
                                   tok.mask_id)])
  cls, sep = tok.id_to_piece(tok.cls_id), tok.id_to_piece(tok.sep_id)
  hf.post_processor = processors.TemplateProcessing(
      single=f'{cls}:0 $A:0 {sep}:0', pair=f'{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1',
      special_tokens=[(cls, tok.cls_id), (sep, tok.sep_id)])
  return hf


def bytelevel_bpe_to_hf(tok):
  """RoBERTa's ``tokenizers.Tokenizer`` for the byte-level BPE ``tok``: its ids, its merges,
  RoBERTa's post-processor (whatever post-processor the pinned file has)."""
  from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  with open(tok.path, encoding='utf-8') as f:
    merges = tokenizer_lib.bpe_merges(json.load(f))
  vocab = {tok.id_to_piece(i): i for i in range(tok.vocab_size)}
  return tokenizer_lib.build_bytelevel_bpe(vocab, merges)


def _write_bytelevel_bpe(tok, out_dir: str) -> None:
  """tokenizer.json (fast) and vocab.json + merges.txt (GPT-2's slow files) of ``tok``."""
  hf = bytelevel_bpe_to_hf(tok)
  hf.save(os.path.join(out_dir, TOKENIZER_JSON))
  vocab = {tok.id_to_piece(i): i for i in range(tok.vocab_size)}
  with open(os.path.join(out_dir, VOCAB_JSON), 'w', encoding='utf-8') as f:
    json.dump(vocab, f, ensure_ascii=False)
  merges = json.loads(hf.to_str())['model']['merges']
  with open(os.path.join(out_dir, MERGES_TXT), 'w', encoding='utf-8') as f:
    f.write('#version: 0.2\n')
    f.writelines((m if isinstance(m, str) else ' '.join(m)) + '\n' for m in merges)


def export_hf_tokenizer(tok, out_dir: str, max_length: int) -> str:
  """Writes ``tok`` so that ``AutoTokenizer.from_pretrained(out_dir)`` works; what it wrote."""
  os.makedirs(out_dir, exist_ok=True)
  specials = {k: tok.id_to_piece(getattr(tok, k.replace('_token', '_id')))
              for k in _SPECIAL_TOKENS}
  input_names = ['input_ids', 'token_type_ids', 'attention_mask']
  if tok.kind == 'bytelevel_bpe':
    _write_bytelevel_bpe(tok, out_dir)
    specials.update(bos_token=specials['cls_token'], eos_token=specials['sep_token'])
    with open(os.path.join(out_dir, SPECIAL_TOKENS_MAP), 'w', encoding='utf-8') as f:
      json.dump(specials, f, indent=2)
    cfg = {'tokenizer_class': 'RobertaTokenizer', 'add_prefix_space': False,
           'trim_offsets': True, 'errors': 'replace'}
    input_names = ['input_ids', 'attention_mask']  # RoBERTa: one segment, no type ids.
    written = (f'{TOKENIZER_JSON} + {VOCAB_JSON} + {MERGES_TXT} + {TOKENIZER_CONFIG} + '
               f'{SPECIAL_TOKENS_MAP} (byte-level BPE, RoBERTa)')
  elif tok.kind == 'wordpiece':
    shutil.copyfile(tok.path, os.path.join(out_dir, VOCAB_TXT))
    cfg = {'tokenizer_class': 'BertTokenizer', 'do_lower_case': bool(tok.lowercase)}
    written = f'{VOCAB_TXT} + {TOKENIZER_CONFIG} (WordPiece)'
  elif tok.kind == 'sentencepiece':
    shutil.copyfile(tok.path, os.path.join(out_dir, SENTENCEPIECE_MODEL))
    sentencepiece_to_hf(tok).save(os.path.join(out_dir, TOKENIZER_JSON))
    cfg = {'tokenizer_class': 'PreTrainedTokenizerFast'}
    written = (f'{TOKENIZER_JSON} + {TOKENIZER_CONFIG} (fast tokenizer) + '
               f'{SENTENCEPIECE_MODEL} (SentencePiece)')
  else:
    raise ValueError(f'tokenizer kind {tok.kind!r}; expected sentencepiece, wordpiece or '
                     'bytelevel_bpe')
  cfg.update(specials, model_max_length=int(max_length), model_input_names=input_names)
  with open(os.path.join(out_dir, TOKENIZER_CONFIG), 'w', encoding='utf-8') as f:
    json.dump(cfg, f, indent=2)
  return written
