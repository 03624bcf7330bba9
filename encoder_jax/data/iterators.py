"""Deterministic, resumable batches for training and evaluation, the same on any topology.

The global batch of step ``s`` is a function of the config and ``s`` alone: not of the number
of processes, the devices per process or the mesh. Order of the training stream:
  1. Epoch ``e`` orders all train documents by a permutation seeded from ``(seed, e)``
     (with several sources: the mixture of ``mixing.epoch_order``).
  2. ``G = config.data.streams`` streams split it: stream ``j`` reads positions
     ``j, j + G, j + 2G, ...`` of every epoch (disjoint, together every document).
  3. In each stream, the builder for ``config.data.pair_kind`` turns its documents into
     instances (randomness seeded per document), built ``shuffle_pool_examples / G`` at a
     time into a pool at the current sequence length and emitted in a permutation seeded
     from ``(seed, stream, pool number)``.
  4. Global row ``r`` of every batch comes from stream ``r // (batch_size / G)``: each stream
     gives ``batch_size / G`` rows per step.
A process materialises only the global rows its devices hold (``rows = (lo, hi)``, from the
batch sharding; by default the ``process_index``-th of ``process_count`` equal blocks): it
builds the streams that cover them and nothing else, so loading stays per-host work.

The iterator state is the step plus, per stream, where its current pool started (a cursor
``(epoch, position, sub)``), its length, number and how many rows were taken: restoring
rebuilds those pools and continues with exactly the batch the uninterrupted iterator would
have given. Every process saves the states of its own streams; ``merge_states`` joins them
into the global state a checkpoint holds, which any topology can resume from.
Sequence-length phases (``length_phases.phase_at``): a batch for a longer phase pads the rest of
a shorter pool; when the length shrinks, the rest of the longer pool is dropped. A new
length starts pair builders at the next document boundary (their instances depend on it).
"""

from __future__ import annotations

import itertools
import logging

import numpy as np

from encoder_jax.core import length_phases
from encoder_jax.data import builders
from encoder_jax.data import mixing
from encoder_jax.data import seeding

STATE_FORMAT = 2  # 2: per-stream pools (1: per-process pools).


class DocumentStream:
  """Positions ``index, index + count, ...`` of every epoch's document order, over a
  memory-mapped corpus split (a stream's documents; with ``count = 1`` all of them)."""

  def __init__(self, corpus, order_fn, index: int = 0, count: int = 1):
    if not 0 <= index < count:
      raise ValueError(f'index must be in [0, count); got {index} of {count}')
    self.corpus = corpus
    self.num_documents = corpus.num_documents
    self.document = corpus.document
    self._order_fn = order_fn
    self._index, self._count = index, count
    self._cache: dict = {}

  def order(self, epoch: int):
    """Global document ids of this stream in ``epoch`` (None when the stream has ended)."""
    if epoch not in self._cache:
      order = self._order_fn(epoch)
      if order is not None:
        order = order[self._index::self._count]
        if len(order) == 0:
          raise ValueError(
              f'Stream {self._index} of {self._count} gets no documents: the split has only '
              f'{self.num_documents}; use more data or fewer config.data.streams.')
      if len(self._cache) >= 2:
        self._cache.pop(min(self._cache))
      self._cache[epoch] = order
    return self._cache[epoch]


