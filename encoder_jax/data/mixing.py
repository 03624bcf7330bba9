"""Mixing several sources, and the per-epoch document order.

Sampling probabilities: explicit ``@weight``s (normalised), or XLM-R's exponent smoothing
``q_i = p_i**alpha / sum_j p_j**alpha`` with ``p_i = n_i / sum_k n_k`` (``alpha`` =
config.data.mixing_alpha; 1.0 keeps the natural proportions, 0.3 is XLM-R's choice that
up-samples low-resource languages). ``n_i`` counts sentences (tokenizer training estimates
it from the raw size before anything is split).

An epoch of a mixture holds as many sentences as the whole train split; source ``i``
contributes ``q_i`` of them with whole documents, drawn from its own shuffled order
(repeating with a fresh shuffle when it is up-sampled, a random subset when down-sampled).
With one source, or with ``q == p``, an epoch is exactly one pass over every document.
"""

from __future__ import annotations

import numpy as np

from encoder_jax.data import seeding


def source_probabilities(sizes, weights, alpha: float) -> np.ndarray:
  """``q`` over sources from explicit ``weights`` (if given) or ``sizes`` and ``alpha``."""
  if weights is not None and all(w is not None for w in weights):
    w = np.asarray(weights, np.float64)
    return w / w.sum()
  if alpha <= 0:
    raise ValueError(f'config.data.mixing_alpha must be > 0; got {alpha}')
  p = np.asarray(sizes, np.float64)
  if p.sum() <= 0:
    raise ValueError('Cannot mix sources that are all empty.')
  p = p / p.sum()
  q = p ** alpha  # 0 stays 0.
  return q / q.sum()


def _rng(*values) -> np.random.Generator:
  return np.random.Generator(np.random.PCG64(seeding.mix(*values)))


def epoch_order(seed: int, epoch: int, doc_offsets: list[int], q: np.ndarray | None,
                sentence_counts: list[np.ndarray] | None) -> np.ndarray:
  """Global document ids of one epoch (all processes), in training order.

  Args:
    seed: config.seed.
    epoch: epoch number (orders differ per epoch).
    doc_offsets: first global document id of each source, plus the total at the end.
    q: sampling probability per source (None or one source: a plain shuffled pass).
    sentence_counts: per source, the number of sentences of each document.
  """
  n_total = doc_offsets[-1]
  num_sources = len(doc_offsets) - 1
  if num_sources == 1 or q is None:
    return _rng(seed, seeding.EPOCH_ORDER, epoch).permutation(n_total)
  total_sentences = float(sum(int(c.sum()) for c in sentence_counts))
  parts = []
  for i in range(num_sources):
    n_i = doc_offsets[i + 1] - doc_offsets[i]
    if n_i == 0 or q[i] == 0:
      continue
    s_i = float(sentence_counts[i].sum())
    ratio = q[i] * total_sentences / s_i  # Passes over source i per epoch.
    if abs(ratio - 1.0) < 1e-9:
      ids = _rng(seed, seeding.EPOCH_ORDER, epoch, i, 0).permutation(n_i)
    else:
      quota = ratio * s_i
      reps = []
      have = 0
      while have < quota:
        perm = _rng(seed, seeding.EPOCH_ORDER, epoch, i, len(reps)).permutation(n_i)
        reps.append(perm)
        have += s_i
      ids = np.concatenate(reps)
      cum = np.cumsum(sentence_counts[i][ids])
      take = int(np.searchsorted(cum, quota, side='left')) + 1
      ids = ids[:min(take, len(ids))]
    parts.append(ids + doc_offsets[i])
  order = np.concatenate(parts)
  return order[_rng(seed, seeding.EPOCH_ORDER, epoch, -1).permutation(len(order))]
