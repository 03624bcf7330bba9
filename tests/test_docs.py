"""The README and docs/ say only what is true of the tree.

Every relative link in README.md, docs/**/*.md, data/README.md and launch/README.md
resolves to a file or directory (and a ``#anchor`` into a Markdown file to one of its
headings), and every
``python -m encoder_jax...`` command they quote names a module that exists and flags that
module defines: its ``flags.DEFINE_*`` / ``config_flags.DEFINE_config_file`` calls, those
of the ``encoder_jax`` helpers it calls (``cli.define_source_flags()``), those of the
modules it imports, and absl's own; a ``--config.a.b=...`` override names a field of the
config file the command passes (or of the default schema). ``python benchmarks/X.py`` and
``python launch/X.py`` commands name scripts that exist and their argparse options. Flags
are read from the source with ``ast``: nothing is run, so the check takes seconds.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import pathlib
import re

import pytest

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

REPO = pathlib.Path(support.ROOT)
README_MAX_LINES = 250
TEST_COMMAND = "pip install -e '.[test]' && python -m pytest -n 2 tests"
DOCS = ([REPO / 'README.md', REPO / 'data' / 'README.md', REPO / 'launch' / 'README.md']
        + sorted((REPO / 'docs').rglob('*.md')))

# Flags absl itself defines for every program (absl.app and absl.logging).
ABSL_FLAGS = frozenset({
    'help', 'helpshort', 'helpfull', 'helpxml', 'flagfile', 'undefok', 'verbosity', 'v',
    'logtostderr', 'alsologtostderr', 'log_dir', 'stderrthreshold', 'showprefixforinfo',
    'only_check_args', 'pdb', 'pdb_post_mortem', 'run_with_pdb', 'run_with_profiling',
    'profile_file', 'use_cprofile_for_profiling', 'logger_levels'})
# The schema a --config.X override is checked against when the command names no config file.
DEFAULT_SCHEMA = {'encoder_jax.finetune': ('encoder_jax.finetune.config', 'base_config')}
FALLBACK_SCHEMA = ('encoder_jax.config.schema', 'base_config')

_FENCE = re.compile(r'^\s*```.*?^\s*```[^\n]*$', re.M | re.S)
_INLINE = re.compile(r'`([^`\n]+)`')
_LINK = re.compile(r'\[[^\]\n]*\]\(([^)\s]+)\)')
_HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$', re.M)
_COMMAND = re.compile(r'python3? -m (encoder_jax(?:\.\w+)*)')
_FLAG = re.compile(r'(?:^|[\s\[])--([A-Za-z][\w.]*)')
_CONFIG_VALUE = re.compile(r'(?:^|\s)--config=(\S+)')
_SCRIPT = re.compile(r'python3? ((?:benchmarks|launch)/\w+\.py)')
_SNIPPET = re.compile(r'from (encoder_jax[\w.]*) import (\w+); print\(\2\.(\w+)\(')


# ---- Markdown ----

def _code_blocks(text: str) -> list[str]:
  """Fenced blocks and blocks indented by 4 spaces, each as one string."""
  blocks = [m.group(0) for m in _FENCE.finditer(text)]
  current: list[str] = []
  for line in _FENCE.sub('', text).splitlines():
    if line.startswith('    ') or (current and not line.strip()):
      current.append(line)
    elif current:
      blocks.append('\n'.join(current))
      current = []
  return blocks + ['\n'.join(current)] if current else blocks


def _prose(text: str) -> str:
  """The text without code blocks and inline code (links inside code are not links)."""
  lines = [ln for ln in _FENCE.sub('', text).splitlines() if not ln.startswith('    ')]
  return _INLINE.sub('', '\n'.join(lines))


def slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
  text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)
  return re.sub(r'[^\w\- ]', '', text.lower()).replace(' ', '-')


def anchors(text: str) -> set[str]:
  seen: dict[str, int] = {}
  out = set()
  for m in _HEADING.finditer(_FENCE.sub('', text)):
    s = slug(m.group(2))
    out.add(s if s not in seen else f'{s}-{seen[s]}')
    seen[s] = seen.get(s, 0) + 1
  return out


def link_problems(path: pathlib.Path, text: str) -> list[str]:
  """Relative links of one Markdown file that do not resolve."""
  problems = []
  for target in _LINK.findall(_prose(text)):
    if re.match(r'^[a-z][a-z0-9+.-]*:', target):  # http:, https:, mailto:
      continue
    file_part, _, anchor = target.partition('#')
    dest = (path.parent / file_part).resolve() if file_part else path
    if not dest.exists():
      problems.append(f'{path.name}: link {target!r}: {file_part} does not exist')
    elif anchor and dest.suffix == '.md' and anchor not in anchors(dest.read_text()):
      problems.append(f'{path.name}: link {target!r}: no heading #{anchor} in {dest.name}')
  return problems


def table_problems(path: pathlib.Path, text: str) -> list[str]:
  """A table row must stay on one line: a line after a row is a row or blank."""
  lines = [ln for ln in _FENCE.sub('', text).splitlines() if not ln.startswith('    ')]
  return [f'{path.name}: a table row continues on the next line: {nxt[:60]!r}'
          for row, nxt in zip(lines, lines[1:])
          if row.startswith('|') and nxt.strip() and not nxt.startswith('|')]


def commands(text: str, pattern: re.Pattern[str] = _COMMAND) -> list[str]:
  """Every command ``pattern`` starts that is quoted in code, continuation lines joined; a
  command ends at the end of its line, at ``&&``, `` | ``, `` -- `` or the next ``python``."""
  out = []
  spans = [re.sub(r'\\\n\s*#?', ' ', block) for block in _code_blocks(text)]
  spans += _INLINE.findall(_FENCE.sub('', text))
  for span in spans:
    for line in span.splitlines():
      for part in re.split(r'&&| \| | -- ', line):
        starts = [m.start() for m in re.finditer(r'python3? ', part)] + [len(part)]
        out += [part[a:b].strip() for a, b in zip(starts, starts[1:]) if pattern.match(part, a)]
  return out


# ---- Flags, read from the modules' source ----

def _source(module: str) -> pathlib.Path | None:
  """The file of an encoder_jax module, found without importing its packages."""
  base = REPO.joinpath(*module.split('.'))
  for path in (base.with_suffix('.py'), base / '__init__.py'):
    if path.is_file():
      return path
  return None


@functools.lru_cache(maxsize=None)
def _tree(module: str) -> ast.Module | None:
  path = _source(module)
  return ast.parse(path.read_text()) if path else None


def _defined(node: ast.AST) -> set[str]:
  """Names of the flags the DEFINE_* calls under ``node`` define."""
  names = set()
  for call in ast.walk(node):
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        and call.func.attr.startswith('DEFINE')):
      args = [a for a in call.args[:1]] + [k.value for k in call.keywords if k.arg == 'name']
      names |= {a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
  return names


def _field_flags(node: ast.AST, imported: dict[str, str]) -> set[str]:
  """Names of the flags ``fields.define_flags(MODULE.NAME)`` calls under ``node`` define:
  the names of the ``Field(...)`` declarations in MODULE's ``NAME = (...)``."""
  names = set()
  for call in ast.walk(node):
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == 'define_flags' and call.args
            and isinstance(arg := call.args[0], ast.Attribute)
            and isinstance(arg.value, ast.Name) and arg.value.id in imported):
      continue
    for stmt in (_tree(imported[arg.value.id]) or ast.Module(body=[])).body:
      if isinstance(stmt, ast.Assign) and any(
          isinstance(t, ast.Name) and t.id == arg.attr for t in stmt.targets):
        names |= {c.args[0].value for c in ast.walk(stmt.value) if isinstance(c, ast.Call)
                  and c.args and isinstance(c.args[0], ast.Constant)
                  and isinstance(c.args[0].value, str)}
  return names


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
  """Local name -> encoder_jax module, for every import in the file."""
  out = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      base = node.module
      if node.level:  # Relative: resolve against this module's package.
        base = '.'.join(module.split('.')[:-node.level] + [node.module])
      for alias in node.names:
        full = f'{base}.{alias.name}'
        if base.startswith('encoder_jax') and _is_module(base):
          out[alias.asname or alias.name] = full if _is_module(full) else base
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith('encoder_jax'):
          out[alias.asname or alias.name] = alias.name
  return out


