"""On-device masking: rates, the 80/10/10 split, exclusions, shapes, determinism per step."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.objectives import masking

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
  out = masking.mask_tokens(jax.random.key(3), ids, jnp.ones_like(ids), max_predictions=2,
                            recipe=recipe, tables=tables)
  np.testing.assert_array_equal(out['masked_weights'].sum(1), 1)
  np.testing.assert_array_equal(out['masked_labels'][:, 0], 20)


def test_bad_recipe_is_rejected_with_the_field_name():
  with pytest.raises(ValueError, match='mask_rate'):
    masking.MaskingRecipe(mask_rate=1.5)
  with pytest.raises(ValueError, match='random_token_distribution'):
    masking.MaskingRecipe(random_token_distribution='zipf')
