"""A fine-tuning task as the training engine sees it: head + loss + metrics.

:class:`Task` implements what the engine trains (``trainable.Trainable``, the contract a
pretraining setup extends too: ``init``, ``loss_fn``, metric weights, console metrics,
FLOPs), so the engine's train step (``steps.Pieces.train_step``: mesh and sharding, the
model's dtype policy, gradient clipping through the optimizer, the non-finite policy),
its sharded state (``train_state``) and its Orbax checkpoints run it unchanged. Each
registered task (``finetune.tasks``) builds one with its head, loss and predictions; the
data side is ``finetune.data`` (encoded arrays, ``EpochBatches``); the task metrics
(accuracy, macro-F1, span F1) are ``finetune.scores``, on the host over a whole split.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoder_jax.core import length_phases
from encoder_jax.core import trainable
from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import heads
from encoder_jax.models import registry as models
from encoder_jax.objectives import base


def loss_and_accuracy(logits, labels, weights):
  """Mean cross-entropy and accuracy over real examples / labelled tokens (label -1 =
  ignored), and the count they average over."""
  if labels.ndim == 2:
    weights = weights[:, None] * (labels != data_lib.IGNORE)
  safe = jnp.maximum(labels, 0)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), safe[..., None], -1)[..., 0]
  correct = (jnp.argmax(logits, -1) == safe).astype(jnp.float32)
  count = weights.sum()
  denom = jnp.maximum(count, 1.0)
  return (nll * weights).sum() / denom, (correct * weights).sum() / denom, count


def classification_loss(logits, batch):
  """Cross-entropy and accuracy over real examples / labelled tokens (label -1 ignored)."""
  loss, accuracy, count = loss_and_accuracy(logits, batch['labels'], batch['weights'])
  return loss, {'loss': loss, 'accuracy': accuracy, 'examples': count}


def argmax(logits):
  return jnp.argmax(logits, -1)


def identity(outputs):
  return outputs


ACCURACY = (('accuracy', 'acc', '{:.1%}'),)


class Task(trainable.Trainable):
  """A head on any registered kind, as the engine trains it: the task's ``loss(outputs,
  batch) -> (loss, metrics)`` and ``predict(outputs) -> predictions`` of the head's outputs
  (``outputs``: what ``model.apply`` returns, e.g. logits)."""
  metric_weights = {'loss': 'examples', 'accuracy': 'examples'}

  def __init__(self, model: nn.Module, network: models.Network, max_len: int, loss, predict,
               console_metrics=ACCURACY):
    super().__init__('threefry')
    self.model, self.network, self.max_len = model, network, max_len
    self._loss, self._predict, self.console_metrics = loss, predict, console_metrics

  def _dummy(self):
    ids = jnp.zeros((1, self.max_len), jnp.int32)
    return ids, ids, ids

  def init(self, rng):
    return self.model.init(rng, *self._dummy())['params']

  def logits(self, params, batch, rng=None, train: bool = False):
    """The head's outputs for a batch (dropout when ``train``)."""
    rngs = {'dropout': self.dropout_key(rng)} if train else {}
    packed = base.packed_inputs(self.network, batch)  # Packed rows: logits per example.
    return self.model.apply({'params': params}, batch['input_ids'], batch['segment_ids'],
                            batch['input_mask'], deterministic=not train, rngs=rngs, **packed)

  def loss_fn(self, params, batch, rng, phase, train):
    del phase
    return self._loss(self.logits(params, batch, rng, train), batch)

  def predict(self, params, batch):
    return self._predict(self.logits(params, batch))

  def flops_per_sequence(self, phase: length_phases.Phase) -> float:
    return self.network.flops_per_token(phase.seq_len) * phase.seq_len

  def downstream(self, params):
    return self.network, {k: v for k, v in params.items() if k not in heads.HEAD_PARTS}


def phase(max_len: int) -> length_phases.Phase:
  """Fine-tuning has one phase at ``max_len`` (no masked positions)."""
  return length_phases.Phase(index=0, start_step=0, end_step=0, seq_len=max_len, max_predictions=0)
