"""The persistent compilation cache of every run (``run/compilation_cache.py``), and the
end-to-end checks of the cache with the profiler window (the window alone:
tests/run/test_profiler.py)."""

import logging
import os

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from encoder_jax.api import pretrain

from encoder_jax.run import compilation_cache
from encoder_jax.run import profiler
from encoder_jax.config import schema as config_base
from encoder_jax.config import validation
from encoder_jax.run import workdir as workdir_lib

import support
from support import consoles
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
  jax_cache.reset_cache()  # JAX reopens the suite's cache at the next compile.


@pytest.mark.slow  # A training run, profiled.
def test_a_run_caches_its_programs_in_its_workdir_and_traces_its_window(
    prepared_dir, tmp_path, capsys, jax_config):
  jax_config('jax_compilation_cache_dir', None)  # No cache from the environment: 'auto'.
  workdir = tmp_path / 'run'
  pretrain.run(_config(prepared_dir, profile_first_step=2, profile_steps=2),
                           str(workdir))
  out = capsys.readouterr().out
  cache = workdir / compilation_cache.SUBDIR
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
  assert compilation_cache.directory('auto', workdir) == environment
  assert compilation_cache.directory('', workdir) is None
  assert compilation_cache.directory('gs://b/x', workdir) == 'gs://b/x'
  monkeypatch.chdir(tmp_path)
  assert compilation_cache.directory('rel', workdir) == str(tmp_path / 'rel')
  jax_config('jax_persistent_cache_min_compile_time_secs', 0.0)  # Cache even tiny programs.
  mine = tmp_path / 'mine'
  with compilation_cache.use(str(mine), workdir) as used:
    assert used == str(mine)
    with compilation_cache.use('', workdir) as off:
      assert off is None and compilation_cache.in_use() is None  # pylint: disable=protected-access
      _compile_new(1.75)
    assert _entries(mine) == []  # Off: nothing written.
    _compile_new(2.75)
    assert len(_entries(mine)) == 1  # On again, in the configured directory.
    with _CacheHits() as hits:  # The same program again, as a restarted process compiles it.
      _compile_new(2.75)
    assert len(hits.names) == 1
  assert compilation_cache.in_use() == environment  # pylint: disable=protected-access
  # Without a cache from the environment, 'auto' is the workdir's (local or gs://).
  jax_config('jax_compilation_cache_dir', None)
  assert compilation_cache.directory('auto', workdir) == os.path.join(workdir,
                                                                      compilation_cache.SUBDIR)
  assert compilation_cache.directory('auto', 'gs://b/run') == 'gs://b/run/compilation_cache'
  assert compilation_cache.directory('auto', None) is None
  jax_config('jax_enable_compilation_cache', False)  # JAX_ENABLE_COMPILATION_CACHE=false
  assert compilation_cache.directory('auto', workdir) is None


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
  with compilation_cache.use(f'{bucket}/xla', None) as used:
    assert used == f'{bucket}/xla'
    _compile_new(3.75)
  assert [p.name for p in epath.Path(f'{bucket}/xla').glob('*-cache')]
  console = consoles.Lines()
  window = profiler.ProfileWindow(first=1, count=1, workdir=f'{bucket}/run', console=console)
  window.before(1, compiled=True)
  assert window.after(1, _compile_new(3.75))
  traces = list(epath.Path(f'{bucket}/run/profile/plugins/profile').glob('*/*.xplane.pb'))
  assert len(traces) == 1 and str(traces[0].parent) in console.lines[0], console.lines
  assert not os.path.exists(window.log_dir)  # The local copy is gone.
