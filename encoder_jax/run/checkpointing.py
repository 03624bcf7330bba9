"""Orbax checkpoints of a training run: params, optimizer state, data-iterator state, step.

Layout: ``<workdir>/checkpoints/<step>/{params,opt_state,data,meta}``. Saves are
asynchronous (training continues while the arrays are written) and atomic: locally Orbax
writes to a temporary directory and renames it when complete; on ``gs://``, which cannot
rename a directory atomically, it writes in place and marks the step complete with a
``commit_success.txt`` last (:func:`steps` takes only complete ones). Either way a run
killed mid-save leaves the previous checkpoints intact. A checkpoint that fails to restore (truncated, written
for another model shape) is reported and the next older one is tried; if none can be
restored, the run stops with every reason, and never silently starts from scratch.

When an older checkpoint does restore, every newer one that failed is moved (never
deleted) to ``<workdir>/checkpoints_damaged/<step>-<UTC time>/``, next to a ``.txt`` with
the reason: the run retrains those steps and must be able to save them again (Orbax
refuses to save a step that is still listed), and the damaged files stay for inspection.
Nothing is moved when no checkpoint restores: that is more likely a config that does not
fit the workdir than damage, and the checkpoints must stay where they are.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from encoder_jax.storage import paths as storage
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.data import iterators as data_iterators

ITEMS = ('params', 'opt_state', 'data', 'meta')
# Saved only by trainables that carry state across steps (``TrainState.extra``, e.g. XLNet's
# memory): every other checkpoint has exactly ITEMS.
EXTRA = 'extra'
JSON_ITEMS = ('data', 'meta')  # Written by ocp.args.JsonSave into <item>/metadata.
DAMAGED_DIR = 'checkpoints_damaged'


class CheckpointError(RuntimeError):
  pass


class Restored(NamedTuple):
  """A restored checkpoint (``Checkpointer.restore``)."""
  params: Any
  opt_state: Any
  data_state: dict  # The global data-iterator state ({}: none, e.g. an imported checkpoint).
  step: int


def checkpoint_dir(workdir: str) -> str:
  return str(workdir_lib.path(workdir, 'checkpoints'))


def damaged_dir(workdir: str) -> str:
  """Where unrestorable checkpoints are set aside: outside Orbax's step listing."""
  return str(workdir_lib.path(workdir, DAMAGED_DIR))


def _diagnose(step_dir: epath.Path) -> str | None:
  """A structural defect of a step directory, naming the file; None if none is seen.

  Orbax's own errors for these cases name an item ('Item "params" was not found') or
  nothing at all (a JSONDecodeError), not the file an operator has to look at.
  """
  if not step_dir.exists():
    return f'{step_dir} does not exist'
  if not step_dir.is_dir():
    return f'{step_dir} is a file; expected a checkpoint directory'
  if not any(True for _ in step_dir.iterdir()):
    return f'{step_dir} is empty'
  for item in ITEMS:
    item_dir = step_dir / item
    if not item_dir.exists():
      return f'{item_dir} is missing'
    if not item_dir.is_dir():
      return f'{item_dir} is a file; expected a directory (the checkpoint item {item!r})'
  checked = [step_dir / item / 'metadata' for item in JSON_ITEMS]
  checked += [step_dir / item / '_METADATA' for item in ('params', 'opt_state')]
  for file in checked:
    if not file.exists():
      if file.name == 'metadata':
        return f'{file} is missing'
      continue
    try:
      json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
      return f'{file} is not valid JSON ({e})'
  return None


def _reason(step_dir: epath.Path, error: BaseException) -> str:
  """One line saying why a step did not restore, naming the damaged file where possible."""
  if isinstance(error, CheckpointError):
    return str(error)
  found = _diagnose(step_dir)
  if found:
    return found
  text = str(error)
  shapes = re.search(r'Requested shape: (\(.*?\)) is not compatible with the stored shape: '
                     r'(\(.*?\))', text)
  if shapes:  # Orbax goes on to suggest disabling the check, which would load garbage.
    return (f'an array stored with shape {shapes[2]}; the config expects {shapes[1]} (a '
            'checkpoint of another model shape?)')
  # TensorStore names the file it failed on ('... of local file "<path>": <what>'), inside
  # a message of several kB of JSON specs; keep the innermost file and what went wrong.
  files = [f for f in re.findall(r'local file "([^"]+)"', text) if not f.endswith('/')]
  if files:
    detail = text.rsplit(f'local file "{files[-1]}"', 1)[1].lstrip(': ')
    detail = detail.split(' [tensorstore_spec', 1)[0].strip()
    return f'{files[-1]}: {detail}' if detail else f'{files[-1]} cannot be read'
  first = text.splitlines()[0] if text else ''
  if len(first) > 300:
    first = first[:300] + '...'
  return f'{type(error).__name__}: {first}'


