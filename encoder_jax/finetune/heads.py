"""Task heads on any registered encoder kind, for fine-tuning all layers end to end.

The encoder submodules keep the names they have in the kind's pretraining network
(``embeddings``, ``encoder``, ``pooler``), so a pretrained (or imported) params tree
drops in; only ``classifier`` is new (and ``pooler`` for kinds pretrained without one,
e.g. RoBERTa, whose classification head is likewise a fresh dense + tanh on ``<s>``).
Sequence classification reads the tanh-pooled first state (as BERT fine-tuning does);
token classification reads every final state.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from encoder_jax.models import config as model_config_lib
from encoder_jax.models import layers
from encoder_jax.models import registry as models

# Sequence regression (STS-B) is a one-output head on the pooled state, trained with MSE.
# Question answering (SQuAD) is a per-token head of two outputs: start and end logits.
TASKS = ('sequence_classification', 'sequence_regression', 'token_classification',
         'question_answering')
HEAD_PARTS = ('classifier',)  # Always fresh; every other part comes from the pretrained params.


class Classifier(nn.Module):
  """Logits from the encoder: [B, num_labels] on the pooled [CLS] state (sentences or
  pairs), or [B, L, num_labels] on every final state (``per_token``: tagging, e.g. NER)."""
  config: model_config_lib.EncoderConfig
  num_labels: int
  dropout_rate: float = 0.1
  per_token: bool = False

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
               deterministic: bool = True):
    c = self.config
    out = models.get(c.kind).encode(c, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                      deterministic=deterministic, pool=not self.per_token)
    h = out['sequence_output'] if self.per_token else out['pooled_output']
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return layers.Dense((c.hidden_size,), (self.num_labels,), ('embed',), (None,),
                        c.initializer_range, c.jnp_dtype, name='classifier')(h).astype(jnp.float32)


def make(task: str, config: model_config_lib.EncoderConfig, num_labels: int,
         dropout_rate: float) -> nn.Module:
  if task not in TASKS:
    raise ValueError(f'config.task={task!r}; expected one of {TASKS}')
  if task == 'question_answering':
    return Classifier(config, 2, dropout_rate, per_token=True)
  return Classifier(config, num_labels, dropout_rate, per_token=task == 'token_classification')
