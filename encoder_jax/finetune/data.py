"""What fine-tuning tasks read and train on: rows in, padded int32 arrays out, batches.

The tasks' readers (``finetune.tasks``) build on these: :func:`read_rows` (tfds, TSV or
JSONL rows, the spec parsed by ``data.sources.split_spec``), label names and ids,
:func:`encode_texts` (texts or pairs in the tokenizer's frame, ``[CLS] a [SEP] b [SEP]``
for BERT, each imported checkpoint's own, the longer text truncated first as Hugging Face
does), :class:`Truncation` (nothing is cut silently: the truncated examples, tokens and
words cut are counted for the log and the metrics), :func:`prepare_labelled` (train, eval
and more_evals of a labelled task) into a :class:`Prepared`. For the engine:
:func:`pack` (whole examples packed into rows, ``data.builders.packing.greedy_bins``),
:func:`batches` and :class:`EpochBatches` (the epochs' batches, with the checkpointed
position).
"""

from __future__ import annotations

import csv
import dataclasses
import json
from typing import Any, Sequence

import ml_collections
import numpy as np
from absl import logging

from encoder_jax.data import sources
from encoder_jax.data.builders import packing
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


KINDS = ('tsv', 'jsonl', 'tfds')  # Source kinds of a labelled split.
EXPECTED = "'tfds:NAME:SPLIT[;data_dir=DIR][;prepare=true]', 'tsv:PATH' or 'jsonl:PATH'"


def read_rows(spec: str, data_config: ml_collections.ConfigDict, label_keys: Sequence[str]
              ) -> tuple[list[dict], dict[str, list[str]]]:
  """Rows as dicts, and the label names tfds declares for ``label_keys`` (if any); the spec
  parsed by the sources' one parser (``data.sources.split_spec``), a tfds split read by
  the sources' one tfds reader (``data.sources.TfdsSplit``)."""
  kind, rest = sources.split_spec(spec, KINDS, 'config.data', EXPECTED)
  what = f'config.data: {spec!r}'
  if kind == 'tsv':
    lines = sources.text_lines(rest, what)
    return list(csv.DictReader(lines, delimiter='\t', quoting=csv.QUOTE_NONE)), {}
  if kind == 'jsonl':
    return list(jsonl_objects(rest, what)), {}
  split = sources.tfds_split(spec, data_config.tfds_data_dir)
  builder = split.builder()
  rows = [{k: _decode(v) for k, v in ex.items()} for ex in split.examples(builder)]
  return rows, split.label_names(label_keys, builder)


def jsonl_objects(path: str, what: str):
  """The JSON value of every non-blank line of ``path`` (``data.sources.text_lines``: local
  or gs://, plain or compressed); a line that is not JSON is an error naming its place."""
  for number, line in enumerate(sources.text_lines(path, what), 1):
    if line.strip():
      try:
        yield json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f'{what}: {path}:{number} is not JSON ({e.msg})') from None


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


def label_names(rows: list[dict], key: str, spec: str, given: Sequence[str],
                declared: Sequence[str], split_strings: bool = False) -> list[str]:
  """Label names, index = class id: ``given`` (train's, or config.data.labels), else those
  tfds declares, else the sorted set of the values in the rows (ints: 0..max).
  ``split_strings``: a string value holds several labels (a token task's tags)."""
  names = list(given or declared)
  if names:
    return names
  values = [field(r, key, spec) for r in rows]
  flat = [v for x in values for v in (x.split() if isinstance(x, str) and split_strings else
                                      (x if isinstance(x, list) else [x]))]
  names = [str(v) for v in sorted(set(flat), key=lambda v: (str(type(v)), v))]
  if all(str(n).lstrip('-').isdigit() for n in names):
    names = [str(i) for i in range(max(int(n) for n in names) + 1)]
  return names


def read_labelled_rows(spec: str, data_config: ml_collections.ConfigDict, label_key: str
                       ) -> tuple[list[dict], list[str]]:
  """The rows of one split (none is an error), and the label names tfds declares."""
  rows, declared = read_rows(spec, data_config, [label_key])
  if not rows:
    raise ValueError(f'config.data: {spec!r} has no examples')
  return rows, declared.get(label_key, [])


@dataclasses.dataclass
class Truncation:
  """What a task's encoder cut from one split to fit ``max_len``."""
  unit: str  # 'tokens' (text tasks: pieces cut) or 'words' (dropped with their labels).
  max_len: int
  examples: int = 0
  truncated_examples: int = 0
  dropped_tokens: int = 0  # Text tasks: pieces cut from the texts.
  words: int = 0  # Word tasks: words in the split, and those dropped with their labels.
  dropped_words: int = 0
  longest: int = 0  # Tokens of the longest example before truncation, [CLS]/[SEP] included.

  def summary(self, split: str) -> str:
    if not self.truncated_examples:
      return (f'{split}: {self.examples} examples, none longer than max_len={self.max_len} '
              'tokens')
    if self.unit == 'words':
      cut = (f'{self.dropped_words} of {self.words} words dropped with their labels (not '
             'trained on / not scored)')
    else:
      cut = f'{self.dropped_tokens} tokens cut'
    return (f'{split}: {self.truncated_examples} of {self.examples} examples longer than '
            f'max_len={self.max_len} tokens were truncated, {cut}; the longest has '
            f'{self.longest} tokens (raise config.data.max_len to keep more)')

  def metrics(self) -> dict[str, int]:
    out = {'truncated_examples': self.truncated_examples}
    if self.unit == 'words':
      out['dropped_words'] = self.dropped_words
    else:
      out['dropped_tokens'] = self.dropped_tokens
    return out


