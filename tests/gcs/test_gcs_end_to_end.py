"""A run whose workdir is a bucket, end to end against the emulator: ``main`` trains and
writes its config, tokenizer, metrics, TensorBoard events and Orbax checkpoints there; a
rerun resumes from them and appends to the metrics; a refused resume changes no object;
the reading commands (evaluate, fill_mask, embed, plot) read the bucket. Tiny config, one
trained workdir per module."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from encoder_jax import data as data_lib
from encoder_jax import storage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'tests'))
import tiny_config  # pylint: disable=wrong-import-position

pytestmark = pytest.mark.slow


def _run(module: str, *flags: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', f'encoder_jax.{module}', *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=600, check=False)


def _main(prepared: str, workdir: str, *flags: str) -> subprocess.CompletedProcess:
  return _run('main', f'--config={ROOT}/tests/tiny_config.py:prepared_dir={prepared}',
              f'--workdir={workdir}', '--config.checkpoint.every_steps=4', *flags)


def _objects(url: str) -> dict[str, int]:
  """Object name (under ``url``) -> generation."""
  bucket, prefix = storage.split(url)
  return {b.name[len(prefix) + 1:]: b.generation
          for b in storage.client().list_blobs(bucket, prefix=prefix + '/')}


def _metrics(workdir: str, split: str = 'train') -> list[int]:
  text = storage.Blob(f'{workdir}/metrics.jsonl').read().text
  return [r['step'] for r in map(json.loads, text.splitlines()) if r['split'] == split]


@pytest.fixture(scope='module')
def trained(gcs_emulator, tmp_path_factory):
  """(workdir on the bucket, prepared dir, the two runs' outputs): 8 steps, then resumed
  to 12."""
  prepared = str(tmp_path_factory.mktemp('prepared'))
  data_lib.load_or_prepare(tiny_config.get_config(f'prepared_dir={prepared}'))
  gcs_emulator.create_bucket('e2e')
  workdir = 'gs://e2e/run'
  first = _main(prepared, workdir, '--config.train.num_steps=8')
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  after_first = _objects(workdir)
  steps_first = _metrics(workdir)
  second = _main(prepared, workdir, '--config.train.num_steps=12')
  assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
  return workdir, prepared, dict(after_first=after_first, steps_first=steps_first,
                                 second=second.stdout + second.stderr)


def test_main_writes_the_run_to_the_bucket_and_a_rerun_resumes_there(trained):
  workdir, _, runs = trained
  first = runs['after_first']
  assert json.loads(storage.Blob(f'{workdir}/config.json').read().text)['model'][
      'hidden_size'] == 32
  for name in ('tokenizer/tokenizer.json', 'tokenizer/tokenizer.model',
               'tokenizer/unigram_counts.npy', 'parameters.txt'):
    assert name in first, sorted(first)
  assert any(n.startswith('tensorboard/events.out.tfevents') for n in first)
  assert {n.split('/')[1] for n in first if n.startswith('checkpoints/')} == {'4', '8'}
  assert '.lock' not in first  # Released at the end.
  assert runs['steps_first'] == list(range(1, 9))
  assert 'resuming from checkpoint step 8' in runs['second']
  assert _metrics(workdir) == list(range(1, 13))  # Appended to, not overwritten.
  now = _objects(workdir)
  assert {n.split('/')[1] for n in now if n.startswith('checkpoints/')} == {'4', '8', '12'}
  assert now['checkpoints/8/_CHECKPOINT_METADATA'] == first['checkpoints/8/_CHECKPOINT_METADATA']


def test_a_refused_resume_changes_no_object_in_the_bucket(trained):
  workdir, prepared, _ = trained
  before = _objects(workdir)
  refused = _main(prepared, workdir, '--config.train.num_steps=12',
                  '--config.model.intermediate_size=48')
  assert refused.returncode != 0
  assert 'config.model.intermediate_size: 64 -> 48' in refused.stdout + refused.stderr
  assert _objects(workdir) == before


def test_the_reading_commands_read_a_workdir_in_the_bucket(trained, tmp_path):
  workdir, _, _ = trained
  evaluated = _run('evaluate', f'--workdir={workdir}')
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert json.loads(storage.Blob(f'{workdir}/eval_12.json').read().text)
  filled = _run('fill_mask', f'--workdir={workdir}', '--text=the [MASK] of')
  assert filled.returncode == 0 and '[MASK] #1:' in filled.stdout, filled.stderr[-3000:]
  (tmp_path / 'in.txt').write_text('a first sentence\nand a second one\n')
  embedded = _run('embed', f'--workdir={workdir}', f'--input={tmp_path / "in.txt"}',
                  f'--output={tmp_path / "emb.npy"}')
  assert embedded.returncode == 0, embedded.stderr[-3000:]
  assert np.load(tmp_path / 'emb.npy').shape == (2, 32)
  plotted = _run('plot', f'--workdir={workdir}')
  assert plotted.returncode == 0, plotted.stderr[-3000:]
  assert storage.Blob(f'{workdir}/loss.png').read() is not None
