"""A fine-tuning task as the training engine sees it: head + loss + metrics.

:class:`Task` implements the same contract as a pretraining setup
(``objectives.base.Pretraining``: ``init``, ``loss_fn``, metric weights, console metrics,
FLOPs), so the engine's train step (``train.make_train_step``: mesh and sharding, the
model's dtype policy, gradient clipping through the optimizer, the non-finite policy),
its sharded state (``train_state``) and its Orbax checkpoints run it unchanged. The data
side is ``finetune.data`` (encoded arrays, :func:`epoch_batches`); the task metrics
(accuracy, macro-F1, span F1) are ``finetune.scores``, on the host over a whole split.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax import length_phases
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


def span_loss(logits_BxLx2, batch):
  """Question answering: the mean of the start and end cross-entropies (BERT's run_squad),
  each a softmax over the row's tokens (padding excluded), over real rows."""
  mask = batch['input_mask'] > 0
  w = batch['weights']
  logits = jnp.where(mask[..., None], logits_BxLx2.astype(jnp.float32), -1e9)
  logp = jax.nn.log_softmax(logits, axis=1)  # Over positions.
  losses, correct = [], []
  for i, key in enumerate(('start_positions', 'end_positions')):
    target = batch[key]
    losses.append(-jnp.take_along_axis(logp[..., i], target[:, None], axis=1)[:, 0])
    correct.append((jnp.argmax(logits[..., i], axis=1) == target).astype(jnp.float32))
  denom = jnp.maximum(w.sum(), 1.0)
  loss = ((losses[0] + losses[1]) / 2 * w).sum() / denom
  accuracy = ((correct[0] * correct[1]) * w).sum() / denom
  return loss, {'loss': loss, 'accuracy': accuracy, 'examples': w.sum()}


class Task(base.Pretraining):
  """Sequence or token classification, or sequence regression, on any registered kind."""
  metric_weights = {'loss': 'examples', 'accuracy': 'examples'}
  console_metrics = (('accuracy', 'acc', '{:.1%}'),)

  def __init__(self, name: str, model: nn.Module, network: models.Network, max_len: int):
    super().__init__('threefry')
    self.name, self.model, self.network, self.max_len = name, model, network, max_len
    self.regression = name == 'sequence_regression'
    self.spans = name == 'question_answering'
    if self.regression:
      self.console_metrics = ()

  def _dummy(self):
    ids = jnp.zeros((1, self.max_len), jnp.int32)
    return ids, ids, ids

  def init(self, rng):
    return self.model.init(rng, *self._dummy())['params']

  def logits(self, params, batch, rng=None, train: bool = False):
    rngs = {'dropout': self.dropout_key(rng)} if train else {}
    packed = base.packed_inputs(self.network, batch)  # Packed rows: logits per example.
    return self.model.apply({'params': params}, batch['input_ids'], batch['segment_ids'],
                            batch['input_mask'], deterministic=not train, rngs=rngs, **packed)

  def loss_fn(self, params, batch, rng, phase, train):
    del phase
    logits = self.logits(params, batch, rng, train)
    if self.spans:  # Start and end positions: a softmax over the row's real tokens each.
      return span_loss(logits, batch)
    if self.regression:  # Mean squared error of the one output, over real examples.
      w = batch['weights']
      loss = (jnp.square(logits[:, 0] - batch['labels']) * w).sum() / jnp.maximum(w.sum(), 1.0)
      return loss, {'loss': loss, 'examples': w.sum()}
    loss, accuracy, count = loss_and_accuracy(logits, batch['labels'], batch['weights'])
    return loss, {'loss': loss, 'accuracy': accuracy, 'examples': count}

  def predict(self, params, batch):
    logits = self.logits(params, batch)
    if self.spans:
      return logits
    return logits[:, 0] if self.regression else jnp.argmax(logits, -1)

  def flops_per_sequence(self, phase: length_phases.Phase) -> float:
    return self.network.flops_per_token(phase.seq_len) * phase.seq_len

  def downstream(self, params):
    return self.network, {k: v for k, v in params.items() if k not in heads.HEAD_PARTS}


def phase(max_len: int) -> length_phases.Phase:
  """Fine-tuning has one phase at ``max_len`` (no masked positions)."""
  return length_phases.Phase(index=0, start_step=0, end_step=0, seq_len=max_len, max_predictions=0)


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
  """The example order of an epoch: a function of (seed, epoch) alone, so a resumed run
  takes the same batches."""
  return np.random.default_rng([seed, epoch]).permutation(n)
