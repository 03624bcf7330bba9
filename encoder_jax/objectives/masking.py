"""On-device MLM corruption (BERT's 80/10/10), redrawn every step from the step's key.

All shapes are static: ``max_predictions`` positions per sequence, of which the first
``n_i = min(max_predictions, max(1, round(mask_rate * maskable_i)))`` are real (weight 1)
and the rest padding (weight 0, position 0, label 0).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class VocabTables:
  """Per-vocabulary-id facts the corruption needs (from the tokenizer and prepared data)."""
  is_special_V: np.ndarray  # bool: never selected, never drawn as a random replacement.
  is_word_start_V: np.ndarray  # bool: the piece begins a word (whole-word masking).
  unigram_counts_V: np.ndarray  # Counts over the training corpus (unigram replacement).
  mask_id: int

  @classmethod
  def from_tokenizer(cls, tokenizer, unigram_counts) -> 'VocabTables':
    v = tokenizer.vocab_size
    special = np.zeros(v, bool)
    special[np.asarray(tokenizer.special_ids, np.int64)] = True
    counts = np.zeros(v, np.float64) if unigram_counts is None else np.asarray(unigram_counts,
                                                                             np.float64)
    if counts.shape != (v,):
      raise ValueError(f'unigram counts have shape {counts.shape}; expected ({v},) '
                       '(the tokenizer size): the prepared data does not match the tokenizer')
    return cls(special, np.asarray(tokenizer.is_word_start, bool), counts, int(tokenizer.mask_id))


@dataclasses.dataclass(frozen=True)
class MaskingRecipe:
  mask_rate: float = 0.15
  mask_token_rate: float = 0.8
  random_token_rate: float = 0.1
  random_token_distribution: str = 'uniform'  # or 'unigram'
  whole_word_masking: bool = False

  def __post_init__(self):
    if not 0.0 < self.mask_rate < 1.0:
      raise ValueError(f'config.objective.mask_rate={self.mask_rate}; expected in (0, 1)')
    if self.mask_token_rate < 0 or self.random_token_rate < 0 or (
        self.mask_token_rate + self.random_token_rate > 1.0):
      raise ValueError('config.objective.mask_token_rate + random_token_rate must be in [0, 1]; '
                       f'got {self.mask_token_rate} + {self.random_token_rate}')
    if self.random_token_distribution not in ('uniform', 'unigram'):
      raise ValueError('config.objective.random_token_distribution='
                       f'{self.random_token_distribution!r}; expected "uniform" or "unigram"')


def _replacement_logits(tables: VocabTables, distribution: str) -> jax.Array:
  allowed = ~tables.is_special_V
  if distribution == 'uniform':
    weights = allowed.astype(np.float64)
  else:
    weights = np.where(allowed, tables.unigram_counts_V, 0.0)
    if weights.sum() <= 0:
      raise ValueError('random_token_distribution="unigram" but the unigram counts are all zero')
  with np.errstate(divide='ignore'):
    return jnp.asarray(np.log(weights), jnp.float32)


def mask_tokens(rng: jax.Array, input_ids_BxL: jax.Array, input_mask_BxL: jax.Array, *,
                max_predictions: int, recipe: MaskingRecipe, tables: VocabTables) -> dict:
  """Selects and corrupts MLM positions.

  Returns ``masked_input_ids`` [B, L], ``masked_positions``/``masked_labels`` int32 [B, P]
  and ``masked_weights`` float32 [B, P] (1 for a real prediction).
  """
  b, l = input_ids_BxL.shape
  p = max_predictions
  k_select, k_kind, k_random = jax.random.split(rng, 3)
  maskable_BxL = (input_mask_BxL > 0) & ~jnp.asarray(tables.is_special_V)[input_ids_BxL]
  n_maskable_B = maskable_BxL.sum(-1)
  n_B = jnp.clip(jnp.round(n_maskable_B * recipe.mask_rate).astype(jnp.int32), 1, p)
  n_B = jnp.minimum(n_B, n_maskable_B)

  u_BxL = jax.random.uniform(k_select, (b, l))
  if recipe.whole_word_masking:
    selected_BxL = _whole_word_selection(u_BxL, maskable_BxL, n_B,
                                         jnp.asarray(tables.is_word_start_V)[input_ids_BxL])
    # Selected tokens first, in sequence order; the cap keeps at most P of them.
    score_BxL = jnp.where(selected_BxL, 2.0 - jnp.arange(l) / l, -1.0)
    _, positions_BxP = jax.lax.top_k(score_BxL, p)
    n_B = jnp.minimum(selected_BxL.sum(-1), p)
  else:
    _, positions_BxP = jax.lax.top_k(jnp.where(maskable_BxL, u_BxL, -1.0), p)
  weights_BxP = jnp.arange(p)[None, :] < n_B[:, None]
  positions_BxP = jnp.where(weights_BxP, positions_BxP, 0).astype(jnp.int32)
  labels_BxP = jnp.where(weights_BxP, jnp.take_along_axis(input_ids_BxL, positions_BxP, 1), 0)

  kind_BxP = jax.random.uniform(k_kind, (b, p))
  random_ids_BxP = jax.random.categorical(
      k_random, _replacement_logits(tables, recipe.random_token_distribution), shape=(b, p))
  new_BxP = jnp.where(kind_BxP < recipe.mask_token_rate, tables.mask_id,
                      jnp.where(kind_BxP < recipe.mask_token_rate + recipe.random_token_rate,
                                random_ids_BxP, labels_BxP)).astype(input_ids_BxL.dtype)
  # Padding slots point at position 0 with weight 0: scatter them to an out-of-range
  # index so they cannot overwrite anything.
  scatter_BxP = jnp.where(weights_BxP, positions_BxP, l)
  masked_BxL = input_ids_BxL.at[jnp.arange(b)[:, None], scatter_BxP].set(new_BxP, mode='drop')
  return dict(masked_input_ids=masked_BxL, masked_positions=positions_BxP,
              masked_labels=labels_BxP.astype(jnp.int32),
              masked_weights=weights_BxP.astype(jnp.float32))


def _whole_word_selection(u_BxL, maskable_BxL, n_B, word_start_BxL):
  """Picks whole words in random order, skipping any that would exceed ``n_B`` pieces.

  A word is a maskable word-start piece and the maskable non-start pieces after it. As in
  google-research/bert, words are visited in random order and a word that no longer fits
  is skipped (a smaller one later may still fit), so the count is met whenever possible.
  """
  b, l = u_BxL.shape
  starts_BxL = maskable_BxL & (word_start_BxL | ~jnp.concatenate(
      [jnp.zeros((b, 1), bool), maskable_BxL[:, :-1]], axis=1))
  word_id_BxL = jnp.cumsum(starts_BxL, axis=1) - 1  # Index of the word each piece is in.
  word_id_BxL = jnp.where(maskable_BxL, word_id_BxL, l)  # Non-maskable -> a dummy word.
  # Each word's random score is its start piece's draw; sizes count its pieces.
  rows = jnp.arange(b)[:, None]
  word_score_BxW = jnp.full((b, l + 1), 2.0).at[rows, jnp.where(starts_BxL, word_id_BxL, l)].set(
      jnp.where(starts_BxL, u_BxL, 2.0))
  word_score_BxW = word_score_BxW.at[:, l].set(2.0)
  word_size_BxW = jnp.zeros((b, l + 1), jnp.int32).at[rows, word_id_BxL].add(1)
  order_BxW = jnp.argsort(word_score_BxW, axis=1)  # Random order; dummy words last.

  def greedy(sizes_W, real_W, budget):
    def visit(count, word):
      size, real = word
      take = real & (count + size <= budget)
      return count + jnp.where(take, size, 0), take
    return jax.lax.scan(visit, jnp.int32(0), (sizes_W, real_W))[1]

  taken_in_order = jax.vmap(greedy)(jnp.take_along_axis(word_size_BxW, order_BxW, 1),
                                    jnp.take_along_axis(word_score_BxW, order_BxW, 1) < 2.0, n_B)
  chosen_BxW = jnp.zeros((b, l + 1), bool).at[rows, order_BxW].set(taken_in_order)
  return jnp.take_along_axis(chosen_BxW, word_id_BxL, 1) & maskable_BxL
