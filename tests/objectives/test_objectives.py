"""The objective registry over every model kind: setups build, compose on one pass, count FLOPs."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from encoder_jax.config import schema as config_base
from encoder_jax.core import length_phases
from encoder_jax import objectives
from encoder_jax.models import registry as models
from encoder_jax.models import trunk
from encoder_jax.objectives import masking

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

TINY = dict(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
            max_position_embeddings=20)
KIND_FIELDS = {
    'bert': {},
    'roberta': dict(kind='roberta', position_offset=2, type_vocab_size=1, layer_norm_eps=1e-5),
    'albert': dict(kind='albert', embedding_size=8, share_layers='all', activation='gelu_new'),
}
PAIR = {'bert': ('nsp', 'nsp'), 'albert': ('sop', 'sop'), 'roberta': (None, 'full_sentences')}


def _config(kind):
  c = config_base.base_config()
  c.model.update(**TINY, **KIND_FIELDS[kind])
  head, pair_kind = PAIR[kind]
  c.objective.names = ('mlm', head) if head else ('mlm',)
  c.data.pair_kind = pair_kind
  c.train.update(seq_lens=(12,), max_predictions=(3,), phase_fractions=(1.0,))
  return c


def _tables(v=50):
  special = np.zeros(v, bool)
  special[:5] = True
  return masking.VocabTables(special, np.ones(v, bool), np.ones(v), mask_id=4)


def _batch(b=4, l=12, v=50):
  rng = np.random.RandomState(0)
  ids = rng.randint(5, v, (b, l)).astype(np.int32)
  ids[:, 0] = 2
  mask = np.ones((b, l), np.int32)
  mask[1, 8:] = 0
  return dict(input_ids=ids * mask, segment_ids=np.zeros_like(ids), input_mask=mask,
              pair_labels=np.array([0, 1, 0, 1], np.int32))


def test_every_kind_has_a_test_config():
  assert set(KIND_FIELDS) <= set(models.KINDS)


@pytest.mark.parametrize('kind', sorted(KIND_FIELDS))
def test_setup_initialises_and_runs_the_network_once(kind):
  c = _config(kind)
  setup = objectives.build(c, _tables())
  params = nn.unbox(jax.jit(setup.init)(jax.random.key(0)))  # Jitted: eager is slow.
  phase = length_phases.phases(c.train)[0]
  calls = []

  def count(next_fun, args, kwargs, context):
    if context.method_name == '__call__' and isinstance(context.module, trunk.EncoderWithHeads):
      calls.append(type(context.module).__name__)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(count):  # Counted while tracing.
    loss, metrics = jax.jit(lambda p, b, k: setup.loss_fn(p, b, k, phase, True))(
        params, _batch(), jax.random.key(1))
  assert calls == ['EncoderWithHeads'], calls  # MLM + NSP/SOP share one encoder pass.
  assert np.isfinite(float(loss))
  assert float(metrics['mlm_predictions']) > 0
  assert ('pair_loss' in metrics) == (PAIR[kind][0] is not None)
  network, downstream = setup.downstream(params)
  assert network.config.kind == kind and downstream is params


def test_a_pair_objective_needs_a_kind_with_a_pair_head():
  c = _config('roberta')
  c.objective.names, c.data.pair_kind = ('mlm', 'nsp'), 'nsp'
  with pytest.raises(ValueError, match=r"kind='roberta' with .*: the kind has no pair head, "
                                       r"which 'nsp' needs; objectives that train 'roberta': "
                                       r"\['mlm', 'contrastive', 'sbo'\]"):
    objectives.build(c)


def test_unknown_kind_lists_the_valid_ones():
  c = _config('bert')
  c.model.kind = 'bart'
  with pytest.raises(ValueError, match="model.kind='bart'.*albert.*bert.*roberta"):
    objectives.build(c)


def test_flops_follow_the_documented_formula():
  """BERT-base at 128 tokens / 20 predictions: the encoder at every position but the last
  layer's query side (q and output projections, feed-forward, scores) at the 20 predicted
  positions and [CLS] only; the heads as used."""
  c = config_base.base_config()
  c.train.update(seq_lens=(128,), max_predictions=(20,), phase_fractions=(1.0,))
  setup = objectives.build(c)
  L, d, f, v, s, p = 12, 768, 3072, 30522, 128, 20
  expected = ((6 * L * (4 * d * d + 2 * d * f) + 12 * L * s * d) * s
              - (s - p - 1) * (6 * (2 * d * d + 2 * d * f) + 12 * s * d)
              + 6 * p * (d * d + d * v) + 6 * (d * d + 2 * d))
  assert setup.flops_per_sequence(length_phases.phases(c.train)[0]) == expected


def test_mlm_without_tables_describes_but_cannot_corrupt():
  c = _config('bert')
  setup = objectives.build(c)  # No tokenizer: loading a checkpoint needs only the shapes.
  params = nn.unbox(jax.jit(setup.init)(jax.random.key(0)))  # Jitted: eager is slow.
  with pytest.raises(ValueError, match='without vocabulary tables'):
    setup.loss_fn(params, _batch(), jax.random.key(1), length_phases.phases(c.train)[0], False)


def test_sbo_reads_boundaries_from_a_kind_without_last_layer_rows():
  """XLNet's network takes no gather positions (no ``last_layer_rows``): the composite
  reads SBO's span boundaries from its sequence output instead."""
  c = config_base.base_config()
  c.model.update(**TINY, kind='xlnet')
  c.objective.names = ('mlm', 'sbo')
  c.data.pair_kind = 'full_sentences'
  c.train.update(seq_lens=(12,), max_predictions=(3,), phase_fractions=(1.0,))
  setup = objectives.build(c, _tables())
  assert setup.network.kind.last_layer_rows is None
  params = nn.unbox(jax.jit(setup.init)(jax.random.key(0)))
  phase = length_phases.phases(c.train)[0]
  loss, metrics = jax.jit(lambda p, b, k: setup.loss_fn(p, b, k, phase, True))(
      params, _batch(), jax.random.key(1))
  assert np.isfinite(float(loss)) and float(metrics['sbo_predictions']) > 0


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_lm_head_and_cross_entropy_gradients_equal_autodiff(dtype):
  """``layers.tied_logits`` and ``base.cross_entropy`` write their gradients out: values and
  gradients (input, table, bias) equal autodiff's of the plain formulas, with ignored
  (weight 0) and repeated labels, a loss scaled by the caller (and the accuracy, which has
  no gradient, added), all weights zero, and the decoder under an arbitrary cotangent; in
  float32 and under a bfloat16 compute dtype (whose products read a bfloat16 cotangent)."""
  from encoder_jax.models import layers
  from encoder_jax.objectives import base
  jnp = jax.numpy
  dt = jnp.dtype(dtype)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 5, 8)), dt)
  table = jnp.asarray(rng.normal(size=(40, 8)), dt)
  bias = jnp.asarray(rng.normal(size=(40,)), jnp.float32)
  labels = rng.integers(0, 40, (3, 5))
  labels[0, :2] = 7
  labels = jnp.asarray(labels, jnp.int32)
  tol = 1e-5 if dtype == 'float32' else 2e-2

  def plain_logits(x, table, bias):
    return jnp.einsum('...d,vd->...v', x, table, preferred_element_type=jnp.float32) + bias

  def check(ours, ref, name):
    assert ours.dtype == ref.dtype, name
    np.testing.assert_allclose(np.float32(ours), np.float32(ref), rtol=tol, atol=tol,
                               err_msg=name)

  for weights in (jnp.asarray(rng.random((3, 5)) < 0.7, jnp.float32), jnp.zeros((3, 5))):
    def plain(x, table, bias):
      logp = jax.nn.log_softmax(plain_logits(x, table, bias), axis=-1)
      nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
      return 2.5 * (nll * weights).sum() / jnp.maximum(weights.sum(), 1.0)

    def written(x, table, bias):
      loss, accuracy = base.cross_entropy(layers.tied_logits(x, table, bias), labels, weights)
      return 2.5 * loss + accuracy - jax.lax.stop_gradient(accuracy)

    ours, ours_grads = jax.jit(jax.value_and_grad(written, argnums=(0, 1, 2)))(x, table, bias)
    ref, ref_grads = jax.jit(jax.value_and_grad(plain, argnums=(0, 1, 2)))(x, table, bias)
    check(ours, ref, 'loss')
    for name, a, b in zip(('x', 'table', 'bias'), ours_grads, ref_grads):
      check(a, b, name)
    moved = [float(np.abs(np.float32(g)).max()) > 1e-3 for g in ours_grads]
    assert all(moved) if float(weights.sum()) else not any(moved)

  # The decoder alone, under a cotangent that is not a softmax's.
  g = jnp.asarray(rng.normal(size=(3, 5, 40)), jnp.float32)
  ours = jax.vjp(layers.tied_logits, x, table, bias)[1](g)
  ref = jax.vjp(plain_logits, x, table, bias)[1](g)
  for name, a, b in zip(('x', 'table', 'bias'), ours, ref):
    check(a, b, name + ' (decoder alone)')
