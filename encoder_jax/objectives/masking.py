"""On-device MLM corruption (BERT's 80/10/10), redrawn every step from the step's key.

All shapes are static: ``max_predictions`` positions per sequence, of which the first
``n_i = min(max_predictions, max(1, round(mask_rate * maskable_i)))`` are real (weight 1)
and the rest padding (weight 0, position 0, label 0). Whole-word and n-gram selection take
whole units, so they may fall a little short of ``n_i`` but never exceed it.

Selection is per piece (BERT), per whole word (``whole_word_masking``, as google-research/bert)
or per span of 1..``max_ngram`` units (ALBERT's n-gram masking, ``_ngram_selection``).
Everything costs O(batch x length) memory, never O(batch x predictions x vocab): random
replacement ids come from an integer draw into a table of the allowed ids (uniform) or an
inverse-CDF lookup (unigram), not from a categorical over the vocabulary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax.core import fields as fields_lib


@dataclasses.dataclass(frozen=True)
class VocabTables:
  """Per-vocabulary-id facts the corruption needs (from the tokenizer and prepared data)."""
  is_special_V: np.ndarray  # bool: never selected, never drawn as a random replacement.
  is_word_start_V: np.ndarray  # bool: the piece begins a word (whole-word masking).
  unigram_counts_V: np.ndarray  # Counts over the training corpus (unigram replacement).
  mask_id: int

  @classmethod
  def from_tokenizer(cls, tokenizer, unigram_counts, vocab_size: int | None = None
                     ) -> 'VocabTables':
    """The tables over ``vocab_size`` ids (default: the tokenizer's); ids past the
    tokenizer's pieces (an imported embedding table larger than its tokenizer) are special:
    never selected, never drawn."""
    n = tokenizer.vocab_size
    v = n if vocab_size is None else int(vocab_size)
    special = np.ones(v, bool)
    special[:n] = False
    special[np.asarray(tokenizer.special_ids, np.int64)] = True
    counts = np.zeros(v, np.float64) if unigram_counts is None else np.asarray(unigram_counts,
                                                                             np.float64)
    if counts.shape not in ((v,), (n,)):
      raise ValueError(f'unigram counts have shape {counts.shape}; expected ({v},) '
                       '(the tokenizer size): the prepared data does not match the tokenizer')
    counts = np.pad(counts, (0, v - counts.shape[0]))
    word_start = np.pad(np.asarray(tokenizer.is_word_start, bool), (0, v - n))
    return cls(special, word_start, counts, int(tokenizer.mask_id))


F = fields_lib.Field
# The masking recipe's config.objective fields (read by 'mlm', hence SpanBERT and ALBERT,
# and by ELECTRA's generator input); MaskingRecipe is built from them.
MAX_NGRAM = F('max_ngram', 1, fields_lib.integer(1),
              'ALBERT n-gram masking: spans of 1..max_ngram words, p(n) ~ 1/n; 1 = off '
              "(XLNet's 'plm' reads it as its longest span).")
FIELDS: tuple[fields_lib.Field, ...] = (
    F('mask_rate', 0.15, fields_lib.number(0, 1, lo_open=True, hi_open=True),
      'Fraction of maskable tokens per sequence selected for prediction.'),
    F('mask_token_rate', 0.8, fields_lib.number(0, 1), 'Of the selected: replaced by [MASK].'),
    F('random_token_rate', 0.1, fields_lib.number(0, 1),
      'Of the selected: replaced by a random token (the rest stay unchanged).'),
    F('random_token_distribution', 'uniform', fields_lib.one_of('uniform', 'unigram'),
      "'uniform' over the vocabulary or 'unigram' counts."),
    F('whole_word_masking', False, fields_lib.boolean(),
      'Select whole words (all their pieces) instead of pieces.'),
    MAX_NGRAM,
    F('span_p', 0.0, fields_lib.number(0, 1, hi_open=True),
      'SpanBERT span masking: span lengths (words) ~ Geometric(span_p) truncated at '
      'max_span_length, 80/10/10 decided per span; 0 = off (SpanBERT: 0.2 and 10).'),
    F('max_span_length', 10, fields_lib.integer(1), 'Longest SpanBERT span, in words.'),
)
_DEFAULTS = {f.name: f.default for f in FIELDS}


def recipe_problem(mask_token_rate, random_token_rate, span_p, max_ngram) -> str | None:
  """The recipe's checks over several fields (each field's own range is its Field's)."""
  if mask_token_rate + random_token_rate > 1.0 + 1e-9:
    return (f'config.objective.mask_token_rate={mask_token_rate} + random_token_rate='
            f'{random_token_rate}: expected a sum <= 1 (the rest of the selected tokens stay '
            'unchanged)')
  if span_p and max_ngram > 1:
    return (f'config.objective.span_p={span_p} (SpanBERT spans) and max_ngram={max_ngram} '
            '(ALBERT n-grams) select spans two ways: expected one of them off (span_p=0 or '
            'max_ngram=1)')
  return None


@dataclasses.dataclass(frozen=True)
class MaskingRecipe:
  """How MLM selects and corrupts tokens: the values of :data:`FIELDS`."""
  mask_rate: float = _DEFAULTS['mask_rate']
  mask_token_rate: float = _DEFAULTS['mask_token_rate']
  random_token_rate: float = _DEFAULTS['random_token_rate']
  random_token_distribution: str = _DEFAULTS['random_token_distribution']
  whole_word_masking: bool = _DEFAULTS['whole_word_masking']
  # Units of n-grams and spans are whole words under whole_word_masking (ALBERT's default),
  # single pieces otherwise.
  max_ngram: int = _DEFAULTS['max_ngram']
  span_p: float = _DEFAULTS['span_p']
  max_span_length: int = _DEFAULTS['max_span_length']

  def __post_init__(self):
    for f in FIELDS:
      value = getattr(self, f.name)
      if isinstance(value, np.integer):
        value = int(value)
      problem = f.problem('objective', value)
      if problem:
        raise ValueError(problem)
    problem = recipe_problem(self.mask_token_rate, self.random_token_rate, self.span_p,
                             self.max_ngram)
    if problem:
      raise ValueError(problem)

  @classmethod
  def from_config(cls, objective_config) -> 'MaskingRecipe':
    return cls(**{f.name: objective_config[f.name] for f in FIELDS})


def check_config(config) -> str | None:
  """The recipe's cross-field check on a whole config (for validation)."""
  o = config.objective
  return recipe_problem(o.mask_token_rate, o.random_token_rate, o.span_p, o.max_ngram)


def _replacement_sampler(tables: VocabTables, distribution: str):
  """Returns ``draw(key, shape) -> ids`` for the random 10%, in O(prod(shape)) memory.

  A categorical over the vocabulary would materialise [batch, predictions, vocab] noise
  (~10 GB at BERT-base pretraining sizes); instead the allowed ids go in a table. Uniform:
  an integer draw indexes the table. Unigram: inverse CDF, a uniform draw located in the
  cumulative counts (built in float64, then cast) by binary search. Special ids and ids with
  zero count are left out of the table, so they are never drawn.
  """
  allowed_V = ~np.asarray(tables.is_special_V, bool)
  if distribution == 'uniform':
    ids_A = np.flatnonzero(allowed_V).astype(np.int32)
    if ids_A.size == 0:
      raise ValueError('config.objective.random_token_distribution="uniform" but every '
                       'vocabulary id is special: there is no id to draw a replacement from')
    table_A = jnp.asarray(ids_A)
    return lambda key, shape: table_A[jax.random.randint(key, shape, 0, ids_A.size)]
  counts_V = np.asarray(tables.unigram_counts_V, np.float64)
  ids_A = np.flatnonzero(allowed_V & (counts_V > 0)).astype(np.int32)
  if ids_A.size == 0:
    raise ValueError('config.objective.random_token_distribution="unigram" but the unigram '
                     'counts are all zero (outside the special ids): nothing to draw from')
  cdf_A = np.cumsum(counts_V[ids_A])
  cdf_A /= cdf_A[-1]
  cdf_A[-1] = 1.0  # Exactly: a draw in [0, 1) then always lands inside the table.
  table_A, cdf_A = jnp.asarray(ids_A), jnp.asarray(cdf_A, jnp.float32)

  def draw(key, shape):
    # side='right': id i is drawn for cdf[i-1] <= u < cdf[i], with probability count_i / total.
    index = jnp.searchsorted(cdf_A, jax.random.uniform(key, shape), side='right')
    return table_A[jnp.minimum(index, ids_A.size - 1)]
  return draw


def selection_budget(input_ids_BxL, input_mask_BxL, tables: VocabTables, mask_rate: float,
                     max_predictions: int):
  """(maskable [B, L], n [B]): the pieces that may be selected (real, not special) and how
  many to select per sequence, ``min(P, max(1, round(mask_rate * maskable)))`` capped by
  the maskable count. Shared by every masking scheme (tokens, words, n-grams, spans)."""
  maskable_BxL = (input_mask_BxL > 0) & ~jnp.asarray(tables.is_special_V)[input_ids_BxL]
  n_maskable_B = maskable_BxL.sum(-1)
  n_B = jnp.clip(jnp.round(n_maskable_B * mask_rate).astype(jnp.int32), 1, max_predictions)
  return maskable_BxL, jnp.minimum(n_B, n_maskable_B)


def unit_starts(input_ids_BxL, tables: VocabTables, whole_word: bool, word_starts_BxL=None):
  """bool [B, L]: where a selection unit starts: every piece, or with ``whole_word`` the
  batch's word starts (``word_starts``, stored per position by preparation); only a batch
  without them (built by hand) takes them from the vocabulary table."""
  if not whole_word:
    return jnp.ones(input_ids_BxL.shape, bool)
  if word_starts_BxL is not None:
    return jnp.asarray(word_starts_BxL).astype(bool)
  return jnp.asarray(tables.is_word_start_V)[input_ids_BxL]


def mask_tokens(rng: jax.Array, input_ids_BxL: jax.Array, input_mask_BxL: jax.Array, *,
                max_predictions: int, recipe: MaskingRecipe, tables: VocabTables,
                word_starts_BxL=None) -> dict:
  """Selects and corrupts MLM positions; words (whole-word and n-gram units) start where
  ``word_starts_BxL`` says (``unit_starts``).

  Returns ``masked_input_ids`` [B, L], ``masked_positions``/``masked_labels`` int32 [B, P]
  and ``masked_weights`` float32 [B, P] (1 for a real prediction).
  """
  input_ids_BxL, input_mask_BxL = jnp.asarray(input_ids_BxL), jnp.asarray(input_mask_BxL)
  b, l = input_ids_BxL.shape
  p = max_predictions
  k_select, k_kind, k_random = jax.random.split(rng, 3)
  maskable_BxL, n_B = selection_budget(input_ids_BxL, input_mask_BxL, tables, recipe.mask_rate, p)

  if recipe.max_ngram > 1 or recipe.whole_word_masking:
    word_start_BxL = unit_starts(input_ids_BxL, tables, recipe.whole_word_masking,
                                 word_starts_BxL)
    if recipe.max_ngram > 1:
      selected_BxL, _ = _ngram_selection(k_select, maskable_BxL, n_B, word_start_BxL,
                                         recipe.max_ngram)
    else:
      selected_BxL = _whole_word_selection(jax.random.uniform(k_select, (b, l)), maskable_BxL,
                                           n_B, word_start_BxL)
    # Selected tokens first, in sequence order; the cap keeps at most P of them.
    score_BxL = jnp.where(selected_BxL, 2.0 - jnp.arange(l) / l, -1.0)
    _, positions_BxP = jax.lax.top_k(score_BxL, p)
    n_B = jnp.minimum(selected_BxL.sum(-1), p)
  else:
    u_BxL = jax.random.uniform(k_select, (b, l))
    _, positions_BxP = jax.lax.top_k(jnp.where(maskable_BxL, u_BxL, -1.0), p)
  weights_BxP = jnp.arange(p)[None, :] < n_B[:, None]
  positions_BxP = jnp.where(weights_BxP, positions_BxP, 0).astype(jnp.int32)
  labels_BxP = jnp.where(weights_BxP, jnp.take_along_axis(input_ids_BxL, positions_BxP, 1), 0)

  kind_BxP = jax.random.uniform(k_kind, (b, p))
  random_ids_BxP = _replacement_sampler(tables, recipe.random_token_distribution)(k_random,
                                                                                (b, p))
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
  starts_BxL, word_id_BxL = _words(maskable_BxL, word_start_BxL)
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


def _words(maskable_BxL, word_start_BxL):
  """Word starts and the word index of each piece (non-maskable pieces -> dummy word ``L``).

  A word is a maskable word-start piece and the maskable non-start pieces after it; a
  maskable piece after a non-maskable one (e.g. after [SEP]) starts a word whatever it is.
  Real words are numbered 0, 1, ... in sequence order.
  """
  b, l = maskable_BxL.shape
  starts_BxL = maskable_BxL & (word_start_BxL | ~jnp.concatenate(
      [jnp.zeros((b, 1), bool), maskable_BxL[:, :-1]], axis=1))
  word_id_BxL = jnp.cumsum(starts_BxL, axis=1) - 1  # Index of the word each piece is in.
  return starts_BxL, jnp.where(maskable_BxL, word_id_BxL, l)


def ngram_probabilities(max_ngram: int) -> np.ndarray:
  """p(n) for n = 1..max_ngram: ∝ 1/n (ALBERT's ``favor_shorter_ngram``)."""
  p_N = 1.0 / np.arange(1, max_ngram + 1)
  return p_N / p_N.sum()


def _ngram_selection(rng, maskable_BxL, n_B, word_start_BxL, max_ngram: int):
  """ALBERT's n-gram masking on device; returns (selected [B, L], span words [B, W=L+1]).

  Reproduces ``create_masked_lm_predictions`` of google-research/albert
  (create_pretraining_data.py): every unit (a word, see ``_words``; a piece when every piece
  starts a word, i.e. ALBERT's do_whole_word_mask=False) is a candidate start, visited once
  in random order; each draws n in 1..max_ngram with p(n) ∝ 1/n and proposes
  the next n units in sequence order (fewer at the end of the sequence; specials are not
  units, so a span may straddle [SEP] as in ALBERT). While the span would take the count past
  the budget ``n_B`` it shrinks to n-1, ..., 1 units; if one unit is still too many, or the
  span touches an already covered unit, the candidate is skipped. The count thus never
  exceeds ``n_B`` (<= max_predictions). The second output holds, at each span's first unit,
  its length in units (0 elsewhere), for tests and statistics.
  """
  b, l = maskable_BxL.shape
  k_order, k_length = jax.random.split(rng)
  starts_BxL, word_id_BxL = _words(maskable_BxL, word_start_BxL)
  n_words_B = starts_BxL.sum(-1).astype(jnp.int32)
  w_ids_W = jnp.arange(l + 1)
  # Real words first in a random order, then the (never taken) empty slots.
  score_BxW = jnp.where(w_ids_W[None] < n_words_B[:, None],
                        jax.random.uniform(k_order, (b, l + 1)), 2.0)
  order_BxW = jnp.argsort(score_BxW, axis=1).astype(jnp.int32)
  # Inverse CDF over the few n-gram lengths: n = 1 + #{cdf_n <= u}.
  cdf_N1 = jnp.asarray(np.cumsum(ngram_probabilities(max_ngram))[:-1], jnp.float32)
  ngram_BxW = 1 + (jax.random.uniform(k_length, (b, l + 1))[..., None] >= cdf_N1).sum(
      -1).astype(jnp.int32)
  sizes_BxW = jnp.zeros((b, l + 1), jnp.int32).at[jnp.arange(b)[:, None], word_id_BxL].add(
      maskable_BxL.astype(jnp.int32))
  covered_BxW, spans_BxW = _ngram_greedy(order_BxW, ngram_BxW, sizes_BxW, n_words_B, n_B,
                                         max_ngram)
  selected_BxL = jnp.take_along_axis(covered_BxW, word_id_BxL, 1) & maskable_BxL
  return selected_BxL, spans_BxW


def _ngram_greedy(order_BxW, ngram_BxW, sizes_BxW, n_words_B, budget_B, max_ngram: int):
  """ALBERT's greedy span pass over candidate units, one ``lax.scan`` per sequence.

  ``order_BxW``: candidate unit indices in visiting order (only those < ``n_words`` count);
  ``ngram_BxW``: the n drawn for the k-th visited candidate; ``sizes_BxW``: pieces per unit
  (0 for slots past the last unit). Returns covered units and span lengths, both [B, W].
  """
  w = order_BxW.shape[1]
  k_N = jnp.arange(1, max_ngram + 1, dtype=jnp.int32)

  def one_sequence(order_W, ngram_W, sizes_W, n_words, budget):
    # Exclusive prefix sums: units [c, e) hold ends[e] - ends[c] pieces.
    ends_W1 = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(sizes_W)])

    def visit(carry, candidate):
      count, covered_W, spans_W = carry
      c, n = candidate
      stop_N = jnp.minimum(c + k_N, n_words)  # End of the k-unit span (cut at the last unit).
      fits_N = (k_N <= n) & (count + ends_W1[stop_N] - ends_W1[c] <= budget)
      # Span sizes grow with k, so the units that fit are a prefix: take the longest, as
      # ALBERT's shrinking loop does (0 = even one unit is too many: skip).
      length = jnp.minimum(fits_N.sum(), n_words - c)
      in_span_N = k_N <= length
      unit_N = jnp.minimum(c + k_N - 1, w - 1)
      overlaps = (covered_W[unit_N] & in_span_N).any()
      take = (c < n_words) & (length > 0) & ~overlaps
      covered_W = covered_W.at[unit_N].set(covered_W[unit_N] | (in_span_N & take))
      spans_W = spans_W.at[c].set(jnp.where(take, length, spans_W[c]))
      count = count + jnp.where(take, ends_W1[c + length] - ends_W1[c], 0)
      return (count, covered_W, spans_W), None

    init = (jnp.int32(0), jnp.zeros(w, bool), jnp.zeros(w, jnp.int32))
    (_, covered_W, spans_W), _ = jax.lax.scan(visit, init, (order_W, ngram_W))
    return covered_W, spans_W

  return jax.vmap(one_sequence)(order_BxW, ngram_BxW, sizes_BxW, n_words_B,
                                budget_B.astype(jnp.int32))
