"""Deterministic, sharded, resumable batches for training and evaluation.

Order of the training stream (for one process):
  1. Epoch ``e`` orders all train documents by a permutation seeded from ``(seed, e)``
     (with several sources: the mixture of ``mixing.epoch_order``). Process ``p`` of ``P``
     takes positions ``p, p + P, p + 2P, ...``: disjoint slices whose union is every document.
  2. The builder for ``config.data.pair_kind`` turns that document stream into instances
     (randomness seeded per document, so instances do not depend on the process layout).
  3. Instances are built ``shuffle_pool_examples`` at a time into a pool at the current
     sequence length and emitted in a permutation seeded from ``(seed, process, pool number)``,
     so a batch mixes many documents.

The iterator state is where the current pool started (a cursor ``(epoch, position, sub)``),
its length, its number and how many rows were taken, plus the step: restoring it rebuilds
that pool and continues with exactly the batch the uninterrupted iterator would have given.
Sequence-length phases (``schedule.phase_at``): a batch for a longer phase pads the rest of
a shorter pool; when the length shrinks, the rest of the longer pool is dropped. A new
length starts pair builders at the next document boundary (their instances depend on it).
"""

from __future__ import annotations

import itertools
import logging

import numpy as np

from encoder_jax import schedule
from encoder_jax.data import builders
from encoder_jax.data import mixing
from encoder_jax.data import seeding

STATE_FORMAT = 1


class DocumentStream:
  """One process's documents, epoch by epoch, over a memory-mapped corpus split."""

  def __init__(self, corpus, order_fn, process_index: int, process_count: int):
    if not 0 <= process_index < process_count:
      raise ValueError(f'process_index must be in [0, process_count); got {process_index} '
                       f'of {process_count}')
    self.corpus = corpus
    self.num_documents = corpus.num_documents
    self.document = corpus.document
    self._order_fn = order_fn
    self._process_index, self._process_count = process_index, process_count
    self._cache: dict = {}

  def order(self, epoch: int):
    """Global document ids of this process in ``epoch`` (None when the stream has ended)."""
    if epoch not in self._cache:
      order = self._order_fn(epoch)
      if order is not None:
        order = order[self._process_index::self._process_count]
        if len(order) == 0:
          raise ValueError(
              f'Process {self._process_index} of {self._process_count} gets no documents: '
              f'the split has only {self.num_documents}; use more data or fewer processes.')
      if len(self._cache) >= 2:
        self._cache.pop(min(self._cache))
      self._cache[epoch] = order
    return self._cache[epoch]


def render(instances, seq_len: int, cls_id: int, sep_id: int, pad_id: int):
  """Instances -> (input_ids, segment_ids int32 [N, L], lengths [N], labels int32 [N])."""
  n = len(instances)
  ids = np.full((n, seq_len), pad_id, np.int32)
  seg = np.zeros((n, seq_len), np.int32)
  lengths = np.zeros(n, np.int64)
  labels = np.zeros(n, np.int32)
  for r, (pieces, label) in enumerate(instances):
    row_ids, row_seg = ids[r], seg[r]
    row_ids[0] = cls_id
    pos = 1
    for tokens, start, stop, segment in pieces:
      end = pos + stop - start
      row_ids[pos:end] = tokens[start:stop]
      row_ids[end] = sep_id
      if segment:
        row_seg[pos:end + 1] = segment
      pos = end + 1
    lengths[r] = pos
    labels[r] = label
  if n and lengths.max() > seq_len:
    raise AssertionError(f'A built example has {lengths.max()} > {seq_len} tokens (bug).')
  return ids, seg, lengths, labels


def _batch(ids, seg, lengths, labels, seq_len: int, pad_id: int) -> dict:
  if ids.shape[1] < seq_len:
    pad = seq_len - ids.shape[1]
    ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=pad_id)
    seg = np.pad(seg, ((0, 0), (0, pad)))
  mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int32)
  return {'input_ids': ids, 'segment_ids': seg, 'input_mask': mask, 'pair_labels': labels}


def _local_batch_size(config, process_count: int) -> int:
  b = int(config.train.batch_size)
  if process_count < 1 or b % process_count:
    raise ValueError(f'config.train.batch_size = {b} must be divisible by process_count = '
                     f'{process_count} (each process loads batch_size // process_count).')
  return b // process_count


def _make_builder(config, seed: int):
  return builders.make(str(config.data.pair_kind), seed=seed,
                       short_seq_prob=float(config.data.short_seq_prob))


