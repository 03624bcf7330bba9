"""The shared block options (``models.config.BLOCK_OPTIONS``): pre-LN, GLU feed-forward,
bias-free dense layers and LayerNorms, against the formulas written out by hand; the
final LayerNorm; the last-layer-at-rows path under pre-LN; and the refusals where a kind
or a Hugging Face architecture does not implement an option."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.interop import hf
from encoder_jax.models import attention
from encoder_jax.models import bert
from encoder_jax.models import config as config_lib
from encoder_jax.models import registry
from encoder_jax.models import trunk

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

TINY = dict(vocab_size=97, hidden_size=24, num_layers=2, num_heads=3, intermediate_size=40,
            max_position_embeddings=32, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
# BERT's block, each option alone, and all together (pre-LN, GLU, no biases).
COMBOS = [dict(zip(('pre_norm', 'gated_ffn', 'dense_bias', 'norm_bias'), v))
          for v in ((False, False, True, True), (True, False, True, True),
                    (False, True, False, True), (False, False, True, False),
                    (True, True, False, False))]


def _ln(x, p, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p['scale'] + p.get('bias', 0.0)


def _dense(x, p, n_in=1):
  y = np.tensordot(x, p['kernel'], axes=n_in)
  return y + p['bias'] if 'bias' in p else y


def _gelu(x):
  return np.asarray(config_lib.gelu(jnp.asarray(x)))


def _reference_layer(x, p, c, mask):
  """One encoder layer from its parameters, in NumPy, as the papers write it."""
  h, d = c.num_heads, c.head_dim
  eps = c.layer_norm_eps

  def attend(y):
    q, k, v = (_dense(y, p[n]) for n in ('query', 'key', 'value'))  # [B, L, H, D]
    s = np.einsum('blhd,bmhd->bhlm', q, k) / np.sqrt(d)
    s = np.where(mask[:, None, None, :] > 0, s, -1e30)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return _dense(np.einsum('bhlm,bmhd->blhd', w, v), p['attention_output'], n_in=2)

  def ffn(y):
    if c.gated_ffn:  # Kernel [E, 2, F]: value (activated) and gate.
      vg = _dense(y, p['intermediate'])
      f = _gelu(vg[..., 0, :]) * vg[..., 1, :]
    else:
      f = _gelu(_dense(y, p['intermediate']))
    return _dense(f, p['output'])

  if c.pre_norm:
    x = x + attend(_ln(x, p['attention_layer_norm'], eps))
    return x + ffn(_ln(x, p['output_layer_norm'], eps))
  x = _ln(x + attend(x), p['attention_layer_norm'], eps)
  return _ln(x + ffn(x), p['output_layer_norm'], eps)


@pytest.mark.parametrize('options', COMBOS, ids=lambda o: ','.join(f'{k}={v}' for k, v in o.items()))
def test_layer_equals_the_written_out_formula(options):
  c = bert.BertConfig(**TINY, **options)
  rng = np.random.RandomState(0)
  x = rng.randn(2, 7, c.hidden_size).astype(np.float32)
  mask = np.array([[1] * 7, [1] * 5 + [0] * 2], np.int32)
  layer = trunk.Layer(c, deterministic=True)
  mask_4d = jnp.asarray(mask, bool)[:, None, None, :]
  params = nn.unbox(layer.init(jax.random.key(1), x, mask_4d, {})['params'])
  # Random, nonzero biases and scales (zeros and ones would hide a misplaced one).
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  params = jax.tree.unflatten(tree, [l + 0.1 * jax.random.normal(k, l.shape)
                                     for l, k in zip(leaves, keys)])
  names = {n for n, p in params.items() for leaf in p if leaf == 'bias'}
  if not options['dense_bias']:
    assert not names & {'query', 'key', 'value', 'attention_output', 'intermediate', 'output'}
  if not options['norm_bias']:
    assert 'bias' not in params['attention_layer_norm']
  assert params['intermediate']['kernel'].shape == (
      (24, 2, 40) if options['gated_ffn'] else (24, 40))
  got, _ = layer.apply({'params': params}, x, mask_4d, {})
  np_params = jax.tree.map(np.asarray, params)
  want = _reference_layer(x.astype(np.float64), np_params, c, mask)
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=1e-4)


def _pretraining(options):
  c = bert.BertConfig(**TINY, **options)
  model = bert.BertForPreTraining(c)
  params = nn.unbox(model.init(jax.random.key(0), **bert.init_inputs())['params'])
  params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(3), p.shape),
                        params)
  rng = np.random.RandomState(5)
  ids = rng.randint(5, c.vocab_size, (2, 12)).astype(np.int32)
  mask = np.array([[1] * 12, [1] * 9 + [0] * 3], np.int32)
  return c, model, params, ids, np.zeros_like(ids), mask


def test_rotary_has_no_position_table():
  _, _, params, _, _, _ = _pretraining(dict(rotary=True))
  assert 'position_embeddings' not in params['embeddings']


def test_pre_norm_ends_with_a_final_layer_norm():
  c, model, params, ids, seg, mask = _pretraining(dict(pre_norm=True, norm_bias=False))
  assert set(params['encoder']['final_layer_norm']) == {'scale'}
  out = model.apply({'params': params}, ids, seg, mask, collect_hidden=True)
  last = np.asarray(out['all_hidden_states'][-1], np.float64)  # The residual stream.
  want = _ln(last, jax.tree.map(np.asarray, params['encoder']['final_layer_norm']),
             c.layer_norm_eps)
  np.testing.assert_allclose(np.asarray(out['sequence_output']), want, atol=2e-5)


@pytest.mark.parametrize('options', [dict(pre_norm=True), dict(rotary=True),
                                     dict(pre_norm=True, gated_ffn=True, dense_bias=False,
                                          norm_bias=False, rotary=True)])
def test_last_layer_at_the_rows_equals_the_full_pass(options):
  """The last layer at the masked rows reads its keys and values from every row's
  (normalised) state and turns its queries by their own positions: the logits there equal
  the full pass's."""
  _, model, params, ids, seg, mask = _pretraining(options)
  positions = np.array([[1, 4, 7], [0, 2, 8]], np.int32)
  rows = model.apply({'params': params}, ids, seg, mask, positions)
  assert 'sequence_output' not in rows  # The rows path ran.
  full = model.apply({'params': params}, ids, seg, mask)
  want = np.take_along_axis(np.asarray(full['mlm_logits']), positions[..., None], axis=1)
  np.testing.assert_allclose(np.asarray(rows['mlm_logits']), want, atol=1e-5)
  np.testing.assert_allclose(rows['pair_logits'], full['pair_logits'], atol=1e-5)


