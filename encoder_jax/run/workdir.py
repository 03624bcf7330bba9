"""What a run's workdir holds, in one place; local paths or ``gs://`` alike (etils.epath).

  <workdir>/config.json          the run's config
  <workdir>/tokenizer/           the tokenizer the run trains with, pinned at its start:
      tokenizer.model | vocab.txt | bytelevel_bpe.tokenizer.json | hf_tokenizer.json (the
      kind's file, data.tokenizer_kinds), unigram_counts.npy,
      tokenizer.json (kind, sha256, ...)
  <workdir>/checkpoints/<step>/  Orbax checkpoints (see checkpointing.py)
  <workdir>/metrics.jsonl, <workdir>/tensorboard/
  <workdir>/.lock                the run using the workdir now (see WorkdirLock, built on
                                 encoder_jax.storage.locks, the package's one lock helper)

Pinning the tokenizer makes a workdir self-contained: evaluation, fill-mask, embeddings
and export read the ids the checkpoint was trained on, whatever the prepared-data cache
holds now, and a resumed run whose prepared tokenizer differs stops with both files named.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import tempfile
import uuid

import ml_collections
import numpy as np
from absl import logging
from etils import epath

from encoder_jax.storage import locks
from encoder_jax.storage import paths as storage
from encoder_jax.storage import client as storage_client

CONFIG_JSON = 'config.json'
CHECKPOINTS_DIR = 'checkpoints'
IMPORT_REPORT = 'import_report.txt'  # For people: what an import initialised or ignored.
IMPORT_REPORT_JSON = 'import_report.json'  # The same for tools (loading reads it back).
TOKENIZER_DIR = 'tokenizer'
TOKENIZER_INFO = 'tokenizer.json'
UNIGRAM_COUNTS = 'unigram_counts.npy'


def path(workdir: str, *parts: str) -> epath.Path:
  """A path inside ``workdir`` (absolute for local directories; URLs kept as they are, the
  storage layers readied for them first: ``storage_client.configure``)."""
  if '://' in workdir:
    storage_client.configure()
  root = workdir if '://' in workdir else os.path.abspath(workdir)
  return epath.Path(root).joinpath(*parts)


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes ``config.json`` atomically: a run killed mid-write leaves the old file whole."""
  path(workdir).mkdir(parents=True, exist_ok=True)
  storage.write_atomically(path(workdir, CONFIG_JSON), config.to_json_best_effort(indent=2))


class WorkdirError(ValueError):
  """A user error about the workdir: not writable, in use by another run, refused resume."""


# ---------------------------------------------------------------------------------------
# Writability, checked before any work.


def check_workdir_writable(workdir: str) -> None:
  """Raises WorkdirError unless ``workdir`` is, or can be created as, a writable directory.

  Probes for real (os.access says yes to root on /proc and on some network mounts) with a
  temporary file or directory that is removed at once; a workdir that does not exist yet
  is not created here, so a run refused later leaves nothing behind.
  """
  if not workdir:
    raise WorkdirError('--workdir is empty; expected a directory for checkpoints and metrics')
  if '://' in workdir:
    probe = path(workdir, f'.write_test-{os.getpid()}-{uuid.uuid4().hex[:8]}')
    try:
      if str(probe).startswith('gs://'):  # Cloud Storage's own errors, each with its fix.
        storage.check_access(workdir)  # Write, list, delete, and what Orbax needs.
        return
      probe.write_text('probe')
      probe.unlink()
    except storage.StorageError as e:
      raise WorkdirError(f'--workdir={workdir}: cannot write there: {e}') from e
    except Exception as e:  # pylint: disable=broad-except  (each file system raises its own)
      raise WorkdirError(f'--workdir={workdir}: cannot write there ({type(e).__name__}: {e}); '
                         'expected a bucket path this machine may write') from e
    return
  target = os.path.abspath(workdir)
  existing = target
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  if existing == target and not os.path.isdir(target):
    raise WorkdirError(f'--workdir={workdir}: {target} exists and is not a directory; expected '
                       'a directory (or a path to create one at)')
  if existing != target and not os.path.isdir(existing):
    raise WorkdirError(f'--workdir={workdir}: cannot create it, {existing} is a file; expected '
                       'a path under a directory')
  try:
    if existing == target:
      fd, probe = tempfile.mkstemp(prefix='.write_test-', dir=target)
      os.close(fd)
      os.unlink(probe)
    else:  # Creating a directory in `existing` is what makedirs will do; a unique name, so
      # the processes of a multi-host run probing at the same moment do not collide.
      os.rmdir(tempfile.mkdtemp(prefix='.write_test-', dir=existing))
  except OSError as e:
    where = target if existing == target else existing
    raise WorkdirError(f'--workdir={workdir}: cannot write in {where} ({e.strerror or e}); '
                       'expected a writable directory or a path that can be created') from e