def check_corpus(config, prepared, split: str) -> list[str]:
  """The builder's verdict on a prepared split, from the manifest's counts (reads no shard).

  Raises ValueError when no valid example can ever be built (e.g. NSP over one document of
  one sentence); returns warnings (also logged) when the examples would be ill-posed or
  their pair labels all of one class.
  """
  counts = prepared.manifest['splits'][split]
  if not counts['documents']:
    return []  # An empty split is reported where it is used.
  kind = str(config.data.pair_kind)
  where = (f"The {split.replace('_', '-')} split of config.data.sources="
           f'{str(config.data.sources)!r} (prepared in {prepared.directory})')
  warnings = builders.REGISTRY[kind].check_corpus(
      int(counts['documents']), int(counts['sentences']), int(counts['tokens']), where)
  for warning in warnings:
    logging.warning('%s', warning)
  return warnings


# A first pool of at least this many examples, all with one pair label, is worth a warning
# (a balanced objective gives that with probability ~2**-63).
_ONE_CLASS_MIN_EXAMPLES = 64


def _one_class_warning(config, labels, seq_len: int) -> str | None:
  if len(labels) < _ONE_CLASS_MIN_EXAMPLES or (labels != labels[0]).any():
    return None
  return (f'All {len(labels)} examples of the first pool of config.data.pair_kind='
          f'{str(config.data.pair_kind)!r} at length {seq_len} have pair label {int(labels[0])}: '
          'the pair objective learns a constant and its accuracy means nothing. Likely every '
          'chunk is one sentence (documents of one sentence, or sentences longer than seq_len '
          f'- 3 = {seq_len - 3} tokens): use longer sequences or a corpus of multi-sentence '
          'documents.')


class TrainIterator:
  """Infinite iterator of training batches for one process; see the module docstring."""

  def __init__(self, config, prepared, process_index: int = 0, process_count: int = 1):
    self.batch_size = _local_batch_size(config, process_count)
    self.phases = schedule.phases(config.train)
    self.seed = int(config.seed)
    self.pool_size = int(config.data.shuffle_pool_examples)
    if self.pool_size < 1:
      raise ValueError('config.data.shuffle_pool_examples must be >= 1; got '
                       f'{self.pool_size}')
    tok = prepared.tokenizer
    self._cls, self._sep, self._pad = tok.cls_id, tok.sep_id, tok.pad_id
    self.process_index, self.process_count = process_index, process_count
    corpus = prepared.split('train')
    sources = prepared.manifest['sources']
    q = None
    if len(sources) > 1:
      q = mixing.source_probabilities([s['train']['sentences'] for s in sources],
                                      [s['weight'] for s in sources],
                                      float(config.data.mixing_alpha))
    self.source_probabilities = q
    counts = []

    def order_fn(epoch):
      if q is not None and not counts:
        counts.extend(corpus.sentence_counts_by_source())
      return mixing.epoch_order(self.seed, epoch, corpus.source_offsets, q, counts or None)

    self.stream = DocumentStream(corpus, order_fn, process_index, process_count)
    self.builder = _make_builder(config, self.seed)
    # What the corpus means for the pair objective: stops here if nothing can be built.
    self.corpus_warnings = check_corpus(config, prepared, 'train')
    self._config = config
    self._fingerprint = dict(
        config_hash=prepared.manifest['config_hash'], pair_kind=str(config.data.pair_kind),
        seed=self.seed, process_index=process_index, process_count=process_count,
        batch_size=self.batch_size, pool_size=self.pool_size,
        short_seq_prob=float(config.data.short_seq_prob))
    self.step = 0
    self._pool = None
    self._labels_checked = False

  # ---- pools ----

  def _build_pool(self, cursor, seq_len: int, number: int, taken: int = 0):
    gen = self.builder.generate(self.stream, tuple(cursor), seq_len)
    instances, end = [], tuple(cursor)
    for instance, end in itertools.islice(gen, self.pool_size):
      instances.append(instance)
    if not instances:
      raise StopIteration
    arrays = getattr(self.builder, 'render', render)(instances, seq_len, self._cls, self._sep,
                                                     self._pad)
    rng = np.random.Generator(np.random.PCG64(seeding.mix(
        self.seed, seeding.POOL_SHUFFLE, self.process_index, number)))
    self._pool = dict(cursor=[int(c) for c in cursor], seq_len=seq_len, number=number,
                      taken=taken, end=end, arrays=arrays,
                      perm=rng.permutation(len(instances)))
    if (self.builder.pair_labels and not self._labels_checked
        and not self.corpus_warnings):  # Once: reads the labels, changes nothing.
      self._labels_checked = True
      warning = _one_class_warning(self._config, arrays[3], seq_len)
      if warning:
        logging.warning('%s', warning)
        self.corpus_warnings.append(warning)

  def _next_pool(self, seq_len: int):
    if self._pool is None:
      self._build_pool((0, 0, 0), seq_len, 0)
      return
    epoch, k, sub = self._pool['end']
    if (self.builder.length_dependent_cursor and sub and seq_len != self._pool['seq_len']):
      k, sub = k + 1, 0  # Instances of a document depend on the length: restart cleanly.
    self._build_pool((epoch, k, sub), seq_len, self._pool['number'] + 1)

  # ---- iteration ----

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    seq_len = schedule.phase_at(self.phases, self.step).seq_len
    parts, need = [], self.batch_size
    while need:
      pool = self._pool
      if pool is None or pool['taken'] == len(pool['perm']) or pool['seq_len'] > seq_len:
        self._next_pool(seq_len)
        pool = self._pool
      take = min(need, len(pool['perm']) - pool['taken'])
      rows = pool['perm'][pool['taken']:pool['taken'] + take]
      pool['taken'] += take
      need -= take
      parts.append((pool['seq_len'], [a[rows] for a in pool['arrays']]))
    self.step += 1
    if len(parts) == 1:
      return _batch(*parts[0][1], seq_len, self._pad)
    batches = [_batch(*arrays, seq_len, self._pad) for _, arrays in parts]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}

  # ---- checkpointing ----

  def get_state(self) -> dict:
    """JSON-serializable; ``set_state`` of it makes ``next`` return the following batch."""
    pool = None
    if self._pool is not None:
      pool = {k: self._pool[k] for k in ('seq_len', 'number', 'taken')}
      pool['cursor'] = list(self._pool['cursor'])
    return {'format': STATE_FORMAT, 'step': self.step, 'pool': pool,
            'fingerprint': dict(self._fingerprint)}

  def set_state(self, state: dict) -> None:
    if state.get('format') != STATE_FORMAT:
      raise ValueError(f"Data iterator state has format {state.get('format')!r}; this code "
                       f'reads format {STATE_FORMAT}.')
    saved = state.get('fingerprint', {})
    diff = {k: (saved.get(k), v) for k, v in self._fingerprint.items() if saved.get(k) != v}
    if diff:
      raise ValueError(
          'The data iterator state was saved with different settings, so resuming would not '
          f'continue the same stream: {{setting: (saved, now)}} = {diff}.')
    self.step = int(state['step'])
    pool = state['pool']
    if pool is None:
      self._pool = None
    else:
      self._build_pool(pool['cursor'], int(pool['seq_len']), int(pool['number']),
                       int(pool['taken']))