def render(instances, seq_len: int, template, pad_id: int, per_document: bool = False,
           word_start_V=None) -> dict:
  """Instances -> rows: ``input_ids``, ``segment_ids`` int32 [N, L], ``lengths`` [N],
  ``pair_labels`` int32 [N], ``word_starts`` int32 [N, L] (1 = starts a word), and with ``per_document``
  ``document_ids`` int32 [N, L].

  ``word_starts``: whether each token starts a word, as preparation stored it beside the
  shard's tokens (``shards.Tokens``); for data prepared without them, the vocabulary's
  ``word_start_V`` [vocab] (False everywhere without it). Specials never start a word.

  The one way special tokens frame a row: ``template`` (the builder's, a
  ``tokenizer_files.Template``) gives the specials before the first piece, those closing
  each piece (in the piece's segment) and those after the last one
  (``Template.around_pieces``): BERT's ``[CLS] A [SEP] B [SEP]``, XLNet's
  ``A [SEP] B [SEP] [CLS]``. With ``per_document`` each piece is a document framed alone,
  head to tail, under its own id (1, 2, ... in row order; 0 = padding): packed rows of
  ``[CLS] document [SEP]`` that the encoder reads one document at a time.
  """
  head, closing, tail = template.around_pieces()
  (head_ids, head_seg), (tail_ids, tail_seg) = (
      (np.array([t for t, _ in part], np.int32), np.array([k for _, k in part], np.int32))
      for part in (head, tail))
  closing = np.array(closing, np.int32)
  nh, nc, nt = len(head), len(closing), len(tail)
  head_typed, tail_typed = head_seg.any(), tail_seg.any()  # Rows start in segment 0.
  n = len(instances)
  ids = np.full((n, seq_len), pad_id, np.int32)
  seg = np.zeros((n, seq_len), np.int32)
  lengths = np.zeros(n, np.int64)
  labels = np.zeros(n, np.int32)
  documents = np.zeros((n, seq_len), np.int32)
  starts = np.zeros((n, seq_len), np.int32)
  for r, (pieces, label) in enumerate(instances):
    row_ids, row_seg, pos, last = ids[r], seg[r], 0, len(pieces) - 1
    for d, (tokens, start, stop, segment) in enumerate(pieces):
      first = pos
      if nh and (per_document or d == 0):  # The head: before the first piece (or each).
        row_ids[pos:pos + nh] = head_ids
        if head_typed:
          row_seg[pos:pos + nh] = head_seg
        pos += nh
      end = pos + stop - start
      if end + nc + nt > seq_len:  # The row ends at or after that.
        raise AssertionError(f'A built example has more than {seq_len} tokens (bug).')
      row_ids[pos:end] = tokens[start:stop]
      stored = getattr(tokens, 'word_starts', None)
      if stored is not None:
        starts[r, pos:end] = stored[start:stop]
      elif word_start_V is not None:
        starts[r, pos:end] = word_start_V[row_ids[pos:end]]
      row_ids[end:end + nc] = closing
      if segment:
        row_seg[pos:end + nc] = segment
      pos = end + nc
      if nt and (per_document or d == last):  # The tail: after the last piece (or each).
        row_ids[pos:pos + nt] = tail_ids
        if tail_typed:
          row_seg[pos:pos + nt] = tail_seg
        pos += nt
      if per_document:
        documents[r, first:pos] = d + 1
    lengths[r] = pos
    labels[r] = label
  rows = dict(input_ids=ids, segment_ids=seg, lengths=lengths, pair_labels=labels,
              word_starts=starts)
  if per_document:
    rows['document_ids'] = documents
  return rows


def _batch(rows: dict, seq_len: int) -> dict:
  """Rendered rows (already ``seq_len`` wide) -> the batch dict: ``input_mask`` from their
  lengths, the rest as rendered."""
  batch = {k: v for k, v in rows.items() if k != 'lengths'}
  batch['input_mask'] = (np.arange(seq_len)[None, :] < rows['lengths'][:, None]).astype(
      np.int32)
  return batch


def word_start_table(prepared):
  """The vocabulary's word starts, for data prepared without per-token ones
  (``config.data.word_segmenter='none'``); None when the shards hold their own."""
  if prepared.manifest.get('words') is not None:
    return None
  return np.asarray(prepared.tokenizer.is_word_start, bool)


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


_MAX_AUTO_STREAMS = 64


def num_streams(config, num_documents: int) -> int:
  """``config.data.streams``, or (0) the largest divisor of the batch size that is at most
  64 and at most ``num_documents`` (so every stream has documents)."""
  b, g = int(config.train.batch_size), int(config.data.streams)
  if g == 0:
    cap = max(1, min(_MAX_AUTO_STREAMS, num_documents))
    return max(d for d in range(1, min(b, cap) + 1) if b % d == 0)
  if g < 1 or b % g:
    raise ValueError(f'config.data.streams = {g} must divide config.train.batch_size = {b} '
                     '(each stream gives batch_size / streams rows per step); 0 picks one.')
  if g > num_documents:
    raise ValueError(f'config.data.streams = {g} is more than the {num_documents} train '
                     'documents (each stream reads its own documents); lower it, or 0.')
  return g


