r"""Compiles a config's training for a TPU slice on any host, and says what fits and how fast.

  python -m encoder_jax.compile --config=configs/bert_base.py --topology=v5e:4x4
  python -m encoder_jax.compile --config=configs/modernbert_base.py --topology=v5p:4x4x4 --fit
  python -m encoder_jax.compile --config=configs/bert_base.py --topology=v5e:2x4 --slices=2 \
      --config.mesh.fsdp=8 --config.mesh.data=1

Needs libtpu (``pip install 'encoder_jax[tpu]'``), not a TPU. For every length phase of the
config it builds the run's own train step and eval step on the config's mesh
(``mesh.*`` within a slice, ``mesh.dcn_*`` across ``--slices``) over the slice's devices and
compiles them with the TPU compiler (``encoder_jax.tpu.aot``). Per phase and per chip it
prints: HBM (params + optimizer state, temporaries, total) against what the compiler allows
a chip, with a verdict (fits / does not fit); the collectives a step runs, by kind, with
their bytes; XLA's FLOPs a step (layers unrolled) beside the objective's formula; and the
roofline: the step's lower bound from FLOPs at the chip's bf16 peak and from bytes at its
HBM bandwidth (``encoder_jax.core.chips``), so the tokens/s and MFU that bound allows.

``--fit`` finds, by compiling, the smallest ``train.grad_accum_steps`` (largest micro-batch
a chip) that fits each phase, with ``model.remat`` off and on, and prints the overrides.
The exit status is 0 when every compiled program fits, 1 when one does not; a topology that
libtpu refuses, a config error or a missing libtpu is one ``error:`` line (status 2).
``--json=PATH`` also writes the figures.
"""

from __future__ import annotations

import json
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from encoder_jax.tpu import aot
from encoder_jax.tpu import fitting
from encoder_jax.tpu import programs
from encoder_jax.tpu import summary
from encoder_jax import cli

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_string('topology', None, 'The TPU slice: GENERATION:AxB[xC], e.g. '
                                'v5e:2x4, v5e:4x4, v5p:2x2x1, v4:2x2x1, v6e:2x2.')
_SLICES = flags.DEFINE_integer('slices', 1, 'Slices of --topology (multislice, over the '
                               'data-centre network: config.mesh.dcn_*).')
_PHASES = flags.DEFINE_list('phases', None, 'Phase indices to compile (default: all).')
_EVAL = flags.DEFINE_bool('eval', True, 'Also compile the eval step of each phase.')
_FLOPS = flags.DEFINE_bool('flops', True, "Also compile one micro-batch with the layers "
                           "unrolled for XLA's FLOPs and bytes (the roofline).")
_WHOLE = flags.DEFINE_bool('whole_stack', False, "Count XLA's FLOPs and bytes on the whole "
                           'stack compiled unrolled, not extrapolated from 2 and 3 layers '
                           '(slower to compile on deep stacks; not an estimate).')
_FIT = flags.DEFINE_bool('fit', False, 'Search the grad_accum_steps and remat that fit each '
                         'phase, by compiling.')
_JSON = flags.DEFINE_string('json', None, 'Also write the figures as JSON to this path.')
flags.mark_flags_as_required(['config', 'topology'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config, topology = _CONFIG.value, _TOPOLOGY.value
  devices = programs.topology_devices(topology, _SLICES.value)
  slices = f' x {_SLICES.value} slices' if _SLICES.value > 1 else ''
  target = programs.build(config, devices)
  print(f'{config.model.kind} ({config.model.num_layers} x {config.model.hidden_size}, '
        f'{config.model.dtype}) on {topology}{slices}: {len(devices)} x '
        f'{devices[0].device_kind}, mesh {dict(target.mesh.shape)}; HBM a chip '
        f'{summary.gib(programs.hbm_limit(devices[0]))} (the compiler\'s limit)', flush=True)
  wanted = ([int(p) for p in _PHASES.value] if _PHASES.value
            else list(range(len(target.phases))))
  for i in wanted:
    if not 0 <= i < len(target.phases):
      raise ValueError(f'--phases: {i} is not a phase of this config (0 .. '
                       f'{len(target.phases) - 1})')
  out, all_fit = [], True
  for i in wanted:
    if _FIT.value:
      found = fitting.fit(config, devices, i)
      for line in summary.fit_lines(found):
        print(line, flush=True)
      all_fit &= found.best is not None
      out.append(dict(phase=i, tried=found.tried, best=found.best))
      continue
    report = aot.compile_phase(target, target.phases[i], with_eval=_EVAL.value,
                               with_flops=_FLOPS.value, whole_stack=_WHOLE.value)
    for line in summary.report_lines(report):
      print(line, flush=True)
    all_fit &= report.fits
    out.append(summary.as_json(report))
  if _JSON.value:
    with open(_JSON.value, 'w', encoding='utf-8') as f:
      json.dump(dict(command=sys.argv[1:], topology=topology,
                     slices=_SLICES.value, phases=out), f, indent=2, default=str)
  if not all_fit:
    sys.exit(1)


if __name__ == '__main__':
  cli.run(main)
