"""What the compile command prints and writes: a phase's lines (:func:`report_lines`), its
JSON (:func:`as_json`) and the fit search's lines (:func:`fit_lines`).
"""

from __future__ import annotations



from encoder_jax.tpu import aot
from encoder_jax.tpu import fitting
from encoder_jax.tpu import programs


def gib(n: float) -> str:
  """Bytes in GiB (MiB below one GiB)."""
  return f'{n / programs.GIB:.2f} GiB' if n >= programs.GIB else f'{n / 2 ** 20:.1f} MiB'


def _collective_line(found: dict) -> str:
  if not found:
    return 'none'
  return ', '.join(f'{kind} x{count:g} ({n / 2 ** 20:,.1f} MiB)'
                   for kind, (count, n) in sorted(found.items()))


def _program_lines(p: programs.Program) -> list[str]:
  verdict = 'fits' if p.fits else 'does not fit'
  if p.refusal:
    return [f'{p.name} step: {verdict}: the compiler refused it ({p.refusal}); state '
            f'{gib(p.state)} a chip; compile {p.compile_s:.0f} s']
  return [f'{p.name} step: {verdict}: {gib(p.total)} of {gib(p.hbm_limit)} a chip (state '
          f'{gib(p.state)}, temporaries {gib(p.temporaries)}, arguments {gib(p.arguments)}); '
          f'compiled in {p.compile_s:.0f} s',
          f'  collectives a step: {_collective_line(p.collectives)}; attention kernels '
          f'(Pallas splash) in the program: {p.kernels}']


def report_lines(r: aot.PhaseReport) -> list[str]:
  """The printed lines of one phase."""
  micro = r.batch_size // r.grad_accum_steps
  lines = [f'phase {r.phase.index}: {r.phase.seq_len} tokens x {r.batch_size} sequences '
           f'({r.grad_accum_steps} micro-batch{"es" * (r.grad_accum_steps > 1)} of {micro}, '
           f'{micro / r.chips:g} a chip; remat {"on" if r.remat else "off"})']
  for p in (r.train, r.eval):
    if p is not None:
      lines += ['  ' + line for line in _program_lines(p)]
  if r.xla_flops:
    counted = ('the whole stack unrolled' if r.whole_stack
               else 'layers unrolled, extrapolated from 2 and 3')
    lines.append(f'  FLOPs a step: XLA {r.xla_flops * r.chips:.4g} ({counted}; compiled '
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


def as_json(r: aot.PhaseReport) -> dict:
  program = lambda p: None if p is None else dict(
      fits=p.fits, total_bytes=p.total, hbm_limit_bytes=p.hbm_limit, state_bytes=p.state,
      temporaries_bytes=p.temporaries, arguments_bytes=p.arguments, compile_s=p.compile_s,
      collectives=p.collectives, refusal=p.refusal, kernels=p.kernels)
  return dict(phase=r.phase.index, seq_len=r.phase.seq_len, batch_size=r.batch_size,
              grad_accum_steps=r.grad_accum_steps, remat=r.remat, chips=r.chips,
              train=program(r.train), eval=program(r.eval), xla_flops_per_chip=r.xla_flops,
              xla_bytes_per_chip=r.xla_bytes, whole_stack=r.whole_stack,
              formula_flops=r.formula_flops,
              flops_ratio=r.flops_ratio, roofline=r.roofline())


def fit_lines(f: fitting.Fit) -> list[str]:
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
