"""Sentence-BERT (Reimers & Gurevych, 2019): the siamese network, its task, its data.

See ``encoder_jax.finetune.sbert`` for the command, the objectives and the export.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoder_jax import inference
from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import task as task_lib
from encoder_jax.models import layers
from encoder_jax.models import registry as models

OBJECTIVES = ('classification', 'contrastive')
SIDES = ('', 'b_', 'c_')  # Array-name prefixes of the first, second and third text.


class Siamese(nn.Module):
  """One encoder for every side (rows of all sides stacked on the batch axis, one pass),
  pooled; ``classify``: the softmax head on (u, v, |u - v|) of the first two sides."""
  config: object
  pooling: str = 'mean'
  cls_index: int = 0
  num_labels: int = 0

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, *, deterministic: bool = True,
               classify: bool = False):
    c = self.config
    out = models.get(c.kind).encode(c, input_ids, segment_ids, input_mask,
                                    deterministic=deterministic, pool=False)
    emb = inference.pool(out['sequence_output'], input_mask, self.pooling, self.cls_index)
    if not classify:
      return emb
    u, v = jnp.split(emb[:2 * (emb.shape[0] // 2)], 2)
    features = jnp.concatenate([u, v, jnp.abs(u - v)], axis=-1)
    return layers.Dense((3 * emb.shape[-1],), (self.num_labels,), ('embed',), (None,),
                        c.initializer_range, jnp.float32, name='classifier')(features)


def _stack(batch, sides):
  return [jnp.concatenate([batch[f'{p}{k}'] for p in sides])
          for k in ('input_ids', 'segment_ids', 'input_mask')]


class SiameseTask(task_lib.Task):
  """The engine's contract for Sentence-BERT: loss of the chosen objective; prediction =
  the cosine of the first two sides (scored against the gold similarity)."""

  def __init__(self, model: Siamese, network, max_len: int, objective: str, sides: int,
               scale: float = 20.0):
    super().__init__('sentence_embedding', model, network, max_len)
    self.objective, self.sides, self.scale = objective, sides, scale
    self.console_metrics = (('accuracy', 'acc', '{:.1%}'),)

  def init(self, rng):
    ids = jnp.zeros((2, self.max_len), jnp.int32)
    return self.model.init(rng, ids, ids, ids,
                           classify=self.objective == 'classification')['params']

  def loss_fn(self, params, batch, rng, phase, train):
    del phase
    rngs = {'dropout': self.dropout_key(rng)} if train else {}
    w = batch['weights']
    n = w.shape[0]
    if self.objective == 'classification':
      logits = self.model.apply({'params': params}, *_stack(batch, SIDES[:2]),
                                deterministic=not train, classify=True, rngs=rngs)
      loss, accuracy, count = task_lib.loss_and_accuracy(logits, batch['labels'], w)
      return loss, {'loss': loss, 'accuracy': accuracy, 'examples': count}
    emb = self.model.apply({'params': params}, *_stack(batch, SIDES[:self.sides]),
                           deterministic=not train, rngs=rngs)
    emb = inference.l2_normalize(emb)
    anchors, candidates = emb[:n], emb[n:]  # Positives, then hard negatives.
    scores = self.scale * anchors @ candidates.T  # [B, B * (sides - 1)]
    real = jnp.tile(w > 0, self.sides - 1)
    scores = jnp.where(real[None, :], scores, -1e9)  # Padding rows are no candidates.
    loss, accuracy, count = task_lib.loss_and_accuracy(scores, jnp.arange(n), w)
    return loss, {'loss': loss, 'accuracy': accuracy, 'examples': count}

  def predict(self, params, batch):
    emb = inference.l2_normalize(self.model.apply({'params': params}, *_stack(batch, SIDES[:2])))
    n = batch['input_ids'].shape[0]
    return (emb[:n] * emb[n:]).sum(-1)


# ---------------------------------------------------------------------------- data


def read(spec: str, fields: tuple[str, ...], label_field: str | None,
         data_config: ml_collections.ConfigDict) -> tuple[list[tuple[str, ...]], list, int]:
  """(texts per row, labels or [], rows skipped for a missing gold label)."""
  rows, _ = data_lib.read_rows(spec, data_config, [label_field] if label_field else [])
  texts, labels, skipped = [], [], 0
  for r in rows:
    if label_field:
      label = data_lib.field(r, label_field, spec)
      if isinstance(label, (int, np.integer)) and int(label) < 0:  # SNLI: no gold label.
        skipped += 1
        continue
      labels.append(label)
    texts.append(tuple(str(data_lib.field(r, f, spec)) for f in fields))
  if not texts:
    raise ValueError(f'{spec!r} has no usable rows ({skipped} without a gold label)')
  return texts, labels, skipped


def encode(tok, texts: list[tuple[str, ...]], max_len: int, sides: int) -> dict[str, np.ndarray]:
  out = {}
  for k, prefix in enumerate(SIDES[:sides]):
    x = tok.encode_inputs([t[k] for t in texts], max_len=max_len, length=max_len)
    out.update({f'{prefix}{name}': x[name] for name in ('input_ids', 'segment_ids',
                                                        'input_mask')})
  return out
