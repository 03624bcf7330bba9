"""What a run is built from: its settings (:class:`RunSpec`) and the pieces every run, every
compile of a run (``encoder_jax.compile``), the tests and the benchmarks build from them
(:class:`Pieces`, :func:`build`): the optimizer and its schedule, the state's shardings, the
batch check and the train step.

One builder for each: ``engine.run`` trains with a :class:`Pieces`, ``tpu.aot`` compiles
the train step of one, so what ``compile`` reports is the program ``main`` runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from encoder_jax.core import length_phases
from encoder_jax.core import optimizer as optimizer_lib
from encoder_jax.core import sharding
from encoder_jax.run import train_state

TrainState = train_state.TrainState
_TRAIN = train_state.TRAIN


@dataclasses.dataclass(frozen=True)
class Checkpointing:
  every_steps: int
  keep: int
  async_save: bool = False


@dataclasses.dataclass(frozen=True)
class Keys:
  """Where a schema sets what errors name (pretraining's by default)."""
  nonfinite_policy: str = 'config.train.nonfinite_policy'
  batch_size: str = 'config.train.batch_size / grad_accum_steps'


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """A run's settings, whichever schema they come from."""
  seed: int
  batch_size: int  # Rows of a step (global; accumulated over grad_accum_steps micro-batches).
  num_steps: int
  optim: optimizer_lib.Optim
  mesh: Any  # The mesh section (config_base.MESH's fields).
  checkpoint: Checkpointing
  grad_accum_steps: int = 1
  nonfinite_policy: str = 'stop'
  compilation_cache_dir: str = 'auto'
  peak_tflops_per_device: float = 0.0
  profile_steps: int = 0
  profile_first_step: int = 1
  # True: batch_size is the global rows, of which each process feeds its share; False: each
  # process's batches side by side (one process: its batch).
  global_rows: bool = True
  keys: Keys = Keys()


def check_batch(spec: RunSpec, mesh) -> None:
  """Each micro-batch splits evenly over the mesh's data axes (refused by the spec's key)."""
  sharding.check_batch(spec.batch_size // spec.grad_accum_steps, mesh, spec.keys.batch_size)


@dataclasses.dataclass(frozen=True)
class Pieces:
  """A run's optimizer, schedule and state shardings for one trainable on one mesh, and
  the train step built from them."""
  spec: RunSpec
  trainable: Any  # trainable.Trainable: init, init_extra, losses, flops, metric weights.
  mesh: jax.sharding.Mesh
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  boxed: TrainState  # The abstract state, params boxed with their logical axes.
  shards: TrainState  # NamedShardings of the (unboxed) state.

  def abstract_state(self) -> TrainState:
    """ShapeDtypeStructs with the state's shardings: a restore's target, a lowering's input."""
    return train_state.abstract_of(self.boxed, self.shards)

  def create_state(self, rng=None, params=None) -> TrainState:
    """A new sharded state (step 0): its params drawn from ``rng`` (the key of the spec's
    seed, ``train_state.init_rng``, unless given), or ``params`` (host or global) as given."""
    rng = train_state.init_rng(self.spec.seed) if rng is None else rng
    return train_state.create(self.trainable, self.tx, self.mesh, self.spec.batch_size, rng,
                              params, shards=self.shards)

  def train_step(self, phase: length_phases.Phase):
    """The jitted ``(state, batch) -> (state, metrics)`` of ``phase``."""
    s = self.spec
    return _train_step(self.trainable, self.tx, self.schedule, self.mesh, self.shards, phase,
                       seed=s.seed, grad_accum_steps=s.grad_accum_steps,
                       nonfinite_policy=s.nonfinite_policy)


def build(spec: RunSpec, trainable, mesh, tx: optax.GradientTransformation | None = None
          ) -> Pieces:
  """The :class:`Pieces` of ``spec`` for ``trainable`` on ``mesh`` (the batch checked first;
  the trainable's init is traced once, for the shardings). ``tx``: the spec's optimizer
  (``optimizer.build``) unless given, e.g. one wrapped to keep what a test inspects."""
  check_batch(spec, mesh)
  tx = optimizer_lib.build(spec.optim, spec.num_steps) if tx is None else tx
  boxed, shards = train_state.shardings(trainable, tx, mesh, spec.batch_size)
  return Pieces(spec, trainable, mesh, tx, optimizer_lib.schedule(spec.optim, spec.num_steps),
                boxed, shards)


def _train_step(trainable, tx, schedule_fn, mesh, shards, phase: length_phases.Phase, *,
                seed: int, grad_accum_steps: int = 1, nonfinite_policy: str = 'stop'):
  """A jitted ``(state, batch) -> (state, metrics)`` for one sequence-length phase:
  ``grad_accum_steps`` micro-batches, the update dropped on a non-finite loss or gradient
  when ``nonfinite_policy`` is 'skip', dropout and masks drawn from ``fold_in(key(seed),
  step)``."""
  accum = int(grad_accum_steps)
  skip_nonfinite = nonfinite_policy == 'skip'
  base_key = jax.random.fold_in(jax.random.key(seed), _TRAIN)
  # ``extra``: the trainable's non-trained state carried across steps (None for most setups),
  # one row per batch row, read and renewed by ``stateful_loss_fn``.
  grad_fn = jax.value_and_grad(trainable.stateful_loss_fn, has_aux=True)

  def micro_step(params, extra, batch, rng):
    # Traced under the step's mesh (abstract: axis names and sizes), which the kernels that
    # must be placed explicitly read (splash attention's shard_map); nothing else reads it.
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      (_, (m, extra)), g = grad_fn(params, extra, batch, rng, phase, True)
    return (g, m), extra

  def step_fn(state: TrainState, batch):
    rng = jax.random.fold_in(base_key, state.step)
    if accum == 1:
      (grads, m), extra = micro_step(state.params, state.extra, batch, rng)
    else:
      # Micro-batch i takes rows i, i+A, i+2A, ...: every device keeps its share of each.
      split = lambda tree: jax.tree.map(
          lambda x: x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1), tree)
      micro, micro_extra = split(batch), split(state.extra)
      first = lambda tree: jax.tree.map(lambda x: x[0], tree)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), jax.eval_shape(
          micro_step, state.params, first(micro_extra), first(micro), rng)[0])

      def body(carry, xs):
        i, mb, me = xs
        out, extra = micro_step(state.params, me, mb, jax.random.fold_in(rng, i))
        return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), carry, out), extra

      (grads, m), extra = jax.lax.scan(body, zeros, (jnp.arange(accum), micro, micro_extra))
      extra = jax.tree.map(  # Back to rows i, i+A, ... of micro-batch i.
          lambda x: x.swapaxes(0, 1).reshape(-1, *x.shape[2:]), extra)
      grads, m = jax.tree.map(lambda x: x / accum, (grads, m))
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(m['loss']) & jnp.isfinite(grad_norm)
    if skip_nonfinite:  # Drop the update; the batch still counts as consumed.
      keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
      params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
      extra = keep(extra, state.extra)
    m = dict(m, grad_norm=grad_norm, learning_rate=schedule_fn(state.step),
             nonfinite=1.0 - finite.astype(jnp.float32))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state, extra=extra), m

  return jax.jit(step_fn, in_shardings=(shards, sharding.batch_sharding(mesh)),
                 out_shardings=(shards, None), donate_argnums=(0,))
