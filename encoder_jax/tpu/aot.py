"""Ahead-of-time compilation of a config's steps for a TPU slice, on any host.

libtpu (the ``tpu`` extra) compiles for a TPU slice without one: ``topology_devices`` gives
the devices of a slice (``v5e:2x4``; several slices with ``slices``), the config's mesh is
laid over them (``sharding.make_mesh``: ``mesh.*`` within a slice, ``mesh.dcn_*`` across
slices), and the run's own train step (``pretraining.pieces``: the pieces ``main`` trains
with: objective, optimizer, gradient accumulation and shardings of the config) and eval
step are lowered from ``jax.ShapeDtypeStruct``s and compiled by the TPU compiler. Nothing
is allocated or run.

Per phase (:func:`compile_phase`) the compiled programs say, per chip:

* HBM: ``memory_analysis()`` (arguments, outputs, aliased, temporaries; total = arguments
  + outputs - aliased + temporaries), the state's own share (params + optimizer state, from
  the shardings' shard shapes), against the HBM the compiler allows a program
  (:func:`hbm_limit`, asked of libtpu). A step the compiler refuses for memory
  ("RESOURCE_EXHAUSTED") does not fit, with the compiler's figures.
* Collectives: each all-reduce / all-gather / reduce-scatter / all-to-all /
  collective-permute of the compiled HLO (:func:`collectives`), counted per step (an op
  inside a while loop counts its trip count; inside a conditional, once) with the bytes of
  its output on the chip.
* FLOPs and bytes accessed: ``cost_analysis()`` counts a while loop's body once, so these
  come from the same step compiled with its layers unrolled (``model.scan_unroll=0``) at
  one micro-batch (``grad_accum_steps=1``), at two stack depths and extended linearly to
  all of it (:func:`unrolled_cost`); the step's figure is that micro-batch's times
  ``grad_accum_steps`` (the optimizer update, a few FLOPs per parameter, is then counted
  that many times). It also counts a conditional as its costliest branch, so a stack of
  local and global layers (ModernBERT's ``lax.cond`` on the scanned layer index) is
  counted from programs whose scanned layers are all global or all local, weighted by the
  stack's own layers of each kind. The objective's own formula (``flops_per_sequence``,
  what MFU divides by) is printed beside it.
* A roofline: the step takes at least ``max(FLOPs / peak, bytes / HBM bandwidth)`` on a
  chip (``chips.TPUS``), which bounds tokens/s from above, and the MFU that bound allows.

:func:`fit` searches, by compiling, the largest micro-batch (smallest ``grad_accum_steps``)
and whether ``model.remat`` is needed for each phase to fit.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoder_jax.core import chips
from encoder_jax.core import extras
from encoder_jax.tpu import hlo
from encoder_jax.core import length_phases
from encoder_jax import objectives
from encoder_jax.core import sharding
from encoder_jax.run import pretraining
from encoder_jax.run import steps
from encoder_jax.config import validation
from encoder_jax.data import builders
from encoder_jax.models import config as model_config_lib
from encoder_jax.objectives import masking

GIB = 2.0 ** 30
COLLECTIVES = hlo.COLLECTIVES
_EXAMPLES = 'e.g. v5e:2x4, v5e:4x4, v5p:2x2x1, v4:2x2x1, v6e:2x2'


def topology_devices(topology: str, slices: int = 1) -> list:
  """The devices of ``slices`` TPU slices of ``topology`` (``v5e:2x4``), on any host.

  A missing libtpu is a one-line :class:`extras.MissingExtra` with its pip command; a name
  libtpu refuses is a ValueError quoting libtpu's reason.
  """
  extras.locate('libtpu', extra='tpu', what=f'Compiling for the TPU slice {topology!r} '
                'needs libtpu, the TPU compiler')
  chips.by_name(topology)  # A generation outside the chip table: refused by name.
  if int(slices) < 1:
    raise ValueError(f'--slices={slices}: expected 1 or more slices')
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  # Compiling only: no chip is claimed, so several processes may load libtpu at once (it
  # otherwise takes a lock file that a second process fails on).
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  try:
    desc = topologies.get_topology_desc(topology_name=topology, platform='tpu',
                                        num_slices=int(slices))
  except Exception as e:  # pylint: disable=broad-except
    reason = ' '.join(str(e).split()) or type(e).__name__
    raise ValueError(f'--topology={topology!r}: libtpu refuses this slice ({reason}); expected '
                     f'GENERATION:AxB[xC] with a shape that generation offers ({_EXAMPLES})'
                     ) from e
  return list(desc.devices)


_HBM_LIMITS: dict[str, float] = {}


def hbm_limit(device) -> float:
  """Bytes of HBM the TPU compiler lets one program use on ``device``'s chip: its own
  figure, read from its refusal of a program far too large (a little below the datasheet's
  capacity: 15.75 GiB on a 16 GB v5e)."""
  kind = device.device_kind
  if kind not in _HBM_LIMITS:
    one = jax.sharding.SingleDeviceSharding(device)
    huge = jax.jit(lambda x: jnp.broadcast_to(x, (2 ** 40,)) + 1, out_shardings=one)
    try:
      _tpu_compile(huge.lower(jax.ShapeDtypeStruct((), jnp.int8, sharding=one)))
    except Exception as e:  # pylint: disable=broad-except
      found = re.search(r'available HBM \(([\d.]+)([KMGT])\)', str(e))
      if found:
        _HBM_LIMITS[kind] = float(found.group(1)) * 1024 ** 'KMGT'.index(found.group(2)) * 1024
    if kind not in _HBM_LIMITS:  # The compiler did not say: the datasheet's capacity.
      chip = chips.by_device_kind(kind)
      _HBM_LIMITS[kind] = (chip.hbm_gb if chip else 0.0) * GIB
  return _HBM_LIMITS[kind]


def vocab_tables(config: ml_collections.ConfigDict) -> masking.VocabTables:
  """Stand-in vocabulary tables of the config's size (the first five ids special, every
  piece a word start, uniform counts): the compiled program depends on their shapes only."""
  v = int(config.model.vocab_size)
  special = np.zeros(v, bool)
  special[:5] = True
  return masking.VocabTables(special, np.ones(v, bool), np.ones(v), mask_id=4)


@dataclasses.dataclass
class Target:
  """A config's run on a slice: its pieces (what ``main`` trains with) on the slice's mesh."""
  config: ml_collections.ConfigDict
  phases: tuple[length_phases.Phase, ...]
  pieces: steps.Pieces
  devices: list
  state: Any  # The TrainState's ShapeDtypeStructs, with the pieces' shardings.

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self.pieces.mesh

  @property
  def objective(self):
    return self.pieces.trainable


def build(config: ml_collections.ConfigDict, devices,
          tables: masking.VocabTables | None = None) -> Target:
  """Validates ``config`` and builds its run's pieces (``pretraining.pieces``) on a mesh of
  ``devices`` (the batch must divide the data axes, as in a run). ``tables``: the corpus's
  vocabulary tables (stand-ins of the config's size unless given: the compiled program
  depends on their shapes only). The model's init is traced once."""
  validation.validate(config)
  mesh = sharding.make_mesh(config.mesh, devices)
  objective = objectives.build(config, vocab_tables(config) if tables is None else tables)
  pieces = pretraining.pieces(config, mesh, objective)
  return Target(config, length_phases.phases(config.train), pieces, list(devices),
                pieces.abstract_state())


