"""Packed rows: several documents in one row, each read as if it were alone.

A packed batch (``data.pair_kind='packed_documents'``) carries ``document_ids`` [B, L]:
1, 2, ... for the documents of a row in order, 0 for the padding at its tail. A kind whose
trunk reads it (``ModelKind.packed_rows``, on an attention kind with ``packed_rows``)
takes it as ``document_ids_BxL`` and derives what each document would have in a row of its
own: positions restarting at 0 at its first token (absolute position embeddings and RoPE,
:func:`positions`) and attention within the document only (:func:`same_document`, the
block-diagonal mask that replaces the key padding mask; the sliding window of a local layer
is applied on top). Padding attends to padding only, so no row of the mask is empty.
Positions are not a second batch field: they follow from the ids, which keeps the two from
disagreeing.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def positions(document_ids_BxL):
  """int32 [B, L]: each token's position in its document (0 at its first token; the
  padding run counts as one more document)."""
  b, length = document_ids_BxL.shape
  index_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
  previous_BxL = jnp.pad(document_ids_BxL[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
  starts_BxL = jnp.where(document_ids_BxL != previous_BxL, index_BxL, 0)
  return index_BxL - jax.lax.cummax(starts_BxL, axis=1)


def same_document(q_documents_BxL, k_documents_BxS):
  """bool [B, 1, L, S]: query and key in the same document (the attention mask of packed
  rows: block-diagonal, padding with padding)."""
  return (q_documents_BxL[:, :, None] == k_documents_BxS[:, None, :])[:, None]


def context(document_ids_BxL) -> dict[str, Any]:
  """What the encoder hands every layer for packed rows (``{}`` for ordinary rows):
  ``document_ids`` and ``positions`` [B, L] of the keys' sequence."""
  if document_ids_BxL is None:
    return {}
  document_ids_BxL = jnp.asarray(document_ids_BxL, jnp.int32)
  return {'document_ids': document_ids_BxL, 'positions': positions(document_ids_BxL)}


def at_rows(x_BxL, rows_BxQ):
  """``x`` at the query rows (the last layer at some rows), or x itself (None)."""
  return x_BxL if rows_BxQ is None else jnp.take_along_axis(x_BxL, rows_BxQ, axis=1)