def make_train_iterator(config, prepared, process_index: int = 0,
                        process_count: int = 1) -> TrainIterator:
  """Batches of ``config.train.batch_size // process_count`` rows for this process."""
  return TrainIterator(config, prepared, process_index, process_count)


class EvalIterator:
  """Finite, deterministic batches from the held-out split (same batches every time)."""

  def __init__(self, batches: list[dict]):
    self._batches = batches
    self._i = 0

  def __len__(self):
    return len(self._batches)

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._i >= len(self._batches):
      raise StopIteration
    self._i += 1
    return self._batches[self._i - 1]


def make_eval_iterator(config, prepared, seq_len: int, process_index: int = 0,
                       process_count: int = 1) -> EvalIterator:
  """At most ``config.train.eval_batches`` held-out batches of this process's slice."""
  batch_size = _local_batch_size(config, process_count)
  corpus = prepared.split('held_out') if prepared.manifest['splits']['held_out'][
      'documents'] else None
  if corpus is None:
    raise ValueError(
        f'The prepared data in {prepared.directory!r} has no held-out documents; set '
        'config.data.held_out_fraction > 0 and config.data.held_out_max_documents > 0 '
        '(this re-prepares), or disable evaluation with config.train.eval_every_steps = 0.')
  n = corpus.num_documents
  stream = DocumentStream(corpus, lambda e: np.arange(n) if e == 0 else None,
                          process_index, process_count)
  check_corpus(config, prepared, 'held_out')
  builder = _make_builder(config, seeding.mix(int(config.seed), seeding.EVAL))
  max_batches = int(config.train.eval_batches)
  tok = prepared.tokenizer
  instances = list(itertools.islice(
      (inst for inst, _ in builder.generate(stream, (0, 0, 0), int(seq_len))),
      max_batches * batch_size))
  num_batches = len(instances) // batch_size
  if num_batches == 0:
    raise ValueError(
        f'The held-out split ({n} documents, {len(instances)} examples of length {seq_len} '
        f'for process {process_index}/{process_count}) is smaller than one batch of '
        f'{batch_size}; raise config.data.held_out_fraction / held_out_max_documents.')
  ids, seg, lengths, labels = getattr(builder, 'render', render)(
      instances[:num_batches * batch_size], int(seq_len), tok.cls_id, tok.sep_id, tok.pad_id)
  batches = []
  for b in range(num_batches):
    rows = slice(b * batch_size, (b + 1) * batch_size)
    batches.append(_batch(ids[rows], seg[rows], lengths[rows], labels[rows], int(seq_len),
                          tok.pad_id))
  return EvalIterator(batches)
