"""What every command line of encoder_jax shares: quiet logs, one-line user errors, and the
flags that name a model (``--workdir``/``--config``/``--step`` or ``--hf_dir``).

A user error (a bad config value, a corpus that cannot be read, a refused resume, a
checkpoint that does not fit, a missing file) prints one ``error: ...`` line naming the
thing and what was expected, and exits with status 2; a traceback is for bugs, or for
``--traceback``. An override of a config key that does not exist
(``--config.model.hiden_size``) is one such line too, naming the key and the nearest
fields, printed while the flags are parsed (before any work). A command of several runs
(bake-off, probe, GLUE) that SIGTERM stopped mid-run prints one ``preempted: ...`` line
saying what a rerun does, and exits with status 3. A Cloud Storage failure that outlasted
its library's retries (an outage, lost credentials: google-cloud-storage, gcsfs, aiohttp or
tensorstore raised it, or it is behind the error raised) is one ``error:`` line too (status
2), naming the ``gs://`` path and what a rerun does (a training run resumes from its last
checkpoint), instead of the library's traceback. Library chatter (Orbax INFO notes)
stays out of the console unless ``--verbosity`` is given.
"""

from __future__ import annotations

import difflib
import logging as std_logging
import sys
from typing import Callable, Sequence

from absl import app
from absl import flags
from absl import logging

from encoder_jax.core import extras
from encoder_jax.storage import client as storage_client

_TRACEBACK = flags.DEFINE_bool('traceback', False, 'Show the Python traceback of a user error '
                               '(bad config, corpus, checkpoint, refused resume).')

USER_ERROR_EXIT = 2
PREEMPTED_EXIT = 3  # A command of several runs stopped by SIGTERM (engine.PreemptedError).


def user_errors() -> tuple[type[BaseException], ...]:
  from encoder_jax.run import checkpointing  # pylint: disable=g-import-not-at-top
  from encoder_jax.storage import locks  # pylint: disable=g-import-not-at-top
  return (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
          PermissionError, FloatingPointError, checkpointing.CheckpointError, extras.MissingExtra,
          locks.LockLost)


# What a rerun does after a storage failure, said after its line.
STORAGE_RERUN = ('Rerun the same command once the bucket is reachable: a training run resumes '
                 'from its last checkpoint.')


def run(main: Callable[[list[str]], None]) -> None:
  """``absl.app.run(main)``, with user errors and storage failures as one line on stderr
  (exit status 2), and a command of several runs stopped by SIGTERM as one ``preempted:``
  line (exit status 3)."""

  def wrapped(argv):
    quiet_logging()
    storage_client.configure()  # gs:// (and an emulator STORAGE_EMULATOR_HOST names).
    try:
      return main(argv)
    except Exception as e:  # pylint: disable=broad-except  (what is not one line is raised)
      if _TRACEBACK.value:
        raise
      line, status = one_line(e)
      if line is None:
        raise
      print(line, file=sys.stderr, flush=True)
      if status == USER_ERROR_EXIT:
        print('(run with --traceback for the details of where it happened)', file=sys.stderr)
      sys.exit(status)

  app.run(wrapped, flags_parser=parse_flags)


def one_line(error: BaseException) -> tuple[str | None, int]:
  """The console line and exit status for ``error`` as a command ends: a storage failure
  (``storage_client.failure_of``: it, or the error behind it) with what a rerun does, a user
  error, or a preemption; (None, 0) for a bug, whose traceback is the point.

  A storage failure is looked for first: tensorstore reports one as a ValueError, which would
  otherwise pass for a user error without saying what a rerun does. An error of the project
  raised from one (a WorkdirError naming the flag) keeps its own words.
  """
  failure = storage_client.failure_of(error)
  if failure is not None:
    raised, explained = failure
    own = raised is not error and isinstance(error, user_errors())
    message = ' '.join((str(error) if own else str(explained)).split()).rstrip('.')
    return f'error: {message}. {STORAGE_RERUN}', USER_ERROR_EXIT
  if isinstance(error, user_errors()):
    return f'error: {str(error) or type(error).__name__}', USER_ERROR_EXIT
  from encoder_jax.run import engine  # pylint: disable=g-import-not-at-top
  if isinstance(error, engine.PreemptedError):
    return f'preempted: {error}', PREEMPTED_EXIT
  return None, 0


def parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing (``app.parse_flags_with_usage``), with an override of a config key
  that does not exist as one ``error:`` line (exit status 2) instead of ml_collections'
  traceback; a bad value already is one line (absl's)."""
  try:
    return app.parse_flags_with_usage(argv)
  except (KeyError, AttributeError):
    # Raised while the config flag parses its file and overrides: read the file again here
    # (a config file is cheap) to name the key and its neighbours.
    message = unknown_override(argv, _config_file(argv))
    if message is None or '--traceback' in argv:
      raise
    print(f'error: {message}', file=sys.stderr, flush=True)
    sys.exit(USER_ERROR_EXIT)


def _config_file(argv: Sequence[str]):
  """The ConfigDict the ``--config`` of ``argv`` names (None: none, or it does not load)."""
  if 'config' not in flags.FLAGS:
    return None
  for i, arg in enumerate(argv):
    name, eq, value = arg.partition('=')
    if name in ('--config', '-config'):
      value = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
      try:
        return flags.FLAGS['config'].parser.parse(value) if value else None
      except Exception:  # pylint: disable=broad-except
        return None  # The original error is then the one shown.
  return None


def unknown_override(argv: Sequence[str], config) -> str | None:
  """The message for the first ``--config.<key>`` of ``argv`` that names no field of
  ``config`` (a ConfigDict): the key and its nearest fields; None when every key exists."""
  for arg in argv[1:]:
    if not arg.startswith('--config.'):
      continue
    flag = arg.partition('=')[0]
    node, where = config, 'config'
    for part in flag[len('--config.'):].split('.'):
      if node is None:
        return f'{flag}: no config to override (pass --config=FILE)'
      if not hasattr(node, 'keys'):
        return f'{flag}: {where} is a value, not a section with fields'
      if part not in node:
        known = sorted(node.keys())
        near = difflib.get_close_matches(part, known, n=3, cutoff=0.6)
        hint = (f'nearest: {", ".join(f"{where}.{n}" for n in near)}' if near
                else f'the fields of {where}: {", ".join(known)}')
        return f'{flag}: {where} has no field {part!r}; {hint}'
      node, where = node[part], f'{where}.{part}'
  return None


def define_source_flags() -> None:
  """--config/--workdir/--step or --hf_dir: where a CLI's model comes from."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file(
      'config', None, 'Run config (default: <workdir>/config.json).', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Pretraining workdir holding checkpoints/.')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
  flags.DEFINE_string('hf_dir', None, 'A Hugging Face directory of any registered kind '
                      'instead of a workdir.')


def define_finetune_flags(out_help: str, *, epochs: int, batch_size: int,
                          learning_rate: float, max_len: int, seed: bool = True) -> None:
  """The flags every downstream command shares: the pretrained source (--workdir or
  --hf_dir), --out, the fine-tuning budget and --tfds_data_dir."""
  flags.DEFINE_string('workdir', None, 'A pretraining workdir (its latest checkpoint).')
  flags.DEFINE_string('hf_dir', None, 'Or a Hugging Face directory of any registered kind.')
  flags.DEFINE_string('out', None, out_help)
  flags.DEFINE_integer('epochs', epochs, 'Epochs.')
  flags.DEFINE_integer('batch_size', batch_size, 'Examples per step.')
  flags.DEFINE_float('learning_rate', learning_rate, 'Peak learning rate.')
  flags.DEFINE_integer('max_len', max_len, 'Tokens per example (QA: per window).')
  if seed:
    flags.DEFINE_integer('seed', 0, 'Seed of head init, dropout and order.')
  flags.DEFINE_string('tfds_data_dir', '', 'tfds data_dir where the datasets are prepared.')
  flags.mark_flags_as_required(['out'])


def load_from_flags(f, with_tokenizer: bool = True):
  """The ``loading.Loaded`` model the source flags name (``source.load``)."""
  from encoder_jax.api import source  # pylint: disable=g-import-not-at-top
  named = source.Named(workdir=f.workdir or '', step=f.step, hf_dir=f.hf_dir or '',
                       keys=('--workdir', '--hf_dir'))
  return source.load(named, f.config, with_tokenizer=with_tokenizer)


def quiet_logging() -> None:
  """For the CLIs' main: warnings and errors only (unless --verbosity is given), no Orbax notes.

  What the user sees is the result and real problems, not library chatter.
  """
  from encoder_jax.loading import loaded as loading  # pylint: disable=g-import-not-at-top
  if 'verbosity' not in flags.FLAGS or not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  for target in (logging.get_absl_handler(), logging.get_absl_logger(), std_logging.getLogger()):
    if loading.not_orbax_chatter not in target.filters:
      target.addFilter(loading.not_orbax_chatter)