# ---------------------------------------------------------------------------------------
# The lock: one run per workdir (on encoder_jax.storage.locks, the package's one lock helper).

LOCK_FILE = '.lock'
HEARTBEAT_S = 60.0  # The holder rewrites the lock this often...
STALE_AFTER_S = 15 * 60.0  # ...so a lock from another machine not rewritten for this long is
# taken over: that run is dead (or hung). On the same machine the pid is checked instead.


def wait_for_stale(stale_after_s: float = STALE_AFTER_S, heartbeat_s: float = HEARTBEAT_S
                   ) -> float:
  """How long a restart waits for a lock that may be a dead run's: long enough for a
  hard-killed run's lock to go stale."""
  return stale_after_s + 3 * heartbeat_s


WAIT_S = wait_for_stale()
WAIT_ENV = 'ENCODER_JAX_LOCK_WAIT_S'  # Sets that wait (seconds; 0: refuse at once).

LockInfo = locks.LockInfo  # Who holds a workdir: written as JSON into <workdir>/.lock.


class WorkdirLock:
  """``with WorkdirLock(workdir): ...``: only one run uses a workdir at a time.

  Taking it creates ``<workdir>/.lock`` (``locks.Lock``: a file, or an object on a bucket,
  created atomically), so of two runs started together exactly one wins. A holder proven
  alive (its process runs on this machine, or its lock is refreshed while this run looks)
  is refused at once with WorkdirError naming it; any other holder is waited for, up to
  ``wait_s``, with one line saying so: a run hard-killed on another machine (or on a
  machine of the same name: a pod's) left a lock that only staleness can clear, and its
  automatic restart should take over rather than fail. A lock whose holder is gone is
  taken over with a warning: on the same machine when its pid no longer runs; otherwise
  when it was not refreshed for ``stale_after_s`` (the holder rewrites it every
  ``heartbeat_s`` from a daemon thread). Released on exit, also on an exception.
  ``enabled=False`` (every process but 0 of a multi-host run) does nothing, so a run holds
  the lock once.

  A lock that can no longer be confirmed is lost (``locks.Lock``): ``check()`` then raises
  ``locks.LockLost``, and so does leaving the ``with`` block normally.
  """

  def __init__(self, workdir: str, enabled: bool = True, heartbeat_s: float = HEARTBEAT_S,
               stale_after_s: float = STALE_AFTER_S, wait_s: float | None = None):
    self.workdir = workdir
    self.enabled = enabled
    self.path = path(workdir, LOCK_FILE)
    self.wait_s = wait_for_stale(stale_after_s, heartbeat_s) if wait_s is None else wait_s
    self._lock = locks.Lock(str(self.path), heartbeat_s=heartbeat_s, horizon_s=stale_after_s,
                            on_lost=self._lost)

  @property
  def info(self) -> LockInfo | None:
    """Our lock, while we hold it."""
    return self._lock.info

  @property
  def took_over(self) -> LockInfo | None:
    """The lock of the dead run taken over, if one was."""
    return self._lock.took_over

  def __enter__(self) -> 'WorkdirLock':
    if self.enabled:
      self.acquire()
    return self

  def __exit__(self, exc_type, *exc) -> None:
    lost = self._lost_error()
    self.release()
    if lost is not None and exc_type is None:
      raise lost

  def acquire(self) -> None:
    """Takes the lock or raises WorkdirError naming its holder; a no-op if already held."""
    if self.info is not None:
      return
    path(self.workdir).mkdir(parents=True, exist_ok=True)
    try:
      self._lock.acquire(self.wait_s, refuse_alive=True, on_wait=self._waiting)
    except locks.LockHeld as e:
      who = e.holder.info.describe() if e.holder.info else 'its lock is being written'
      raise WorkdirError(
          f'{self.workdir} is in use by another run ({who}; lock file '
          f'{self.path}): {e.why}. Wait for it to finish, stop it, or use another --workdir. '
          'If that run is gone, delete the lock file.') from None
    if self.took_over:
      logging.warning('Took over the lock %s of a run that is gone (%s).', self.path,
                      self.took_over.describe())

  def _waiting(self, holder: locks.Holder, waited_s: float) -> None:
    del waited_s  # Printed: shown at any verbosity.
    print(f'Waiting up to {locks.duration(self.wait_s)} for the lock {self.path}: it is held '
          f'by {holder.info.describe()}, last refreshed {locks.duration(holder.heartbeat_age())}'
          ' ago, a run this machine cannot check (killed, or running elsewhere). Taken over '
          f'once unrefreshed for {locks.duration(self._lock.horizon_s)}; refused at once if '
          'refreshed meanwhile.', flush=True)

  def check(self, everywhere: bool = False) -> None:
    """Raises ``locks.LockLost`` once this run's lock is lost: the run must stop before
    another run takes its workdir. Cheap; call it between steps. ``everywhere``: a
    collective of a multi-host run (every process calls it at the same step), after which
    every process raises if process 0, the holder, lost the lock."""
    lost = self._lost_error()
    if everywhere:
      import jax  # pylint: disable=g-import-not-at-top
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      if jax.process_count() > 1 and int(multihost_utils.broadcast_one_to_all(
          np.int32(lost is not None))) and lost is None:
        lost = locks.LockLost(f'process 0 lost the lock of {self.workdir} (its log says how); '
                              'every process of this run stops')
    if lost is not None:
      raise lost

  def _lost_error(self) -> locks.LockLost | None:
    try:
      self._lock.check()
    except locks.LockLost as e:
      return locks.LockLost(
          f'{e}. This run stops so that two runs never write to {self.workdir}; rerun the same '
          'command to resume from its last checkpoint (it waits for the lock if another run '
          'holds it)', e.holder)
    return None

  def _lost(self, error: locks.LockLost) -> None:
    logging.error('%s; this run stops at its next check so that another run can take %s.',
                  error, self.workdir)

  def release(self) -> None:
    """Stops the heartbeat and removes the lock if it is still ours; safe to call twice."""
    self._lock.release()


