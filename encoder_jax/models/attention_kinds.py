"""Attention kinds by ``config.model.attention_kind``: one line per kind.

Each kind is a Flax module ``cls(config, deterministic)`` defined in its own module
(``models.attention`` documents the call); the encoder layer looks it up here and never
names one.
"""

from __future__ import annotations

import flax.linen as nn

from encoder_jax.models import attention
from encoder_jax.models import disentangled_attention

REGISTRY: dict[str, type[nn.Module]] = {
    'dot_product': attention.DotProductAttention,
    'disentangled': disentangled_attention.DisentangledAttention,  # DeBERTa.
}


def get(name: str) -> type[nn.Module]:
  if name not in REGISTRY:
    raise ValueError(
        f'config.model.attention_kind={name!r} is not a known attention kind; '
        f'valid: {sorted(REGISTRY)}')
  return REGISTRY[name]


def reads_document_ids(name: str) -> bool:
  """Whether the attention kind keeps the documents of a packed row apart (its class
  declares ``packed_rows``)."""
  return bool(getattr(get(name), 'packed_rows', False))


def document_readers() -> list[str]:
  """The attention kinds that keep the documents of a packed row apart."""
  return sorted(n for n in REGISTRY if reads_document_ids(n))
