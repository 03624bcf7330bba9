"""Device mesh and logical -> physical sharding rules (pjit semantics: jit over a Mesh).

Mesh axes: ``data`` (replicated params), ``fsdp`` (params and optimizer state sharded,
batch split too) and ``tensor`` (heads / d_ff / vocabulary split). Parameters name their
logical axes in ``models.layers``; ``LOGICAL_RULES`` maps each logical name to mesh axes,
first match wins. A dimension that a mesh axis does not divide stays replicated along
that axis (``describe`` shows the result for every parameter).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ('data', 'fsdp', 'tensor')

LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
    ('batch', ('data', 'fsdp')),
    ('vocab', 'tensor'),
    ('heads', 'tensor'),
    ('mlp', 'tensor'),
    ('embed', 'fsdp'),
    ('kv', None),
    ('length', None),
    ('layers', None),
)


DCN_AXES = tuple(f'dcn_{a}' for a in MESH_AXES)  # config.mesh's sizes across slices.


def make_mesh(mesh_config: ml_collections.ConfigDict, devices=None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh laid out on the chips' topology.

  ``mesh_config.data/fsdp/tensor`` are each axis's size within a slice (the chips' own
  interconnect, ICI); ``dcn_data/dcn_fsdp/dcn_tensor`` (1 when absent) its size across the
  slices of a multislice job (the data-centre network). One size of each group may be -1:
  the remaining devices of a slice, or the remaining slices. See :func:`device_layout`.
  """
  devices = list(jax.devices() if devices is None else devices)
  ici = [int(mesh_config[a]) for a in MESH_AXES]
  dcn = [int(mesh_config.get(a, 1)) for a in DCN_AXES]
  return Mesh(device_layout(ici, dcn, devices), MESH_AXES)


def _granules(devices) -> list[list]:
  """The devices grouped by slice (``slice_index``; one group where devices have none)."""
  groups: dict[int, list] = {}
  for d in devices:
    groups.setdefault(int(getattr(d, 'slice_index', 0) or 0), []).append(d)
  return [groups[k] for k in sorted(groups)]


def _resolve(sizes: list[int], total: int, what: str, named: dict) -> list[int]:
  """``sizes`` with its -1 (at most one) replaced by what is left of ``total``."""
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f'config.mesh sizes {named}: each must be >= 1, and at most one may be '
                     f'-1 (= the remaining {what})')
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if total % known:
      raise ValueError(f'config.mesh {named}: {total} {what} are not divisible by the fixed '
                       f'axes product {known}')
    sizes = list(sizes)
    sizes[sizes.index(-1)] = total // known
  if math.prod(sizes) != total:
    raise ValueError(f'config.mesh {named} needs {math.prod(sizes)} {what}; {total} are '
                     'available')
  return sizes


def device_layout(ici: list[int], dcn: list[int], devices) -> np.ndarray:
  """The devices as an array of shape ``ici * dcn`` (axis by axis), for ``Mesh``.

  Within a slice, ``mesh_utils.create_device_mesh`` orders the devices so that neighbours
  on each mesh axis are neighbours on the physical torus (TPU; elsewhere it keeps the
  enumeration order). With several slices (devices carry ``slice_index``), each slice gets
  that layout and ``create_hybrid_device_mesh`` tiles the slices along the ``dcn_*`` axes,
  so only those axes cross the slower data-centre network. Pure: it reads only the devices'
  attributes (``slice_index``, ``platform``, ``device_kind`` and, on TPU, ``coords``).
  """
  from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top
  granules = _granules(devices)
  slices = len(granules)
  dcn = _resolve(dcn, slices, 'slices', dict(zip(DCN_AXES, dcn)))
  per_slice = len(devices) // slices
  if any(len(g) != per_slice for g in granules):
    raise ValueError(f'The devices span {slices} slices of unequal sizes '
                     f'{[len(g) for g in granules]}; expected the same number in each')
  ici = _resolve(ici, per_slice, 'devices' + (' per slice' if slices > 1 else ''),
                 dict(zip(MESH_AXES, ici)))
  if slices == 1:
    return mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
  return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices,
                                              allow_split_physical_axes=True)


def logical_to_spec(names: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
  """Resolves logical axis names to a PartitionSpec for an array of ``shape``."""
  rules = dict(LOGICAL_RULES)
  used: set[str] = set()
  spec = []
  for name, dim in zip(names, shape):
    if name is not None and name not in rules:
      raise ValueError(f'Logical axis {name!r} has no rule; known: {sorted(rules)}')
    target = rules.get(name) if name else None
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
    if axes and dim % math.prod(mesh.shape[a] for a in axes):
      axes = ()  # Not divisible: replicate this dimension.
    used.update(axes)
    spec.append(axes[0] if len(axes) == 1 else (axes or None))
  return P(*spec)


def _is_box(x) -> bool:
  return isinstance(x, nn.LogicallyPartitioned)


def shardings_of(boxed_tree, mesh: Mesh):
  """NamedShardings for the unboxed version of ``boxed_tree`` (unboxed leaves: replicated)."""
  def one(x):
    if _is_box(x):
      return NamedSharding(mesh, logical_to_spec(x.names, x.value.shape, mesh))
    return NamedSharding(mesh, P())
  return jax.tree.map(one, boxed_tree, is_leaf=_is_box)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(('data', 'fsdp')))


def process_rows(mesh: Mesh, batch_size: int) -> tuple[int, int]:
  """The global batch rows ``[lo, hi)`` this process's devices hold under ``batch_sharding``:
  what its input pipeline materialises (all rows when the batch is replicated across hosts)."""
  spans = sorted({(s[0].start or 0, batch_size if s[0].stop is None else s[0].stop)
                  for s in batch_sharding(mesh).addressable_devices_indices_map(
                      (batch_size,)).values()})
  lo, hi = spans[0]
  for start, stop in spans[1:]:
    if start > hi:
      raise ValueError(
          f'This process holds global batch rows {spans}, not one contiguous range; order '
          f'the mesh devices by process (mesh {dict(mesh.shape)}).')
    hi = max(hi, stop)
  return lo, hi


def check_batch(batch_size: int, mesh: Mesh, what: str = 'config.train.batch_size'):
  n = mesh.shape['data'] * mesh.shape['fsdp']
  if batch_size % n:
    raise ValueError(f'{what}={batch_size} is not divisible by the data-parallel mesh size '
                     f'data*fsdp={n} (mesh {dict(mesh.shape)})')


def describe(boxed_params, mesh: Mesh) -> str:
  """One line per parameter: path, shape, logical axes and mesh PartitionSpec."""
  lines = []
  flat = jax.tree_util.tree_flatten_with_path(boxed_params, is_leaf=_is_box)[0]
  for path, box in flat:
    name = '/'.join(str(getattr(k, 'key', k)) for k in path)
    shape = tuple(box.value.shape)
    lines.append(f'{name:60s} {str(shape):22s} {str(box.names):40s} '
                 f'{logical_to_spec(box.names, shape, mesh)}')
  return '\n'.join(lines)
