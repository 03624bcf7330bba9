"""Preparation, once per config: corpus -> tokenizer -> sharded, pre-tokenized documents.

``prepare(config, directory)`` streams every source document by document, tokenizes chunks of
documents in worker processes (all cores; results are consumed in order, so the output does
not depend on the number of workers), and writes shards as they fill, so memory stays
bounded by (workers x chunk) + one shard buffer + the held-out documents. The result lands
in a ``.partial-<host>-<pid>-<process start>`` directory that is renamed when complete (and
removed on failure); ``manifest.json`` lists shards, counts, skipped input by reason, the
unigram counts of the train split, the tokenizer's sha256 and a hash of the config fields
that determine the content (``CONTENT_KEYS``).

``load_or_prepare(config)`` reuses a prepared directory whose config hash matches, prepares
a missing one, and refuses (naming the changed fields) to reuse one made from a different
config or whose tokenizer file changed. No masking happens here: masks are drawn on device.

Held-out split: each document gets a hash score from (source, position in the source); those
with score < ``held_out_fraction`` are held out, at most ``held_out_max_documents`` of them
(the lowest scores; a document pushed out of the held-out set goes to train).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import glob
import hashlib
import heapq
import json
import logging
import multiprocessing
import os
import shutil
import socket
import sys
import time

import numpy as np

from encoder_jax.storage import locks
from encoder_jax.storage import paths as storage
from encoder_jax.data import prepare_once
from encoder_jax.data import seeding
from encoder_jax.data import sentences as sentences_lib
from encoder_jax.data import shards as shards_lib
from encoder_jax.data import sources as sources_lib
from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.data import tokenizer_kinds
from encoder_jax.data import words as words_lib

FORMAT_VERSION = 2  # 2: per-token word starts (words.py).
MANIFEST = 'manifest.json'
# Config fields that determine the prepared content; anything else (workers, shard size,
# pair_kind, ...) can change without re-preparing.
CONTENT_KEYS = (
    'model.vocab_size',
    'data.sources', 'data.mixing_alpha', 'data.tfds_data_dir', 'data.max_line_bytes',
    'data.max_sentence_chars', 'data.held_out_fraction', 'data.held_out_max_documents',
    'tokenizer.kind', 'tokenizer.path', 'tokenizer.model_type', 'tokenizer.lowercase',
    'tokenizer.train_sentences', 'tokenizer.character_coverage', 'data.word_segmenter',
)
_CHUNK_CHARS = 1 << 19  # Raw text per tokenization task.
_DEFAULT_ROOT = os.path.join('data', 'prepared')


@dataclasses.dataclass
class PreparedData:
  """A prepared directory, validated against the config that loaded it."""
  directory: str
  manifest: dict
  tokenizer: tokenizer_lib.Tokenizer
  unigram_counts: np.ndarray  # int64 [vocab_size], over the train split.

  def __post_init__(self):
    self._splits = {}

  def split(self, name: str) -> shards_lib.CorpusSplit:
    """The memory-mapped 'train' or 'held_out' split."""
    if name not in self._splits:
      self._splits[name] = shards_lib.CorpusSplit(
          self.directory, self.manifest['splits'][name]['shards'],
          len(self.manifest['sources']), word_starts=self.manifest.get('words') is not None)
    return self._splits[name]


# ---------------------------------------------------------------------------- config hash


def _get(config, dotted: str):
  value = config
  for part in dotted.split('.'):
    value = value[part]
  return value


def content_fields(config) -> dict:
  """The config values (plus input fingerprints) that the prepared content depends on."""
  fields = {k: _get(config, k) for k in CONTENT_KEYS}
  fields = {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
  srcs = sources_lib.parse_sources(config.data)
  fields['embedded_corpus'] = next((s.fingerprint() for s in srcs if s.fingerprint()), '')
  path = str(config.tokenizer.path)
  fields['tokenizer_file_sha256'] = tokenizer_lib.file_sha256(path) if path else ''
  fields['word_segmenters'] = words_lib.resolve(config.data.word_segmenter)
  fields['format_version'] = FORMAT_VERSION
  return fields


def config_hash(fields: dict) -> str:
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def prepared_directory(config, fields: dict | None = None) -> str:
  """config.data.prepared_dir, or data/prepared/<config hash> (relative to the cwd)."""
  if config.data.prepared_dir:
    return str(config.data.prepared_dir)
  return os.path.join(_DEFAULT_ROOT, config_hash(fields or content_fields(config)))


# ---------------------------------------------------------------------------- workers

_WORKER_TOKENIZER = None
_WORKER_WORDS = None


def _init_worker(kind: str, path: str, lowercase: bool, segmenter: str, resolved):
  global _WORKER_TOKENIZER, _WORKER_WORDS
  os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')
  _WORKER_TOKENIZER = tokenizer_lib.Tokenizer.from_file(kind, path, lowercase)
  _WORKER_WORDS = None if resolved is None else words_lib.Words(
      segmenter, resolved, _WORKER_TOKENIZER.is_word_start)


def _tokenize_chunk(task):
  """Worker: raw documents -> (tokens, word starts or None, sentence lengths, sentences
  per doc, kept docs, report, bytes, word counts by script)."""
  docs, lines_are_sentences, max_chars, dtype = task
  tok = _WORKER_TOKENIZER
  report = sources_lib.Report()
  texts: list[str] = []
  per_doc: list[int] = []
  raw_bytes = 0
  for lines, where in docs:
    raw_bytes += sum(len(line.encode('utf-8')) + 1 for line in lines)
    sents, cuts = sentences_lib.document_sentences(lines, lines_are_sentences, max_chars)
    if cuts:
      report.add('sentences_cut_at_max_sentence_chars', where, cuts)
    texts.extend(sents)
    per_doc.append(len(sents))
  starts, by_script = None, {}
  if _WORKER_WORDS is not None and texts:
    ids, starts, by_script = _WORKER_WORDS.encode(texts, tok,
                                                  lambda reason, n: report.add(reason, '', n))
  else:
    ids = tok.encode_batch(texts) if texts else []
  lens = np.fromiter(map(len, ids), np.int64, count=len(ids))
  flat = np.fromiter((i for seq in ids for i in seq), dtype, count=int(lens.sum()))
  doc_of_sentence = np.repeat(np.arange(len(per_doc)), per_doc)
  keep = lens > 0
  if not keep.all():
    for d in np.unique(doc_of_sentence[~keep])[:5]:
      report.add('sentences_empty_after_tokenization', docs[d][1], 0)
    report.add('sentences_empty_after_tokenization', '', int((~keep).sum()))
  doc_sentences = np.bincount(doc_of_sentence[keep], minlength=len(per_doc))
  empty_docs = np.flatnonzero(doc_sentences == 0)
  for d in empty_docs:
    report.add('documents_empty_skipped', docs[d][1])
  return (flat, starts, lens[keep], doc_sentences[doc_sentences > 0], doc_sentences > 0,
          report, raw_bytes, by_script)


def _start_method() -> str:
  """'fork' (fast, works from unguarded scripts) unless JAX or TensorFlow threads exist.

  Forking a process that runs JAX/TF threads can deadlock, so then workers are spawned
  (without re-importing the ``__main__`` module: ``_main_not_reimported``).
  """
  threaded = any(m in sys.modules for m in ('jax', 'tensorflow'))
  return 'spawn' if threaded or sys.platform != 'linux' else 'fork'


@contextlib.contextmanager
def _main_not_reimported():
  """While workers start: a spawned worker does not import the ``__main__`` module.

  A spawned process re-imports ``__main__`` (by module name or file) before it runs
  anything; a script that prepares data at its top level, without an ``if __name__ ==
  '__main__'`` guard, would prepare again in every worker and wait for ever on the
  preparation lock its parent holds. The workers need only this module, so the main
  module's name and file are hidden from multiprocessing while the pool starts.
  """
  main = sys.modules.get('__main__')
  saved = {k: main.__dict__[k] for k in ('__spec__', '__file__') if main and k in main.__dict__}
  try:
    if main is not None:
      main.__spec__ = None
      main.__dict__.pop('__file__', None)
    yield
  finally:
    if main is not None:
      main.__dict__.update(saved)


class _Pool:
  """Ordered, bounded map over a process pool, started lazily (small inputs stay in-process)."""

  def __init__(self, num_workers: int, init_args):
    self.num_workers, self.init_args = num_workers, init_args
    self.pool = None
    self.pending = collections.deque()
    _init_worker(*init_args)  # In-process tokenizer for the first chunk / 1 worker.

  def submit(self, task):
    """Queues ``task``; yields finished results in submission order (bounded backlog)."""
    if self.num_workers <= 1:
      yield _tokenize_chunk(task)
      return
    if self.pool is None and not self.pending:
      self.pending.append(('done', _tokenize_chunk(task)))  # First chunk: no pool yet.
      return
    if self.pool is None:
      ctx = multiprocessing.get_context(_start_method())
      with _main_not_reimported():
        self.pool = ctx.Pool(self.num_workers, initializer=_init_worker,
                             initargs=self.init_args)
    self.pending.append(('async', self.pool.apply_async(_tokenize_chunk, (task,))))
    while len(self.pending) > 2 * self.num_workers:
      yield self._pop()

  def _pop(self):
    kind, value = self.pending.popleft()
    return value if kind == 'done' else value.get()

  def drain(self):
    while self.pending:
      yield self._pop()

  def close(self):
    if self.pool is not None:
      self.pool.close()
      self.pool.join()


# ---------------------------------------------------------------------------- preparation


class _HeldOut:
  """Selects held-out documents by hash score, with a cap (lowest scores win)."""

  def __init__(self, fraction: float, max_documents: int):
    if not 0.0 <= fraction < 1.0:
      raise ValueError(f'config.data.held_out_fraction must be in [0, 1); got {fraction}')
    if max_documents < 0:
      raise ValueError('config.data.held_out_max_documents must be >= 0; got '
                       f'{max_documents}')
    self.fraction, self.max_documents = fraction, max_documents
    self.heap = []  # (-score, source, ordinal, tokens, sentence_lens, word starts or None)

  def offer(self, source: int, ordinal: int, tokens, sentence_lens, starts):
    """Returns None if held out, else the (possibly other) document that goes to train."""
    score = seeding.unit_interval(seeding.HELD_OUT, source, ordinal)
    item = (-score, source, ordinal, tokens, sentence_lens, starts)
    if score >= self.fraction or self.max_documents == 0:
      return item
    if len(self.heap) < self.max_documents:
      heapq.heappush(self.heap, item)
      return None
    return heapq.heappushpop(self.heap, item)

  def documents(self):
    return sorted(self.heap, key=lambda item: (item[1], item[2]))


def _summary(manifest: dict) -> str:
  lines = [f"Prepared {manifest['directory']}:"]
  for split in ('train', 'held_out'):
    s = manifest['splits'][split]
    lines.append(f"  {split}: {s['documents']} documents, {s['sentences']} sentences, "
                 f"{s['tokens']} tokens in {len(s['shards'])} shards")
  words = manifest.get('words')
  if words:
    for script, c in words['by_script'].items():
      by = (words['segmenters'].get(script) or 'the vocabulary ').split(' ')[0]
      by = by if script in words['segmenters'] else 'the vocabulary'
      lines.append(f"  words, {script}: {c['words']} in {c['sentences']} sentences of "
                   f"{c['tokens']} tokens (word starts from {by})")
  t = manifest['throughput']
  lines.append(f"  {t['raw_megabytes']:.2f} MB raw text in {t['seconds']:.1f} s "
               f"({t['raw_megabytes_per_second']:.2f} MB/s, {t['tokens_per_second']:.0f} "
               f"tokens/s, tokenizer training {t['tokenizer_seconds']:.1f} s)")
  if manifest['skipped']:
    lines.append('  skipped or altered input (see manifest.json for locations):')
    for reason, entry in manifest['skipped'].items():
      lines.append(f"    {reason}: {entry['count']}  e.g. {entry['examples'][:2]}")
  else:
    lines.append('  nothing skipped.')
  return '\n'.join(lines)


def _partial_directory(directory: str) -> str:
  """A fresh ``<directory>.partial-<host>-<pid>-<process start>``; removes this host's dead
  ones.

  Unique per process, so hosts sharing a file system can prepare the same directory at
  once (the first to finish wins; the others use its result). The name records its owner
  as a lock file does (``locks.pid_running`` judges it: a pid reused by a process
  started at another time is not the owner); a name without the start time (where /proc
  is missing) is judged by its pid alone.
  """
  host = socket.gethostname()
  prefix = f"{directory.rstrip('/')}.partial-{host}-"
  for stale in glob.glob(glob.escape(prefix) + '*'):
    owner = _partial_owner(stale[len(prefix):])
    if owner is not None and not locks.pid_running(*owner):
      logging.warning('Removing the unfinished preparation %s', stale)
      shutil.rmtree(stale, ignore_errors=True)
  pid = os.getpid()
  start = locks.process_start(pid)
  partial = prefix + (f'{pid}-{start}' if start is not None else str(pid))
  shutil.rmtree(partial, ignore_errors=True)
  os.makedirs(partial)
  return partial


def _partial_owner(tag: str) -> tuple[int, int | None] | None:
  """(pid, process start or None) from a partial directory's ``<pid>[-<start>]``; None
  for a name that is not one."""
  pid, _, start = tag.partition('-')
  if not pid.isdigit() or not (start.isdigit() or not start):
    return None
  return int(pid), int(start) if start else None


def prepare(config, directory: str | None = None) -> dict:
  """Prepares ``directory`` (default: ``prepared_directory(config)``); returns the manifest."""
  start_time = time.time()
  fields = content_fields(config)
  directory = directory or prepared_directory(config, fields)
  srcs = sources_lib.parse_sources(config.data)
  for s in srcs:  # Fail early on missing files / datasets, before training a tokenizer.
    s.check_exists()
  partial = _partial_directory(directory)
  try:
    return _prepare_into(config, fields, srcs, directory, partial, start_time)
  finally:
    shutil.rmtree(partial, ignore_errors=True)  # Renamed away on success.


def _tokenizer_file(config, srcs, partial: str) -> str:
  """The kind's tokenizer file in ``partial``, copied from config.tokenizer.path or trained
  on the corpus (``TokenizerKind.train``); its name."""
  kind, path = str(config.tokenizer.kind), str(config.tokenizer.path)
  spec = tokenizer_kinds.get(kind, ' (config.tokenizer.kind)')
  target = os.path.join(partial, spec.file)
  if path.startswith('gs://'):  # A gs:// workdir's pinned tokenizer (an imported model).
    with storage.open_read(path) as src, open(target, 'wb') as dst:
      shutil.copyfileobj(src, dst)
  elif path:
    shutil.copyfile(path, target)
  elif spec.train is None:
    raise ValueError(f'config.tokenizer.kind={kind!r} needs config.tokenizer.path = '
                     f'{spec.given_file}.')
  else:
    spec.train(config, srcs, target)
  return spec.file


def _prepare_into(config, fields, srcs, directory, partial, start_time) -> dict:
  """Tokenizer, shards and manifest into ``partial``, then renamed to ``directory``."""
  kind, lowercase = str(config.tokenizer.kind), bool(config.tokenizer.lowercase)
  vocab_size = int(config.model.vocab_size)
  tok_start = time.time()
  tok_file = _tokenizer_file(config, srcs, partial)
  tok_seconds = time.time() - tok_start
  tok = tokenizer_lib.Tokenizer.from_file(kind, os.path.join(partial, tok_file), lowercase)
  tok.check_vocab_size(vocab_size)
  num_workers = int(config.data.num_workers) or os.cpu_count() or 1
  out = _Output(config, partial, len(srcs), shards_lib.token_dtype(vocab_size))
  resolved = fields['word_segmenters']
  pool = _Pool(num_workers, (kind, os.path.join(partial, tok_file), lowercase,
                             str(config.data.word_segmenter), resolved))
  try:
    source_entries = [_read_source(si, source, pool, out, int(config.data.max_sentence_chars))
                      for si, source in enumerate(srcs)]
  finally:
    pool.close()
  out.finish()
  report_all = sources_lib.Report()
  for report in out.reports:
    report_all.merge(report)
  splits = _split_counts(out, source_entries)
  if splits['train']['documents'] == 0:
    shutil.rmtree(partial)
    raise ValueError(
        f'config.data.sources = {config.data.sources!r}: the corpus is empty after reading '
        f'(no document with a non-empty sentence reached the train split). Skipped: '
        f'{ {r: e["count"] for r, e in report_all.to_json().items()} }')
  seconds = time.time() - start_time
  raw_bytes = sum(e['raw_bytes'] for e in source_entries)
  manifest = dict(
      format_version=FORMAT_VERSION,
      directory=directory,
      config_hash=config_hash(fields),
      config_fields=fields,
      tokenizer=dict(kind=kind, file=tok_file, sha256=tokenizer_lib.file_sha256(
          os.path.join(partial, tok_file)), vocab_size=tok.vocab_size, lowercase=lowercase,
                     pad_id=tok.pad_id, unk_id=tok.unk_id, cls_id=tok.cls_id,
                     sep_id=tok.sep_id, mask_id=tok.mask_id),
      token_dtype=out.dtype.name,
      sources=source_entries,
      splits=splits,
      skipped=report_all.to_json(),
      words=None if resolved is None else dict(
          segmenter=str(config.data.word_segmenter), segmenters=resolved,
          by_script={k: dict(zip(('sentences', 'tokens', 'words'), v))
                     for k, v in sorted(out.by_script.items())}),
      unigram_counts=sum(w.unigram_counts for w in out.train).tolist(),
      throughput=_throughput(seconds, tok_seconds, raw_bytes, splits, num_workers),
      created=time.strftime('%Y-%m-%dT%H:%M:%S'),
      python=sys.version.split()[0],
  )
  return _publish(manifest, partial, directory)


class _Output:
  """The shard writers of one preparation: train per source, and the held-out set."""

  def __init__(self, config, partial: str, num_sources: int, dtype: np.dtype):
    self.partial, self.dtype, self.num_sources = partial, dtype, num_sources
    self.max_tokens = int(config.data.shard_max_tokens)
    self.vocab_size = int(config.model.vocab_size)
    self.held_out = _HeldOut(float(config.data.held_out_fraction),
                             int(config.data.held_out_max_documents))
    self.train = [self._writer('train', si) for si in range(num_sources)]
    self.held: list[shards_lib.ShardWriter] = []  # Written by finish().
    self.reports = [sources_lib.Report() for _ in range(num_sources)]
    self.by_script: dict[str, list[int]] = {}  # Sentences, tokens, words per script.

  def _writer(self, split: str, si: int) -> shards_lib.ShardWriter:
    return shards_lib.ShardWriter(self.partial, split, si, self.max_tokens, self.dtype,
                                  self.vocab_size, count_unigrams=split == 'train')

  def consume(self, si: int, stats: collections.Counter, result) -> None:
    """One tokenized chunk of source ``si`` (``_tokenize_chunk``): its documents go to the
    held-out set (by hash score) or to train; ``stats`` counts them."""
    flat, starts, lens, doc_sents, kept, rep, nbytes, by_script = result
    self.reports[si].merge(rep)
    for script, counts in by_script.items():
      total = self.by_script.setdefault(script, [0, 0, 0])
      total[:] = [a + b for a, b in zip(total, counts)]
    cut = (lambda a, lo, hi: None) if starts is None else (lambda a, lo, hi: a[lo:hi])
    stats['raw_bytes'] += nbytes
    stats['documents_read'] += len(kept)
    ordinal0 = stats['ordinal']
    stats['ordinal'] += len(kept)
    ordinals = ordinal0 + np.flatnonzero(kept)
    sent_off = np.concatenate([[0], np.cumsum(doc_sents)])
    tok_off = np.concatenate([[0], np.cumsum(lens)])
    train_mask = np.ones(len(doc_sents), bool)
    held_out = self.held_out
    for d, ordinal in enumerate(ordinals.tolist()):
      if seeding.unit_interval(seeding.HELD_OUT, si, ordinal) < held_out.fraction:
        s0, s1 = sent_off[d], sent_off[d + 1]
        t0, t1 = tok_off[s0], tok_off[s1]
        out = held_out.offer(si, ordinal, flat[t0:t1], lens[s0:s1], cut(starts, t0, t1))
        train_mask[d] = False
        if out is not None:  # Pushed out of (or never in) the held-out set.
          self.train[out[1]].add(out[3], out[4], np.array([len(out[4])]), out[5])
    writer = self.train[si]
    if train_mask.all():
      writer.add(flat, lens, doc_sents, starts)
    elif train_mask.any():
      sent_keep = np.repeat(train_mask, doc_sents)
      tok_keep = np.repeat(sent_keep, lens)
      writer.add(flat[tok_keep], lens[sent_keep], doc_sents[train_mask],
                 None if starts is None else starts[tok_keep])

  def finish(self) -> None:
    """Writes the held-out documents and flushes every writer."""
    self.held = [self._writer('held_out', si) for si in range(self.num_sources)]
    for _, si, _, tokens, lens, starts in self.held_out.documents():
      self.held[si].add(tokens, lens, np.array([len(lens)]), starts)
    for w in self.train + self.held:
      w.flush()


def _read_source(si: int, source, pool: '_Pool', out: _Output, max_chars: int) -> dict:
  """Streams source ``si`` through the workers into ``out``; its manifest entry (the split
  counts are added by ``_split_counts``)."""
  stats = collections.Counter()
  report = out.reports[si]
  chunk, chunk_chars = [], 0

  def submit(chunk):
    for result in pool.submit((chunk, source.lines_are_sentences, max_chars, out.dtype)):
      out.consume(si, stats, result)

  for doc in source.documents(report):
    chunk.append((doc.lines, doc.where))
    chunk_chars += sum(len(line) for line in doc.lines)
    if chunk_chars >= _CHUNK_CHARS:
      submit(chunk)
      chunk, chunk_chars = [], 0
  if chunk:
    submit(chunk)
  for result in pool.drain():
    out.consume(si, stats, result)
  if stats['documents_read'] == 0:
    logging.warning('config.data.sources: %r yielded no documents.', source.spec)
  return dict(spec=source.spec, kind=source.kind, weight=source.weight,
              documents_read=stats['documents_read'], raw_bytes=stats['raw_bytes'],
              skipped=report.to_json())


def _split_counts(out: _Output, source_entries: list[dict]) -> dict:
  """The manifest's splits (shards and totals); adds each source's counts to its entry."""
  counts = ('documents', 'sentences', 'tokens')
  splits = {}
  for split, writers in (('train', out.train), ('held_out', out.held)):
    shard_entries = [e for w in writers for e in w.shards]
    splits[split] = dict(shards=shard_entries,
                         **{k: sum(e[k] for e in shard_entries) for k in counts})
  for si, entry in enumerate(source_entries):
    for split, writers in (('train', out.train), ('held_out', out.held)):
      entry[split] = {k: sum(e[k] for e in writers[si].shards) for k in counts}
  return splits


def _throughput(seconds: float, tok_seconds: float, raw_bytes: int, splits: dict,
                num_workers: int) -> dict:
  tokens = splits['train']['tokens'] + splits['held_out']['tokens']
  work = max(seconds - tok_seconds, 1e-9)
  return dict(seconds=seconds, tokenizer_seconds=tok_seconds, raw_megabytes=raw_bytes / 1e6,
              raw_megabytes_per_second=raw_bytes / 1e6 / work,
              tokens_per_second=tokens / work, workers=num_workers)


def _publish(manifest: dict, partial: str, directory: str) -> dict:
  """Writes the manifest and renames ``partial`` to ``directory``, unless another process
  finished it first (its manifest is returned then); prints the summary."""
  with open(os.path.join(partial, MANIFEST), 'w') as f:
    json.dump(manifest, f, indent=1)
  if os.path.exists(directory):
    if os.path.exists(os.path.join(directory, MANIFEST)):  # Another process was faster.
      shutil.rmtree(partial)
      theirs = _read_manifest(directory)
      if theirs.get('config_hash') != manifest['config_hash']:
        raise FileExistsError(f'{directory!r} was prepared concurrently from another config.')
      logging.info('%s was prepared concurrently by another process; using it.', directory)
      return theirs
    if os.listdir(directory):
      shutil.rmtree(partial)
      raise FileExistsError(
          f'{directory!r} (config.data.prepared_dir) exists, has no {MANIFEST} and is not '
          'empty; refusing to overwrite it. Point prepared_dir to a new or empty directory.')
    os.rmdir(directory)
  os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
  os.replace(partial, directory)
  print(_summary(manifest), flush=True)  # Printed, not logged: shown however logging is set.
  return manifest


def _read_manifest(directory: str) -> dict:
  with open(os.path.join(directory, MANIFEST)) as f:
    return json.load(f)


# ---------------------------------------------------------------------------- loading


def _diff(stored: dict, current: dict) -> str:
  keys = sorted(set(stored) | set(current))
  return '; '.join(f'{k}: prepared {stored.get(k)!r} != config {current.get(k)!r}'
                   for k in keys if stored.get(k) != current.get(k))


def load(config, directory: str | None = None) -> PreparedData:
  """Opens a prepared directory, checking it was made from this config's content fields."""
  fields = content_fields(config)
  directory = directory or prepared_directory(config, fields)
  path = os.path.join(directory, MANIFEST)
  if not os.path.exists(path):
    raise FileNotFoundError(f'No prepared data at {directory!r} (no {MANIFEST}); run '
                            'python -m encoder_jax.prepare --config=... or load_or_prepare.')
  manifest = _read_manifest(directory)
  if manifest.get('config_hash') != config_hash(fields):
    raise ValueError(
        f'Prepared data in {directory!r} was made from a different config '
        f'(config.data.prepared_dir): {_diff(manifest.get("config_fields", {}), fields)}. '
        'Delete that directory or set another config.data.prepared_dir to re-prepare; data '
        'from different configs is never mixed.')
  tok_info = manifest['tokenizer']
  tok_path = os.path.join(directory, tok_info['file'])
  if not os.path.exists(tok_path):
    raise FileNotFoundError(f'The tokenizer {tok_path!r} of the prepared data is missing.')
  if tokenizer_lib.file_sha256(tok_path) != tok_info['sha256']:
    raise ValueError(f'The tokenizer {tok_path!r} changed after preparation (sha256 differs '
                     'from the manifest); its token ids would not match the shards. Delete '
                     f'{directory!r} to re-prepare.')
  tok = tokenizer_lib.Tokenizer.from_file(tok_info['kind'], tok_path, tok_info['lowercase'])
  tok.check_vocab_size(int(config.model.vocab_size))
  counts = np.asarray(manifest['unigram_counts'], np.int64)
  return PreparedData(directory=directory, manifest=manifest, tokenizer=tok,
                      unigram_counts=counts)


def load_or_prepare(config) -> PreparedData:
  """Loads the prepared data for ``config``, preparing it first if it does not exist.

  Processes asking at once (the hosts of one run) prepare it once: see ``prepare_once``.
  """
  fields = content_fields(config)
  directory = prepared_directory(config, fields)
  if directory.startswith('gs://'):  # Prepared once for every host, copied to each.
    return load(config, prepare_once.through_bucket(directory, MANIFEST,
                                                    lambda local: prepare(config, local)))
  manifest = os.path.join(directory, MANIFEST)
  if not prepare_once.prepare_once(directory, manifest, lambda: prepare(config, directory)):
    logging.info('Using prepared data in %s', directory)
  return load(config, directory)
