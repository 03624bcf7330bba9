"""Labelled examples for fine-tuning: tfds, TSV or JSONL in; padded int32 arrays out.

Sequence classification: the tokenizer's frame, ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b
[SEP]`` (segment ids 0/1) for BERT, each imported checkpoint's own (``<s> a </s></s> b
</s>``, XLNet's ``a <sep> b <sep> <cls>`` padded on the left), the longer text truncated
first, as Hugging Face does. Token classification: each word is tokenized on its own and
its label goes on its *first* piece; other pieces, the specials and padding get label -1
(ignored by the loss and the metrics). Words past ``max_len``
are dropped with their labels. Nothing is cut silently: :func:`encode_with_report`
counts the truncated examples, the tokens and words cut, for the log and the metrics.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from typing import Any, Sequence

import ml_collections
import numpy as np

from encoder_jax.data import tokenizer as tokenizer_lib

IGNORE = -1


@dataclasses.dataclass
class Examples:
  """Raw examples of one split; labels already mapped to class ids."""
  texts: list[tuple[str, ...]] = dataclasses.field(default_factory=list)  # Sequence task.
  labels: list[int] = dataclasses.field(default_factory=list)
  words: list[list[str]] = dataclasses.field(default_factory=list)  # Token task.
  tags: list[list[int]] = dataclasses.field(default_factory=list)

  def __len__(self):
    return len(self.labels) if self.texts else len(self.words)


def _decode(x) -> Any:
  if isinstance(x, bytes):
    return x.decode('utf-8')
  if isinstance(x, np.ndarray):
    return [_decode(v) for v in x.tolist()]
  if isinstance(x, list):
    return [_decode(v) for v in x]
  if isinstance(x, np.generic):
    return x.item()
  return x


def read_rows(spec: str, data_config: ml_collections.ConfigDict, label_keys: Sequence[str]
               ) -> tuple[list[dict], dict[str, list[str]]]:
  """Rows as dicts, and the label names tfds declares for ``label_keys`` (if any)."""
  kind, _, rest = spec.partition(':')
  if kind == 'tsv' or kind == 'jsonl':
    if not os.path.exists(rest):
      raise FileNotFoundError(f'config.data: {spec!r}: {rest} does not exist')
    with open(rest, encoding='utf-8', newline='') as f:
      if kind == 'tsv':
        return list(csv.DictReader(f, delimiter='\t', quoting=csv.QUOTE_NONE)), {}
      return [json.loads(line) for line in f if line.strip()], {}
  if kind == 'tfds':
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    name, _, split = rest.rpartition(':')
    if not name or not split:
      raise ValueError(f"config.data: {spec!r}; expected 'tfds:NAME:SPLIT', e.g. "
                       "'tfds:glue/sst2:train'")
    builder = tfds.builder(name, data_dir=data_config.tfds_data_dir or None)
    builder.download_and_prepare()  # A no-op when prepared (no network needed then).
    names = {}
    for key in label_keys:
      feature = builder.info.features[key] if key in builder.info.features else None
      feature = getattr(feature, 'feature', feature)  # Sequence(ClassLabel) -> ClassLabel.
      if hasattr(feature, 'names'):
        names[key] = list(feature.names)
    rows = [{k: _decode(v) for k, v in ex.items()}
            for ex in tfds.as_numpy(builder.as_dataset(split=split))]
    return rows, names
  raise ValueError(f"config.data: {spec!r}; expected 'tfds:NAME:SPLIT', 'tsv:PATH' or "
                   "'jsonl:PATH'")


def field(row: dict, key: str, spec: str):
  if key not in row:
    raise KeyError(f'config.data: {spec!r} has no field {key!r}; it has {sorted(row)}')
  return row[key]


def label_mapper(names: Sequence[str]):
  index = {str(n): i for i, n in enumerate(names)}

  def to_id(value, spec: str) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
      if names and not 0 <= int(value) < len(names):
        raise ValueError(f'{spec}: label {value} outside 0..{len(names) - 1} ({list(names)})')
      return int(value)
    if str(value) in index:
      return index[str(value)]
    if str(value).lstrip('-').isdigit() and not names:
      return int(value)
    raise ValueError(f'{spec}: label {value!r} is not one of config.data.labels {list(names)}')
  return to_id


def read(spec: str, task: str, data_config: ml_collections.ConfigDict,
         label_names: Sequence[str] | None = None) -> tuple[Examples, list[str]]:
  """(examples, label names) of one split. ``label_names`` (from train) fixes the mapping."""
  d = data_config
  label_key = d.tags_field if task == 'token_classification' else d.label_field
  rows, declared = read_rows(spec, d, [label_key])
  if not rows:
    raise ValueError(f'config.data: {spec!r} has no examples')
  if task == 'sequence_regression':  # A real-valued score per text (STS-B): no label names.
    out = Examples()
    for r in rows:
      out.texts.append(tuple(str(field(r, k, spec)) for k in d.text_fields))
      value = field(r, label_key, spec)
      try:
        out.labels.append(float(value))
      except (TypeError, ValueError) as e:
        raise ValueError(f'{spec}: label {value!r} is not a number (task '
                         'sequence_regression)') from e
    return out, []
  names = list(label_names or d.labels or declared.get(label_key, []))
  if not names:  # Strings or ints in the file: the sorted set of the values seen.
    values = [field(r, label_key, spec) for r in rows]
    flat = [v for x in values for v in (x.split() if isinstance(x, str) and task ==
                                         'token_classification' else
                                         (x if isinstance(x, list) else [x]))]
    names = [str(v) for v in sorted(set(flat), key=lambda v: (str(type(v)), v))]
    if all(str(n).lstrip('-').isdigit() for n in names):
      names = [str(i) for i in range(max(int(n) for n in names) + 1)]
  to_id = label_mapper(names)
  out = Examples()
  for r in rows:
    if task == 'sequence_classification':
      out.texts.append(tuple(str(field(r, k, spec)) for k in d.text_fields))
      out.labels.append(to_id(field(r, label_key, spec), spec))
    else:
      words, tags = field(r, d.tokens_field, spec), field(r, label_key, spec)
      words = words.split() if isinstance(words, str) else list(words)
      tags = tags.split() if isinstance(tags, str) else list(tags)
      if len(words) != len(tags):
        raise ValueError(f'{spec}: an example has {len(words)} words but {len(tags)} tags')
      out.words.append([str(w) for w in words])
      out.tags.append([to_id(t, spec) for t in tags])
  return out, names


@dataclasses.dataclass
class Truncation:
  """What :func:`encode_with_report` cut from one split to fit ``max_len``."""
  task: str
  max_len: int
  examples: int = 0
  truncated_examples: int = 0
  dropped_tokens: int = 0  # Sequence task: pieces cut from the texts.
  words: int = 0  # Token task: words in the split, and those dropped with their labels.
  dropped_words: int = 0
  longest: int = 0  # Tokens of the longest example before truncation, [CLS]/[SEP] included.

  def summary(self, split: str) -> str:
    if not self.truncated_examples:
      return (f'{split}: {self.examples} examples, none longer than max_len={self.max_len} '
              'tokens')
    if self.task == 'token_classification':
      cut = (f'{self.dropped_words} of {self.words} words dropped with their labels (not '
             'trained on / not scored)')
    else:
      cut = f'{self.dropped_tokens} tokens cut'
    return (f'{split}: {self.truncated_examples} of {self.examples} examples longer than '
            f'max_len={self.max_len} tokens were truncated, {cut}; the longest has '
            f'{self.longest} tokens (raise config.data.max_len to keep more)')

  def metrics(self) -> dict[str, int]:
    out = {'truncated_examples': self.truncated_examples}
    if self.task == 'token_classification':
      out['dropped_words'] = self.dropped_words
    else:
      out['dropped_tokens'] = self.dropped_tokens
    return out


def encode(examples: Examples, tokenizer, task: str, max_len: int) -> dict[str, np.ndarray]:
  """int32 ``input_ids, segment_ids, input_mask`` [N, max_len] and ``labels`` [N] or [N, L]."""
  return encode_with_report(examples, tokenizer, task, max_len)[0]


def encode_with_report(examples: Examples, tokenizer, task: str, max_len: int
                       ) -> tuple[dict[str, np.ndarray], Truncation]:
  """:func:`encode`'s arrays, and what was truncated to fit ``max_len``."""
  n = len(examples)
  report = Truncation(task=task, max_len=max_len, examples=n)
  rows, segments = [], []
  if task != 'token_classification':
    labels = np.asarray(examples.labels,
                        np.float32 if task == 'sequence_regression' else np.int32)
    for texts in examples.texts:
      parts = [tokenizer.encode(t) for t in texts]
      a, b = parts[0], (parts[1] if len(parts) > 1 else None)
      added = tokenizer.num_added(b is not None)
      report.longest = max(report.longest, sum(map(len, parts)) + added)
      cut = tokenizer_lib.truncate_longest_first(a, b, max_len - added)
      report.truncated_examples += cut > 0
      report.dropped_tokens += cut
      row, segs = tokenizer.frame(a, b)
      rows.append(row)
      segments.append(segs)
    ids, seg, mask = tokenizer.pad(rows, segments, max_len)
  else:
    row_labels_all = []
    added = tokenizer.num_added()
    for words, tags in zip(examples.words, examples.tags):
      body, body_labels = [], []
      pieces_per_word = [p or [tokenizer.unk_id]
                         for p in (tokenizer.encode_batch(list(words)) if words else [])]
      report.words += len(words)
      report.longest = max(report.longest, sum(map(len, pieces_per_word)) + added)
      for k, (pieces, tag) in enumerate(zip(pieces_per_word, tags)):
        if len(body) + len(pieces) > max_len - added:  # Truncated: the rest are dropped.
          report.truncated_examples += 1
          report.dropped_words += len(words) - k
          break
        body += pieces
        body_labels += [tag] + [IGNORE] * (len(pieces) - 1)
      row, segs = tokenizer.frame(body)
      # The labels follow the body through the frame; the specials get IGNORE.
      marked, _ = tokenizer.frame([-1 - k for k in range(len(body))])
      row_labels_all.append([body_labels[-1 - m] if m < 0 else IGNORE for m in marked])
      rows.append(row)
      segments.append(segs)
    ids, seg, mask = tokenizer.pad(rows, segments, max_len)
    labels, _, _ = tokenizer.pad(row_labels_all, None, max_len)
    labels = np.where(mask > 0, labels, IGNORE).astype(np.int32)
  arrays = {'input_ids': ids, 'segment_ids': seg, 'input_mask': mask, 'labels': labels}
  return arrays, report


