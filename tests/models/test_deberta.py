"""DeBERTa: the disentangled attention's shifts against a direct O(L^2 d) reference and
against the gathers they replaced (values and gradients), the log buckets against Hugging Face's, the enhanced mask decoder on its own (shapes, absolute
positions, weights shared with the last layer, exact at the predicted positions only), the
kind checks and the parameter count of deberta-base (tiny shapes elsewhere)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.models import config as config_lib
from encoder_jax.models import deberta
from encoder_jax.models import disentangled_attention as da
from encoder_jax.models import registry
from encoder_jax.models import trunk

from support import family


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def tiny(kind='deberta', **kw):
  fields = dict(kind=kind, attention_kind='disentangled', vocab_size=53, hidden_size=24,
                num_layers=3, num_heads=3, intermediate_size=40, max_position_embeddings=32,
                type_vocab_size=0, position_biased_input=False, layer_norm_eps=1e-7,
                hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  fields.update(kw)
  return registry.make_config(fields)


# ------------------------------------------------------------------ attention vs reference

ATTENTION_CASES = {
    'v1_clipped': tiny(max_relative_positions=3),  # k=3 < L: distances clipped.
    'v1_c2p': tiny(pos_att_type='c2p'),
    'v2_buckets': tiny('deberta_v2', position_buckets=6, max_relative_positions=12),
    'v2_shared_norm': tiny('deberta_v2', position_buckets=4, share_att_key=True,
                           norm_rel_ebd=True, pos_att_type='p2c'),
    'v2_c2c_only': tiny('deberta_v2', pos_att_type=''),
}


def reference_attention(c, p, x_BxLxE, kv_BxSxE, mask_BxS, table_RxE, q_pos_BxL):
  """Direct DeBERTa attention in numpy: the position vectors of every (i, j) materialised
  as [B, L, S, heads, d] (the O(L^2 d) form), the full 2*span table, no slicing."""
  x, kv = np.asarray(x_BxLxE, np.float64), np.asarray(kv_BxSxE, np.float64)
  h, d = c.num_heads, c.head_dim
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  proj = lambda y, m: np.einsum('...e,ehd->...hd', y, m['kernel']) + m.get('bias', 0.0)
  if c.kind == 'deberta':
    w = p['in_proj']['kernel']
    q = np.einsum('ble,ehd->blhd', x, w[:, :, 0]) + p['q_bias']
    k = np.einsum('bse,ehd->bshd', kv, w[:, :, 1])
    v = np.einsum('bse,ehd->bshd', kv, w[:, :, 2]) + p['v_bias']
  else:
    q, k, v = proj(x, p['query']), proj(kv, p['key']), proj(kv, p['value'])
  terms = da.position_terms(c)
  scale = np.sqrt(d * (1 + len(terms)))
  logits = np.einsum('blhd,bshd->bhls', q, k) / scale
  span = da.relative_span(c)
  s_len = kv.shape[1]
  rel = np.asarray(q_pos_BxL)[:, :, None] - np.arange(s_len)[None, None, :]  # i - j
  if c.position_buckets:
    rel = da.log_bucket_position(rel, c.position_buckets, da.max_relative_distance(c))
  rows_BxLxS = np.clip(rel + span, 0, 2 * span - 1)
  table = np.asarray(table_RxE, np.float64)
  if c.norm_rel_ebd:
    mu, var = table.mean(-1, keepdims=True), table.var(-1, keepdims=True)
    table = ((table - mu) / np.sqrt(var + c.layer_norm_eps) * p_norm['scale'] + p_norm['bias']
             if (p_norm := p.get('_rel_norm')) else (table - mu) / np.sqrt(var + c.layer_norm_eps))
  pos_BxLxSxE = table[rows_BxLxS]
  if 'c2p' in terms:
    kr = proj(pos_BxLxSxE, p['key'] if c.share_att_key else p['pos_key'])  # [B, L, S, H, D]
    logits += np.einsum('blhd,blshd->bhls', q, kr) / scale
  if 'p2c' in terms:
    qr = proj(pos_BxLxSxE, p['query'] if c.share_att_key else p['pos_query'])
    logits += np.einsum('bshd,blshd->bhls', k, qr) / scale
  logits = np.where(np.asarray(mask_BxS, bool)[:, None, None, :], logits, -1e30)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  a = np.einsum('bhls,bshd->blhd', probs, v)
  return np.einsum('blhd,hde->ble', a, p['attention_output']['kernel']) + p[
      'attention_output']['bias']


def random_params(init_fn, *args, seed=0):
  """Random params of the shapes ``init_fn`` would make, without running it (compiling an
  init costs seconds on 2 cores): LayerNorm scales near 1, everything else ~N(0, 0.3^2)."""
  shapes = nn.unbox(jax.eval_shape(init_fn, *args))
  rng = np.random.default_rng(seed)
  def draw(path, x):
    noise = 0.3 * rng.standard_normal(x.shape)
    scale = any(getattr(k, 'key', None) == 'scale' for k in path)
    return (1.0 + noise if scale else noise).astype(np.float32)
  return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.mark.parametrize('name', sorted(ATTENTION_CASES))
@pytest.mark.parametrize('emd_queries', [False, True], ids=['self', 'emd'])
def test_relative_shifts_match_the_direct_reference(name, emd_queries):
  c = ATTENTION_CASES[name]
  rng = np.random.default_rng(0)
  b, s, e = 2, 9, c.hidden_size
  kv = rng.standard_normal((b, s, e)).astype(np.float32)
  mask = np.ones((b, s), np.int32)
  mask[1, 6:] = 0
  table = rng.standard_normal((2 * da.relative_span(c), e)).astype(np.float32)
  _, lo, hi = da.relative_layout(c, s)
  if emd_queries:  # EMD: 4 queries at given positions, keys/values from kv.
    q_pos = np.array([[0, 3, 8, 5], [7, 1, 2, 2]])
    x = rng.standard_normal((b, 4, e)).astype(np.float32)
    context = dict(query_positions=jnp.asarray(q_pos), kv_states=jnp.asarray(kv))
  else:
    q_pos = np.broadcast_to(np.arange(s), (b, s))
    x = kv
    context = {}
  rel = table[lo:hi]
  norm = None
  if c.norm_rel_ebd:  # As the encoder does: LayerNorm the reachable rows.
    norm = dict(scale=1 + 0.2 * rng.standard_normal(e), bias=0.2 * rng.standard_normal(e))
    mu, var = rel.mean(-1, keepdims=True), rel.var(-1, keepdims=True)
    rel = (rel - mu) / np.sqrt(var + c.layer_norm_eps) * norm['scale'] + norm['bias']
  context['rel_embeddings'] = jnp.asarray(rel, jnp.float32)
  module = da.DisentangledAttention(c, deterministic=True)
  mask_Bx1x1xS = jnp.asarray(mask, bool)[:, None, None, :]
  params = random_params(module.init, jax.random.key(0), x, mask_Bx1x1xS, context,
                         seed=1)['params']
  ours = jax.jit(module.apply)({'params': params}, x, mask_Bx1x1xS, context)
  ref_params = dict(params, _rel_norm=norm) if norm else params
  ref = reference_attention(c, ref_params, x, kv, mask, table, q_pos)
  np.testing.assert_allclose(np.asarray(ours), ref, atol=2e-5, rtol=1e-5)


def gathered_scores(c, q_BxQxHxD, k_BxSxHxD, kr_RxHxD, qr_RxHxD, positions_BxQ):
  """c2p + p2c as this attention computed them before its shifts: scores against the R
  reachable rows, each (i, j) gathered by ``take_along_axis`` with the [Q, S] index."""
  index_SxS, _, _ = da.relative_layout(c, k_BxSxHxD.shape[1])
  index_BxQxS = jnp.asarray(index_SxS)[positions_BxQ]
  c2p_BxHxQxR = jnp.einsum('bqhd,rhd->bhqr', q_BxQxHxD, kr_RxHxD)
  c2p = jnp.take_along_axis(c2p_BxHxQxR, index_BxQxS[:, None], axis=-1)
  p2c_BxHxSxR = jnp.einsum('bshd,rhd->bhsr', k_BxSxHxD, qr_RxHxD)
  p2c = jnp.take_along_axis(p2c_BxHxSxR, jnp.swapaxes(index_BxQxS, -1, -2)[:, None], axis=-1)
  return c2p + jnp.swapaxes(p2c, -1, -2)


def shifted_scores(c, q_BxQxHxD, k_BxSxHxD, kr_RxHxD, qr_RxHxD, positions_BxQ):
  """c2p + p2c as ``DisentangledAttention`` computes them (its distance rows and shifts)."""
  c2p_rows, p2c_rows = da.distance_rows(c, k_BxSxHxD.shape[1])
  c2p = da.c2p_scores(jnp.einsum('bqhd,uhd->bhqu', q_BxQxHxD, kr_RxHxD[c2p_rows]),
                      positions_BxQ)
  p2c = da.p2c_scores(jnp.einsum('bshd,uhd->bhsu', k_BxSxHxD, qr_RxHxD[p2c_rows]),
                      positions_BxQ)
  return c2p + p2c


# name -> (config, keys S, query positions (None: every key) or rows, mask kind). Odd
# lengths; k < L and k > L; log buckets; padding; a packed row of 3 documents (a
# block-diagonal mask); queries at some rows (the EMD, repeated; [CLS] alone).
SHIFT_CASES = {
    'v1_k3_L13_padded': (tiny(max_relative_positions=3), 13, None, 'padded'),
    'v1_k40_L11_packed': (tiny(max_relative_positions=40, max_position_embeddings=64), 11, None,
                          'packed'),
    'v1_k5_L16_rows': (tiny(max_relative_positions=5), 16, [[0, 15, 7, 7], [3, 1, 12, 0]],
                       'padded'),
    'v2_b6_L19_rows': (tiny('deberta_v2', position_buckets=6, max_relative_positions=12), 19,
                       [[0, 18, 5, 5, 9], [3, 1, 17, 2, 0]], 'padded'),
    'v2_b8_k20_L9_packed': (tiny('deberta_v2', position_buckets=8, max_relative_positions=20),
                            9, None, 'packed'),
    'v2_b8_L9_cls': (tiny('deberta_v2', position_buckets=8, max_relative_positions=20), 9,
                     [[0], [0]], 'padded'),
}


@pytest.mark.parametrize('name', sorted(SHIFT_CASES))
def test_shifts_equal_the_gathers_in_value_and_gradient(name):
  c, s, rows, mask_kind = SHIFT_CASES[name]
  rng = np.random.default_rng(3)
  b, h, d = 2, c.num_heads, c.head_dim
  positions = None if rows is None else jnp.asarray(rows, jnp.int32)
  q_len = s if rows is None else positions.shape[1]
  _, lo, hi = da.relative_layout(c, s)
  draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  args = (draw(b, q_len, h, d), draw(b, s, h, d), draw(hi - lo, h, d), draw(hi - lo, h, d))
  key_mask_BxS = np.ones((b, s), bool)
  key_mask_BxS[1, s - 4:] = False
  doc_S = np.digitize(np.arange(s), [s // 3, 2 * s // 3])  # 3 documents.
  q_at = np.broadcast_to(np.arange(s), (b, s)) if rows is None else np.asarray(rows)
  mask_BxQxS = (doc_S[q_at][..., None] == doc_S[None, None] if mask_kind == 'packed'
                else np.broadcast_to(key_mask_BxS[:, None], (b, q_len, s)))
  weights = draw(b, h, q_len, s)
  gather_positions = jnp.broadcast_to(jnp.arange(s), (b, s)) if rows is None else positions

  def loss(scores_fn, *a):
    logits = scores_fn(c, *a, gather_positions if scores_fn is gathered_scores else positions)
    logits = jnp.where(mask_BxQxS[:, None], logits, jnp.finfo(jnp.float32).min)
    return (jax.nn.softmax(logits, axis=-1) * weights).sum(), logits

  grad = lambda fn: jax.jit(jax.value_and_grad(functools.partial(loss, fn), argnums=(0, 1, 2, 3),
                                               has_aux=True))(*args)
  (old_loss, old_logits), old_grads = grad(gathered_scores)
  (new_loss, new_logits), new_grads = grad(shifted_scores)
  assert new_logits.shape == (b, h, q_len, s)
  np.testing.assert_allclose(new_logits, old_logits, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(new_loss, old_loss, atol=1e-5, rtol=1e-5)
  for new, old in zip(new_grads, old_grads):
    assert np.abs(np.asarray(old)).max() > 0
    np.testing.assert_allclose(new, old, atol=1e-5, rtol=1e-5)


def test_relative_layout_projects_only_reachable_rows():
  c = tiny(max_relative_positions=100, max_position_embeddings=128)
  index, lo, hi = da.relative_layout(c, 10)
  assert (lo, hi) == (100 - 9, 100 + 10) and index.shape == (10, 10)
  assert index.min() == 0 and index.max() == hi - lo - 1
  np.testing.assert_array_equal(index + lo, np.clip(
      np.arange(10)[:, None] - np.arange(10)[None] + 100, 0, 199))


def test_log_buckets_equal_hugging_face():
  torch = pytest.importorskip('torch')
  from transformers.models.deberta_v2 import modeling_deberta_v2  # pylint: disable=g-import-not-at-top
  for buckets, max_position in [(256, 512), (4, 16), (6, 12), (64, 128)]:
    rel = np.arange(-3 * max_position, 3 * max_position + 1)
    theirs = modeling_deberta_v2.make_log_bucket_position(torch.tensor(rel), buckets,
                                                          max_position).long().numpy()
    np.testing.assert_array_equal(da.log_bucket_position(rel, buckets, max_position), theirs)


# ------------------------------------------------------------------ enhanced mask decoder

class _Jitted:
  """A network's modules with jitted ``apply`` (eager Flax dispatch is slow on 2 cores)."""

  def __init__(self, net):
    static = ('deterministic', 'collect_hidden')
    self.pretraining = self._wrap(net.pretraining, static)
    self.encoder = self._wrap(net.encoder, static)

  @staticmethod
  def _wrap(module, static):
    apply = jax.jit(module.apply, static_argnames=static)
    return type('Jitted', (), {'apply': staticmethod(apply)})


