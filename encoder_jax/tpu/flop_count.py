"""XLA's FLOPs and bytes accessed of a config's train step on a slice, every layer counted.

``cost_analysis()`` counts a while loop's body once, so the figures come from the same step
compiled with its layers unrolled (``model.scan_unroll=0``) at one micro-batch
(``grad_accum_steps=1``), at two stack depths and extended linearly to all of it
(:func:`unrolled_cost`); the step's figure is that micro-batch's times ``grad_accum_steps``
(the optimizer update, a few FLOPs per parameter, is then counted that many times). It
also counts a conditional as its costliest branch, so a stack of local and global layers
(ModernBERT's ``lax.cond`` on the scanned layer index) is counted from programs whose
scanned layers are all global or all local (``model.scanned_attention``), weighted by the
stack's own layers of each kind.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from encoder_jax.core import length_phases
from encoder_jax.models import config as model_config_lib
from encoder_jax.tpu import programs


def _unrolled(target: programs.Target, phase: length_phases.Phase, num_layers: int,
              attention: str | None = None, scanned: str | None = None) -> tuple[float, float]:
  """(FLOPs, bytes accessed) a chip of one micro-batch's train step with ``num_layers``
  layers, every layer unrolled (``model.scan_unroll=0``), compiled for the slice; with
  ``attention``, that ``model.attention_implementation`` instead of the config's; with
  ``scanned`` ('global' or 'local'), the layer scan's layers all of that kind
  (``model.scanned_attention``: no conditional, whose cost XLA counts as its costliest
  branch's)."""
  c = target.config
  micro = int(c.train.batch_size) // int(c.train.grad_accum_steps)
  changes = {'model.scan_unroll': 0, 'model.num_layers': num_layers,
             'train.batch_size': micro, 'train.grad_accum_steps': 1}
  if attention is not None:
    changes['model.attention_implementation'] = attention
  if scanned is not None:
    changes['model.scanned_attention'] = scanned
  flat = programs.with_changes(c, **changes)
  s = programs.build(flat, target.devices)
  batch = programs.abstract_batch(flat, s.mesh, phase.seq_len)
  lowered = s.pieces.train_step(phase).lower(s.state, batch)
  cost = programs.tpu_compile(lowered).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get('flops', 0.0)), float(cost.get('bytes accessed', 0.0))


def _network(config: ml_collections.ConfigDict) -> model_config_lib.EncoderConfig:
  return model_config_lib.EncoderConfig.from_config(config.model)


def layer_period(config: ml_collections.ConfigDict) -> int:
  """Layers after which the stack repeats: 1, or ModernBERT's global-every-n pattern."""
  c = _network(config)
  return c.global_attn_every_n_layers if c.local_attention > 0 else 1


def has_local_layers(config: ml_collections.ConfigDict) -> bool:
  """Whether some layer of the stack attends within a sliding window."""
  return _network(config).has_local_layers


