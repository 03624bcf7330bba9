"""Under ``pytest -n N`` with ``ENCODER_JAX_TEST_ONE_DEVICE_WORKERS=1``: every other worker
simulates one CPU device instead of eight, and runs only the tests that are marked as not
depending on the device count (off by default: see ``ENABLED``).

A pytest plugin (``tests/conftest.py`` registers it). The sharding tests need the 8
simulated devices (a 2x2x2 mesh), but a run on 8 devices compiles its programs through
the SPMD partitioner and runs every step as 8 threads of work on 2 cores: the same
fine-tuning run takes about 40% less CPU on one device. A test marked
``any_device_count`` (by its module's ``pytestmark``) passes on one device or eight and
checks nothing that depends on how many there are; the even workers (gw0, gw2, ...) have
8 devices and run every test, the odd ones 1 device and only the marked tests.
``--dist=loadgroup`` (setup.cfg) shares them out with :class:`DeviceCountScheduling`.
"""

from __future__ import annotations

import os
import re

import pytest

MANY = 8
MARK = 'any_device_count'
# In the id the scheduler reads (in an xdist_group name): a unit of work that a one-device
# worker may take.
_GROUP = 'anydevices-'


# Off by default: the whole suite with it on was slower on a busy machine (2026-12-01) and
# no faster on a quiet one (2026-12-07: 8m40s, against 8m33s-8m57s without; a one-device
# worker's programs are not the 8-device worker's, so the persistent compilation cache serves
# fewer of them); on for measuring it again.
ENABLED = os.environ.get('ENCODER_JAX_TEST_ONE_DEVICE_WORKERS', '') == '1'


def devices_of(worker: str | None) -> int:
  """The simulated CPU devices of a worker ('gw0', 'gw1', ...; None or '' outside -n)."""
  if ENABLED and worker and worker.startswith('gw') and worker[2:].isdigit() and int(worker[2:]) % 2:
    return 1
  return MANY


def worker_devices() -> int:
  return devices_of(os.environ.get('PYTEST_XDIST_WORKER'))


def with_worker_devices(xla_flags: str) -> str:
  """``xla_flags`` with this worker's device count for the simulated CPU devices (set
  where it is set, unchanged outside -n)."""
  worker = os.environ.get('PYTEST_XDIST_WORKER')
  if not worker:
    return xla_flags
  return re.sub(r'--xla_force_host_platform_device_count=\d+',
                f'--xla_force_host_platform_device_count={devices_of(worker)}', xla_flags)


def pytest_configure(config):
  config.addinivalue_line(
      'markers', f'{MARK}: passes on one simulated device as on eight, and checks nothing '
      'that depends on the count (under -n a one-device worker may run it: '
      'tests/support/device_workers.py)')


def mark_groups(items) -> None:
  """Before pytest-xdist reads the groups: each marked test gets a group of its own that
  says so, joined with any group it has (xdist joins a test's group names, and a test's
  group is its unit of work). A group holding one test that is not marked is left for the
  8-device workers whole: the tests of a group share a worker. Nothing while off: a group
  of its own would split the tests of a module-scoped fixture (a training run, a compile)
  over the workers, and each would build the fixture again."""
  if not ENABLED:
    return
  groups_of = lambda item: {str(m.args[0] if m.args else m.kwargs.get('name', 'default'))
                            for m in item.iter_markers('xdist_group')}
  needs_many = {g for item in items if item.get_closest_marker(MARK) is None
                for g in groups_of(item)}
  for item in items:
    if item.get_closest_marker(MARK) is not None and not groups_of(item) & needs_many:
      # Its own unit of work ('[', ']' and '@' would end a group name in xdist's split).
      item.add_marker(pytest.mark.xdist_group(_GROUP + re.sub(r'[\[\]@]', '_', item.nodeid)))


def pytest_xdist_make_scheduler(config, log):
  if not ENABLED or config.getvalue('dist') != 'loadgroup':
    return None
  from xdist.scheduler import LoadGroupScheduling  # pylint: disable=g-import-not-at-top

  class DeviceCountScheduling(LoadGroupScheduling):
    """LoadGroupScheduling that gives a one-device worker only the units it may run, and
    an 8-device worker the units only it may run before the others."""

    @staticmethod
    def _many(node) -> bool:
      return devices_of(node.gateway.id) > 1

    def _runnable(self, node) -> list[str]:
      units = list(self.workqueue)
      if not self._many(node):
        return [s for s in units if _GROUP in s]
      return [s for s in units if _GROUP not in s] + [s for s in units if _GROUP in s]

    def _assign_work_unit(self, node) -> None:
      units = self._runnable(node)
      if units:
        self.workqueue.move_to_end(units[0], last=False)
        super()._assign_work_unit(node)

    def _reschedule(self, node) -> None:
      if node.shutting_down:
        return
      if not self._runnable(node):
        node.shutdown()
        return
      if self._pending_of(self.assigned_work[node]) > 2:
        return
      self._assign_work_unit(node)

  return DeviceCountScheduling(config, log)
