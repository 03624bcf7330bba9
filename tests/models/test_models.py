"""Every model kind: parameter counts equal to Hugging Face's at full size, ALBERT's
cross-layer sharing, logical axes and padding invariance (tiny shapes)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from encoder_jax.core import sharding
from encoder_jax.models import registry
from encoder_jax.models import trunk

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

# ------------------------------------------------------------ full-size parameter counts

# Our config of each kind's base model, and the HF config of the published checkpoint it
# corresponds to (bert-base-uncased, roberta-base, albert-base-v2).
FULL_SIZE = {
    'bert': (dict(kind='bert'),
             transformers.BertForPreTraining, transformers.BertConfig()),
    'roberta': (dict(kind='roberta', vocab_size=50265, max_position_embeddings=514,
                     type_vocab_size=1, position_offset=2, layer_norm_eps=1e-5),
                transformers.RobertaForMaskedLM,
                transformers.RobertaConfig(vocab_size=50265, max_position_embeddings=514,
                                           type_vocab_size=1, layer_norm_eps=1e-5,
                                           pad_token_id=1)),
    'albert': (dict(kind='albert', vocab_size=30000, embedding_size=128, share_layers='all',
                    activation='gelu_new', hidden_dropout_rate=0.0, attention_dropout_rate=0.0),
               transformers.AlbertForPreTraining,
               transformers.AlbertConfig(vocab_size=30000, embedding_size=128, hidden_size=768,
                                         num_hidden_layers=12, num_attention_heads=12,
                                         intermediate_size=3072, hidden_act='gelu_new',
                                         num_hidden_groups=1, inner_group_num=1)),
}
# Pinned: a change in either library's count (or ours) must be looked at, not followed.
EXPECTED_COUNTS = {'bert': 110_106_428, 'roberta': 124_697_433, 'albert': 11_813_810}


def _count(model_config) -> int:
  net = registry.network(model_config)
  shapes = jax.eval_shape(net.init, jax.random.key(0))
  return sum(x.size for x in jax.tree.leaves(nn.unbox(shapes)))


def _hf_count(cls, config) -> int:
  """HF's count, built on the meta device (no memory, no init time); tied tensors (the
  MLM decoder is the word embedding) are one parameter and counted once."""
  with torch.device('meta'):
    model = cls(config)
  return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize('kind', sorted(FULL_SIZE))
def test_parameter_count_equals_hugging_face(kind):
  ours, cls, hf_config = FULL_SIZE[kind]
  assert _count(ours) == _hf_count(cls, hf_config) == EXPECTED_COUNTS[kind]


# --------------------------------------------------------------------------- tiny shapes

TINY = dict(vocab_size=97, hidden_size=24, num_layers=3, num_heads=3, intermediate_size=40,
            max_position_embeddings=32)
VARIANTS = {
    'bert': dict(kind='bert'),
    'roberta': dict(kind='roberta', type_vocab_size=1, position_offset=2, layer_norm_eps=1e-5,
                    max_position_embeddings=34),
    'albert': dict(kind='albert', embedding_size=10, share_layers='all', activation='gelu_new'),
    'albert_share_attention': dict(kind='albert', embedding_size=10, share_layers='attention',
                                   activation='gelu_new'),
    'albert_share_ffn': dict(kind='albert', embedding_size=10, share_layers='ffn',
                             activation='gelu_new'),
    # Layers 0 global, 1 and 2 local (a 4-token window: 2 either side), so the last layer
    # at the read rows is a local one; rotary with two bases, the first layer's norm skipped.
    'modernbert': dict(kind='modernbert', pre_norm=True, gated_ffn=True, rotary=True,
                       fused_qkv=True, first_attention_norm=False, type_vocab_size=0,
                       dense_bias=False, norm_bias=False, local_attention=4,
                       global_attn_every_n_layers=3, rope_theta=1000.0, local_rope_theta=50.0),
}
ATTENTION_PARAMS = ('query', 'key', 'value', 'attention_output', 'attention_layer_norm')
FFN_PARAMS = ('intermediate', 'output', 'output_layer_norm')


def _network(variant, **overrides):
  return registry.network({**TINY, **VARIANTS[variant], **overrides})


def _params(net, seed=0):
  return nn.unbox(jax.jit(net.init)(jax.random.key(seed)))  # Jitted: eager init is slow.


def _shapes(net):
  return jax.tree.map(np.shape, nn.unbox(jax.eval_shape(net.init, jax.random.key(0))))


def _apply(net, params, *inputs, **options):
  """The pretraining network's outputs, compiled whole (eager dispatch op by op is slow on
  2 cores); flags given by keyword are static."""
  static = tuple(k for k, v in options.items() if isinstance(v, (bool, str)))
  return jax.jit(net.pretraining.apply, static_argnames=static)({'params': params}, *inputs,
                                                                **options)


def _inputs(rng, b, l, lengths, vocab):
  ids = rng.randint(5, vocab, (b, l)).astype(np.int32)
  mask = (np.arange(l)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  seg = (np.arange(l)[None] >= np.asarray(lengths)[:, None] // 2).astype(np.int32) * mask
  return ids, seg, mask


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_every_parameter_has_logical_axes_with_rules(variant):
  net = _network(variant)
  boxed = jax.eval_shape(net.init, jax.random.key(0))
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  rules = dict(sharding.LOGICAL_RULES)
  assert leaves
  for leaf in leaves:
    assert isinstance(leaf, nn.LogicallyPartitioned), type(leaf)
    assert len(leaf.names) == len(leaf.value.shape)
    assert all(n is None or n in rules for n in leaf.names), leaf.names
  encoder = boxed['encoder']
  share = net.config.share_layers
  if net.config.fused_qkv:  # One projection [embed, 3, heads, kv] (ModernBERT's Wqkv).
    assert encoder['layers']['qkv']['kernel'].names == ('layers', 'embed', None, 'heads', 'kv')
  elif share == 'none':  # Stacked by the scan: the 'layers' axis first.
    assert encoder['layers']['query']['kernel'].names == ('layers', 'embed', 'heads', 'kv')
  elif share == 'all':  # One layer, broadcast by the scan: no layer axis.
    assert encoder['layers']['query']['kernel'].names == ('embed', 'heads', 'kv')
  else:
    shared, own = ((ATTENTION_PARAMS, FFN_PARAMS) if share == 'attention'
                   else (FFN_PARAMS, ATTENTION_PARAMS))
    layer_names = [f'layer_{i}' for i in range(TINY['num_layers'])]
    assert sorted(encoder) == sorted(['shared', *layer_names])
    assert sorted(encoder['shared']) == sorted(shared)
    assert all(sorted(encoder[name]) == sorted(own) for name in layer_names)
  names = {n for leaf in leaves for n in leaf.names}
  assert ('layers' in names) == (share == 'none')


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_padding_never_changes_real_positions(variant):
  net = _network(variant)
  params = _params(net)
  rng = np.random.RandomState(0)
  ids, seg, mask = _inputs(rng, 3, 10, [10, 7, 4], TINY['vocab_size'])
  pos = np.array([[1, 2], [0, 3], [1, 2]], np.int32)
  short = _apply(net, params, ids, seg, mask, pos)
  # Append 6 padding positions holding arbitrary ids: nothing real may change.
  pad = rng.randint(0, TINY['vocab_size'], (3, 6)).astype(np.int32)
  long_ids = np.concatenate([ids * mask, pad], 1)
  long_ids[:, :10] = np.where(mask > 0, ids, pad[:, :1])  # Garbage in the old padding too.
  zeros = np.zeros((3, 6), np.int32)
  longer = _apply(net, params, long_ids, np.concatenate([seg, zeros], 1),
                  np.concatenate([mask, zeros], 1), pos)
  heads = [k for k in ('pooled_output', 'pair_logits', 'mlm_logits') if k in short]
  assert ('pair_logits' in heads) == net.kind.pair_head
  for k in heads:
    np.testing.assert_allclose(short[k], longer[k], atol=1e-5, err_msg=k)
  real = mask.astype(bool)
  full = lambda *a: _apply(net, params, *a, collect_hidden=True)['sequence_output']
  np.testing.assert_allclose(np.asarray(full(ids, seg, mask))[real],
                             np.asarray(full(long_ids, np.concatenate([seg, zeros], 1),
                                             np.concatenate([mask, zeros], 1)))[:, :10][real],
                             atol=1e-5)


# Every network whose last layer can run at the rows the losses read (its kind declares
# ``last_layer_rows``): scanned, shared and partly shared layers (the 'ffn' mode runs the
# same loop as 'attention'), with and without DeBERTa's EMD. (Training mode takes the same
# path: the family tests train every kind.)
ROW_NETWORKS = {
    **{v: VARIANTS[v] for v in VARIANTS if v != 'albert_share_ffn'},
    'deberta_emd': dict(kind='deberta', attention_kind='disentangled',
                        position_biased_input=False, emd_layers=2, max_relative_positions=6),
    'deberta_v2': dict(kind='deberta_v2', attention_kind='disentangled', position_buckets=4,
                       max_relative_positions=8, share_att_key=True, norm_rel_ebd=True),
    'electra_generator': dict(kind='electra_generator', embedding_size=10),
}


@pytest.mark.parametrize('variant', sorted(ROW_NETWORKS))
def test_last_layer_at_the_read_rows_equals_the_full_pass(variant):
  """With masked (and gathered) positions the last layer runs at those rows and [CLS]
  only: the heads, the gathered states and every parameter's gradient equal the full
  pass's (positions None: every row), with padding and repeated positions."""
  net = registry.network({**TINY, **ROW_NETWORKS[variant]})
  assert net.kind.last_layer_rows is not None
  params = _params(net)
  ids, seg, mask = _inputs(np.random.RandomState(2), 2, 16, [16, 11], TINY['vocab_size'])
  pos = np.array([[1, 2, 2], [0, 9, 4]], np.int32)
  gather = np.array([[0, 3, 15, 5], [10, 1, 1, 8]], np.int32)

  def outputs(p, sparse):
    out = _apply(net, p, ids, seg, mask, pos if sparse else None, gather_positions_BxG=gather)
    if not sparse:
      out['mlm_logits'] = np.take_along_axis(out['mlm_logits'], pos[..., None], 1)
    assert ('sequence_output' in out) == (not sparse)
    return {k: out[k] for k in ('mlm_logits', 'pair_logits', 'gathered_output') if k in out}

  def loss(p, sparse):
    return sum(jnp.sum(jnp.sin(v)) for v in outputs(p, sparse).values())

  run = jax.jit(lambda p, sparse: (outputs(p, sparse), jax.grad(loss)(p, sparse)),
                static_argnums=1)  # Jitted: eager dispatch is slow on 2 cores.
  (rows, g_rows), (full, g_full) = run(params, True), run(params, False)
  assert sorted(rows) == sorted(full) and 'gathered_output' in rows
  for k in rows:
    np.testing.assert_allclose(rows[k], full[k], atol=2e-5, err_msg=k)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_rows), jax.tree.leaves(g_full)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-5, err_msg=jax.tree_util.keystr(path))


