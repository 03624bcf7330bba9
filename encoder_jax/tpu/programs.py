"""A config's run on a TPU slice, on any host: the slice's devices, the run's pieces on its
mesh, and one program compiled for it (nothing allocated or run).

libtpu (the ``tpu`` extra) compiles for a TPU slice without one: :func:`topology_devices`
gives the devices of a slice (``v5e:2x4``; several slices with ``slices``), the config's
mesh is laid over them (``sharding.make_mesh``: ``mesh.*`` within a slice, ``mesh.dcn_*``
across slices), and :func:`build` makes the run's own pieces there (``pretraining.pieces``:
what ``main`` trains with: objective, optimizer, gradient accumulation and shardings).
:func:`compile_program` compiles a lowered step and reads, per chip, its HBM
(``memory_analysis()``: total = arguments + outputs - aliased + temporaries) against the
HBM the compiler allows a program (:func:`hbm_limit`, asked of libtpu), and its
collectives (``hlo.collectives``: an op inside a while loop counts its trip count); a step
the compiler refuses for memory ("RESOURCE_EXHAUSTED") does not fit, with its figures.
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

from encoder_jax import objectives
from encoder_jax.config import validation
from encoder_jax.core import chips
from encoder_jax.core import extras
from encoder_jax.core import length_phases
from encoder_jax.core import sharding
from encoder_jax.data import builders
from encoder_jax.objectives import masking
from encoder_jax.run import pretraining
from encoder_jax.run import steps
from encoder_jax.tpu import hlo


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
      tpu_compile(huge.lower(jax.ShapeDtypeStruct((), jnp.int8, sharding=one)))
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


def bytes_on_chip(tree) -> float:
  """Bytes of the busiest chip's shards of a tree of sharded ShapeDtypeStructs."""
  total = 0.0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
  return total


def refusal(error: Exception) -> str | None:
  """The compiler's out-of-memory reason, or None for any other failure."""
  text = ' '.join(str(error).split())
  if 'RESOURCE_EXHAUSTED' not in text and 'Ran out of memory' not in text:
    return None
  found = (re.search(r'(Ran out of memory.*?available HBM \([^)]*\))', text)
           or re.search(r'(Ran out of memory.*?\))\.?', text))
  return found.group(1) if found else text[:300]


def tpu_compile(lowered):
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


def compile_program(name: str, lower, limit: float, state_bytes: float) -> tuple[Program, Any]:
  start = time.perf_counter()
  try:
    compiled = tpu_compile(lower())
  except Exception as e:  # pylint: disable=broad-except
    reason = refusal(e)
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


def with_changes(config: ml_collections.ConfigDict, **changes) -> ml_collections.ConfigDict:
  """A copy of ``config`` with ``section.field`` values changed (keys as 'train.batch_size')."""
  out = copy.deepcopy(config)
  with out.unlocked():
    for key, value in changes.items():
      section, field = key.split('.')
      out[section][field] = value
  return out
