"""The layers of the package hold: the import-linter contracts in ``.importlinter`` (tools >
CLI plumbing > API > Hugging Face interop > loading > training engine > objectives / data >
models, and the registries inside ``models``) and no import cycle anywhere, function-level
imports and imports by name (``importlib.import_module('encoder_jax...')``,
``__import__('encoder_jax...')``) included; and no function is longer than 80 lines."""

import ast
import contextlib
import glob
import io
import os
import sys

import grimp
import pytest

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ROOT = support.ROOT
PACKAGE = 'encoder_jax'


def string_imports(source: str) -> list[tuple[int, str]]:
  """(line, module) of every import of an ``encoder_jax`` module by name in ``source``:
  ``importlib.import_module('encoder_jax...')``, ``import_module(...)``,
  ``__import__('encoder_jax...')``. Static imports do not show them, so neither do
  import-linter and grimp without this."""
  out = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Call) or not node.args:
      continue
    func, name = node.func, node.args[0]
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', None)
    if (called in ('import_module', '__import__') and isinstance(name, ast.Constant)
        and isinstance(name.value, str)
        and (name.value == PACKAGE or name.value.startswith(PACKAGE + '.'))):
      out.append((node.lineno, name.value))
  return out


def _module_files():
  for path in sorted(glob.glob(os.path.join(ROOT, PACKAGE, '**', '*.py'), recursive=True)):
    module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
    yield module.removesuffix('.__init__'), path


def add_string_imports(graph, sources=None) -> list[tuple[str, str]]:
  """Adds the by-name imports of every module (or of ``sources``: module -> source) to a
  grimp graph; returns them as (importer, imported)."""
  if sources is None:
    sources = {m: open(p, encoding='utf-8').read() for m, p in _module_files()}
  edges = []
  for module, source in sources.items():
    for line, imported in string_imports(source):
      graph.add_import(importer=module, imported=imported, line_number=line,
                       line_contents=f'import_module({imported!r})')
      edges.append((module, imported))
  return edges


def _lint(extra_sources=None) -> tuple[bool, str]:
  """import-linter's contracts over the graph with the by-name imports added (and those of
  ``extra_sources``, module -> source, for the self-check)."""
  from importlinter import configuration  # pylint: disable=g-import-not-at-top
  from importlinter.application import use_cases  # pylint: disable=g-import-not-at-top
  from importlinter.application.app_config import settings  # pylint: disable=g-import-not-at-top
  configuration.configure()
  plain = settings.GRAPH_BUILDER

  class WithStringImports(type(plain)):
    def build(self, *args, **kwargs):
      graph = super().build(*args, **kwargs)
      add_string_imports(graph)
      if extra_sources:
        add_string_imports(graph, extra_sources)
      return graph

  settings.configure(GRAPH_BUILDER=WithStringImports())
  out = io.StringIO()
  try:
    with contextlib.redirect_stdout(out):
      ok = use_cases.lint_imports(config_filename=os.path.join(ROOT, '.importlinter'),
                                  cache_dir=None, no_logo=True)
  finally:
    settings.configure(GRAPH_BUILDER=plain)
  return ok, out.getvalue()


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
  for v in sorted(edges):
    if v not in index:
      visit(v)
  return out


def _edges(graph) -> dict[str, set[str]]:
  return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def test_no_import_cycles():
  graph = grimp.build_graph(PACKAGE, include_external_packages=False)
  add_string_imports(graph)
  assert _cycles(_edges(graph)) == []
  # The check itself finds a cycle when there is one.
  assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]


SNIPPET = """
import importlib

def later():
  registry = importlib.import_module('encoder_jax.models.registry')
  other = __import__('encoder_jax.run.pretraining')
  return importlib.import_module('json'), registry, other
"""


def test_imports_by_name_are_seen():
  """The scan finds by-name imports, and the cycle and the layer checks then see them: the
  cycle models/config.py once hid (config -> registry -> every kind -> config) is found,
  and a model module importing the training engine by name breaks the contract."""
  assert string_imports(SNIPPET) == [(5, 'encoder_jax.models.registry'), (6, 'encoder_jax.run.pretraining')]
  graph = grimp.build_graph(PACKAGE, include_external_packages=False)
  add_string_imports(graph, {'encoder_jax.models.config': SNIPPET})
  assert any({'encoder_jax.models.config', 'encoder_jax.models.registry'} <= set(c)
             for c in _cycles(_edges(graph)))
  ok, report = _lint({'encoder_jax.models.layers': SNIPPET})
  assert not ok and 'encoder_jax.models.layers -> encoder_jax.run.pretraining' in report, report[-3000:]


def test_contracts_hold_with_imports_by_name():
  ok, report = _lint()
  assert ok, report[-4000:]


MAX_FUNCTION_LINES = 80


def _long_functions(source: str, path: str) -> list[str]:
  """``path:line name (N lines)`` of every function over the limit, nested ones included."""
  return [f'{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)'
          for node in ast.walk(ast.parse(source))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_is_longer_than_80_lines():
  # The check itself counts nested functions, from the def line to the last.
  body = '\n'.join(['    x = 1'] * 80)
  assert _long_functions(f'def outer():\n  def inner():\n{body}\n  return inner\n', 'f.py') == [
      'f.py:1 outer (83 lines)', 'f.py:2 inner (81 lines)']
  offenders = []
  for folder in (PACKAGE, 'benchmarks', 'configs', 'launch'):
    for path in sorted(glob.glob(os.path.join(ROOT, folder, '**', '*.py'), recursive=True)):
      with open(path, encoding='utf-8') as f:
        offenders += _long_functions(f.read(), os.path.relpath(path, ROOT))
  assert offenders == [], 'functions over 80 lines (split them):\n' + '\n'.join(offenders)