def run_lock(workdir: str, wait_s: float | None = None) -> WorkdirLock:
  """The lock of a training run, held: ``with workdir.run_lock(workdir) as lock: train...``,
  calling ``lock.check()`` between steps.

  Process 0 takes it (a run holds it once however many hosts it has), waiting up to
  ``wait_s`` (default: $ENCODER_JAX_LOCK_WAIT_S, else ``WAIT_S``) for a holder that may be
  dead, and every process learns the outcome, so all of them stop when it is refused
  instead of the others waiting in their first collective. A collective call in
  multi-host runs.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if wait_s is None:
    wait_s = float(os.environ.get(WAIT_ENV) or WAIT_S)
  lock = WorkdirLock(workdir, enabled=jax.process_index() == 0, wait_s=wait_s)
  error = None
  if lock.enabled:
    try:
      lock.acquire()
    except WorkdirError as e:
      error = e
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    held = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
    if not held and error is None:
      raise WorkdirError(f'{workdir} is in use by another run: process 0 could not take its '
                         'lock (its log names the run holding it)')
  if error is not None:
    raise error
  return lock


# ---------------------------------------------------------------------------------------
# Resuming: which config changes a workdir accepts.

# Dotted keys (or 'section.*') a resume may change: schedules, periods and performance
# knobs. Every other key fixes the checkpoint's shapes, the optimizer state's structure,
# the data stream or the masks, and may not change; a key added to the schema later is
# refused until it is listed here.
RESUME_MAY_CHANGE = (
    'optim.learning_rate', 'optim.warmup_steps', 'optim.weight_decay', 'optim.grad_clip_norm',
    'optim.b1', 'optim.b2', 'optim.eps',
    'train.num_steps', 'train.log_every_steps', 'train.eval_every_steps', 'train.eval_batches',
    'train.grad_accum_steps', 'train.nonfinite_policy', 'train.peak_tflops_per_device',
    'train.compilation_cache_dir', 'train.profile_steps', 'train.profile_first_step',
    'checkpoint.*', 'mesh.*',
    'model.dtype', 'model.remat', 'model.attention_implementation',
    'data.num_workers', 'data.prepared_dir', 'data.tfds_data_dir',
)


@dataclasses.dataclass(frozen=True)
class ConfigChange:
  key: str
  old: object
  new: object

  def __str__(self) -> str:
    return f'{self.key}: {self.old!r} -> {self.new!r}'


def _flatten(tree, prefix: str = '') -> dict:
  out = {}
  for k, v in tree.items():
    key = f'{prefix}{k}'
    if isinstance(v, dict):
      out.update(_flatten(v, key + '.'))
    else:
      out[key] = v
  return out


def _may_change(key: str) -> bool:
  return key in RESUME_MAY_CHANGE or f'{key.split(".")[0]}.*' in RESUME_MAY_CHANGE


def _only_an_import(workdir: str) -> bool:
  """True if the workdir's only checkpoint is the step 0 an import wrote."""
  if not any(path(workdir, name).exists()
             for name in (IMPORT_REPORT, IMPORT_REPORT_JSON)):
    return False
  checkpoints = path(workdir, CHECKPOINTS_DIR)
  steps = [d.name for d in checkpoints.iterdir() if d.name.isdigit()] if (
      checkpoints.is_dir()) else []
  return steps == ['0']


