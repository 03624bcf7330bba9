"""optax optimizer and learning-rate schedule from an :class:`Optim` (BERT recipe defaults).

The one optimizer builder of pretraining and fine-tuning. Each config schema makes its
:class:`Optim` (``steps.RunSpec.optim``): pretraining's ``optim`` section names its warmup
in steps (:func:`of_pretraining`), fine-tuning's as a fraction of the steps, which its
adapter turns into steps once the data says how many there are.
"""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
import optax


SCHEDULES = ('linear', 'cosine', 'wsd')


@dataclasses.dataclass(frozen=True)
class Optim:
  """What builds the optimizer and its schedule; the defaults are BERT's."""
  learning_rate: float
  warmup_steps: int
  name: str = 'adamw'
  schedule: str = 'linear'
  decay_fraction: float = 0.2
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-6
  weight_decay: float = 0.01
  grad_clip_norm: float = 1.0

  @classmethod
  def of(cls, section: ml_collections.ConfigDict, warmup_steps: int) -> 'Optim':
    """The fields a config's ``optim`` section declares (the others keep their defaults:
    fine-tuning declares no schedule), with the warmup in steps."""
    names = {f.name for f in dataclasses.fields(cls)} - {'warmup_steps'}
    return cls(warmup_steps=int(warmup_steps), **{k: section[k] for k in names if k in section})


def of_pretraining(optim: ml_collections.ConfigDict) -> Optim:
  """A pretraining config's ``optim`` section (its warmup is ``warmup_steps``)."""
  return Optim.of(optim, int(optim.warmup_steps))


def schedule(o: Optim, num_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to the peak over ``warmup_steps``, then ``optim.schedule``:

  * ``'linear'`` (BERT): linear decay to 0 at ``num_steps``; with ``warmup_steps`` =
    ``num_steps / 2`` this is the triangular one-cycle schedule (Cramming).
  * ``'cosine'``: cosine decay to 0 at ``num_steps``.
  * ``'wsd'`` (warmup-stable-decay; MiniCPM, ModernBERT): the peak held, then a linear
    decay to 0 over the last ``decay_fraction`` of the steps.
  """
  warmup = o.warmup_steps
  if not 0 <= warmup <= num_steps:
    raise ValueError(f'config.optim.warmup_steps={warmup} must be in [0, train.num_steps='
                     f'{num_steps}]')
  peak, kind = o.learning_rate, o.schedule
  after = max(num_steps - warmup, 1)
  pieces, boundaries = [optax.linear_schedule(0.0, peak, max(warmup, 1))], [warmup]
  if kind == 'linear':
    pieces.append(optax.linear_schedule(peak, 0.0, after))
  elif kind == 'cosine':
    pieces.append(optax.cosine_decay_schedule(peak, after))
  elif kind == 'wsd':
    fraction = float(o.decay_fraction)
    if not 0 < fraction <= 1:
      raise ValueError(f'config.optim.decay_fraction={fraction}; expected in (0, 1]')
    decay = max(1, min(after, int(round(fraction * num_steps))))
    pieces += [optax.constant_schedule(peak), optax.linear_schedule(peak, 0.0, decay)]
    boundaries.append(warmup + after - decay)
  else:
    raise ValueError(f'config.optim.schedule={kind!r}; expected one of {SCHEDULES}')
  return optax.join_schedules(pieces, boundaries)


def decay_mask(params):
  """Weight decay on weight matrices only: not on LayerNorm parameters and biases."""
  def keep(path, _):
    names = [str(getattr(k, 'key', getattr(k, 'name', ''))) for k in path]
    return not any('layer_norm' in n or 'bias' in n for n in names)
  return jax.tree_util.tree_map_with_path(keep, params)


def build(o: Optim, num_steps: int) -> optax.GradientTransformation:
  """AdamW or LAMB on :func:`schedule`, weight decay on weight matrices only, after global
  gradient-norm clipping."""
  lr = schedule(o, num_steps)
  if o.name == 'adamw':
    opt = optax.adamw(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                      mask=decay_mask)
  elif o.name == 'lamb':
    opt = optax.lamb(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                     mask=decay_mask)
  else:
    raise ValueError(f'config.optim.name={o.name!r}; expected "adamw" or "lamb"')
  if o.grad_clip_norm < 0:
    raise ValueError(f'config.optim.grad_clip_norm={o.grad_clip_norm}; expected >= 0')
  if o.grad_clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(o.grad_clip_norm), opt)
  return opt