def _move_aside(workdir: str, step_dir: epath.Path, step: int, reason: str) -> epath.Path:
  """Moves ``step_dir`` to ``checkpoints_damaged/<step>-<UTC time>`` with a reason file."""
  root = epath.Path(damaged_dir(workdir))
  root.mkdir(parents=True, exist_ok=True)
  stamp = time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())
  target, n = root / f'{step}-{stamp}', 1
  while target.exists() or target.with_name(target.name + '.txt').exists():
    target, n = root / f'{step}-{stamp}-{n}', n + 1
  note = target.with_name(target.name + '.txt')  # Written first: on a bucket it also makes
  note.write_text(  # `root` exist (a bucket has no empty directories to rename into).
      f'step: {step}\nfrom: {step_dir}\nset aside: {stamp}\nreason: {reason}\n')
  try:
    step_dir.rename(target)
  except OSError as e:
    note.unlink(missing_ok=True)
    raise CheckpointError(
        f'Checkpoint step {step} cannot be restored ({reason}) and moving {step_dir} aside to '
        f'{target} failed ({e}); move it out of {step_dir.parent} by hand, then rerun.') from e
  return target


# Arrays whose per-replica slice would be smaller than this are written whole by one
# replica instead of split across the replicas that hold them (Orbax's replica-parallel
# save): splitting a LayerNorm scale over 8 replicas buys nothing, and each distinct slice
# is a small XLA program compiled on the first save (over 100 of them for a 2-layer model
# on 8 devices).
MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL = 1 << 20


def _register_array_handler() -> None:
  """Orbax's jax.Array handler with :data:`MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL`, in the
  global registry (the handler the Standard save and restore args look up), keeping the
  default handler's array metadata store."""
  current = ocp.type_handlers.get_type_handler(jax.Array)
  if getattr(current, '_min_slice_bytes_for_replica_parallel', None) == (
      MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL):
    return
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(
          min_slice_bytes_for_replica_parallel=MIN_SLICE_BYTES_FOR_REPLICA_PARALLEL,
          array_metadata_store=getattr(current, '_array_metadata_store', None)),
      override=True)


def _manager(workdir: str, keep: int = 3, async_save: bool = False, items=ITEMS,
             create: bool = True) -> ocp.CheckpointManager:
  _register_array_handler()
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                         enable_async_checkpointing=async_save)
  return ocp.CheckpointManager(workdir_lib.path(workdir, 'checkpoints'), options=options,
                               item_names=items)


def _check_shapes(restored, abstract, what: str, step: int):
  """Orbax may restore a differently shaped array; a mismatch must be an error."""
  flat_r = jax.tree_util.tree_flatten_with_path(restored)[0]
  flat_a = jax.tree_util.tree_flatten_with_path(abstract)[0]
  if len(flat_r) != len(flat_a):
    raise CheckpointError(f'checkpoint step {step}: {what} has {len(flat_r)} arrays; the model '
                          f'expects {len(flat_a)}')
  for (path, r), (_, a) in zip(flat_r, flat_a):
    if tuple(r.shape) != tuple(a.shape):
      raise CheckpointError(
          f'checkpoint step {step}: {what}{jax.tree_util.keystr(path)} has shape '
          f'{tuple(r.shape)}; the config expects {tuple(a.shape)} (a checkpoint of another '
          'model shape?)')


def _restore_args(abstract_tree):
  return ocp.args.StandardRestore(abstract_tree)


