"""The prepared-shard format: writing as documents stream in, memory-mapped reading.

A shard ``{split}-s{source:02d}-{index:05d}`` is three ``.npy`` files:
  ``.tokens.npy``     flat token ids of all its documents (uint16 if vocab <= 65536, else int32)
  ``.sentences.npy``  int64 [num_sentences + 1]: token offset where each sentence starts, then
                      the total (sentence ``j`` = tokens[s[j]:s[j+1]])
  ``.documents.npy``  int64 [num_documents + 1]: sentence offset where each document starts
  ``.word_starts.npy`` bool, beside the tokens: whether each token starts a word
                      (``words.py``); absent when the data was prepared without them
                      (``config.data.word_segmenter='none'``)
Documents never span shards and every shard holds one source, so a document is always a
contiguous token range and so is any run of its sentences. Reading uses ``np.load(...,
mmap_mode='r')``: nothing is read until used, so corpora larger than RAM work.
"""

from __future__ import annotations

import bisect
import os

import numpy as np

SUFFIXES = ('tokens', 'sentences', 'documents')
WORD_STARTS = 'word_starts'


class Tokens(np.ndarray):
  """A shard's token ids, with its per-token word starts beside them (``word_starts``:
  bool, the same length; None when the data has none). Builders pass it through in their
  pieces; ``iterators.render`` reads both."""
  word_starts: np.ndarray | None = None


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.int32)


def shard_name(split: str, source: int, index: int) -> str:
  return f'{split}-s{source:02d}-{index:05d}'


class ShardWriter:
  """Buffers tokenized documents of one (split, source) and writes shards as they fill."""

  def __init__(self, directory: str, split: str, source: int, max_tokens: int,
               dtype: np.dtype, vocab_size: int, count_unigrams: bool):
    self.directory, self.split, self.source = directory, split, source
    self.max_tokens, self.dtype, self.vocab_size = max_tokens, dtype, vocab_size
    self.count_unigrams = count_unigrams
    self.unigram_counts = np.zeros(vocab_size, np.int64)
    self.shards: list[dict] = []  # Manifest entries.
    self._reset()

  def _reset(self):
    self._tokens, self._sentence_lens, self._doc_sentences = [], [], []
    self._starts = []
    self._num_tokens = 0

  def add(self, tokens: np.ndarray, sentence_lens: np.ndarray, doc_sentences: np.ndarray,
          word_starts: np.ndarray | None = None):
    """Appends whole documents: flat tokens, tokens per sentence, sentences per document
    (and each token's word start: given for every document of a writer, or for none)."""
    if len(doc_sentences) == 0:
      return
    self._tokens.append(tokens)
    if word_starts is not None:
      self._starts.append(np.asarray(word_starts, np.bool_))
    self._sentence_lens.append(sentence_lens)
    self._doc_sentences.append(doc_sentences)
    self._num_tokens += len(tokens)
    if self._num_tokens >= self.max_tokens:
      self.flush()

  def flush(self):
    if not self._doc_sentences:
      return
    tokens = np.concatenate(self._tokens).astype(self.dtype, copy=False)
    sentences = np.zeros(sum(len(s) for s in self._sentence_lens) + 1, np.int64)
    np.cumsum(np.concatenate(self._sentence_lens), out=sentences[1:])
    documents = np.zeros(sum(len(d) for d in self._doc_sentences) + 1, np.int64)
    np.cumsum(np.concatenate(self._doc_sentences), out=documents[1:])
    name = shard_name(self.split, self.source, len(self.shards))
    for suffix, array in zip(SUFFIXES, (tokens, sentences, documents)):
      np.save(os.path.join(self.directory, f'{name}.{suffix}.npy'), array)
    if self._starts:
      starts = np.concatenate(self._starts)
      if len(starts) != len(tokens):
        raise AssertionError('word starts given for some documents only (bug)')
      np.save(os.path.join(self.directory, f'{name}.{WORD_STARTS}.npy'), starts)
    if self.count_unigrams:
      self.unigram_counts += np.bincount(tokens, minlength=self.vocab_size)[:self.vocab_size]
    self.shards.append(dict(name=name, source=self.source, documents=len(documents) - 1,
                            sentences=len(sentences) - 1, tokens=len(tokens)))
    self._reset()


class CorpusSplit:
  """Read-only view of one prepared split: documents by global id, over all sources.

  Global document ids run over the sources in config order, then shards, then documents.
  """

  def __init__(self, directory: str, shards: list[dict], num_sources: int,
               word_starts: bool = False):
    self.directory = directory
    self._tokens, self._sentences, self._documents = [], [], []
    self._first_doc = [0]  # Global id of each shard's first document (+ total).
    docs_per_source = [0] * num_sources
    for entry in sorted(shards, key=lambda e: (e['source'], e['name'])):
      arrays = []
      for suffix in SUFFIXES:
        path = os.path.join(directory, f"{entry['name']}.{suffix}.npy")
        if not os.path.exists(path):
          raise FileNotFoundError(f'Prepared shard file {path!r} listed in the manifest is '
                                  'missing; delete the prepared directory to re-prepare.')
        arrays.append(np.load(path, mmap_mode='r').view(np.ndarray))
      if len(arrays[2]) - 1 != entry['documents'] or len(arrays[0]) != entry['tokens']:
        raise ValueError(f"Prepared shard {entry['name']!r} in {directory!r} does not match "
                         'its manifest entry (truncated copy?); re-prepare it.')
      tokens = arrays[0].view(Tokens)
      if word_starts:
        path = os.path.join(directory, f"{entry['name']}.{WORD_STARTS}.npy")
        if not os.path.exists(path):
          raise FileNotFoundError(f'Prepared shard file {path!r} (word starts, listed by the '
                                  'manifest) is missing; delete the prepared directory to '
                                  're-prepare.')
        tokens.word_starts = np.load(path, mmap_mode='r').view(np.ndarray)
        if tokens.word_starts.shape != tokens.shape:
          raise ValueError(f'Prepared shard file {path!r} has {len(tokens.word_starts)} word '
                           f"starts for {len(tokens)} tokens (truncated copy?); re-prepare it.")
      self._tokens.append(tokens)
      self._sentences.append(arrays[1])
      self._documents.append(arrays[2])
      self._first_doc.append(self._first_doc[-1] + entry['documents'])
      docs_per_source[entry['source']] += entry['documents']
    self.num_documents = self._first_doc[-1]
    self.source_offsets = [0]  # First global id of each source (+ total).
    for n in docs_per_source:
      self.source_offsets.append(self.source_offsets[-1] + n)

  def document(self, g: int) -> tuple[np.ndarray, list[int]]:
    """``(tokens, bounds)``: sentence ``j`` of document ``g`` is tokens[bounds[j]:bounds[j+1]]."""
    s = bisect.bisect_right(self._first_doc, g) - 1
    d = g - self._first_doc[s]
    first, last = self._documents[s][d:d + 2].tolist()
    return self._tokens[s], self._sentences[s][first:last + 1].tolist()

  def sentence_counts_by_source(self) -> list[np.ndarray]:
    """Per source, the number of sentences of each of its documents (reads all offsets)."""
    per_shard = [np.diff(d) for d in self._documents]
    out = []
    shard = 0
    for i in range(len(self.source_offsets) - 1):
      parts = []
      while (shard < len(per_shard)
             and self._first_doc[shard] < self.source_offsets[i + 1]):
        parts.append(per_shard[shard])
        shard += 1
      out.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return out

  def num_tokens(self) -> int:
    return int(sum(len(t) for t in self._tokens))
