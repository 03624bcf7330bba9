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

Import reads ``vocab.txt`` first, else our ``tokenizer.model``, else a WordPiece
``tokenizer.json``.
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


def from_path(kind: str, path: str, lowercase: bool = True):
  """A tokenizer file of ``kind`` ('sentencepiece' or 'wordpiece')."""
  from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  return tokenizer_lib.Tokenizer.from_file(kind, path, lowercase)


def kind_of_file(path: str) -> str:
  """'sentencepiece' for a ``*.model`` file, else 'wordpiece' (a ``vocab.txt``)."""
  return 'sentencepiece' if path.endswith('.model') else 'wordpiece'


# ----------------------------------------------------------------------------- workdir


def no_pinned_tokenizer_message(workdir: str) -> str:
  info = workdir_lib.path(workdir, workdir_lib.TOKENIZER_DIR, workdir_lib.TOKENIZER_INFO)
  return (f'{workdir} has no pinned tokenizer ({info} does not exist: runs started before '
          'tokenizers were pinned have none) and its config has no tokenizer.path, so the '
          'ids its checkpoints were trained on are unknown. Pin the tokenizer the run trained '
          'with (the tokenizer.model or vocab.txt in the prepared-data directory it used): '
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
    raise FileNotFoundError(f'{hf_dir}: none of {VOCAB_TXT}, {SENTENCEPIECE_MODEL} or '
                            f'{TOKENIZER_JSON}; expected the WordPiece tokenizer of a BERT '
                            'checkpoint or an encoder_jax SentencePiece export')
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


def import_hf_tokenizer(hf_dir: str, out_dir: str):
  """The HF directory's tokenizer, its file copied into ``out_dir`` (vocab.txt or .model)."""
  os.makedirs(out_dir, exist_ok=True)
  spm = os.path.join(hf_dir, SENTENCEPIECE_MODEL)
  if not os.path.exists(os.path.join(hf_dir, VOCAB_TXT)) and os.path.exists(spm):
    out = os.path.join(os.path.abspath(out_dir), SENTENCEPIECE_MODEL)
    if os.path.abspath(spm) != out:
      shutil.copyfile(spm, out)
    return _hf_sentencepiece(out)
  vocab = write_hf_vocab(hf_dir, out_dir)
  return wordpiece(os.path.abspath(vocab), hf_lowercase(hf_dir))


def load_hf_tokenizer(hf_dir: str):
  """The HF directory's tokenizer, read in place where it can be."""
  if os.path.exists(os.path.join(hf_dir, VOCAB_TXT)):
    return wordpiece(os.path.join(hf_dir, VOCAB_TXT), hf_lowercase(hf_dir))
  if os.path.exists(os.path.join(hf_dir, SENTENCEPIECE_MODEL)):
    return _hf_sentencepiece(os.path.join(hf_dir, SENTENCEPIECE_MODEL))
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


def export_hf_tokenizer(tok, out_dir: str, max_length: int) -> str:
  """Writes ``tok`` so that ``AutoTokenizer.from_pretrained(out_dir)`` works; what it wrote."""
  os.makedirs(out_dir, exist_ok=True)
  specials = {k: tok.id_to_piece(getattr(tok, k.replace('_token', '_id')))
              for k in _SPECIAL_TOKENS}
  if tok.kind == 'wordpiece':
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
    raise ValueError(f'tokenizer kind {tok.kind!r}; expected sentencepiece or wordpiece')
  cfg.update(specials, model_max_length=int(max_length),
             model_input_names=['input_ids', 'token_type_ids', 'attention_mask'])
  with open(os.path.join(out_dir, TOKENIZER_CONFIG), 'w', encoding='utf-8') as f:
    json.dump(cfg, f, indent=2)
  return written
