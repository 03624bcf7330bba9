"""A command run as ``python -m`` runs it, in the test's own process: ``runpy`` with its flags
parsed from ``sys.argv``. For tests of what a command reads, writes and prints, where its
process is not the point: a Python and JAX start (a few seconds of CPU) is saved each."""

from __future__ import annotations

import runpy
import subprocess
import sys


def command(capsys, module: str, *flags: str) -> subprocess.CompletedProcess:
  """``python -m encoder_jax.<module> FLAGS...`` in this process: its exit status and
  console output. The command's flags are removed afterwards (the next defines its own)."""
  from absl import app  # pylint: disable=g-import-not-at-top,unused-import
  from absl import flags as absl_flags  # pylint: disable=g-import-not-at-top
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top,unused-import
  before, argv = set(absl_flags.FLAGS), sys.argv  # absl.app's and cli's flags among them.
  sys.argv = [f'encoder_jax.{module}', *flags]
  capsys.readouterr()
  try:
    runpy.run_module(f'encoder_jax.{module}', run_name='__main__')
    code = 0
  except SystemExit as e:  # absl's app.run ends with sys.exit.
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  finally:
    sys.argv = argv
    for name in set(absl_flags.FLAGS) - before:
      delattr(absl_flags.FLAGS, name)
  out = capsys.readouterr()
  return subprocess.CompletedProcess(flags, code, out.out, out.err)