def process_rows(batch_size: int, process_index: int = 0,
                 process_count: int = 1) -> tuple[int, int]:
  """Global rows ``[lo, hi)`` of the ``process_index``-th of ``process_count`` equal blocks."""
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index must be in [0, process_count); got {process_index} '
                     f'of {process_count}')
  if batch_size % process_count:
    raise ValueError(f'config.train.batch_size = {batch_size} must be divisible by '
                     f'process_count = {process_count} (each process loads its block).')
  n = batch_size // process_count
  return process_index * n, (process_index + 1) * n


def _own_rows(rows, batch_size: int, process_index: int, process_count: int
              ) -> tuple[int, int]:
  """``rows`` (``(lo, hi)`` of the global batch), checked; by default this process's block
  (``process_rows``)."""
  if rows is None:
    rows = process_rows(batch_size, process_index, process_count)
  lo, hi = (int(r) for r in rows)
  if not 0 <= lo < hi <= batch_size:
    raise ValueError(f'rows {rows} must be a non-empty range within the global batch of '
                     f'{batch_size}')
  return lo, hi


def _order_cache(order_fn, keep: int = 4):
  """``order_fn`` remembering its last ``keep`` epochs (streams share it; they may be an
  epoch apart)."""
  cache: dict = {}

  def cached(epoch):
    if epoch not in cache:
      if len(cache) >= keep:
        cache.pop(min(cache))
      cache[epoch] = order_fn(epoch)
    return cache[epoch]
  return cached


class _Stream:
  """One example stream: documents ``j, j + G, ...`` of each epoch, built into pools."""

  def __init__(self, it: 'TrainIterator', index: int, stream: DocumentStream):
    self.it, self.index, self.stream = it, index, stream
    self.pool = None

  def build_pool(self, cursor, seq_len: int, number: int, taken: int = 0):
    it = self.it
    gen = it.builder.generate(self.stream, tuple(cursor), seq_len)
    instances, end = [], tuple(cursor)
    for instance, end in itertools.islice(gen, it.stream_pool_size):
      instances.append(instance)
    if not instances:
      raise StopIteration
    arrays = render(instances, seq_len, it.template, it._pad,
                    it.builder.packs_documents, it.word_start_V)
    rng = np.random.Generator(np.random.PCG64(seeding.mix(
        it.seed, seeding.POOL_SHUFFLE, self.index, number)))
    self.pool = dict(cursor=[int(c) for c in cursor], seq_len=seq_len, number=number,
                     taken=taken, end=end, arrays=arrays, perm=rng.permutation(len(instances)))
    it.check_labels(arrays['pair_labels'], seq_len)

  def next_pool(self, seq_len: int):
    if self.pool is None:
      self.build_pool((0, 0, 0), seq_len, 0)
      return
    epoch, k, sub = self.pool['end']
    if self.it.builder.length_dependent_cursor and sub and seq_len != self.pool['seq_len']:
      k, sub = k + 1, 0  # Instances of a document depend on the length: restart cleanly.
    self.build_pool((epoch, k, sub), seq_len, self.pool['number'] + 1)

  def take(self, need: int, seq_len: int) -> list:
    """The stream's next ``need`` rows as [rendered rows (``render``)] at ``seq_len``."""
    parts = []
    while need:
      pool = self.pool
      if pool is None or pool['taken'] == len(pool['perm']) or pool['seq_len'] > seq_len:
        self.next_pool(seq_len)
        pool = self.pool
      take = min(need, len(pool['perm']) - pool['taken'])
      rows = pool['perm'][pool['taken']:pool['taken'] + take]
      pool['taken'] += take
      need -= take
      part = {k: a[rows] for k, a in pool['arrays'].items()}
      width = part['input_ids'].shape[1]
      if width < seq_len:  # Padding: the pad id, segment 0, document 0, no word start.
        pad = ((0, 0), (0, seq_len - width))
        part = {k: np.pad(a, pad, constant_values=self.it._pad if k == 'input_ids' else 0)
                if a.ndim == 2 else a for k, a in part.items()}
      parts.append(part)
    return parts

  def get_state(self):
    if self.pool is None:
      return None
    state = {k: self.pool[k] for k in ('seq_len', 'number', 'taken')}
    state['cursor'] = list(self.pool['cursor'])
    return state

  def set_state(self, state):
    if state is None:
      self.pool = None
    else:
      self.build_pool(state['cursor'], int(state['seq_len']), int(state['number']),
                      int(state['taken']))


