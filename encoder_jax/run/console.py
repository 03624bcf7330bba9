"""What a training run prints: a tool's console, not a log dump.

One header (what runs: model, objectives, mesh, parameters, data), one short progress line
per logged step (step, loss, accuracy, tokens/s, ETA), eval and checkpoint lines, and a
closing summary with the commands to try next. Everything else (the full parameter table,
library notes) goes to the log (``--verbosity=0`` or lower shows INFO) or the workdir.
Only process 0 prints.
"""

from __future__ import annotations

import sys
import time
from typing import Mapping

# The loss first and the learning rate last; between them, the metrics the pretraining
# setup declares (``trainable.Trainable.console_metrics``: each objective names its
# own). The rest is in metrics.jsonl / TensorBoard.
_FIRST = (('loss', 'loss', '{:.4f}'),)
_LAST = (('learning_rate', 'lr', '{:.2e}'),)


def _duration(seconds: float) -> str:
  seconds = int(round(max(seconds, 0)))
  h, rest = divmod(seconds, 3600)
  m, s = divmod(rest, 60)
  return f'{h}h{m:02d}m' if h else (f'{m}m{s:02d}s' if m else f'{s}s')


def _rate(x: float) -> str:
  for unit, scale in (('M', 1e6), ('k', 1e3)):
    if x >= scale:
      return f'{x / scale:.1f}{unit}'
  return f'{x:.0f}'


class Console:
  """Prints the run's lines on process 0 (``enabled``) to ``stream`` (stdout); progress
  lines show ``shown`` ((metric key, short name, format), the objectives' own)."""

  def __init__(self, enabled: bool = True, stream=None,
               shown: tuple[tuple[str, str, str], ...] = ()):
    self.enabled = enabled
    self.shown = _FIRST + tuple(shown) + _LAST
    self.stream = stream or sys.stdout
    self.start = time.perf_counter()

  def say(self, text: str) -> None:
    if self.enabled:
      print(text, file=self.stream, flush=True)

  def metrics_line(self, step: int, total: int, scalars: Mapping[str, float],
                   split: str = 'train', eta_s: float | None = None) -> str:
    parts = [f'{split:5s} step {step:>{len(str(total))}d}/{total}']
    for key, name, fmt in self.shown:
      if key in scalars and not (split == 'eval' and key == 'learning_rate'):
        parts.append(f'{name} {fmt.format(scalars[key])}')
    if 'tokens_per_s' in scalars:
      parts.append(f'{_rate(scalars["tokens_per_s"])} tok/s')
    if 'mfu' in scalars:
      parts.append(f'MFU {scalars["mfu"]:.1%}')
    if scalars.get('nonfinite'):
      parts.append(f'{int(scalars["nonfinite"])} non-finite (skipped)')
    if eta_s is not None:
      parts.append(f'ETA {_duration(eta_s)}')
    return '  '.join(parts)

  def metrics(self, step: int, total: int, scalars: Mapping[str, float], split: str = 'train',
              eta_s: float | None = None) -> None:
    self.say(self.metrics_line(step, total, scalars, split, eta_s))

  def elapsed(self) -> str:
    return _duration(time.perf_counter() - self.start)


def next_commands(workdir: str) -> list[str]:
  return [f'python -m encoder_jax.evaluate --workdir={workdir}',
          f'python -m encoder_jax.fill_mask --workdir={workdir} --text="The capital of France '
          'is [MASK]."',
          f'python -m encoder_jax.embed --workdir={workdir} --input=sentences.txt '
          '--output=emb.npy',
          f'python -m encoder_jax.convert workdir_to_hf --workdir={workdir} --out={workdir}/hf',
          f'python -m encoder_jax.plot --workdir={workdir}']
