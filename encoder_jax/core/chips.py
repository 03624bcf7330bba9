"""The TPU chips a run can be planned for: one declared table, with where each figure comes
from.

Each :class:`Chip` holds a generation's vendor figures per chip: dense bf16 peak, HBM
capacity and bandwidth, and bidirectional inter-chip interconnect (ICI) bandwidth. The
compile command (``encoder_jax.compile``) divides a compiled step's FLOPs by the peak and
its bytes by the HBM bandwidth for the step's roofline, and ``metrics_log`` reads the peak
for MFU on a TPU. The HBM a program may use is the compiler's own figure
(``encoder_jax.compile`` asks libtpu for it), a little below the capacity here.

Sources (Google Cloud TPU documentation, "System architecture" of each generation):
  v4:  https://cloud.google.com/tpu/docs/v4   275 TFLOP/s bf16; HBM2 32 GiB, 1,200 GB/s;
       ICI not given per chip on that page (6 links a chip, 3D torus).
  v5e: https://cloud.google.com/tpu/docs/v5e  197 TFLOP/s bf16; HBM2 16 GB, 819 GB/s; ICI
       1,600 Gbit/s (400 GB/s bidirectional) a chip.
  v5p: https://cloud.google.com/tpu/docs/v5p  459 TFLOP/s bf16; HBM2e 95 GB, 2,765 GB/s; ICI
       4,800 Gbit/s a chip.
  v6e: https://cloud.google.com/tpu/docs/v6e  918 TFLOP/s bf16; HBM 32 GB, 1,638 GB/s; ICI
       800 GB/s bidirectional a chip.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation's per-chip figures (vendor datasheet values)."""
  name: str  # The topology prefix libtpu takes: 'v5e' in 'v5e:2x4'.
  device_kinds: tuple[str, ...]  # What jax.Device.device_kind says on that chip.
  peak_bf16_tflops: float  # Dense bf16 TFLOP/s.
  hbm_gb: float  # HBM capacity as the datasheet states it (GB; v4: GiB).
  hbm_gbytes_per_s: float  # HBM bandwidth, GB/s.
  ici_gbytes_per_s: float | None  # Bidirectional ICI bandwidth a chip, GB/s (None: not stated).
  source: str


TPUS: tuple[Chip, ...] = (
    Chip('v4', ('TPU v4',), 275.0, 32.0, 1200.0, None, 'https://cloud.google.com/tpu/docs/v4'),
    Chip('v5e', ('TPU v5 lite', 'TPU v5e'), 197.0, 16.0, 819.0, 400.0,
         'https://cloud.google.com/tpu/docs/v5e'),
    Chip('v5p', ('TPU v5p', 'TPU v5'), 459.0, 95.0, 2765.0, 600.0,
         'https://cloud.google.com/tpu/docs/v5p'),
    Chip('v6e', ('TPU v6 lite', 'TPU v6e'), 918.0, 32.0, 1638.0, 800.0,
         'https://cloud.google.com/tpu/docs/v6e'),
)


def by_name(name: str) -> Chip:
  """The chip of a topology name's generation ('v5e' or 'v5e:2x4')."""
  generation = name.partition(':')[0].strip().lower()
  for chip in TPUS:
    if chip.name == generation:
      return chip
  raise ValueError(f'TPU generation {generation!r} (from {name!r}) is not in the chip table; '
                   f'known: {[c.name for c in TPUS]} (encoder_jax/core/chips.py)')


def by_device_kind(kind: str) -> Chip | None:
  """The chip whose ``device_kind`` is ``kind`` (longest match first), or None."""
  pairs = sorted(((k, c) for c in TPUS for k in c.device_kinds), key=lambda p: -len(p[0]))
  for k, chip in pairs:
    if k.lower() in kind.lower():
      return chip
  return None


def peak_tflops_by_kind() -> dict[str, float]:
  """``device_kind`` -> bf16 peak TFLOP/s of every TPU in the table."""
  return {k: c.peak_bf16_tflops for c in TPUS for k in c.device_kinds}
