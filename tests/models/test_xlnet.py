"""XLNet's network (models/xlnet.py): relative positions against a direct reference,
parameter count equal to Hugging Face's, logical axes, padding invariance, the memory,
and the content stream as the encoder. (Both streams against transformers:
tests/interop/test_hf_parity_xlnet.py; the permutation masks: tests/objectives/test_plm.py.)"""

from __future__ import annotations

import importlib.util
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from encoder_jax.core import sharding
from encoder_jax.models import registry
from encoder_jax.models import xlnet

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

TINY = dict(kind='xlnet', vocab_size=61, hidden_size=24, num_layers=2, num_heads=3,
            intermediate_size=40, max_position_embeddings=32, type_vocab_size=3)


def _net(**overrides):
  return registry.network({**TINY, **overrides})


def _params(net, seed=0):
  return nn.unbox(jax.jit(net.init)(jax.random.key(seed)))


def _pretraining(net):
  """The jitted pretraining network (eager application of a scanned model is slow)."""
  return jax.jit(net.pretraining.apply,
                 static_argnames=('deterministic', 'collect_hidden', 'bi_data'))


def _inputs(rng, b, l, lengths, vocab=TINY['vocab_size']):
  ids = rng.randint(5, vocab, (b, l)).astype(np.int32)
  mask = (np.arange(l)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  seg = (np.arange(l)[None] >= np.asarray(lengths)[:, None] // 2).astype(np.int32) * mask
  return ids, seg, mask


# ------------------------------------------------------------- relative positions


def _direct_position_scores(q_BxLxNxD, wr_ExNxD, qlen, mlen, d_model, clamp_len, backward_B):
  """O(L^2 d): for every (query i, key j), the sinusoid of the distance (mlen + i) - j
  (negated for backward rows, clipped at clamp_len), projected by r, dotted with q."""
  b = q_BxLxNxD.shape[0]
  klen = qlen + mlen
  out = np.zeros((b, q_BxLxNxD.shape[2], qlen, klen), np.float64)
  inv_freq = 1.0 / 10000 ** (np.arange(0, d_model, 2) / d_model)
  for n in range(b):
    for i in range(qlen):
      for j in range(klen):
        dist = (mlen + i) - j
        if clamp_len > 0:
          dist = max(-clamp_len, min(clamp_len, dist))
        if backward_B is not None and backward_B[n]:
          dist = -dist
        emb = np.concatenate([np.sin(dist * inv_freq), np.cos(dist * inv_freq)])
        k_r = np.einsum('e,end->nd', emb, wr_ExNxD)
        out[n, :, i, j] = np.einsum('nd,nd->n', q_BxLxNxD[n, i], k_r)
  return out


@pytest.mark.parametrize('qlen,mlen,clamp_len,bidirectional', [
    (5, 0, -1, False), (6, 3, -1, False), (7, 2, 3, True), (4, 0, -1, True)])
def test_relative_shift_reads_each_pairs_distance(qlen, mlen, clamp_len, bidirectional):
  """The shifted position scores equal the direct per-pair computation: per row, and as
  the layer computes them (``position_scores``: head-major, one product per direction,
  the batch's second half backward under bi_data)."""
  rng = np.random.RandomState(qlen + mlen)
  b, n, d, e = 4, 2, 4, 8
  q = rng.randn(b, qlen, n, d).astype(np.float32)
  wr = rng.randn(e, n, d).astype(np.float32)
  backward = np.arange(b) >= b // 2 if bidirectional else None
  pos_R = xlnet.relative_positions(qlen, qlen + mlen, clamp_len)
  assert pos_R.shape == (2 * qlen + mlen,)
  if backward is None:
    emb_BxRxE = jnp.broadcast_to(xlnet.sinusoid(pos_R, e), (b, pos_R.shape[0], e))
    emb_XxRxE = xlnet.sinusoid(pos_R, e)[None]
  else:
    emb_BxRxE = xlnet.sinusoid(jnp.where(backward[:, None], -pos_R, pos_R), e)
    emb_XxRxE = xlnet.sinusoid(jnp.stack([pos_R, -pos_R]), e)
  k_r = jnp.einsum('bre,end->brnd', emb_BxRxE, wr)
  shifted = xlnet.rel_shift(jnp.einsum('blnd,brnd->bnlr', q, k_r), qlen + mlen)
  direct = _direct_position_scores(q, wr, qlen, mlen, e, clamp_len, backward)
  np.testing.assert_allclose(np.asarray(shifted), direct, atol=1e-4, rtol=1e-4)
  x = emb_XxRxE.shape[0]
  q_NxXxBxLxD = q.transpose(2, 0, 1, 3).reshape(n, x, b // x, qlen, d)
  layer = xlnet.position_scores(q_NxXxBxLxD, jnp.einsum('xre,end->xrnd', emb_XxRxE, wr),
                                qlen + mlen)
  np.testing.assert_allclose(np.asarray(layer).reshape(n, b, qlen, -1).transpose(1, 0, 2, 3),
                             direct, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('x,mlen', [(1, 0), (2, 3)])
def test_position_scores_gradients_equal_autodiff(x, mlen):
  """The written-out gradient of ``position_scores`` equals autodiff's of the plain
  product and shift, under an arbitrary cotangent; bfloat16 inputs get bfloat16 scores
  and gradients."""
  rng = np.random.RandomState(x + mlen)
  n, b, l, d = 3, 2, 5, 4
  klen = l + mlen
  q = jnp.asarray(rng.randn(n, x, b, l, d), jnp.float32)
  kr = jnp.asarray(rng.randn(x, klen + l, n, d), jnp.float32)
  g = jnp.asarray(rng.randn(n, x, b, l, klen), jnp.float32)
  plain = lambda q, kr: xlnet.rel_shift(
      jnp.einsum('nxbld,xrnd->nxblr', q, kr, preferred_element_type=q.dtype), klen)
  ours = lambda q, kr: xlnet.position_scores(q, kr, klen)

  def grads(f, *a):
    def pullback(*a):
      out, vjp = jax.vjp(f, *a)
      return vjp(g.astype(out.dtype))
    return jax.jit(pullback)(*a)

  np.testing.assert_allclose(ours(q, kr), plain(q, kr), atol=1e-5)
  for got, want in zip(grads(ours, q, kr), grads(plain, q, kr)):
    assert np.abs(np.asarray(want)).max() > 0.1
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)
  bf = [a.astype(jnp.bfloat16) for a in (q, kr)]
  assert ours(*bf).dtype == jnp.bfloat16
  for got, want in zip(grads(ours, *bf), grads(plain, *bf)):
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(got), np.float32(want), atol=0.1, rtol=0.05)


def test_bi_data_needs_an_even_batch():
  net = _net()
  params = _params(net)
  ids, seg, mask = _inputs(np.random.RandomState(0), 3, 6, [6, 6, 4])
  with pytest.raises(ValueError, match='bi_data.*3 rows.*even'):
    _pretraining(net)({'params': params}, ids, seg, mask, np.zeros((3, 1), np.int32),
                      bi_data=True)


def test_memory_with_an_all_zero_mask_is_no_memory():
  """The training state starts with an empty memory at a fixed shape: it must change
  nothing; a filled memory must change the outputs."""
  net = _net(mem_len=4)
  params = _params(net)
  ids, seg, mask = _inputs(np.random.RandomState(0), 2, 9, [9, 6])
  tm = jax.nn.one_hot(np.array([[1, 4], [2, 5]]), 9)
  perm = np.broadcast_to(np.asarray(tm).max(1)[:, None], (2, 9, 9))
  apply = _pretraining(net)
  run = lambda **kw: apply({'params': params}, ids, seg, mask, perm_mask=perm,
                           target_mapping=tm, **kw)
  none = run()
  mems = np.random.RandomState(1).randn(2, 2, 4, 24).astype(np.float32)
  empty = run(mems=mems, mem_mask=np.zeros((2, 4), np.int32))
  for k in ('mlm_logits', 'query_output'):
    np.testing.assert_allclose(none[k], empty[k], atol=1e-5, err_msg=k)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(none['sequence_output'])[real],
                             np.asarray(empty['sequence_output'])[real], atol=1e-5)
  full = run(mems=mems, mem_mask=np.ones((2, 4), np.int32))
  assert np.abs(np.asarray(full['mlm_logits']) - np.asarray(none['mlm_logits'])).max() > 1e-3
  # The new memory: the last mem_len of (old memory, this layer's input), and its mask.
  assert empty['new_mems'].shape == (2, 2, 4, 24)
  np.testing.assert_array_equal(empty['new_mem_mask'], mask[:, -4:])


# ------------------------------------------------------------------- the network


def test_parameter_count_equals_hugging_face_xlnet_base():
  ours = dict(kind='xlnet', vocab_size=32000, hidden_size=768, num_layers=12, num_heads=12,
              intermediate_size=3072, type_vocab_size=3)
  net = registry.network(ours)
  count = sum(x.size for x in jax.tree.leaves(nn.unbox(jax.eval_shape(net.init,
                                                                      jax.random.key(0)))))
  with torch.device('meta'):
    hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(
        vocab_size=32000, d_model=768, n_layer=12, n_head=12, d_inner=3072))
  assert count == sum(p.numel() for p in hf.parameters()) == 116_750_336


