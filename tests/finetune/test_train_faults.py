"""Fine-tuning survives SIGKILL and SIGTERM mid-epoch: rerunning the same config ends with
the very params of a run never interrupted (bit for bit).

The interrupted run is ``python -m encoder_jax.finetune.main`` in a subprocess (a tiny BERT,
16 examples, 2 epochs of 2 steps, a checkpoint at each epoch's end); the uninterrupted
reference and the rerun go through the same ``finetune.train.finetune`` in this process (the
signal's target is the subprocess, not them), which saves a Python and JAX start each. The
signal is not timed but injected: ``held_run.script`` runs the command with the engine's
preemption check of step ``STEP`` (mid-epoch 2) held until the signal comes; SIGKILL then
loses the epoch's first step (the rerun resumes from epoch 1's checkpoint), SIGTERM is heard
by the engine's handler (checkpoint at the step, exit, resume from it).
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from encoder_jax.finetune import train

import support
from support import held_run
from support import hf_fixtures

ROOT = support.ROOT

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

STEP = 3  # Mid-epoch 2 (steps 3 and 4).
CONFIG = '''
from encoder_jax.finetune import config as finetune_config


def get_config():
  c = finetune_config.base_config()
  c.init.hf_dir = {hf_dir!r}
  c.data.update(train={data!r}, eval={data!r}, max_len=32)
  c.optim.update(learning_rate=1e-3, epochs=2, batch_size=8, eval_batch_size=8)
  c.dropout_rate = 0.1  # The resumed steps must redraw the same dropout keys.
  return c
'''
@pytest.fixture(scope='module')
def setup(tmp_path_factory):
  """(config file, the subprocesses' environment, reference workdir)."""
  root = tmp_path_factory.mktemp('finetune_faults')
  hf_dir = str(root / 'hf')
  os.makedirs(hf_dir)
  vocab_size = hf_fixtures.write_vocab(os.path.join(hf_dir, 'vocab.txt'))
  hf_fixtures.random_hf_model(vocab_size=vocab_size, hidden_size=16, num_layers=1, num_heads=2,
                              intermediate_size=24, max_positions=40).save_pretrained(hf_dir)
  rows = [{'sentence': s, 'label': int('good' in s or 'great' in s)} for s in (
      'the film was good.', 'a great movie!', 'it was great.', 'good, good.',
      'the film was bad.', 'a terrible movie!', 'it was terrible.', 'bad, bad.')] * 2
  data = root / 'train.jsonl'
  data.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  config = root / 'tiny_finetune.py'
  config.write_text(CONFIG.format(hf_dir=hf_dir, data=f'jsonl:{data}'))
  (root / 'inject.py').write_text(held_run.script('encoder_jax.finetune.main'))
  # This process's XLA compilation cache (tests/conftest.py), which the in-process reference
  # run fills, for the subprocesses too.
  env = dict(os.environ)
  reference = str(root / 'reference')
  train.finetune(_load(config), reference)
  return root, config, env, reference


def _load(config):
  """The config the command reads from ``--config``."""
  return runpy.run_path(str(config))['get_config']()


def _command(config, workdir, inject) -> list[str]:
  return [sys.executable, *inject, f'--config={config}', f'--workdir={workdir}']


@pytest.mark.slow  # A subprocess run of the fine-tuning command, then a rerun in process.
@pytest.mark.parametrize('sig', [signal.SIGKILL, signal.SIGTERM], ids=['SIGKILL', 'SIGTERM'])
def test_signal_mid_epoch_resumes_to_the_same_params(setup, sig, capsys):
  root, config, env, reference = setup
  workdir, marker = str(root / f'w_{sig.name}'), str(root / f'marker_{sig.name}')
  proc = subprocess.Popen(_command(config, workdir, [str(root / 'inject.py'), str(STEP),
                                                     marker]),
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
  held_run.wait_for(lambda: os.path.exists(marker), proc)
  proc.send_signal(sig)
  out = proc.communicate(timeout=300)[0]
  if sig == signal.SIGKILL:
    assert proc.returncode == -signal.SIGKILL
  else:
    assert proc.returncode == 0 and f'Preempted at step {STEP}: checkpoint saved' in out, out
  assert not os.path.exists(os.path.join(workdir, 'params'))  # It did not finish.
  capsys.readouterr()
  train.finetune(_load(config), workdir)
  resumed = capsys.readouterr().out
  assert f'resuming from checkpoint step {STEP - 1 if sig == signal.SIGKILL else STEP}' in resumed
  jax.tree.map(np.testing.assert_array_equal, train.read_final_params(reference),
               train.read_final_params(workdir))
