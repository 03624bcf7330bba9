"""The bake-off's results as a Markdown table and a figure (``encoder_jax.bakeoff`` writes
them into ``--out`` after every row: ``bakeoff.md``, ``bakeoff.json``, ``bakeoff.png``)."""

from __future__ import annotations

import json
import os

from encoder_jax.core import extras


def _fmt(summary: dict) -> str:
  return (f'{summary["accuracy"]:.1%} ± {summary["accuracy_std"]:.1%} '
          f'(F1 {summary["macro_f1"]:.3f})')


def _frozen_fmt(point: dict) -> str:
  f = point.get('frozen')
  return f'{f["accuracy"]:.1%} (F1 {f["macro_f1"]:.3f})' if f else '-'


def best_baseline(results: dict) -> tuple[str, dict] | None:
  """(network, summary) of the from-scratch baseline with the best test accuracy."""
  base = results.get('from_scratch') or {}
  if not base:
    return None
  return max(base.items(), key=lambda kv: kv[1]['accuracy'])


def table(results: dict) -> str:
  """The Markdown table: every row, then every from-scratch baseline, then every public
  reference; each line's gain is against the best baseline (the bar a pretrained row has
  to clear). The half-budget column is there when some row was probed half-way."""
  best = best_baseline(results)
  base = best[1] if best else None
  halves = any(len(r['points']) > 1 for r in results['rows'].values())
  head = ['row', 'pretraining steps', 'training FLOPs', 'wall time', 'final loss',
          "held-out MLM accuracy (own masking rate; BERT's 15%)",
          *(['probe accuracy (half budget)'] if halves else []),
          'probe accuracy (full budget)', 'fine-tuning rate', 'vs best from scratch',
          'frozen features']
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for name, r in results['rows'].items():
    full = r['points'][-1]
    half = [_fmt(r['points'][0]) if len(r['points']) > 1 else '-'] if halves else []
    held = r.get('heldout', {})
    mlm = held.get('mlm_accuracy', held.get('generator_mlm_accuracy'))
    mlm = '-' if mlm is None else f'{mlm:.1%}'
    if 'mlm_accuracy_15' in held:
      mlm += f' ({held["mlm_accuracy_15"]:.1%} at 15%)'
    gain = _gain(full, base)
    label = f'{name} ({r["overrides"]})' if r.get('overrides') else name
    if r.get('starts_from'):
      label += f' [from {"/".join(r["starts_from"].rstrip("/").split("/")[-2:])}]'
    cells = [label, str(r['steps']), f'{r["flops"]:.3g}', f'{r["wall_s"]:.0f} s',
             f'{r["final_loss"]:.3f}', mlm, *half, _fmt(full), _rate(full), gain,
             _frozen_fmt(full)]
    lines.append('| ' + ' | '.join(cells) + ' |')
  for name, b in (results.get('from_scratch') or {}).items():
    cells = [f'from scratch ({name} network)', '0', '0', '-', '-', '-',
             *(['-'] if halves else []), _fmt(b), _rate(b), '', _frozen_fmt(b)]
    lines.append('| ' + ' | '.join(cells) + ' |')
  for name, ref in (results.get('references') or {}).items():
    cells = [f'reference: {name} (public checkpoint, not pretrained here)', '-', '-', '-', '-',
             '-', *(['-'] if halves else []), _fmt(ref), _rate(ref), _gain(ref, base),
             _frozen_fmt(ref)]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _gain(summary: dict, base: dict | None) -> str:
  """A line's probe accuracy against the best from-scratch baseline, and whether the
  difference is beyond the seed spread ('' without a baseline)."""
  if not base:
    return ''
  delta = summary['accuracy'] - base['accuracy']
  spread = max(summary['accuracy_std'], base['accuracy_std'])
  return f'{delta:+.1%} ' + ('(within the seed spread)' if abs(delta) <= spread else
                             f'({"better" if delta > 0 else "worse"}, beyond the seed spread)')


def _rate(summary: dict) -> str:
  rate = summary.get('learning_rate')
  return '-' if rate is None else f'{rate:g}'


def write(out: str, results: dict) -> None:
  with open(os.path.join(out, 'bakeoff.json'), 'w', encoding='utf-8') as f:
    json.dump(results, f, indent=2)
  with open(os.path.join(out, 'bakeoff.md'), 'w', encoding='utf-8') as f:
    f.write(table(results) + '\n')
  plot(results, os.path.join(out, 'bakeoff.png'))


def plot(results: dict, path: str) -> None:
  """Probe accuracy (mean, min..max over seeds) against pretraining FLOPs, one line a row."""
  Figure = extras.require(  # pylint: disable=invalid-name
      'matplotlib.figure', extra='bakeoff', what='The bake-off figure is drawn with matplotlib'
  ).Figure
  fig = Figure(figsize=(7, 4.5))
  ax = fig.subplots()
  best = best_baseline(results)
  base = best[1] if best else None
  for name, r in results['rows'].items():
    xs = [0.0] + [p['flops'] for p in r['points']] if base else [p['flops'] for p in r['points']]
    pts = ([base] if base else []) + r['points']
    ys = [p['accuracy'] for p in pts]
    err = [[p['accuracy'] - p['accuracy_min'] for p in pts],
           [p['accuracy_max'] - p['accuracy'] for p in pts]]
    ax.errorbar(xs, ys, yerr=err, marker='o', capsize=3, label=name)
  if base:
    ax.axhline(base['accuracy'], color='gray', linestyle='--',
               label=f'best from scratch ({best[0]} network)')
  for name, ref in (results.get('references') or {}).items():
    ax.axhline(ref['accuracy'], linestyle=':', color='black', label=f'reference: {name}')
  ax.set_xlabel('pretraining FLOPs (as MFU counts them)')
  ax.set_ylabel('probe test accuracy')
  ax.set_title('What each objective buys at equal compute')
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