def test_every_parameter_has_logical_axes_with_rules():
  boxed = jax.eval_shape(_net().init, jax.random.key(0))
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  rules = dict(sharding.LOGICAL_RULES)
  for leaf in leaves:
    assert isinstance(leaf, nn.LogicallyPartitioned), type(leaf)
    assert len(leaf.names) == len(leaf.value.shape)
    assert all(n is None or n in rules for n in leaf.names), leaf.names
  layer = boxed['encoder']['layers']
  assert layer['q'].names == ('layers', 'embed', 'heads', 'kv')
  assert layer['seg_embed'].names == ('layers', None, 'heads', 'kv')
  assert sorted(boxed) == ['embeddings', 'encoder', 'lm_bias', 'mask_emb']


def test_padding_never_changes_real_positions_in_either_stream():
  net = _net()
  params = _params(net)
  rng = np.random.RandomState(0)
  ids, seg, mask = _inputs(rng, 3, 10, [10, 7, 4])
  pos = np.array([[1, 2], [0, 3], [1, 2]], np.int32)
  apply = _pretraining(net)
  short = apply({'params': params}, ids, seg, mask, pos)
  pad = rng.randint(0, TINY['vocab_size'], (3, 6)).astype(np.int32)
  long_ids = np.concatenate([np.where(mask > 0, ids, 7), pad], 1)
  zeros = np.zeros((3, 6), np.int32)
  longer = apply({'params': params}, long_ids, np.concatenate([seg, zeros], 1),
                 np.concatenate([mask, zeros], 1), pos)
  np.testing.assert_allclose(short['mlm_logits'], longer['mlm_logits'], atol=1e-5)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(short['sequence_output'])[real],
                             np.asarray(longer['sequence_output'])[:, :10][real], atol=1e-5)


