"""BERT model: golden parameter counts, logical axes, padding invariance, attention paths."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.core import sharding
from encoder_jax.models import attention
from encoder_jax.models import bert

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

TINY = dict(vocab_size=97, hidden_size=24, num_layers=2, num_heads=3, intermediate_size=40,
            max_position_embeddings=32)


def _count(cfg):
  shapes = jax.eval_shape(lambda: bert.BertForPreTraining(cfg).init(
      jax.random.key(0), **bert.init_inputs()))
  return sum(x.size for x in jax.tree.leaves(shapes['params']))


@pytest.mark.parametrize('kwargs,expected', [
    (dict(), 110_106_428),  # Hugging Face BertForPreTraining, bert-base-uncased.
    (dict(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096), 336_226_108),
])
def test_parameter_counts_equal_the_papers_models(kwargs, expected):
  assert _count(bert.BertConfig(**kwargs)) == expected


def _init(cfg, seed=0):
  return bert.BertForPreTraining(cfg).init(jax.random.key(seed), **bert.init_inputs())['params']


def test_every_parameter_has_logical_axes_with_rules():
  boxed = _init(bert.BertConfig(**TINY))
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  rules = dict(sharding.LOGICAL_RULES)
  assert leaves
  for leaf in leaves:
    assert isinstance(leaf, nn.LogicallyPartitioned), type(leaf)
    assert len(leaf.names) == leaf.value.ndim
    assert all(n is None or n in rules for n in leaf.names), leaf.names
  # The stacked layer parameters carry the 'layers' axis first.
  q = boxed['encoder']['layers']['query']['kernel']
  assert q.names == ('layers', 'embed', 'heads', 'kv')


def _inputs(rng, b, l, lengths, vocab):
  ids = rng.randint(5, vocab, (b, l)).astype(np.int32)
  mask = (np.arange(l)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  seg = (np.arange(l)[None] >= np.asarray(lengths)[:, None] // 2).astype(np.int32) * mask
  return ids, seg, mask


def test_padding_never_changes_real_positions():
  cfg = bert.BertConfig(**TINY)
  model = bert.BertForPreTraining(cfg)
  params = nn.unbox(_init(cfg))
  rng = np.random.RandomState(0)
  ids, seg, mask = _inputs(rng, 3, 10, [10, 7, 4], cfg.vocab_size)
  pos = np.array([[1, 2], [0, 3], [1, 2]], np.int32)
  short = model.apply({'params': params}, ids, seg, mask, pos)
  # Append 6 padding positions holding arbitrary ids: nothing real may change.
  pad = rng.randint(0, cfg.vocab_size, (3, 6)).astype(np.int32)
  long_ids = np.concatenate([ids * mask, pad], 1)
  long_ids[:, :10] = np.where(mask > 0, ids, pad[:, :1])  # Garbage in the old padding too.
  zeros = np.zeros((3, 6), np.int32)
  longer = model.apply({'params': params}, long_ids, np.concatenate([seg, zeros], 1),
                       np.concatenate([mask, zeros], 1), pos)
  for k in ('pooled_output', 'pair_logits', 'mlm_logits'):
    np.testing.assert_allclose(short[k], longer[k], atol=1e-5, err_msg=k)
  real = mask.astype(bool)
  full = lambda *a: model.apply({'params': params}, *a, collect_hidden=True)['sequence_output']
  np.testing.assert_allclose(np.asarray(full(ids, seg, mask))[real],
                             np.asarray(full(long_ids, np.concatenate([seg, zeros], 1),
                                             np.concatenate([mask, zeros], 1)))[:, :10][real],
                             atol=1e-5)


def test_fused_and_explicit_attention_agree():
  rng = jax.random.split(jax.random.key(1), 3)
  q, k, v = (jax.random.normal(r, (2, 6, 3, 8)) for r in rng)
  mask = jnp.array([[1] * 6, [1] * 4 + [0] * 2], bool)[:, None, None, :]
  fused = attention.dot_product(q, k, v, mask, dropout_rate=0.0, dropout_rng=None)
  explicit = attention.explicit_dot_product(q, k, v, mask, dropout_rate=0.0, dropout_rng=None)
  np.testing.assert_allclose(fused, explicit, atol=1e-5)


def test_unknown_attention_kind_lists_the_valid_ones():
  with pytest.raises(ValueError, match="attention_kind='flash9'.*dot_product"):
    bert.BertConfig(**TINY, attention_kind='flash9')


def test_dropout_is_active_only_in_training():
  cfg = bert.BertConfig(**TINY)
  model = bert.BertForPreTraining(cfg)
  params = nn.unbox(_init(cfg))
  ids, seg, mask = _inputs(np.random.RandomState(0), 2, 8, [8, 5], cfg.vocab_size)
  run = lambda det, key: model.apply({'params': params}, ids, seg, mask, deterministic=det,
                                     rngs={'dropout': jax.random.key(key)})['sequence_output']
  np.testing.assert_array_equal(run(True, 0), run(True, 1))
  assert not np.allclose(run(False, 0), run(False, 1))


def test_remat_and_jit_do_not_change_gradients():
  cfg = bert.BertConfig(**TINY)
  params = nn.unbox(_init(cfg))
  ids, seg, mask = _inputs(np.random.RandomState(2), 2, 8, [8, 6], cfg.vocab_size)

  def loss(p, c):
    return bert.BertForPreTraining(c).apply({'params': p}, ids, seg, mask)['mlm_logits'].sum()

  plain = jax.grad(loss)(params, cfg)
  remat = jax.jit(jax.grad(loss), static_argnums=1)(params, bert.BertConfig(**TINY, remat=True))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), plain, remat)
  # With masked positions (the last layer at those rows and [CLS]) under remat, too.
  pos = np.array([[1, 3], [0, 5]], np.int32)

  def at_positions(p, c):
    out = bert.BertForPreTraining(c).apply({'params': p}, ids, seg, mask, pos)
    assert 'sequence_output' not in out  # The rows path.
    return out['mlm_logits'].sum()

  def full_at_positions(p):
    logits = bert.BertForPreTraining(cfg).apply({'params': p}, ids, seg, mask)['mlm_logits']
    return np.take_along_axis(logits, pos[..., None], 1).sum()

  rows = jax.jit(jax.grad(at_positions), static_argnums=1)(params,
                                                           bert.BertConfig(**TINY, remat=True))
  full = jax.jit(jax.grad(full_at_positions))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), full, rows)


def test_bfloat16_activations_keep_float32_params():
  cfg = bert.BertConfig(**TINY, dtype='bfloat16')
  model = bert.BertForPreTraining(cfg)
  params = nn.unbox(_init(cfg))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  ids, seg, mask = _inputs(np.random.RandomState(3), 2, 8, [8, 6], cfg.vocab_size)
  out = model.apply({'params': params}, ids, seg, mask)
  assert out['sequence_output'].dtype == jnp.bfloat16
  assert out['mlm_logits'].dtype == jnp.float32
  ref = bert.BertForPreTraining(bert.BertConfig(**TINY)).apply({'params': params}, ids, seg, mask)
  np.testing.assert_allclose(out['mlm_logits'], ref['mlm_logits'], atol=0.1)


def test_all_hidden_states_are_returned_on_request():
  cfg = bert.BertConfig(**TINY)
  params = nn.unbox(_init(cfg))
  ids, seg, mask = _inputs(np.random.RandomState(4), 2, 8, [8, 6], cfg.vocab_size)
  out = bert.BertForPreTraining(cfg).apply({'params': params}, ids, seg, mask, collect_hidden=True)
  assert len(out['all_hidden_states']) == cfg.num_layers + 1
  np.testing.assert_array_equal(out['all_hidden_states'][-1], out['sequence_output'])


def test_a_kind_imported_alone_builds_its_config():
  """``from encoder_jax.models import bert`` and nothing else (a notebook): its config reads
  its fields from the model registry, which the package imports."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = 'from encoder_jax.models import bert; print(bert.BertConfig(hidden_size=24).hidden_size)'
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        check=False, timeout=120)
  assert proc.returncode == 0 and proc.stdout.split() == ['24'], proc.stderr[-3000:]