def test_roberta_has_no_segment_signal_and_numbers_positions_after_the_pad_id():
  net = _network('roberta')
  params = _params(net)
  ids, seg, mask = _inputs(np.random.RandomState(1), 2, 8, [8, 5], TINY['vocab_size'])
  run = lambda s: _apply(net, params, ids, s, mask)['mlm_logits']
  np.testing.assert_array_equal(run(seg), run(np.zeros_like(seg)))  # Pair ids are ignored.
  np.testing.assert_array_equal(
      trunk.position_ids(net.config, mask),
      [[2, 3, 4, 5, 6, 7, 8, 9], [2, 3, 4, 5, 6, 1, 1, 1]])  # Padding: the pad id's row.
  # The table holds max_position_embeddings - 2 = 32 tokens, not one more.
  with pytest.raises(ValueError, match='33 exceeds the 32 positions.*position_offset=2'):
    trunk.position_ids(net.config, np.ones((1, 33), np.int32))


def test_albert_shares_one_layer_across_all_layers():
  """share_layers='all': no layer axis, the same parameters at any depth, and the encoder
  is one layer's function applied num_layers times."""
  net = _network('albert')
  params = _params(net)
  # The parameter tree does not depend on the depth.
  one = _network('albert', num_layers=1)
  assert _shapes(one) == _shapes(net)
  assert _count(net.config) == _count(one.config)
  assert params['encoder']['layers']['query']['kernel'].shape == (24, 3, 8)

  ids, seg, mask = _inputs(np.random.RandomState(2), 2, 9, [9, 6], TINY['vocab_size'])
  out = _apply(net, params, ids, seg, mask, collect_hidden=True)
  hidden = out['all_hidden_states']
  assert len(hidden) == TINY['num_layers'] + 1
  x = hidden[0]  # The embedding output, already projected E -> hidden.
  assert x.shape[-1] == TINY['hidden_size']
  layer = trunk.Encoder(one.config)
  for i in range(TINY['num_layers']):
    x, _ = layer.apply({'params': params['encoder']}, x, mask, True)
    np.testing.assert_allclose(x, hidden[i + 1], atol=1e-5, err_msg=f'layer {i}')
  # And it is BERT's unshared stack with the one layer copied into every slot.
  unshared = _network('albert', share_layers='none')
  tiled = dict(params, encoder={'layers': jax.tree.map(
      lambda p: np.stack([p] * TINY['num_layers']), params['encoder']['layers'])})
  assert jax.tree.map(np.shape, tiled) == _shapes(unshared)
  ref = _apply(unshared, tiled, ids, seg, mask)
  for k in ('sequence_output', 'pair_logits', 'mlm_logits'):
    np.testing.assert_allclose(out[k], ref[k], atol=1e-5, err_msg=k)


