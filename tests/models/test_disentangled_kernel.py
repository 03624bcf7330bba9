"""DeBERTa's Pallas attention kernel (``models/disentangled_kernel.py``): in Pallas interpret
mode on the CPU against the XLA path (``attention_implementation='xla'``), in value and
gradient (parameters and inputs) on odd shapes: lengths not a multiple of the block (several
blocks each), key padding, a packed row of 3 documents, v1 (k < L, k > L, c2p only) and v2
(log buckets, share_att_key, p2c only, c2c only); the kernel against a direct O(L^2 d) sum
of its own table layout; which calls run it; and, with libtpu, the TPU compiler's lowering
of a layer's forward and backward kernels (Mosaic)."""

from __future__ import annotations

import importlib.util
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.models import attention
from encoder_jax.models import disentangled_attention as da
from encoder_jax.models import disentangled_kernel as dk
from encoder_jax.models import registry


def tiny(kind='deberta', **kw):
  fields = dict(kind=kind, attention_kind='disentangled', vocab_size=53, hidden_size=24,
                num_layers=1, num_heads=3, intermediate_size=40, max_position_embeddings=32,
                type_vocab_size=0, position_biased_input=False, layer_norm_eps=1e-7,
                hidden_dropout_rate=0.0, attention_dropout_rate=0.0,
                attention_implementation='splash')
  fields.update(kw)
  return registry.make_config(fields)


def _random_params(init_fn, *args, seed=0):
  shapes = nn.unbox(jax.eval_shape(init_fn, *args))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: (0.3 * rng.standard_normal(x.shape)).astype(np.float32), shapes)


def _documents(b: int, s: int) -> np.ndarray:
  """[B, S]: 3 documents a row (their boundaries differ by row), then padding (document 0)."""
  docs = np.zeros((b, s), np.int32)
  for row in range(b):
    cuts = [s // 4 + row, s // 2 + row, s - 3]
    docs[row] = np.digitize(np.arange(s), cuts) + 1
    docs[row, s - 3:] = 0
  return docs


# name -> (config, length, mask kind).
CASES = {
    'v1_k3_L11_padded': (tiny(max_relative_positions=3), 11, 'padded'),
    'v1_k40_L13_padded': (tiny(max_relative_positions=40, max_position_embeddings=64), 13,
                          'padded'),
    'v1_c2p_L9_packed': (tiny(pos_att_type='c2p'), 9, 'packed'),
    'v2_b8_k20_L19_packed': (tiny('deberta_v2', position_buckets=8, max_relative_positions=20),
                             19, 'packed'),
    'v2_b6_shared_L17_padded': (tiny('deberta_v2', position_buckets=6, max_relative_positions=12,
                                     share_att_key=True), 17, 'padded'),
    'v2_shared_p2c_L10_padded': (tiny('deberta_v2', position_buckets=4, share_att_key=True,
                                      pos_att_type='p2c'), 10, 'padded'),
    'v2_c2c_L9_padded': (tiny('deberta_v2', pos_att_type=''), 9, 'padded'),
}


def _layer(c, s, mask_kind, seed=0):
  """(module under c, module under attention_implementation='xla', params, args)."""
  rng = np.random.default_rng(seed)
  b, e = 2, c.hidden_size
  x = jnp.asarray(rng.standard_normal((b, s, e)), jnp.float32)
  _, lo, hi = da.relative_layout(c, s)
  context = {'rel_embeddings': jnp.asarray(rng.standard_normal((hi - lo, e)), jnp.float32)}
  if mask_kind == 'packed':
    docs = _documents(b, s)
    context['document_ids'] = jnp.asarray(docs)
    mask = docs != 0
  else:
    mask = np.ones((b, s), bool)
    mask[1, s - 4:] = False
  mask_Bx1x1xS = jnp.asarray(mask)[:, None, None, :]
  ours = da.DisentangledAttention(c, deterministic=True)
  xla = da.DisentangledAttention(registry.make_config(
      {**c.to_dict(), 'attention_implementation': 'xla'}), deterministic=True)
  params = _random_params(ours.init, jax.random.key(0), x, mask_Bx1x1xS, context, seed=seed + 1)
  return ours, xla, params, (x, mask_Bx1x1xS, context)


@pytest.mark.parametrize('name', sorted(CASES))
def test_kernel_equals_the_xla_path_in_value_and_gradient(name):
  c, s, mask_kind = CASES[name]
  ours, xla, params, (x, mask, context) = _layer(c, s, mask_kind)
  weights = jnp.asarray(np.random.default_rng(5).standard_normal(x.shape), jnp.float32)

  def run(module):
    def loss(p, x):
      out = module.apply(p, x, mask, context)
      return jnp.sum(out * weights), out
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)

  _same_as_xla(run, ours, xla, jax.make_jaxpr(lambda p, x: ours.apply(p, x, mask, context))(
      params, x), nonzero=True)


