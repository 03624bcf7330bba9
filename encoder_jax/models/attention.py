"""Dot-product attention, and what every attention kind shares (the fused / explicit
softmax backends, key lengths for cuDNN).

Attention kinds are looked up by ``config.model.attention_kind`` in
``models.attention_kinds`` (the registry). An attention kind is a Flax module ``cls(config, deterministic)`` called as
``(x_BxLxE, mask_Bx1x1xL, context) -> BxLxE``: it owns its parameters (projections,
and anything else it needs, e.g. DeBERTa's relative-position projections) and returns
the attention block's output before dropout and the residual. ``context`` is a dict the
encoder builds once per forward pass and hands to every layer (e.g. relative-position
embeddings or a second stream); plain dot-product attention reads only ``kv_states``
(keys and values from other rows than the queries), when present.

Encoder layers call a kind with ``nn.share_scope``, so its parameters sit directly in the
layer's scope (``query``, ``key``, ``value``, ``attention_output`` for dot-product), the
layout the checkpoints and the Hugging Face tables use. A new kind is a module plus a line
in ``attention_kinds``; the encoder layer never names one.
"""

from __future__ import annotations

from typing import Any

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from encoder_jax.models import layers

# config.model.attention_implementation: None = per backend (cuDNN on a CUDA GPU in
# bf16/fp16, XLA elsewhere), or one forced.
IMPLEMENTATIONS = (None, 'xla', 'cudnn')
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_warned: set[str] = set()


def _backend() -> str:
  """The JAX backend steps compile for (a function, so a test can pose as a GPU host)."""
  return jax.default_backend()


def key_lengths(mask_Bx1x1xS):
  """Keys per sequence, ``int32[B]``: the count of ones in each row of the key mask.

  Assumes right padding: each row is ones (real tokens) then zeros (padding), which is
  what the data pipeline (``data.iterators``: ``arange(L) < length``), fine-tuning
  (``finetune.data``) and ``encoder_jax.load(...).encode`` produce. For such a mask,
  masking keys at positions ``>= length`` is the same as masking by the boolean mask. A
  mask with holes or left padding is only exact with ``attention_implementation='xla'``.
  """
  return jnp.sum(mask_Bx1x1xS, axis=(1, 2, 3), dtype=jnp.int32)


def resolve_implementation(requested: str | None, dtype) -> str:
  """'xla' or 'cudnn' for ``config.model.attention_implementation`` on this backend.

  None picks cuDNN on a GPU when the activations are bf16/fp16 (the only dtypes cuDNN's
  flash attention takes) and XLA otherwise; note that ``jax.nn.dot_product_attention``'s
  own default (``implementation=None``) is XLA on every backend, so without this choice
  the cuDNN kernel never runs. An explicit 'cudnn' that cannot run here is an error that
  names the key, not a silent fallback: whoever forces it is measuring it.
  """
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f'config.model.attention_implementation={requested!r}; expected one of '
                     f'{list(IMPLEMENTATIONS)} (None = cuDNN on GPUs, XLA elsewhere)')
  if requested == 'xla':
    return 'xla'
  backend, low_precision = _backend(), jnp.dtype(dtype) in _CUDNN_DTYPES
  if requested == 'cudnn':
    if backend != 'gpu':
      raise ValueError(
          "config.model.attention_implementation='cudnn' needs a CUDA GPU (cuDNN fused "
          f"attention); this process's JAX backend is {backend!r}. Use 'xla', or None to "
          'choose per backend.')
    if not low_precision:
      raise ValueError(
          "config.model.attention_implementation='cudnn' needs config.model.dtype="
          f"'bfloat16' (cuDNN flash attention takes bf16/fp16, not {jnp.dtype(dtype).name}); "
          "use 'xla' or None for float32.")
    return 'cudnn'
  return 'cudnn' if backend == 'gpu' and low_precision else 'xla'