def _gather_json(obj) -> list:
  """Every process's JSON-serialisable ``obj``, in process order (a collective call).

  Orbax writes JSON items from the primary host only, so each host's data-iterator state
  (its own streams) is gathered there and merged into the one global state it saves.
  """
  if jax.process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  raw = np.frombuffer(json.dumps(obj).encode('utf-8'), np.uint8)
  lengths = multihost_utils.process_allgather(np.array([raw.size], np.int32)).reshape(-1)
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:raw.size] = raw
  rows = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(rows[i, :lengths[i]]).decode('utf-8')) for i in range(len(lengths))]


def _data_state(saved: dict | None, step: int) -> dict:
  """The global data-iterator state of a checkpoint ({} when it has none: the stream starts
  from the beginning, e.g. an imported checkpoint)."""
  saved = saved or {}
  if 'global' in saved:
    return saved['global'] or {}
  states = saved.get('processes', [{}])  # Written by an older version, per process.
  if all(not s for s in states):
    return {}
  if len(states) == 1:
    return states[0]  # The iterator says whether it can continue it.
  raise CheckpointError(
      f'checkpoint step {step} holds the data-iterator states of {len(states)} processes '
      'in the format of an older version, which continues only on the same topology and '
      'this version cannot read; resume it with the version that wrote it.')