def check_resume_config(workdir: str, config: ml_collections.ConfigDict,
                        defaults: ml_collections.ConfigDict | None = None) -> list[ConfigChange]:
  """Compares ``config`` with ``<workdir>/config.json`` before anything is written.

  Returns the accepted changes (to log; [] for a new workdir or an identical config), or
  raises WorkdirError listing every refused change and what a resume may change. Reads
  only. A key that ``config.json`` lacks (written before the key existed) is accepted if
  ``config`` holds its default (``defaults``: ``config_base.base_config()``); a key that
  only ``config.json`` has is ignored.
  """
  saved_path = path(workdir, CONFIG_JSON)
  if not saved_path.exists():
    return []
  try:
    saved = _flatten(json.loads(saved_path.read_text()))
  except (ValueError, UnicodeDecodeError) as e:
    raise WorkdirError(f'{saved_path} is not valid JSON ({e}); it should hold the config of the '
                       f'run in {workdir}. Restore it, or use another --workdir.') from e
  current = _flatten(json.loads(config.to_json_best_effort()))
  if defaults is None:
    from encoder_jax.config import schema as config_base  # pylint: disable=g-import-not-at-top
    defaults = config_base.base_config()
  default = _flatten(json.loads(defaults.to_json_best_effort()))
  # A workdir holding only the step-0 checkpoint of an import (convert hf_to_workdir) has
  # no training progress and no data stream yet: its recipe (data, batch, lengths, steps,
  # objective, seed) is the user's to choose; only the network and tokenizer are fixed.
  imported = _only_an_import(workdir)
  fixed_after_import = ('model.', 'tokenizer.')
  accepted, refused = [], []
  for key in sorted(current):
    new = current[key]
    if key not in saved:
      if key in default and default[key] == new:
        continue
      old = '<absent>'
    else:
      old = saved[key]
      if old == new:
        continue
    may = _may_change(key) or (imported and not key.startswith(fixed_after_import))
    (accepted if may else refused).append(ConfigChange(key, old, new))
  if refused:
    raise WorkdirError(
        f'Refusing to resume in {workdir}: the config differs from {saved_path} in keys a '
        'resume may not change (they fix the model and optimizer shapes, the data stream or '
        'the masks):\n  ' + '\n  '.join(f'config.{c}' for c in refused) +
        '\nA resume may change: ' + ', '.join(RESUME_MAY_CHANGE) + '. Use another --workdir '
        'for a different run. Nothing in the workdir was changed.')
  return accepted


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def check_pinned_tokenizer(workdir: str, tokenizer) -> None:
  """Raises if ``workdir`` has a pinned tokenizer other than ``tokenizer``; writes nothing."""
  if path(workdir, TOKENIZER_DIR, TOKENIZER_INFO).exists():
    _pin_or_check(workdir, tokenizer, None, write=False)


