"""The profiler window (``run/profiler.py``): one trace a session, after the compile."""

import jax
import jax.numpy as jnp
import pytest

from encoder_jax.run import profiler

from support import consoles

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def test_window_skips_the_compile_and_stops_when_the_loop_ends_early(tmp_path):
  step = jax.jit(lambda v: v + 1)
  console = consoles.Lines()
  window = profiler.ProfileWindow(first=1, count=3, workdir=str(tmp_path), console=console)
  window.before(1, compiled=False)  # Step 1 compiles the program: not traced.
  x = step(jnp.zeros(2))
  assert not window.after(1, x) and window.start_step is None
  window.before(2, compiled=True)
  assert window.start_step == 2
  x = step(x)
  assert not window.after(2, x)
  window.stop(2)  # The loop ended (preempted, failed) inside the window.
  assert len(console.lines) == 1 and console.lines[0].startswith('profiled steps 2-2: ')
  assert list((tmp_path / 'profile').rglob('*.xplane.pb'))
  window.before(3, compiled=True)  # One trace per session.
  assert window.start_step is None
  # A session that starts after the window's first step (a resume) traces nothing.
  late = profiler.ProfileWindow(first=5, count=2, workdir=str(tmp_path / 'late'), console=console)
  late.before(6, compiled=True)
  assert late.start_step is None and not (tmp_path / 'late').exists()