def test_encoder_is_the_content_stream_of_the_pretraining_network():
  """Features and fine-tuning read the content stream: the encoder-only network on the
  pretraining params gives the pretraining network's content stream, and the query stream
  does not feed back into it."""
  net = _net()
  params = _params(net)
  ids, seg, mask = _inputs(np.random.RandomState(3), 2, 8, [8, 5])
  enc = jax.jit(net.encoder.apply, static_argnames=('collect_hidden',))(
      {'params': params}, ids, seg, mask, collect_hidden=True)
  apply = _pretraining(net)
  both = apply({'params': params}, ids, seg, mask, np.array([[1, 2], [3, 4]], np.int32),
               collect_hidden=True)
  content = apply({'params': params}, ids, seg, mask)
  np.testing.assert_allclose(enc['sequence_output'], content['sequence_output'], atol=1e-6)
  assert len(enc['all_hidden_states']) == TINY['num_layers'] + 1
  assert len(both['all_query_states']) == TINY['num_layers'] + 1
  assert both['mlm_logits'].shape == (2, 2, TINY['vocab_size'])
  assert content['mlm_logits'].shape == (2, 8, TINY['vocab_size'])  # No targets: every h.


def test_without_content_output_the_query_stream_and_its_gradients_are_unchanged():
  """Pretraining (``content_output=False``) skips the last layer's content stream: the
  logits and every parameter's gradient equal the full computation's, with and without
  memory. The last layer runs on its own, so the program has no conditional
  (``tests/test_flops.py`` checks that XLA's count leaves that content stream out)."""
  net = _net(mem_len=4)
  params = _params(net)
  ids, seg, mask = _inputs(np.random.RandomState(5), 2, 8, [8, 6])
  pos = np.array([[1, 2], [3, 4]], np.int32)
  mems = jax.random.normal(jax.random.key(1), (2, TINY['num_layers'], 4, TINY['hidden_size']))
  for extra in ({}, dict(mems=mems, mem_mask=np.ones((2, 4), np.int32))):
    def loss(p, content_output, extra=extra):
      out = net.pretraining.apply({'params': p}, ids, seg, mask, pos,
                                  content_output=content_output, **extra)
      assert ('sequence_output' in out) == content_output
      return (out['mlm_logits'] ** 2).mean(), out['mlm_logits']
    grad = jax.jit(jax.grad(loss, has_aux=True), static_argnums=1)
    (g_full, logits_full), (g_skip, logits_skip) = grad(params, True), grad(params, False)
    np.testing.assert_allclose(logits_skip, logits_full, rtol=1e-6, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g_skip), jax.tree.leaves(g_full)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  hlo = jax.jit(lambda p: jax.grad(lambda p: loss(p, False)[0])(p)).lower(params).as_text()
  assert hlo.count('stablehlo.case') + hlo.count('mhlo.case') == 0