def pin_tokenizer(workdir: str, tokenizer, unigram_counts: np.ndarray | None) -> None:
  """Copies the run's tokenizer into the workdir, or checks it against the pinned one.

  ``unigram_counts`` may be None (an imported checkpoint: counts come with prepared data).
  """
  _pin_or_check(workdir, tokenizer, unigram_counts, write=True)


def _pin_or_check(workdir: str, tokenizer, unigram_counts, write: bool) -> None:
  info_path = path(workdir, TOKENIZER_DIR, TOKENIZER_INFO)
  data = epath.Path(tokenizer.path).read_bytes()
  sha = _sha256(data)
  if info_path.exists():
    pinned = json.loads(info_path.read_text())
    if pinned['sha256'] != sha:
      raise ValueError(
          f'The tokenizer this run would use ({tokenizer.path}, sha256 {sha[:12]}) differs from '
          f'the one {workdir} was trained with ({path(workdir, TOKENIZER_DIR, pinned["file"])}, '
          f'sha256 {pinned["sha256"][:12]}): the ids would not match the checkpoint. Point '
          'config.data.prepared_dir at the data prepared for this run, or use a new workdir.')
    return
  if not write:
    return
  directory = path(workdir, TOKENIZER_DIR)
  directory.mkdir(parents=True, exist_ok=True)
  name = os.path.basename(tokenizer.path)
  if name in (TOKENIZER_INFO, UNIGRAM_COUNTS):  # A byte-level BPE tokenizer.json: not the info.
    name = f'{tokenizer.kind}.{name}'
  (directory / name).write_bytes(data)
  if unigram_counts is not None:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(unigram_counts, np.int64))
    (directory / UNIGRAM_COUNTS).write_bytes(buffer.getvalue())
  info_path.write_text(json.dumps({
      'kind': tokenizer.kind, 'file': name, 'sha256': sha, 'lowercase': bool(tokenizer.lowercase),
      'vocab_size': int(tokenizer.vocab_size), 'source': str(tokenizer.path)}, indent=2))


def has_pinned_tokenizer(workdir: str) -> bool:
  return path(workdir, TOKENIZER_DIR, TOKENIZER_INFO).exists()


def load_tokenizer(workdir: str):
  """(Tokenizer, unigram counts) pinned in ``workdir``; a clear error if there is none."""
  from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  info_path = path(workdir, TOKENIZER_DIR, TOKENIZER_INFO)
  if not info_path.exists():
    raise FileNotFoundError(f'{info_path} does not exist: {workdir!r} has no pinned tokenizer '
                            '(written when training starts, or by convert hf_to_workdir)')
  info = json.loads(info_path.read_text())
  source = path(workdir, TOKENIZER_DIR, info['file'])
  data = source.read_bytes()
  if _sha256(data) != info['sha256']:
    raise ValueError(f'{source} does not match the sha256 recorded in {info_path}: the file '
                     'was changed or truncated')
  local = source
  if '://' in workdir:  # SentencePiece and tokenizers read local files only.
    local = epath.Path(tempfile.mkdtemp(prefix='tokenizer_')) / info['file']
    local.write_bytes(data)
  tok = tokenizer_lib.Tokenizer.from_file(info['kind'], str(local), info['lowercase'])
  counts_path = path(workdir, TOKENIZER_DIR, UNIGRAM_COUNTS)
  counts = np.load(io.BytesIO(counts_path.read_bytes())) if counts_path.exists() else None
  return tok, counts
