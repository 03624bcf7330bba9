"""The lean install: every module imports without the optional packages, each place that
needs one stops with a one-line error naming its pip command, and setup.cfg's extras bring
what ``encoder_jax.core.extras`` says they bring.

Absence is simulated honestly: the subprocesses put ``None`` in ``sys.modules`` for every
optional package before importing encoder_jax, which makes ``import x`` raise
``ModuleNotFoundError`` exactly as on a machine without it.
"""

import configparser
import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest

from encoder_jax.core import extras

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ROOT = support.ROOT
OPTIONAL = sorted({name for _, names in extras.EXTRAS.values() for name in names})
BLOCK = f'import sys\nfor _name in {OPTIONAL!r}:\n  sys.modules[_name] = None\n'

# Every module of the package, by file (importing a package to list it would import it first).
MODULES = sorted(
    os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, '.').removesuffix('.__init__')
    for d, _, files in os.walk(os.path.join(ROOT, 'encoder_jax')) for f in files
    if f.endswith('.py'))

_IMPORT_ALL = '''
import importlib, json, sys, traceback
from absl import flags
import jax  # Loads libtpu itself where it is installed (its TPU plugin): not ours to defer.
by_jax = {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}
failed = {}
for name in MODULES:
  before = set(flags.FLAGS)
  try:
    importlib.import_module(name)
  except BaseException:  # pylint: disable=broad-except
    failed[name] = traceback.format_exc(limit=-3)
  for flag in set(flags.FLAGS) - before:  # Each command defines its own --config, --workdir...
    delattr(flags.FLAGS, flag)
loaded = sorted(({m.split('.')[0] for m in sys.modules if sys.modules[m] is not None} - by_jax)
                & set(OPTIONAL))
'''

_LOCAL_RUN = '''
import os, tempfile
from encoder_jax.run import metrics_log
from encoder_jax.storage import client as storage_client
storage_client.configure()
with tempfile.TemporaryDirectory() as d:
  writer = metrics_log.MetricWriter(d, resume_step=0)
  writer.write(1, {'loss': 1.0})
  writer.close()
  events = len(os.listdir(os.path.join(d, 'tensorboard')))
used = sorted(({m.split('.')[0] for m in sys.modules if sys.modules[m] is not None} - by_jax)
              & set(OPTIONAL))
'''

# site -> (extra, code run with every optional package absent; it must raise MissingExtra).
SITES = {
    'fine-tuning scores': ('finetune', '''
from encoder_jax.finetune import scores
scores.macro_f1(np.zeros(2, int), np.zeros(2, int), 2)'''),
    'BBC News corpus': ('bakeoff', '''
from encoder_jax.finetune import probe_data
probe_data.bbc_news()'''),
    'frozen-feature probe': ('bakeoff', '''
from encoder_jax.finetune import probe
probe.frozen({}, {}, None)'''),
    'loss curves': ('plot', '''
from encoder_jax import plot
plot.plot(TMP)'''),
    'bake-off figure': ('bakeoff', '''
from encoder_jax import bakeoff_report
bakeoff_report.plot({'rows': {}}, os.path.join(TMP, 'bakeoff.png'))'''),
    'TensorBoard on gs://': ('gcs', '''
from encoder_jax.run import metrics_log
metrics_log._summary_writer('gs://bucket/run/tensorboard')'''),
    'fine-tuning tfds: rows': ('tfds', '''
import ml_collections
from encoder_jax.finetune import data
data.read_rows('tfds:glue/sst2:train', ml_collections.ConfigDict(dict(tfds_data_dir='')), ())'''),
    'question answering tfds: source': ('tfds', '''
from encoder_jax.finetune.tasks import question_answering
question_answering.read('tfds:squad/v1.1:train')'''),
    'slow Hugging Face tokenizer': ('peers', '''
from encoder_jax.interop import tokenizer
for name in ('vocab.json', 'merges.txt', 'config.json'):
  open(os.path.join(TMP, name), 'w').close()
tokenizer.hf_bundle(TMP)'''),
    'compiling for a TPU slice': ('tpu', '''
from encoder_jax.tpu import programs
programs.topology_devices('v5e:2x2')'''),
    'pytorch_model.bin': ('peers', '''
from encoder_jax.interop import hf
open(os.path.join(TMP, 'pytorch_model.bin'), 'wb').close()
hf.read_state_dict(TMP)'''),
}

_RUN_SITES = '''
import os, tempfile
import numpy as np
from encoder_jax.core import extras
results = {}
for site, (extra, code) in SITES.items():
  TMP = tempfile.mkdtemp()
  try:
    exec(code, dict(np=np, os=os, TMP=TMP))
  except extras.MissingExtra as e:
    results[site] = str(e)
  except BaseException as e:  # pylint: disable=broad-except
    results[site] = f'not MissingExtra: {type(e).__name__}: {e}'
  else:
    results[site] = 'no error'
'''


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, '-c', code, *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300, check=False)


def _json_of(proc: subprocess.CompletedProcess) -> dict:
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def without_optional() -> dict:
  """One process without any optional package: which modules failed to import, and what
  each import site raised."""
  code = (BLOCK + f'MODULES = {MODULES!r}\nOPTIONAL = {OPTIONAL!r}\nSITES = {SITES!r}\n'
          + _IMPORT_ALL + _RUN_SITES
          + 'print(json.dumps(dict(failed=failed, loaded=loaded, sites=results)))')
  return _json_of(_python(code))


