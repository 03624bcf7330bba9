"""The training state and how it is created, sharded and described abstractly.

Separate from the training loop (``train.py``, which pulls in the input pipeline) so that
loading a checkpoint (``encoder_jax.load``, the CLIs) and importing Hugging Face weights
never import the loop. The params tree is the pretraining setup's
(``objectives.build(config).init``): one network, or several in one tree.
"""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from encoder_jax import objectives
from encoder_jax import optimizer as optimizer_lib
from encoder_jax import sharding

# Independent random streams derived from config.seed.
INIT, TRAIN, EVAL = 0, 1, 2


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  # Not trained, carried from step to step (the setup's ``init_extra``, e.g. XLNet's
  # Transformer-XL memory) and checkpointed; None for setups without (most), whose state
  # and checkpoints are then exactly what they were before this field existed.
  extra: Any = None


def _boxed_init_fn(setup, tx, batch_size: int):
  def init(rng):
    params = setup.init(rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      extra=setup.init_extra(batch_size))
  return init


def state_shardings(config: ml_collections.ConfigDict, mesh, setup=None, tx=None):
  """(abstract boxed TrainState, NamedSharding tree of the unboxed TrainState)."""
  setup = setup or objectives.build(config)
  tx = tx or optimizer_lib.make(config)
  boxed = jax.eval_shape(_boxed_init_fn(setup, tx, int(config.train.batch_size)),
                         jax.random.key(0))
  return boxed, sharding.shardings_of(boxed, mesh)


def abstract_state(config: ml_collections.ConfigDict, mesh, setup=None, tx=None) -> TrainState:
  """ShapeDtypeStructs with shardings: the target of a checkpoint restore."""
  boxed, shards = state_shardings(config, mesh, setup, tx)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      nn.unbox(boxed), shards)


def abstract_params(config: ml_collections.ConfigDict, mesh, setup=None):
  """ShapeDtypeStructs (with shardings on ``mesh``) of the params alone (no optimizer)."""
  setup = setup or objectives.build(config)
  boxed = jax.eval_shape(setup.init, jax.random.key(0))
  shards = sharding.shardings_of(boxed, mesh)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      nn.unbox(boxed), shards)


def create_train_state(config: ml_collections.ConfigDict, mesh, params=None, setup=None,
                       tx=None) -> TrainState:
  """A new sharded TrainState (step 0); from ``params`` if given (e.g. imported weights)."""
  setup = setup or objectives.build(config)
  tx = tx or optimizer_lib.make(config)
  _, shards = state_shardings(config, mesh, setup, tx)
  batch_size = int(config.train.batch_size)
  if params is None:
    init = _boxed_init_fn(setup, tx, batch_size)
    rng = jax.random.fold_in(jax.random.key(config.seed), INIT)
    return jax.jit(lambda r: nn.unbox(init(r)), out_shardings=shards)(rng)
  new = lambda p: TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p),
                             extra=nn.unbox(setup.init_extra(batch_size)))
  return jax.jit(new, in_shardings=(shards.params,), out_shardings=shards)(params)


def initial_extra(config: ml_collections.ConfigDict, mesh, setup, shards=None):
  """The setup's fresh (sharded) ``TrainState.extra``, or None if it carries none."""
  shards = shards if shards is not None else state_shardings(config, mesh, setup)[1]
  if shards.extra is None:
    return None
  make = lambda: nn.unbox(setup.init_extra(int(config.train.batch_size)))
  return jax.jit(make, out_shardings=shards.extra)()
