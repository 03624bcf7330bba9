"""Tokenizers for checkpoints: the one pinned in a workdir, and Hugging Face directories.

A workdir's tokenizer is the one pinned in ``<workdir>/tokenizer/`` when its run started
(``encoder_jax.run.workdir``), never one re-derived from the current config: the prepared-data
cache can change with the code or the config, and re-preparing a corpus to run fill-mask
would be slow anyway. A workdir without one (checkpoints copied without their
``tokenizer/``) falls back to ``config.tokenizer.path``.

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

Import takes the fixed-layout kinds where they read the directory exactly as
``AutoTokenizer`` does: a BERT ``vocab.txt`` (WordPiece), an encoder_jax SentencePiece
``tokenizer.model``, a RoBERTa-layout byte-level BPE (``tokenizer.json`` or ``vocab.json`` +
``merges.txt``). Every other directory becomes the ``hf`` kind (``hf_bundle``): the
checkpoint's ``tokenizer.json`` (any model type: WordPiece, BPE, Unigram), run by
``tokenizers``; a directory with only a slow tokenizer's files (``spiece.model``,
``spm.model``, ``sentencepiece.bpe.model``, ``vocab.json`` + ``merges.txt``) is converted
to one by ``transformers`` (what ``AutoTokenizer`` does with them). The special roles come
from its ``tokenizer_config.json`` / ``special_tokens_map.json`` (cls falls back to the
bos token, sep to the eos token), the layout of specials from the post-processor, the
padding side from the config or the tokenizer class (XLNet pads on the left); the
directory's files are kept in the bundle so that export writes them back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Callable

from encoder_jax.core import extras
from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.data import tokenizer_export
from encoder_jax.data import tokenizer_files
from encoder_jax.data import tokenizer_kinds

VOCAB_TXT = tokenizer_export.VOCAB_TXT
SENTENCEPIECE_MODEL = tokenizer_export.SENTENCEPIECE_MODEL
TOKENIZER_JSON = tokenizer_export.TOKENIZER_JSON
TOKENIZER_CONFIG = tokenizer_export.TOKENIZER_CONFIG
VOCAB_JSON = tokenizer_export.VOCAB_JSON
MERGES_TXT = tokenizer_export.MERGES_TXT
SPECIAL_TOKENS_MAP = tokenizer_export.SPECIAL_TOKENS_MAP
HF_TOKENIZER_FILE = tokenizer_files.HF_FILE  # The hf kind's file (a bundle; see hf_bundle).
# Slow-tokenizer files Hugging Face checkpoints ship (ALBERT/XLNet/T5, DeBERTa v2/v3,
# XLM-R/CamemBERT, Llama-style), besides vocab.txt and vocab.json + merges.txt.
SENTENCEPIECE_NAMES = ('spiece.model', 'spm.model', 'sentencepiece.bpe.model',
                       SENTENCEPIECE_MODEL)
# Tokenizer classes that pad on the left when their tokenizer_config.json says nothing
# (a class attribute in transformers, not saved by save_pretrained).
_LEFT_PADDING_CLASSES = frozenset({'XLNetTokenizer', 'XLNetTokenizerFast'})
# Tokenizer classes that set BERT's normalizer from their own settings (tokenizer_config.json's
# do_lower_case, strip_accents, tokenize_chinese_chars, else BertTokenizer's defaults)
# whatever tokenizer.json's normalizer says, and the model types AutoTokenizer gives one of
# them when no class is named.
_BERT_CLASSES = frozenset(f'{name}Tokenizer{fast}' for name in ('Bert', 'Electra', 'DistilBert')
                          for fast in ('', 'Fast'))
_BERT_MODEL_TYPES = frozenset({'bert', 'electra', 'distilbert'})
# (tokenizer_config.json key, BertNormalizer field, BertTokenizer's default).
_BERT_SETTINGS = (('do_lower_case', 'lowercase', True), ('strip_accents', 'strip_accents', None),
                  ('tokenize_chinese_chars', 'handle_chinese_chars', True))
# Where each role's token is named, first found wins (tokenizer_config.json, then
# special_tokens_map.json, for each key in order).
_ROLE_KEYS = (('pad', ('pad_token',)), ('unk', ('unk_token',)),
              ('cls', ('cls_token', 'bos_token')), ('sep', ('sep_token', 'eos_token')),
              ('mask', ('mask_token',)))


# --------------------------------------------------------------------- loading by kind


def wordpiece(vocab_path: str, lowercase: bool = True):
  """The input pipeline's tokenizer for a WordPiece ``vocab.txt``."""
  return tokenizer_lib.Tokenizer.from_wordpiece_vocab(vocab_path, lowercase=lowercase)


