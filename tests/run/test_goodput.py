"""Goodput on a pod: the persistent compilation cache of every run, and the profiler window."""

import logging
import os

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache

from encoder_jax.run import goodput
from encoder_jax.config import schema as config_base
from encoder_jax.run import console as console_lib
from encoder_jax.run import pretraining as train
from encoder_jax.config import validation
from encoder_jax.run import workdir as workdir_lib

import support
from support import tiny_config

ROOT = support.ROOT

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def _config(prepared_dir, **train_overrides):
  """The tiny run in one phase, no evaluation: 4 steps."""
  c = tiny_config.get_config(f'prepared_dir={prepared_dir}')
  c.train.update(num_steps=4, seq_lens=(32,), max_predictions=(5,), phase_fractions=(1.0,),
                 eval_every_steps=0, log_every_steps=2)
  c.train.update(**train_overrides)
  return c


class _CacheHits(logging.Handler):
  """The programs JAX found in its persistent compilation cache while active."""

  def __init__(self):
    super().__init__(logging.DEBUG)
    self.names = []
    self.logger = logging.getLogger('jax._src.compiler')

  def emit(self, record):
    if record.getMessage().startswith('Persistent compilation cache hit for'):
      self.names.append(record.args[0])

  def __enter__(self):
    self.level = self.logger.level
    self.logger.setLevel(logging.DEBUG)
    self.logger.addHandler(self)
    return self

  def __exit__(self, *exc):
    self.logger.removeHandler(self)
    self.logger.setLevel(self.level)


def _entries(directory):
  return sorted(p.name for p in directory.glob('*-cache')) if directory.is_dir() else []


def _compile_new(x: float):
  """Compiles (and runs) a program no other test compiles."""
  return jax.jit(lambda v: v * x + 0.3141)(jnp.arange(3.0)).block_until_ready()


@pytest.fixture
def jax_config():
  """Sets JAX config values for one test; the suite's are back (and the cache reopened)
  after it."""
  saved = {}

  def update(name, value):
    saved.setdefault(name, getattr(jax.config, name))
    jax.config.update(name, value)

  yield update
  for name, value in saved.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()  # JAX reopens the suite's cache at the next compile.


@pytest.mark.slow  # A training run, profiled.
def test_a_run_caches_its_programs_in_its_workdir_and_traces_its_window(
    prepared_dir, tmp_path, capsys, jax_config):
  jax_config('jax_compilation_cache_dir', None)  # No cache from the environment: 'auto'.
  workdir = tmp_path / 'run'
  train.train_and_evaluate(_config(prepared_dir, profile_first_step=2, profile_steps=2),
                           str(workdir))
  out = capsys.readouterr().out
  cache = workdir / goodput.COMPILATION_CACHE
  assert f'compiled programs cached in {cache}' in out
  assert _entries(cache), 'the run wrote no compiled program into its workdir'
  assert jax.config.jax_compilation_cache_dir is None  # The process's own setting, back.
  lines = [ln for ln in out.splitlines() if ln.startswith('profiled steps')]
  assert len(lines) == 1 and lines[0].startswith(
      f'profiled steps 2-3: trace in {workdir / "profile" / "plugins" / "profile"}'), out
  assert f'--logdir={workdir / "profile"}' in lines[0]
  traces = list((workdir / 'profile' / 'plugins' / 'profile').glob('*/*.xplane.pb'))
  assert len(traces) == 1 and str(traces[0].parent) in lines[0]
  assert traces[0].stat().st_size > 1000