class TrainIterator:
  """Infinite iterator of this process's rows of every global batch; see the module
  docstring."""

  def __init__(self, config, prepared, process_index: int = 0, process_count: int = 1,
               rows: tuple[int, int] | None = None):
    self.global_batch_size = int(config.train.batch_size)
    self.rows = _own_rows(rows, self.global_batch_size, process_index, process_count)
    self.batch_size = self.rows[1] - self.rows[0]
    self.phases = length_phases.phases(config.train)
    self.seed = int(config.seed)
    self.pool_size = int(config.data.shuffle_pool_examples)
    if self.pool_size < 1:
      raise ValueError('config.data.shuffle_pool_examples must be >= 1; got '
                       f'{self.pool_size}')
    tok = prepared.tokenizer
    self._pad = tok.pad_id
    corpus = prepared.split('train')
    self.num_streams = num_streams(config, corpus.num_documents)
    self.rows_per_stream = self.global_batch_size // self.num_streams
    self.stream_pool_size = max(self.rows_per_stream, -(-self.pool_size // self.num_streams))
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

    orders = _order_cache(order_fn)
    lo, hi = self.rows
    own = range(lo // self.rows_per_stream, -(-hi // self.rows_per_stream))
    self._streams = [_Stream(self, j, DocumentStream(corpus, orders, j, self.num_streams))
                     for j in own]
    self._offset = lo - own[0] * self.rows_per_stream  # First own row in the streams' rows.
    self.builder = _make_builder(config, self.seed)
    self.template = self.builder.template(tok.cls_id, tok.sep_id)  # How rows are framed.
    self.word_start_V = word_start_table(prepared)
    # What the corpus means for the pair objective: stops here if nothing can be built.
    self.corpus_warnings = check_corpus(config, prepared, 'train')
    self._config = config
    self._fingerprint = dict(
        config_hash=prepared.manifest['config_hash'], pair_kind=str(config.data.pair_kind),
        seed=self.seed, batch_size=self.global_batch_size, streams=self.num_streams,
        pool_size=self.pool_size, short_seq_prob=float(config.data.short_seq_prob))
    self.step = 0
    self._labels_checked = False

  def check_labels(self, labels, seq_len: int):
    """Once, on the first pool: warns when its pair labels are all of one class."""
    if self.builder.pair_labels and not self._labels_checked and not self.corpus_warnings:
      self._labels_checked = True
      warning = _one_class_warning(self._config, labels, seq_len)
      if warning:
        logging.warning('%s', warning)
        self.corpus_warnings.append(warning)

  @property
  def streams(self) -> list[int]:
    """The streams this process builds."""
    return [s.index for s in self._streams]

  # ---- iteration ----

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    seq_len = length_phases.phase_at(self.phases, self.step).seq_len
    parts = []
    for s in self._streams:
      parts.extend(s.take(self.rows_per_stream, seq_len))
    self.step += 1
    rows = {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k]
            for k in parts[0]}
    lo = self._offset
    if lo or len(rows['input_ids']) != self.batch_size:
      rows = {k: a[lo:lo + self.batch_size] for k, a in rows.items()}
    return _batch(rows, seq_len)

  # ---- checkpointing ----

  def get_state(self) -> dict:
    """JSON-serializable: the step and this process's streams (``merge_states`` joins the
    processes'); ``set_state`` of it makes ``next`` return the following batch."""
    return {'format': STATE_FORMAT, 'step': self.step,
            'streams': {str(s.index): s.get_state() for s in self._streams},
            'fingerprint': dict(self._fingerprint)}

  def set_state(self, state: dict) -> None:
    """Continues from a state of any topology that holds this process's streams."""
    if state.get('format') != STATE_FORMAT:
      raise ValueError(f"Data iterator state has format {state.get('format')!r}; this code "
                       f'reads format {STATE_FORMAT} (a checkpoint of an older version: its '
                       'data position cannot be continued).')
    saved = state.get('fingerprint', {})
    diff = {k: (saved.get(k), v) for k, v in self._fingerprint.items() if saved.get(k) != v}
    if 'batch_size' in diff:
      raise ValueError(
          f'The checkpoint was trained with config.train.batch_size = {diff["batch_size"][0]}; '
          f'this run has {diff["batch_size"][1]}. Its data stream continues only with the '
          'same global batch: resume with the saved batch size (any number of hosts), or '
          'start a new workdir that initialises from this one.')
    if diff:
      raise ValueError(
          'The data iterator state was saved with different settings, so resuming would not '
          f'continue the same stream: {{setting: (saved, now)}} = {diff}.')
    streams = state.get('streams', {})
    missing = [s.index for s in self._streams if str(s.index) not in streams]
    if missing:
      raise ValueError(f'The data iterator state holds streams {sorted(map(int, streams))}; '
                       f'this process needs {missing} as well.')
    self.step = int(state['step'])
    for s in self._streams:
      s.set_state(streams[str(s.index)])


def merge_states(states: list[dict]) -> dict:
  """Every process's ``get_state`` -> the global state (all streams) a checkpoint holds."""
  states = [s for s in states if s]
  if not states:
    return {}
  first = states[0]
  if any('streams' not in s for s in states):  # Another loop's position (fine-tuning's).
    if any(s != first for s in states):
      raise ValueError(f'The processes saved different data positions: {states} (bug).')
    return first
  merged = dict(first, streams={})
  for s in states:
    if (s.get('format'), s.get('step'), s.get('fingerprint')) != (
        first.get('format'), first.get('step'), first.get('fingerprint')):
      raise ValueError('The processes\' data iterators disagree on step or settings: '
                       f'{[(x.get("step"), x.get("fingerprint")) for x in states]} (bug).')
    merged['streams'].update(s.get('streams', {}))
  return merged


def make_train_iterator(config, prepared, process_index: int = 0, process_count: int = 1,
                        rows: tuple[int, int] | None = None) -> TrainIterator:
  """This process's rows of every global batch: ``rows = (lo, hi)`` of the global batch
  (from the batch sharding), or else the ``process_index``-th of ``process_count`` blocks."""
  return TrainIterator(config, prepared, process_index, process_count, rows)


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
                       process_count: int = 1,
                       rows: tuple[int, int] | None = None) -> EvalIterator:
  """This process's rows of at most ``config.train.eval_batches`` held-out global batches.

  The held-out set is one stream over the split in document order, the same for every
  topology (each process builds it whole, at most ``eval_batches * batch_size`` examples,
  and keeps its ``rows`` of each batch).
  """
  batch_size = int(config.train.batch_size)
  lo, hi = _own_rows(rows, batch_size, process_index, process_count)
  corpus = prepared.split('held_out') if prepared.manifest['splits']['held_out'][
      'documents'] else None
  if corpus is None:
    raise ValueError(
        f'The prepared data in {prepared.directory!r} has no held-out documents; set '
        'config.data.held_out_fraction > 0 and config.data.held_out_max_documents > 0 '
        '(this re-prepares), or disable evaluation with config.train.eval_every_steps = 0.')
  n = corpus.num_documents
  stream = DocumentStream(corpus, lambda e: np.arange(n) if e == 0 else None)
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
        f'The held-out split ({n} documents, {len(instances)} examples of length {seq_len}) '
        f'is smaller than one batch of config.train.batch_size = {batch_size}; raise '
        'config.data.held_out_fraction / held_out_max_documents.')
  arrays = render(instances[:num_batches * batch_size], int(seq_len),
                  builder.template(tok.cls_id, tok.sep_id), tok.pad_id, builder.packs_documents,
                  word_start_table(prepared))
  batches = []
  for b in range(num_batches):
    own = slice(b * batch_size + lo, b * batch_size + hi)
    batches.append(_batch({k: a[own] for k, a in arrays.items()}, int(seq_len)))
  return EvalIterator(batches)