def test_config_checks_name_the_key():
  with pytest.raises(ValueError, match='mem_len'):
    _net(mem_len=-1)
  with pytest.raises(ValueError, match='position_offset'):
    _net(position_offset=1)
  with pytest.raises(ValueError, match='share_layers'):
    _net(share_layers='all')


# ------------------------------------------------------------- the Pallas kernel's path


def _permuted_inputs(b=4, l=13, seed=0):
  """A batch as the PLM objective gives it (its permutation masks and target slots), rows
  of different lengths, segments with [CLS]'s own, and one target that may read no key."""
  from encoder_jax.objectives import plm  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  ids, seg, mask = _inputs(rng, b, l, [l, l - 3, l, l - 4])
  seg[:, 0] = 2
  selected = jnp.asarray(rng.rand(b, l) < 0.3) & (mask > 0)
  perm, targets = plm.permutation_masks(jax.random.key(seed), selected, jnp.asarray(mask == 0))
  first = int(np.argmax(np.asarray(targets[0])))
  perm = perm.at[0, first].set(True)  # Target `first` of row 0 reads nothing.
  mapping, _, _ = plm.target_slots(targets, jnp.asarray(ids), 5)
  return ids, seg, mask, perm, mapping


@pytest.mark.parametrize('bi_data,content_output', [(True, False), (False, True)])
def test_the_kernel_path_equals_the_xla_path(bi_data, content_output):
  """attention_implementation='splash' (the Pallas kernel, interpret mode) against 'xla':
  logits, content states and every parameter's gradient, with the permutation masks, the
  backward half of the batch, padding, 13 tokens (two blocks of 8) and a query stream row
  that reads no key."""
  ids, seg, mask, perm, mapping = _permuted_inputs()
  ours, ref = _net(attention_implementation='splash'), _net(attention_implementation='xla')
  params = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(1), x.shape),
                        _params(ref))

  def run(net):
    def loss(p):
      out = net.pretraining.apply({'params': p}, ids, seg, mask, perm_mask=perm,
                                  target_mapping=mapping, bi_data=bi_data,
                                  content_output=content_output)
      weights = jnp.sin(jnp.arange(out['mlm_logits'].size)).reshape(out['mlm_logits'].shape)
      total = jnp.sum(out['mlm_logits'] * weights)
      if content_output:
        total += jnp.sum(jnp.cos(out['sequence_output']) * mask[..., None])
      return total, (out['mlm_logits'], out.get('sequence_output'))
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  jaxpr = jax.make_jaxpr(lambda p: ours.pretraining.apply(
      {'params': p}, ids, seg, mask, perm_mask=perm, target_mapping=mapping, bi_data=bi_data,
      content_output=content_output))(params)
  assert 'pallas_call' in str(jaxpr) and 'pallas_call' not in str(jax.make_jaxpr(
      lambda p: ref.pretraining.apply({'params': p}, ids, seg, mask, perm_mask=perm,
                                      target_mapping=mapping, bi_data=bi_data))(params))
  (_, (logits, states)), grads = run(ours)
  (_, (ref_logits, ref_states)), ref_grads = run(ref)
  np.testing.assert_allclose(logits, ref_logits, atol=2e-5, rtol=1e-5)
  if content_output:
    np.testing.assert_allclose(states, ref_states, atol=2e-5, rtol=1e-5)
  for (path, g), r in zip(jax.tree.leaves_with_path(grads), jax.tree.leaves(ref_grads)):
    scale = np.abs(np.asarray(r)).max()
    np.testing.assert_allclose(g, r, atol=2e-5 * max(scale, 1.0), rtol=1e-5,
                               err_msg=jax.tree_util.keystr(path))


