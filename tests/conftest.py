"""Shared test setup: 8 simulated CPU devices, so sharding is exercised without hardware
(under -n, one in every other worker, for the tests marked ``any_device_count``);
the tiny config's prepared data (``prepared_dir``), prepared once per test process."""

import dataclasses
import gc
import os

import pytest

# The workers' heaps are large (JAX's caches of traced and compiled programs, torch,
# TensorFlow): the cyclic collector's full passes took about 3% of their CPU (0.3 s each).
# Collecting the youngest generation less often makes every generation's passes rarer.
gc.set_threshold(10_000, 10, 10)

# Must be set before JAX initialises its backends (first jax import in the session).
# The tests compile far more than they run (about 7 of the 12 minutes a cold suite took on 2
# cores): XLA's CPU backend skips its expensive LLVM passes (the suite: 12m -> 10m), and
# emits fusions with its older loop emitters instead of the MLIR fusion emitters (about
# half the backend compile time of a family row's programs). The HLO is the same;
# code generation differs, so two differently compiled programs may round differently in
# the last bit (bit-exact comparisons in the tests are between runs of one program, as
# resume is).
pytest.register_assert_rewrite('support.device_workers')
from support import device_workers  # pylint: disable=g-import-not-at-top,wrong-import-position

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8 '
                      '--xla_backend_optimization_level=0 '
                      '--xla_llvm_disable_expensive_passes=true '
                      '--xla_cpu_use_fusion_emitters=false')
# 8 simulated devices; 1 in every other pytest-xdist worker (tests/support/device_workers.py). A
# worker inherits the flags the controller's conftest set.
os.environ['XLA_FLAGS'] = device_workers.with_worker_devices(os.environ['XLA_FLAGS'])
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
# One persistent XLA compilation cache for the session (and the training subprocesses the
# tests start): the many short runs compile the same steps again and again. Programs are
# keyed by their HLO and flags, so a hit is the same executable, bit for bit.
# Every program is cached, not only those that took over a second to compile: the resumed
# runs, evaluations and fine-tunes of the tests compile many small identical programs.
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  import tempfile  # pylint: disable=g-import-not-at-top
  os.environ['JAX_COMPILATION_CACHE_DIR'] = os.path.join(tempfile.gettempdir(),
                                                         f'encoder_jax_test_xla_{os.getuid()}')


# The Cloud Storage emulator fixtures (gcs_emulator, bucket, faulty_proxy): one emulator per
# pytest worker, started by the first test that asks for it, shared by every gs:// test.
pytest_plugins = ('support.gcs_emulator', 'support.device_workers')


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
  """The end-to-end (``slow``) tests first, in their order: with ``-n 2`` the long ones are
  shared out while every worker is busy, instead of one worker finishing a long test while
  the other has run out of work.

  And the ``xdist_group`` marks made to group: under ``--dist=loadgroup`` pytest-xdist's
  worker appends ``@<group>`` to each marked test's id for the scheduler to read, by setting
  ``item._nodeid``, which pytest 9 no longer reads (an item's id is ``item._id``). Here the
  id the worker reports carries the suffix again, so the tests that read one shared run
  (tests/support/family.py) run in one worker.

  The tests of a module that use one of its module-scoped fixtures (a training run, a
  converted checkpoint) get a group of their module, unless they have a group: a worker
  builds such a fixture for itself, so two workers sharing the module's tests built it
  twice (the two-process run of tests/run/test_distributed.py: 33 s of setup in each worker)."""
  del config
  for item in items:
    info = getattr(item, '_fixtureinfo', None)
    if info is None or item.get_closest_marker('xdist_group') is not None:
      continue
    if any(defs[-1].scope == 'module' for defs in info.name2fixturedefs.values() if defs):
      item.add_marker(pytest.mark.xdist_group(item.nodeid.split('::')[0]))
  device_workers.mark_groups(items)
  result = yield
  for item in items:
    grouped = vars(item).get('_nodeid')
    if grouped and grouped != item.nodeid and hasattr(item, '_id'):
      item._id = dataclasses.replace(item._id)  # pylint: disable=protected-access
      object.__setattr__(item._id, '_str_cache', grouped)  # pylint: disable=protected-access
  items.sort(key=lambda item: item.get_closest_marker('slow') is None)
  return result


@pytest.fixture
def one_device_env():
  """The environment of a command run in a process of its own on one CPU device (without
  the 8 simulated ones), with the suite's fast-compile XLA flags."""
  flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count')]
  return dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=' '.join(flags))


@pytest.fixture(scope='session')
def prepared_dir(tmp_path_factory):
  """tests/support/tiny_config.py's corpus, prepared once per test process (read-only)."""
  from support import tiny_config  # pylint: disable=g-import-not-at-top
  from encoder_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  d = str(tmp_path_factory.mktemp('prepared'))
  data_lib.load_or_prepare(tiny_config.get_config(f'prepared_dir={d}'))
  return d


@pytest.fixture(scope='session')
def family_root(tmp_path_factory):
  """Where tests/support/family.py's rows prepare their data and train, once per test process."""
  return str(tmp_path_factory.mktemp('family'))
