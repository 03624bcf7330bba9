"""A command run as ``python -m`` runs it, in the test's own process: ``runpy`` with its flags
parsed from ``sys.argv``. For tests of what a command reads, writes and prints, where its
process is not the point: a Python and JAX start (a few seconds of CPU) is saved each.

What a command changes in its process and a process of its own would drop at its exit is put
back afterwards, so that it does not reach the tests that run next in this process: the
command's own flags are removed, absl's flags get back their values (``--alsologtostderr``,
the verbosity ``cli.quiet_logging`` sets), and the environment (``storage_client.configure``
sets variables), the root logger's handlers and filters, and absl's handler's stream are
restored. While it runs, absl's log lines go to this test's captured stderr, as a command's
go to its process's stderr."""

from __future__ import annotations

import importlib
import logging
import os
import runpy
import subprocess
import sys
import warnings


def command(capsys, module: str, *flags: str) -> subprocess.CompletedProcess:
  """``python -m encoder_jax.<module> FLAGS...`` in this process: its exit status and
  console output (stdout, and stderr with absl's log lines)."""
  from absl import flags as absl_flags  # pylint: disable=g-import-not-at-top
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  for name in ('absl.app', 'encoder_jax.cli'):  # Flags every command has: not removed after.
    importlib.import_module(name)
  fv = absl_flags.FLAGS
  before = {name: (fv[name].value, fv[name].present, fv[name].using_default_value)
            for name in fv}
  parsed, argv, environ = fv.is_parsed(), sys.argv, dict(os.environ)
  root, absl_logger = logging.getLogger(), absl_logging.get_absl_logger()
  handlers, root_filters, absl_filters = root.handlers[:], root.filters[:], absl_logger.filters[:]
  absl_handler = absl_logging.get_absl_handler()
  python_handler, handler_filters = absl_handler.python_handler, absl_handler.filters[:]
  stream = python_handler.stream
  sys.argv = [f'encoder_jax.{module}', *flags]
  capsys.readouterr()
  python_handler.stream = sys.stderr  # The captured stderr, as a process's own stderr.
  absl_logging.use_absl_handler()  # As app.run does (only at its first run in a process).
  try:
    with warnings.catch_warnings():  # The test's imports: the module runs again as __main__.
      warnings.filterwarnings('ignore', r"'encoder_jax\.\S+' found in sys.modules", RuntimeWarning)
      _drop_gs_file_systems()  # A new process starts without any.
      runpy.run_module(f'encoder_jax.{module}', run_name='__main__')
    code = 0
  except SystemExit as e:  # absl's app.run ends with sys.exit.
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  finally:
    _drop_gs_file_systems()  # Made in the command's environment, which ends with it.
    sys.argv = argv
    for name in set(fv) - set(before):
      delattr(fv, name)
    if not parsed:
      fv.unparse_flags()
    for name, (value, present, using_default_value) in before.items():
      flag = fv[name]
      if flag.value != value:
        flag.value = value  # The verbosity flag sets absl's logging level again.
      flag.present, flag.using_default_value = present, using_default_value
    for name in set(os.environ) - set(environ):
      del os.environ[name]
    os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
    root.handlers[:], root.filters[:], absl_logger.filters[:] = (handlers, root_filters,
                                                                 absl_filters)
    python_handler.stream, absl_handler.filters[:] = stream, handler_filters
  out = capsys.readouterr()
  return subprocess.CompletedProcess(flags, code, out.out, out.err)


def _drop_gs_file_systems() -> None:
  """fsspec keeps each gs:// file system it made (gcsfs: the endpoint and credentials of the
  environment it was made in, and its listings) for the process: a command that made one in
  the test's process leaves none behind for the next test, as its own process would."""
  from encoder_jax.storage import client as storage_client  # pylint: disable=g-import-not-at-top
  storage_client.forget_file_systems()  # Nothing to drop before gcsfs is imported.
