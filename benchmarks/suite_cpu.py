"""The test suite's CPU, test by test: a pytest plugin that records each test's CPU, and a
report of where it goes (the suite's time goal is a CPU budget on 2 cores).

  PYTHONPATH=benchmarks python -m pytest -n 2 tests -p suite_cpu     # records, per worker
  python benchmarks/suite_cpu.py                                     # the report

A test's CPU is its worker's (every thread) plus that of the processes it started and
waited for, from setup to teardown (``getrusage``), and the seconds its worker spent tracing,
lowering and compiling programs (JAX's own compile events; a persistent-cache hit is counted
apart); ``SUITE_CPU_DIR`` (default /tmp/suite_cpu) holds one JSON line per test, one file per
worker. Start from an empty
directory (and an empty XLA compilation cache, for a cold suite).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import resource
import time

import pytest

DIR = os.environ.get('SUITE_CPU_DIR', '/tmp/suite_cpu')
_out = None

# JAX's compile events (jax/_src/dispatch.py, compiler.py), summed per test by short name.
_EVENTS = {'/jax/core/compile/jaxpr_trace_duration': 'trace_s',
           '/jax/core/compile/jaxpr_to_mlir_module_duration': 'lower_s',
           '/jax/core/compile/backend_compile_duration': 'compile_s',
           '/jax/compilation_cache/cache_retrieval_time_sec': 'cache_read_s'}
_phases = collections.Counter()
_outcomes: dict[str, str] = {}


def _devices() -> int:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.device_count()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """A test's outcome: 'failed' if any of its phases failed, 'skipped' if it was skipped."""
  del call
  report = (yield).get_result()
  if report.failed or (report.skipped and _outcomes.get(item.nodeid) != 'failed'):
    _outcomes[item.nodeid] = report.outcome


def _on_event(event: str, seconds: float, **_) -> None:
  name = _EVENTS.get(event)
  if name:
    _phases[name] += seconds
    if name == 'compile_s':
      _phases['programs'] += 1


def _listen() -> None:
  import jax  # pylint: disable=g-import-not-at-top  (the worker imports it anyway)
  jax.monitoring.register_event_duration_secs_listener(_on_event)


def _cpu() -> tuple[float, float]:
  own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                   resource.RUSAGE_CHILDREN))
  return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """Setup, call and teardown of one test: its wall time and CPU."""
  del nextitem
  global _out
  if _out is None:
    os.makedirs(DIR, exist_ok=True)
    worker = os.environ.get('PYTEST_XDIST_WORKER', 'main')
    _out = open(os.path.join(DIR, f'{worker}.jsonl'), 'a', encoding='utf-8')
    _listen()
  _phases.clear()
  (own0, child0), wall0 = _cpu(), time.perf_counter()
  yield
  (own1, child1), wall1 = _cpu(), time.perf_counter()
  _out.write(json.dumps(dict(id=item.nodeid, wall_s=wall1 - wall0, own_s=own1 - own0,
                             children_s=child1 - child0, **_phases,
                             outcome=_outcomes.pop(item.nodeid, 'passed'),
                             worker_devices=_devices())) + '\n')
  _out.flush()


def report(directory: str, files: int, tests: int) -> list[str]:
  rows = [json.loads(line) for path in sorted(glob.glob(os.path.join(directory, '*.jsonl')))
          for line in open(path, encoding='utf-8')]
  if not rows:
    raise SystemExit(f'{directory} holds no records: run the suite with -p suite_cpu first')
  cpu = lambda r: r['own_s'] + r['children_s']
  total = sum(map(cpu, rows))
  lines = [f'{len(rows)} tests: {total / 60:.1f} CPU-minutes ('
           f'{sum(r["children_s"] for r in rows) / 60:.1f} in the processes they started), '
           f'{sum(r["wall_s"] for r in rows) / 60:.1f} minutes of test time in all workers']
  bands = [(0, 0.5), (0.5, 2), (2, 5), (5, 10), (10, 20), (20, float('inf'))]
  for lo, hi in bands:
    band = [cpu(r) for r in rows if lo <= cpu(r) < hi]
    lines.append(f'  {lo:>4}-{hi:<4} s: {len(band):4d} tests, {sum(band) / 60:5.1f} CPU-minutes')
  by_file = collections.Counter()
  for r in rows:
    by_file[r['id'].split('::')[0]] += cpu(r)
  lines.append('CPU seconds by file:')
  lines += [f'  {s:7.1f}  {f}' for f, s in by_file.most_common(files)]
  phases = {k: sum(r.get(k, 0) for r in rows) for k in ('trace_s', 'lower_s', 'compile_s',
                                                         'cache_read_s', 'programs')}
  lines.append(f'In the workers: {phases["trace_s"] / 60:.1f} CPU-minutes tracing, '
               f'{phases["lower_s"] / 60:.1f} lowering, {phases["compile_s"] / 60:.1f} '
               f'compiling {phases["programs"]:.0f} programs (of which reading the '
               f'persistent cache: {phases["cache_read_s"] / 60:.1f})')
  lines.append('CPU seconds by test (of which in started processes), wall seconds:')
  lines += [f'  {cpu(r):7.1f} ({r["children_s"]:5.1f}) {r["wall_s"]:6.1f}  {r["id"]}'
            for r in sorted(rows, key=cpu, reverse=True)[:tests]]
  return lines


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('directory', nargs='?', default=DIR)
  ap.add_argument('--files', type=int, default=20)
  ap.add_argument('--tests', type=int, default=30)
  args = ap.parse_args()
  print('\n'.join(report(args.directory, args.files, args.tests)))


if __name__ == '__main__':
  main()