def _pretraining(c, seed=0):
  net = registry.network(c)
  ids = jnp.asarray(np.random.default_rng(seed).integers(5, c.vocab_size, (2, 12)), jnp.int32)
  mask = jnp.ones_like(ids).at[1, 9:].set(0)
  params = random_params(net.init, jax.random.key(seed), seed=seed)
  return _Jitted(net), params, ids, jnp.zeros_like(ids), mask


POSITIONS = jnp.array([[1, 4, 7, 10], [0, 2, 2, 8]])


@pytest.mark.parametrize('kind', ['deberta', 'deberta_v2'])
def test_emd_shapes_and_exact_at_the_predicted_positions(kind):
  c = tiny(kind, emd_layers=2)
  net, params, ids, seg, mask = _pretraining(c)
  out = net.pretraining.apply({'params': params}, ids, seg, mask, POSITIONS)
  assert out['emd_output'].shape == (2, 4, c.hidden_size)
  assert out['mlm_logits'].shape == (2, 4, c.vocab_size)
  # The loss reads the EMD: the encoder's last layer ran at [CLS] only (no sequence output).
  assert 'sequence_output' not in out
  full = net.pretraining.apply({'params': params}, ids, seg, mask, POSITIONS, collect_hidden=True)
  assert full['sequence_output'].shape == (2, 12, c.hidden_size)
  np.testing.assert_allclose(full['emd_output'], out['emd_output'], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(full['pooled_output'], out['pooled_output'], atol=1e-5, rtol=1e-5)
  # Running the EMD at every position and picking the predicted ones gives the same logits:
  # a query's output depends only on its own input and the encoder states.
  every = net.pretraining.apply({'params': params}, ids, seg, mask)['mlm_logits']
  np.testing.assert_allclose(out['mlm_logits'],
                             np.take_along_axis(np.asarray(every), POSITIONS[..., None], 1),
                             atol=1e-5, rtol=1e-5)


def test_emd_uses_absolute_positions_only_in_the_decoder():
  c = tiny(emd_layers=2)
  net, params, ids, seg, mask = _pretraining(c)
  apply = lambda p: net.pretraining.apply({'params': p}, ids, seg, mask, POSITIONS,
                                          collect_hidden=True)
  before = apply(params)
  moved = jax.tree.map(lambda x: x, params)
  table = params['embeddings']['position_embeddings']['embedding']
  moved['embeddings']['position_embeddings']['embedding'] = np.roll(table, 3, axis=0)
  after = apply(moved)
  np.testing.assert_array_equal(after['sequence_output'], before['sequence_output'])
  assert np.abs(np.asarray(after['mlm_logits']) - np.asarray(before['mlm_logits'])).max() > 1e-3
  # Without the EMD the absolute table does not exist (DeBERTa: relative positions only).
  assert 'position_embeddings' not in jax.eval_shape(
      registry.network(c.replace(emd_layers=0)).init, jax.random.key(0))['embeddings']


def test_emd_layers_are_the_last_layer_applied_twice():
  c = tiny('deberta_v2', emd_layers=2, position_buckets=6, norm_rel_ebd=True)
  net, params, ids, seg, mask = _pretraining(c)
  # No parameters besides the absolute position table: the decoding layers are the last.
  off = nn.unbox(jax.eval_shape(registry.network(c.replace(emd_layers=0)).init,
                                jax.random.key(0)))
  flat = lambda t: {jax.tree_util.keystr(k): v.shape
                    for k, v in jax.tree_util.tree_leaves_with_path(t)}
  extra = set(flat(params)) - set(flat(off))
  assert extra == {"['embeddings']['position_embeddings']['embedding']"}, extra
  out = net.pretraining.apply({'params': params}, ids, seg, mask, POSITIONS,
                              collect_hidden=True)
  # By hand: I = H_{N-1} + P at the positions; twice layer N (its own weights) with K,V = H.
  h = np.asarray(out['all_hidden_states'][-2])
  last = jax.tree.map(lambda p: p[-1], params['encoder']['layers'])
  table = params['embeddings']['position_embeddings']['embedding']
  q = np.take_along_axis(h, np.asarray(POSITIONS)[..., None], 1) + table[np.asarray(POSITIONS)]
  rel = params['encoder']['rel_embeddings']
  _, lo, hi = da.relative_layout(c, ids.shape[1])
  rel = trunk.layers.LayerNorm(c.layer_norm_eps).apply(
      {'params': params['encoder']['rel_layer_norm']}, jnp.asarray(rel[lo:hi]))
  context = dict(rel_embeddings=rel, query_positions=jnp.asarray(POSITIONS),
                 kv_states=jnp.asarray(h))
  layer_apply = jax.jit(trunk.Layer(c, True).apply)
  for _ in range(2):
    q, _ = layer_apply({'params': last}, q, jnp.asarray(mask, bool)[:, None, None, :], context)
  np.testing.assert_allclose(out['emd_output'], q, atol=1e-5, rtol=1e-5)
  # Changing layer N's weights changes the EMD; the first layers' outputs stay.
  bumped = jax.tree.map(lambda x: x, params)
  bumped['encoder']['layers']['intermediate']['bias'] = (
      params['encoder']['layers']['intermediate']['bias'] + np.array([0, 0, 1.0])[:, None])
  again = net.pretraining.apply({'params': bumped}, ids, seg, mask, POSITIONS,
                                collect_hidden=True)
  np.testing.assert_array_equal(again['all_hidden_states'][-2], out['all_hidden_states'][-2])
  assert np.abs(np.asarray(again['emd_output']) - np.asarray(out['emd_output'])).max() > 1e-3


def test_features_and_fine_tuning_use_the_encoder_output():
  c = tiny(emd_layers=2)
  net, params, ids, seg, mask = _pretraining(c)
  pre = net.pretraining.apply({'params': params}, ids, seg, mask, POSITIONS, collect_hidden=True)
  enc = net.encoder.apply({'params': params}, ids, seg, mask)
  # The same encoder in two programs: equal to float32 rounding (the EMD's output, which
  # these must not be, differs by orders more).
  np.testing.assert_allclose(enc['sequence_output'], pre['sequence_output'], rtol=0, atol=1e-5)
  np.testing.assert_allclose(enc['pooled_output'], pre['pooled_output'], rtol=0, atol=1e-5)
  at_positions = np.take_along_axis(np.asarray(pre['sequence_output']),
                                    np.asarray(POSITIONS)[..., None], axis=1)
  assert np.abs(np.asarray(pre['emd_output']) - at_positions).max() > 1e-3
  from encoder_jax.finetune import heads  # pylint: disable=g-import-not-at-top
  head = heads.Classifier(c, num_labels=3, dropout_rate=0.1)
  head_params = jax.eval_shape(head.init, jax.random.key(1), ids, seg, mask)['params']
  assert set(head_params) == {'embeddings', 'encoder', 'pooler', 'classifier'}
  for part in ('embeddings', 'encoder', 'pooler'):  # The pretrained params drop in.
    assert (jax.tree.map(lambda x: x.shape, nn.unbox(head_params[part]))
            == jax.tree.map(np.shape, params[part]))
  logits = jax.eval_shape(head.apply, {'params': head_params}, ids, seg, mask)
  assert logits.shape == (2, 3)


def test_dropout_runs_in_training():
  c = tiny(emd_layers=2, hidden_dropout_rate=0.1, attention_dropout_rate=0.1)
  net, params, ids, seg, mask = _pretraining(c)
  run = lambda key: net.pretraining.apply({'params': params}, ids, seg, mask, POSITIONS,
                                          deterministic=False, rngs={'dropout': key})
  a, b = run(jax.random.key(1)), run(jax.random.key(2))
  assert np.isfinite(np.asarray(a['mlm_logits'])).all()
  assert np.abs(np.asarray(a['mlm_logits']) - np.asarray(b['mlm_logits'])).max() > 0


def test_padding_does_not_change_real_positions():
  c = tiny('deberta_v2', position_buckets=6)
  net, params, ids, seg, mask = _pretraining(c)
  other = ids.at[1, 9:].set(7)  # Different tokens where row 1 is padding.
  a = net.encoder.apply({'params': params}, ids, seg, mask)['sequence_output']
  b = net.encoder.apply({'params': params}, other, seg, mask)['sequence_output']
  np.testing.assert_allclose(a[1, :9], b[1, :9], atol=1e-6)


# ------------------------------------------------------------------ config and counts

@pytest.mark.parametrize('fields, expected', [
    (dict(kind='deberta', position_buckets=8), r"kind='deberta' \(v1\) has no .*deberta_v2"),
    (dict(kind='deberta', share_att_key=True), r"kind='deberta' \(v1\) has no"),
    (dict(kind='deberta', emd_layers=2, position_biased_input=True),
     'position_biased_input=False'),
    (dict(kind='deberta_v2', attention_kind='dot_product'), "attention_kind='disentangled'"),
    (dict(kind='deberta_v2', pos_att_type='c2p|p2p'), 'pos_att_type'),
    (dict(kind='deberta_v2', share_layers='all'), 'no cross-layer sharing'),
    (dict(kind='deberta_v2', position_buckets=8, max_position_embeddings=4),
     'position_buckets=8 needs'),
], ids=['v1_buckets', 'v1_shared_key', 'emd_biased', 'dot_product', 'p2p', 'sharing', 'k'])
def test_kind_checks(fields, expected):
  base = dict(attention_kind='disentangled', hidden_size=8, num_heads=2, num_layers=1,
              intermediate_size=8, vocab_size=11, position_biased_input=False)
  with pytest.raises(ValueError, match=expected):
    registry.make_config(dict(base, **fields))


def test_parameter_count_equals_hugging_face_deberta_base():
  """deberta-base's config (v1, k = 512, no absolute positions, no segments, 50,265 pieces):
  our MLM network = HF DebertaForMaskedLM + our pooler and pair head (+ the EMD's position
  table when it is on)."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  ours = tiny(vocab_size=50265, hidden_size=768, num_layers=12, num_heads=12,
              intermediate_size=3072, max_position_embeddings=512)
  count = lambda c: sum(x.size for x in jax.tree.leaves(nn.unbox(jax.eval_shape(
      registry.network(c).init, jax.random.key(0)))))
  hf_config = transformers.DebertaConfig(vocab_size=50265, relative_attention=True,
                                         pos_att_type='c2p|p2c', position_biased_input=False,
                                         type_vocab_size=0, max_relative_positions=-1)
  with torch.device('meta'):
    hf_count = sum(p.numel() for p in transformers.DebertaForMaskedLM(hf_config).parameters())
  heads = 768 * 768 + 768 + 768 * 2 + 2
  assert count(ours) == hf_count + heads == 139_244_121 + heads
  assert count(ours.replace(emd_layers=2)) == count(ours) + 512 * 768


def test_flops_count_the_relative_terms_and_the_emd():
  c = tiny()
  bert_like = config_lib.encoder_flops_per_token(c, 16)
  assert deberta.flops_per_token(c, 16) > bert_like
  assert deberta.flops_per_token(c.replace(emd_layers=2), 16) > deberta.flops_per_token(c, 16)
  assert deberta.flops_per_token(c.replace(pos_att_type=''), 16) == bert_like


# ------------------------------------------------------------------ end to end

ROW = 'deberta_v2_mlm_sop'


@pytest.mark.slow  # The family's DeBERTa-v2 row (support/family.py), shared with test_family.py.
@pytest.mark.xdist_group(family.group(ROW))
def test_short_run_loss_falls_then_loads_and_exports(family_root, tmp_path):
  """DeBERTa-v2 (v3's options) with EMD and whole-word masking on the embedded corpus, 12
  steps: the loss falls; ``encoder_jax.load`` serves the workdir; the HF export computes our
  encoder exactly."""
  import encoder_jax  # pylint: disable=g-import-not-at-top
  from encoder_jax import convert  # pylint: disable=g-import-not-at-top
  run = family.trained(ROW, family_root)
  assert run.config.model.kind == 'deberta_v2' and run.config.model.emd_layers == 2
  workdir, losses = run.workdir, run.logged('loss')
  assert len(losses) == 6 and np.mean(losses[-2:]) < losses[0] - 0.5, losses  # 7.6 -> 6.9.
  model = encoder_jax.load(workdir)
  x = model.encode(['The cat sat on the mat.', 'A second, longer sentence here.'])
  ids, mask = x['input_ids'], x['input_mask']
  hidden = model.hidden_states(ids, mask)
  assert hidden.shape == ids.shape + (32,) and np.isfinite(hidden).all()
  assert np.isfinite(model.mlm_logits(ids, mask)).all()
  out = str(tmp_path / 'hf')
  convert.workdir_to_hf(workdir, out)
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  hf_model = transformers.DebertaV2ForMaskedLM.from_pretrained(out).eval()
  with torch.no_grad():
    theirs = hf_model(input_ids=torch.tensor(np.asarray(ids), dtype=torch.long),
                      attention_mask=torch.tensor(np.asarray(mask), dtype=torch.long),
                      output_hidden_states=True).hidden_states[-1].numpy()
  sel = np.asarray(mask).astype(bool)
  np.testing.assert_allclose(theirs[sel], hidden[sel], atol=1e-4)
