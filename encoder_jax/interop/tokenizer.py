"""Tokenizers for checkpoints: a Hugging Face directory's WordPiece vocabulary, or a run's.

An HF BERT directory carries ``vocab.txt`` and/or ``tokenizer.json`` (WordPiece); both
become one ``vocab.txt`` (one piece per line, line number = id) that the input pipeline's
``Tokenizer.from_wordpiece_vocab`` reads (``config.tokenizer.kind='wordpiece'``).
"""

from __future__ import annotations

import json
import os
import shutil

import ml_collections

VOCAB_TXT = 'vocab.txt'
TOKENIZER_JSON = 'tokenizer.json'
TOKENIZER_CONFIG = 'tokenizer_config.json'


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
    raise FileNotFoundError(f'{hf_dir}: neither {VOCAB_TXT} nor {TOKENIZER_JSON}; expected the '
                            'WordPiece tokenizer of a BERT checkpoint')
  with open(src) as f:
    model = json.load(f).get('model') or {}
  if model.get('type') != 'WordPiece':
    raise ValueError(f'{src}: tokenizer model type {model.get("type")!r}; expected '
                     "'WordPiece' (a BERT tokenizer)")
  by_id = sorted(model['vocab'].items(), key=lambda kv: kv[1])
  if [i for _, i in by_id] != list(range(len(by_id))):
    raise ValueError(f'{src}: WordPiece ids are not 0..{len(by_id) - 1}')
  with open(out, 'w', encoding='utf-8') as f:
    f.writelines(piece + '\n' for piece, _ in by_id)
  return out


def write_hf_tokenizer_files(vocab_path: str, out_dir: str, lowercase: bool,
                             max_length: int) -> None:
  """vocab.txt + tokenizer_config.json so ``AutoTokenizer.from_pretrained(out_dir)`` works."""
  shutil.copyfile(vocab_path, os.path.join(out_dir, VOCAB_TXT))
  with open(os.path.join(out_dir, TOKENIZER_CONFIG), 'w') as f:
    json.dump({'tokenizer_class': 'BertTokenizer', 'do_lower_case': lowercase,
               'model_max_length': max_length, 'unk_token': '[UNK]', 'sep_token': '[SEP]',
               'pad_token': '[PAD]', 'cls_token': '[CLS]', 'mask_token': '[MASK]'}, f, indent=2)


def wordpiece(vocab_path: str, lowercase: bool = True):
  """The input pipeline's tokenizer for a WordPiece ``vocab.txt``."""
  from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  return tokenizer_lib.Tokenizer.from_wordpiece_vocab(vocab_path, lowercase=lowercase)


def for_config(config: ml_collections.ConfigDict):
  """The tokenizer a run config names (``config.tokenizer``)."""
  t = config.tokenizer
  if t.path:
    if not os.path.exists(t.path):
      raise FileNotFoundError(f'config.tokenizer.path={t.path!r} does not exist')
    if t.kind == 'wordpiece':
      return wordpiece(t.path, bool(t.lowercase))
    from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    return tokenizer_lib.Tokenizer.from_sentencepiece(t.path)
  from encoder_jax import data  # pylint: disable=g-import-not-at-top
  return data.load_or_prepare(config).tokenizer
