"""Task heads on any registered encoder kind, for fine-tuning all layers end to end.

The encoder submodules keep the names they have in the kind's pretraining network
(``embeddings``, ``encoder``, ``pooler``), so a pretrained (or imported) params tree
drops in; only ``classifier`` is new (and ``pooler`` for kinds pretrained without one,
e.g. RoBERTa, whose classification head is likewise a fresh dense + tanh on ``<s>``).
A sequence task reads the tanh-pooled first state (as BERT fine-tuning does) or the
tokens' mean; a token task reads every final state. Which task uses which is declared in
``finetune.tasks``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoder_jax.models import config as model_config_lib
from encoder_jax.models import layers
from encoder_jax.models import registry as models

HEAD_PARTS = ('classifier',)  # Always fresh; every other part comes from the pretrained params.


class Classifier(nn.Module):
  """Logits from the encoder: [B, num_labels] on the pooled [CLS] state (sentences or
  pairs; ``pooling='mean'``: the mean of the real tokens' final states instead, with no
  pooler), or [B, L, num_labels] on every final state (``per_token``: tagging, e.g. NER)."""
  config: model_config_lib.EncoderConfig
  num_labels: int
  dropout_rate: float = 0.1
  per_token: bool = False
  pooling: str = 'cls'

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
               deterministic: bool = True, document_ids_BxL=None):
    """``document_ids_BxL``: packed rows (several examples per row, ``data.pack``), on a
    kind with ``packed_rows``: each example attends to itself only, and a sequence task's
    logits are per example, [B, D, num_labels] with ``D = L // 3`` slots (example d of a
    row in slot d - 1; ``pooling='mean'`` only)."""
    c = self.config
    cls_pool = not self.per_token and self.pooling == 'cls'
    packed = {} if document_ids_BxL is None else {'document_ids_BxL': document_ids_BxL}
    if packed and cls_pool:
      raise ValueError("Packed rows pool each example by the mean of its tokens: expected "
                       "config.pooling='mean' (the pooler reads the row's first token only)")
    out = models.get(c.kind).encode(c, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                                    deterministic=deterministic, pool=cls_pool, **packed)
    if self.per_token:
      h = out['sequence_output']
    elif packed:  # The mean of each example's tokens: [B, D, H].
      slots = input_ids_BxL.shape[1] // 3  # An example takes >= 3 tokens ([CLS] x [SEP]).
      m = jax.nn.one_hot(document_ids_BxL - 1, slots, dtype=jnp.float32)  # Padding: none.
      h = jnp.einsum('bld,blh->bdh', m, out['sequence_output'].astype(jnp.float32))
      h = (h / jnp.maximum(m.sum(1), 1.0)[..., None]).astype(c.jnp_dtype)
    elif cls_pool:
      h = out['pooled_output']
    else:
      m = input_mask_BxL[..., None].astype(jnp.float32)
      h = (out['sequence_output'].astype(jnp.float32) * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
      h = h.astype(c.jnp_dtype)
    h = layers.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return layers.Dense((c.hidden_size,), (self.num_labels,), ('embed',), (None,),
                        c.initializer_range, c.jnp_dtype, name='classifier')(h).astype(jnp.float32)
