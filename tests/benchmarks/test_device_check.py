"""``benchmarks/device_check.py --dry_run``: the accelerator check rehearsed on the CPU, every
part at tiny shapes, one part made to fail; and the training path without TensorFlow (the
accelerator machine has neither tensorflow nor tensorflow-datasets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ROOT = support.ROOT
SCRIPT = os.path.join(ROOT, 'benchmarks', 'device_check.py')


def _device_check():
  return support.benchmark('device_check')


def _env() -> dict:
  # One CPU device (conftest simulates 8 for the sharding tests), XLA's fast compile flags.
  flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count')]
  return dict(os.environ, XLA_FLAGS=' '.join(flags), JAX_PLATFORMS='cpu',
              TF_CPP_MIN_LOG_LEVEL='3', PYTHONUNBUFFERED='1')


@pytest.mark.slow
def test_dry_run_reports_every_part_and_a_failed_part_does_not_stop_the_others(tmp_path):
  out = tmp_path / 'out'
  proc = subprocess.run(
      [sys.executable, SCRIPT, '--dry_run', f'--out={out}', f'--scratch={tmp_path / "scratch"}',
       '--fail_part=electra_small'], cwd=ROOT, env=_env(), capture_output=True, text=True,
      timeout=900, check=False)
  log = proc.stdout[-6000:] + proc.stderr[-3000:]
  assert proc.returncode == 0, log
  report = json.loads((out / 'device_check.json').read_text())
  markdown = (out / 'device_check.md').read_text()
  parts = _device_check().PARTS
  assert list(report['parts']) == [p.name for p in parts], log
  assert report['finished'] and report['dry_run']
  for p in parts:
    entry = report['parts'][p.name]
    assert entry['wall_s'] >= 0 and entry['estimate_s'] >= 0
    assert f'| {p.name} | {entry["status"]} |' in markdown
    # Figures, or an error entry, or a reason to skip: never nothing.
    assert entry.get('figures') or entry.get('error') or entry.get('reason'), (p.name, entry)
  # The injected failure: recorded with its type, message and traceback ...
  failed = report['parts']['electra_small']
  assert failed['status'] == 'error' and failed['error']['type'] == 'RuntimeError'
  assert '--fail_part=electra_small' in failed['error']['message']
  assert 'Traceback' in failed['error']['traceback']
  # ... and the parts after it ran all the same.
  status = {name: e['status'] for name, e in report['parts'].items()}
  assert status == dict(
      environment='ok', bert_base_128='ok', hf_bert_128='ok', bert_base_512='ok',
      hf_bert_512='ok', train_resume='ok', attention_512='ok', electra_small='error',
      deberta_v2_base='ok', xlnet_base='ok', modernbert_base='ok'), (status, log)
  figures = {name: e.get('figures', {}) for name, e in report['parts'].items()}
  for name in ('bert_base_128', 'bert_base_512', 'deberta_v2_base', 'xlnet_base',
               'modernbert_base'):
    assert figures[name]['tokens_per_s'] > 0 and figures[name]['tflops_per_device'] > 0
    assert figures[name]['compiled_peak_gib'] > 0
  for name in ('hf_bert_128', 'hf_bert_512'):
    assert figures[name]['tokens_per_s'] > 0 and figures[name]['ratio_ours_over_hf'] > 0
  assert figures['attention_512']['xla']['tokens_per_s'] > 0
  assert 'skipped' in figures['attention_512']['cudnn']  # No cuDNN on the CPU.
  # Killed after step 7 with checkpoint 6 on disk, resumed from 6: the very same run.
  resume = figures['train_resume']
  assert resume['killed_returncode'] == -9 and resume['checkpoints_after_kill'] == [6]
  assert resume['resumed_from_step'] == 6 and resume['superseded_lines'] == 1
  assert resume['same_logged_steps'] and resume['logged_steps'] == 12
  assert resume['losses_equal'] and resume['loss_max_abs_diff_after_resume'] == 0.0
  assert set(resume['train_max_abs_diff'].values()) == {0.0}
  assert resume['params_equal'] and resume['params_max_abs_diff'] == 0.0
  assert resume['loss_falling'] and resume['ok']
  assert report['environment']['packages']['jax']
  # Wall time per part is printed as it ends.
  for p in parts:
    assert f'== {p.name}: {report["parts"][p.name]["status"]} in ' in proc.stdout


_WITHOUT_TENSORFLOW = '''
import sys
from encoder_jax import main  # The training path.
from encoder_jax.config import schema as config_base
from encoder_jax.run import pretraining
from encoder_jax.config import validation
from encoder_jax.data import preparation
import importlib.util
assert importlib.util.find_spec('tensorflow') is None
assert importlib.util.find_spec('tensorflow_datasets') is None
try:
  import tensorflow_datasets
except ModuleNotFoundError:
  pass
else:
  raise AssertionError('tensorflow_datasets imported')
spec = importlib.util.spec_from_file_location('bert_small', 'configs/bert_small.py')
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
config = module.get_config()
validation.validate(config)
config.data.sources = 'tfds:wikipedia/20230601.en:train'
config.data.prepared_dir = sys.argv[1]
try:
  preparation.prepare(config)
except ImportError as e:
  print('ERROR', e)
else:
  raise AssertionError('a tfds: source prepared without tensorflow-datasets')
assert not any(m.split('.')[0] in ('tensorflow', 'tensorflow_datasets') for m in sys.modules)
print('OK')
'''


def test_training_path_imports_without_tensorflow_and_tfds_sources_say_what_is_missing(
    tmp_path):
  """The package imports, builds and validates a config with tensorflow and
  tensorflow_datasets unimportable (the check's training processes train so); a ``tfds:``
  source then stops with the source and the package to install named."""
  code = _device_check().REFUSE_TENSORFLOW + _WITHOUT_TENSORFLOW
  env = _env()  # The repository's encoder_jax, whether installed or not.
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [ROOT, env.get('PYTHONPATH')]))
  proc = subprocess.run([sys.executable, '-c', code, str(tmp_path / 'prepared')], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert proc.stdout.strip().endswith('OK'), proc.stdout
  error = next(line for line in proc.stdout.splitlines() if line.startswith('ERROR'))
  assert "'tfds:wikipedia/20230601.en:train'" in error, error
  assert 'needs tensorflow-datasets' in error and "pip install 'encoder_jax[tfds]'" in error