def sentencepiece(model_path: str):
  """The input pipeline's tokenizer for a SentencePiece ``.model``."""
  return tokenizer_lib.Tokenizer.from_sentencepiece(model_path)


def bytelevel_bpe(json_path: str):
  """The input pipeline's tokenizer for a byte-level BPE ``tokenizer.json``."""
  return tokenizer_lib.Tokenizer.from_bytelevel_bpe(json_path)


def from_path(kind: str, path: str, lowercase: bool = True):
  """A tokenizer file of ``kind`` (one of ``data.tokenizer_kinds.KINDS``)."""
  return tokenizer_lib.Tokenizer.from_file(kind, path, lowercase)


kind_of_file = tokenizer_kinds.kind_of_file


# --------------------------------------------------------------------------- HF import


def bert_settings(hf_dir: str) -> dict | None:
  """The BertNormalizer fields ``AutoTokenizer`` sets for the directory's tokenizer class:
  ``{'lowercase', 'strip_accents', 'handle_chinese_chars'}`` from tokenizer_config.json
  with BertTokenizer's defaults (lowercasing, accents stripped when lowercasing, CJK
  characters split); None when its class is not a BERT WordPiece one (then tokenizer.json's
  normalizer stands). A Chinese checkpoint whose tokenizer_config.json names no
  do_lower_case (hfl's say only ``{"init_inputs": []}``) lowercases, whatever its
  tokenizer.json says."""
  config = _read_json(os.path.join(hf_dir, TOKENIZER_CONFIG))
  model_config = _read_json(os.path.join(hf_dir, 'config.json'))
  name = config.get('tokenizer_class') or model_config.get('tokenizer_class')
  if not (str(name) in _BERT_CLASSES if name
          else model_config.get('model_type') in _BERT_MODEL_TYPES):
    return None
  out = {}
  for key, field, default in _BERT_SETTINGS:
    value = config.get(key, default)
    out[field] = value if field == 'strip_accents' else bool(default if value is None else value)
  return out


def _effective_spec(spec: dict, hf_dir: str) -> dict:
  """``spec`` (a tokenizer.json dict) with the BertNormalizer fields ``AutoTokenizer`` sets
  for the directory's class (``bert_settings``), as it runs it."""
  settings = bert_settings(hf_dir)
  norm = spec.get('normalizer') or {}
  if settings is None or norm.get('type') != 'BertNormalizer':
    return spec
  return dict(spec, normalizer=dict(norm, **settings))


def hf_lowercase(hf_dir: str) -> bool:
  """Whether the HF tokenizer lowercases, as ``AutoTokenizer`` runs it: a BERT tokenizer
  class by its settings (``bert_settings``), else tokenizer_config.json, else
  tokenizer.json."""
  settings = bert_settings(hf_dir)
  if settings is not None:
    return settings['lowercase']
  cfg = _read_json(os.path.join(hf_dir, TOKENIZER_CONFIG))
  if 'do_lower_case' in cfg:
    return bool(cfg['do_lower_case'])
  normalizer = _read_json(os.path.join(hf_dir, TOKENIZER_JSON)).get('normalizer') or {}
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
  model = _read_json(src).get('model') or {}
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
  if os.path.exists(os.path.join(hf_dir, TOKENIZER_JSON)):
    return TOKENIZER_JSON if _model_type(hf_dir) == 'BPE' else None
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
  return _write_checked(out, lambda partial: tokenizer_files.build_bytelevel_bpe(
      vocab, merges).save(partial), _hf_bytelevel_bpe)


