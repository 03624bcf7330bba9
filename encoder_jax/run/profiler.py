"""A profiler window: a ``jax.profiler`` trace of a few steps of a run, to see where a step
goes."""

from __future__ import annotations

import pathlib
import shutil
import tempfile

import jax
from absl import logging

from encoder_jax.run import console as console_lib
from encoder_jax.run import workdir as workdir_lib

PROFILE_DIR = 'profile'  # jax.profiler traces: profile/plugins/profile/<run>/<host>.xplane.pb


class ProfileWindow:
  """A ``jax.profiler`` trace of a few steps, ``count`` from step ``first`` (the numbering
  of metrics.jsonl), into ``<workdir>/profile`` (TensorBoard's profile plugin and xprof
  read ``plugins/profile/<run>/*.xplane.pb`` there). The trace starts just before a step
  whose program already ran in this process (else one step later: no compile traced), and
  only in a session that starts at or before ``first`` (a run resumed past it traces no
  more); it stops after the window's last step, blocked on its outputs, or when the loop
  ends early (preemption, failure). A ``gs://`` workdir gets the trace copied in."""

  def __init__(self, first: int, count: int, workdir: str, console: console_lib.Console):
    self.first, self.count, self.console = int(first), int(count), console
    self.target = workdir_lib.path(workdir, PROFILE_DIR)
    self.remote = '://' in str(self.target)
    self.start_step = self.last_step = None  # Of the trace running now.
    self.session_first = None  # The first step this session runs (set by the first call).
    self.log_dir, self.earlier = '', set()

  def before(self, step: int, compiled: bool) -> None:
    """Called before the update that produces ``step``; ``compiled``: its program ran."""
    if self.session_first is None:
      self.session_first = step
    if (self.start_step is not None or self.log_dir or step < self.first or not compiled
        or self.session_first > self.first):
      return
    self.log_dir = (tempfile.mkdtemp(prefix='encoder_jax_profile_') if self.remote
                    else str(self.target))
    self.earlier = set(self._runs())
    try:
      jax.profiler.start_trace(self.log_dir)
    except RuntimeError as e:  # Another trace runs (started by the caller): leave it.
      logging.warning('No profile of steps from %d: %s', step, e)
      return
    self.start_step, self.last_step = step, step + self.count - 1

  def after(self, step: int, outputs) -> bool:
    """Called after the update that produced ``step``; True when it stopped the trace."""
    if self.start_step is None or step < self.last_step:
      return False
    jax.block_until_ready(outputs)  # The window holds the steps' execution, not dispatch.
    self.stop(step)
    return True

  def _runs(self) -> list[pathlib.Path]:
    runs = pathlib.Path(self.log_dir, 'plugins', 'profile')
    return [d for d in runs.iterdir() if d.is_dir()] if runs.is_dir() else []

  def stop(self, step: int) -> None:
    """Ends the trace (if one runs) after ``step`` and says where it is."""
    if self.start_step is None:
      return
    start, self.start_step = self.start_step, None
    jax.profiler.stop_trace()
    newest = max(set(self._runs()) - self.earlier or self._runs(), key=lambda d: d.name)
    where = self.target.joinpath('plugins', 'profile', newest.name)
    if self.remote:
      for f in (f for f in newest.rglob('*') if f.is_file()):
        dest = where.joinpath(*f.relative_to(newest).parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.read_bytes())
      shutil.rmtree(self.log_dir, ignore_errors=True)
    self.console.say(f'profiled steps {start}-{step}: trace in {where}; view: xprof '
                     f'--logdir={self.target}, or tensorboard --logdir={self.target} with its '
                     'profile plugin (pip install xprof)')
