"""Attention kinds, looked up by ``config.model.attention_kind``.

An attention kind is a Flax module ``cls(config, deterministic)`` called as
``(x_BxLxE, mask_Bx1x1xL, context) -> BxLxE``: it owns its parameters (projections,
and anything else it needs, e.g. DeBERTa's relative-position projections) and returns
the attention block's output before dropout and the residual. ``context`` is a dict the
encoder builds once per forward pass and hands to every layer (e.g. relative-position
embeddings or a second stream); plain dot-product attention ignores it.

Encoder layers call a kind with ``nn.share_scope``, so its parameters sit directly in the
layer's scope (``query``, ``key``, ``value``, ``attention_output`` for dot-product), the
layout the checkpoints and the Hugging Face tables use. New kinds register here; the
encoder layer never names one.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoder_jax.models import layers

REGISTRY: dict[str, type[nn.Module]] = {}


def register(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
  def wrap(cls):
    REGISTRY[name] = cls
    return cls
  return wrap


def get(name: str) -> type[nn.Module]:
  if name not in REGISTRY:
    raise ValueError(
        f'config.model.attention_kind={name!r} is not a known attention kind; '
        f'valid: {sorted(REGISTRY)}')
  return REGISTRY[name]


def fused(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS):
  """``jax.nn.dot_product_attention``: the fused cuDNN kernel on GPUs, XLA elsewhere."""
  return jax.nn.dot_product_attention(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask=mask_Bx1x1xS)


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
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs_BxHxLxS.shape)
    probs_BxHxLxS = jnp.where(keep, probs_BxHxLxS / (1.0 - dropout_rate), 0.0)
  return jnp.einsum('bhls,bshd->blhd', probs_BxHxLxS.astype(v_BxSxHxD.dtype), v_BxSxHxD)


def dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, *, dropout_rate, dropout_rng):
  """Scaled dot-product attention with a key padding mask.

  Without attention dropout (evaluation, or ``attention_dropout_rate=0``) this is
  ``jax.nn.dot_product_attention``. BERT's recipe drops attention probabilities during
  training, which that API cannot do, so the training path with dropout spells out the
  same computation with an explicit softmax (a test checks both paths agree).
  """
  if dropout_rate == 0.0 or dropout_rng is None:
    return fused(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS)
  return explicit_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS,
                              dropout_rate=dropout_rate, dropout_rng=dropout_rng)


@register('dot_product')
class DotProductAttention(nn.Module):
  """Multi-head self-attention: q/k/v projections with a head axis, output projection."""
  config: Any  # models.config.EncoderConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxLxE, mask_Bx1x1xL, context: dict[str, Any] | None = None):
    del context
    c, dt = self.config, self.config.jnp_dtype
    h, d, e = c.num_heads, c.head_dim, c.hidden_size
    qkv = lambda n: layers.Dense((e,), (h, d), ('embed',), ('heads', 'kv'),
                                 c.initializer_range, dt, name=n)
    q_BxLxHxD, k_BxLxHxD, v_BxLxHxD = (qkv(n)(x_BxLxE) for n in ('query', 'key', 'value'))
    use_dropout = not self.deterministic and c.attention_dropout_rate > 0
    a_BxLxHxD = dot_product(q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, mask_Bx1x1xL,
                            dropout_rate=c.attention_dropout_rate if use_dropout else 0.0,
                            dropout_rng=self.make_rng('dropout') if use_dropout else None)
    return layers.Dense((h, d), (e,), ('heads', 'kv'), ('embed',), c.initializer_range, dt,
                        name='attention_output')(a_BxLxHxD)


# Kinds defined in their own modules register themselves on import (kept last: they import
# this module's ``register``).
from encoder_jax.models import disentangled_attention  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
