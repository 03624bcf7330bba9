r"""Every shipped pretraining config compiled for a TPU slice it is meant for: the table of
docs/results/tpu_compile.md.

  python benchmarks/compile_configs.py --out=/tmp/tpu_compile          # every config
  python benchmarks/compile_configs.py --out=/tmp/tpu_compile --only=bert_base,electra_small
  python benchmarks/compile_configs.py --out=/tmp/tpu_compile --table_only   # from the JSON

Needs libtpu (``pip install -e '.[tpu]'``), not a TPU. Each row of ``ROWS`` names a config,
the slice it is compiled for and any overrides (the config's own batch always; a larger
``grad_accum_steps`` where a micro-batch must shrink to fit). Each config runs
``python -m encoder_jax.compile ... --json=OUT/<name>.json`` in its own process (so one
config's compile cannot disturb the next), and after each one ``OUT/tpu_compile.md`` is
rewritten with a Markdown table over what finished: config, slice, phase, tokens and
sequences a chip, HBM a chip against the compiler's limit, the verdict, the collectives a
step, the roofline tokens/s and MFU ceiling, and the compile time of the train step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from encoder_jax.core import chips  # pylint: disable=wrong-import-position

# name -> (topology, slices, overrides). Slices: the smallest of a generation where the
# config's own micro-batch fits (v5e: 16 GB a chip; v5p: 95 GB).
ROWS: dict[str, tuple[str, int, tuple[str, ...]]] = {
    'electra_small': ('v5e:2x2', 1, ()),
    'bert_base': ('v5e:4x4', 1, ()),
    'roberta_base': ('v5e:4x4', 1, ()),
    'albert_base': ('v5e:4x4', 1, ()),
    'spanbert_base': ('v5e:4x4', 1, ()),
    'electra_base': ('v5e:4x4', 1, ()),
    # 256 sequences a micro-batch do not fit a v5e chip at 16 a chip (19.33 GiB of
    # temporaries): 8 a chip.
    'deberta_base': ('v5e:4x4', 1, ('--config.train.grad_accum_steps=16',)),
    'xlnet_base': ('v5e:4x4', 1, ()),
    'bert_large': ('v5p:2x2x2', 1, ()),
    'xlnet_large': ('v5p:2x2x4', 1, ()),
    'modernbert_base': ('v5p:8x8x4', 1, ()),
}


def _gib(n: float) -> str:
  return f'{n / 2 ** 30:.2f}'


def _collectives(found: dict) -> str:
  return ', '.join(f'{kind} x{count:g} ({n / 2 ** 20:,.0f} MiB)'
                   for kind, (count, n) in sorted(found.items())) or 'none'


def table(results: dict[str, dict]) -> str:
  """The Markdown table over the finished configs."""
  lines = ['| config | slice | phase | a chip (tokens x seqs) | HBM a chip, GiB (train / eval, '
           'of limit) | verdict | collectives a train step | roofline tokens/s | MFU ceiling '
           '(compute bound alone) '
           '| XLA / formula FLOPs | train compile, s |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
  for name, r in results.items():
    if 'error' in r:
      lines.append(f'| {name} | {r["topology"]} | | | | error: {r["error"]} | | | | | |')
      continue
    for p in r['phases']:
      train, ev = p['train'], p['eval'] or {}
      per_chip = p['batch_size'] // p['grad_accum_steps'] / p['chips']
      accum = f' (accum {p["grad_accum_steps"]})' if p['grad_accum_steps'] > 1 else ''
      where = r['topology'] + (f' x {r["slices"]}' if r['slices'] > 1 else '')
      fits = train['fits'] and ev.get('fits', True)
      roof = p['roofline'] or {}
      if roof and 'compute_mfu' not in roof:  # Written before the compute-only ceiling.
        roof['compute_mfu'] = p['formula_flops'] / (
            roof['compute_s'] * p['chips'] * chips.by_name(r['topology']).peak_bf16_tflops * 1e12)
      cells = [name, where, str(p['phase']), f'{p["seq_len"]} x {per_chip:g}{accum}',
               f'{_gib(train["total_bytes"])} / {_gib(ev.get("total_bytes", 0))} of '
               f'{_gib(train["hbm_limit_bytes"])}',
               'fits' if fits else '**does not fit**', _collectives(train['collectives']),
               f'{roof["tokens_per_s"]:,.0f}' if roof else '',
               f'{roof["mfu"]:.0%} ({roof["compute_mfu"]:.0%})' if roof else '',
               f'{p["flops_ratio"]:.3f}' if p['flops_ratio'] else '',
               f'{train["compile_s"]:.0f}']
      lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--out', required=True, help='Directory for the JSON files and the table.')
  parser.add_argument('--only', default='', help='Comma-separated row names (default: all).')
  parser.add_argument('--timeout_s', type=int, default=7200, help='Per config.')
  parser.add_argument('--table_only', action='store_true',
                      help='Compile nothing: write the table from the JSON files in --out.')
  args = parser.parse_args()
  names = [n for n in args.only.split(',') if n] or list(ROWS)
  unknown = sorted(set(names) - set(ROWS))
  if unknown:
    parser.error(f'--only: unknown rows {unknown}; known: {sorted(ROWS)}')
  os.makedirs(args.out, exist_ok=True)
  results: dict[str, dict] = {}
  if args.table_only:
    for name in names:
      path = os.path.join(args.out, f'{name}.json')
      if os.path.exists(path):
        with open(path, encoding='utf-8') as f:
          results[name] = json.load(f)
    with open(os.path.join(args.out, 'tpu_compile.md'), 'w', encoding='utf-8') as f:
      f.write(table(results))
    return
  for name in names:
    topology, slices, overrides = ROWS[name]
    path = os.path.join(args.out, f'{name}.json')
    command = [sys.executable, '-m', 'encoder_jax.compile', f'--config=configs/{name}.py',
               f'--topology={topology}', f'--slices={slices}', f'--json={path}', *overrides]
    print('$', ' '.join(command[1:]), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          timeout=args.timeout_s, check=False)
    print(proc.stdout, end='', flush=True)
    if proc.returncode not in (0, 1) or not os.path.exists(path):
      error = ([l for l in proc.stderr.splitlines() if l.startswith('error: ')]
               or proc.stderr.strip().splitlines()[-1:] or ['no output'])[0]
      results[name] = dict(topology=topology, slices=slices, error=error)
      print(proc.stderr[-2000:], file=sys.stderr)
    else:
      with open(path, encoding='utf-8') as f:
        results[name] = json.load(f)
    print(f'({name}: {time.perf_counter() - start:.0f} s)', flush=True)
    with open(os.path.join(args.out, 'tpu_compile.md'), 'w', encoding='utf-8') as f:
      f.write(table(results))


if __name__ == '__main__':
  main()
