"""What an objective is, and how several are combined into one ``loss_fn``.

An objective may corrupt the batch before the network runs (MLM masks tokens) and reads
the network's outputs afterwards (a loss and metrics). ``Composite`` runs every
objective's corruption, the network once, and sums the losses, so MLM + NSP is
composition, not a branch in the training loop.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections

from encoder_jax import schedule

Batch = dict[str, jax.Array]

# Generators for dropout masks. Threefry gives the same bits on any mesh but is slow
# inside the scanned layer body on XLA:CPU; 'rbg' (XLA's RngBitGenerator) is fast.
DROPOUT_RNG_IMPLS = {'threefry': 'threefry2x32', 'rbg': 'rbg'}
Metrics = dict[str, jax.Array]


class Objective:
  """Base class of the registry entries (``objectives.REGISTRY``)."""
  name: str = ''
  # data.pair_kind values whose batches this objective can learn from (None = any).
  pair_kinds: tuple[str, ...] | None = None
  # Metrics that are means over a per-batch count, e.g. {'mlm_loss': 'mlm_predictions'}:
  # averaging over batches weights each batch by that count (a per-token mean).
  metric_weights: dict[str, str] = {}

  def corrupt(self, batch: Batch, rng: jax.Array, phase: schedule.Phase) -> Batch:
    del rng, phase
    return batch

  def loss(self, outputs: dict[str, Any], batch: Batch) -> tuple[jax.Array, Metrics]:
    raise NotImplementedError

  def summarize(self, metrics: dict[str, float]) -> dict[str, float]:
    """Metrics derived from the aggregated held-out metrics (e.g. perplexity)."""
    return {}


def cross_entropy(logits_NxC: jax.Array, labels_N: jax.Array, weights_N: jax.Array):
  """Weighted mean negative log-likelihood and accuracy (weights 0 = ignored)."""
  logp_NxC = jax.nn.log_softmax(logits_NxC.astype(jnp.float32), axis=-1)
  nll_N = -jnp.take_along_axis(logp_NxC, labels_N[..., None], axis=-1)[..., 0]
  correct_N = (jnp.argmax(logits_NxC, -1) == labels_N).astype(jnp.float32)
  denom = jnp.maximum(weights_N.sum(), 1.0)
  return (nll_N * weights_N).sum() / denom, (correct_N * weights_N).sum() / denom


class Composite:
  """``loss_fn(params, batch, rng, phase, train)`` for a list of objectives and a model."""

  def __init__(self, objectives: list[Objective], apply_fn: Callable[..., dict],
               dropout_rng_impl: str = 'threefry'):
    if dropout_rng_impl not in DROPOUT_RNG_IMPLS:
      raise ValueError(f'config.train.dropout_rng_impl={dropout_rng_impl!r}; expected one of '
                       f'{list(DROPOUT_RNG_IMPLS)}')
    self.objectives = objectives
    self.apply_fn = apply_fn
    self.dropout_rng_impl = DROPOUT_RNG_IMPLS[dropout_rng_impl]

  def _dropout_key(self, rng: jax.Array) -> jax.Array:
    """A dropout key of the configured generator, seeded from ``rng`` (so still per step)."""
    if self.dropout_rng_impl == 'threefry2x32':
      return rng
    return jax.random.key(jax.random.bits(rng, dtype=jnp.uint32), impl=self.dropout_rng_impl)

  def loss_fn(self, params, batch: Batch, rng: jax.Array, phase: schedule.Phase,
              train: bool) -> tuple[jax.Array, Metrics]:
    rngs = jax.random.split(rng, len(self.objectives) + 1)
    for objective, key in zip(self.objectives, rngs[1:]):
      batch = objective.corrupt(batch, key, phase)
    positions = batch.get('masked_positions')
    if positions is None:  # No token-level objective: run the MLM head on one position only.
      positions = jnp.zeros((batch['input_ids'].shape[0], 1), jnp.int32)
    outputs = self.apply_fn(
        {'params': params}, batch.get('masked_input_ids', batch['input_ids']),
        batch['segment_ids'], batch['input_mask'], positions, deterministic=not train,
        rngs={'dropout': self._dropout_key(rngs[0])} if train else None)
    total, metrics = jnp.float32(0.0), {}
    for objective in self.objectives:
      loss, m = objective.loss(outputs, batch)
      total = total + loss
      metrics.update(m)
    metrics['loss'] = total
    return total, metrics

  @property
  def metric_weights(self) -> dict[str, str]:
    return {k: v for o in self.objectives for k, v in o.metric_weights.items()}

  def summarize(self, metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for o in self.objectives for k, v in o.summarize(metrics).items()}


def check_pair_kind(objectives: list[Objective], data_config: ml_collections.ConfigDict):
  for o in objectives:
    if o.pair_kinds is not None and data_config.pair_kind not in o.pair_kinds:
      raise ValueError(
          f'config.objective.names includes {o.name!r}, which needs config.data.pair_kind in '
          f'{list(o.pair_kinds)}; got {data_config.pair_kind!r}')
