"""Deterministic seeds for every random choice of the input pipeline.

Every random decision is a pure function of ``(config.seed, purpose, epoch, document...)``,
so the example stream does not depend on how it is split across processes or where it was
interrupted. ``mix`` is SplitMix64 folded over the integers, fast enough per document.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1

# Purposes, so that e.g. the epoch shuffle and the NSP draws never share a seed.
EPOCH_ORDER = 1
DOCUMENT = 2
POOL_SHUFFLE = 3
HELD_OUT = 4
TOKENIZER_SAMPLE = 5
EVAL = 6


def _splitmix64(x: int) -> int:
  x = (x + 0x9E3779B97F4A7C15) & _MASK64
  x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
  x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
  return x ^ (x >> 31)


def mix(*values: int) -> int:
  """A 64-bit seed from integers (order matters); equal inputs give equal seeds."""
  h = 0x243F6A8885A308D3
  for v in values:
    h = _splitmix64(h ^ (int(v) & _MASK64))
  return h


def unit_interval(*values: int) -> float:
  """A deterministic pseudo-random float in [0, 1) from integers."""
  return (mix(*values) >> 11) * (1.0 / (1 << 53))