def fused(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, *,
          implementation: str | None = None, padding_as_lengths: bool | None = None):
  """``jax.nn.dot_product_attention``: cuDNN's fused flash-attention kernel, or XLA's.

  ``implementation`` is ``config.model.attention_implementation`` (see
  :func:`resolve_implementation`). cuDNN takes key padding as sequence lengths (its
  PADDING mask type); a boolean mask it would first turn into an additive bias tensor
  the kernel must read (JAX's ``combine_bias_and_mask``). So on the cuDNN path the
  padding goes in as ``key_value_seq_lengths = key_lengths(mask)`` (right padding
  assumed, see :func:`key_lengths`). Queries keep their full length, so padded positions still get
  outputs, equal to the mask path's (and Hugging Face's). The XLA path keeps the boolean
  mask, exact for any mask. ``padding_as_lengths`` overrides the choice of padding form
  (tests compare the two on XLA).

  With None, a case JAX's cuDNN path rejects when tracing (no cuDNN, e.g. ROCm; compute
  capability < 8.0; a head dim over 128, or 256 on Hopper, or not a multiple of 8) falls
  back to XLA with a warning; with 'cudnn' it is an error naming the key.
  """
  impl = resolve_implementation(implementation, q_BxLxHxD.dtype)
  as_lengths = impl == 'cudnn' if padding_as_lengths is None else padding_as_lengths
  padding = (dict(key_value_seq_lengths=key_lengths(mask_Bx1x1xS)) if as_lengths
             else dict(mask=mask_Bx1x1xS))
  if impl == 'cudnn':
    try:
      return jax.nn.dot_product_attention(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, **padding,
                                          implementation='cudnn')
    except (NotImplementedError, RuntimeError, ValueError) as e:
      if implementation == 'cudnn':
        raise ValueError(f"config.model.attention_implementation='cudnn': cuDNN cannot run "
                         f"this attention ({e}); use 'xla', or None to fall back.") from e
      if str(e) not in _warned:
        _warned.add(str(e))
        logging.warning('cuDNN attention unavailable (%s); using XLA attention '
                        '(config.model.attention_implementation=None).', e)
      if padding_as_lengths is None:
        padding = dict(mask=mask_Bx1x1xS)
  return jax.nn.dot_product_attention(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, **padding,
                                      implementation='xla')


def explicit_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, *, dropout_rate,
                         dropout_rng):
  """The same attention with an explicit float32 softmax, and dropout on its output."""
  depth = q_BxLxHxD.shape[-1]
  logits_BxHxLxS = jnp.einsum('blhd,bshd->bhls', q_BxLxHxD, k_BxSxHxD,
                              preferred_element_type=jnp.float32)
  logits_BxHxLxS = logits_BxHxLxS / jnp.sqrt(jnp.float32(depth))
  logits_BxHxLxS = jnp.where(mask_Bx1x1xS, logits_BxHxLxS, jnp.finfo(jnp.float32).min)
  probs_BxHxLxS = jax.nn.softmax(logits_BxHxLxS, axis=-1)
  if dropout_rate > 0.0:
    probs_BxHxLxS = layers.dropout(probs_BxHxLxS, dropout_rate, dropout_rng)
  return jnp.einsum('bhls,bshd->blhd', probs_BxHxLxS.astype(v_BxSxHxD.dtype), v_BxSxHxD)


def dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, *, dropout_rate, dropout_rng,
                implementation: str | None = None):
  """Scaled dot-product attention with a key padding mask.

  Without attention dropout (evaluation, or ``attention_dropout_rate=0``) this is
  ``jax.nn.dot_product_attention`` (:func:`fused`; cuDNN on GPUs). BERT's recipe drops
  attention probabilities during training, which that API cannot do, so the training path
  with dropout spells out the same computation with an explicit softmax (a test checks
  both paths agree); a GPU run reaches the cuDNN kernel in training only with
  ``attention_dropout_rate=0``.
  """
  if dropout_rate == 0.0 or dropout_rng is None:
    return fused(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, implementation=implementation)
  return explicit_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS,
                              dropout_rate=dropout_rate, dropout_rng=dropout_rng)


