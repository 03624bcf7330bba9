"""Orbax checkpoints of a training run: params, optimizer state, data-iterator state, step.

Layout: ``<workdir>/checkpoints/<step>/{params,opt_state,data,meta}``. Saves are
asynchronous (training continues while the arrays are written) and atomic: Orbax writes
to a temporary directory and renames it when complete, so a run killed mid-save leaves
the previous checkpoints intact. A checkpoint that fails to restore (truncated, written
for another model shape) is reported and the next older one is tried; if none can be
restored, the run stops with every reason, and never silently starts from scratch.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from encoder_jax import workdir as workdir_lib

ITEMS = ('params', 'opt_state', 'data', 'meta')


class CheckpointError(RuntimeError):
  pass


def checkpoint_dir(workdir: str) -> str:
  return str(workdir_lib.path(workdir, 'checkpoints'))


def _manager(workdir: str, keep: int = 3, async_save: bool = False, items=ITEMS,
             create: bool = True) -> ocp.CheckpointManager:
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
  is gathered there and saved as one list; each host restores its own entry.
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


def _own_data_state(saved: dict | None, step: int) -> dict:
  states = (saved or {}).get('processes', [{}])
  if all(not s for s in states):
    return {}  # E.g. an imported checkpoint: the stream starts from the beginning.
  if len(states) != jax.process_count():
    raise CheckpointError(
        f'checkpoint step {step} holds the data-iterator state of {len(states)} processes; '
        f'this run has {jax.process_count()}: resume with the same number of hosts')
  return states[jax.process_index()]


class Checkpointer:
  """Saves and restores a run's state in ``<workdir>/checkpoints``."""

  def __init__(self, workdir: str, checkpoint_config: ml_collections.ConfigDict):
    if checkpoint_config.keep < 1 or checkpoint_config.every_steps < 1:
      raise ValueError('config.checkpoint.keep and every_steps must be >= 1; got '
                       f'{checkpoint_config.keep}, {checkpoint_config.every_steps}')
    self.every_steps = int(checkpoint_config.every_steps)
    self.manager = _manager(workdir, checkpoint_config.keep, checkpoint_config.async_save)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict[str, Any]) -> None:
    self.manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(state.params),
        opt_state=ocp.args.StandardSave(state.opt_state),
        data=ocp.args.JsonSave({'processes': _gather_json(data_state)}),
        meta=ocp.args.JsonSave({'step': int(step)})), force=True)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def restore(self, abstract_state) -> tuple[Any, dict, int] | None:
    """The newest restorable (params, opt_state, data_state, step), or None if none exist.

    ``abstract_state`` has ``.params`` and ``.opt_state`` trees of ShapeDtypeStructs whose
    ``.sharding`` says where each restored array goes.
    """
    steps = sorted(self.manager.all_steps(), reverse=True)
    if not steps:
      return None
    failures = []
    for step in steps:
      try:
        got = self.manager.restore(step, args=ocp.args.Composite(
            params=_restore_args(abstract_state.params),
            opt_state=_restore_args(abstract_state.opt_state),
            data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
        _check_shapes(got.params, abstract_state.params, 'params', step)
        _check_shapes(got.opt_state, abstract_state.opt_state, 'opt_state', step)
        if int(got.meta['step']) != step:
          raise CheckpointError(f'checkpoint step {step}: meta says step {got.meta["step"]}')
      except Exception as e:  # pylint: disable=broad-except
        reason = f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}'
        logging.error('Checkpoint step %d in %s cannot be restored (%s); trying an older one.',
                      step, self.manager.directory, reason)
        failures.append(f'step {step}: {reason}')
        continue
      if failures:
        logging.warning('Restored step %d after skipping unreadable checkpoints: %s', step,
                        '; '.join(failures))
      return got.params, got.opt_state, _own_data_state(got.data, step), step
    raise CheckpointError(
        f'No checkpoint in {self.manager.directory} could be restored; refusing to start from '
        'scratch over them. Reasons: ' + ' | '.join(failures))

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def resolve_step(workdir: str, step: int | None = None) -> int:
  """``step``, checked to exist in ``workdir``, or its newest; a clear error if there is none."""
  directory = workdir_lib.path(workdir, 'checkpoints')
  if not workdir_lib.path(workdir).is_dir():
    raise CheckpointError(f'workdir {workdir!r} does not exist')
  steps = sorted(int(d.name) for d in directory.iterdir()
                 if d.name.isdigit()) if directory.is_dir() else []
  if not steps:
    raise CheckpointError(f'{directory} holds no checkpoint; expected <step>/ directories '
                          'written by encoder_jax.main or encoder_jax.convert')
  if step is None:
    return steps[-1]
  if step not in steps:
    raise CheckpointError(f'{directory} has no checkpoint for step {step}; it has steps {steps}')
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
