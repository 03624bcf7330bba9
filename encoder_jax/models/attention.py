"""Attention kinds, looked up by ``config.model.attention_kind``.

An attention kind maps projected queries/keys/values to the attended values:
``fn(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, *, dropout_rate, dropout_rng) -> BxLxHxD``.
New kinds (e.g. DeBERTa's disentangled attention, which also needs relative positions)
register here; the encoder layer never names a kind.
"""

from __future__ import annotations

from typing import Callable, Protocol

import jax
import jax.numpy as jnp


class AttentionFn(Protocol):

  def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *,
               dropout_rate: float, dropout_rng: jax.Array | None) -> jax.Array:
    ...


REGISTRY: dict[str, AttentionFn] = {}


def register(name: str) -> Callable[[AttentionFn], AttentionFn]:
  def wrap(fn):
    REGISTRY[name] = fn
    return fn
  return wrap


def get(name: str) -> AttentionFn:
  if name not in REGISTRY:
    raise ValueError(
        f'config.model.attention_kind={name!r} is not a known attention kind; '
        f'valid: {sorted(REGISTRY)}')
  return REGISTRY[name]


@register('dot_product')
def dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, *, dropout_rate, dropout_rng):
  """Scaled dot-product attention with a key padding mask.

  Without attention dropout (evaluation, or ``attention_dropout_rate=0``) this is
  ``jax.nn.dot_product_attention``, which lowers to the fused cuDNN kernel on GPUs.
  BERT's recipe drops attention probabilities during training, which that API cannot do,
  so the training path with dropout spells out the same computation with an explicit
  softmax (a test checks both paths agree when dropout is off).
  """
  if dropout_rate == 0.0 or dropout_rng is None:
    return jax.nn.dot_product_attention(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask=mask_Bx1x1xS)
  return explicit_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS,
                              dropout_rate=dropout_rate, dropout_rng=dropout_rng)


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