def _is_module(name: str) -> bool:
  return name.startswith('encoder_jax') and _source(name) is not None


def _module_level(tree: ast.Module) -> list[ast.stmt]:
  """What runs on import: no function or class bodies, no ``if __name__ == '__main__':``."""
  def on_import(s):
    return not (isinstance(s, (ast.FunctionDef, ast.ClassDef)) or (
        isinstance(s, ast.If) and '__main__' in ast.unparse(s.test)))
  return [s for s in tree.body if on_import(s)]


@functools.lru_cache(maxsize=None)
def module_flags(module: str) -> frozenset[str]:
  """The flags ``python -m module`` accepts."""
  flags, seen, todo = set(ABSL_FLAGS), set(), [(module, None)]
  while todo:
    mod, function = todo.pop()
    if (mod, function) in seen or (tree := _tree(mod)) is None:
      continue
    seen.add((mod, function))
    if function is None:  # The whole file for the command, module level for what it imports.
      nodes = [tree] if mod == module else _module_level(tree)
      if mod == module:  # Options a module parses by hand: a literal '--name=' in its source.
        flags |= {m.group(1) for c in ast.walk(tree) if isinstance(c, ast.Constant)
                  and isinstance(c.value, str) and (m := re.fullmatch(r'--(\w+)=?', c.value))}
    else:
      nodes = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == function]
    imported = _imports(tree, mod)
    for node in nodes:
      flags |= _defined(node) | _field_flags(node, imported)
      for call in ast.walk(node):  # cli.define_source_flags() and the like.
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name) and call.func.value.id in imported):
          todo.append((imported[call.func.value.id], call.func.attr))
    todo += [(m, None) for m in imported.values()]
  return frozenset(flags)