class Checkpointer:
  """Saves and restores a run's state in ``<workdir>/checkpoints``."""

  def __init__(self, workdir: str, checkpoint_config: ml_collections.ConfigDict):
    if checkpoint_config.keep < 1 or checkpoint_config.every_steps < 1:
      raise ValueError('config.checkpoint.keep and every_steps must be >= 1; got '
                       f'{checkpoint_config.keep}, {checkpoint_config.every_steps}')
    self.workdir = workdir
    self.every_steps = int(checkpoint_config.every_steps)
    self.manager = _manager(workdir, checkpoint_config.keep, checkpoint_config.async_save,
                            items=ITEMS + (EXTRA,))
    # ``TrainState.extra`` of the step ``restore`` returned; None when the state carries
    # none or that checkpoint has none (then the run starts it afresh).
    self.restored_extra = None
    # (step, reason, where it went) of each checkpoint ``restore`` set aside; where is ''
    # on processes other than 0, which moves the files.
    self.set_aside: list[tuple[int, str, str]] = []

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict[str, Any]) -> None:
    items = dict(params=ocp.args.StandardSave(state.params),
                 opt_state=ocp.args.StandardSave(state.opt_state),
                 data=ocp.args.JsonSave({'global': data_iterators.merge_states(
                     _gather_json(data_state))}),
                 meta=ocp.args.JsonSave({'step': int(step)}))
    if getattr(state, 'extra', None) is not None:
      items[EXTRA] = ocp.args.StandardSave(state.extra)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def restore(self, abstract_state) -> Restored | None:
    """The newest restorable checkpoint, or None if none exist.

    ``abstract_state`` has ``.params`` and ``.opt_state`` trees of ShapeDtypeStructs whose
    ``.sharding`` says where each restored array goes (and ``.extra``, restored into
    ``self.restored_extra`` when the checkpoint has it). Newer steps that failed while an
    older one restored are set aside (see the module docstring) and listed in
    ``self.set_aside``, so the run can save those steps again.
    """
    steps = sorted(self.manager.all_steps(), reverse=True)
    if not steps:
      return None
    failures = []
    abstract_extra = getattr(abstract_state, 'extra', None)
    for step in steps:
      try:
        items = dict(params=_restore_args(abstract_state.params),
                     opt_state=_restore_args(abstract_state.opt_state),
                     data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
        with_extra = abstract_extra is not None and (self._step_dir(step) / EXTRA).exists()
        if with_extra:
          items[EXTRA] = _restore_args(abstract_extra)
        got = self.manager.restore(step, args=ocp.args.Composite(**items))
        _check_shapes(got.params, abstract_state.params, 'params', step)
        _check_shapes(got.opt_state, abstract_state.opt_state, 'opt_state', step)
        self.restored_extra = None
        if with_extra:
          _check_shapes(got[EXTRA], abstract_extra, EXTRA, step)
          self.restored_extra = got[EXTRA]
        if int(got.meta['step']) != step:
          raise CheckpointError(f'checkpoint step {step}: meta says step {got.meta["step"]}')
      except Exception as e:  # pylint: disable=broad-except
        reason = _reason(self._step_dir(step), e)
        logging.error('Checkpoint step %d in %s cannot be restored (%s); trying an older one.',
                      step, self.manager.directory, reason)
        failures.append((step, reason))
        continue
      if failures:
        self._set_aside(failures)
        logging.warning('Restored step %d after setting aside unrestorable checkpoints: %s',
                        step, '; '.join(f'step {s}: {r}' for s, r in failures))
      return Restored(got.params, got.opt_state, _data_state(got.data, step), step)
    raise CheckpointError(
        f'No checkpoint in {self.manager.directory} could be restored; refusing to start from '
        'scratch over them. Reasons: ' + ' | '.join(f'step {s}: {r}' for s, r in failures) +
        '. If they are of another model, run with the config in config.json; if they are '
        f'damaged, move the step directories out of {self.manager.directory} (e.g. into '
        f'{damaged_dir(self.workdir)}) to start over.')

  def _step_dir(self, step: int) -> epath.Path:
    return epath.Path(self.manager.directory) / str(step)

  def _set_aside(self, failures: list[tuple[int, str]]) -> None:
    """Moves failed steps out of Orbax's listing (process 0); every process then reloads."""
    for step, reason in failures:
      where = ''
      if jax.process_index() == 0:
        where = str(_move_aside(self.workdir, self._step_dir(step), step, reason))
        logging.warning('Checkpoint step %d cannot be restored (%s); moved to %s (kept for '
                        'inspection) so this run can save step %d again.', step, reason, where,
                        step)
      self.set_aside.append((step, reason, where))
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices('encoder_jax_checkpoints_set_aside')
    self.refresh()

  def refresh(self) -> None:
    """Lists the steps anew, from the bucket: after process 0 moved steps aside, every other
    host's cached listing still has them (and Orbax would refuse to save those steps
    again: StepAlreadyExistsError)."""
    storage.forget_listings(checkpoint_dir(self.workdir))
    self.manager.reload()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def steps(workdir: str) -> list[int]:
  """The saved steps of ``workdir``, ascending: only checkpoints whose save completed.

  Locally Orbax writes a step into a temporary directory and renames it when complete; on
  ``gs://`` (no atomic rename) it writes into ``checkpoints/<step>/`` directly and marks
  completion with a ``commit_success.txt`` last. A step directory without its marker is a
  save in progress, or one a preemption cut short: never a step (Orbax's own rule,
  ``ocp.step.is_path_finalized``)."""
  directory = workdir_lib.path(workdir, 'checkpoints')
  storage.forget_listings(str(directory))  # Another host may have saved or moved a step.
  if not directory.is_dir():
    return []
  return sorted(int(d.name) for d in directory.iterdir()
                if d.name.isdigit() and ocp.step.is_path_finalized(d))


def resolve_step(workdir: str, step: int | None = None) -> int:
  """``step``, checked to exist in ``workdir``, or its newest; a clear error if there is none."""
  directory = workdir_lib.path(workdir, 'checkpoints')
  if not workdir_lib.path(workdir).is_dir():
    raise CheckpointError(f'workdir {workdir!r} does not exist')
  saved = steps(workdir)
  if not saved:
    raise CheckpointError(f'{directory} holds no checkpoint; expected <step>/ directories '
                          'written by encoder_jax.main or encoder_jax.convert (a step counts '
                          'once its save completed)')
  if step is None:
    return saved[-1]
  if step not in saved:
    unfinished = (directory / str(step)).exists()
    raise CheckpointError(
        f'{directory} has no checkpoint for step {step}' + (
            ' that completed (its save was cut short: no commit marker)' if unfinished else '')
        + f'; it has steps {saved}')
  return step


def restore_params(workdir: str, abstract_params, step: int | None = None):
  """Only the params of a checkpoint (latest, or ``step``), placed per ``abstract_params``."""
  step = resolve_step(workdir, step)
  manager = _manager(workdir, items=('params',), create=False)
  try:
    got = manager.restore(step, args=ocp.args.Composite(params=_restore_args(abstract_params)))
    _check_shapes(got.params, abstract_params, 'params', step)
    return got.params, step
  finally:
    manager.close()
