"""Attention implementation choice (``config.model.attention_implementation``): padding as
key lengths (cuDNN's form) equals the boolean mask, the cuDNN path is what a GPU host
selects, and a cuDNN request that cannot run is an error naming the key. Dropout (shared
by every attention kind and layer) keeps 1 - rate of the elements, scaled.

No GPU runs here: the GPU host is simulated by replacing ``attention._backend`` and
``jax.nn.dot_product_attention`` (the recorder checks what would reach cuDNN, then
computes with XLA).

Splash attention (the Pallas TPU kernel) runs here in Pallas interpret mode: its outputs and
gradients equal XLA's at the real positions (padding, packed documents, local windows, odd
lengths, a sharded mesh), a short training run logs XLA's losses, and where it cannot serve
one log line says why.
"""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.api import pretrain

from encoder_jax.config import schema as config_base
from encoder_jax import data as data_lib
from encoder_jax.run import feeding
from encoder_jax.core import length_phases
from encoder_jax import objectives
from encoder_jax.core import sharding
from encoder_jax.run import pretraining
from encoder_jax.config import validation
from encoder_jax.models import attention
from encoder_jax.models import attention_kinds
from encoder_jax.models import config as config_lib
from encoder_jax.models import layers
from encoder_jax.models import modernbert
from encoder_jax.models import registry

from support import tiny_config


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
  with pytest.raises(ValueError, match=r"attention_implementation='splash' is a TPU kernel"):
    resolve('splash', jnp.bfloat16)
  monkeypatch.setattr(attention, '_backend', lambda: 'tpu')
  assert resolve(None, jnp.bfloat16) == resolve(None, jnp.float32) == 'splash'
  assert resolve('xla', jnp.float32) == 'xla'
  with pytest.raises(ValueError, match=r"'cudnn' needs a CUDA GPU.*'tpu'"):
    resolve('cudnn', jnp.bfloat16)  # Forced, not quietly replaced by splash.
  monkeypatch.setattr(attention, '_backend', lambda: 'cpu')
  assert resolve('splash', jnp.float32) == 'splash'  # Pallas interpret mode (these tests).


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
  for implementation in ('cudnn', 'splash'):
    c.model.attention_implementation = implementation
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


# ------------------------------------------------------------------ splash attention

SPLASH_LENGTH = 37  # Not a multiple of the kernel's 128-token blocks: padded to 128.
# Case -> (rows: per row, its documents' lengths (packed rows, document ids 1, 2, ...; the
# rest padding, id 0) or one length (ordinary right-padded rows); half_window or None).
SPLASH_CASES = {
    'padded': ([(37,), (20,), (1,), (30,)], None),
    'packed_3_documents': ([(9, 17, 6), (37,), (12, 5, 20), (2, 3, 1)], None),
    'local_window': ([(37,), (20,), (1,), (30,)], 3),
    'local_packed': ([(9, 17, 6), (37,), (12, 5, 20), (2, 3, 1)], 4),
}


def _splash_inputs(rows, packed):
  """q, k, v [4, 37, 2, 8]; segment ids (documents, or the padding mask as 1/0); the XLA
  attention's mask [B, 1, L, L] (the same documents, or key padding); real query rows."""
  b, length = len(rows), SPLASH_LENGTH
  q, k, v = [jax.random.normal(r, (b, length, 2, 8)) for r in jax.random.split(
      jax.random.key(4), 3)]
  documents = np.zeros((b, length), np.int32)
  for i, docs in enumerate(rows):
    ends = np.cumsum(docs)
    for d, (start, end) in enumerate(zip(ends - docs, ends)):
      documents[i, start:end] = d + 1 if packed else 1
  real = documents > 0
  mask = (documents[:, None, :, None] == documents[:, None, None, :] if packed
          else np.broadcast_to(real[:, None, None, :], (b, 1, length, length)))
  return (q, k, v), documents, mask, real


