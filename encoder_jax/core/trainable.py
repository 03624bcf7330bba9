"""What the training engine trains: the contract of a pretraining setup and a fine-tuning task.

The engine (``engine.run``: its train step, loop, ``train_state`` and checkpoints)
needs of what it trains only this: its params' initialisation, one differentiable
``loss_fn(params, batch, rng, phase, train)``, any state carried between steps, the FLOPs
of a step (MFU), how its metrics average and show, and which network serves downstream.
A pretraining setup (``objectives.base.Pretraining``: objectives, exports, fill-mask) and a
fine-tuning task (``finetune.task.Task``: a head and its loss) each extend it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

# Generators of the dropout keys (config.train.dropout_rng_impl). Each dropout hashes its
# mask from two words of its key (``models.layers.random_words``), so the generator draws
# a few words per layer, not a bit per element: either is cheap. Threefry's values are the
# same on any mesh; JAX does not promise that of 'rbg' (XLA's RngBitGenerator).
DROPOUT_RNG_IMPLS = {'threefry': 'threefry2x32', 'rbg': 'rbg'}


class Trainable:
  """The contract between what is trained and the training engine. ``phase``: the
  ``length_phases.Phase`` of the step (sequence length, masked positions)."""
  # Metrics that are means over a per-batch count, e.g. {'mlm_loss': 'mlm_predictions'}:
  # averaging over batches weights each batch by that count (a per-token mean).
  metric_weights: dict[str, str] = {}
  # The metrics shown on the console's progress line, as (metric key, short name, format),
  # after the loss; the rest goes to metrics.jsonl / TensorBoard.
  console_metrics: tuple[tuple[str, str, str], ...] = ()

  def __init__(self, dropout_rng_impl: str = 'threefry'):
    if dropout_rng_impl not in DROPOUT_RNG_IMPLS:
      raise ValueError(f'config.train.dropout_rng_impl={dropout_rng_impl!r}; expected one of '
                       f'{list(DROPOUT_RNG_IMPLS)}')
    self.dropout_rng_impl = DROPOUT_RNG_IMPLS[dropout_rng_impl]

  def init(self, rng: jax.Array) -> Any:
    """Boxed (logically partitioned) params of every network, one tree."""
    raise NotImplementedError

  def loss_fn(self, params, batch: dict[str, jax.Array], rng: jax.Array, phase,
              train: bool) -> tuple[jax.Array, dict[str, jax.Array]]:
    raise NotImplementedError

  def init_extra(self, batch_size: int) -> Any:
    """State carried from one training step to the next that is not trained (boxed arrays
    with a leading batch axis of ``batch_size`` rows, e.g. XLNet's Transformer-XL memory),
    or None. It lives in ``TrainState.extra`` and is checkpointed with the params."""
    del batch_size
    return None

  def stateful_loss_fn(self, params, extra, batch: dict[str, jax.Array], rng: jax.Array,
                       phase, train: bool):
    """What the training step differentiates: ``(loss, (metrics, new extra))``. Setups
    without ``init_extra`` state are their ``loss_fn``; evaluation calls ``loss_fn``."""
    loss, metrics = self.loss_fn(params, batch, rng, phase, train)
    return loss, (metrics, extra)

  def flops_per_sequence(self, phase) -> float:
    """Training FLOPs (forward + backward) of one sequence at this phase, every network."""
    raise NotImplementedError

  def downstream(self, params) -> tuple[Any, Any]:
    """The network (``models.Network``) and its params subtree for features and
    fine-tuning."""
    raise NotImplementedError

  def summarize(self, metrics: dict[str, float]) -> dict[str, float]:
    """Metrics derived from the aggregated held-out metrics (e.g. perplexity)."""
    del metrics
    return {}

  def dropout_key(self, rng: jax.Array) -> jax.Array:
    """A dropout key of the configured generator, seeded from ``rng`` (so still per step)."""
    if self.dropout_rng_impl == 'threefry2x32':
      return rng
    return jax.random.key(jax.random.bits(rng, dtype=jnp.uint32), impl=self.dropout_rng_impl)
