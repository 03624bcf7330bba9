"""RoBERTa's single-segment inputs (FULL-SENTENCES, DOC-SENTENCES), and packed documents.

Contiguous sentences are packed greedily, in stream order, into ``[CLS] ... [SEP]`` of at
most ``seq_len`` tokens; no pair label (0). FULL-SENTENCES continues into the next document
(and the next epoch), closing the previous document's piece with an extra ``[SEP]``;
DOC-SENTENCES ends the sequence at every document end (the last one of a document is
shorter). A sentence that does not fit in the remaining space starts the next sequence; a
single sentence longer than ``seq_len - 2`` is truncated to fit, alone in its sequence (its
tail is dropped). Every sentence is used exactly once per epoch otherwise. ``sub`` in the
cursor is the index of the next sentence in the current document.

PACKED-DOCUMENTS (:class:`PackedDocuments`) fills rows with whole documents, each framed as
a row of its own (``[CLS] document [SEP]``) and numbered (``document_ids``), so that the
encoder attends within each document only and restarts its positions at each [CLS]: a
document reads exactly as it would alone in its row, and no compute goes to padding.
"""

from __future__ import annotations

import numpy as np

from encoder_jax.data import tokenizer_files


def greedy_fill(bounds, start: int, stop: int, limit: int) -> int:
  """The rule of greedy packing, in one place: items ``start``, ``start + 1``, ... (item
  ``i`` spans ``bounds[i]..bounds[i + 1]``, ``bounds`` non-decreasing) are taken in order
  while the last one taken ends at or before ``limit``. Returns the index after the last
  item taken (``start``: none fits), at most ``stop``. The sentence packers below fill a
  sequence's piece with it; :func:`greedy_bins` packs whole items with it."""
  j = start
  while j < stop and bounds[j + 1] <= limit:
    j += 1
  return j


def greedy_bins(lengths, capacity: int) -> list[list[int]]:
  """Greedy packing of whole items: item indices, in order, into bins of ``capacity``; an
  item that does not fit in what is left of the current bin closes it and starts the next
  (one longer than a bin sits alone in its own). Fine-tuning packs whole examples into rows
  with it (``finetune.data.pack``)."""
  ends = np.concatenate([[0], np.cumsum(np.asarray(lengths, np.int64))]).tolist()
  n, bins, i = len(ends) - 1, [], 0
  while i < n:
    stop = max(greedy_fill(ends, i, n, ends[i] + capacity), i + 1)
    bins.append(list(range(i, stop)))
    i = stop
  return bins


def _walk(stream, cursor):
  """``(epoch, k, sub, tokens, bounds)`` of every document from ``cursor`` = (epoch, k,
  sub) on, document ``k`` of the epoch's order starting at ``sub`` (0 for the later ones),
  on into the following epochs; then ``(epoch, None, 0, None, None)`` once, at the end of
  the stream."""
  epoch, k, sub = cursor
  while True:
    order = stream.order(epoch)
    if order is None:
      yield epoch, None, 0, None, None
      return
    while k < len(order):
      tokens, bounds = stream.document(int(order[k]))
      yield epoch, k, sub, tokens, bounds
      k, sub = k + 1, 0
    epoch, k = epoch + 1, 0