def _same_as_xla(run, ours, xla, jaxpr, nonzero=False):
  """``run(module)`` -> ((loss, outputs), gradients): ours (one Pallas call in ``jaxpr``)
  equals the XLA path in outputs and gradients (each non-zero with ``nonzero``)."""
  assert str(jaxpr).count('pallas_call') == 1, 'the kernel path did not run'
  (_, out), grads = run(ours)
  (_, ref_out), ref_grads = run(xla)
  np.testing.assert_allclose(out, ref_out, atol=1e-5, rtol=1e-5)
  for (path, g), ref in zip(jax.tree.leaves_with_path(grads), jax.tree.leaves(ref_grads)):
    assert not nonzero or np.abs(np.asarray(ref)).max() > 0, path
    np.testing.assert_allclose(g, ref, atol=2e-5, rtol=1e-5, err_msg=jax.tree_util.keystr(path))


def _direct(q, k, v, kr, qr, q_ids, kv_ids, scale):
  """The kernel's attention as one O(P^2 d) sum over its own table layout (module doc)."""
  p = q.shape[2]
  i, j = np.arange(p)[:, None], np.arange(p)[None, :]
  s = jnp.einsum('bhid,bhjd->bhij', q, k)
  if kr is not None:
    s += jnp.einsum('bhid,hijd->bhij', q, kr[:, j - i + p - 1])
  if qr is not None:
    s += jnp.einsum('bhjd,hijd->bhij', k, qr[:, i - j + p - 1])
  allowed = ((kv_ids > 0)[:, None, None, :] if q_ids is None
             else (q_ids[:, :, None] == kv_ids[:, None, :])[:, None])
  s = jnp.where(allowed, s / scale, jnp.finfo(jnp.float32).min)
  return jnp.einsum('bhij,bhjd->bhid', jax.nn.softmax(s, -1), v)


@pytest.mark.parametrize('name', ['v1_k3_L11_padded', 'v2_b8_k20_L19_packed',
                                  'v2_b6_shared_L17_padded'])
def test_queries_at_rows_equal_the_xla_path_in_value_and_gradient(name):
  """The EMD's and the last layer's calls: queries at some rows of the keys (a position
  twice with the same vector, as [CLS] and the padding slots), through the kernel at their
  positions, against the XLA path's shifts at the rows."""
  c, s, mask_kind = CASES[name]
  ours, xla, params, (x, mask, context) = _layer(c, s, mask_kind)
  positions = jnp.asarray([[0, 3, s - 1, 0], [5, 1, 1, 2]], jnp.int32)
  queries = jnp.take_along_axis(x, positions[..., None], axis=1)
  rows = dict(context, kv_states=x, query_positions=positions)
  weights = jnp.asarray(np.random.default_rng(5).standard_normal(queries.shape), jnp.float32)

  def run(module):
    def loss(p, x):
      q = jnp.take_along_axis(x, positions[..., None], axis=1)
      out = module.apply(p, q, mask, dict(rows, kv_states=x))
      return jnp.sum(out * weights), out
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)

  _same_as_xla(run, ours, xla,
               jax.make_jaxpr(lambda p, q: ours.apply(p, q, mask, rows))(params, queries))


