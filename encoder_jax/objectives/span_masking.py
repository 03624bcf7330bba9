"""SpanBERT's span masking (Joshi et al. 2020, §3.1) on device, redrawn every step.

Reproduces ``PairWithSpanMaskingScheme`` + ``span_masking`` of facebookresearch/SpanBERT
(pretraining/fairseq/data/masking.py) with fixed shapes:

* **Lengths**: each span's length in words is drawn from a geometric distribution
  ``p(n) ∝ p (1 - p)^(n-1)``, truncated at ``max_span_length`` and renormalised over
  1..max_span_length (as SpanBERT's ``len_distrib``; p = 0.2, max 10: mean 3.80 words).
* **Starts**: a span starts at the beginning of a word chosen uniformly among the words not
  masked yet, and covers whole words (the paper; ``whole_word_masking=False`` makes every
  piece its own word). Candidate starts are visited once each, in a random order.
* **Budget**: spans are drawn until ``n_i = min(max_predictions, round(mask_rate *
  maskable_i))`` pieces are selected. A span that would pass the budget keeps only the
  words that fit (whole words: SpanBERT cuts the last span mid-word instead), so the count
  never exceeds ``n_i`` and, as later candidates may still fill the rest, meets it
  whenever one-piece words remain. A span runs on over words that an earlier span already
  masked (they cost nothing, as in SpanBERT's mask set) and stops at the last word.
* **80/10/10 per span**: the replacement is decided once per maximal run of selected pieces
  (SpanBERT merges touching spans with ``merge_intervals`` and decides per merged span):
  all its pieces become [MASK] (80%), all become random tokens (10%, one draw per piece),
  or all stay unchanged (10%).

Everything is O(batch x length) memory; the greedy pass is one ``lax.scan`` over the
candidate words per sequence (as ALBERT's n-grams in ``masking._ngram_greedy``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax.objectives import masking


def span_length_probabilities(p: float, max_span_length: int) -> np.ndarray:
  """p(n) for n = 1..max_span_length: the geometric, truncated and renormalised."""
  n_N = np.arange(1, max_span_length + 1)
  p_N = p * (1.0 - p) ** (n_N - 1)
  return p_N / p_N.sum()


def mask_spans(rng: jax.Array, input_ids_BxL: jax.Array, input_mask_BxL: jax.Array, *,
               max_predictions: int, recipe: masking.MaskingRecipe,
               tables: masking.VocabTables, word_starts_BxL=None) -> dict:
  """Selects whole-word spans and corrupts them; the outputs of ``masking.mask_tokens``
  (words start where ``word_starts_BxL`` says: ``masking.unit_starts``).

  Returns ``masked_input_ids`` [B, L], ``masked_positions``/``masked_labels`` int32 [B, P]
  (selected pieces in sequence order) and ``masked_weights`` float32 [B, P].
  """
  input_ids_BxL, input_mask_BxL = jnp.asarray(input_ids_BxL), jnp.asarray(input_mask_BxL)
  b, l = input_ids_BxL.shape
  p = max_predictions
  k_select, k_kind, k_random = jax.random.split(rng, 3)
  maskable_BxL, n_B = masking.selection_budget(input_ids_BxL, input_mask_BxL, tables,
                                               recipe.mask_rate, p)
  word_start_BxL = masking.unit_starts(input_ids_BxL, tables, recipe.whole_word_masking,
                                       word_starts_BxL)
  selected_BxL, _, _ = span_selection(k_select, maskable_BxL, n_B, word_start_BxL,
                                      recipe.span_p, recipe.max_span_length)

  # Selected pieces first, in sequence order (at most n_B <= P of them).
  score_BxL = jnp.where(selected_BxL, 2.0 - jnp.arange(l) / l, -1.0)
  _, positions_BxP = jax.lax.top_k(score_BxL, p)
  weights_BxP = jnp.arange(p)[None, :] < jnp.minimum(selected_BxL.sum(-1), p)[:, None]
  positions_BxP = jnp.where(weights_BxP, positions_BxP, 0).astype(jnp.int32)
  labels_BxP = jnp.where(weights_BxP, jnp.take_along_axis(input_ids_BxL, positions_BxP, 1), 0)

  # One draw per maximal run of selected pieces decides [MASK] / random / unchanged.
  previous_BxL = jnp.concatenate([jnp.zeros((b, 1), bool), selected_BxL[:, :-1]], axis=1)
  run_BxL = jnp.maximum(jnp.cumsum(selected_BxL & ~previous_BxL, axis=1) - 1, 0)
  kind_BxL = jnp.take_along_axis(jax.random.uniform(k_kind, (b, l)), run_BxL, 1)
  kind_BxP = jnp.take_along_axis(kind_BxL, positions_BxP, 1)
  random_ids_BxP = masking._replacement_sampler(  # pylint: disable=protected-access
      tables, recipe.random_token_distribution)(k_random, (b, p))
  new_BxP = jnp.where(kind_BxP < recipe.mask_token_rate, tables.mask_id,
                      jnp.where(kind_BxP < recipe.mask_token_rate + recipe.random_token_rate,
                                random_ids_BxP, labels_BxP)).astype(input_ids_BxL.dtype)
  scatter_BxP = jnp.where(weights_BxP, positions_BxP, l)  # Padding slots write nowhere.
  masked_BxL = input_ids_BxL.at[jnp.arange(b)[:, None], scatter_BxP].set(new_BxP, mode='drop')
  return dict(masked_input_ids=masked_BxL, masked_positions=positions_BxP,
              masked_labels=labels_BxP.astype(jnp.int32),
              masked_weights=weights_BxP.astype(jnp.float32))


def span_selection(rng, maskable_BxL, n_B, word_start_BxL, span_p: float,
                   max_span_length: int):
  """Greedy span selection; returns (selected [B, L], drawn [B, W], placed [B, W]).

  ``W = L + 1`` word slots (words as ``masking._words``). At the first word of every span
  that was placed, ``drawn`` holds the length in words drawn for it and ``placed`` the
  words it covers (fewer when cut by the budget or the end of the sequence); 0 elsewhere.
  Those two are for tests and statistics.
  """
  b, l = maskable_BxL.shape
  k_order, k_length = jax.random.split(rng)
  starts_BxL, word_id_BxL = masking._words(maskable_BxL, word_start_BxL)  # pylint: disable=protected-access
  n_words_B = starts_BxL.sum(-1).astype(jnp.int32)
  w_ids_W = jnp.arange(l + 1)
  # Real words first in a random order, then the (never taken) empty slots.
  score_BxW = jnp.where(w_ids_W[None] < n_words_B[:, None],
                        jax.random.uniform(k_order, (b, l + 1)), 2.0)
  order_BxW = jnp.argsort(score_BxW, axis=1).astype(jnp.int32)
  # Inverse CDF over the few lengths: n = 1 + #{cdf_n <= u}.
  cdf_N1 = jnp.asarray(np.cumsum(span_length_probabilities(span_p, max_span_length))[:-1],
                       jnp.float32)
  length_BxW = 1 + (jax.random.uniform(k_length, (b, l + 1))[..., None] >= cdf_N1).sum(
      -1).astype(jnp.int32)
  sizes_BxW = jnp.zeros((b, l + 1), jnp.int32).at[jnp.arange(b)[:, None], word_id_BxL].add(
      maskable_BxL.astype(jnp.int32))
  covered_BxW, drawn_BxW, placed_BxW = _span_greedy(order_BxW, length_BxW, sizes_BxW,
                                                    n_words_B, n_B, max_span_length)
  selected_BxL = jnp.take_along_axis(covered_BxW, word_id_BxL, 1) & maskable_BxL
  return selected_BxL, drawn_BxW, placed_BxW


def _span_greedy(order_BxW, length_BxW, sizes_BxW, n_words_B, budget_B, max_span_length: int):
  """SpanBERT's loop over candidate starts, one ``lax.scan`` per sequence.

  ``order_BxW``: candidate words in visiting order (only those < ``n_words`` are real);
  ``length_BxW``: the length drawn for the k-th visited candidate; ``sizes_BxW``: pieces
  per word. A candidate whose first word is already masked is skipped (SpanBERT: ``if
  anchor in mask: continue``); otherwise it covers the longest prefix of its n words whose
  not-yet-masked pieces fit the budget (at least its first word, or it is skipped).
  """
  w = order_BxW.shape[1]
  k_N = jnp.arange(1, max_span_length + 1, dtype=jnp.int32)

  def one_sequence(order_W, length_W, sizes_W, n_words, budget):
    def visit(carry, candidate):
      count, covered_W, drawn_W, placed_W = carry
      c, n = candidate
      unit_N = jnp.minimum(c + k_N - 1, w - 1)
      in_sequence_N = c + k_N - 1 < n_words
      cost_N = jnp.cumsum(jnp.where(covered_W[unit_N] | ~in_sequence_N, 0, sizes_W[unit_N]))
      # Each condition holds for a prefix of k (the cost grows with k): count it.
      length = ((k_N <= n) & in_sequence_N & (count + cost_N <= budget)).sum()
      take = (c < n_words) & ~covered_W[c] & (length > 0)
      in_span_N = (k_N <= length) & take
      covered_W = covered_W.at[unit_N].set(covered_W[unit_N] | in_span_N)
      drawn_W = drawn_W.at[c].set(jnp.where(take, n, drawn_W[c]))
      placed_W = placed_W.at[c].set(jnp.where(take, length, placed_W[c]))
      count = count + jnp.where(take, cost_N[jnp.maximum(length - 1, 0)], 0)
      return (count, covered_W, drawn_W, placed_W), None

    zeros = jnp.zeros(w, jnp.int32)
    init = (jnp.int32(0), jnp.zeros(w, bool), zeros, zeros)
    (_, covered_W, drawn_W, placed_W), _ = jax.lax.scan(visit, init, (order_W, length_W))
    return covered_W, drawn_W, placed_W

  return jax.vmap(one_sequence)(order_BxW, length_BxW, sizes_BxW, n_words_B,
                                budget_B.astype(jnp.int32))
