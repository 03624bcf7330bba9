r"""Loss and accuracy curves of a run as a PNG, for machines without TensorBoard at hand.

  python -m encoder_jax.plot --workdir=DIR [--out=loss.png]

Reads ``<workdir>/metrics.jsonl`` (one row per step and split; see ``metrics_log.read_metrics``)
and draws two panels: every ``*loss`` and every ``*accuracy`` metric, training as lines and
held-out evaluation as dots. ``--out`` defaults to ``<workdir>/loss.png``; ``gs://`` paths
work for both.
"""

from __future__ import annotations

import io
import sys

from absl import app
from absl import flags
from etils import epath

from encoder_jax.core import extras
from encoder_jax.run import metrics_log as metrics_lib
from encoder_jax.run import workdir as workdir_lib

PANELS = (('loss', 'Loss'), ('accuracy', 'Accuracy'))


def _series(rows: list[dict], split: str, suffix: str) -> dict[str, tuple[list, list]]:
  """{metric name: (steps, values)} of ``split``'s finite metrics ending in ``suffix``."""
  out: dict[str, tuple[list, list]] = {}
  for row in rows:
    if row.get('split', 'train') != split:
      continue
    for key, value in row.items():
      if key.endswith(suffix) and isinstance(value, (int, float)) and value == value:
        steps, values = out.setdefault(key, ([], []))
        steps.append(int(row['step']))
        values.append(float(value))
  return out


def plot(workdir: str, out: str | None = None) -> str:
  """Writes the curves of ``workdir`` to ``out`` (default ``<workdir>/loss.png``); its path."""
  Figure = extras.require(  # pylint: disable=invalid-name
      'matplotlib.figure', extra='plot', what='encoder_jax.plot draws with matplotlib').Figure
  rows = metrics_lib.read_metrics(workdir)
  if not rows:
    raise ValueError(f'{workdir_lib.path(workdir, metrics_lib.METRICS_FILE)} holds no metrics '
                     'yet (the first are logged after train.log_every_steps steps)')
  fig = Figure(figsize=(11, 4.2), layout='constrained')
  axes = fig.subplots(1, len(PANELS))
  for ax, (suffix, title) in zip(axes, PANELS):
    drawn = 0
    by_split = {split: _series(rows, split, suffix) for split in ('train', 'eval')}
    names = sorted({n for series in by_split.values() for n in series})
    for split, style in (('train', dict(linewidth=1.2)),
                         ('eval', dict(marker='o', markersize=4, linestyle='--'))):
      for name, (steps, values) in sorted(by_split[split].items()):  # One colour per metric.
        ax.plot(steps, values, label=f'{split} {name}', color=f'C{names.index(name) % 10}',
                **style)
        drawn += 1
    ax.set_title(title)
    ax.set_xlabel('step')
    ax.grid(alpha=0.3)
    if drawn:
      ax.legend(fontsize=8)
    else:
      ax.text(0.5, 0.5, f'no *{suffix} metrics', ha='center', va='center',
              transform=ax.transAxes)
  fig.suptitle(str(workdir_lib.path(workdir)), fontsize=9)
  target = epath.Path(out) if out else workdir_lib.path(workdir, 'loss.png')
  buffer = io.BytesIO()
  fig.savefig(buffer, format='png', dpi=110)
  target.parent.mkdir(parents=True, exist_ok=True)
  target.write_bytes(buffer.getvalue())
  return str(target)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not flags.FLAGS.workdir:
    raise app.UsageError('--workdir is required')
  try:
    written = plot(flags.FLAGS.workdir, flags.FLAGS.out)
  except (FileNotFoundError, ValueError, extras.MissingExtra) as e:  # One line, no trace.
    print(f'encoder_jax.plot: {e}', file=sys.stderr)
    sys.exit(1)
  print(f'Wrote {written}')


if __name__ == '__main__':
  flags.DEFINE_string('workdir', None, 'Workdir holding metrics.jsonl.')
  flags.DEFINE_string('out', None, 'PNG path (default: <workdir>/loss.png).')
  app.run(main)