def _xla_attention(q, k, v, mask, half_window):
  if half_window is not None:
    positions = jnp.broadcast_to(jnp.arange(q.shape[1]), q.shape[:2])
    mask = jnp.logical_and(mask, attention.band_mask(positions, positions, half_window))
  return attention.explicit_dot_product(q, k, v, mask, dropout_rate=0.0, dropout_rng=None)


def _outputs_and_grads(attend, qkv, real):
  """The outputs, and the gradients w.r.t. q, k, v of a random projection of the outputs at
  the real positions (padded queries' outputs are read by no loss)."""
  cotangent = jax.random.normal(jax.random.key(5), qkv[0].shape) * real[:, :, None, None]
  loss = lambda *qkv: jnp.sum(attend(*qkv) * cotangent)
  return jax.jit(lambda *qkv: (attend(*qkv), jax.grad(loss, argnums=(0, 1, 2))(*qkv)))(*qkv)


def _assert_splash_equals_xla(splash, xla, real, what):
  (out, grads), (out_ref, grads_ref) = splash, xla
  diffs = {'out': float(np.abs(np.asarray(out)[real] - np.asarray(out_ref)[real]).max())}
  for name, g, g_ref in zip('qkv', grads, grads_ref):
    diffs[f'd{name}'] = float(np.abs(np.asarray(g) - np.asarray(g_ref)).max())
  print(what, diffs)  # The figures (pytest -s).
  assert max(diffs.values()) < 2e-5, (what, diffs)


@pytest.mark.parametrize('case', sorted(SPLASH_CASES))
def test_splash_equals_xla_outputs_and_gradients(case):
  """At the real positions; the sliding window against :func:`attention.band_mask` (both
  edges in the window, as splash's ``LocalMask``)."""
  rows, half_window = SPLASH_CASES[case]
  qkv, documents, mask, real = _splash_inputs(rows, packed='packed' in case)
  splash = _outputs_and_grads(
      lambda q, k, v: attention.splash_dot_product(q, k, v, documents, half_window), qkv, real)
  xla = _outputs_and_grads(lambda q, k, v: _xla_attention(q, k, v, mask, half_window), qkv,
                           real)
  _assert_splash_equals_xla(splash, xla, real, case)
  if half_window is not None and 'packed' not in case:  # The banded path too.
    banded = attention.local_dot_product(*qkv, mask[:, :, :1], half_window)
    np.testing.assert_allclose(np.asarray(splash[0])[real], np.asarray(banded)[real], atol=2e-6)


def test_splash_on_a_sharded_mesh_equals_xla():
  """data=2, fsdp=2, tensor=2: the kernel in a shard_map (rows over data and fsdp, the two
  heads over tensor), packed rows in a local window."""
  rows, half_window = SPLASH_CASES['local_packed']
  qkv, documents, mask, real = _splash_inputs(rows, packed=True)
  mesh = sharding.make_mesh(dict(data=2, fsdp=2, tensor=2))
  rows_spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(('data', 'fsdp')))
  qkv = jax.device_put(qkv, rows_spec)

  def splash_attend(q, k, v):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return attention.splash_dot_product(q, k, v, jax.device_put(documents, rows_spec),
                                          half_window)

  assert 'shard_map' in str(jax.make_jaxpr(splash_attend)(*qkv))
  splash = _outputs_and_grads(splash_attend, qkv, real)
  assert tuple(splash[0].sharding.spec)[:3] == (('data', 'fsdp'), None, 'tensor')
  xla = _outputs_and_grads(lambda q, k, v: _xla_attention(q, k, v, mask, half_window), qkv,
                           real)
  _assert_splash_equals_xla(splash, xla, real, 'sharded 2x2x2')


