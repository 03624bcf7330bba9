"""The persistent compilation cache of a run: a restarted run loads its compiled steps
instead of compiling them again."""

from __future__ import annotations

import contextlib
import os

import jax
from absl import logging
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from encoder_jax.storage import client as storage_client
from encoder_jax.run import workdir as workdir_lib

SUBDIR = 'compilation_cache'  # Of the workdir: compilation_cache_dir='auto' without JAX's own.


def directory(setting: str, workdir: str | None) -> str | None:
  """The persistent compilation cache a run uses (None: none), from its
  ``compilation_cache_dir`` setting: a directory (local or ``gs://``) is that one, '' is none,
  and 'auto' is the one JAX is already given (``JAX_COMPILATION_CACHE_DIR``, or
  ``jax_compilation_cache_dir`` set by the caller; ``JAX_ENABLE_COMPILATION_CACHE=false``:
  none), else ``<workdir>/compilation_cache``, beside the checkpoints a restart reads."""
  if setting != 'auto':
    return (setting if '://' in setting else os.path.abspath(setting)) if setting else None
  if not jax.config.jax_enable_compilation_cache:
    return None
  if jax.config.jax_compilation_cache_dir:
    return jax.config.jax_compilation_cache_dir
  return str(workdir_lib.path(workdir, SUBDIR)) if workdir else None


def in_use() -> str | None:
  return (jax.config.jax_compilation_cache_dir or None
          if jax.config.jax_enable_compilation_cache else None)


def _use_cache(directory: str | None, enabled: bool) -> None:
  jax.config.update('jax_compilation_cache_dir', directory)
  jax.config.update('jax_enable_compilation_cache', enabled)
  jax_cache.reset_cache()  # JAX opens its cache once: the next compile opens this one.


@contextlib.contextmanager
def use(setting: str, workdir: str | None):
  """JAX's persistent compilation cache set to :func:`directory` for the
  duration (enter before the run's first compile); the process's own setting is back
  after. Yields the directory (None: no cache). JAX caches the programs that took at least
  ``jax_persistent_cache_min_compile_time_secs`` (1 s unless the environment says) to
  compile, and only process 0 writes; a hit is the same executable, bit for bit."""
  want, before = directory(setting, workdir), (
      jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache)
  change = want != in_use()
  if want and '://' in want:  # JAX reads it through etils.epath: gcsfs, not tf.io.gfile.
    storage_client.configure()
  if change:
    _use_cache(want or before[0], bool(want))
    logging.info('Persistent compilation cache: %s', want or 'off')
  try:
    yield want
  finally:
    if change:
      _use_cache(*before)
