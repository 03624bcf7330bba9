"""The training state and how it is created, sharded and described abstractly.

Separate from the training loop (``run/pretraining.py``, which pulls in the input
pipeline) so that loading a checkpoint (``encoder_jax.load``, the CLIs) never imports the
loop. The params tree is what pretraining trains
(``objectives.build(config).init``): one network, or several in one tree.

A run may also start from another model (continued pretraining, ``config.init``): a
:class:`Source` (built above this layer, by ``encoder_jax.api.pretrain``, from a workdir or a
Hugging Face directory) gives its network and tokenizer to the config (:func:`adopt`) and
its weights to the new params tree (:func:`start_params`), part by part.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from encoder_jax.config import schema as config_base
from encoder_jax import objectives
from encoder_jax.core import sharding

# Independent random streams derived from config.seed.
INIT, TRAIN, EVAL = 0, 1, 2


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  # Not trained, carried from step to step (the trainable's ``init_extra``, e.g. XLNet's
  # Transformer-XL memory) and checkpointed; None for trainables without (most): their
  # checkpoints then hold no such item.
  extra: Any = None


def _boxed_init_fn(trainable, tx, batch_size: int):
  def init(rng):
    params = trainable.init(rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      extra=trainable.init_extra(batch_size))
  return init


def shardings(trainable, tx, mesh, batch_size: int):
  """(abstract boxed TrainState, NamedSharding tree of the unboxed TrainState) of what
  ``trainable`` trains with ``tx``; ``batch_size``: the global rows of a step (the trainable's
  extra state has one row per batch row)."""
  boxed = jax.eval_shape(_boxed_init_fn(trainable, tx, int(batch_size)), jax.random.key(0))
  return boxed, sharding.shardings_of(boxed, mesh)


def abstract_of(boxed, shards):
  """ShapeDtypeStructs with ``shards`` of an abstract boxed tree (a TrainState: what
  :func:`shardings` gave, nothing traced again; or params alone)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      nn.unbox(boxed), shards)


def create(trainable, tx, mesh, batch_size: int, rng, params=None, shards=None) -> TrainState:
  """A new sharded TrainState (step 0): initialised from ``rng``, or from ``params`` (a
  host or global tree) when given. ``shards``: :func:`shardings`'s for the same arguments
  (not traced again)."""
  if shards is None:
    _, shards = shardings(trainable, tx, mesh, batch_size)
  if params is None:
    init = _boxed_init_fn(trainable, tx, int(batch_size))
    return jax.jit(lambda r: nn.unbox(init(r)), out_shardings=shards)(rng)
  new = lambda p: TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p),
                             extra=nn.unbox(trainable.init_extra(int(batch_size))))
  return jax.jit(new, in_shardings=(shards.params,), out_shardings=shards)(params)


def init_rng(seed: int):
  """The key a pretraining run's params are initialised from."""
  return jax.random.fold_in(jax.random.key(seed), INIT)


def abstract_params(config: ml_collections.ConfigDict, mesh, trainable=None):
  """ShapeDtypeStructs (with shardings on ``mesh``) of the params alone (no optimizer)."""
  trainable = trainable or objectives.build(config)
  boxed = jax.eval_shape(trainable.init, jax.random.key(0))
  return abstract_of(boxed, sharding.shardings_of(boxed, mesh))


def initial_extra(trainable, batch_size: int, shards: TrainState):
  """The trainable's fresh (sharded) ``TrainState.extra``, or None if it carries none."""
  if shards.extra is None:
    return None
  make = lambda: nn.unbox(trainable.init_extra(int(batch_size)))
  return jax.jit(make, out_shardings=shards.extra)()


# --------------------------------------------------------------- continued pretraining

# Model fields a run started from a source may set apart from the source's: how the network
# runs, not what its parameters are. Every other field of config.model is the source's.
RUN_MODEL_FIELDS = ('hidden_dropout_rate', 'attention_dropout_rate', 'dtype', 'remat',
                    'scan_unroll', 'attention_implementation')


@dataclasses.dataclass
class Source:
  """The model a pretraining run starts from (``config.init``): what it gives the run."""
  key: str  # The config key that names it, for messages: "config.init.hf_dir='...'".
  description: str  # Where the weights come from, e.g. 'WORKDIR step 40'.
  model: dict  # Its config.model (every field).
  tokenizer: Any  # Its tokenizer (data.tokenizer.Tokenizer): the new corpus is prepared with it.
  # () -> (host params tree of what the run trains, the top-level parts the source holds
  # untrained, e.g. the MLM head an import of a sentence-transformers model initialised, and
  # why). Called only for a fresh start (a resume reads the run's own checkpoint).
  load: Callable[[], tuple[Any, dict[str, str]]]
  step: int | None = None  # Its checkpoint step (None: a Hugging Face directory).


