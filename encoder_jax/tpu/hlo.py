"""What a compiled program's HLO text says that its cost and memory analyses do not: the
collectives a step runs, by kind, with their bytes (a while loop's body counted its trip
count times). ``programs`` reads every compiled TPU program through it.
"""

from __future__ import annotations

import collections
import math
import re

COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute')
_DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'f16': 2, 'bf16': 2, 's32': 4,
                'u32': 4, 'f32': 4, 's64': 8, 'u64': 8, 'f64': 8, 'c64': 8, 'c128': 16}
_ARRAY = re.compile(r'\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s([a-z][\w\-]*)\(')
_COMPUTATION = re.compile(r'^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$')
_CALLS = re.compile(r'\b(body|condition|calls|to_apply|branch_computations|true_computation|'
                    r'false_computation)=(?:\{([^}]*)\}|(%?[\w.\-]+))')
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


def _shape_bytes(shape_text: str) -> float:
  total = 0.0
  for dtype, dims in _ARRAY.findall(shape_text):
    size = _DTYPE_BYTES.get(dtype, 1 if dtype.startswith('f8') else 0)
    total += size * math.prod(int(d) for d in dims.split(',') if d)
  return total


def collectives(hlo_text: str) -> dict[str, list[float]]:
  """``kind -> [count, bytes]`` of the collectives one execution of a compiled HLO module
  runs on a chip: every all-reduce, all-gather, reduce-scatter, all-to-all and
  collective-permute (their ``-start`` halves for asynchronous ones), with the bytes of its
  output. An op in a while loop's body counts ``known_trip_count`` times (the layer scan,
  gradient accumulation); one in a conditional's branch counts once."""
  computations: dict[str, list[str]] = {}
  entry, current = None, None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)  # Headers start at column 0, instructions indented.
    if header and not line[:1].isspace():
      current = header.group(2)
      computations[current] = []
      if header.group(1):
        entry = current
      continue
    if current is not None:
      computations[current].append(line)
  if entry is None:
    return {}
  multiplier: dict[str, float] = collections.defaultdict(float)
  multiplier[entry] = 1.0
  order, seen = [entry], {entry}
  for name in order:  # Breadth-first over the call graph from the entry.
    for line in computations.get(name, []):
      trip = _TRIP.search(line)
      for role, listed, single in _CALLS.findall(line):
        factor = int(trip.group(1)) if role == 'body' and trip else 1
        for callee in (c.strip().lstrip('%') for c in (listed or single).split(',')):
          if callee in computations:
            multiplier[callee] += multiplier[name] * factor
            if callee not in seen:
              seen.add(callee)
              order.append(callee)
  out: dict[str, list[float]] = {}
  for name, lines in computations.items():
    for line in lines:
      found = _INSTRUCTION.match(line)
      if not found:
        continue
      shape, opcode = found.groups()
      kind = opcode.removesuffix('-start')
      if kind in COLLECTIVES and multiplier[name]:
        shape_bytes = _shape_bytes(shape)
        if opcode.endswith('-start') and shape.startswith('('):
          shape_bytes /= 2  # An async start's tuple holds the operand and the result.
        count = out.setdefault(kind, [0.0, 0.0])
        count[0] += multiplier[name]
        count[1] += multiplier[name] * shape_bytes
  return out