def layer_kinds(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """(global, local) layers among the layer scan's (all but the last, which runs apart at
  the predicted rows): (num_layers - 1, 0) without local attention."""
  c = _network(config)
  global_layers = sum(1 for i in range(c.num_layers - 1) if c.layer_is_global(i))
  return global_layers, c.num_layers - 1 - global_layers


@dataclasses.dataclass(frozen=True)
class LayerCosts:
  """A linear count split by layer: ``fixed`` (embeddings, the last layer, heads, loss and
  optimizer) plus ``global_layer`` per scanned global layer and ``local_layer`` per scanned
  local one; each a tuple of figures (FLOPs, bytes accessed)."""
  fixed: tuple[float, ...]
  global_layer: tuple[float, ...]
  local_layer: tuple[float, ...]

  def total(self, global_layers: int, local_layers: int) -> tuple[float, ...]:
    return tuple(f + global_layers * g + local_layers * l
                 for f, g, l in zip(self.fixed, self.global_layer, self.local_layer))


def layer_costs(target: programs.Target, count) -> LayerCosts:
  """``count(num_layers, scanned)`` (figures linear in the scanned layers, see
  :func:`unrolled_cost`) split into the fixed part and one scanned layer of each kind.

  One kind of layer: stacks of ``n`` and ``n + 1`` layers (``n = 2``: one layer skips the
  layer scan, so is not yet the per-layer program); a stack of at most two layers is
  compiled whole, its count all in ``fixed``. Global and local layers: stacks of ``n``
  layers, where ``n`` leaves the last layer (which runs apart) of the kind of the real
  stack's last (``n = num_layers`` modulo the period) and at least one layer in the scan,
  and of ``n + period``: the scan all local at both depths gives the local layer and the
  fixed part, and all global at ``n`` the global layer (the global programs hold the most
  memory: only the shallower one is compiled).
  """
  c = target.config
  total = int(c.model.num_layers)
  if not has_local_layers(c):
    n = 2 if total >= 3 else total
    base = count(n, None)
    if n == total:
      zeros = tuple(0.0 for _ in base)
      return LayerCosts(base, zeros, zeros)
    per_layer = tuple(d - b for b, d in zip(base, count(n + 1, None)))
    return LayerCosts(tuple(b - (n - 1) * p for b, p in zip(base, per_layer)), per_layer,
                      per_layer)
  period = layer_period(c)
  n = (total - 1) % period + 1
  if n == 1:
    n += period  # At least one layer in the scan.
  local, deeper = count(n, 'local'), count(n + period, 'local')
  per_local = tuple((d - b) / period for b, d in zip(local, deeper))
  fixed = tuple(b - (n - 1) * p for b, p in zip(local, per_local))
  per_global = tuple((g - f) / (n - 1) for g, f in zip(count(n, 'global'), fixed))
  return LayerCosts(fixed, per_global, per_local)


def unrolled_cost(target: programs.Target, phase: length_phases.Phase,
                  kernels: bool = True, whole: bool = False) -> tuple[float, float]:
  """XLA's (FLOPs, bytes accessed) a chip of one micro-batch's train step, every layer
  counted (``cost_analysis`` counts a loop's body once).

  The count is linear in the layers: the step is some fixed work plus one layer's program
  for each layer of the layer scan, of one kind, or of two (ModernBERT: global and local
  attention). So it is compiled unrolled at two depths and extended to
  ``model.num_layers`` (:func:`layer_costs`): the count of the whole unrolled stack
  without compiling it (on a 4-layer model: within 0.1% of the FLOPs, 1% of the bytes).
  With two kinds, each layer is counted as its own kind: the run selects a layer's
  attention by a ``lax.cond`` on its traced index, which ``cost_analysis`` counts as its
  costliest branch (global attention for every layer), so the counted programs have one
  kind throughout the scan (``model.scanned_attention``), weighted by the stack's layers of
  each kind (:func:`layer_kinds`).

  With ``whole``, the count is that of the whole stack compiled unrolled (one program,
  ``model.num_layers`` layers; a conditional still counted as its costliest branch): slower
  to compile on deep stacks, but not an extrapolation. XLA schedules a 2- or 3-layer
  program differently from the whole stack (its asynchronous copies into VMEM above all),
  so the per-layer difference of the two small programs can be off by 10-40% for a kind
  whose layers hold several kernels (docs/results/relative_attention_tpu.md).

  A Pallas kernel (splash attention) is opaque to XLA's FLOP count, so where the program
  has one (``kernels``) the FLOPs are those of the same step with XLA's attention (the same
  arithmetic, counted), and the bytes the program's own. When that step does not fit the
  chip (or a counted program does not), the figure is 0 (unknown).
  """
  kinds = layer_kinds(target.config)

  def counted(attention=None) -> tuple[float, float]:
    try:
      if whole:
        return _unrolled(target, phase, int(target.config.model.num_layers), attention)
      costs = layer_costs(target, lambda n, scanned: _unrolled(target, phase, n, attention,
                                                             scanned))
    except Exception as e:  # pylint: disable=broad-except
      if programs.refusal(e) is None:
        raise
      return 0.0, 0.0  # That program does not fit a chip: unknown.
    return costs.total(*kinds)

  own = counted()
  return (counted('xla')[0], own[1]) if kernels else own
