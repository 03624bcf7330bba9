"""On gs:// Orbax writes a step in place and marks it complete with commit_success.txt:
a step directory without that marker (a save in progress, or one a preemption cut short)
is never taken as a step."""

import pytest
from etils import epath

from encoder_jax.run import checkpointing

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def test_a_step_without_its_commit_marker_is_never_a_step(bucket):
  run = f'{bucket}/marker-run'
  done, cut = epath.Path(f'{run}/checkpoints/3'), epath.Path(f'{run}/checkpoints/7')
  (done / 'params').mkdir(parents=True, exist_ok=True)
  (done / 'params' / '_METADATA').write_text('{}')
  (done / 'commit_success.txt').write_text('Checkpoint commit was successful to ' + str(done))
  (cut / 'params').mkdir(parents=True, exist_ok=True)
  (cut / 'params' / '_METADATA').write_text('{}')  # Newer, but its save never completed.
  assert checkpointing.steps(run) == [3]
  assert checkpointing.resolve_step(run) == 3
  with pytest.raises(checkpointing.CheckpointError, match=r'no checkpoint for step 7 that '
                     r'completed \(its save was cut short: no commit marker\); it has steps '
                     r'\[3\]'):
    checkpointing.resolve_step(run, 7)


@pytest.mark.parametrize('fsspec_instances_dropped', [False, True])
def test_a_step_another_host_moved_is_listed_anew(bucket, fsspec_instances_dropped):
  """gcsfs caches listings without expiry: after process 0 sets a step aside (here: its
  objects deleted through another client, as another host's are), this host's checkpointer
  must list it gone, and save that step again. Also when fsspec's own file systems were
  dropped meanwhile (by any code in the process): etils.epath keeps the one it made, and
  its listings must be forgotten too."""
  import fsspec  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from encoder_jax.storage import paths as storage  # pylint: disable=g-import-not-at-top
  from encoder_jax.run import train_state  # pylint: disable=g-import-not-at-top
  run = f'{bucket}/moved-run-{int(fsspec_instances_dropped)}'
  ckpt = checkpointing.Checkpointer(run, ml_collections.ConfigDict(
      dict(every_steps=1, keep=5, async_save=False)))
  state = train_state.TrainState(step=jnp.int32(0), params={'w': jnp.ones(3)},
                                 opt_state={'m': jnp.zeros(3)})
  try:
    for step in (1, 2):
      ckpt.save(step, state, {})
    ckpt.wait()
    assert ckpt.manager.all_steps() == [1, 2]
    assert sorted(d.name for d in epath.Path(f'{run}/checkpoints').iterdir()) == ['1', '2']
    if fsspec_instances_dropped:
      fsspec.get_filesystem_class('gs').clear_instance_cache()
    for url in storage.glob(f'{run}/checkpoints/2/**'):
      blob, now = storage.Blob(url), storage.Blob(url).read()
      if now is not None:  # An object, not a prefix.
        blob.delete(if_generation=now.generation)
    ckpt.refresh()
    assert ckpt.manager.all_steps() == [1]
    ckpt.save(2, state, {})  # Not StepAlreadyExistsError.
    ckpt.wait()
    assert checkpointing.steps(run) == [1, 2]
  finally:
    ckpt.close()