def _write_checked(out: str, write: Callable[[str], object],
                   check: Callable[[str], object]) -> str:
  """``out``, written by ``write(partial)`` and checked by ``check(partial)`` before it
  takes the name: no bad file is left behind."""
  partial = out + '.partial'
  try:
    write(partial)
    check(partial)
    os.replace(partial, out)
  finally:
    if os.path.exists(partial):
      os.remove(partial)
  return out


def _read_json(path: str) -> dict:
  """The JSON object in a Hugging Face directory's file ({} when there is none); a clear
  error when it is not one. Every read of the directory's JSON files goes through it."""
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding='utf-8') as f:
      out = json.load(f)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise ValueError(f'{path}: not readable JSON ({e}); expected the file save_pretrained '
                     'writes') from e
  if not isinstance(out, dict):
    raise ValueError(f'{path}: a JSON {type(out).__name__}; expected an object')
  return out


def _model_type(hf_dir: str) -> str | None:
  """The model type of the directory's tokenizer.json ('WordPiece', 'BPE', ...); None
  without one."""
  return (_read_json(os.path.join(hf_dir, TOKENIZER_JSON)).get('model') or {}).get('type')


def _token_text(value) -> str | None:
  """A special token as tokenizer_config.json / special_tokens_map.json spell it: a string,
  or an AddedToken dict with its ``content``."""
  if isinstance(value, dict):
    value = value.get('content')
  return value if isinstance(value, str) and value else None


def _named_token(config: dict, special_map: dict, keys) -> str | None:
  """The token the first of ``keys`` names, in tokenizer_config.json, then
  special_tokens_map.json; None if neither names one."""
  return next((t for key in keys for t in (_token_text(config.get(key)),
                                           _token_text(special_map.get(key))) if t), None)


def _plain_bert_wordpiece(hf_dir: str) -> bool:
  """Whether the wordpiece kind (BERT's basic + WordPiece tokenizer: clean text, Chinese
  characters split, accents stripped when lowercasing, BERT's special tokens) reads the
  directory as AutoTokenizer does; other settings go to the hf kind."""
  config = _read_json(os.path.join(hf_dir, TOKENIZER_CONFIG))
  special_map = _read_json(os.path.join(hf_dir, SPECIAL_TOKENS_MAP))
  for key, piece in tokenizer_export.SPECIAL_TOKENS.items():
    if _named_token(config, special_map, (key,)) not in (None, piece):
      return False
  if config.get('strip_accents') is not None or not config.get('tokenize_chinese_chars', True):
    return False
  spec_path = os.path.join(hf_dir, TOKENIZER_JSON)
  if not os.path.exists(spec_path):
    return True
  spec = _effective_spec(_read_json(spec_path), hf_dir)
  norm, pre = spec.get('normalizer') or {}, spec.get('pre_tokenizer') or {}
  model = spec.get('model') or {}
  return (norm.get('type') == 'BertNormalizer' and norm.get('clean_text', True)
          and norm.get('handle_chinese_chars', True) and norm.get('strip_accents') is None
          and bool(norm.get('lowercase', True)) == hf_lowercase(hf_dir)
          and pre.get('type') == 'BertPreTokenizer'
          and model.get('continuing_subword_prefix', '##') == '##')


def _reads_as_wordpiece(hf_dir: str) -> bool:
  """A ``vocab.txt`` (and no other model type in tokenizer.json) with BERT's settings."""
  model_type = _model_type(hf_dir)  # First: a broken tokenizer.json is an error here.
  return (os.path.exists(os.path.join(hf_dir, VOCAB_TXT))
          and model_type in (None, 'WordPiece') and _plain_bert_wordpiece(hf_dir))


def _reads_as_sentencepiece(hf_dir: str) -> bool:
  """A ``tokenizer.model`` with encoder_jax's fixed ids (else the hf kind reads it)."""
  path = os.path.join(hf_dir, SENTENCEPIECE_MODEL)
  if not os.path.exists(path):
    return False
  try:
    tokenizer_lib.Tokenizer.from_sentencepiece(path)
    return True
  except ValueError:
    return False  # Not our fixed ids: the hf kind reads it.


