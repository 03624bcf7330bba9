"""Training metrics: peak FLOP/s for MFU (model FLOPs come from the objective), and a writer for TensorBoard, JSONL and the console.

``metrics.jsonl`` holds each (step, split) once. A run resumed from step S redoes the steps
after S that the killed run had already logged; the writer, told S, moves those lines to
``metrics_superseded.jsonl`` (kept, each tagged with the resume that superseded it) when it
opens, and TensorBoard is told to purge them too, so plots and ``read_metrics`` see one
history. ``read_metrics`` also keeps the last line of a duplicated (step, split), for
files written before this rule.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Mapping

import jax
from absl import logging

from encoder_jax.core import chips
from encoder_jax.core import extras
from encoder_jax.storage import appends as storage_appends
from encoder_jax.run import workdir as workdir_lib

# Dense bf16 peak TFLOP/s per device (vendor figures), matched against device_kind: the
# GPUs here, the TPUs from the chip table (``encoder_jax.core.chips``).
PEAK_TFLOPS = {
    'H100': 989.0, 'H200': 989.0, 'A100': 312.0, 'L4': 121.0, 'B200': 2250.0, 'TPU v3': 123.0,
    **chips.peak_tflops_by_kind(),
}


def peak_tflops_per_device(configured: float = 0.0) -> float:
  """The configured peak, else the table entry for this device kind, else 0 (unknown)."""
  if configured:
    return float(configured)
  kind = jax.devices()[0].device_kind
  for name in sorted(PEAK_TFLOPS, key=len, reverse=True):
    if name.lower() in kind.lower():
      return PEAK_TFLOPS[name]
  return 0.0


METRICS_FILE = 'metrics.jsonl'
SUPERSEDED_FILE = 'metrics_superseded.jsonl'
# On gs://, metrics.jsonl is appended to by a thread of its own, soon after each write and at
# most this often (never a request on the training thread:
# storage_appends.BackgroundAppender), and
# tensorboardX's thread flushes event files this often; its queue holds this many events,
# so a flush slowed by an outage does not make add_scalar wait.
JSONL_FLUSH_S = 1.0
TENSORBOARD_FLUSH_S = 120.0
TENSORBOARD_QUEUE = 10_000


class MetricWriter:
  """Writes scalars to TensorBoard event files, ``metrics.jsonl`` and the log.

  ``resume_step``: the step training continues from (0 for a start from scratch): lines
  of later steps, left by a run that died after them, are superseded (see the module
  docstring). None appends without looking (a tool adding lines to a finished run).

  On ``gs://`` neither a slow bucket nor an outage reaches training: ``write`` queues what it
  writes, and a failed flush is logged and tried again (JSONL_FLUSH_S, TENSORBOARD_FLUSH_S).
  """

  def __init__(self, workdir: str, enabled: bool = True, resume_step: int | None = None):
    self.enabled = enabled
    self._tb = None
    self._jsonl = None
    self.superseded = 0  # Lines moved to SUPERSEDED_FILE when opening.
    if enabled:
      workdir_lib.path(workdir).mkdir(parents=True, exist_ok=True)
      path = workdir_lib.path(workdir, METRICS_FILE)
      _drop_partial_last_line(path)
      if resume_step is not None:
        self.superseded = _supersede_after(path, workdir_lib.path(workdir, SUPERSEDED_FILE),
                                           int(resume_step))
      self._tb = _summary_writer(str(workdir_lib.path(workdir, 'tensorboard')),
                                 None if resume_step is None else int(resume_step) + 1)
      self._jsonl = storage_appends.open_append(  # gs://: appends by compose, in a thread.
          path, background_s=JSONL_FLUSH_S)

  def write(self, step: int, scalars: Mapping[str, float], prefix: str = 'train') -> None:
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    for k, v in scalars.items():
      self._tb.add_scalar(f'{prefix}/{k}', v, step)
    self._jsonl.write(json.dumps({'step': step, 'split': prefix, 'time': time.time(),
                                  **scalars}) + '\n')
    self._jsonl.flush()  # Local files now; gs:// in the appender's thread.
    # The full line goes to the log; the console shows a short one (encoder_jax.run.console).
    logging.info('[%s] step %d %s', prefix, step,
                 ' '.join(f'{k}={_fmt(v)}' for k, v in scalars.items()))

  def close(self) -> None:
    if self.enabled:
      self._tb.close()
      self._jsonl.close()


def _summary_writer(logdir: str, purge_step: int | None = None):
  """TensorBoard event files: tensorboardX locally and on gs:// (there through
  google-cloud-storage, which honours STORAGE_EMULATOR_HOST: encoder_jax.storage.appends);
  TensorFlow's writer for other remote file systems.

  ``purge_step``: TensorBoard hides this run's earlier events at steps >= it (redone after
  a resume). tf.summary has no such flag; TensorBoard drops the out-of-order steps itself.
  """
  if '://' in logdir and not logdir.startswith('gs://'):
    return _TfSummaryWriter(logdir)
  with _tensorboardx_without_torch():
    if logdir.startswith('gs://'):
      storage_appends.tensorboardx(logdir)  # Appends by compose; or the gcs extra named.
    import tensorboardX  # pylint: disable=g-import-not-at-top
  return tensorboardX.SummaryWriter(logdir, purge_step=purge_step, max_queue=TENSORBOARD_QUEUE,
                                    flush_secs=TENSORBOARD_FLUSH_S)


@contextlib.contextmanager
def _tensorboardx_without_torch():
  """tensorboardX's writer module imports torch where it is installed, only to accept torch
  tensors as values (about 2 s of CPU in every run's process); the writer is given floats.
  While tensorboardX is first imported, an import of torch finds none (unless torch is
  already imported); nothing else changes."""
  if 'torch' in sys.modules or 'tensorboardX.writer' in sys.modules:
    yield
    return
  sys.modules['torch'] = None  # `import torch` raises ImportError, as where it is absent.
  try:
    yield
  finally:
    if 'torch' in sys.modules and sys.modules['torch'] is None:
      del sys.modules['torch']


class _TfSummaryWriter:
  """The tensorboardX calls we use, on ``tf.summary`` (which writes to remote file systems)."""

  def __init__(self, logdir: str):
    tf = extras.require('tensorflow', extra='gcs', what=f'TensorBoard events in {logdir} are '
                        'written through TensorFlow (tf.summary)')
    self._tf = tf
    self._writer = tf.summary.create_file_writer(logdir)

  def add_scalar(self, tag: str, value: float, step: int) -> None:
    with self._writer.as_default():
      self._tf.summary.scalar(tag, value, step=step)

  def close(self) -> None:
    self._writer.close()


def _drop_partial_last_line(path) -> None:
  """A run killed mid-write leaves half a JSON line; cut it so appends stay valid JSONL."""
  if not path.exists():
    return
  content = path.read_bytes()
  if content and not content.endswith(b'\n'):
    logging.warning('%s ends with a partial line (killed run?); removing it.', path)
    path.write_bytes(content[:content.rfind(b'\n') + 1])


def _supersede_after(path, superseded_path, resume_step: int) -> int:
  """Moves the lines of steps > ``resume_step`` from ``path`` to ``superseded_path``.

  The kept lines are rewritten through a temporary file and a rename, after the moved ones
  were appended to ``superseded_path``: a crash in between duplicates lines there, never
  loses one. Returns how many lines moved.
  """
  if not path.exists():
    return 0
  keep, moved = [], []
  for line in path.read_text().splitlines(keepends=True):
    try:
      step = int(json.loads(line)['step'])
    except (ValueError, KeyError, TypeError):
      keep.append(line)  # Not ours to judge; a reader skips what it cannot parse.
      continue
    (moved if step > resume_step else keep).append(line)
  if not moved:
    return 0
  stamp = time.time()
  tagged = []
  for line in moved:
    row = json.loads(line)
    row.update(superseded_by_resume_from=resume_step, superseded_time=stamp)
    tagged.append(json.dumps(row) + '\n')
  with storage_appends.open_append(superseded_path) as f:
    f.writelines(tagged)
  tmp = path.with_name(f'.{path.name}.tmp-{os.getpid()}')
  tmp.write_text(''.join(keep))
  if '://' in str(path):
    tmp.replace(path)
  else:
    os.replace(tmp, path)
  logging.warning('Resuming from step %d: moved %d lines of later steps (logged by the run '
                  'that stopped after them; they are redone now) from %s to %s.', resume_step,
                  len(moved), path, superseded_path)
  return len(moved)


def read_metrics(workdir: str) -> list[dict]:
  """The rows of ``<workdir>/metrics.jsonl``, one per (step, split), in step order.

  A duplicated (step, split) keeps its last line, the one of the run that went on.
  Unparseable lines are skipped.
  """
  path = workdir_lib.path(workdir, METRICS_FILE)
  if not path.exists():
    raise FileNotFoundError(f'{path} does not exist: {workdir!r} holds no training metrics '
                            '(written by encoder_jax.main as it trains)')
  rows: dict[tuple[int, str], dict] = {}
  for line in path.read_text().splitlines():
    try:
      row = json.loads(line)
      key = (int(row['step']), str(row.get('split', 'train')))
    except (ValueError, KeyError, TypeError):
      continue
    rows.pop(key, None)  # Re-insert: the last line wins.
    rows[key] = row
  return sorted(rows.values(), key=lambda r: int(r['step']))


def _fmt(v: float) -> str:
  if v == 0 or 1e-3 <= abs(v) < 1e5:
    return f'{v:.4g}'
  return f'{v:.3e}'