def test_splash_in_a_model_with_local_layers_and_packed_rows_equals_xla():
  """ModernBERT's layers through the attention module (RoPE, local and global layers in the
  layer scan, the last layer at some rows on XLA): the same states at the real positions."""
  c = registry.make_config(dict(
      modernbert.PUBLISHED, vocab_size=97, hidden_size=24, num_layers=2, num_heads=2,
      intermediate_size=40, max_position_embeddings=64, local_attention=8,
      global_attn_every_n_layers=2, attention_implementation='splash'))
  net = registry.network(c)
  params = net.init(jax.random.key(0))
  _, documents, _, real = _splash_inputs(SPLASH_CASES['packed_3_documents'][0], packed=True)
  ids = np.where(real, np.random.default_rng(0).integers(5, 97, real.shape), 0).astype(np.int32)
  inputs = (ids, np.zeros_like(ids), real.astype(np.int32))
  rows = np.array([[0, 3, 20, 36]] * len(ids), np.int32)
  out = {}
  for implementation in ('splash', 'xla'):
    run = registry.network(c.replace(attention_implementation=implementation))
    encoded = jax.jit(run.encoder.apply)({'params': params}, *inputs, document_ids_BxL=documents)
    logits = jax.jit(run.pretraining.apply)({'params': params}, *inputs, rows,
                                            document_ids_BxL=documents)['mlm_logits']
    out[implementation] = np.asarray(encoded['sequence_output'])[real], np.asarray(logits)
  for a, b in zip(out['splash'], out['xla']):
    np.testing.assert_allclose(a, b, atol=2e-5)


def _tiny_run_config(prepared_dir, implementation):
  """tests/support/tiny_config.py at 32 tokens, attention dropout 0, on a 2 x 2 x 2 mesh."""
  c = tiny_config.get_config(f'prepared_dir={prepared_dir}')
  c.model.update(attention_implementation=implementation, attention_dropout_rate=0.0)
  c.mesh.update(data=2, fsdp=2, tensor=2)
  c.train.update(num_steps=3, seq_lens=(32,), max_predictions=(5,), phase_fractions=(1.0,),
                 eval_every_steps=100)
  c.checkpoint.update(every_steps=100)
  return c


def test_the_steps_lower_for_a_tpu_with_the_kernel_placed_by_shard_map(prepared_dir,
                                                                        monkeypatch):
  """TPU-ready without a TPU: the backend posing as a TPU (the kernel compiled by Mosaic, not
  interpreted; None resolves to splash), the tiny config's training and evaluation steps on
  a 2 x 2 x 2 mesh lower for the TPU platform, their attention Mosaic custom calls (forward;
  backward dq and dkv) in shard_maps: lowering refuses a Mosaic call XLA would have to
  partition ('cannot be automatically partitioned')."""
  monkeypatch.setattr(attention, '_backend', lambda: 'tpu')
  c = _tiny_run_config(prepared_dir, None)
  prepared = data_lib.load_or_prepare(c)
  mesh = sharding.make_mesh(c.mesh)
  batch = feeding.to_global(next(data_lib.make_train_iterator(c, prepared, 0, 1)),
                            sharding.batch_sharding(mesh))
  objective = objectives.build(c, pretraining.vocab_tables(c, prepared))
  pieces = pretraining.pieces(c, mesh, objective)
  state = pieces.abstract_state()
  phase = length_phases.phases(c.train)[0]
  step = pieces.train_step(phase)
  evaluate = pretraining.make_eval_step(c, objective, mesh, pieces.shards.params, phase)
  for program, calls in ((step.trace(state, batch), 3),
                         (evaluate.trace(state.params, batch, 0), 1)):
    text = program.lower(lowering_platforms=('tpu',)).as_text()
    assert text.count('tpu_custom_call') == calls


