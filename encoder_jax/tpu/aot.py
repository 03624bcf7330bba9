"""Ahead-of-time compilation of a config's steps for a TPU slice, on any host: per phase
(:func:`compile_phase`), the train and eval steps ``main`` would run, compiled for the
slice (``programs``), with their HBM and collectives a chip, XLA's FLOPs and bytes a step
(``flop_count``) beside the objective's own formula (``flops_per_sequence``, what MFU divides
by), and a roofline: the step takes at least ``max(FLOPs / peak, bytes / HBM bandwidth)``
on a chip (``chips.TPUS``), which bounds tokens/s from above, and the MFU that bound
allows. The search for what fits is ``fitting``; the printed lines are ``summary``'s.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import ml_collections

from encoder_jax.core import chips
from encoder_jax.core import length_phases
from encoder_jax.run import pretraining
from encoder_jax.tpu import flop_count
from encoder_jax.tpu import programs


@dataclasses.dataclass
class PhaseReport:
  """A phase's compiled programs, FLOPs and roofline."""
  phase: length_phases.Phase
  batch_size: int
  grad_accum_steps: int
  remat: bool
  chips: int
  chip: chips.Chip | None
  train: programs.Program
  eval: programs.Program | None = None
  xla_flops: float = 0.0  # Per chip per step (layers unrolled), 0 when not compiled.
  xla_bytes: float = 0.0  # HBM bytes accessed per chip per step (idem).
  formula_flops: float = 0.0  # The objective's flops_per_sequence x batch (all chips).
  flops_compile_s: float = 0.0
  whole_stack: bool = False  # FLOPs and bytes from the whole stack, not extrapolated.

  @property
  def fits(self) -> bool:
    return self.train.fits and (self.eval is None or self.eval.fits)

  @property
  def flops_ratio(self) -> float:
    return self.xla_flops * self.chips / self.formula_flops if self.formula_flops else 0.0

  def roofline(self) -> dict[str, float]:
    """Lower bounds on the step time from compute and from HBM traffic, the tokens/s they
    allow and the MFU ceiling (model FLOPs over peak at that bound); {} without FLOPs."""
    if not (self.xla_flops and self.chip):
      return {}
    compute_s = self.xla_flops / (self.chip.peak_bf16_tflops * 1e12)
    memory_s = self.xla_bytes / (self.chip.hbm_gbytes_per_s * 1e9)
    bound_s = max(compute_s, memory_s)
    tokens = self.batch_size * self.phase.seq_len
    mfu = lambda s: self.formula_flops / (s * self.chips * self.chip.peak_bf16_tflops * 1e12)
    return dict(compute_s=compute_s, memory_s=memory_s, step_s=bound_s,
                tokens_per_s=tokens / bound_s, mfu=mfu(bound_s), compute_mfu=mfu(compute_s))


def compile_phase(target: programs.Target, phase: length_phases.Phase, *,
                  with_eval: bool = True, with_flops: bool = True,
                  whole_stack: bool = False) -> PhaseReport:
  """Compiles the run's train step (and eval step) of one phase for the slice; with
  ``with_flops``, also one micro-batch with the layers unrolled, for FLOPs and bytes (at 2
  and 3 layers, extrapolated; the whole stack with ``whole_stack``:
  ``flop_count.unrolled_cost``)."""
  c, mesh = target.config, target.mesh
  limit = programs.hbm_limit(target.devices[0])
  state = target.state
  step = target.pieces.train_step(phase)
  batch = programs.abstract_batch(c, mesh, phase.seq_len)
  train_program, _ = programs.compile_program(
      'train', lambda: step.lower(state, batch), limit,
      programs.bytes_on_chip((state.params, state.opt_state)))
  accum = int(c.train.grad_accum_steps)
  report = PhaseReport(phase, int(c.train.batch_size), accum, bool(c.model.remat),
                       len(target.devices), chips.by_device_kind(target.devices[0].device_kind),
                       train_program,
                       formula_flops=target.objective.flops_per_sequence(phase)
                       * int(c.train.batch_size))
  if with_eval:
    eval_step = pretraining.make_eval_step(c, target.objective, mesh,
                                           target.pieces.shards.params, phase)
    index = jax.ShapeDtypeStruct((), jnp.int32)
    report.eval, _ = programs.compile_program(
        'eval', lambda: eval_step.lower(state.params, batch, index), limit,
        programs.bytes_on_chip(state.params))
  if with_flops and train_program.fits:
    start = time.perf_counter()
    counted = flop_count.unrolled_cost(target, phase, kernels=train_program.kernels > 0,
                                       whole=whole_stack)
    report.xla_flops, report.xla_bytes = (x * accum for x in counted)
    report.whole_stack = whole_stack
    report.flops_compile_s = time.perf_counter() - start
  return report


def compile_config(config: ml_collections.ConfigDict, devices, *, phases=None,
                   with_eval: bool = True, with_flops: bool = True,
                   whole_stack: bool = False) -> list[PhaseReport]:
  """:func:`compile_phase` for every phase of ``config`` (or the indices in ``phases``)."""
  target = programs.build(config, devices)
  wanted = range(len(target.phases)) if phases is None else phases
  return [compile_phase(target, target.phases[i], with_eval=with_eval, with_flops=with_flops,
                        whole_stack=whole_stack)
          for i in wanted]