def _reads_as_bytelevel_bpe(hf_dir: str) -> bool:
  """A byte-level BPE with RoBERTa's layout (``tokenizer.json`` or ``vocab.json`` +
  ``merges.txt``)."""
  source = _bpe_source(hf_dir)
  if not source:
    return False
  try:
    if source == TOKENIZER_JSON:
      tokenizer_lib.Tokenizer.from_bytelevel_bpe(os.path.join(hf_dir, TOKENIZER_JSON))
    else:
      with tempfile.TemporaryDirectory(prefix='bpe_') as scratch:
        write_hf_bytelevel_bpe(hf_dir, scratch)
    return True
  except (ValueError, FileNotFoundError):
    return False  # Another layout (special tokens elsewhere, added tokens): the hf kind.


def _copy_sentencepiece(hf_dir: str, out_dir: str) -> str:
  spm = os.path.join(hf_dir, SENTENCEPIECE_MODEL)
  out = os.path.join(os.path.abspath(out_dir), SENTENCEPIECE_MODEL)
  if os.path.abspath(spm) != out:
    shutil.copyfile(spm, out)
  return out


@dataclasses.dataclass(frozen=True)
class _Import:
  """How a fixed-layout kind takes a Hugging Face directory.

  Attributes:
    reads: whether the kind reads the directory exactly as ``AutoTokenizer`` does.
    write: ``(hf_dir, out_dir) -> its file``, written into ``out_dir``.
    in_place: its file inside ``hf_dir`` when it can be read there, else None.
    open: ``(its file, hf_dir) -> Tokenizer``, with an error naming the directory's file.
  """
  reads: Callable[[str], bool]
  write: Callable[[str, str], str]
  in_place: Callable[[str], str | None]
  open: Callable[[str, str], object]


# The fixed-layout kinds, in the order tried; a directory none reads becomes the hf kind
# (hf_bundle), which reads every tokenizer.json.
_IMPORTS = {
    'wordpiece': _Import(
        _reads_as_wordpiece, lambda d, out: os.path.abspath(write_hf_vocab(d, out)),
        lambda d: os.path.join(d, VOCAB_TXT), lambda path, d: wordpiece(path, hf_lowercase(d))),
    'sentencepiece': _Import(
        _reads_as_sentencepiece, _copy_sentencepiece,
        lambda d: os.path.join(d, SENTENCEPIECE_MODEL), lambda path, d: _hf_sentencepiece(path)),
    'bytelevel_bpe': _Import(
        _reads_as_bytelevel_bpe, write_hf_bytelevel_bpe,
        lambda d: (os.path.join(d, TOKENIZER_JSON) if _bpe_source(d) == TOKENIZER_JSON
                   else None),
        lambda path, d: _hf_bytelevel_bpe(path)),
}


def _fixed_kind(hf_dir: str) -> str | None:
  """The fixed-layout kind that reads ``hf_dir`` as ``AutoTokenizer`` does, or None."""
  return next((kind for kind, how in _IMPORTS.items() if how.reads(hf_dir)), None)