@pytest.mark.parametrize('terms', ['c2p_p2c', 'c2p', 'p2c'])
@pytest.mark.parametrize('packed', [False, True], ids=['padded', 'packed'])
def test_kernel_equals_the_direct_sum_over_its_tables(terms, packed):
  """Three blocks of 8 each way (every window offset, both edges of the tables)."""
  b, h, p, d, bl = 2, 2, 24, 16, 8
  rng = np.random.default_rng(7)
  draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  q, k, v, do = (draw(b, h, p, d) for _ in range(4))
  kr = draw(h, 2 * p, d) if 'c2p' in terms else None
  qr = draw(h, 2 * p, d) if 'p2c' in terms else None
  if packed:
    docs = np.asarray(np.digitize(np.arange(p), [5, 13]), np.int32)
    q_ids = jnp.asarray(np.broadcast_to(docs, (b, p))).at[:, 21:].set(-2)
    kv_ids = jnp.asarray(np.broadcast_to(docs, (b, p))).at[:, 21:].set(-1)
    rows = np.asarray(q_ids >= 0)
  else:
    q_ids, kv_ids = None, jnp.ones((b, p), jnp.int32).at[1, 15:].set(0).at[:, 21:].set(-1)
    rows = np.asarray(kv_ids >= 0)
  weights = do * rows[:, None, :, None]
  kernel = lambda *a: dk.attend(*a, q_ids, kv_ids, block=bl, scale=7.0, interpret=True)
  direct = lambda *a: _direct(*a, q_ids, kv_ids, 7.0)
  args = (q, k, v, kr, qr)
  argnums = tuple(n for n, a in enumerate(args) if a is not None)
  value = lambda f: jax.jit(jax.value_and_grad(lambda *a: jnp.sum(f(*a) * weights), argnums))
  out, grads = value(kernel)(*args)
  ref, ref_grads = value(direct)(*args)
  np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-5)
  for g, r in zip(grads, ref_grads):
    np.testing.assert_allclose(g, r, atol=2e-5, rtol=1e-5)


def test_codes_and_biases_equal_the_direct_sum():
  """XLNet's operands (c2p, codes, a bias a key and a bias a query where the codes say):
  three blocks of 8 each way, masked pairs at random, block padding, a flat row (logits 0,
  gradients to the scores: ``s - stop_gradient(s)``) and a row that reads no key (unread)."""
  b, h, p, d, bl = 2, 2, 24, 16, 8
  rng = np.random.default_rng(11)
  draw = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  q, k, v, do = (draw(b, h, p, d) for _ in range(4))
  kr, key_bias, row_bias = draw(h, 2 * p, d), draw(b, h, p), draw(b, h, p)
  codes = rng.integers(dk.READ, dk.MASKED + 1, (b, p, p)).astype(np.int8)
  codes[:, :, 21:] = dk.MASKED
  codes[0, 3] = dk.MASKED
  flat = np.zeros((b, p), bool)
  flat[1, 5] = True
  codes[1, 5, :21] = rng.integers(dk.READ, dk.READ_WITH_ROW_BIAS + 1, 21)
  weights = do.at[0, :, 3].set(0.0).at[:, :, 21:].set(0.0)
  i, j = np.arange(p)[:, None], np.arange(p)[None, :]

  def direct(q, k, v, kr, key_bias, row_bias):
    s = (jnp.einsum('bhid,bhjd->bhij', q, k)
         + jnp.einsum('bhid,hijd->bhij', q, kr[:, j - i + p - 1])
         + key_bias[:, :, None, :] + jnp.where(codes[:, None] == dk.READ_WITH_ROW_BIAS,
                                               row_bias[..., None], 0.0))
    s = jnp.where(flat[:, None, :, None], s - jax.lax.stop_gradient(s), s)
    s = jnp.where(codes[:, None] == dk.MASKED, jnp.finfo(jnp.float32).min, s / 7.0)
    return jnp.einsum('bhij,bhjd->bhid', jax.nn.softmax(s, -1), v)

  def kernel(q, k, v, kr, key_bias, row_bias):
    return dk.attend(q, k, v, kr, None, None, None, block=bl, scale=7.0, interpret=True,
                     codes=dk.pack_codes(jnp.asarray(codes), jnp.asarray(flat), bl),
                     key_bias_BxHxP=key_bias,
                     row_bias_BxHxP=row_bias)

  value = lambda f: jax.jit(jax.value_and_grad(lambda *a: jnp.sum(f(*a) * weights),
                                               tuple(range(6))))
  args = (q, k, v, kr, key_bias, row_bias)
  out, grads = value(kernel)(*args)
  ref, ref_grads = value(direct)(*args)
  np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-5)
  for g, r in zip(grads, ref_grads):
    assert np.abs(np.asarray(r)).max() > 0
    np.testing.assert_allclose(g, r, atol=2e-5, rtol=1e-5)


