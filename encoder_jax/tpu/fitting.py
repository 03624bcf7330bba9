"""What fits a slice, found by compiling: the largest micro-batch (smallest
``grad_accum_steps``) and whether ``model.remat`` is needed for a phase's train step to fit
a chip (:func:`fit`).
"""

from __future__ import annotations

import dataclasses

import ml_collections

from encoder_jax.core import length_phases
from encoder_jax.core import sharding
from encoder_jax.tpu import aot
from encoder_jax.tpu import programs


@dataclasses.dataclass
class Fit:
  """What :func:`fit` found for a phase: the smallest accumulation that fits, per remat."""
  phase: length_phases.Phase
  tried: list  # (grad_accum_steps, remat, fits, total bytes on a chip)
  best: tuple | None  # (grad_accum_steps, remat, total bytes) or None: nothing fits.


def accumulation_choices(config: ml_collections.ConfigDict, mesh) -> list[int]:
  """Every ``grad_accum_steps`` whose micro-batch splits evenly over the data axes."""
  b = int(config.train.batch_size)
  data = mesh.shape['data'] * mesh.shape['fsdp']
  return [a for a in range(1, b + 1) if b % a == 0 and (b // a) % data == 0]


def fit(config: ml_collections.ConfigDict, devices, phase_index: int,
        remats=(False, True)) -> Fit:
  """The largest micro-batch (smallest ``grad_accum_steps``) whose train step fits a chip,
  with remat off and on, found by compiling (a binary search: memory grows with the
  micro-batch). The best is the one with fewer micro-batches (remat off on a tie)."""
  tried, best = [], None
  mesh = sharding.make_mesh(config.mesh, devices)
  choices = accumulation_choices(config, mesh)
  if not choices:
    raise ValueError(f'config.train.batch_size={config.train.batch_size} has no split into '
                     f'micro-batches that the data axes ({dict(mesh.shape)}) divide')
  for remat in remats:
    lo, hi, found = 0, len(choices) - 1, None
    while lo <= hi:
      mid = (lo + hi) // 2
      candidate = programs.with_changes(
          config, **{'train.grad_accum_steps': choices[mid], 'model.remat': remat})
      target = programs.build(candidate, devices)
      report = aot.compile_phase(target, target.phases[phase_index], with_eval=False,
                                 with_flops=False)
      tried.append((choices[mid], remat, report.train.fits, report.train.total))
      if report.train.fits:
        found, hi = (choices[mid], remat, report.train.total), mid - 1
      else:
        lo = mid + 1
    if found and (best is None or found[0] < best[0]):
      best = found
  phases = length_phases.phases(config.train)
  return Fit(phases[phase_index], tried, best)