def abstract_batch(config: ml_collections.ConfigDict, mesh, seq_len: int,
                   rows: int | None = None) -> dict:
  """The global batch a run feeds at ``seq_len``, as ShapeDtypeStructs sharded as in a run."""
  b = int(config.train.batch_size if rows is None else rows)
  s = sharding.batch_sharding(mesh)
  spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=s)
  batch = dict(input_ids=spec(b, seq_len), segment_ids=spec(b, seq_len),
               input_mask=spec(b, seq_len), pair_labels=spec(b), word_starts=spec(b, seq_len))
  if getattr(builders.REGISTRY[str(config.data.pair_kind)], 'packs_documents', False):
    batch['document_ids'] = spec(b, seq_len)
  return batch


@dataclasses.dataclass
class Program:
  """One compiled program's per-chip figures (or why the compiler refused it)."""
  name: str  # 'train' or 'eval'.
  compile_s: float
  fits: bool
  hbm_limit: float  # Bytes the compiler allows a program on a chip.
  total: float = 0.0  # Bytes on a chip: arguments + outputs - aliased + temporaries.
  arguments: float = 0.0
  temporaries: float = 0.0
  state: float = 0.0  # Params + optimizer state (train) or params (eval) on the busiest chip.
  collectives: dict = dataclasses.field(default_factory=dict)  # kind -> [count, bytes]
  refusal: str = ''  # The compiler's reason when it refused the program.
  kernels: int = 0  # Pallas (Mosaic) custom calls in the HLO: splash attention's kernels.


