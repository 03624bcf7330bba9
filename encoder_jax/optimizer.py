"""optax optimizer and learning-rate schedule from ``config.optim`` (BERT recipe defaults)."""

from __future__ import annotations

import jax
import ml_collections
import optax


def learning_rate_schedule(optim: ml_collections.ConfigDict, num_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to the peak over ``warmup_steps``, then linear decay to 0."""
  warmup = int(optim.warmup_steps)
  if not 0 <= warmup <= num_steps:
    raise ValueError(f'config.optim.warmup_steps={warmup} must be in [0, train.num_steps='
                     f'{num_steps}]')
  return optax.join_schedules([
      optax.linear_schedule(0.0, optim.learning_rate, max(warmup, 1)),
      optax.linear_schedule(optim.learning_rate, 0.0, max(num_steps - warmup, 1)),
  ], [warmup])


def decay_mask(params):
  """Weight decay on weight matrices only: not on LayerNorm parameters and biases."""
  def keep(path, _):
    names = [str(getattr(k, 'key', getattr(k, 'name', ''))) for k in path]
    return not any('layer_norm' in n or 'bias' in n for n in names)
  return jax.tree_util.tree_map_with_path(keep, params)


def make(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  o = config.optim
  lr = learning_rate_schedule(o, int(config.train.num_steps))
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
