"""Sentence pairs: BERT next-sentence prediction and ALBERT sentence-order prediction.

``NextSentencePairs`` follows google-research/bert ``create_instances_from_document``
step by step: one target length per document (``max_num_tokens = seq_len - 3``, or with
probability ``short_seq_prob`` a random length in [2, max_num_tokens]); sentences are
accumulated into a chunk until it reaches the target or the document ends; segment A is the
first ``a_end`` sentences (``a_end`` uniform in [1, len(chunk) - 1]); B is the rest of the
chunk (label 0), or, with probability 0.5 or when the chunk has one sentence, sentences from a
random other document from a random start up to the remaining target length (label 1), and
then the unused sentences of the chunk are put back (``i -= num_unused``); finally
``truncate_seq_pair`` trims the longer segment, one token at a time from the front or the
back at random, until the pair fits ``max_num_tokens``. That loop is computed in closed form
here (how many tokens each segment loses, and a Binomial(k, 1/2) front/back split of k).

``SentenceOrderPairs`` (ALBERT SOP) uses the same chunking, but B is always the actual
continuation and the two segments are swapped with probability 0.5 (label 1 = swapped). A
chunk of one sentence is cut at a random token into two halves (ALBERT would instead draw a
random-document B, which is an NSP example, not an order example); a one-token chunk is
skipped.

Some corpora cannot feed a pair objective: ``check_corpus`` says so from the split's counts
(documents, sentences, tokens; in the manifest) before any example is built, stopping when
no valid pair can ever be built and warning when the pairs would be ill-posed or all of one
class (a pair accuracy of 1.0 from the first step teaches nothing).
"""

from __future__ import annotations

import random

from encoder_jax.data import seeding
from encoder_jax.data import tokenizer_files


def _popcount(x: int) -> int:
  return bin(x).count('1')


class _PairBuilder:
  """Per-document instances; ``sub`` in the cursor is the instance index in the document."""

  length_dependent_cursor = True  # Instances differ with seq_len: a new length restarts a doc.
  pair_labels = True  # Labels are a pair objective's targets (see iterators' first-pool check).
  template = tokenizer_files.Template.bert  # [CLS] A [SEP] B [SEP].
  packs_documents = False  # One text per row (A and B).

  def __init__(self, seed: int, short_seq_prob: float):
    if not 0.0 <= short_seq_prob <= 1.0:
      raise ValueError(f'config.data.short_seq_prob must be in [0, 1]; got {short_seq_prob}')
    self.seed = seed
    self.short_seq_prob = short_seq_prob

  def generate(self, stream, cursor, seq_len: int):
    """Yields ``(instance, cursor after it)`` from ``cursor`` on, until the stream ends."""
    epoch, k, sub = cursor
    while True:
      order = stream.order(epoch)
      if order is None:
        return
      while k < len(order):
        g = int(order[k])
        instances = self.document_instances(stream, g, epoch, seq_len)
        n = len(instances)
        for j in range(sub, n):
          yield instances[j], ((epoch, k, j + 1) if j + 1 < n else (epoch, k + 1, 0))
        k, sub = k + 1, 0
      epoch, k, sub = epoch + 1, 0, 0

  def _truncate(self, rng: random.Random, a, b, max_num_tokens: int):
    """``truncate_seq_pair`` on token ranges ``a = (start, stop)`` and ``b``, in O(1)."""
    la, lb = a[1] - a[0], b[1] - b[0]
    excess = la + lb - max_num_tokens
    if excess <= 0:
      return a, b
    first = min(excess, abs(la - lb))  # Removed from the longer one until equal...
    rest = excess - first  # ...then alternately, b first (ties trim b in the original).
    if la > lb:
      ra, rb = first + rest // 2, rest - rest // 2
    else:
      ra, rb = rest // 2, first + rest - rest // 2
    fa = _popcount(rng.getrandbits(ra)) if ra else 0  # Binomial(ra, 1/2) from the front.
    fb = _popcount(rng.getrandbits(rb)) if rb else 0
    return (a[0] + fa, a[1] - (ra - fa)), (b[0] + fb, b[1] - (rb - fb))

  def document_instances(self, stream, g: int, epoch: int, seq_len: int) -> list:
    tokens, bounds = stream.document(g)
    rng = random.Random(seeding.mix(self.seed, seeding.DOCUMENT, epoch, g, seq_len))
    max_num_tokens = seq_len - 3
    target = max_num_tokens
    if rng.random() < self.short_seq_prob:
      target = rng.randint(2, max_num_tokens)
    n = len(bounds) - 1
    out = []
    chunk_start, length, i = 0, 0, 0
    while i < n:
      length += bounds[i + 1] - bounds[i]
      if i == n - 1 or length >= target:
        m = i - chunk_start + 1
        a_end = rng.randint(1, m - 1) if m >= 2 else 1
        i = self._pair(out, rng, stream, g, tokens, bounds, chunk_start, a_end, i, target,
                       max_num_tokens)
        chunk_start, length = i + 1, 0
      i += 1
    return out


