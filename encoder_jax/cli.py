"""What every command line of encoder_jax shares: quiet logs and one-line user errors.

A user error (a bad config value, a corpus that cannot be read, a refused resume, a
checkpoint that does not fit, a missing file) prints one ``error: ...`` line naming the
thing and what was expected, and exits with status 2; a traceback is for bugs, or for
``--traceback``. Library chatter (Orbax INFO notes) stays out of the console unless
``--verbosity`` is given.
"""

from __future__ import annotations

import sys
from typing import Callable

from absl import app
from absl import flags

_TRACEBACK = flags.DEFINE_bool('traceback', False, 'Show the Python traceback of a user error '
                               '(bad config, corpus, checkpoint, refused resume).')

USER_ERROR_EXIT = 2


def user_errors() -> tuple[type[BaseException], ...]:
  from encoder_jax import checkpointing  # pylint: disable=g-import-not-at-top
  return (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
          PermissionError, FloatingPointError, checkpointing.CheckpointError)


def run(main: Callable[[list[str]], None]) -> None:
  """``absl.app.run(main)``, with user errors as one line on stderr (exit status 2)."""

  def wrapped(argv):
    from encoder_jax.interop import checkpoint_io  # pylint: disable=g-import-not-at-top
    checkpoint_io.quiet_logging()
    try:
      return main(argv)
    except user_errors() as e:  # pylint: disable=catching-non-exception
      if _TRACEBACK.value:
        raise
      message = str(e) or type(e).__name__
      print(f'error: {message}', file=sys.stderr, flush=True)
      print('(run with --traceback for the details of where it happened)', file=sys.stderr)
      sys.exit(USER_ERROR_EXIT)

  app.run(wrapped)