@pytest.mark.slow  # About 35 s on 2 cores with a cold compilation cache.
def test_a_short_training_run_with_splash_logs_the_losses_of_xla(prepared_dir, tmp_path,
                                                                  monkeypatch):
  """tests/support/tiny_config.py (as tests/run/test_pretraining.py's runs), 3 steps at 32
  tokens on a data=2, fsdp=2, tensor=2 mesh (the step traced under it: the kernel in a shard_map),
  attention dropout 0: the logged losses and gradient norms equal XLA's run's."""
  meshes = []
  kernel = attention.splash_dot_product

  def splash_dot_product(*args, **kwargs):
    meshes.append(dict(jax.sharding.get_abstract_mesh().shape))
    return kernel(*args, **kwargs)

  monkeypatch.setattr(attention, 'splash_dot_product', splash_dot_product)
  logged = {}
  for implementation in ('xla', 'splash'):
    workdir = tmp_path / implementation
    pretrain.run(_tiny_run_config(prepared_dir, implementation), str(workdir))
    with open(workdir / 'metrics.jsonl', encoding='utf-8') as f:
      logged[implementation] = [r for r in map(json.loads, f) if r['split'] == 'train']
  assert [r['step'] for r in logged['splash']] == [1, 2, 3]
  # Traced in the training and the evaluation step (the first layer; the last one runs at the
  # predicted rows on XLA) under their 2 x 2 x 2 mesh (the other traces: shapes and
  # initialisation, outside the steps, without a mesh).
  assert [m for m in meshes if m] == [dict(data=2, fsdp=2, tensor=2)] * 2, meshes
  for ours, theirs in zip(logged['splash'], logged['xla']):
    for key in ('loss', 'mlm_loss', 'pair_loss', 'grad_norm'):
      np.testing.assert_allclose(ours[key], theirs[key], rtol=2e-5, err_msg=key)


def _warnings(monkeypatch):
  lines = []
  monkeypatch.setattr(attention, '_warned', set())
  monkeypatch.setattr(attention.logging, 'warning', lambda fmt, *a: lines.append(fmt % a))
  return lines


@pytest.mark.parametrize('kind', ['dropout', 'tpu_without_mesh'])
def test_where_splash_cannot_serve_one_line_says_so(kind, monkeypatch):
  """Attention dropout in training, a trace on several TPU devices without the mesh in
  context (the Mosaic kernel cannot be placed): XLA's attention, and one log line (per
  reason) naming it. Traced only. (DeBERTa's and XLNet's attention have a kernel of their
  own: tests/models/test_disentangled_kernel.py, tests/models/test_xlnet.py.)"""
  lines = _warnings(monkeypatch)
  if kind == 'tpu_without_mesh':  # conftest: 8 devices.
    monkeypatch.setattr(attention, '_backend', lambda: 'tpu')
    cfg = config_lib.EncoderConfig(**TINY)  # None: splash on a TPU.
    module = attention_kinds.get('dot_product')(cfg, True)
    shape = jax.ShapeDtypeStruct((len(LENGTHS), 16, cfg.hidden_size), jnp.float32)
    jaxpr = str(jax.make_jaxpr(lambda x: module.init_with_output(
        jax.random.key(0), x, _right_padded_mask()))(shape))
    assert 'pallas_call' not in jaxpr
    expected = r'without a mesh in context on 8 TPU devices'
  else:
    cfg = config_lib.EncoderConfig(**TINY, attention_implementation='splash',
                                   attention_dropout_rate=0.1)
    shape = jax.ShapeDtypeStruct((len(LENGTHS), 16, cfg.hidden_size), jnp.float32)
    for _ in range(2):
      module = attention_kinds.get('dot_product')(cfg, False)
      rngs = dict(params=jax.random.key(2), dropout=jax.random.key(3))
      jax.eval_shape(lambda x: module.init_with_output(rngs, x, _right_padded_mask()), shape)
    jax.eval_shape(lambda x: attention_kinds.get('dot_product')(cfg, True).init_with_output(
        rngs, x, _right_padded_mask()), shape)  # Evaluation: the kernel, no line.
    expected = r'has no attention dropout.*attention_dropout_rate=0.1'
  assert len(lines) == 1, lines
  assert re.search(expected + r'.*using XLA attention', lines[0]), lines