def test_the_kernel_takes_ids_or_codes():
  x = jnp.zeros((1, 1, 8, 8))
  ids = jnp.ones((1, 8), jnp.int32)
  codes = dk.pack_codes(jnp.zeros((1, 8, 8), jnp.int8), jnp.zeros((1, 8), bool), 8)
  call = lambda **kw: dk.attend(x, x, x, None, None, None, kw.pop('ids', None), block=8,
                                scale=1.0, interpret=True, **kw)
  with pytest.raises(ValueError, match='key ids or the codes'):
    call(ids=ids, codes=codes)
  with pytest.raises(ValueError, match='key ids or the codes'):
    call()
  with pytest.raises(ValueError, match='row bias'):
    call(ids=ids, row_bias_BxHxP=jnp.zeros((1, 1, 8)))


def test_reverse_table_is_its_own_adjoint():
  t = jnp.arange(2 * 2 * 6 * 3, dtype=jnp.float32).reshape(2, 12, 3)
  u = jnp.asarray(np.random.default_rng(0).standard_normal(t.shape), jnp.float32)
  np.testing.assert_array_equal(dk.reverse_table(dk.reverse_table(t))[:, :-1], t[:, :-1])
  _, vjp = jax.vjp(dk.reverse_table, t)
  np.testing.assert_array_equal(vjp(u)[0], dk.reverse_table(u))


def _warnings(monkeypatch):
  lines = []
  monkeypatch.setattr(attention, '_warned', set())
  monkeypatch.setattr(attention.logging, 'warning', lambda fmt, *a: lines.append(fmt % a))
  return lines


def test_which_calls_run_the_kernel(monkeypatch):
  """Splash (or None on a TPU): the kernel, queries at some rows (the EMD, the last layer at
  the predicted rows) included; 'xla', a caller's per-query mask: the XLA path, without a line;
  attention dropout in training: the XLA path and one line naming the key."""
  lines = _warnings(monkeypatch)
  c, s, _ = CASES['v1_k3_L11_padded']
  ours, xla, params, (x, mask, context) = _layer(c, s, 'padded')
  trace = lambda m, x, mask, ctx, **kw: str(jax.make_jaxpr(
      lambda p, x: m.apply(p, x, mask, ctx, **kw))(params, x))
  assert 'pallas_call' in trace(ours, x, mask, context)
  assert 'pallas_call' not in trace(xla, x, mask, context)
  rows = dict(context, kv_states=x, query_positions=jnp.asarray([[0, 4, 9], [2, 2, 1]]))
  assert 'pallas_call' in trace(ours, x[:, :3], mask, rows)
  per_query = jnp.broadcast_to(mask, (2, 1, s, s))
  assert 'pallas_call' not in trace(ours, x, per_query, context)
  assert lines == []
  dropout = da.DisentangledAttention(registry.make_config(
      {**c.to_dict(), 'attention_dropout_rate': 0.1}), deterministic=False)
  for _ in range(2):
    jaxpr = trace(dropout, x, mask, context, rngs={'dropout': jax.random.key(1)})
    assert 'pallas_call' not in jaxpr
  assert len(lines) == 1 and re.search(
      r"disentangled attention kernel.*no attention dropout.*attention_dropout_rate=0.1.*"
      r'using XLA attention', lines[0]), lines


