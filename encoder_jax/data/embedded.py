"""The embedded corpus: docstrings of the Python standard library, offline on every machine.

The stdlib sources are parsed with ``ast`` (never imported), in sorted path order, so the
corpus is deterministic for a given Python version (~1.6 MB of English in ~1,900 documents
and ~21,000 sentences on CPython 3.11). A document is either a module (its docstring plus
the docstrings of its top-level functions) or a class (its docstring plus those of its
methods and nested classes); exact duplicate documents are kept once. Doctest lines
(``>>>``/``...`` and their output) and rule lines (``-----``) are dropped; the rest is split
into sentences by ``sentences.split_paragraph``. Test suites and ``site-packages`` are
skipped.

Parsing the stdlib takes seconds, so the extracted corpus is kept in a cache file
(``ENCODER_JAX_CACHE_DIR``, default ``<tempdir>/encoder_jax_cache_<uid>``; ``''`` turns it
off) named by the :func:`fingerprint` and a digest of every source file's path, size and
modification time: a changed stdlib or extraction rule is a new file, never a stale read.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import sys
import sysconfig
import tempfile

from encoder_jax.storage import paths as storage
from encoder_jax.data import sentences as sentences_lib

_SKIP_DIRS = frozenset({'site-packages', 'dist-packages', 'test', 'tests', 'idle_test',
                        '__pycache__'})
_RULE = re.compile(r'^[\s\-=~^*#+_.:]*$')
_MAX_SENTENCE_CHARS = 5000
# Bump when the extraction below changes, so prepared data keyed by the fingerprint is redone.
_EXTRACTION_VERSION = 2


def stdlib_dir() -> str:
  return sysconfig.get_paths()['stdlib']


def fingerprint() -> str:
  """Identifies the corpus content: the Python version and the extraction rules."""
  v = sys.version_info
  return f'python-{v.major}.{v.minor}.{v.micro}/extraction-{_EXTRACTION_VERSION}'


def _source_files(root: str) -> list[str]:
  out = []
  for directory, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith('.'))
    out.extend(os.path.join(directory, f) for f in sorted(files) if f.endswith('.py'))
  return out


def _docstring_sentences(doc: str) -> list[str]:
  """Prose sentences of one cleaned docstring (paragraph = block between blank lines)."""
  out = []
  paragraph: list[str] = []
  in_doctest = False

  def flush():
    if paragraph:
      out.extend(sentences_lib.split_paragraph(' '.join(paragraph), _MAX_SENTENCE_CHARS)[0])
      paragraph.clear()

  for line in doc.split('\n'):
    stripped = line.strip()
    if not stripped:
      in_doctest = False
      flush()
    elif in_doctest or stripped.startswith('>>>'):
      in_doctest = True
      flush()
    elif _RULE.match(stripped):
      flush()
    else:
      paragraph.append(stripped)
  flush()
  return [s for s in out if any(c.isalpha() for c in s)]


def _node_docstrings(node: ast.AST) -> list[str]:
  """Docstrings of ``node`` and of the functions/classes nested in it (source order)."""
  out = []
  stack = [node]
  while stack:
    n = stack.pop()
    if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(n, clean=True)
      if doc:
        out.append(doc)
      children = [c for c in n.body
                  if isinstance(c, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
      stack.extend(reversed(children))
  return out


def _file_documents(path: str) -> list[list[str]]:
  with open(path, 'rb') as f:
    source = f.read()
  try:
    tree = ast.parse(source, filename=path)
  except (SyntaxError, ValueError):  # E.g. deliberately broken files in lib2to3 fixtures.
    return []
  module_doc = []
  doc = ast.get_docstring(tree, clean=True)
  if doc:
    module_doc.append(doc)
  documents = []
  for child in tree.body:
    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
      module_doc.extend(_node_docstrings(child))
    elif isinstance(child, ast.ClassDef):
      documents.append(_node_docstrings(child))
  documents.insert(0, module_doc)
  out = []
  for docstrings in documents:
    sentences = [s for d in docstrings for s in _docstring_sentences(d)]
    if sentences:
      out.append(sentences)
  return out


def _cache_path(root: str, files: list[str]) -> str | None:
  directory = os.environ.get('ENCODER_JAX_CACHE_DIR',
                             os.path.join(tempfile.gettempdir(),
                                          f'encoder_jax_cache_{os.getuid()}'))
  if not directory:
    return None
  digest = hashlib.sha256(f'{fingerprint()}\n{root}'.encode())
  for path in files:
    st = os.stat(path)
    digest.update(f'{path}\t{st.st_size}\t{st.st_mtime_ns}\n'.encode())
  return os.path.join(directory, f'embedded_corpus_{digest.hexdigest()[:24]}.json')


@functools.lru_cache(maxsize=1)
def _corpus() -> tuple[tuple[str, ...], ...]:
  root = stdlib_dir()
  files = _source_files(root)
  cache = _cache_path(root, files)
  if cache and os.path.exists(cache):
    try:
      with open(cache, encoding='utf-8') as f:
        return tuple(tuple(d) for d in json.load(f))
    except (OSError, ValueError):  # A damaged cache file: extracted again below.
      pass
  documents = _extract(root, files)
  if cache:
    try:  # Written whole then renamed, so a concurrent reader never sees a partial file.
      os.makedirs(os.path.dirname(cache), exist_ok=True)
      storage.write_atomically(cache, json.dumps(documents))
    except OSError:  # A read-only temp dir: the corpus still works, uncached.
      pass
  return documents


def _extract(root: str, files: list[str]) -> tuple[tuple[str, ...], ...]:
  documents, seen = [], set()
  for path in files:
    for doc in map(tuple, _file_documents(path)):
      if doc not in seen:  # Exact duplicates (e.g. shared deprecation notices): keep one.
        seen.add(doc)
        documents.append(doc)
  if not documents:
    raise RuntimeError(
        f'The embedded corpus is empty: no docstrings found under the stdlib at {root!r} '
        '(is this a stripped Python install without .py sources?). Configure '
        "config.data.sources with 'text:', 'jsonl:' or 'tfds:' sources instead.")
  return tuple(documents)


def embedded_corpus() -> list[list[str]]:
  """The stdlib docstring corpus: a list of documents, each a list of sentence strings."""
  return [list(d) for d in _corpus()]