@dataclasses.dataclass
class PhaseReport:
  """A phase's compiled programs, FLOPs and roofline."""
  phase: length_phases.Phase
  batch_size: int
  grad_accum_steps: int
  remat: bool
  chips: int
  chip: chips.Chip | None
  train: Program
  eval: Program | None = None
  xla_flops: float = 0.0  # Per chip per step (layers unrolled), 0 when not compiled.
  xla_bytes: float = 0.0  # HBM bytes accessed per chip per step (idem).
  formula_flops: float = 0.0  # The objective's flops_per_sequence x batch (all chips).
  flops_compile_s: float = 0.0

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


def _bytes_on_chip(tree) -> float:
  """Bytes of the busiest chip's shards of a tree of sharded ShapeDtypeStructs."""
  total = 0.0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
  return total


def _refusal(error: Exception) -> str | None:
  """The compiler's out-of-memory reason, or None for any other failure."""
  text = ' '.join(str(error).split())
  if 'RESOURCE_EXHAUSTED' not in text and 'Ran out of memory' not in text:
    return None
  found = (re.search(r'(Ran out of memory.*?available HBM \([^)]*\))', text)
           or re.search(r'(Ran out of memory.*?\))\.?', text))
  return found.group(1) if found else text[:300]


def _tpu_compile(lowered):
  """``lowered.compile()`` writing nothing to the persistent compilation cache: an
  executable for a slice this host has no client for can be written but not read back here
  (each read is an error warning). JAX decides whether the cache is on once per process,
  at its first compile, so the cache is also told to keep no program however long it took
  to compile (read at each write)."""
  options = {'jax_enable_compilation_cache': False,
             'jax_persistent_cache_min_compile_time_secs': float('inf')}
  was = {name: getattr(jax.config, name) for name in options}
  for name, value in options.items():
    jax.config.update(name, value)
  try:
    return lowered.compile()
  finally:
    for name, value in was.items():
      jax.config.update(name, value)


def _compile(name: str, lower, limit: float, state_bytes: float) -> tuple[Program, Any]:
  start = time.perf_counter()
  try:
    compiled = _tpu_compile(lower())
  except Exception as e:  # pylint: disable=broad-except
    reason = _refusal(e)
    if reason is None:
      raise
    found = re.search(r'required for [^(]*\(([\d.]+)([KMGT])\)', reason)
    total = (float(found.group(1)) * 1024 ** 'KMGT'.index(found.group(2)) * 1024
             if found else 0.0)
    return Program(name, time.perf_counter() - start, False, limit, total=total,
                   state=state_bytes, refusal=reason), None
  elapsed = time.perf_counter() - start
  text = compiled.as_text()
  m = compiled.memory_analysis()
  total = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
           + m.temp_size_in_bytes)
  program = Program(name, elapsed, total <= limit, limit, total=float(total),
                    arguments=float(m.argument_size_in_bytes),
                    temporaries=float(m.temp_size_in_bytes), state=state_bytes,
                    collectives=hlo.collectives(text), kernels=text.count('tpu_custom_call'))
  return program, compiled