class _Packer:
  length_dependent_cursor = False  # A sentence index means the same at any length.
  cross_documents = True
  pair_labels = False  # Every label is 0: there is no pair objective to feed.
  template = tokenizer_files.Template.bert  # [CLS] piece [SEP] piece [SEP] ...
  packs_documents = False  # One text per row (its pieces continue one another).

  def __init__(self, seed: int, short_seq_prob: float):
    del seed, short_seq_prob  # Deterministic: no random choices besides the epoch order.

  @staticmethod
  def check_corpus(documents: int, sentences: int, tokens: int, where: str) -> list[str]:
    """Any non-empty corpus packs (see ``NextSentencePairs.check_corpus``)."""
    del documents, sentences, tokens, where
    return []

  def generate(self, stream, cursor, seq_len: int):
    """Yields ``(instance, cursor after it)`` from ``cursor`` on, until the stream ends."""
    budget = seq_len - 1  # Room after [CLS]; every piece costs its tokens + one [SEP].
    pieces, used = [], 0
    for epoch, k, sub, tokens, bounds in _walk(stream, cursor):
      if tokens is None:  # The stream's end.
        if pieces:
          yield (pieces, 0), (epoch, 0, 0)
        return
      n = len(bounds) - 1
      j = sub
      while j < n:
        piece_start = bounds[j]
        j = greedy_fill(bounds, j, n, piece_start + budget - used - 1)  # -1: its [SEP].
        if bounds[j] > piece_start:  # At least one sentence of this document fits.
          pieces.append((tokens, piece_start, bounds[j], 0))
          used += bounds[j] - piece_start + 1
        if j < n:  # Sentence j does not fit: close the sequence.
          if not pieces:  # Longer than a whole sequence: truncate it, alone.
            pieces.append((tokens, bounds[j], bounds[j] + budget - 1, 0))
            j += 1
          nxt = (epoch, k, j) if j < n else (epoch, k + 1, 0)
          yield (pieces, 0), nxt
          pieces, used = [], 0
      if pieces and (not self.cross_documents or used + 2 > budget):
        yield (pieces, 0), (epoch, k + 1, 0)
        pieces, used = [], 0


class FullSentences(_Packer):
  cross_documents = True


class DocSentences(_Packer):
  cross_documents = False


class PackedDocuments(_Packer):
  """Unpadded rows: documents back to back, each ``[CLS] tokens [SEP]`` with its own id.

  Documents are taken in stream order (and on into the next epoch) and placed one after
  another in a row of ``seq_len`` tokens; a document that does not fit in what is left of
  the row is cut at that token, its first part closing the row and the rest starting the
  next (with its own [CLS]), so every row is full but for fewer than 3 tokens (a piece
  needs [CLS], one token and [SEP]) and the stream's last row. A document longer than a
  row spans several rows. Every token is used exactly once per epoch; ``sub`` in the
  cursor is the token offset in the current document (the same at any length). No pair
  label (0).

  Rendered per document (``iterators.render``: each piece framed alone), the rows carry
  ``document_ids`` [N, L] (1, 2, ... in row order, 0 = padding) beside the usual arrays;
  the encoder derives from it the block-diagonal attention mask and the positions
  restarting at each document (``models.packing``), so only kinds whose attention reads it
  (``ModelKind.packed_rows``) may train on these rows (``validation``).
  """

  # A token offset in the cursor (``sub``) means the same at any length, as a sentence
  # index does; no pair label; any non-empty corpus packs (``_Packer``). Each piece is
  # framed alone and rows carry 'document_ids' (read by validation and the models).
  packs_documents = True

  def generate(self, stream, cursor, seq_len: int):
    """Yields ``(instance, cursor after it)`` from ``cursor`` on, until the stream ends."""
    if seq_len < 3:
      raise ValueError(f'Packed rows need seq_len >= 3 ([CLS] token [SEP]); got {seq_len}')
    pieces, room = [], seq_len
    for epoch, k, sub, tokens, bounds in _walk(stream, cursor):
      if tokens is None:  # The stream's end.
        if pieces:
          yield (pieces, 0), (epoch, 0, 0)
        return
      start, stop = bounds[0] + sub, bounds[-1]
      while start < stop:
        take = min(stop - start, room - 2)
        pieces.append((tokens, start, start + take, 0))
        start += take
        room -= take + 2
        if room < 3:  # No room for another piece: close the row.
          nxt = (epoch, k, start - bounds[0]) if start < stop else (epoch, k + 1, 0)
          yield (pieces, 0), nxt
          pieces, room = [], seq_len
