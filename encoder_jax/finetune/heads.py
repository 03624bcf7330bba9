"""Task heads on the BERT encoder, for fine-tuning all layers end to end.

The encoder submodules keep the names they have in ``bert.BertForPreTraining``
(``embeddings``, ``encoder``, ``pooler``), so a pretrained (or imported) params tree
drops in; only ``classifier`` is new. Sequence classification reads the tanh-pooled
[CLS] state (as BERT fine-tuning does); token classification reads every final state.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from encoder_jax.models import bert
from encoder_jax.models import layers

TASKS = ('sequence_classification', 'token_classification')
PRETRAINED_PARTS = ('embeddings', 'encoder', 'pooler')  # Taken from the pretrained params.


def _dense(c: bert.BertConfig, out: int, out_axes, name: str) -> layers.Dense:
  return layers.Dense((c.hidden_size,), (out,), ('embed',), out_axes, c.initializer_range,
                      c.jnp_dtype, name=name)


class SequenceClassifier(nn.Module):
  """Logits [B, num_labels] from the pooled [CLS] state (single sentences or pairs)."""
  config: bert.BertConfig
  num_labels: int
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
               deterministic: bool = True):
    c = self.config
    pooled_BxE = bert.encode(c, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                             deterministic=deterministic)['pooled_output']
    pooled_BxE = nn.Dropout(self.dropout_rate)(pooled_BxE, deterministic=deterministic)
    return _dense(c, self.num_labels, (None,), 'classifier')(pooled_BxE).astype(jnp.float32)


class TokenClassifier(nn.Module):
  """Logits [B, L, num_labels] for every token (tagging, e.g. NER)."""
  config: bert.BertConfig
  num_labels: int
  dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
               deterministic: bool = True):
    c = self.config
    x_BxLxE = bert.encode(c, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                          deterministic=deterministic, pool=False)['sequence_output']
    x_BxLxE = nn.Dropout(self.dropout_rate)(x_BxLxE, deterministic=deterministic)
    return _dense(c, self.num_labels, (None,), 'classifier')(x_BxLxE).astype(jnp.float32)


def make(task: str, config: bert.BertConfig, num_labels: int, dropout_rate: float) -> nn.Module:
  if task == 'sequence_classification':
    return SequenceClassifier(config, num_labels, dropout_rate)
  if task == 'token_classification':
    return TokenClassifier(config, num_labels, dropout_rate)
  raise ValueError(f'config.task={task!r}; expected one of {TASKS}')