def rotate(x_BxLxHxD, positions_BxL, theta: float):
  """Rotary position embedding (RoPE; Su et al. 2021) in the rotate-half layout of Hugging
  Face's RoFormer-derived models (ModernBERT, Llama): dimension i pairs with i + D/2, each
  pair turned by the angle ``position * theta^(-2i/D)``; computed in float32."""
  d = x_BxLxHxD.shape[-1]
  if d % 2:
    raise ValueError(f'Rotary positions need an even head size; got {d} '
                     '(config.model.hidden_size / num_heads)')
  inverse_D2 = theta ** -(jnp.arange(0, d, 2, dtype=jnp.float32) / d)
  angle_BxLx1xD2 = positions_BxL.astype(jnp.float32)[..., None, None] * inverse_D2
  cos, sin = jnp.cos(angle_BxLx1xD2), jnp.sin(angle_BxLx1xD2)
  x = x_BxLxHxD.astype(jnp.float32)
  x1, x2 = x[..., :d // 2], x[..., d // 2:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x_BxLxHxD.dtype)


class DotProductAttention(nn.Module):
  """Multi-head self-attention: q/k/v projections with a head axis, output projection.

  ``config.rotary``: queries and keys turned by their positions (:func:`rotate`); the
  queries' positions are ``context['query_positions']`` [B, L] when the queries are some
  rows of the keys' sequence (the last layer at the predicted rows), else 0..L-1.
  """
  config: Any  # models.config.EncoderConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxLxE, mask_Bx1x1xL, context: dict[str, Any] | None = None):
    # Keys and values from context['kv_states'] [B, S, E] when given (queries at a subset
    # of the rows, e.g. the last layer at the predicted positions), else from x.
    kv_BxSxE = (context or {}).get('kv_states', x_BxLxE)
    c, dt = self.config, self.config.jnp_dtype
    h, d, e = c.num_heads, c.head_dim, c.hidden_size
    qkv = lambda n: layers.Dense((e,), (h, d), ('embed',), ('heads', 'kv'),
                                 c.initializer_range, dt, use_bias=c.dense_bias, name=n)
    q_BxLxHxD = qkv('query')(x_BxLxE)
    k_BxLxHxD, v_BxLxHxD = qkv('key')(kv_BxSxE), qkv('value')(kv_BxSxE)
    if c.rotary:
      b, length, s = x_BxLxE.shape[0], x_BxLxE.shape[1], kv_BxSxE.shape[1]
      q_positions = (context or {}).get('query_positions')
      if q_positions is None:
        q_positions = jnp.broadcast_to(jnp.arange(length), (b, length))
      q_BxLxHxD = rotate(q_BxLxHxD, q_positions, c.rope_theta)
      k_BxLxHxD = rotate(k_BxLxHxD, jnp.broadcast_to(jnp.arange(s), (b, s)), c.rope_theta)
    use_dropout = not self.deterministic and c.attention_dropout_rate > 0
    if use_dropout and c.attention_implementation == 'cudnn':
      raise ValueError(
          "config.model.attention_implementation='cudnn' has no attention dropout, and "
          f'config.model.attention_dropout_rate={c.attention_dropout_rate} asks for it in '
          "training: set attention_dropout_rate=0, or attention_implementation None/'xla' "
          '(dropout then runs the explicit softmax).')
    a_BxLxHxD = dot_product(q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, mask_Bx1x1xL,
                            dropout_rate=c.attention_dropout_rate if use_dropout else 0.0,
                            dropout_rng=self.make_rng('dropout') if use_dropout else None,
                            implementation=c.attention_implementation)
    return layers.Dense((h, d), (e,), ('heads', 'kv'), ('embed',), c.initializer_range, dt,
                        use_bias=c.dense_bias, name='attention_output')(a_BxLxHxD)
