"""optax optimizer and learning-rate schedule from ``config.optim`` (BERT recipe defaults).

The one optimizer builder of pretraining and fine-tuning: fine-tuning's ``optim`` section
has the same fields (its defaults are BERT fine-tuning's), its warmup as a fraction of
the steps (``warmup_fraction``) instead of a count.
"""

from __future__ import annotations

import jax
import ml_collections
import optax


SCHEDULES = ('linear', 'cosine', 'wsd')


def learning_rate_schedule(optim: ml_collections.ConfigDict, num_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to the peak over ``warmup_steps``, then ``optim.schedule``:

  * ``'linear'`` (BERT): linear decay to 0 at ``num_steps``; with ``warmup_steps`` =
    ``num_steps / 2`` this is the triangular one-cycle schedule (Cramming).
  * ``'cosine'``: cosine decay to 0 at ``num_steps``.
  * ``'wsd'`` (warmup-stable-decay; MiniCPM, ModernBERT): the peak held, then a linear
    decay to 0 over the last ``decay_fraction`` of the steps.
  """
  warmup = warmup_steps(optim, num_steps)
  if not 0 <= warmup <= num_steps:
    raise ValueError(f'config.optim.warmup_steps={warmup} must be in [0, train.num_steps='
                     f'{num_steps}]')
  peak, kind = optim.learning_rate, optim.get('schedule', 'linear')
  after = max(num_steps - warmup, 1)
  pieces, boundaries = [optax.linear_schedule(0.0, peak, max(warmup, 1))], [warmup]
  if kind == 'linear':
    pieces.append(optax.linear_schedule(peak, 0.0, after))
  elif kind == 'cosine':
    pieces.append(optax.cosine_decay_schedule(peak, after))
  elif kind == 'wsd':
    fraction = float(optim.get('decay_fraction', 0.2))
    if not 0 < fraction <= 1:
      raise ValueError(f'config.optim.decay_fraction={fraction}; expected in (0, 1]')
    decay = max(1, min(after, int(round(fraction * num_steps))))
    pieces += [optax.constant_schedule(peak), optax.linear_schedule(peak, 0.0, decay)]
    boundaries.append(warmup + after - decay)
  else:
    raise ValueError(f'config.optim.schedule={kind!r}; expected one of {SCHEDULES}')
  return optax.join_schedules(pieces, boundaries)


def warmup_steps(optim: ml_collections.ConfigDict, num_steps: int) -> int:
  """``optim.warmup_steps``, or ``optim.warmup_fraction`` of ``num_steps`` where the config
  has that instead (fine-tuning's, whose step count follows from the data)."""
  if 'warmup_fraction' not in optim:
    return int(optim.warmup_steps)
  fraction = float(optim.warmup_fraction)
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f'config.optim.warmup_fraction={optim.warmup_fraction}; expected a '
                     'fraction of the steps in [0, 1]')
  return int(round(fraction * num_steps))


def decay_mask(params):
  """Weight decay on weight matrices only: not on LayerNorm parameters and biases."""
  def keep(path, _):
    names = [str(getattr(k, 'key', getattr(k, 'name', ''))) for k in path]
    return not any('layer_norm' in n or 'bias' in n for n in names)
  return jax.tree_util.tree_map_with_path(keep, params)


def make(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  o = config.optim
  lr = learning_rate_schedule(o, int(config.train.num_steps))
  name = o.get('name', 'adamw')
  if name == 'adamw':
    opt = optax.adamw(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                      mask=decay_mask)
  elif name == 'lamb':
    opt = optax.lamb(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                     mask=decay_mask)
  else:
    raise ValueError(f'config.optim.name={name!r}; expected "adamw" or "lamb"')
  if o.grad_clip_norm < 0:
    raise ValueError(f'config.optim.grad_clip_norm={o.grad_clip_norm}; expected >= 0')
  if o.grad_clip_norm:
    opt = optax.chain(optax.clip_by_global_norm(o.grad_clip_norm), opt)
  return opt
