"""The layers of the package hold: the import-linter contracts in ``.importlinter`` (tools >
CLI plumbing > API > Hugging Face interop > loading > training engine > objectives / data >
models, and the registries inside ``models``) and no import cycle anywhere, function-level
imports included."""

import os
import subprocess
import sys

import grimp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_linter_contracts_are_kept():
  lint = os.path.join(os.path.dirname(sys.executable), 'lint-imports')
  out = subprocess.run([lint, '--config', os.path.join(ROOT, '.importlinter')], cwd=ROOT,
                       capture_output=True, text=True, check=False,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
  assert 'Contracts: 3 kept, 0 broken.' in out.stdout, out.stdout[-2000:]


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


def test_no_import_cycles():
  graph = grimp.build_graph('encoder_jax', include_external_packages=False)
  edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
  assert _cycles(edges) == []
  # The check itself finds a cycle when there is one.
  assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