def _plain(value):
  return tuple(value) if isinstance(value, list) else value


def adopt(config: ml_collections.ConfigDict, source: Source | None
          ) -> ml_collections.ConfigDict:
  """``config`` with the source's network (``config.model``) and tokenizer (its file
  prepares the new corpus); ``config`` itself when ``source`` is None. A network field the
  config sets (apart from its default) to another value than the source's is refused by
  name, before any work; :data:`RUN_MODEL_FIELDS` the config sets are kept. Idempotent."""
  if source is None:
    return config
  defaults = config_base.base_config()
  out = ml_collections.ConfigDict(config.to_dict())
  conflicts = []
  for key, theirs in source.model.items():
    if key not in out.model:
      continue
    mine, default, theirs = (_plain(v) for v in (config.model[key], defaults.model[key], theirs))
    if key in RUN_MODEL_FIELDS:
      if mine == default:
        out.model[key] = theirs
    elif mine not in (default, theirs):
      conflicts.append(f'config.model.{key}={mine!r} (the source has {theirs!r})')
    else:
      out.model[key] = theirs
  tok, t = source.tokenizer, config.tokenizer
  if str(t.path) and str(t.path) != str(tok.path):
    conflicts.append(f'config.tokenizer.path={str(t.path)!r} (the source\'s is {tok.path!r})')
  if str(t.kind) not in (defaults.tokenizer.kind, str(tok.kind)):
    conflicts.append(f'config.tokenizer.kind={str(t.kind)!r} (the source\'s is {tok.kind!r})')
  if conflicts:
    raise ValueError(
        f'{source.key}: the run takes its network and tokenizer from {source.description}; '
        'the config sets ' + '; '.join(conflicts) + '. Leave these fields unset (or equal to '
        "the source's); only " + ', '.join(RUN_MODEL_FIELDS) + ' of config.model may differ.')
  out.tokenizer.update(kind=str(tok.kind), path=str(tok.path), lowercase=bool(tok.lowercase))
  return out


def _shapes(tree):
  return jax.tree.map(lambda x: tuple(x.shape), tree)


def start_params(trainable, rng, theirs, untrained: dict[str, str]) -> tuple[Any, dict]:
  """(host params, report): the one rule of every run that starts from pretrained parts
  (continued pretraining, fine-tuning). The trainable's params tree (initialised from ``rng``)
  takes every top-level part that ``theirs`` holds trained, at the same shapes, as it is;
  the others are freshly initialised, each with why: not in the source, untrained there
  (``untrained``: part -> why, e.g. a task's head or a head an import initialised), or of
  other shapes there. ``report``: ``taken`` (parts), ``initialised`` (part -> why) and
  ``unused`` (the source's parts the trainable has no place for)."""
  shapes = _shapes(nn.unbox(jax.eval_shape(trainable.init, rng)))
  theirs = jax.device_get(theirs)
  taken, fresh = [], {}
  for part in sorted(shapes):
    if part in untrained:
      fresh[part] = untrained[part]
    elif part not in theirs:
      fresh[part] = 'not in the source'
    elif _shapes(theirs[part]) != shapes[part]:
      fresh[part] = f'other shapes in the source: {_shapes(theirs[part])}'
    else:
      taken.append(part)
  # The fresh parts only: the same values as the whole init's (one key, split the same
  # way); the taken parts' initialisation is never computed.
  params = dict(jax.device_get(jax.jit(
      lambda r: {k: v for k, v in nn.unbox(trainable.init(r)).items() if k in fresh})(rng)))
  params.update({part: theirs[part] for part in taken})
  return params, dict(taken=taken, initialised=fresh,
                      unused=sorted(set(theirs) - set(shapes)))


def parts_lines(report: dict) -> list[str]:
  """The console's lines for the parts of a :func:`start_params` report."""
  lines = ['taken from the source: ' + (', '.join(report['taken']) or 'nothing')]
  if report['initialised']:
    lines.append('freshly initialised: ' + ', '.join(
        f'{part} ({why})' for part, why in report['initialised'].items()))
  if report['unused']:
    lines.append('in the source, not used: ' + ', '.join(report['unused']))
  return lines


def report_lines(report: dict) -> list[str]:
  """The console's lines for a continued-pretraining start (``init_report.json``)."""
  m = report['network']
  return [f'starting from {report["source"]} ({report["init"]}): its network '
          f'({m["kind"]}, {m["num_layers"]} x {m["hidden_size"]}) and '
          f'{report["tokenizer"]["kind"]} tokenizer; a fresh optimizer'] + [
              '  ' + line for line in parts_lines(report)]