def _with(config: ml_collections.ConfigDict, **changes) -> ml_collections.ConfigDict:
  """A copy of ``config`` with ``section.field`` values changed (keys as 'train.batch_size')."""
  out = copy.deepcopy(config)
  with out.unlocked():
    for key, value in changes.items():
      section, field = key.split('.')
      out[section][field] = value
  return out


def compile_phase(target: Target, phase: length_phases.Phase, *, with_eval: bool = True,
                  with_flops: bool = True) -> PhaseReport:
  """Compiles the run's train step (and eval step) of one phase for the slice; with
  ``with_flops``, also one micro-batch with the layers unrolled, for FLOPs and bytes."""
  c, mesh = target.config, target.mesh
  limit = hbm_limit(target.devices[0])
  state = target.state
  step = target.pieces.train_step(phase)
  batch = abstract_batch(c, mesh, phase.seq_len)
  train_program, _ = _compile('train', lambda: step.lower(state, batch), limit,
                              _bytes_on_chip((state.params, state.opt_state)))
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
    report.eval, _ = _compile('eval', lambda: eval_step.lower(state.params, batch, index),
                              limit, _bytes_on_chip(state.params))
  if with_flops and train_program.fits:
    start = time.perf_counter()
    report.xla_flops, report.xla_bytes = (
        x * accum for x in unrolled_cost(target, phase, kernels=train_program.kernels > 0))
    report.flops_compile_s = time.perf_counter() - start
  return report