@functools.lru_cache(maxsize=None)
def _config(value: str | None, module: str):
  """The ConfigDict a --config value gives (the default schema when there is no file)."""
  if value is None:
    mod, fn = next((v for k, v in DEFAULT_SCHEMA.items() if module.startswith(k)),
                   FALLBACK_SCHEMA)
    return getattr(importlib.import_module(mod), fn)()
  path, _, arg = value.partition(':')
  spec = importlib.util.spec_from_file_location('doc_config', REPO / path)
  config_module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(config_module)
  return config_module.get_config(arg) if arg else config_module.get_config()


def _has_field(config, dotted: str) -> bool:
  node = config
  for part in dotted.split('.'):
    if not hasattr(node, 'keys') or part not in node.keys():
      return False
    node = node[part]
  return True


def command_problems(command: str) -> list[str]:
  """What is wrong with one quoted command: its module, its flags, its overrides."""
  module = _COMMAND.match(command).group(1)
  if not _is_module(module):
    return [f'{command!r}: no module {module}']
  known = module_flags(module)
  problems = []
  config_value = None
  m = _CONFIG_VALUE.search(command)
  if m and m.group(1).split(':')[0].endswith('.py') and not re.search(r'[<>$*]', m.group(1)):
    config_value = m.group(1).strip('\'"')  # A real path, not a placeholder (configs/<name>.py).
    if not (REPO / config_value.split(':')[0]).is_file():
      return [f'{command!r}: config file {config_value.split(":")[0]} does not exist']
  for name in _FLAG.findall(command):
    if name.startswith('config.') and 'config' in known:
      if not _has_field(_config(config_value, module), name[len('config.'):]):
        problems.append(f'{command!r}: --{name}: no field {name[7:]!r} in '
                        f'{config_value or "the default schema"}')
    elif name not in known and not (name.startswith('no') and name[2:] in known):
      problems.append(f'{command!r}: --{name} is not a flag of {module}')
  return problems


@functools.lru_cache(maxsize=None)
def script_options(script: str) -> frozenset[str]:
  """The ``--options`` a script's ``add_argument`` calls define (aliases included)."""
  options = set()
  for call in ast.walk(ast.parse((REPO / script).read_text())):
    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        and call.func.attr == 'add_argument'):
      options |= {a.value[2:] for a in call.args
                  if isinstance(a, ast.Constant) and str(a.value).startswith('--')}
  return frozenset(options | {'help'})


def script_problems(command: str) -> list[str]:
  """What is wrong with one quoted ``python benchmarks/X.py`` command."""
  script = _SCRIPT.match(command).group(1)
  if not (REPO / script).is_file():
    return [f'{command!r}: no script {script}']
  return [f'{command!r}: --{name} is not an option of {script}'
          for name in _FLAG.findall(command) if name not in script_options(script)]