def test_the_kernel_path_with_slots_at_one_position():
  """Fill-mask's targets (every listed position hidden from every query), a position listed
  twice: both slots read the same row, as the XLA path computes them alike."""
  ids, seg, mask, _, _ = _permuted_inputs()
  positions = np.array([[1, 4, 4], [0, 2, 7], [3, 3, 3], [5, 6, 0]], np.int32)
  ours, ref = _net(attention_implementation='splash'), _net(attention_implementation='xla')
  params = _params(ref)
  logits = lambda net: jax.jit(net.pretraining.apply)({'params': params}, ids, seg, mask,
                                                      positions)['mlm_logits']
  np.testing.assert_allclose(logits(ours), logits(ref), atol=2e-5, rtol=1e-5)


def test_which_passes_run_the_kernel(monkeypatch):
  """'splash': the kernel; memory and attention dropout in training: XLA's attention and
  one log line naming the key; 'xla': XLA's, no line."""
  from encoder_jax.models import attention  # pylint: disable=g-import-not-at-top
  lines = []
  monkeypatch.setattr(attention, '_warned', set())
  monkeypatch.setattr(attention.logging, 'warning', lambda fmt, *a: lines.append(fmt % a))
  ids, seg, mask, perm, mapping = _permuted_inputs()
  runs = lambda net, **kw: 'pallas_call' in str(jax.make_jaxpr(
      lambda p: net.pretraining.apply({'params': p}, ids, seg, mask, perm_mask=perm,
                                      target_mapping=mapping, **kw))(_params(net)))
  assert runs(_net(attention_implementation='splash'))
  assert not runs(_net(attention_implementation='xla')) and lines == []
  mems = jnp.zeros((4, TINY['num_layers'], 4, TINY['hidden_size']))
  assert not runs(_net(attention_implementation='splash', mem_len=4), mems=mems)
  assert not runs(_net(attention_implementation='splash', attention_dropout_rate=0.1),
                  deterministic=False, rngs={'dropout': jax.random.key(0)})
  assert len(lines) == 2, lines
  assert 'mem_len=4' in lines[0] and 'attention_dropout_rate=0.1' in lines[1], lines


@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                    reason="libtpu (pip install 'encoder_jax[tpu]') is not installed")
def test_the_tpu_compiler_lowers_both_streams_kernels():
  """One v5e chip, bfloat16, 200 tokens (padded to 256), the backward half of the batch, two
  layers: both streams' forward and backward kernels in the first, the query stream's in
  the last (its content stream is skipped) are the step's six Mosaic calls, and the step has
  no [B, heads, L, L] float32 array."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  devices = topologies.get_topology_desc(topology_name='v5e:2x2', platform='tpu').devices
  mesh = jax.sharding.Mesh(np.asarray(devices[:1]), ('data',))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  net = _net(hidden_size=128, num_heads=2, num_layers=2, max_position_embeddings=256,
             dtype='bfloat16', attention_implementation=None)
  b, l, p = 2, 200, 16
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)
  ids, seg, mask = (spec((b, l), jnp.int32) for _ in range(3))
  perm, mapping = spec((b, l, l), jnp.bool_), spec((b, p, l), jnp.float32)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    params = jax.tree.map(lambda a: spec(a.shape, a.dtype),
                          nn.unbox(jax.eval_shape(net.init, jax.random.key(0))))
    loss = lambda w, *a: jnp.sum(net.pretraining.apply(
        {'params': w}, *a[:3], perm_mask=a[3], target_mapping=a[4], bi_data=True,
        content_output=False)['mlm_logits'])
    compiled = jax.jit(jax.grad(loss)).lower(params, ids, seg, mask, perm, mapping).compile()
  text = compiled.as_text()
  assert text.count('custom_call_target="tpu_custom_call"') == 6
  assert not re.search(r'f32\[2,2,(200|256),(200|256)\]', text)
