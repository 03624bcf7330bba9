"""On-device masking: rates, the 80/10/10 split, exclusions, shapes, determinism per step,
replacement distributions, ALBERT n-gram spans, and memory that does not grow with the vocab."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.objectives import masking

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

V = 500
SPECIAL = np.array([0, 1, 2, 3, 4])  # [PAD] [UNK] [CLS] [SEP] [MASK]


class _Tok:  # The tokenizer facts masking reads (the real tokenizer is tested in tests/data).
  vocab_size = V
  special_ids = SPECIAL
  is_word_start = np.random.RandomState(0).rand(V) < 0.6
  mask_id = 4


def _batch(b=512, l=128, seed=0):
  rng = np.random.RandomState(seed)
  lengths = rng.randint(12, l + 1, b)
  mask = (np.arange(l)[None] < lengths[:, None]).astype(np.int32)
  ids = rng.randint(5, V, (b, l)).astype(np.int32) * mask
  ids[:, 0] = 2
  ids[np.arange(b), lengths - 1] = 3
  ids[np.arange(b), lengths // 2] = 3
  return jnp.asarray(ids), jnp.asarray(mask)


@functools.lru_cache()
def _masked(wwm=False, distribution='uniform', key=0, p=20):
  counts = np.zeros(V)
  counts[5:15] = 1.0  # Unigram draws may only pick ids 5..14.
  tables = masking.VocabTables.from_tokenizer(_Tok, counts)
  recipe = masking.MaskingRecipe(whole_word_masking=wwm, random_token_distribution=distribution)
  ids, mask = _batch()
  out = jax.jit(lambda k: masking.mask_tokens(k, ids, mask, max_predictions=p, recipe=recipe,
                                              tables=tables))(jax.random.key(key))
  return np.asarray(ids), np.asarray(mask), jax.tree.map(np.asarray, out)


def test_selects_fifteen_percent_of_maskable_tokens_per_sequence():
  ids, mask, out = _masked()
  maskable = (mask > 0) & ~np.isin(ids, SPECIAL)
  n = out['masked_weights'].sum(1)
  expected = np.clip(np.round(maskable.sum(1) * 0.15), 1, 20)
  np.testing.assert_array_equal(n, expected)  # Exact per-sequence count, capped.
  assert abs(n.sum() / maskable.sum() - 0.15) < 0.01


def test_eighty_ten_ten_split():
  ids, _, out = _masked()
  w = out['masked_weights'] > 0
  rows = np.arange(len(ids))[:, None]
  new = out['masked_input_ids'][rows, out['masked_positions']][w]
  orig = out['masked_labels'][w]
  np.testing.assert_array_equal(orig, ids[rows, out['masked_positions']][w])
  frac_mask = (new == 4).mean()
  frac_same = (new == orig).mean()
  frac_random = 1 - frac_mask - frac_same
  assert abs(frac_mask - 0.8) < 0.02 and abs(frac_same - 0.1) < 0.015, (frac_mask, frac_same)
  assert abs(frac_random - 0.1) < 0.015


def test_never_selects_special_or_padding_and_changes_nothing_else():
  ids, mask, out = _masked()
  w = out['masked_weights'] > 0
  rows = np.arange(len(ids))[:, None]
  chosen = ids[rows, out['masked_positions']][w]
  assert not np.isin(chosen, SPECIAL).any()
  assert (mask[rows, out['masked_positions']][w] == 1).all()
  changed = out['masked_input_ids'] != ids
  selected = np.zeros_like(changed)
  selected[rows, out['masked_positions']] = w
  assert not (changed & ~selected).any()
  # Padding slots are position 0, label 0, weight 0, and unique real positions.
  assert (out['masked_positions'][~w] == 0).all() and (out['masked_labels'][~w] == 0).all()
  for r in range(len(ids)):
    real = out['masked_positions'][r][w[r]]
    assert len(set(real.tolist())) == len(real)


def test_fixed_shapes_and_dtypes():
  _, _, out = _masked()
  assert out['masked_positions'].shape == (512, 20) and out['masked_positions'].dtype == np.int32
  assert out['masked_labels'].shape == (512, 20) and out['masked_weights'].dtype == np.float32
  assert out['masked_input_ids'].shape == (512, 128)


def test_same_key_same_mask_other_key_other_mask():
  a, b, c = _masked(key=0)[2], _masked(key=0)[2], _masked(key=1)[2]
  np.testing.assert_array_equal(a['masked_input_ids'], b['masked_input_ids'])
  real = a['masked_weights'] > 0
  assert (a['masked_positions'] != c['masked_positions'])[real].mean() > 0.8


def test_unigram_replacement_draws_from_the_counts():
  ids, _, out = _masked(distribution='unigram')
  w = out['masked_weights'] > 0
  rows = np.arange(len(ids))[:, None]
  new = out['masked_input_ids'][rows, out['masked_positions']][w]
  orig = out['masked_labels'][w]
  replaced = new[(new != 4) & (new != orig)]
  assert len(replaced) > 100 and ((replaced >= 5) & (replaced < 15)).all()


def test_uniform_replacement_never_draws_special_ids():
  ids, _, out = _masked()
  w = out['masked_weights'] > 0
  rows = np.arange(len(ids))[:, None]
  new = out['masked_input_ids'][rows, out['masked_positions']][w]
  replaced = new[(new != 4) & (new != out['masked_labels'][w])]
  assert not np.isin(replaced, SPECIAL).any() and len(np.unique(replaced)) > 100


def test_whole_word_masking_masks_all_pieces_of_a_word():
  ids, mask, out = _masked(wwm=True)
  maskable = (mask > 0) & ~np.isin(ids, SPECIAL)
  starts = _Tok.is_word_start[ids] | ~np.concatenate(
      [np.zeros((len(ids), 1), bool), maskable[:, :-1]], 1)
  w = out['masked_weights'] > 0
  for r in range(64):
    sel = set(out['masked_positions'][r][w[r]].tolist())
    word = -1
    words = {}
    for i in range(ids.shape[1]):
      if not maskable[r, i]:
        word = -1
        continue
      if starts[r, i] or word == -1:
        word = i
      words.setdefault(word, []).append(i)
    for pieces in words.values():
      hit = [i in sel for i in pieces]
      assert all(hit) or not any(hit), (r, pieces, hit)
  # Skipping words that do not fit meets the per-sequence count almost always.
  expected = np.clip(np.round(maskable.sum(1) * 0.15), 1, 20)
  assert (w.sum(1) == expected).mean() > 0.97, (w.sum(1) - expected)


def test_whole_word_masking_skips_a_word_that_does_not_fit():
  # [CLS] w1a w1b w1c w2 [SEP]: 4 maskable pieces -> budget 1 (round(0.6) = 1). The
  # three-piece word never fits; the one-piece word must be chosen whatever the order.
  is_start = np.zeros(V, bool)
  is_start[[10, 20]] = True
  tok = type('Tok', (), dict(vocab_size=V, special_ids=SPECIAL, is_word_start=is_start,
                             mask_id=4))
  tables = masking.VocabTables.from_tokenizer(tok, None)
  recipe = masking.MaskingRecipe(whole_word_masking=True, mask_token_rate=1.0,
                                 random_token_rate=0.0)
  ids = jnp.array([[2, 10, 11, 12, 20, 3]] * 16, jnp.int32)
  out = jax.jit(lambda k: masking.mask_tokens(k, ids, jnp.ones_like(ids), max_predictions=2,
                                              recipe=recipe, tables=tables))(jax.random.key(3))
  np.testing.assert_array_equal(out['masked_weights'].sum(1), 1)
  np.testing.assert_array_equal(out['masked_labels'][:, 0], 20)


def test_bad_recipe_is_rejected_with_the_field_name():
  with pytest.raises(ValueError, match='mask_rate'):
    masking.MaskingRecipe(mask_rate=1.5)
  with pytest.raises(ValueError, match='random_token_distribution'):
    masking.MaskingRecipe(random_token_distribution='zipf')
  for bad in (0, -2, 2.5):
    with pytest.raises(ValueError, match=r'config\.objective\.max_ngram'):
      masking.MaskingRecipe(max_ngram=bad)


# ---- Random replacement ids: the configured distribution, in O(B x P) memory. ----

SMALL_V = 40
SMALL_SPECIAL = np.array([0, 1, 2, 3, 4, 17])  # 17: a special id in the middle of the vocab.


def _replacements(distribution, counts, key=0):
  """Every selected piece replaced by a random id (mask/keep rates 0): the drawn ids."""
  tok = type('Tok', (), dict(vocab_size=SMALL_V, special_ids=SMALL_SPECIAL,
                             is_word_start=np.ones(SMALL_V, bool), mask_id=4))
  tables = masking.VocabTables.from_tokenizer(tok, counts)
  recipe = masking.MaskingRecipe(mask_rate=0.5, mask_token_rate=0.0, random_token_rate=1.0,
                                 random_token_distribution=distribution)
  rng = np.random.RandomState(1)
  ids = rng.randint(5, SMALL_V, (1024, 64)).astype(np.int32)
  ids[ids == 17] = 5
  out = jax.jit(lambda k: masking.mask_tokens(k, jnp.asarray(ids), jnp.ones_like(ids),
                                              max_predictions=32, recipe=recipe,
                                              tables=tables))(jax.random.key(key))
  w = np.asarray(out['masked_weights']) > 0
  rows = np.arange(len(ids))[:, None]
  return np.asarray(out['masked_input_ids'])[rows, np.asarray(out['masked_positions'])][w]


def _assert_frequencies(drawn, expected_V):
  freq_V = np.bincount(drawn, minlength=SMALL_V) / len(drawn)
  sigma_V = np.sqrt(expected_V * (1 - expected_V) / len(drawn))
  assert (np.abs(freq_V - expected_V) <= 5 * sigma_V + 1e-12).all(), np.c_[freq_V, expected_V]


def test_uniform_replacements_are_uniform_over_non_special_ids():
  drawn = _replacements('uniform', None)
  assert len(drawn) > 30_000
  allowed_V = ~np.isin(np.arange(SMALL_V), SMALL_SPECIAL)
  assert not np.isin(drawn, SMALL_SPECIAL).any()
  _assert_frequencies(drawn, allowed_V / allowed_V.sum())


def test_unigram_replacements_follow_the_counts_never_zero_count_or_special():
  counts_V = np.random.RandomState(2).randint(0, 6, SMALL_V).astype(np.float64)
  counts_V[[7, 20, 33]] = 0.0  # Zero-count ids between non-zero ones.
  counts_V[17] = 1000.0  # A frequent special id (e.g. [SEP]): still never drawn.
  drawn = _replacements('unigram', counts_V)
  expected_V = np.where(np.isin(np.arange(SMALL_V), SMALL_SPECIAL), 0.0, counts_V)
  expected_V /= expected_V.sum()
  assert not np.isin(drawn, np.flatnonzero(expected_V == 0)).any()
  _assert_frequencies(drawn, expected_V)


def test_unigram_with_all_zero_counts_is_rejected():
  counts_V = np.zeros(SMALL_V)
  counts_V[SMALL_SPECIAL] = 5.0  # Only specials counted: nothing may be drawn.
  with pytest.raises(ValueError, match='unigram counts are all zero'):
    _replacements('unigram', counts_V)


def _compiled_memory(fn, *args):
  return jax.jit(fn).lower(*args).compile().memory_analysis()


def test_masking_temp_memory_does_not_grow_with_the_vocab():
  b, l, p = 8, 128, 20
  ids = jax.ShapeDtypeStruct((b, l), jnp.int32)
  recipes = [masking.MaskingRecipe(random_token_distribution=d) for d in ('uniform', 'unigram')]
  temps = {}
  for v in (1_000, 100_000):
    special_V = np.zeros(v, bool)
    special_V[:5] = True
    tables = masking.VocabTables(special_V, np.arange(v) % 3 == 0, np.arange(v, dtype=float),
                                 mask_id=4)

    def both(k, i, m, tables=tables):  # One compile covers both samplers.
      return [masking.mask_tokens(k, i, m, max_predictions=p, recipe=r, tables=tables)
              for r in recipes]
    temps[v] = _compiled_memory(both, jax.random.key(0), ids, ids).temp_size_in_bytes
  assert temps[100_000] <= 1.1 * temps[1_000] + 4096, temps
  # The measurement would catch the old formulation: a categorical over the vocabulary
  # needs [B, P, V] temporaries.
  old = _compiled_memory(lambda k: jax.random.categorical(k, jnp.zeros(100_000), shape=(b, p)),
                         jax.random.key(0))
  assert old.temp_size_in_bytes >= b * p * 100_000 * 4 > 100 * temps[100_000]


# ---- ALBERT n-gram masking. ----

def _albert_reference(units, order, ngrams, num_to_predict, max_ngram):
  """google-research/albert create_masked_lm_predictions' span loop, transcribed.

  ``units``: the candidate index lists (``cand_indexes``); ``order``: the shuffled visiting
  order of candidate starts; ``ngrams[k]``: the n drawn at the k-th visit. Returns the
  covered pieces and {start unit: span length in units}.
  """
  ngram_indexes = [[units[i:i + n] for n in range(1, max_ngram + 1)] for i in range(len(units))]
  masked, covered, spans = [], set(), {}
  for k, start in enumerate(order):
    cand_index_set = ngram_indexes[start]
    if len(masked) >= num_to_predict:
      break
    n = ngrams[k]
    chosen = cand_index_set[n - 1]
    index_set = sum(chosen, [])
    n -= 1
    while len(masked) + len(index_set) > num_to_predict:
      if n == 0:
        break
      chosen = cand_index_set[n - 1]
      index_set = sum(chosen, [])
      n -= 1
    if len(masked) + len(index_set) > num_to_predict:
      continue
    if any(i in covered for i in index_set):
      continue
    covered.update(index_set)
    masked.extend(index_set)
    spans[start] = len(chosen)
  return covered, spans


def test_ngram_greedy_matches_the_albert_loop_exactly():
  rng = np.random.RandomState(0)
  b, w, max_ngram = 64, 41, 3
  sizes_BxW = np.zeros((b, w), np.int32)
  order_BxW = np.zeros((b, w), np.int32)
  n_words_B = rng.randint(1, w, b)
  budget_B = rng.randint(1, 25, b)
  ngram_BxW = rng.randint(1, max_ngram + 1, (b, w)).astype(np.int32)
  for r in range(b):
    sizes_BxW[r, :n_words_B[r]] = rng.randint(1, 4, n_words_B[r])
    order_BxW[r] = np.r_[rng.permutation(n_words_B[r]), np.arange(n_words_B[r], w)]
  covered_BxW, spans_BxW = jax.jit(masking._ngram_greedy, static_argnums=5)(
      order_BxW, ngram_BxW, sizes_BxW, n_words_B, budget_B, max_ngram)
  covered_BxW, spans_BxW = np.asarray(covered_BxW), np.asarray(spans_BxW)
  for r in range(b):
    ends = np.cumsum(np.r_[0, sizes_BxW[r, :n_words_B[r]]])
    units = [list(range(ends[i], ends[i + 1])) for i in range(n_words_B[r])]
    covered, spans = _albert_reference(units, order_BxW[r, :n_words_B[r]], ngram_BxW[r],
                                       budget_B[r], max_ngram)
    ours = {i for u, unit in enumerate(units) if covered_BxW[r, u] for i in unit}
    assert ours == covered, r
    assert {u: int(s) for u, s in enumerate(spans_BxW[r]) if s} == spans, r
    assert len(covered) <= budget_B[r]


def _ngram_batch(b, l, seed):
  """Sequences [CLS] a [SEP] b [SEP] pad..., words of 1-3 pieces (is_word_start)."""
  rng = np.random.RandomState(seed)
  lengths = rng.randint(l // 2, l + 1, b)
  mask = (np.arange(l)[None] < lengths[:, None]).astype(np.int32)
  ids = rng.randint(5, V, (b, l)).astype(np.int32) * mask
  ids[:, 0] = 2
  ids[np.arange(b), lengths - 1] = 3
  ids[np.arange(b), lengths // 2] = 3
  return jnp.asarray(ids), jnp.asarray(mask)


def test_ngram_span_lengths_follow_one_over_n_in_words():
  # Long sequences, a small budget: few spans overlap or hit the budget, so the taken
  # lengths stay close to the drawn ones (ALBERT's shrinking moves a little mass to n=1).
  b, l, budget, max_ngram = 64, 1024, 80, 3
  ids = np.random.RandomState(3).randint(5, V, (b, l))
  word_start = jnp.asarray(_Tok.is_word_start[ids])  # Words of 1.7 pieces on average.
  selected, spans = jax.jit(masking._ngram_selection, static_argnums=4)(
      jax.random.key(0), jnp.ones((b, l), bool), jnp.full((b,), budget), word_start, max_ngram)
  spans = np.asarray(spans)
  hist = np.bincount(spans[spans > 0], minlength=max_ngram + 1)[1:]
  freq = hist / hist.sum()
  expected = masking.ngram_probabilities(max_ngram)
  np.testing.assert_allclose(expected, [6 / 11, 3 / 11, 2 / 11])
  assert hist.sum() > 1500 and np.abs(freq - expected).max() < 0.05, (freq, expected)
  assert freq[0] > freq[1] > freq[2]
  assert (np.asarray(selected).sum(1) <= budget).all()


@functools.lru_cache()
def _ngram_step(wwm=True, p=20, mask_rate=0.15):
  ids, mask = _ngram_batch(128, 96, seed=4)
  tables = masking.VocabTables.from_tokenizer(_Tok, None)
  recipe = masking.MaskingRecipe(mask_rate=mask_rate, whole_word_masking=wwm, max_ngram=3)
  return ids, mask, jax.jit(lambda k: masking.mask_tokens(
      k, ids, mask, max_predictions=p, recipe=recipe, tables=tables))


@functools.lru_cache()
def _ngram_masked(key=0, wwm=True, p=20, mask_rate=0.15):
  ids, mask, step = _ngram_step(wwm, p, mask_rate)
  out = step(jax.random.key(key))
  return np.asarray(ids), np.asarray(mask), jax.tree.map(np.asarray, out)


def test_ngram_masking_never_exceeds_max_predictions():
  # A mask rate far above what fits: spans must shrink or be skipped, never overflow P.
  ids, mask, out = _ngram_masked(mask_rate=0.9, p=7)
  changed = (out['masked_input_ids'] != ids).sum(1)
  assert (out['masked_weights'].sum(1) <= 7).all() and (changed <= 7).all()
  assert (out['masked_weights'].sum(1) == 7).mean() > 0.9
  # The selection itself stays within the budget (nothing is cut off by the [B, P] cap):
  # asserted on _ngram_greedy / _ngram_selection in the ALBERT-loop and span-length tests.


def test_ngram_masking_selects_whole_words():
  ids, mask, out = _ngram_masked()
  maskable = (mask > 0) & ~np.isin(ids, SPECIAL)
  starts = maskable & (_Tok.is_word_start[ids] | ~np.concatenate(
      [np.zeros((len(ids), 1), bool), maskable[:, :-1]], 1))
  w = out['masked_weights'] > 0
  for r in range(64):
    sel = np.zeros(ids.shape[1], bool)
    sel[out['masked_positions'][r][w[r]]] = True
    assert not (sel & ~maskable[r]).any()
    word = np.cumsum(starts[r])
    for u in np.unique(word[sel]):
      pieces = maskable[r] & (word == u)
      assert sel[pieces].all(), (r, np.flatnonzero(pieces), np.flatnonzero(sel))
  expected = np.clip(np.round(maskable.sum(1) * 0.15), 1, 20)
  assert (w.sum(1) <= expected).all() and (w.sum(1) == expected).mean() > 0.9


def test_ngram_masking_is_deterministic_given_the_key():
  a, c = _ngram_masked(key=0)[2], _ngram_masked(key=1)[2]
  b = _ngram_step()[2](jax.random.key(0))  # A second run, not the cached result.
  for name in a:
    np.testing.assert_array_equal(a[name], np.asarray(b[name]))
  assert (a['masked_positions'] != c['masked_positions']).any(1).mean() > 0.9


def test_ngram_masking_of_pieces_without_whole_word_masking():
  # ALBERT with do_whole_word_mask=False: units are pieces, spans of 1..3 adjacent pieces.
  ids, mask, out = _ngram_masked(wwm=False)
  w = out['masked_weights'] > 0
  maskable = (mask > 0) & ~np.isin(ids, SPECIAL)
  expected = np.clip(np.round(maskable.sum(1) * 0.15), 1, 20)
  np.testing.assert_array_equal(w.sum(1), expected)  # Single pieces always fill the budget.
  rows = np.arange(len(ids))[:, None]
  assert maskable[rows, out['masked_positions']][w].all()