def test_rotary_positions_equal_hugging_face_and_depend_on_distance_only():
  torch = pytest.importorskip('torch')
  from transformers.models.modernbert import modeling_modernbert  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  q, k = rng.randn(2, 2, 9, 3, 8).astype(np.float32)  # [B, L, H, D] each.
  positions = np.broadcast_to(np.arange(9), (2, 9))
  ours = [np.asarray(attention.rotate(jnp.asarray(x), positions, 160.0)) for x in (q, k)]
  # Hugging Face: cos/sin of the angles repeated over both halves, rotate_half, [B, L, H, D].
  inv = 1.0 / 160.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)
  angles = torch.arange(9, dtype=torch.float32)[:, None] * inv
  emb = torch.cat([angles, angles], -1)[None].expand(2, 9, 8)
  hf_q, hf_k = modeling_modernbert.apply_rotary_pos_emb(
      torch.from_numpy(q), torch.from_numpy(k), emb.cos(), emb.sin(), unsqueeze_dim=2)
  np.testing.assert_allclose(ours[0], hf_q.numpy(), atol=1e-5)
  np.testing.assert_allclose(ours[1], hf_k.numpy(), atol=1e-5)
  # A query and a key turned by positions m and n score as at m + t and n + t.
  one_q, one_k = jnp.asarray(q[:1, :1]), jnp.asarray(k[:1, :1])
  score = lambda m, n: float(jnp.sum(attention.rotate(one_q, jnp.array([[m]]), 160.0)
                                     * attention.rotate(one_k, jnp.array([[n]]), 160.0)))
  assert score(2, 7) == pytest.approx(score(12, 17), abs=1e-4)
  assert abs(score(2, 7) - score(2, 3)) > 1e-3


@pytest.mark.parametrize('kind,extra,option', [
    ('xlnet', dict(type_vocab_size=3), dict(rotary=True)),
    ('xlnet', dict(type_vocab_size=3), dict(pre_norm=True)),
    ('xlnet', dict(type_vocab_size=3), dict(gated_ffn=True)),
    ('deberta_v2', dict(attention_kind='disentangled'), dict(dense_bias=False)),
    ('deberta_v2', dict(attention_kind='disentangled'), dict(pre_norm=True)),
    ('deberta_v2', dict(attention_kind='disentangled'), dict(local_attention=8)),
])
def test_a_kind_refuses_an_option_it_does_not_implement(kind, extra, option):
  (name, value), = option.items()
  with pytest.raises(ValueError, match=f'config.model.{name}={value}.*{kind}.*does not '
                                       'implement'):
    registry.network(dict(kind=kind, **extra, **option))


def test_every_kind_implements_declared_options_only():
  names = set(config_lib.BLOCK_OPTION_NAMES)
  for kind in registry.KINDS.values():
    assert set(kind.block_options) <= names, kind.name
  assert registry.get('deberta').block_options == ('gated_ffn',)  # Its own attention.
  registry.network(dict(kind='deberta_v2', attention_kind='disentangled', gated_ffn=True))


def test_hugging_face_export_refuses_what_bert_cannot_represent():
  c = registry.make_config(dict(TINY, pre_norm=True))
  with pytest.raises(ValueError, match='pre_norm=True has no Hugging Face BertForPreTraining'):
    hf.hf_config_from(c)
  hf.hf_config_from(registry.make_config(TINY))  # The defaults export.


def test_a_kind_refuses_values_other_than_those_it_is_defined_by():
  """``ModelKind.requires`` (ModernBERT: pre-LN, GeGLU, rotary, fused QKV, no first
  attention norm, no segments) is checked for every config, naming each key."""
  with pytest.raises(ValueError, match=r"kind='modernbert' is defined by pre_norm=True, "
                                       r'gated_ffn=True.*; got pre_norm=False'):
    registry.network(dict(TINY, kind='modernbert'))
  c = registry.make_config(dict(TINY, kind='modernbert', pre_norm=True, gated_ffn=True,
                                rotary=True, fused_qkv=True, first_attention_norm=False,
                                type_vocab_size=0))
  assert c.kind == 'modernbert' and not c.has_local_layers
  with pytest.raises(ValueError, match='first_attention_norm=False needs pre_norm=True'):
    registry.make_config(dict(TINY, first_attention_norm=False))
