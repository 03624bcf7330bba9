"""RoBERTa's single-segment inputs: FULL-SENTENCES and DOC-SENTENCES.

Contiguous sentences are packed greedily, in stream order, into ``[CLS] ... [SEP]`` of at
most ``seq_len`` tokens; no pair label (0). FULL-SENTENCES continues into the next document
(and the next epoch), closing the previous document's piece with an extra ``[SEP]``;
DOC-SENTENCES ends the sequence at every document end (the last one of a document is
shorter). A sentence that does not fit in the remaining space starts the next sequence; a
single sentence longer than ``seq_len - 2`` is truncated to fit, alone in its sequence (its
tail is dropped). Every sentence is used exactly once per epoch otherwise. ``sub`` in the
cursor is the index of the next sentence in the current document.
"""

from __future__ import annotations


class _Packer:
  length_dependent_cursor = False  # A sentence index means the same at any length.
  cross_documents = True
  pair_labels = False  # Every label is 0: there is no pair objective to feed.

  def __init__(self, seed: int, short_seq_prob: float):
    del seed, short_seq_prob  # Deterministic: no random choices besides the epoch order.

  @staticmethod
  def check_corpus(documents: int, sentences: int, tokens: int, where: str) -> list[str]:
    """Any non-empty corpus packs (see ``NextSentencePairs.check_corpus``)."""
    del documents, sentences, tokens, where
    return []

  def generate(self, stream, cursor, seq_len: int):
    """Yields ``(instance, cursor after it)`` from ``cursor`` on, until the stream ends."""
    epoch, k, sub = cursor
    budget = seq_len - 1  # Room after [CLS]; every piece costs its tokens + one [SEP].
    pieces, used = [], 0
    while True:
      order = stream.order(epoch)
      if order is None:
        break
      while k < len(order):
        tokens, bounds = stream.document(int(order[k]))
        n = len(bounds) - 1
        j = sub
        while j < n:
          piece_start = bounds[j]
          while j < n and used + bounds[j + 1] - piece_start + 1 <= budget:  # +1: its [SEP].
            j += 1
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
        k, sub = k + 1, 0
        if pieces and (not self.cross_documents or used + 2 > budget):
          yield (pieces, 0), (epoch, k, 0)
          pieces, used = [], 0
      epoch, k, sub = epoch + 1, 0, 0
    if pieces:
      yield (pieces, 0), (epoch, 0, 0)


class FullSentences(_Packer):
  cross_documents = True


class DocSentences(_Packer):
  cross_documents = False
