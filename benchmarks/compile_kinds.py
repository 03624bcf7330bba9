r"""Every registered model kind's train step compiled for one TPU slice at one shape: what
each kind costs beside BERT (docs/results/relative_attention_tpu.md).

  python benchmarks/compile_kinds.py --out=/tmp/kinds                  # every kind
  python benchmarks/compile_kinds.py --out=/tmp/kinds --only=bert,deberta,deberta_v2,xlnet
  python benchmarks/compile_kinds.py --out=/tmp/kinds --table_only    # from the JSON
  python benchmarks/compile_kinds.py --out=/tmp/kinds0 --only=bert,deberta \
      --set=--config.model.attention_dropout_rate=0                     # every kind's kernel

Needs libtpu, not a TPU. Each kind runs its base config (``KINDS``) through
``python -m encoder_jax.compile --noeval --json=OUT/<kind>.json`` in its own process with
the same shape for all (``SHAPE``: 32 sequences of 512 tokens a step on v5e:2x2, one
micro-batch, BERT's vocabulary; BERT's 512-token phase), and after each kind
``OUT/compile_kinds.md`` is rewritten: HBM a chip of the train step, the roofline's
compute and HBM bounds a step (XLA's FLOPs and bytes accessed of the whole stack compiled
unrolled, ``--whole_stack``; ``--extrapolate``: from 2 and 3 layers, quicker on deep stacks
and off by up to 20% for kinds with several kernels a layer), the tokens/s that roofline
allows, and how many times slower than BERT's that is.
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

from encoder_jax.models import registry  # pylint: disable=wrong-import-position

SHAPE = ('--topology=v5e:2x2', '--noeval', '--config.train.batch_size=32',
         '--config.train.grad_accum_steps=1', '--config.model.vocab_size=30522')
WHOLE_STACK = '--whole_stack'  # XLA's count of the whole unrolled stack, not extrapolated.
# kind -> (config argument, overrides that bring it to SHAPE's 512 tokens).
KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    'bert': ('configs/bert_base.py', ('--phases=1',)),
    'roberta': ('configs/roberta_base.py', ()),
    'albert': ('configs/albert_base.py', ()),
    'electra': ('configs/electra_base.py', ()),
    'deberta': ('configs/deberta_base.py', ()),
    'deberta_v2': ('configs/deberta_base.py:version=2', ()),
    'xlnet': ('configs/xlnet_base.py', ()),
    'modernbert': ('configs/modernbert_base.py',
                   ('--config.train.seq_lens=(512,)', '--config.train.max_predictions=(154,)',
                    '--config.train.phase_fractions=(1.0,)')),
}
# Registered kinds that are not a pretraining network of their own.
PARTS = {'electra_generator': "ELECTRA's generator (inside the electra row)"}
BASELINE = 'bert'


def _check_registry() -> None:
  missing = sorted(set(registry.KINDS) - set(KINDS) - set(PARTS))
  if missing:
    raise SystemExit(f'benchmarks/compile_kinds.py: registered kinds {missing} have no row in '
                     'KINDS (a base config) or PARTS')


def row(result: dict) -> dict | None:
  """The figures of a kind's 512-token phase: None if it failed or was not counted."""
  if 'error' in result or not result.get('phases'):
    return None
  p = result['phases'][-1]
  roof = p['roofline'] or {}
  if not roof:
    return None
  return dict(seq_len=p['seq_len'], hbm=p['train']['total_bytes'], fits=p['train']['fits'],
              compute_s=roof['compute_s'], memory_s=roof['memory_s'],
              tokens_per_s=roof['tokens_per_s'], compile_s=p['train']['compile_s'],
              counted='whole stack' if p.get('whole_stack') else 'from 2 and 3 layers')


def table(results: dict[str, dict]) -> str:
  """The Markdown table over the finished kinds (ratios to BERT where BERT is there)."""
  rows = {name: row(r) for name, r in results.items()}
  base = rows.get(BASELINE)
  lines = ['| kind | HBM a chip | compute bound | HBM bound | roofline tokens/s | vs BERT '
           '(tokens/s) | vs BERT (HBM) | counted |', '|---|---|---|---|---|---|---|---|']
  for name, r in rows.items():
    if r is None:
      error = results[name].get('error', 'no roofline')
      lines.append(f'| {name} | error: {error} | | | | | | |')
      continue
    slower = f'{base["tokens_per_s"] / r["tokens_per_s"]:.2f}x slower' if base else ''
    more = f'{r["hbm"] / base["hbm"]:.2f}x' if base else ''
    fits = '' if r['fits'] else ' (does not fit)'
    lines.append(f'| {name} | {r["hbm"] / 2 ** 30:.2f} GiB{fits} | {r["compute_s"] * 1e3:.2f} ms | '
                 f'{r["memory_s"] * 1e3:.2f} ms | {r["tokens_per_s"]:,.0f} | {slower} | {more} | '
                 f'{r["counted"]} |')
  return '\n'.join(lines) + '\n'


def _write(out: str, results: dict[str, dict]) -> str:
  text = table(results)
  with open(os.path.join(out, 'compile_kinds.md'), 'w', encoding='utf-8') as f:
    f.write(text)
  return text


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--out', required=True, help='Directory for the JSON files and the table.')
  parser.add_argument('--only', default='', help='Comma-separated kinds (default: all).')
  parser.add_argument('--timeout_s', type=int, default=3600, help='Per kind.')
  parser.add_argument('--set', action='append', default=[],
                      help='An argument added to every kind\'s command (repeatable), e.g. '
                      '--set=--config.model.attention_dropout_rate=0: without attention '
                      'dropout, the attention kernels (splash, DeBERTa\'s) run in training.')
  parser.add_argument('--extrapolate', action='store_true',
                      help='Count FLOPs and bytes at 2 and 3 layers, extrapolated to the stack '
                      '(quicker on deep stacks), not on the whole stack.')
  parser.add_argument('--table_only', action='store_true',
                      help='Compile nothing: the table from the JSON files in --out.')
  args = parser.parse_args()
  _check_registry()
  names = [n for n in args.only.split(',') if n] or list(KINDS)
  unknown = sorted(set(names) - set(KINDS))
  if unknown:
    parser.error(f'--only: unknown kinds {unknown}; known: {sorted(KINDS)}')
  os.makedirs(args.out, exist_ok=True)
  results: dict[str, dict] = {}
  for name in names:
    path = os.path.join(args.out, f'{name}.json')
    if args.table_only:
      if os.path.exists(path):
        with open(path, encoding='utf-8') as f:
          results[name] = json.load(f)
      continue
    config, overrides = KINDS[name]
    whole = () if args.extrapolate else (WHOLE_STACK,)
    command = [sys.executable, '-m', 'encoder_jax.compile', f'--config={config}', *SHAPE,
               *whole, *overrides, *args.set, f'--json={path}']
    print('$', ' '.join(command[1:]), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          timeout=args.timeout_s, check=False)
    print(proc.stdout, end='', flush=True)
    if proc.returncode not in (0, 1) or not os.path.exists(path):
      error = ([l for l in proc.stderr.splitlines() if l.startswith('error: ')]
               or proc.stderr.strip().splitlines()[-1:] or ['no output'])[0]
      results[name] = dict(error=error)
      print(proc.stderr[-2000:], file=sys.stderr)
    else:
      with open(path, encoding='utf-8') as f:
        results[name] = json.load(f)
    print(f'({name}: {time.perf_counter() - start:.0f} s)', flush=True)
    _write(args.out, results)
  print(_write(args.out, results), end='')


if __name__ == '__main__':
  main()