def encode_texts(examples: Examples, tokenizer, max_len: int, label_dtype=np.int32
                 ) -> tuple[dict[str, np.ndarray], Truncation]:
  """Texts or pairs in the tokenizer's frame, the longer text truncated first: int32
  ``input_ids, segment_ids, input_mask`` [N, max_len], ``labels`` [N]; what was cut."""
  report = Truncation(unit='tokens', max_len=max_len, examples=len(examples))
  rows, segments = [], []
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
  arrays = {'input_ids': ids, 'segment_ids': seg, 'input_mask': mask,
            'labels': np.asarray(examples.labels, label_dtype)}
  return arrays, report


@dataclasses.dataclass
class Prepared:
  """A task's data, read and encoded: what the engine trains on and the scorer reads."""
  train: dict[str, np.ndarray]
  evals: dict[str, np.ndarray] | None = None
  more_evals: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)
  names: list[str] = dataclasses.field(default_factory=list)  # Label names (class ids).
  num_outputs: int = 1  # The head's outputs.
  report: dict[str, Any] = dataclasses.field(default_factory=dict)  # Added to the result.
  context: dict[str, Any] = dataclasses.field(default_factory=dict)  # Split -> scorer input.


def more_eval_specs(data_config: ml_collections.ConfigDict) -> dict[str, str]:
  """``config.data.more_evals`` ('name=SPEC,name=SPEC'): splits scored after the last epoch."""
  out = {}
  for item in filter(None, (x.strip() for x in data_config.more_evals.split(','))):
    name, sep, spec = item.partition('=')
    if not sep or not name.isidentifier():
      raise ValueError(f'config.data.more_evals has {item!r}; expected NAME=SPEC, e.g. '
                       "'mismatched=tfds:glue/mnli:validation_mismatched'")
    out[name] = spec
  return out


def prepare_labelled(config: ml_collections.ConfigDict, tokenizer, max_len: int, read_split,
                     encode, log=print) -> Prepared:
  """Train, eval and more_evals of a labelled task through its ``read_split(spec,
  data_config, names) -> (Examples, names)`` and ``encode(examples, tokenizer, max_len) ->
  (arrays, Truncation)``; truncation logged and counted in the result."""
  d = config.data
  train_ex, names = read_split(d.train, d)
  train, train_cut = encode(train_ex, tokenizer, max_len)
  out = Prepared(train=train, names=list(names), num_outputs=max(1, len(names)))
  cuts = {'train': train_cut}
  if d.eval:
    eval_ex, _ = read_split(d.eval, d, names)
    out.evals, cuts['eval'] = encode(eval_ex, tokenizer, max_len)
  for name, spec in more_eval_specs(d).items():
    out.more_evals[name] = encode(read_split(spec, d, names)[0], tokenizer, max_len)[0]
  logging.info('Fine-tuning %s: %d train / %d eval examples, labels %s', config.task,
               train_cut.examples, cuts['eval'].examples if 'eval' in cuts else 0, names)
  for split, cut in cuts.items():
    logging.info('%s', cut.summary(split))
    if cut.truncated_examples:
      log(f'Warning: {cut.summary(split)}')
  for split in ('eval', 'train'):  # The order the result has always listed them in.
    if split in cuts:
      out.report.update({f'{split}_{k}': v for k, v in cuts[split].metrics().items()})
  out.report['labels'] = list(names)
  return out


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
  rows = [[int(order[j]) for j in row] for row in packing.greedy_bins(lengths[order], width)]
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


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
  """The example order of an epoch: a function of (seed, epoch) alone, so a resumed run
  takes the same batches."""
  return np.random.default_rng([seed, epoch]).permutation(n)


class EpochBatches:
  """The training batches of epochs 1..``epochs``, each epoch in its own order
  (:func:`epoch_order`; ``packing``: the epoch's examples packed in that order), the last
  batch of an epoch padded. The state is the position of the next batch,
  ``{'epoch': e, 'batch': i}``, what the engine's checkpoints hold: a batch that ends an
  epoch leaves ``{'epoch': e + 1, 'batch': 0}``."""

  def __init__(self, arrays: dict[str, np.ndarray], batch_size: int, seed: int, epochs: int,
               packing: bool = False):
    self.arrays, self.batch_size, self.seed = arrays, int(batch_size), int(seed)
    self.epochs, self.packing = int(epochs), packing
    self.epoch, self.batch = 1, 0
    self._batches, self._count = None, 0

  def _rows(self, epoch: int) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    order = epoch_order(len(self.arrays['input_ids']), self.seed, epoch)
    if self.packing:
      return pack(self.arrays, order), None
    return self.arrays, order

  def steps(self, epoch: int) -> int:
    """The batches of one epoch."""
    return -(-len(self._rows(epoch)[0]['input_ids']) // self.batch_size)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self.epoch > self.epochs:
      raise StopIteration
    if self._batches is None:
      rows, order = self._rows(self.epoch)
      self._count = -(-len(rows['input_ids']) // self.batch_size)
      self._batches = batches(rows, self.batch_size, None, order, self.batch)
    batch = next(self._batches)
    self.batch += 1
    if self.batch >= self._count:
      self.epoch, self.batch, self._batches = self.epoch + 1, 0, None
    return batch

  def get_state(self) -> dict[str, int]:
    return {'epoch': self.epoch, 'batch': self.batch}

  def set_state(self, state: dict) -> None:
    try:
      epoch, batch = int(state['epoch']), int(state['batch'])
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"expected a fine-tuning position {{'epoch', 'batch'}}, got {state!r}"
                       ) from e
    if not 1 <= epoch <= self.epochs + 1 or batch < 0:
      raise ValueError(f'position epoch {epoch}, batch {batch} is outside the '
                       f'{self.epochs} epochs of config.optim.epochs')
    self.epoch, self.batch, self._batches = epoch, batch, None