def pack(arrays: dict[str, np.ndarray], order: np.ndarray | None = None
         ) -> dict[str, np.ndarray]:
  """Encoded sequence-task examples -> packed rows of the same width: examples (in
  ``order``) back to back, each keeping its own frame and segment ids, numbered
  ``document_ids`` 1, 2, ... in its row (0 = padding); a row is closed when the next
  example does not fit. ``labels`` [N, L // 3] holds example d's label in slot d - 1 (the
  rest -1): what ``heads.Classifier`` reads with ``document_ids_BxL``, and what
  ``task.loss_and_accuracy`` weighs (ignoring -1). Each example reads as if alone
  (``models.packing``), so the loss is the same as on padded rows; only the padding goes."""
  ids, seg, mask = arrays['input_ids'], arrays['segment_ids'], arrays['input_mask']
  n, width = ids.shape
  order = np.arange(n) if order is None else np.asarray(order)
  lengths = mask.sum(1)
  rows, row, used = [], [], 0
  for i in order:
    if used + lengths[i] > width:
      rows.append(row)
      row, used = [], 0
    row.append(int(i))
    used += int(lengths[i])
  if row:
    rows.append(row)
  out = {k: np.zeros((len(rows), width), np.int32)
         for k in ('input_ids', 'segment_ids', 'input_mask', 'document_ids')}
  out['labels'] = np.full((len(rows), width // 3), IGNORE, arrays['labels'].dtype)
  for r, members in enumerate(rows):
    pos = 0
    for d, i in enumerate(members):
      k = int(lengths[i])
      out['input_ids'][r, pos:pos + k] = ids[i, :k]
      out['segment_ids'][r, pos:pos + k] = seg[i, :k]
      out['input_mask'][r, pos:pos + k] = 1
      out['document_ids'][r, pos:pos + k] = d + 1
      out['labels'][r, d] = arrays['labels'][i]
      pos += k
  return out


def batches(arrays: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator | None,
            order: np.ndarray | None = None, first: int = 0):
  """Fixed-size batches; the last one padded with weight-0 rows. In ``order`` if given
  (else shuffled if ``rng``), from batch number ``first`` on (a resumed epoch)."""
  n = len(arrays['input_ids'])
  if order is None:
    order = rng.permutation(n) if rng is not None else np.arange(n)
  for start in range(first * batch_size, n, batch_size):
    idx = order[start:start + batch_size]
    batch = {k: v[idx] for k, v in arrays.items()}
    batch['weights'] = np.ones(len(idx), np.float32)
    if len(idx) < batch_size:
      pad = batch_size - len(idx)
      batch = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)])
               for k, v in batch.items()}
      if 'labels' in batch and batch['labels'].ndim == 2:
        batch['labels'][-pad:] = IGNORE
    yield batch