@pytest.mark.parametrize('share', ['attention', 'ffn'])
def test_albert_partial_sharing_builds_runs_and_trains(share):
  """'attention' / 'ffn' share that block only; with every layer's own block equal to the
  fully shared layer's, the network is the fully shared one."""
  net = _network(f'albert_share_{share}')
  params = _params(net)
  shared, own = ((ATTENTION_PARAMS, FFN_PARAMS) if share == 'attention'
                 else (FFN_PARAMS, ATTENTION_PARAMS))
  # Count: the unshared stack minus (num_layers - 1) copies of the shared block.
  full = _network('albert', share_layers='none')
  block = sum(np.size(x) for k in shared for x in jax.tree.leaves(params['encoder']['shared'][k]))
  assert _count(net.config) == _count(full.config) - (TINY['num_layers'] - 1) * block

  ids, seg, mask = _inputs(np.random.RandomState(3), 2, 8, [8, 5], TINY['vocab_size'])
  all_shared = _network('albert')
  one_layer = _params(all_shared, seed=1)
  layer = one_layer['encoder']['layers']
  rebuilt = dict(one_layer, encoder={
      'shared': {k: layer[k] for k in shared},
      **{f'layer_{i}': {k: layer[k] for k in own} for i in range(TINY['num_layers'])}})
  assert jax.tree.map(np.shape, rebuilt) == _shapes(net)
  out = _apply(net, rebuilt, ids, seg, mask, collect_hidden=True)
  ref = _apply(all_shared, one_layer, ids, seg, mask, collect_hidden=True)
  for a, b in zip(out['all_hidden_states'], ref['all_hidden_states']):
    np.testing.assert_allclose(a, b, atol=1e-5)

  # Gradients reach the shared block and every layer's own block, in training mode.
  def loss(p):
    out = net.pretraining.apply({'params': p}, ids, seg, mask, deterministic=False,
                                rngs={'dropout': jax.random.key(0)})
    return out['mlm_logits'].sum() + out['pair_logits'].sum()

  grads = jax.jit(jax.grad(loss))(params)
  for name in ['shared'] + [f'layer_{i}' for i in range(TINY['num_layers'])]:
    g = jax.tree.leaves(grads['encoder'][name])
    assert all(np.isfinite(x).all() for x in g) and any(np.abs(x).sum() > 0 for x in g), name
