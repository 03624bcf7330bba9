"""Pretraining from a config: from scratch, resumed, or started from another model.

``run(config, workdir)`` is the one entry point to pretraining: ``encoder_jax.main``, the
bake-off, the tests and the benchmarks start a run with it. A config whose
``init`` names a model (``init.workdir`` with ``init.step``, or ``init.hf_dir``: the names
fine-tuning uses) is continued pretraining (Gururangan et al. 2020, "Don't Stop
Pretraining"): the new run takes the source's weights, network and tokenizer and keeps its
own corpus, objectives, schedule and a fresh optimizer. The source is resolved by
``encoder_jax.api.source`` (the one resolver of a model: a workdir, a Hugging Face directory or
``reference:NAME``) into a ``train_state.Source``, which the run adopts
(``train_state.adopt``) and starts from (``train_state.start_params``). Only what the
config needs (network, tokenizer) is read before the run starts; the weights are read
when the run starts from them, never when it resumes from a checkpoint of its own.
"""

from __future__ import annotations

import os

import ml_collections

from encoder_jax.api import source as source_lib
from encoder_jax.config import validation
from encoder_jax.run import engine
from encoder_jax.run import pretraining
from encoder_jax.run import train_state


def run(config: ml_collections.ConfigDict, workdir: str) -> engine.Result:
  """Pretrains (or resumes) in ``workdir`` from what ``config.init`` names, if anything, on
  the engine (``engine.run``): the state, the step reached, whether it was preempted and
  the last logged training metrics.

  Every config value and the workdir are checked before any work; the workdir is locked
  against a second run; a resume whose config changes what a checkpoint depends on is
  refused before anything in the workdir is written. The source's network and tokenizer
  replace the config's (``train_state.adopt``: a conflicting network field is refused by
  name, before the config's own checks).
  """
  source = resolve(config, workdir)
  config = train_state.adopt(config, source)
  validation.validate(config)
  return engine.run(pretraining.spec(config), workdir,
                    lambda mesh: pretraining.job(config, workdir, mesh, source))


def adopted(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` as a run would train it: with the network and tokenizer of the model its
  ``init`` names (``config`` itself when none)."""
  return train_state.adopt(config, resolve(config))


def resolve(config: ml_collections.ConfigDict, workdir: str | None = None
            ) -> train_state.Source | None:
  """The model ``config.init`` names (None: none), through ``source`` (a workdir and step,
  a Hugging Face directory or ``reference:NAME``); ``workdir``: the run's own, which cannot
  be its source."""
  i = config.init
  if not (i.workdir or i.hf_dir):
    return None
  if i.workdir and i.hf_dir:
    raise ValueError(f'config.init.workdir={i.workdir!r} and config.init.hf_dir={i.hf_dir!r}: '
                     'expected at most one source to start from')
  if i.workdir and workdir and os.path.abspath(str(i.workdir)) == os.path.abspath(workdir):
    raise ValueError(f'config.init.workdir={i.workdir!r} is the run\'s own workdir: a rerun '
                     'resumes from its checkpoints; name another workdir to start from')
  return source_lib.for_pretraining(source_lib.of_init(i))