@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                    reason="libtpu (pip install 'encoder_jax[tpu]') is not installed")
def test_the_tpu_compiler_lowers_a_layers_kernels():
  """One v5e chip, bfloat16, 200 tokens (padded to 256: blocks of 256), v2 with both
  terms: the forward and backward kernels are two Mosaic custom calls of the compiled
  gradient, and their cost estimates reach XLA's count."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  devices = topologies.get_topology_desc(topology_name='v5e:2x2', platform='tpu').devices
  mesh = jax.sharding.Mesh(np.asarray(devices[:1]), ('data',))
  c = tiny('deberta_v2', position_buckets=32, max_relative_positions=256,
           max_position_embeddings=256, dtype='bfloat16', hidden_size=128, num_heads=2,
           attention_implementation=None)
  s, b = 200, 2
  module = da.DisentangledAttention(c, deterministic=True)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  _, lo, hi = da.relative_layout(c, s)
  x = jax.ShapeDtypeStruct((b, s, c.hidden_size), jnp.float32, sharding=replicated)
  mask = jax.ShapeDtypeStruct((b, 1, 1, s), jnp.bool_, sharding=replicated)
  rel = jax.ShapeDtypeStruct((hi - lo, c.hidden_size), jnp.bfloat16, sharding=replicated)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
                          nn.unbox(jax.eval_shape(module.init, jax.random.key(0), x, mask,
                                                  {'rel_embeddings': rel})))
    loss = lambda p, x, mask, rel: jnp.sum(module.apply(
        p, x, mask, {'rel_embeddings': rel}).astype(jnp.float32))
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x, mask, rel).compile()
  text = compiled.as_text()
  assert text.count('custom_call_target="tpu_custom_call"') == 2
  assert 'disentangled_attention_fwd' in text and 'disentangled_attention_bwd' in text
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  assert cost['flops'] > 20 * 2 * b * 2 * 256 * 256 * 64  # The kernels' estimates included.


@pytest.mark.parametrize('emd_layers', [0, 2])
def test_a_network_with_the_kernel_in_its_layer_scan_equals_xla(emd_layers):
  """The whole pretraining network (2 scanned layers; the last at the predicted rows, or at
  [CLS] with the enhanced mask decoder; every call through the kernel): MLM logits and every
  parameter's gradient."""
  grads = {}
  for impl in ('splash', 'xla'):
    c = tiny(num_layers=2, max_relative_positions=6, attention_implementation=impl,
             emd_layers=emd_layers)
    net = registry.network(c)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(5, c.vocab_size, (2, 13)), jnp.int32)
    mask = jnp.ones_like(ids).at[1, 9:].set(0)
    positions = jnp.asarray([[1, 4, 7, 10], [0, 2, 2, 8]])
    params = _random_params(net.init, jax.random.key(0), seed=1)
    weights = jnp.asarray(rng.standard_normal((2, 4, c.vocab_size)), jnp.float32)

    def loss(p):
      out = net.pretraining.apply({'params': p}, ids, jnp.zeros_like(ids), mask, positions)
      return jnp.sum(out['mlm_logits'] * weights)

    fn = lambda p: loss(p)
    assert ('pallas_call' in str(jax.make_jaxpr(fn)(params))) == (impl == 'splash')
    grads[impl] = jax.jit(jax.value_and_grad(fn))(params)
  (value, g), (ref_value, ref_g) = grads['splash'], grads['xla']
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  for (path, a), b in zip(jax.tree.leaves_with_path(g), jax.tree.leaves(ref_g)):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