def _hf_tokenizer_spec(hf_dir: str) -> tuple[dict, str]:
  """(the tokenizer.json dict, where it came from): the directory's own tokenizer.json, or
  the one ``transformers`` converts a slow tokenizer's files to (as ``AutoTokenizer``)."""
  path = os.path.join(hf_dir, TOKENIZER_JSON)
  if os.path.exists(path):
    return _read_json(path), path
  slow = [f for f in (*SENTENCEPIECE_NAMES, VOCAB_JSON, VOCAB_TXT)
          if os.path.exists(os.path.join(hf_dir, f))]
  if not slow:
    raise FileNotFoundError(
        f'{hf_dir}: no tokenizer files; expected a {TOKENIZER_JSON}, a SentencePiece model '
        f'({", ".join(SENTENCEPIECE_NAMES)}), {VOCAB_JSON} + {MERGES_TXT} or {VOCAB_TXT}, '
        'as save_pretrained writes them')
  if VOCAB_JSON in slow and not os.path.exists(os.path.join(hf_dir, MERGES_TXT)):
    raise FileNotFoundError(f'{hf_dir}: {VOCAB_JSON} without {MERGES_TXT}; a BPE tokenizer '
                            'needs both (or a tokenizer.json)')
  if not any(os.path.exists(os.path.join(hf_dir, f)) for f in (TOKENIZER_CONFIG, 'config.json')):
    raise ValueError(f'{hf_dir}: {" + ".join(slow)} without a {TOKENIZER_JSON}, and no '
                     f'{TOKENIZER_CONFIG} or config.json to say which tokenizer class reads '
                     'them (as AutoTokenizer needs); save the tokenizer with save_pretrained')
  transformers = extras.require('transformers', extra='peers', what=(
      f'{hf_dir}: {" + ".join(slow)} without a {TOKENIZER_JSON}; converting a slow tokenizer '
      'as AutoTokenizer does needs transformers (or save the tokenizer with a fast '
      "tokenizer's save_pretrained)"))
  try:
    auto = transformers.AutoTokenizer.from_pretrained(hf_dir, use_fast=True)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'{hf_dir}: transformers could not load its tokenizer ({" + ".join(slow)}): '
                     f'{e}') from e
  backend = getattr(auto, 'backend_tokenizer', None)
  if backend is None:
    raise ValueError(f'{hf_dir}: transformers gives no fast tokenizer for {" + ".join(slow)}; '
                     f'expected a {TOKENIZER_JSON} beside it')
  return json.loads(backend.to_str()), f'{" + ".join(slow)} (converted by transformers)'


def _template_processing(node: dict, where: str):
  """The Template of a ``TemplateProcessing`` post-processor (its special tokens' ids)."""
  specials = node.get('special_tokens') or {}

  def items(seq):
    out = []
    for item in seq:
      if 'Sequence' in item:
        out.append((item['Sequence']['id'], int(item['Sequence'].get('type_id', 0))))
      else:
        name = item['SpecialToken']['id']
        if name not in specials:
          raise ValueError(f'{where}: the post-processor uses {name!r} but does not list '
                           'its ids in special_tokens')
        out += [(int(i), int(item['SpecialToken'].get('type_id', 0)))
                for i in specials[name]['ids']]
    return tuple(out)
  return tokenizer_files.Template(items(node['single']), items(node['pair']))


# The post-processors that place specials, by their type in a tokenizer.json.
_POST_PROCESSORS = {
    'TemplateProcessing': _template_processing,
    'RobertaProcessing': lambda node, where: tokenizer_files.Template.roberta(
        int(node['cls'][1]), int(node['sep'][1])),
    'BertProcessing': lambda node, where: tokenizer_files.Template.bert(
        int(node['cls'][1]), int(node['sep'][1])),
}


def _template_from(spec: dict, where: str):
  """The specials' layout (a ``data.tokenizer_files.Template``) of a tokenizer.json's
  post-processor: TemplateProcessing, RobertaProcessing or BertProcessing, also inside a
  Sequence; none (no specials added) when it has no such processor, as AutoTokenizer."""
  post = spec.get('post_processor') or {}
  nodes = post.get('processors') or [] if post.get('type') == 'Sequence' else [post]
  for node in nodes:
    read = _POST_PROCESSORS.get(node.get('type'))
    if read is not None:
      return read(node, where)
  return tokenizer_files.Template((('A', 0),), (('A', 0), ('B', 1)))