def test_every_module_imports_without_any_optional_package(without_optional):
  assert len(MODULES) > 50, MODULES
  assert not without_optional['failed'], '\n'.join(
      f'{name}:\n{trace}' for name, trace in without_optional['failed'].items())


def test_no_module_imports_an_optional_package_until_it_is_used():
  """With every extra installed, importing the package's modules loads none of them: the
  commands start without TensorFlow's or PyTorch's import time."""
  code = (f'MODULES = {MODULES!r}\nOPTIONAL = {OPTIONAL!r}\n' + _IMPORT_ALL + _LOCAL_RUN
          + 'print(json.dumps(dict(failed=sorted(failed), loaded=loaded, used=used, '
          'events=events)))')
  result = _json_of(_python(code))
  assert not result['failed'], result['failed']
  assert result['loaded'] == [], f'imported at module level: {result["loaded"]}'
  # Nor does a run on local disk: tensorboardX's writer (which would import torch to accept
  # its tensors) and the storage setup (gcsfs, imported at the first gs:// use).
  assert result['events'] == 1
  assert result['used'] == [], f'imported by a run on local disk: {result["used"]}'


@pytest.mark.parametrize('site', sorted(SITES))
def test_an_import_site_without_its_extra_names_the_pip_command(site, without_optional):
  extra = SITES[site][0]
  message = without_optional['sites'][site]
  assert message.endswith(f"pip install 'encoder_jax[{extra}]'"), message
  assert '\n' not in message, message
  assert 'is not installed' in message, message


@pytest.mark.parametrize('extra, sources', [
    ('tfds', 'tfds:wikipedia/20230601.en:train'),
    ('gcs', 'text:gs://bucket/corpus/*.txt'),
])
def test_a_command_without_its_extra_prints_one_line_with_the_pip_command(
    extra, sources, tmp_path):
  code = BLOCK + 'import runpy\nsys.argv[0] = "encoder_jax.main"\n' + (
      'runpy.run_module("encoder_jax.main", run_name="__main__", alter_sys=True)')
  proc = _python(code, '--config=configs/crammed_small.py', f'--workdir={tmp_path / "run"}',
                 f'--config.data.sources={sources}')
  errors = [line for line in proc.stderr.splitlines() if line.startswith('error: ')]
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert len(errors) == 1, proc.stderr[-3000:]
  assert repr(sources) in errors[0], errors[0]
  assert errors[0].endswith(f"pip install 'encoder_jax[{extra}]'"), errors[0]
  assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]


def _requirement_name(line: str) -> str:
  return re.split(r'[\s\[<>=!~;]', line.strip(), maxsplit=1)[0].lower().replace('_', '-')


def _setup_cfg_extras() -> tuple[set[str], dict[str, set[str]]]:
  """install_requires, and each extra's requirements with self-references expanded."""
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(ROOT, 'setup.cfg'))
  lines = lambda text: [l for l in text.splitlines() if l.strip()]  # noqa: E731
  base = {_requirement_name(l) for l in lines(cfg['options']['install_requires'])}
  raw = {name: lines(text) for name, text in cfg['options.extras_require'].items()}

  def expand(name: str) -> set[str]:
    out = set()
    for line in raw[name]:
      self_ref = re.fullmatch(r'\s*encoder[-_]jax\[([\w,\s-]+)\]\s*', line)
      if self_ref:
        for other in self_ref.group(1).split(','):
          out |= expand(other.strip())
      else:
        out.add(_requirement_name(line))
    return out

  return base, {name: expand(name) for name in raw}


def test_setup_cfg_extras_bring_what_extras_says_and_test_brings_them_all():
  base, extras_cfg = _setup_cfg_extras()
  providers = importlib.metadata.packages_distributions()
  for extra, (_, modules) in extras.EXTRAS.items():
    assert extra in extras_cfg, f'setup.cfg has no extra {extra!r}'
    for module in modules:
      dists = {d.lower().replace('_', '-') for d in providers.get(module, [])}
      assert dists, f'{module} is not installed here (the test extra should bring it)'
      assert dists & extras_cfg[extra], f'extra {extra!r} brings none of {dists} ({module})'
      assert not dists & base, f'{module} ({dists}) is in install_requires'
    assert extras_cfg[extra] <= extras_cfg['test'], f'test lacks the {extra!r} extra'
  with open(os.path.join(ROOT, 'setup.cfg'), encoding='utf-8') as f:
    assert re.search(r'^\s*torch==[\d.]+\s*$', f.read(), re.M), 'torch must be pinned exactly'


def test_require_names_the_extra_and_refuses_a_package_the_extra_does_not_bring():
  with pytest.raises(ValueError, match="extra 'plot' does not bring 'json'"):
    extras.require('json', extra='plot', what='x')
  with pytest.raises(ValueError, match="unknown extra 'plots'"):
    extras.pip_command('plots')
  lazy = extras.lazy('matplotlib.figure', extra='plot', what='x')
  assert 'matplotlib.figure' in repr(lazy)


def test_the_tpu_vm_launcher_installs_what_a_bucket_run_needs():
  """launch/tpu_vm.sh runs on every worker of a pod with a gs:// workdir and, for the shipped
  full-size configs, a tfds: corpus: its install brings libtpu, the Cloud Storage clients
  and tensorflow-datasets, not libtpu alone."""
  with open(os.path.join(ROOT, 'launch', 'tpu_vm.sh'), encoding='utf-8') as f:
    installs = re.findall(r"pip install [^\n]*-e '\.\[([\w,]+)\]'", f.read())
  assert len(installs) == 1, installs
  assert {'tpu', 'gcs', 'tfds'} <= set(installs[0].split(',')), installs
