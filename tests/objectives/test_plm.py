"""XLNet's permutation LM (objectives/plm.py): the permutation masks (a target never sees
itself or a later factor, checked through the network too), target sampling against a
port of the original ``_sample_mask``, the backward rows, the memory carried as training
state (and in checkpoints), and a short run whose loss falls."""

from __future__ import annotations

import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from encoder_jax.run import checkpointing
from encoder_jax import data as data_lib
from encoder_jax.core import length_phases
from encoder_jax.run import train_state
from encoder_jax.models import registry
from encoder_jax.objectives import masking
from encoder_jax.objectives import plm

import support
from support import family
from support import tiny_config

ROOT = support.ROOT

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

V, CLS, SEP, PAD = 50, 3, 4, 0
SPECIAL_IDS = (0, 1, 2, 3, 4)


def _tables(word_start_rate=0.7, seed=0):
  special = np.zeros(V, bool)
  special[list(SPECIAL_IDS)] = True
  start = np.random.RandomState(seed).rand(V) < word_start_rate
  return masking.VocabTables(special, start, np.ones(V), mask_id=2)


def _xlnet_rows(rng, lengths, l, a_fraction=0.5):
  """``A [SEP] B [SEP] [CLS]`` rows (segments 0 / 1 / 2), right-padded to ``l``."""
  b = len(lengths)
  ids = np.full((b, l), PAD, np.int32)
  seg = np.zeros((b, l), np.int32)
  for r, n in enumerate(lengths):
    a = max(1, int((n - 3) * a_fraction))
    body = n - 3 - a
    ids[r, :a] = rng.randint(5, V, a)
    ids[r, a] = SEP
    ids[r, a + 1:a + 1 + body] = rng.randint(5, V, body)
    ids[r, n - 2], ids[r, n - 1] = SEP, CLS
    seg[r, a + 1:n - 1] = 1
    seg[r, n - 1] = 2
  mask = (np.arange(l)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  return {'input_ids': ids, 'segment_ids': seg, 'input_mask': mask}


# --------------------------------------------------------------- permutation masks


def test_targets_form_a_factorization_order_and_never_see_themselves():
  rng = np.random.RandomState(0)
  b, l = 6, 12
  selected = rng.rand(b, l) < 0.4
  functional = rng.rand(b, l) < 0.15
  perm, targets = jax.device_get(plm.permutation_masks(
      jax.random.key(0), jnp.asarray(selected), jnp.asarray(functional)))
  np.testing.assert_array_equal(targets, selected & ~functional)
  sees = ~perm
  for r in range(b):
    t = np.flatnonzero(targets[r])
    plain = np.flatnonzero(~selected[r] & ~functional[r])
    ordered = np.flatnonzero(selected[r] | functional[r])
    assert not sees[r][t, t].any()  # A target never sees itself...
    for i in ordered:  # ...and "i sees j" is a strict total order over the ordered tokens:
      for j in ordered:
        if i != j:
          assert sees[r, i, j] != sees[r, j, i], (r, i, j)  # exactly one comes first,
          for k in ordered:  # transitively.
            if sees[r, i, j] and sees[r, j, k] and k != i:
              assert sees[r, i, k]
    assert sees[r][:, plain].all()  # Plain context: seen by every query...
    assert not sees[r][np.ix_(plain, ordered)].any()  # ...and sees no target or special.
    functional_i = np.flatnonzero(functional[r])
    assert sees[r][functional_i, functional_i].all()  # [SEP]/[CLS] see themselves.


def test_factorization_orders_are_uniform():
  """Over many draws, each of two targets comes first half of the time."""
  selected = jnp.ones((2000, 3), bool)
  perm, _ = plm.permutation_masks(jax.random.key(1), selected, jnp.zeros((2000, 3), bool))
  first = np.asarray(~perm[:, 1, 0]).mean()  # Target 1 sees target 0: 0 comes first.
  assert 0.46 < first < 0.54, first


def test_a_target_never_sees_its_own_or_later_tokens_through_the_network():
  """Changing a target's token, or any token its permutation mask hides, leaves the
  query stream's prediction for it unchanged; changing a token it sees changes it."""
  net = registry.network(dict(kind='xlnet', vocab_size=V, hidden_size=24, num_layers=2,
                              num_heads=3, intermediate_size=32, max_position_embeddings=24,
                              type_vocab_size=3))
  params = nn.unbox(jax.jit(net.init)(jax.random.key(0)))
  batch = _xlnet_rows(np.random.RandomState(1), [20, 15], 20)
  recipe = plm.PlmRecipe(partial_prediction_k=3, max_span=3, bidirectional_data=True)
  x = jax.device_get(jax.jit(lambda key, batch: plm.permute_batch(
      key, batch, max_predictions=6, recipe=recipe, tables=_tables()))(jax.random.key(2), batch))
  apply = jax.jit(lambda ids: net.pretraining.apply(
      {'params': params}, ids, x['segment_ids'], x['input_mask'], perm_mask=x['perm_mask'],
      target_mapping=x['target_mapping'], bi_data=recipe.bidirectional_data)['mlm_logits'])
  base = np.asarray(apply(x['input_ids']))
  checked = 0
  for r in range(2):
    for p in np.flatnonzero(x['target_weights'][r]):
      t = int(np.argmax(x['target_mapping'][r, p]))
      hidden = np.flatnonzero(x['perm_mask'][r, t] & (x['input_mask'][r] > 0))
      assert t in hidden
      changed = x['input_ids'].copy()
      changed[r, hidden] = (changed[r, hidden] + 7) % (V - 5) + 5
      np.testing.assert_allclose(np.asarray(apply(changed))[r, p], base[r, p], atol=1e-5)
      seen = np.flatnonzero(~x['perm_mask'][r, t] & (x['input_mask'][r] > 0))
      changed = x['input_ids'].copy()
      changed[r, seen] = (changed[r, seen] + 7) % (V - 5) + 5
      assert np.abs(np.asarray(apply(changed))[r, p] - base[r, p]).max() > 1e-4
      checked += 1
  assert checked >= 6


# ------------------------------------------------------------------ target choice


def _reference_sample_mask(rng, is_start, seg_len, goal, k, max_gram=5):
  """XLNet's ``data_utils._sample_mask`` (mask_alpha=k, mask_beta=1), quirk included: its
  n-gram loop tests ``seg[beg]``, so a span is n tokens from a word start."""
  mask = np.zeros(seg_len, bool)
  num = 0
  ngrams = np.arange(1, max_gram + 1)
  pvals = 1.0 / ngrams
  pvals /= pvals.sum()
  cur = 0
  while cur < seg_len:
    if num >= goal:
      break
    n = min(int(rng.choice(ngrams, p=pvals)), goal - num)
    ctx = n * k
    l_ctx = int(rng.choice(ctx))
    beg = cur + l_ctx
    while beg < seg_len and not is_start[beg]:
      beg += 1
    if beg >= seg_len:
      break
    end, cnt = beg + 1, 1
    while end < seg_len:
      if is_start[beg]:
        cnt += 1
        if cnt > n:
          break
      end += 1
    if end >= seg_len:
      break
    mask[beg:end] = True
    num += end - beg
    cur = end + ctx - l_ctx
  while num < goal:
    i = rng.randint(seg_len)
    if not mask[i]:
      mask[i] = True
      num += 1
  return mask


def _stats(masks, is_start):
  """(runs per row, share of selected at word starts, share of runs of length 1..5)."""
  runs, lengths = [], []
  for m in masks:
    edges = np.diff(np.concatenate([[0], m.astype(int), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    runs.append(len(starts))
    lengths.extend(ends - starts)
  lengths = np.asarray(lengths)
  at_start = (masks & is_start).sum() / masks.sum()
  return np.mean(runs), at_start, [np.mean(lengths == n) for n in range(1, 6)]


def test_targets_are_sampled_as_xlnets_sample_mask():
  b, l, goal, k = 600, 96, 16, 6
  rng = np.random.RandomState(0)
  is_start = rng.rand(b, l) < 0.6
  ours = np.asarray(plm.sample_spans(
      jax.random.key(0), jnp.asarray(is_start), jnp.full((b,), l), jnp.full((b,), goal), k=k,
      max_span=5, max_iterations=goal))
  assert (ours.sum(1) == goal).all()
  ref = np.stack([_reference_sample_mask(rng, is_start[r], l, goal, k) for r in range(b)])
  (runs, starts, hist), (ref_runs, ref_starts, ref_hist) = (_stats(ours, is_start),
                                                            _stats(ref, is_start))
  assert abs(runs - ref_runs) < 0.04 * ref_runs, (runs, ref_runs)
  assert abs(starts - ref_starts) < 0.03, (starts, ref_starts)
  np.testing.assert_allclose(hist, ref_hist, atol=0.03)


def test_budget_is_one_in_k_of_the_real_tokens_and_specials_are_never_targets():
  batch = _xlnet_rows(np.random.RandomState(3), [64, 40, 13, 5], 64)
  permute = jax.jit(lambda key, batch: plm.permute_batch(
      key, batch, max_predictions=11, recipe=plm.PlmRecipe(6, 5, False), tables=_tables()))
  x = jax.device_get(permute(jax.random.key(4), batch))
  n = x['target_weights'].sum(1)
  budget = np.minimum(np.round(np.array([64, 40, 13, 5]) / 6), 11)
  # Selected [SEP]/[CLS] take budget but are not predicted (as the original's padding).
  assert (n <= budget).all() and (n >= budget - 3).all(), (n, budget)
  positions = np.argmax(x['target_mapping'], -1)
  for r in range(4):
    real = positions[r][x['target_weights'][r] > 0]
    assert (np.diff(real) > 0).all()  # Ascending, distinct.
    assert (x['input_mask'][r, real] > 0).all()
    assert not np.isin(x['input_ids'][r, real], SPECIAL_IDS).any()
    np.testing.assert_array_equal(x['target_labels'][r][x['target_weights'][r] > 0],
                                  x['input_ids'][r, real])
    assert not x['target_mapping'][r][x['target_weights'][r] == 0].any()  # Empty slots: 0.


def test_backward_rows_are_the_reversed_stream_in_xlnets_layout():
  ids = np.array([[11, 12, 13, SEP, 21, 22, SEP, CLS, PAD, PAD]] * 2, np.int32)
  seg = np.array([[0, 0, 0, 0, 1, 1, 1, 2, 0, 0]] * 2, np.int32)
  sel = ids == 12
  new_ids, new_seg, new_sel = jax.device_get(plm.reverse_rows(
      jnp.array([False, True]), jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(sel),
      jnp.array([8, 8])))
  np.testing.assert_array_equal(new_ids[0], ids[0])
  np.testing.assert_array_equal(new_seg[0], seg[0])
  np.testing.assert_array_equal(new_ids[1], [22, 21, SEP, 13, 12, 11, SEP, CLS, PAD, PAD])
  np.testing.assert_array_equal(new_seg[1], [0, 0, 0, 1, 1, 1, 1, 2, 0, 0])
  np.testing.assert_array_equal(new_sel[1], new_ids[1] == 12)


# ------------------------------------------------------------------------ memory


def _setup(mem_len):
  c = tiny_config.get_config()
  c.model.update(kind='xlnet', type_vocab_size=3, mem_len=mem_len, vocab_size=V)
  c.objective.update(names=('plm',), max_ngram=5, bidirectional_data=True)
  c.data.pair_kind = 'xlnet'
  from encoder_jax import objectives  # pylint: disable=g-import-not-at-top
  return c, objectives.build(c, _tables())


def test_memory_is_training_state_carried_from_step_to_step():
  _, setup = _setup(mem_len=0)
  assert setup.init_extra(4) is None  # No memory: no extra state, checkpoints unchanged.
  c, setup = _setup(mem_len=6)
  extra = nn.unbox(setup.init_extra(4))
  assert extra['mems'].shape == (4, 2, 6, 32) and not extra['mem_mask'].any()
  params = nn.unbox(jax.jit(setup.init)(jax.random.key(0)))
  batch = _xlnet_rows(np.random.RandomState(0), [16, 12, 9, 16], 16)
  phase = length_phases.phases(c.train)[0]
  step = jax.jit(lambda p, e: setup.stateful_loss_fn(p, e, batch, jax.random.key(1), phase,
                                                     False))
  loss, (metrics, new) = step(params, extra)
  # An empty memory is no memory: the same loss as the stateless (evaluation) loss.
  stateless = jax.jit(lambda p: setup.loss_fn(p, batch, jax.random.key(1), phase, False)[0])
  np.testing.assert_allclose(loss, stateless(params), rtol=1e-5)
  np.testing.assert_array_equal(new['mem_mask'], batch['input_mask'][:, -6:])
  again, _ = step(params, new)
  assert abs(float(again) - float(loss)) > 1e-5  # The filled memory is read.
  assert float(metrics['plm_predictions']) > 0


def test_backward_halves_need_an_even_batch():
  c, setup = _setup(mem_len=0)
  params = nn.unbox(jax.jit(setup.init)(jax.random.key(0)))
  batch = _xlnet_rows(np.random.RandomState(0), [16, 12, 9], 16)
  phase = length_phases.phases(c.train)[0]
  with pytest.raises(ValueError, match=r'bidirectional_data.*3 rows.*even'):
    setup.loss_fn(params, batch, jax.random.key(1), phase, False)


def test_checkpoints_hold_the_extra_state_only_when_there_is_one(tmp_path):
  cfg = ml_collections.ConfigDict(dict(every_steps=1, keep=3, async_save=False))
  params = {'w': jnp.arange(3.0)}
  with_extra = train_state.TrainState(step=jnp.int32(1), params=params, opt_state=params,
                                      extra={'mems': jnp.full((2, 3), 7.0)})
  without = train_state.TrainState(step=jnp.int32(2), params=params, opt_state=params)
  ckpt = checkpointing.Checkpointer(str(tmp_path), cfg)
  ckpt.save(1, with_extra, {})
  ckpt.save(2, without, {})
  ckpt.close()
  step_dir = lambda s: os.path.join(checkpointing.checkpoint_dir(str(tmp_path)), str(s))
  assert os.path.isdir(os.path.join(step_dir(1), checkpointing.EXTRA))
  assert sorted(os.listdir(step_dir(2))) == sorted(
      [*checkpointing.ITEMS, '_CHECKPOINT_METADATA', 'commit_success.txt'])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), with_extra)
  ckpt = checkpointing.Checkpointer(str(tmp_path), cfg)
  assert ckpt.restore(abstract)[3] == 2 and ckpt.restored_extra is None  # Starts afresh.
  shutil.rmtree(step_dir(2))
  ckpt = checkpointing.Checkpointer(str(tmp_path), cfg)
  assert ckpt.restore(abstract)[3] == 1
  np.testing.assert_array_equal(ckpt.restored_extra['mems'], np.full((2, 3), 7.0))


# ------------------------------------------------------------------- end to end


ROW = 'xlnet_plm_memory'


@pytest.mark.slow  # The family's XLNet row (support/family.py), shared with tests/test_family.py.
@pytest.mark.xdist_group(family.group(ROW))
def test_short_run_loss_falls(family_root):
  """12 steps at a high rate, memory carried, two micro-batches of 4 rows a step over data x
  fsdp = 4: the loss falls by over 0.5 (6.9 -> 6.3)."""
  run = family.trained(ROW, family_root)
  c = run.config
  assert c.train.grad_accum_steps == 2 and c.model.mem_len > 0
  losses = run.logged('loss')
  assert len(losses) == 6
  assert np.mean(losses[-2:]) < losses[0] - 0.5, losses
  # The rows it trained on were XLNet's layout: ... [SEP] [CLS], [CLS] in segment 2.
  prepared = data_lib.load_or_prepare(c)
  batch = next(iter(data_lib.make_eval_iterator(c, prepared, 32)))
  last = batch['input_mask'].sum(1) - 1
  rows = np.arange(len(last))
  np.testing.assert_array_equal(batch['input_ids'][rows, last], prepared.tokenizer.cls_id)
  np.testing.assert_array_equal(batch['input_ids'][rows, last - 1], prepared.tokenizer.sep_id)
  np.testing.assert_array_equal(batch['segment_ids'][rows, last], 2)
