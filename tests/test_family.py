"""Every registered model kind x objective trains on 8 simulated devices, learns, and resumes
exactly.

One row per pretraining setup in :data:`family.FAMILY` (a new kind or objective adds a row):
a tiny config on the embedded corpus runs 12 steps on a (data=2, fsdp=2, tensor=2) mesh with
checkpoints at steps 6 and 12, and its loss falls; then, in a copy of its workdir, the
step-12 checkpoint is removed and the same command resumes from step 6, and must end with
the same params, bit for bit. (The row's run is :func:`family.trained`'s, which the
end-to-end tests of the kinds and objectives read as well.)
"""

import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from encoder_jax.api import pretrain

from encoder_jax.run import engine
from encoder_jax.run import checkpointing
from encoder_jax.config import schema as config_base
from encoder_jax import objectives
from encoder_jax.run import train_state
from encoder_jax.config import validation
from encoder_jax.models import registry as models

from support import family
from support.family import FAMILY, family_config


def test_every_kind_is_registered_in_the_family_table():
  kinds = {FAMILY[n].get('model', {}).get('kind', 'bert') for n in FAMILY}
  assert kinds == set(models.KINDS), set(models.KINDS) - kinds


def test_every_objective_is_trained_by_a_family_row():
  names = {n for row in FAMILY.values()
           for n in row.get('objective', {}).get('names', ('mlm', 'nsp'))}
  assert names == set(objectives.REGISTRY), set(objectives.REGISTRY) - names


ENTRIES = ([('model', k) for k in sorted(models.KINDS)]
           + [('objective', n) for n in sorted(objectives.REGISTRY)])


@pytest.mark.parametrize('section,name', ENTRIES, ids=[f'{s}-{n}' for s, n in ENTRIES])
def test_every_registry_entry_declares_sound_fields(section, name):
  """Each entry's fields are in the schema at their documented, in-range defaults, and a
  value of the wrong kind is refused by validation naming the key and its range."""
  entry = models.get(name) if section == 'model' else objectives.REGISTRY[name]
  assert entry.description, f'{section} {name!r} has no description'
  schema = config_base.base_config()[section]
  row = next(n for n in sorted(FAMILY) if (
      FAMILY[n].get('model', {}).get('kind', 'bert') == name if section == 'model' else
      name in FAMILY[n].get('objective', {}).get('names', ('mlm', 'nsp'))))
  for f in entry.fields:
    assert f.doc and f.ok(f.default), f
    assert f.name in schema and schema[f.name] == f.default, f.name
    c = ml_collections.ConfigDict(family_config(row, '/unused').to_dict(), type_safe=False)
    c[section][f.name] = '<wrong>'
    found = validation.problems(c)
    assert found and found[0].startswith(f"config.{section}.{f.name}='<wrong>': expected "
                                         f'{f.expected()}'), found
  # The family row itself is valid, and its setup shows console metrics of its own.
  c = family_config(row, '/unused')
  validation.validate(c)
  assert objectives.build(c).console_metrics


@pytest.mark.parametrize('kind', sorted(models.KINDS))
def test_import_defaults_of_every_kind_build(kind, tmp_path):
  """What a checkpoint of the kind imported from Hugging Face continues pretraining with
  (its registry entry's import_objectives / import_pair_kind) is a valid setup."""
  name = next(n for n in sorted(FAMILY) if FAMILY[n].get('model', {}).get('kind', 'bert') == kind)
  c = family_config(name, str(tmp_path))
  entry = models.get(kind)
  c.objective.names, c.data.pair_kind = entry.import_objectives, entry.import_pair_kind
  validation.validate(c)
  assert objectives.build(c).downstream.__self__ is not None


@pytest.mark.slow
@pytest.mark.parametrize('name', [pytest.param(n, marks=pytest.mark.xdist_group(family.group(n)))
                                  for n in sorted(FAMILY)])
def test_trains_on_8_devices_learns_and_resumes_exactly(name, family_root, tmp_path):
  assert jax.device_count() == 8
  run = family.trained(name, family_root)
  c = run.config
  assert np.isfinite(run.result['loss'])
  # Every row learns: the mean of the last two logged losses is below the first by 3% or
  # more (4.3-34% measured).
  losses = run.logged('loss')
  assert len(losses) == family.NUM_STEPS // 2 and np.mean(losses[-2:]) < 0.97 * losses[0], losses
  # The progress lines show what the setup declares (each objective names its metrics).
  progress = [l for l in run.console.splitlines() if l.startswith(('train step', 'eval  step'))]
  shown = objectives.build(c).console_metrics
  assert progress and shown, (progress, shown)
  for _, short, _ in shown:
    assert any(f'  {short} ' in l for l in progress), (short, progress)
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 2, 2), ('data', 'fsdp', 'tensor'))
  abstract = train_state.abstract_params(c, mesh, objectives.build(c))
  last = family.NUM_STEPS
  final, step = checkpointing.restore_params(run.workdir, abstract, last)
  assert step == last
  # In a copy of the workdir, drop the last checkpoint: the rerun resumes from step 6 and
  # must retrace steps 7-12.
  workdir = str(tmp_path / 'run')
  shutil.copytree(run.workdir, workdir)
  shutil.rmtree(os.path.join(checkpointing.checkpoint_dir(workdir), str(last)))
  programs = engine._PROGRAMS  # pylint: disable=protected-access
  kept = {k: programs[k] for k in run.programs if k in programs}
  pretrain.run(c, workdir)
  # The same config again in this process asks for the very steps the run traced, and
  # reuses those still kept (a few are: the tests run in between may have pushed them out).
  assert set(list(programs)[-len(run.programs):]) == set(run.programs), (list(programs),
                                                                         run.programs)
  assert all(programs[k] is fn for k, fn in kept.items())
  again, _ = checkpointing.restore_params(workdir, abstract, last)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(final), jax.device_get(again))