def snippet_problems(text: str) -> list[str]:
  """``python -c "from encoder_jax.x import y; print(y.f())"`` names a function y defines."""
  problems = []
  for package, module, function in _SNIPPET.findall(text):
    tree = _tree(f'{package}.{module}')
    defined = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)} if tree else set()
    if function not in defined:
      problems.append(f'{package}.{module}.{function} does not exist')
  return problems


# ---- Tests ----

@pytest.mark.parametrize('path', DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
  assert link_problems(path, path.read_text()) + table_problems(path, path.read_text()) == []


@pytest.mark.parametrize('path', DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_quoted_commands_name_real_modules_and_flags(path):
  problems = [p for c in commands(path.read_text()) for p in command_problems(c)]
  assert problems == []


@pytest.mark.parametrize('path', DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_quoted_scripts_exist_with_their_options(path):
  problems = [p for c in commands(path.read_text(), _SCRIPT) for p in script_problems(c)]
  assert problems + snippet_problems(path.read_text()) == []


def test_docs_quote_commands():
  """The command extraction finds the README's commands (a check that checks something)."""
  quoted = commands((REPO / 'README.md').read_text())
  assert any(c.startswith('python -m encoder_jax.main --config=configs/') for c in quoted)
  assert len({_COMMAND.match(c).group(1) for c in quoted}) >= 8


def test_readme_is_a_landing_page():
  lines = (REPO / 'README.md').read_text().splitlines()
  assert len(lines) <= README_MAX_LINES, f'README.md has {len(lines)} lines'


def test_readme_test_command_is_the_ci_command():
  readme = (REPO / 'README.md').read_text()
  assert TEST_COMMAND in readme
  ci = [ln.replace(' --quiet', '') for ln in (REPO / '.ci' / 'run').read_text().splitlines()
        if 'pytest' in ln and not ln.lstrip().startswith('#')]
  assert [ln.strip() for ln in ci] == [TEST_COMMAND]


def test_docs_speak_of_the_project_only():
  for path in DOCS:
    text = path.read_text()
    assert not re.search(r'device tool|`carry`|timeout_s', text), path


def test_checks_catch_a_broken_link_and_an_unknown_flag(tmp_path):
  (tmp_path / 'there.md').write_text('# A heading\n')
  doc = tmp_path / 'doc.md'
  text = ('[ok](there.md) [ok](there.md#a-heading) [ok](https://example.com) '
          '[broken](missing.md) [bad anchor](there.md#nowhere)\n\n'
          '    python -m encoder_jax.main --config=configs/bert_small.py --workdir=/tmp/x \\\n'
          '        --config.train.batch_size=8 --no_such_flag=1 --config.model.no_such_field=2\n'
          '    python -m encoder_jax.no_such_module --x=1\n\n'
          'Inline: `python -m encoder_jax.fill_mask --workdir=DIR --text=a --top_k=3 '
          '--traceback --verbosity=1`, `python -m encoder_jax.embed --input=a --pooling_x=1`.\n\n'
          '    python benchmarks/bench_train.py --kind=all --memory_only --no_such_option\n'
          '    python benchmarks/no_such_script.py\n\n'
          '    python -c "from encoder_jax.config import schema; print(schema.fields_table())"\n'
          '    python -c "from encoder_jax.config import schema; print(schema.no_table())"\n')
  doc.write_text(text)
  assert table_problems(doc, '| a | b |\n|---|---|\n| x | y\nz |\n') != []
  assert table_problems(doc, '| a | b |\n|---|---|\n| x | y |\n\nz\n') == []
  links = link_problems(doc, text)
  assert len(links) == 2 and 'missing.md' in links[0] and '#nowhere' in links[1], links
  problems = [p for c in commands(text) for p in command_problems(c)]
  assert len(problems) == 4, problems
  assert '--no_such_flag' in problems[0] and 'no_such_field' in problems[1]
  assert 'no module encoder_jax.no_such_module' in problems[2]
  assert '--pooling_x' in problems[3]
  scripts = [p for c in commands(text, _SCRIPT) for p in script_problems(c)]
  assert len(scripts) == 2, scripts
  assert '--no_such_option' in scripts[0] and 'no script benchmarks/no_such' in scripts[1]
  assert snippet_problems(text) == ['encoder_jax.config.schema.no_table does not exist']