def test_cache_setting_precedence_off_reuse_and_restore(tmp_path, monkeypatch, jax_config):
  environment = jax.config.jax_compilation_cache_dir  # conftest: JAX_COMPILATION_CACHE_DIR.
  assert environment
  workdir = str(tmp_path / 'w')
  assert goodput.compilation_cache_dir('auto', workdir) == environment
  assert goodput.compilation_cache_dir('', workdir) is None
  assert goodput.compilation_cache_dir('gs://b/x', workdir) == 'gs://b/x'
  monkeypatch.chdir(tmp_path)
  assert goodput.compilation_cache_dir('rel', workdir) == str(tmp_path / 'rel')
  jax_config('jax_persistent_cache_min_compile_time_secs', 0.0)  # Cache even tiny programs.
  mine = tmp_path / 'mine'
  with goodput.compilation_cache(str(mine), workdir) as used:
    assert used == str(mine)
    with goodput.compilation_cache('', workdir) as off:
      assert off is None and goodput.cache_in_use() is None  # pylint: disable=protected-access
      _compile_new(1.75)
    assert _entries(mine) == []  # Off: nothing written.
    _compile_new(2.75)
    assert len(_entries(mine)) == 1  # On again, in the configured directory.
    with _CacheHits() as hits:  # The same program again, as a restarted process compiles it.
      _compile_new(2.75)
    assert len(hits.names) == 1
  assert goodput.cache_in_use() == environment  # pylint: disable=protected-access
  # Without a cache from the environment, 'auto' is the workdir's (local or gs://).
  jax_config('jax_compilation_cache_dir', None)
  assert goodput.compilation_cache_dir('auto', workdir) == os.path.join(workdir,
                                                                      goodput.COMPILATION_CACHE)
  assert goodput.compilation_cache_dir('auto', 'gs://b/run') == 'gs://b/run/compilation_cache'
  assert goodput.compilation_cache_dir('auto', None) is None
  jax_config('jax_enable_compilation_cache', False)  # JAX_ENABLE_COMPILATION_CACHE=false
  assert goodput.compilation_cache_dir('auto', workdir) is None


class _Lines(console_lib.Console):
  def __init__(self):
    super().__init__()
    self.lines = []

  def say(self, text):
    self.lines.append(text)


def test_window_skips_the_compile_and_stops_when_the_loop_ends_early(tmp_path):
  step = jax.jit(lambda v: v + 1)
  console = _Lines()
  window = goodput.ProfileWindow(first=1, count=3, workdir=str(tmp_path), console=console)
  window.before(1, compiled=False)  # Step 1 compiles the program: not traced.
  x = step(jnp.zeros(2))
  assert not window.after(1, x) and window.start_step is None
  window.before(2, compiled=True)
  assert window.start_step == 2
  x = step(x)
  assert not window.after(2, x)
  window.stop(2)  # The loop ended (preempted, failed) inside the window.
  assert len(console.lines) == 1 and console.lines[0].startswith('profiled steps 2-2: ')
  assert list((tmp_path / 'profile').rglob('*.xplane.pb'))
  window.before(3, compiled=True)  # One trace per session.
  assert window.start_step is None
  # A session that starts after the window's first step (a resume) traces nothing.
  late = goodput.ProfileWindow(first=5, count=2, workdir=str(tmp_path / 'late'), console=console)
  late.before(6, compiled=True)
  assert late.start_step is None and not (tmp_path / 'late').exists()


def test_window_and_cache_fields_are_checked():
  c = config_base.base_config()
  c.train.update(num_steps=20, profile_steps=5, profile_first_step=17)
  c.optim.warmup_steps = 2
  assert any('profile_first_step=17, profile_steps=5' in p for p in validation.problems(c))
  c.train.profile_first_step = 16
  assert validation.problems(c) == []
  c.train.update(profile_steps=-1, profile_first_step=0, compilation_cache_dir=None)
  found = validation.problems(c)
  assert {p.split('=')[0] for p in found} == {
      'config.train.profile_steps', 'config.train.profile_first_step',
      'config.train.compilation_cache_dir'}, found


def test_a_resume_may_change_the_cache_and_the_window(tmp_path):
  c = config_base.base_config()
  workdir_lib.write_config(str(tmp_path), c)
  c.train.update(compilation_cache_dir='', profile_steps=3, profile_first_step=50)
  assert sorted(str(x) for x in workdir_lib.check_resume_config(str(tmp_path), c)) == [
      "train.compilation_cache_dir: 'auto' -> ''", 'train.profile_first_step: 10 -> 50',
      'train.profile_steps: 0 -> 3']


def test_on_a_bucket_the_cache_and_the_trace_are_written_there(bucket, jax_config):
  from etils import epath  # pylint: disable=g-import-not-at-top
  jax_config('jax_persistent_cache_min_compile_time_secs', 0.0)
  with goodput.compilation_cache(f'{bucket}/xla', None) as used:
    assert used == f'{bucket}/xla'
    _compile_new(3.75)
  assert [p.name for p in epath.Path(f'{bucket}/xla').glob('*-cache')]
  console = _Lines()
  window = goodput.ProfileWindow(first=1, count=1, workdir=f'{bucket}/run', console=console)
  window.before(1, compiled=True)
  assert window.after(1, _compile_new(3.75))
  traces = list(epath.Path(f'{bucket}/run/profile/plugins/profile').glob('*/*.xplane.pb'))
  assert len(traces) == 1 and str(traces[0].parent) in console.lines[0], console.lines
  assert not os.path.exists(window.log_dir)  # The local copy is gone.
