"""A run whose workdir is a bucket, end to end against the emulator: ``main`` trains (its
first run preempted after step 8, as a SIGTERM does) and writes its config, tokenizer,
metrics, TensorBoard events and Orbax checkpoints there; a rerun resumes from them and
appends to the metrics; a refused resume changes no object; the reading commands
(evaluate, fill_mask, embed, plot, encoder_jax.load) read the bucket (embed its input and
output there too; convert exports to it and imports from it); a run SIGKILLed and rerun
through a proxy that answers some requests with 503 ends as the first run; a garbled
newest checkpoint is set aside on the bucket. Tiny config, one phase.

The commands run as ``python -m`` runs them, in this process (``in_process.command``): what
they read and write on the bucket is the point, not their process. The run that is
SIGKILLed is a subprocess; its rerun through the proxy (another endpoint: the environment
names it while the rerun runs, as a process of its own would be started with) runs here
too, with the compiled steps of the first run."""

import contextlib
import io
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from encoder_jax.run import engine
from encoder_jax.storage import paths as storage
from encoder_jax.storage import client as storage_client

import support
from support import in_process
from support import tiny_config

ROOT = support.ROOT

pytestmark = pytest.mark.slow


_cli = in_process.command


@contextlib.contextmanager
def _endpoint(url: str):
  """This process's storage layers pointed at ``url`` (a proxy of the emulator) while it
  lasts, as a process started with ``STORAGE_EMULATOR_HOST=url`` would be: everything
  derived from that variable is derived again from it, and gcsfs (which keeps its file
  system, endpoint included, for the process) makes another, dropped after."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv(storage_client.EMULATOR_HOST, url)
    patch.delenv('TENSORSTORE_GCS_HTTP_URL', raising=False)
    storage_client.forget_file_systems()
    try:
      yield
    finally:
      storage_client.forget_file_systems()


# The tiny config at one sequence length (tiny_config.one_phase: what is read and written on
# the bucket does not depend on the phases; the run compiles half the programs).
def _main_flags(prepared: str, workdir: str, *flags: str) -> list[str]:
  return [f'--config={support.TINY_CONFIG}:{tiny_config.one_phase(prepared)}',
          f'--workdir={workdir}', *flags]


def _config(prepared: str):
  """The config of the runs ``_main_flags`` starts."""
  return tiny_config.get_config(tiny_config.one_phase(prepared))


def _objects(url: str) -> dict[str, int]:
  """Object name (under ``url``) -> generation."""
  bucket, prefix = storage.split(url)
  return {b.name[len(prefix) + 1:]: b.generation
          for b in storage_client.client().list_blobs(bucket, prefix=prefix + '/')}


def _metrics(workdir: str, split: str = 'train', key: str = 'step') -> list:
  text = storage.Blob(f'{workdir}/metrics.jsonl').read().text
  return [r[key] for r in map(json.loads, text.splitlines()) if r['split'] == split]


def test_a_run_in_a_bucket_end_to_end(gcs_emulator, faulty_proxy, prepared_dir, tmp_path,
                                      capsys):
  """One test (the runs are shared, so pytest-xdist must not split them): each check below
  is a function."""
  gcs_emulator.create_bucket('e2e')
  trained = _train(capsys, prepared_dir, 'gs://e2e/run')
  _check_the_run_was_written_and_resumed(trained)
  _check_a_refused_resume_changes_no_object(trained)
  _check_the_reading_commands_read_the_bucket(capsys, trained, tmp_path)
  _check_a_killed_run_resumes_bit_exactly_through_server_errors(capsys, trained,
                                                                faulty_proxy, tmp_path)
  _check_a_garbled_newest_checkpoint_is_set_aside(trained)


def _train(capsys, prepared: str, workdir: str):
  """(workdir, prepared dir, the two runs' outputs): the 12-step run preempted after step 8
  (as a SIGTERM would), then rerun, which resumes to 12 (and reuses the first's steps)."""
  at = engine.Preempted.at
  engine.Preempted.at = lambda self, step: step == 8 or at(self, step)
  try:
    first = _cli(capsys, 'main', *_main_flags(prepared, workdir))
  finally:
    engine.Preempted.at = at
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  after_first = _objects(workdir)
  steps_first = _metrics(workdir)
  assert 'Preempted at step 8' in first.stdout, first.stdout[-3000:]
  second = _cli(capsys, 'main', *_main_flags(prepared, workdir))
  assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
  return workdir, prepared, dict(after_first=after_first, steps_first=steps_first,
                                 second=second.stdout + second.stderr)


def _check_the_run_was_written_and_resumed(trained):
  workdir, _, runs = trained
  first = runs['after_first']
  config = json.loads(storage.Blob(f'{workdir}/config.json').read().text)
  assert config['model']['hidden_size'] == 32 and config['train']['seq_lens'] == [32]
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


def _check_a_refused_resume_changes_no_object(trained):
  """In process: a fresh process would pay the imports again for one error (a user error,
  WorkdirError among them, as one line with exit status 2: cli.run, tests/core/test_extras.py)."""
  from encoder_jax.api import pretrain  # pylint: disable=g-import-not-at-top
  from encoder_jax.run import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  workdir, prepared, _ = trained
  before = _objects(workdir)
  c = _config(prepared)
  c.model.intermediate_size = 48
  with pytest.raises(workdir_lib.WorkdirError, match='config.model.intermediate_size: 64 -> 48'):
    pretrain.run(c, workdir)
  assert _objects(workdir) == before


def _check_the_reading_commands_read_the_bucket(capsys, trained, tmp_path):
  workdir, _, _ = trained
  evaluated = _cli(capsys, 'evaluate', f'--workdir={workdir}')
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert json.loads(storage.Blob(f'{workdir}/eval_12.json').read().text)
  filled = _cli(capsys, 'fill_mask', f'--workdir={workdir}', '--text=the [MASK] of')
  assert filled.returncode == 0 and '[MASK] #1:' in filled.stdout, filled.stderr[-3000:]
  storage.Blob('gs://e2e/embed/in.txt').write('a first sentence\r\nand a second one\n', 0)
  embedded = _cli(capsys, 'embed', f'--workdir={workdir}', '--input=gs://e2e/embed/in.txt',
                  '--output=gs://e2e/embed/emb.npy')
  assert embedded.returncode == 0, embedded.stderr[-3000:]
  assert np.load(io.BytesIO(_bytes('gs://e2e/embed/emb.npy'))).shape == (2, 32)
  plotted = _cli(capsys, 'plot', f'--workdir={workdir}')
  assert plotted.returncode == 0, plotted.stderr[-3000:]
  assert storage.Blob(f'{workdir}/loss.png').read() is not None
  _check_fine_tuning_from_and_into_the_bucket(workdir, tmp_path)
  _check_convert_both_ways(capsys, workdir)


def _bytes(url: str) -> bytes:
  bucket, name = storage.split(url)
  return storage_client.client().bucket(bucket).blob(name).download_as_bytes()


def _check_convert_both_ways(capsys, workdir: str):
  """workdir_to_hf writes its export to the bucket; hf_to_workdir imports it from there into
  another workdir on the bucket, which embeds as the original does and whose config names
  the tokenizer pinned on the bucket; a second import into it is refused."""
  import encoder_jax  # pylint: disable=g-import-not-at-top
  from encoder_jax.data import tokenizer_files  # pylint: disable=g-import-not-at-top
  from encoder_jax.interop import hf_import  # pylint: disable=g-import-not-at-top
  exported = _cli(capsys, 'convert', 'workdir_to_hf', f'--workdir={workdir}', f'--out={workdir}/hf')
  assert exported.returncode == 0, exported.stderr[-3000:]
  assert {'config.json', 'model.safetensors'} <= set(_objects(f'{workdir}/hf'))
  imported = _cli(capsys, 'convert', 'hf_to_workdir', f'--hf_dir={workdir}/hf',
                  '--workdir=gs://e2e/imported')
  assert imported.returncode == 0, imported.stderr[-3000:]
  assert {'config.json', 'import_report.json', 'tokenizer/tokenizer.json'} <= set(
      _objects('gs://e2e/imported'))
  texts = ['a first sentence', 'and a second one']
  np.testing.assert_allclose(encoder_jax.load('gs://e2e/imported').embed(texts),
                             encoder_jax.load(workdir).embed(texts), rtol=1e-5, atol=1e-6)
  tokenizer = json.loads(storage.Blob('gs://e2e/imported/config.json').read().text)['tokenizer']
  pinned = json.loads(storage.Blob('gs://e2e/imported/tokenizer/tokenizer.json').read().text)
  assert tokenizer['path'] == f'gs://e2e/imported/tokenizer/{pinned["file"]}'
  assert tokenizer_files.file_sha256(tokenizer['path']) == pinned['sha256']
  with pytest.raises(FileExistsError, match='already holds checkpoints'):
    hf_import.import_hf_to_workdir(f'{workdir}/hf', 'gs://e2e/imported')


def _check_fine_tuning_from_and_into_the_bucket(workdir: str, tmp_path):
  from encoder_jax.finetune import config as finetune_config  # pylint: disable=g-import-not-at-top
  from encoder_jax.finetune import train as finetune  # pylint: disable=g-import-not-at-top
  (tmp_path / 'sst.tsv').write_text('sentence\tlabel\n' + ''.join(
      f'{s}\t{l}\n' for s, l in [('a good film.', 1), ('a bad film.', 0)] * 4))
  c = finetune_config.base_config()
  c.task, c.init.workdir = 'sequence_classification', workdir
  c.data.update(train=f'tsv:{tmp_path / "sst.tsv"}', eval=f'tsv:{tmp_path / "sst.tsv"}',
                max_len=32)
  c.optim.update(epochs=1, batch_size=8, eval_batch_size=8)
  out = 'gs://e2e/finetuned'
  assert finetune.finetune(c, out)['step'] == 1
  assert len(jax_leaves(finetune.read_final_params(out))) > 10
  assert json.loads(storage.Blob(f'{out}/labels.json').read().text) == ['0', '1']
  assert _metrics(out, split='eval')


def jax_leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.leaves(tree)


HANG_AT_STEP_6 = """
import os, runpy, sys, time
from encoder_jax.run import metrics_log
MARKER = sys.argv.pop(1)
_write = metrics_log.MetricWriter.write


def write(self, step, scalars, prefix='train'):
  if step == 6 and prefix == 'train':  # Step 6 trained, not logged: wait to be killed.
    open(MARKER, 'w').close()
    while True:
      time.sleep(1)
  return _write(self, step, scalars, prefix)


metrics_log.MetricWriter.write = write
runpy.run_module('encoder_jax.main', run_name='__main__')
"""


def _check_a_killed_run_resumes_bit_exactly_through_server_errors(capsys, trained,
                                                                  faulty_proxy, tmp_path):
  """Through a proxy that answers some requests with 503 (not forwarded), a run is
  SIGKILLed at step 6 and rerun: each storage library (google-cloud-storage: the lock,
  metrics and events; gcsfs: config and checkpoint metadata; tensorstore: arrays) meets at
  least two 503s and retries, the rerun takes over the dead run's lock and resumes from
  step 4, and its losses and parameters equal those of the first workdir's run (preempted
  after step 8, resumed from there) bit for bit. gcsfs sends most requests (about 600) and
  waits 1-2 s before a retry, so one in 120 of its requests fails, one in 30 of
  tensorstore's (about 150) and one in 10 of google-cloud-storage's (35 to 50: the metrics
  are appended to on a timer, so a faster run sends fewer)."""
  import encoder_jax  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  workdir, prepared, _ = trained
  every = {'python-gcsfs': 120, 'gcloud-python': 10, 'tensorstore': 30}
  proxy, faulty = faulty_proxy(every), 'gs://e2e/faulty'
  flags = _main_flags(prepared, faulty)
  env = dict(os.environ, **{storage_client.EMULATOR_HOST: proxy.url})
  env.pop('TENSORSTORE_GCS_HTTP_URL')
  marker = tmp_path / 'at_step_6'
  killed = subprocess.Popen([sys.executable, '-c', HANG_AT_STEP_6, str(marker), *flags],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 300
    while not (marker.exists() and 'checkpoints/4/commit_success.txt' in _objects(faulty)):
      assert killed.poll() is None and time.time() < deadline, 'the run stopped early'
      time.sleep(0.2)
  finally:
    killed.kill()
    killed.wait()
  with _endpoint(proxy.url):  # In this process: its steps compiled by the first run's.
    forwarded = proxy.forwarded.copy()
    rerun = _cli(capsys, 'main', *flags)
    assert all(proxy.forwarded[library] > forwarded[library] for library in every), (
        proxy.forwarded, forwarded)  # The rerun's requests went through the proxy.
  out = rerun.stdout + rerun.stderr
  assert rerun.returncode == 0, out[-5000:]
  assert f'pid {killed.pid}' in out and 'resuming from checkpoint step 4' in out
  assert all(proxy.injected[library] >= 2 for library in every), (proxy.injected,
                                                                  proxy.forwarded)
  assert _metrics(faulty) == list(range(1, 13))
  assert _metrics(faulty, key='loss') == _metrics(workdir, key='loss')
  ours, undisturbed = (jax.tree.leaves(encoder_jax.load(w, step=12).params)
                       for w in (faulty, workdir))
  assert len(ours) == len(undisturbed) > 10
  assert all(np.array_equal(a, b) for a, b in zip(ours, undisturbed))


def _check_a_garbled_newest_checkpoint_is_set_aside(trained):
  """Every object of step 12's params truncated: step 8 restores, step 12 is moved to
  checkpoints_damaged/ on the bucket with its reason beside it."""
  from encoder_jax.run import checkpointing  # pylint: disable=g-import-not-at-top
  from encoder_jax.core import sharding  # pylint: disable=g-import-not-at-top
  from encoder_jax.run import pretraining  # pylint: disable=g-import-not-at-top
  workdir, prepared, _ = trained
  bucket, prefix = storage.split(workdir)
  for blob in storage_client.client().list_blobs(bucket, prefix=f'{prefix}/checkpoints/12/params/'):
    blob.upload_from_string(b'')
  c = _config(prepared)
  ckpt = checkpointing.Checkpointer(workdir, c.checkpoint)
  step = ckpt.restore(pretraining.pieces(c, sharding.make_mesh(c.mesh)).abstract_state())[3]
  ckpt.close()
  assert step == 8 and [s for s, _, _ in ckpt.set_aside] == [12]
  names = set(_objects(workdir))
  assert not any(n.startswith('checkpoints/12/') for n in names)
  aside = ckpt.set_aside[0][2][len(workdir) + 1:]
  assert f'{aside}/params/_METADATA' in names and f'{aside}.txt' in names
  assert 'not valid JSON' in storage.Blob(f'{workdir}/{aside}.txt').read().text
