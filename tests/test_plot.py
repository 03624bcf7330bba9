"""metrics.jsonl after resumes (each step once) and the PNG of its curves."""

import json
import os

import numpy as np
import pytest

from encoder_jax.run import metrics_log as metrics_lib
from encoder_jax import plot

from support import in_process


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def _log(workdir, steps, resume_step=None, scale=1.0, eval_every=4):
  writer = metrics_lib.MetricWriter(str(workdir), resume_step=resume_step)
  for step in steps:
    writer.write(step, {'loss': scale * 9.0 / step, 'mlm_loss': scale * 8.0 / step,
                        'mlm_accuracy': 1 - 1.0 / step, 'learning_rate': 1e-3})
    if step % eval_every == 0:
      writer.write(step, {'mlm_loss': scale * 8.5 / step, 'mlm_accuracy': 0.5}, prefix='eval')
  writer.close()
  return writer


def _lines(workdir, name=metrics_lib.METRICS_FILE):
  with open(os.path.join(workdir, name)) as f:
    return [json.loads(line) for line in f]


def test_resumed_run_logs_each_step_once_and_keeps_what_it_superseded(tmp_path):
  _log(tmp_path, range(1, 11))  # Killed after step 10; its last checkpoint was step 4.
  writer = _log(tmp_path, range(5, 13), resume_step=4, scale=2.0)
  assert writer.superseded == 6 + 1  # Train steps 5..10 and the eval at step 8.
  rows = _lines(tmp_path)
  assert [(r['step'], r['split']) for r in rows if r['split'] == 'train'] == [
      (s, 'train') for s in range(1, 13)]
  assert [r['step'] for r in rows if r['split'] == 'eval'] == [4, 8, 12]
  step_6 = next(r for r in rows if r['step'] == 6)
  assert step_6['loss'] == pytest.approx(2 * 9.0 / 6)  # The resumed run's values.
  old = _lines(tmp_path, metrics_lib.SUPERSEDED_FILE)
  assert [r['step'] for r in old] == [5, 6, 7, 8, 8, 9, 10]
  assert all(r['superseded_by_resume_from'] == 4 for r in old)
  assert old[0]['loss'] == pytest.approx(9.0 / 5)
  assert metrics_lib.read_metrics(str(tmp_path)) == rows  # Already one row per (step, split).


def test_start_from_scratch_supersedes_everything_and_partial_lines_go(tmp_path):
  _log(tmp_path, range(1, 4))
  with open(tmp_path / metrics_lib.METRICS_FILE, 'a') as f:
    f.write('{"step": 4, "spl')  # Killed mid-write.
  writer = _log(tmp_path, range(1, 3), resume_step=0)  # Died before its first checkpoint.
  assert writer.superseded == 3
  assert [r['step'] for r in _lines(tmp_path)] == [1, 2]
  writer = _log(tmp_path, [3], resume_step=2)  # Nothing after step 2: nothing moved.
  assert writer.superseded == 0 and len(_lines(tmp_path, metrics_lib.SUPERSEDED_FILE)) == 3


def test_reader_keeps_the_last_line_of_a_step_logged_twice(tmp_path):
  """Files written before resumes superseded lines: the run that went on wins."""
  _log(tmp_path, range(1, 7))
  _log(tmp_path, range(3, 7), scale=3.0)  # resume_step=None: appends as before.
  rows = metrics_lib.read_metrics(str(tmp_path))
  train = [r for r in rows if r['split'] == 'train']
  assert [r['step'] for r in train] == list(range(1, 7))
  assert train[3]['loss'] == pytest.approx(3 * 9.0 / 4)
  with pytest.raises(FileNotFoundError, match='holds no training metrics'):
    metrics_lib.read_metrics(str(tmp_path / 'nothing'))


def _png_size(path):
  data = open(path, 'rb').read()
  assert data[:8] == b'\x89PNG\r\n\x1a\n'
  return int.from_bytes(data[16:20], 'big'), int.from_bytes(data[20:24], 'big')


def test_plot_draws_train_and_eval_loss_and_accuracy(tmp_path):
  _log(tmp_path, range(1, 41))
  written = plot.plot(str(tmp_path))
  assert written == str(tmp_path / 'loss.png')
  width, height = _png_size(written)
  assert width > 1000 and height > 400
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  pixels = matplotlib.image.imread(written)
  assert np.std(pixels[..., :3]) > 0.05  # Curves, not a blank canvas.
  series = plot._series(metrics_lib.read_metrics(str(tmp_path)), 'eval', 'loss')
  assert list(series) == ['mlm_loss'] and series['mlm_loss'][0] == list(range(4, 41, 4))


def test_plot_command_line(tmp_path, capsys):
  """The command as ``python -m`` runs it, in this process (what it writes and prints is the
  point): the PNG where --out says; a workdir without metrics is one line, exit status 1."""
  _log(tmp_path / 'run', range(1, 9))
  out = tmp_path / 'plots' / 'curves.png'
  done = in_process.command(capsys, 'plot', f'--workdir={tmp_path}/run', f'--out={out}')
  assert done.returncode == 0, done.stderr
  assert f'Wrote {out}' in done.stdout and _png_size(out)[0] > 0
  done = in_process.command(capsys, 'plot', f'--workdir={tmp_path}/none')
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[-1].startswith('encoder_jax.plot: ')
  assert 'Traceback' not in done.stderr and 'holds no training metrics' in done.stderr