def _unrolled(target: Target, phase: length_phases.Phase, num_layers: int,
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
  flat = _with(c, **changes)
  s = build(flat, target.devices)
  lowered = s.pieces.train_step(phase).lower(s.state, abstract_batch(flat, s.mesh, phase.seq_len))
  cost = _tpu_compile(lowered).cost_analysis()
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


def layer_costs(target: Target, count) -> LayerCosts:
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


def unrolled_cost(target: Target, phase: length_phases.Phase,
                  kernels: bool = True) -> tuple[float, float]:
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

  A Pallas kernel (splash attention) is opaque to XLA's FLOP count, so where the program
  has one (``kernels``) the FLOPs are those of the same step with XLA's attention (the same
  arithmetic, counted), and the bytes the program's own. When that step does not fit the
  chip (or a counted program does not), the figure is 0 (unknown).
  """
  kinds = layer_kinds(target.config)

  def counted(attention=None) -> tuple[float, float]:
    try:
      costs = layer_costs(target, lambda n, scanned: _unrolled(target, phase, n, attention,
                                                             scanned))
    except Exception as e:  # pylint: disable=broad-except
      if _refusal(e) is None:
        raise
      return 0.0, 0.0  # That program does not fit a chip: unknown.
    return costs.total(*kinds)

  own = counted()
  return (counted('xla')[0], own[1]) if kernels else own


def compile_config(config: ml_collections.ConfigDict, devices, *, phases=None,
                   with_eval: bool = True, with_flops: bool = True) -> list[PhaseReport]:
  """:func:`compile_phase` for every phase of ``config`` (or the indices in ``phases``)."""
  target = build(config, devices)
  wanted = range(len(target.phases)) if phases is None else phases
  return [compile_phase(target, target.phases[i], with_eval=with_eval, with_flops=with_flops)
          for i in wanted]


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
      candidate = _with(config, **{'train.grad_accum_steps': choices[mid], 'model.remat': remat})
      target = build(candidate, devices)
      report = compile_phase(target, target.phases[phase_index], with_eval=False,
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


# ---- What the compile command prints ----


def gib(n: float) -> str:
  """Bytes in GiB (MiB below one GiB)."""
  return f'{n / GIB:.2f} GiB' if n >= GIB else f'{n / 2 ** 20:.1f} MiB'


def _collective_line(found: dict) -> str:
  if not found:
    return 'none'
  return ', '.join(f'{kind} x{count:g} ({n / 2 ** 20:,.1f} MiB)'
                   for kind, (count, n) in sorted(found.items()))


def _program_lines(p: Program) -> list[str]:
  verdict = 'fits' if p.fits else 'does not fit'
  if p.refusal:
    return [f'{p.name} step: {verdict}: the compiler refused it ({p.refusal}); state '
            f'{gib(p.state)} a chip; compile {p.compile_s:.0f} s']
  return [f'{p.name} step: {verdict}: {gib(p.total)} of {gib(p.hbm_limit)} a chip (state '
          f'{gib(p.state)}, temporaries {gib(p.temporaries)}, arguments {gib(p.arguments)}); '
          f'compiled in {p.compile_s:.0f} s',
          f'  collectives a step: {_collective_line(p.collectives)}; attention kernels '
          f'(Pallas splash) in the program: {p.kernels}']


def report_lines(r: PhaseReport) -> list[str]:
  """The printed lines of one phase."""
  micro = r.batch_size // r.grad_accum_steps
  lines = [f'phase {r.phase.index}: {r.phase.seq_len} tokens x {r.batch_size} sequences '
           f'({r.grad_accum_steps} micro-batch{"es" * (r.grad_accum_steps > 1)} of {micro}, '
           f'{micro / r.chips:g} a chip; remat {"on" if r.remat else "off"})']
  for p in (r.train, r.eval):
    if p is not None:
      lines += ['  ' + line for line in _program_lines(p)]
  if r.xla_flops:
    lines.append(f'  FLOPs a step: XLA {r.xla_flops * r.chips:.4g} (layers unrolled; compiled '
                 f'in {r.flops_compile_s:.0f} s), the objective\'s formula '
                 f'{r.formula_flops:.4g}: ratio {r.flops_ratio:.3f}')
    roof = r.roofline()
    if roof:
      lines.append(f'  roofline a chip: compute {roof["compute_s"] * 1e3:.2f} ms at '
                   f'{r.chip.peak_bf16_tflops:g} TFLOP/s, HBM {roof["memory_s"] * 1e3:.2f} ms at '
                   f'{r.chip.hbm_gbytes_per_s:g} GB/s: at most {roof["tokens_per_s"]:,.0f} '
                   f'tokens/s, MFU at most {roof["mfu"]:.0%} ({roof["compute_mfu"]:.0%} from '
                   'the compute bound alone)')
  if not r.fits:
    lines.append('  -> does not fit: rerun with --fit for the grad_accum_steps and remat that '
                 'fit, or take a larger slice')
  return lines


def as_json(r: PhaseReport) -> dict:
  program = lambda p: None if p is None else dict(
      fits=p.fits, total_bytes=p.total, hbm_limit_bytes=p.hbm_limit, state_bytes=p.state,
      temporaries_bytes=p.temporaries, arguments_bytes=p.arguments, compile_s=p.compile_s,
      collectives=p.collectives, refusal=p.refusal, kernels=p.kernels)
  return dict(phase=r.phase.index, seq_len=r.phase.seq_len, batch_size=r.batch_size,
              grad_accum_steps=r.grad_accum_steps, remat=r.remat, chips=r.chips,
              train=program(r.train), eval=program(r.eval), xla_flops_per_chip=r.xla_flops,
              xla_bytes_per_chip=r.xla_bytes, formula_flops=r.formula_flops,
              flops_ratio=r.flops_ratio, roofline=r.roofline())


def fit_lines(f: Fit) -> list[str]:
  lines = [f'phase {f.phase.index} ({f.phase.seq_len} tokens): tried '
           + ', '.join(f'accum {a} remat {"on" if m else "off"}: '
                       f'{"fits" if ok else "does not fit"} ({gib(t)})' for a, m, ok, t in f.tried)]
  if f.best is None:
    lines.append('  -> nothing fits on this slice: take a larger slice (or more chips along '
                 'fsdp: --config.mesh.fsdp)')
  else:
    a, remat, total = f.best
    lines.append(f'  -> fits with --config.train.grad_accum_steps={a} '
                 f'--config.model.remat={remat} ({gib(total)} a chip)')
  return lines
