"""SpanBERT: span masking statistics (span lengths in words, the 15% budget, 80/10/10 per
span), the span boundary objective (boundaries, its head beside BERT's params, gradients),
and configs/spanbert_base.py.

The statistics are measured over many draws at SpanBERT's length (512 tokens, 77 predicted
per sequence); ``pytest -s`` prints them.
"""

import functools
import importlib.util
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.config import schema as config_base
from encoder_jax import objectives
from encoder_jax.core import length_phases
from encoder_jax.models import registry as models
from encoder_jax.objectives import masking
from encoder_jax.objectives import sbo
from encoder_jax.objectives import span_masking

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ROOT = support.ROOT
V = 500
SPECIAL = np.arange(5)  # [PAD] [UNK] [CLS] [SEP] [MASK]
MASK_ID = 4
IS_WORD_START = np.random.RandomState(0).rand(V) < 0.75  # ~1.3 pieces per word.
RECIPE = masking.MaskingRecipe(whole_word_masking=True, span_p=0.2, max_span_length=10)


def _tables():
  special = np.zeros(V, bool)
  special[SPECIAL] = True
  return masking.VocabTables(special, IS_WORD_START, np.ones(V), MASK_ID)


def _batch(b, l, seed=0):
  """[CLS] tokens [SEP] rows of random lengths (>= half the width), padded."""
  rng = np.random.RandomState(seed)
  lengths = rng.randint(l // 2, l + 1, b)
  mask = (np.arange(l)[None] < lengths[:, None]).astype(np.int32)
  ids = rng.randint(5, V, (b, l)).astype(np.int32) * mask
  ids[:, 0] = 2
  ids[np.arange(b), lengths - 1] = 3
  return ids, mask


def _budget(ids, mask, p):
  maskable = (mask > 0) & ~np.isin(ids, SPECIAL)
  return maskable, np.clip(np.round(maskable.sum(1) * 0.15), 1, p).astype(np.int32)


@functools.lru_cache()
def _masked(b=64, l=512, p=80, keys=8):
  """SpanBERT's setting: masked outputs over ``keys`` draws of one batch."""
  ids, mask = _batch(b, l)
  tables = _tables()
  step = jax.jit(lambda k: span_masking.mask_spans(k, ids, mask, max_predictions=p,
                                                   recipe=RECIPE, tables=tables))
  return ids, mask, [jax.tree.map(np.asarray, step(jax.random.key(k))) for k in range(keys)]


@functools.lru_cache()
def _selection(b=64, l=512, p=80, keys=8):
  """(maskable, budget, [(selected, drawn, placed, word_start)] per key)."""
  ids, mask = _batch(b, l, seed=1)
  maskable, budget = _budget(ids, mask, p)
  word_start = IS_WORD_START[ids]
  select = jax.jit(span_masking.span_selection, static_argnums=(4, 5))
  draws = []
  for k in range(keys):
    out = select(jax.random.key(k), jnp.asarray(maskable), jnp.asarray(budget),
                 jnp.asarray(word_start), 0.2, 10)
    draws.append((*map(np.asarray, out), word_start))
  return maskable, budget, draws


def test_span_length_distribution_is_the_truncated_geometric():
  p_N = span_masking.span_length_probabilities(0.2, 10)
  np.testing.assert_allclose(p_N.sum(), 1.0)
  np.testing.assert_allclose(p_N[1:] / p_N[:-1], 0.8)  # Geometric ratio 1 - p.
  assert abs((np.arange(1, 11) * p_N).sum() - 3.797) < 1e-3  # The paper's mean 3.8.


def test_span_lengths_in_words_follow_the_geometric():
  maskable, budget, draws = _selection()
  drawn = np.concatenate([d[d > 0] for _, d, _, _ in draws])
  placed = np.concatenate([pl[pl > 0] for _, _, pl, _ in draws])
  assert drawn.size == placed.size > 6000
  expected = span_masking.span_length_probabilities(0.2, 10)
  hist = np.bincount(drawn, minlength=11)[1:] / drawn.size
  cut = (placed < drawn).mean()
  print(f'\nspans: {drawn.size}; drawn lengths (words) {np.round(hist, 3)} mean {drawn.mean():.3f}'
        f'\n  expected {np.round(expected, 3)} mean 3.797'
        f'\n  placed mean {placed.mean():.3f}, cut short by the budget or sequence end: '
        f'{cut:.1%}')
  np.testing.assert_allclose(hist, expected, atol=0.015)
  assert abs(drawn.mean() - 3.797) < 0.1
  assert (placed <= drawn).all() and placed.max() <= 10
  assert cut < 0.12  # ~1 span in 12 at 512 tokens: the last of each sequence.


def test_spans_are_whole_words_that_start_at_a_word():
  maskable, _, draws = _selection()
  for selected, _, placed, word_start in draws:
    starts, word_id = masking._words(jnp.asarray(maskable), jnp.asarray(word_start))
    word_id = np.asarray(word_id)
    for r in range(len(selected)):
      real = maskable[r]
      ids = word_id[r][real]
      sel = selected[r][real]
      # A word is selected entirely or not at all.
      per_word = np.bincount(ids, weights=sel, minlength=ids.max() + 1)
      size = np.bincount(ids, minlength=ids.max() + 1)
      assert np.all((per_word == 0) | (per_word == size)), r
      # Placed spans cover `placed` consecutive words from their first word.
      covered = np.zeros(ids.max() + 1, bool)
      for w in np.flatnonzero(placed[r] > 0):
        covered[w:w + placed[r][w]] = True
      np.testing.assert_array_equal(covered, per_word > 0)
      assert not (selected[r] & ~maskable[r]).any()


def test_selects_fifteen_percent_never_more_than_the_budget():
  maskable, budget, draws = _selection()
  counts = np.stack([s.sum(1) for s, _, _, _ in draws])
  fraction = counts.sum() / (len(draws) * maskable.sum())
  print(f'\nselected fraction {fraction:.4f}; sequences at their exact budget '
        f'{(counts == budget).mean():.1%}')
  assert (counts <= budget).all()
  assert abs(fraction - 0.15) < 0.002
  assert (counts == budget).mean() > 0.95


def _runs(positions, weights):
  """Maximal runs of consecutive selected positions: lists of slot indices per run."""
  runs, current, last = [], [], -2
  for slot in np.flatnonzero(weights > 0):
    if positions[slot] != last + 1 and current:
      runs.append(current)
      current = []
    current.append(slot)
    last = positions[slot]
  return runs + ([current] if current else [])


def test_eighty_ten_ten_is_decided_per_span():
  ids, _, outs = _masked()
  kinds = []
  for out in outs:
    new = np.take_along_axis(out['masked_input_ids'], out['masked_positions'], 1)
    for r in range(len(ids)):
      for run in _runs(out['masked_positions'][r], out['masked_weights'][r]):
        is_mask = new[r, run] == MASK_ID
        changed = new[r, run] != out['masked_labels'][r, run]
        assert is_mask.all() or not is_mask.any(), 'a span mixes [MASK] and other tokens'
        kinds.append('mask' if is_mask.all() else 'random' if changed.any() else 'same')
  kinds = np.array(kinds)
  share = {k: (kinds == k).mean() for k in ('mask', 'random', 'same')}
  print(f'\n{kinds.size} spans: ' + ', '.join(f'{k} {v:.1%}' for k, v in share.items()))
  assert kinds.size > 5000
  assert abs(share['mask'] - 0.8) < 0.02
  assert abs(share['random'] - 0.1) < 0.015 and abs(share['same'] - 0.1) < 0.015


def test_outputs_shapes_labels_and_nothing_else_changes():
  ids, mask, outs = _masked()
  maskable, budget = _budget(ids, mask, 80)
  for out in outs:
    assert out['masked_positions'].shape == (64, 80) and out['masked_positions'].dtype == np.int32
    assert out['masked_weights'].dtype == np.float32
    w = out['masked_weights'] > 0
    rows = np.arange(len(ids))[:, None]
    np.testing.assert_array_equal(out['masked_labels'][w],
                                  ids[rows, out['masked_positions']][w])
    assert maskable[rows, out['masked_positions']][w].all()
    assert (out['masked_weights'].sum(1) <= budget).all()
    untouched = np.ones_like(mask, bool)
    untouched[rows.repeat(80, 1)[w], out['masked_positions'][w]] = False
    np.testing.assert_array_equal(out['masked_input_ids'][untouched], ids[untouched])
  assert not np.array_equal(outs[0]['masked_positions'], outs[1]['masked_positions'])


def test_recipe_checks_name_the_field():
  with pytest.raises(ValueError, match=r'config\.objective\.span_p=1\.5'):
    masking.MaskingRecipe(span_p=1.5)
  with pytest.raises(ValueError, match=r'config\.objective\.max_span_length=0'):
    masking.MaskingRecipe(span_p=0.2, max_span_length=0)
  with pytest.raises(ValueError, match='select spans two ways'):
    masking.MaskingRecipe(span_p=0.2, max_ngram=3)


# ------------------------------------------------------------------------------ SBO


def test_span_boundaries_are_the_nearest_unselected_positions():
  positions = jnp.array([[1, 2, 3, 6, 7, 0]])
  weights = jnp.array([[1, 1, 1, 1, 1, 0.]])
  left, right, relative = sbo.span_boundaries(positions, weights, 10)
  np.testing.assert_array_equal(left[0, :5], [0, 0, 0, 5, 5])
  np.testing.assert_array_equal(right[0, :5], [4, 4, 4, 8, 8])
  np.testing.assert_array_equal(relative[0, :5], [0, 1, 2, 0, 1])


def _spanbert_config():
  c = config_base.base_config()
  c.model.update(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                 intermediate_size=24, max_position_embeddings=24)
  c.objective.update(names=('mlm', 'sbo'), span_p=0.2, whole_word_masking=True)
  c.data.pair_kind = 'doc_sentences'
  c.train.update(seq_lens=(16,), max_predictions=(4,), phase_fractions=(1.0,))
  return c


def _small_batch(b=4, l=16):
  rng = np.random.RandomState(0)
  ids = rng.randint(5, 50, (b, l)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  return dict(input_ids=ids, segment_ids=np.zeros_like(ids), input_mask=np.ones_like(ids))


def _small_tables(v=50):
  special = np.zeros(v, bool)
  special[:5] = True
  return masking.VocabTables(special, np.ones(v, bool), np.ones(v), mask_id=4)


def test_sbo_head_lives_beside_berts_unchanged_params():
  c = _spanbert_config()
  setup = objectives.build(c, _small_tables())
  params = nn.unbox(jax.jit(setup.init)(jax.random.key(0)))
  plain = nn.unbox(jax.jit(models.network(c.model).init)(jax.random.key(0)))
  assert set(params) == set(plain) | {'sbo_head'}
  # The network's params are BERT's, the same values as without the SBO head.
  jax.tree.map(np.testing.assert_array_equal, {k: params[k] for k in plain}, plain)
  head = jax.tree.map(np.shape, params['sbo_head'])
  assert head['dense_1']['kernel'] == (2 * 16 + sbo.POSITION_SIZE, 16)
  assert head['position_embeddings']['embedding'] == (sbo.MAX_TARGETS, sbo.POSITION_SIZE)
  assert head['output_bias'] == (50,)
  network, downstream = setup.downstream(params)
  assert network.config.kind == 'bert' and set(downstream) == set(plain)
  # An HF import (the network alone) gets a fresh head, the same init() gives it (the same
  # draws; another compiled program, so equal to float rounding).
  full, fresh = setup.from_downstream(downstream, jax.random.key(0))
  assert fresh == ['sbo_head']
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               full['sbo_head'], params['sbo_head'])


def test_sbo_loss_trains_the_head_and_the_tied_embedding():
  c = _spanbert_config()
  setup = objectives.build(c, _small_tables())
  params = nn.unbox(jax.jit(setup.init)(jax.random.key(0)))
  phase = length_phases.phases(c.train)[0]
  batch = _small_batch()

  def sbo_only(p):  # The SBO loss alone, the step's metrics beside it.
    _, metrics = setup.loss_fn(p, batch, jax.random.key(1), phase, True)
    return metrics['sbo_loss'], metrics
  g, metrics = jax.jit(jax.grad(sbo_only, has_aux=True))(params)
  np.testing.assert_allclose(metrics['loss'], metrics['mlm_loss'] + metrics['sbo_loss'],
                             rtol=1e-6)
  assert metrics['sbo_predictions'] == metrics['mlm_predictions'] > 0
  assert all(np.abs(x).sum() > 0 for x in jax.tree.leaves(g['sbo_head']))
  assert np.abs(g['embeddings']['word_embeddings']['embedding']).sum() > 0  # Tied decoder.
  assert np.abs(g['encoder']['layers']['query']['kernel']).sum() > 0  # Boundary states.
  assert not np.abs(g['mlm_head']['output_bias']).any()
  # FLOPs: MLM + SBO heads beside the encoder.
  c2 = _spanbert_config()
  c2.objective.names = ('mlm',)
  assert setup.flops_per_sequence(phase) > objectives.build(c2).flops_per_sequence(phase)


def test_sbo_needs_mlm_and_an_unfactorized_embedding():
  c = _spanbert_config()
  c.objective.names = ('sbo',)
  with pytest.raises(ValueError, match="expected 'mlm' in the names too"):
    objectives.build(c)
  c = _spanbert_config()
  c.model.update(kind='albert', embedding_size=8, share_layers='all')
  with pytest.raises(ValueError, match='expected config.model.embedding_size 0 or hidden_size'):
    objectives.build(c)


def test_spanbert_base_is_the_papers_recipe():
  spec = importlib.util.spec_from_file_location('cfg', os.path.join(ROOT, 'configs',
                                                                    'spanbert_base.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  m, o = c.model, c.objective
  assert (m.kind, m.hidden_size, m.num_layers, m.num_heads, m.vocab_size) == (
      'bert', 768, 12, 12, 28996)
  assert c.tokenizer.lowercase is False
  assert o.names == ('mlm', 'sbo') and (o.span_p, o.max_span_length, o.mask_rate) == (
      0.2, 10, 0.15)
  assert o.whole_word_masking and (o.mask_token_rate, o.random_token_rate) == (0.8, 0.1)
  assert c.data.pair_kind == 'doc_sentences'  # Single contiguous segments, no NSP.
  assert (c.train.batch_size, c.train.num_steps, c.train.seq_lens) == (256, 2_400_000, (512,))
  assert (c.optim.name, c.optim.learning_rate, c.optim.warmup_steps, c.optim.eps) == (
      'adamw', 1e-4, 10_000, 1e-8)
  local = module.get_config('runlocal=True')
  assert local.objective.names == ('mlm', 'sbo') and local.train.seq_lens == (128,)