class NextSentencePairs(_PairBuilder):
  """BERT NSP: label 1 = B is from a random document (not the next segment)."""

  @staticmethod
  def check_corpus(documents: int, sentences: int, tokens: int, where: str) -> list[str]:
    """Warnings for a split NSP cannot use well; ValueError when it has no pair at all.

    A positive (label 0) needs a document of >= 2 sentences (``sentences > documents``,
    since every document has >= 1); a negative (label 1) needs a second document.
    """
    del tokens
    fix = ('use a corpus of several multi-sentence documents (google-research/bert layout: one '
           "sentence per line, a blank line between documents), or config.data.pair_kind="
           "'full_sentences' with config.objective.names=('mlm',)")
    if documents < 2 and sentences <= documents:
      raise ValueError(
          f'{where} has {documents} document of {sentences} sentence: NSP '
          "(config.data.pair_kind='nsp') can build no pair from it, neither a next sentence "
          f'(label 0) nor a sentence of another document (label 1); {fix}.')
    out = []
    if sentences <= documents:
      out.append(
          f'{where}: every one of its {documents} documents has one sentence, so no NSP pair has '
          "a real next sentence: every example takes B from another document and the pair "
          'labels are all 1 (pair accuracy 1.0 from the first steps means nothing); ' + fix)
    elif documents < 2:
      out.append(
          f'{where} has a single document ({sentences} sentences): NSP negatives (label 1) '
          'need B from another document, so they come from the same document and the pair '
          'task is ill-posed (its accuracy means little); ' + fix)
    return out

  def _pair(self, out, rng, stream, g, tokens, bounds, start, a_end, i, target,
            max_num_tokens):
    a = (bounds[start], bounds[start + a_end])
    m = i - start + 1
    if m == 1 or rng.random() < 0.5:
      target_b = target - (a[1] - a[0])
      num_docs = stream.num_documents
      h = g
      for _ in range(10):
        h = rng.randint(0, num_docs - 1)
        if h != g:
          break
      b_tokens, rb = stream.document(h)
      rs = rng.randint(0, len(rb) - 2)
      j = rs
      while j < len(rb) - 2 and rb[j + 1] - rb[rs] < target_b:
        j += 1
      b = (rb[rs], rb[j + 1])
      i -= m - a_end  # Put the unused sentences of the chunk back.
      label = 1
    else:
      b_tokens, b = tokens, (bounds[start + a_end], bounds[i + 1])
      label = 0
    a, b = self._truncate(rng, a, b, max_num_tokens)
    out.append(([(tokens, a[0], a[1], 0), (b_tokens, b[0], b[1], 1)], label))
    return i


class SentenceOrderPairs(_PairBuilder):
  """ALBERT SOP: label 1 = the two consecutive segments are swapped."""

  @staticmethod
  def check_corpus(documents: int, sentences: int, tokens: int, where: str) -> list[str]:
    """Warnings for a split SOP cannot use well; ValueError when it has no pair at all.

    A pair needs a document of >= 2 tokens (two sentences, or one sentence cut in two);
    every document has >= 1 token, so ``tokens > documents`` says one exists.
    """
    fix = ('use a corpus of multi-sentence documents, or config.data.pair_kind='
           "'full_sentences' with config.objective.names=('mlm',)")
    if tokens <= documents:
      raise ValueError(
          f'{where} has {documents} documents of one token each: SOP '
          "(config.data.pair_kind='sop') can build no pair from them (two segments to order "
          f'need >= 2 tokens); {fix}.')
    if sentences <= documents:
      return [f'{where}: every one of its {documents} documents has one sentence, so SOP has '
              'no sentence order to learn: each example is one sentence cut in two at a random '
              'token (the halves swapped or not); ' + fix]
    return []

  def _pair(self, out, rng, stream, g, tokens, bounds, start, a_end, i, target,
            max_num_tokens):
    del stream, g, target
    if i == start:  # One sentence: cut it into two halves at a random token.
      s0, s1 = bounds[start], bounds[start + 1]
      if s1 - s0 < 2:
        return i
      cut = rng.randint(s0 + 1, s1 - 1)
      a, b = (s0, cut), (cut, s1)
    else:
      a, b = (bounds[start], bounds[start + a_end]), (bounds[start + a_end], bounds[i + 1])
    a, b = self._truncate(rng, a, b, max_num_tokens)
    if rng.random() < 0.5:
      out.append(([(tokens, b[0], b[1], 0), (tokens, a[0], a[1], 1)], 1))
    else:
      out.append(([(tokens, a[0], a[1], 0), (tokens, b[0], b[1], 1)], 0))
    return i
