"""Pretraining from a config: from scratch, resumed, or started from another model.

``run(config, workdir)`` is what ``encoder_jax.main`` and the bake-off start. A config whose
``init`` names a model (``init.workdir`` with ``init.step``, or ``init.hf_dir``: the names
fine-tuning uses) is continued pretraining (Gururangan et al. 2020, "Don't Stop
Pretraining"): the new run takes the source's weights, network and tokenizer and keeps its
own corpus, objectives, schedule and a fresh optimizer. This module loads the source
(a workdir through ``loading``, a Hugging Face directory through ``interop``, both above
the training engine) into a ``train_state.Source``, which the engine adopts
(``train_state.adopt``) and starts from (``train_state.start_params``). Only what the
config needs (network, tokenizer) is read before the run starts; the weights are read
when the run starts from them, never when it resumes from a checkpoint of its own.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

import ml_collections

from encoder_jax import checkpointing
from encoder_jax import engine
from encoder_jax import loading
from encoder_jax import train
from encoder_jax import train_state
from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.interop import hf
from encoder_jax.interop import hf_import
from encoder_jax.interop import tokenizer as tokenizer_io


def run(config: ml_collections.ConfigDict, workdir: str) -> engine.Result:
  """Pretrains (or resumes) in ``workdir`` from what ``config.init`` names, if anything
  (``train.pretrain``): the state, the step reached, whether it was preempted and the last
  logged training metrics."""
  return train.pretrain(config, workdir, resolve(config, workdir))


def adopted(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` as a run would train it: with the network and tokenizer of the model its
  ``init`` names (``config`` itself when none)."""
  return train_state.adopt(config, resolve(config))


def resolve(config: ml_collections.ConfigDict, workdir: str | None = None
            ) -> train_state.Source | None:
  """The model ``config.init`` names (None: none); ``workdir``: the run's own, which cannot
  be its source."""
  i = config.init
  if i.workdir and i.hf_dir:
    raise ValueError(f'config.init.workdir={i.workdir!r} and config.init.hf_dir={i.hf_dir!r}: '
                     'expected at most one source to start from')
  if i.hf_dir:
    return hf_source(str(i.hf_dir))
  if i.workdir:
    if workdir and os.path.abspath(str(i.workdir)) == os.path.abspath(workdir):
      raise ValueError(f'config.init.workdir={i.workdir!r} is the run\'s own workdir: a rerun '
                       'resumes from its checkpoints; name another workdir to start from')
    return workdir_source(str(i.workdir), None if int(i.step) < 0 else int(i.step))
  return None


def workdir_source(source: str, step: int | None = None) -> train_state.Source:
  """An encoder_jax workdir's checkpoint (``step``; None = its latest) as a source."""
  key = f'config.init.workdir={source!r}'
  try:
    config = loading.read_run_config(source)
    step = checkpointing.resolve_step(source, step)
  except (FileNotFoundError, checkpointing.CheckpointError) as e:
    raise FileNotFoundError(f'{key}: {e}') from e
  tok = loading.tokenizer_for_workdir(source, config)
  if '://' in source:  # Read through a fresh temporary copy: keep one a rerun names again.
    tok = _stable_copy(tok, source)

  def load():
    params, _, _ = loading.restore_params(config, source, step)
    report = loading.read_import_report(source)
    untrained = {}
    if report is not None and step == loading.IMPORTED_STEP:  # An import, not trained since.
      untrained = {g: f'its import from {report.source}, which has none'
                   for g in report.initialised_groups}
    return params, untrained

  return train_state.Source(key=key, description=f'{source} step {step}',
                            model=config.model.to_dict(), tokenizer=tok, load=load, step=step)


def hf_source(hf_dir: str) -> train_state.Source:
  """A Hugging Face directory (e.g. a sentence-transformers model) as a source."""
  key = f'config.init.hf_dir={hf_dir!r}'
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

  def load():
    loaded = hf_import.load_hf_dir(hf_dir)
    return loaded.params, {g: f'{architectures} has none' for g in loaded.report.initialised_groups}

  return train_state.Source(
      key=key, description=f'{hf_dir} (Hugging Face directory, {architectures})',
      model=model.to_dict(), tokenizer=tok, load=load)


def _stable_dir(source: str) -> str:
  """A local directory named by ``source``, for its tokenizer file."""
  digest = hashlib.sha256(source.encode()).hexdigest()[:16]
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