def hf_bundle(hf_dir: str) -> dict:
  """The ``hf`` kind's file content for a Hugging Face directory: its tokenizer.json (or the
  conversion of its slow files), the special roles read from its files, the specials'
  layout, the padding side, and its tokenizer_config.json / special_tokens_map.json as
  they are (export writes them back). Raises, naming the file, when a role has no token."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  spec, source = _hf_tokenizer_spec(hf_dir)
  spec = _effective_spec(spec, hf_dir)
  try:
    backend = tokenizers.Tokenizer.from_str(json.dumps(spec))
  except Exception as e:  # The Rust loader raises its own exception type.
    raise ValueError(f'{source}: does not load in tokenizers ({e}); expected a tokenizer.json '
                     'as save_pretrained writes it') from e
  config = _read_json(os.path.join(hf_dir, TOKENIZER_CONFIG))
  special_map = _read_json(os.path.join(hf_dir, SPECIAL_TOKENS_MAP))
  roles, pieces = {}, {}
  for role, keys in _ROLE_KEYS:
    named = _named_token(config, special_map, keys)
    if named is None and role == 'unk':  # The model's own unknown piece, if it has one.
      model = spec.get('model') or {}
      named = model.get('unk_token') or (backend.id_to_token(model['unk_id'])
                                         if model.get('unk_id') is not None else None)
    if named is None:
      raise ValueError(
          f'{hf_dir}: no {role} token: neither {TOKENIZER_CONFIG} nor {SPECIAL_TOKENS_MAP} '
          f'names a {" or ".join(keys)}; encoder_jax needs the pad, unk, cls, sep and mask '
          'tokens of the checkpoint')
    token_id = backend.token_to_id(named)
    if token_id is None:
      raise ValueError(f'{hf_dir}: the {role} token {named!r} named in {TOKENIZER_CONFIG} / '
                       f'{SPECIAL_TOKENS_MAP} is not in the vocabulary of {source}')
    roles[role], pieces[role] = int(token_id), named
  tokenizer_class = str(config.get('tokenizer_class') or '')
  padding_side = config.get('padding_side') or (
      'left' if tokenizer_class in _LEFT_PADDING_CLASSES
      or ((spec.get('padding') or {}).get('direction') == 'Left') else 'right')
  keep = {k: v for k, v in config.items()
          if k not in ('name_or_path', 'is_local', 'local_files_only', 'added_tokens_decoder')}
  return {'format': tokenizer_files.HF_FORMAT, 'source': source, 'tokenizer': spec,
          'roles': roles, 'role_pieces': pieces,
          'template': _template_from(spec, source).to_json(), 'padding_side': padding_side,
          'word_start': list(tokenizer_files.word_start_scheme(spec)),
          'tokenizer_config': keep, 'special_tokens_map': special_map}


def write_hf_bundle(hf_dir: str, out_dir: str) -> str:
  """Writes ``<out_dir>/hf_tokenizer.json`` (see :func:`hf_bundle`); its path."""
  bundle = hf_bundle(hf_dir)
  os.makedirs(out_dir, exist_ok=True)
  out = os.path.join(os.path.abspath(out_dir), HF_TOKENIZER_FILE)

  def write(partial):
    with open(partial, 'w', encoding='utf-8') as f:
      json.dump(bundle, f, ensure_ascii=False, sort_keys=True)

  return _write_checked(out, write, tokenizer_lib.Tokenizer.from_hf_json)


def import_hf_tokenizer(hf_dir: str, out_dir: str):
  """The HF directory's tokenizer, its file written into ``out_dir`` (vocab.txt, .model,
  tokenizer.json or hf_tokenizer.json)."""
  os.makedirs(out_dir, exist_ok=True)
  kind = _fixed_kind(hf_dir)
  if kind is None:
    return tokenizer_lib.Tokenizer.from_hf_json(write_hf_bundle(hf_dir, out_dir))
  how = _IMPORTS[kind]
  return how.open(how.write(hf_dir, out_dir), hf_dir)


def load_hf_tokenizer(hf_dir: str):
  """The HF directory's tokenizer, read in place where it can be."""
  kind = _fixed_kind(hf_dir)
  where = _IMPORTS[kind].in_place(hf_dir) if kind is not None else None
  if where is None:
    return import_hf_tokenizer(hf_dir, tempfile.mkdtemp(prefix='tokenizer_'))
  return _IMPORTS[kind].open(where, hf_dir)


# --------------------------------------------------------------------------- HF export

sentencepiece_to_hf = tokenizer_export.sentencepiece_to_hf
bytelevel_bpe_to_hf = tokenizer_export.bytelevel_bpe_to_hf


def export_hf_tokenizer(tok, out_dir: str, max_length: int) -> str:
  """Writes ``tok`` so that ``AutoTokenizer.from_pretrained(out_dir)`` works (its kind's
  ``TokenizerKind.export_hf``); what it wrote."""
  os.makedirs(out_dir, exist_ok=True)
  return tokenizer_kinds.get(tok.kind, f' for {tok.path!r}').export_hf(tok, out_dir, max_length)
