"""A command held at a known step until a signal comes, so a test injects the signal at
that step instead of timing it.

``python -c script(MODULE) STEP MARKER FLAGS...`` runs MODULE's command line (e.g.
``encoder_jax.main``) with the engine's preemption check (``engine.Preempted.at``) waiting
after step STEP, MARKER written, until a signal arrives: SIGKILL ends the process there;
SIGTERM sets the flag the check waits for, and the run saves and exits as on a preemption.
:func:`wait_for` waits for MARKER (or another condition) while the command runs.
"""

import time

_SCRIPT = '''
import runpy, sys, time
from encoder_jax.run import engine
from encoder_jax.run import pretraining

STEP, MARKER = int(sys.argv[1]), sys.argv[2]
del sys.argv[1:3]
_at = engine.Preempted.at


def at(self, step):
  if step == STEP:
    open(MARKER, 'w').close()
    while not self._requested:  # SIGKILL ends the process here; SIGTERM sets the flag.
      time.sleep(0.05)
  return _at(self, step)


engine.Preempted.at = at
sys.argv[0] = MODULE
runpy.run_module(MODULE, run_name='__main__')
'''


def script(module: str) -> str:
  """The program text that runs ``module``'s command line, held as the docstring says."""
  return f'MODULE = {module!r}\n' + _SCRIPT


def wait_for(predicate, proc, timeout=300):
  """Until ``predicate()`` holds; an error if the process ``proc`` exits first (with its
  output) or ``timeout`` seconds pass (the process killed)."""
  end = time.time() + timeout
  while not predicate():
    if proc.poll() is not None:
      raise AssertionError(f'main exited early ({proc.returncode}):\n{proc.stdout.read()}')
    if time.time() > end:
      proc.kill()
      raise AssertionError('timed out')
    time.sleep(0.1)
