"""Attention implementation choice (``config.model.attention_implementation``): padding as
key lengths (cuDNN's form) equals the boolean mask, the cuDNN path is what a GPU host
selects, and a cuDNN request that cannot run is an error naming the key. Dropout (shared
by every attention kind and layer) keeps 1 - rate of the elements, scaled.

No GPU runs here: the GPU host is simulated by replacing ``attention._backend`` and
``jax.nn.dot_product_attention`` (the recorder checks what would reach cuDNN, then
computes with XLA).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax import config_base
from encoder_jax import validation
from encoder_jax.models import attention
from encoder_jax.models import attention_kinds
from encoder_jax.models import config as config_lib
from encoder_jax.models import layers

TINY = dict(vocab_size=97, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=40,
            max_position_embeddings=32)
LENGTHS = (16, 9, 1)


def _qkv(dtype=jnp.float32, length=16):
  rng = jax.random.split(jax.random.key(0), 3)
  return [jax.random.normal(r, (len(LENGTHS), length, 2, 8)).astype(dtype) for r in rng]


def _right_padded_mask(length=16):
  return (np.arange(length)[None] < np.array(LENGTHS)[:, None])[:, None, None, :]


def test_key_lengths_count_the_real_tokens():
  np.testing.assert_array_equal(attention.key_lengths(_right_padded_mask()), LENGTHS)
  assert attention.key_lengths(_right_padded_mask()).dtype == jnp.int32


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_lengths_path_equals_mask_path(dtype):
  """Every position, padded queries included (only keys are cut by the lengths)."""
  q, k, v = _qkv(dtype)
  mask = _right_padded_mask()
  by_lengths = attention.fused(q, k, v, mask, implementation='xla', padding_as_lengths=True)
  by_mask = attention.fused(q, k, v, mask, implementation='xla', padding_as_lengths=False)
  np.testing.assert_allclose(np.asarray(by_lengths, np.float32),
                             np.asarray(by_mask, np.float32), atol=1e-6)
  explicit = attention.explicit_dot_product(q, k, v, mask, dropout_rate=0.0, dropout_rng=None)
  np.testing.assert_allclose(np.asarray(by_lengths, np.float32),
                             np.asarray(explicit, np.float32),
                             atol=1e-5 if dtype == jnp.float32 else 3e-2)


def test_resolution_per_backend_and_dtype(monkeypatch):
  resolve = attention.resolve_implementation
  assert resolve(None, jnp.bfloat16) == 'xla'  # This host: CPU.
  assert resolve('xla', jnp.bfloat16) == 'xla'
  monkeypatch.setattr(attention, '_backend', lambda: 'gpu')
  assert resolve(None, jnp.bfloat16) == 'cudnn'
  assert resolve(None, jnp.float32) == 'xla'  # cuDNN flash attention takes bf16/fp16 only.
  assert resolve('cudnn', jnp.bfloat16) == 'cudnn'
  with pytest.raises(ValueError, match=r"attention_implementation='cudnn' needs "
                                       r"config.model.dtype='bfloat16'.*float32"):
    resolve('cudnn', jnp.float32)


def _apply(cfg, deterministic=True):
  module = attention_kinds.get('dot_product')(cfg, deterministic)
  x = jax.random.normal(jax.random.key(1), (len(LENGTHS), 16, cfg.hidden_size))
  mask = _right_padded_mask()
  rngs = dict(params=jax.random.key(2), dropout=jax.random.key(3))
  params = module.init(rngs, x, mask)
  return lambda c: attention_kinds.get('dot_product')(c, deterministic).apply(params, x, mask,
                                                                       rngs=rngs)


def test_cudnn_on_a_cpu_backend_is_an_error_naming_the_key():
  cfg = config_lib.EncoderConfig(**TINY, dtype='bfloat16', attention_implementation='cudnn')
  with pytest.raises(ValueError, match=r"config.model.attention_implementation='cudnn' needs "
                                       r"a CUDA GPU.*backend is 'cpu'"):
    _apply(cfg)


def test_cudnn_with_attention_dropout_in_training_is_an_error():
  cfg = config_lib.EncoderConfig(**TINY, dtype='bfloat16', attention_implementation='cudnn',
                                 attention_dropout_rate=0.1)
  with pytest.raises(ValueError, match=r'attention_dropout_rate=0.1'):
    _apply(cfg, deterministic=False)


class _Recorder:
  """Stands in for ``jax.nn.dot_product_attention`` on a simulated GPU host."""

  def __init__(self, reject_cudnn=False):
    self.calls, self.reject_cudnn = [], reject_cudnn
    self.real = jax.nn.dot_product_attention

  def __call__(self, q, k, v, **kw):
    self.calls.append(dict(kw))
    if kw.get('implementation') == 'cudnn':
      if self.reject_cudnn:
        raise NotImplementedError('The head dim must be <= 256 and a multiple of 8')
      kw['implementation'] = 'xla'
    return self.real(q, k, v, **kw)


def test_a_gpu_host_sends_padding_to_cudnn_as_key_lengths(monkeypatch):
  cfg = config_lib.EncoderConfig(**TINY, dtype='bfloat16')
  apply = _apply(cfg)
  reference = apply(cfg.replace(attention_implementation='xla'))
  recorder = _Recorder()
  monkeypatch.setattr(attention, '_backend', lambda: 'gpu')
  monkeypatch.setattr(jax.nn, 'dot_product_attention', recorder)
  for implementation in (None, 'cudnn'):
    recorder.calls.clear()
    out = apply(cfg.replace(attention_implementation=implementation))
    (call,) = recorder.calls
    assert call['implementation'] == 'cudnn' and 'mask' not in call
    np.testing.assert_array_equal(call['key_value_seq_lengths'], LENGTHS)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(reference, np.float32))
  recorder.calls.clear()
  apply(cfg.replace(attention_implementation='xla'))
  assert recorder.calls[0]['implementation'] == 'xla' and 'mask' in recorder.calls[0]


def test_auto_falls_back_to_the_mask_when_cudnn_rejects_the_shape(monkeypatch):
  cfg = config_lib.EncoderConfig(**TINY, dtype='bfloat16')
  apply = _apply(cfg)
  reference = apply(cfg.replace(attention_implementation='xla'))
  recorder = _Recorder(reject_cudnn=True)
  monkeypatch.setattr(attention, '_backend', lambda: 'gpu')
  monkeypatch.setattr(jax.nn, 'dot_product_attention', recorder)
  out = apply(cfg)
  assert [c['implementation'] for c in recorder.calls] == ['cudnn', 'xla']
  assert 'mask' in recorder.calls[1]  # Exact for any mask, not only right-padded ones.
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(reference, np.float32))
  with pytest.raises(ValueError, match=r"attention_implementation='cudnn': cuDNN cannot run.*"
                                       r'head dim'):
    apply(cfg.replace(attention_implementation='cudnn'))


def test_config_rejects_an_unknown_implementation():
  with pytest.raises(ValueError, match=r"config.model.attention_implementation='flash'"):
    config_lib.EncoderConfig(**TINY, attention_implementation='flash')
  c = config_base.base_config()
  assert config_lib.EncoderConfig.from_config(c.model).attention_implementation is None
  c.model.attention_implementation = 'flash'
  with pytest.raises(validation.ConfigError, match='model.attention_implementation'):
    validation.validate(c)
  c.model.attention_implementation = 'cudnn'
  assert not any('attention_implementation' in p for p in validation.problems(c))


@pytest.mark.parametrize('shape', [(4, 64, 256), (3, 7, 33)])  # Even and odd last axes.
def test_dropout_keeps_one_minus_rate_scaled_and_is_deterministic_per_key(shape):
  rate = 0.1
  x = jnp.ones(shape, jnp.float32)
  y = layers.dropout(x, rate, jax.random.key(0))
  kept = np.asarray(y) != 0
  assert y.shape == x.shape
  np.testing.assert_allclose(np.asarray(y)[kept], 1.0 / (1.0 - rate), rtol=1e-6)
  n = kept.size
  # Binomial: the kept share within 5 standard deviations of 1 - rate.
  assert abs(kept.mean() - (1 - rate)) < 5 * (rate * (1 - rate) / n) ** 0.5
  # Both 16-bit halves of the words decide: each half of the last axis drops its share.
  half = shape[-1] // 2
  for part in (kept[..., :half], kept[..., half:]):
    assert abs(part.mean() - (1 - rate)) < 5 * (rate * (1 - rate) / part.size) ** 0.5
  np.testing.assert_array_equal(np.asarray(layers.dropout(x, rate, jax.random.key(0))), y)
  assert not np.array_equal(np.asarray(layers.dropout(x, rate, jax.random.key(1))), y)
  module = layers.Dropout(rate)
  assert module.apply({}, x, deterministic=True) is x
  train = module.apply({}, x, deterministic=False, rngs={'dropout': jax.random.key(0)})
  assert 0.0 < (np.asarray(train) == 0).mean() < 2 * rate
  assert np.asarray(layers.dropout(x, 1.0, jax.random.key(0))).max() == 0.0


def test_dropout_decisions_are_uncorrelated_across_neighbours_and_keys():
  """The hashed words (``layers.random_words``): neighbouring elements (along each axis,
  and the two halves one word decides) and two keys' masks agree as often as independent
  draws would, p^2 + (1-p)^2, within 5 standard deviations."""
  rate, shape = 0.3, (64, 96, 128)
  keep = lambda seed: np.asarray(layers.keep_mask(jax.random.key(seed), shape, rate))
  a, b = keep(0), keep(1)
  p = 1 - rate
  agree = p * p + rate * rate

  def check(x, y):
    share = (x == y).mean()
    assert abs(share - agree) < 5 * (agree * (1 - agree) / x.size) ** 0.5, share

  check(a, b)  # Two keys.
  check(a[:, :, 1:], a[:, :, :-1])  # Neighbours on the last axis (one word apart or halves).
  check(a[:, 1:], a[:, :-1])
  check(a[1:], a[:-1])
  check(a[..., :64], a[..., 64:])  # The two 16-bit halves of the same words.
  # Keys one fold apart (per-layer / per-step keys) are as unrelated.
  c = np.asarray(layers.keep_mask(jax.random.fold_in(jax.random.key(0), 1), shape, rate))
  check(a, c)
  words = np.asarray(layers.random_words(jax.random.key(2), (1 << 16,)))
  # Every bit of the words is fair.
  bits = (words[:, None] >> np.arange(32, dtype=np.uint32)) & 1
  assert np.abs(bits.mean(0) - 0.5).max() < 5 * (0.25 / words.size) ** 0.5


def test_dropout_words_do_not_repeat_past_two_to_the_32_elements():
  """Element (row, 0) and element (row + 2**32 / width, 0) share their flat index mod 2**32
  (a global array of more than 2**32 words, e.g. attention dropout at a large batch); their
  words differ, and rows within one block hash as the flat index."""
  width = 1 << 16
  seeds = jnp.array([12345, 67890], jnp.uint32)
  rows = jnp.array([0, 1 << 16, 7, 7 + (1 << 16)], jnp.uint32)
  words = np.asarray(layers.hash_words(rows, jnp.zeros_like(rows), width, seeds))
  assert len(set(words.tolist())) == 4
  flat = (np.asarray(rows, np.uint64) * width) % (1 << 32)
  assert flat[0] == flat[1] and flat[2] == flat[3]  # The 32-bit index alone would repeat.


@pytest.mark.parametrize('length,half_window', [(37, 4), (16, 2), (9, 3), (12, 1), (5, 0)])
def test_local_attention_equals_masked_full_attention(length, half_window):
  """The sliding window computed band by band (and its dense fallback for short
  sequences) equals full attention with the band in the mask: padding, a length that is
  not a multiple of the block, a window wider than the sequence; and with dropout, the
  kept share of the band's probabilities."""
  lengths = np.array([length, max(1, length - 5), 1])
  q, k, v = [jax.random.normal(r, (3, length, 2, 8)) for r in jax.random.split(
      jax.random.key(1), 3)]
  mask = (np.arange(length)[None] < lengths[:, None])[:, None, None, :]
  ours = attention.local_dot_product(q, k, v, mask, half_window)
  positions = jnp.broadcast_to(jnp.arange(length), (3, length))
  band = attention.band_mask(positions, positions, half_window)
  full = attention.explicit_dot_product(q, k, v, np.logical_and(mask, band), dropout_rate=0.0,
                                        dropout_rng=None)
  real = np.arange(length)[None] < lengths[:, None]
  np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(full)[real], atol=1e-6)
  # Queries at some rows only (the last layer at the rows a loss reads): the same rows.
  rows = np.array([[0, length - 1], [1, 0], [0, 0]]) % length
  at_rows = attention.local_dot_product(jnp.take_along_axis(q, rows[..., None, None], 1), k, v,
                                        mask, half_window, query_positions_BxL=rows)
  np.testing.assert_allclose(at_rows, np.take_along_axis(np.asarray(full), rows[..., None, None],
                                                         1), atol=1e-6)
  dropped = attention.banded_dot_product(q, k, v, mask, half_window, dropout_rate=0.5,
                                         dropout_rng=jax.random.key(3))
  assert np.isfinite(np.asarray(dropped)).all()


def test_local_attention_memory_is_linear_in_the_length():
  """The banded path never holds an [L, L] array: its compiled temporaries at 4,096 tokens
  are a small fraction of the full attention's."""
  shape = jax.ShapeDtypeStruct((1, 4096, 2, 16), jnp.float32)
  mask = jax.ShapeDtypeStruct((1, 1, 1, 4096), jnp.bool_)
  temp = lambda f: jax.jit(f).lower(shape, shape, shape, mask).compile().memory_analysis(
  ).temp_size_in_bytes
  local = temp(lambda q, k, v, m: attention.local_dot_product(q, k, v, m, 16))
  full = temp(lambda q, k, v, m: attention.explicit_dot_product(q, k, v, m, dropout_rate=0.0,
                                                                 dropout_rng=None))
  assert local * 20 < full, (local, full)
