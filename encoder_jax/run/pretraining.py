"""Pretraining's adapter to the engine: a config's settings (:func:`spec`), its pieces
(:func:`pieces`), the job (:func:`job`: data, objectives, header and hooks) and the eval step.

It never names a model variant or an objective: the objective registry turns the config
into what the engine trains (``objectives.build``: the networks, their init and one
``loss_fn(params, batch, rng, phase, train)``, differentiated by the engine's train step).
State is born sharded (``eval_shape`` -> shardings -> ``jit(init, out_shardings=...)``),
masks are drawn on device from ``fold_in(key, step)``, and every ``checkpoint.every_steps``
the params, optimizer state and data-iterator state are saved together.

A run starts at ``encoder_jax.api.pretrain.run`` (the one entry point: ``main``, the tests
and the benchmarks), which resolves the model ``config.init`` names, if any (continued
pretraining: its weights, network and tokenizer, with a fresh optimizer; what it took is
in ``<workdir>/init_report.json``); once a run has a checkpoint of its own it resumes from
that, like any run.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from encoder_jax.run import checkpointing
from encoder_jax.run import console as console_lib
from encoder_jax import data as data_lib
from encoder_jax.run import engine
from encoder_jax.run import feeding
from encoder_jax.run import compilation_cache
from encoder_jax import objectives
from encoder_jax.core import optimizer as optimizer_lib
from encoder_jax.core import length_phases
from encoder_jax.core import sharding
from encoder_jax.run import steps
from encoder_jax.run import train_state
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.objectives import masking

PARAMETERS_TXT = 'parameters.txt'  # The full parameter table (shapes, logical/mesh specs).
INIT_REPORT = 'init_report.json'  # What a run started from a source took and initialised.
_EVAL = train_state.EVAL


def spec(config: ml_collections.ConfigDict) -> steps.RunSpec:
  """The engine's settings of a pretraining config."""
  t, c = config.train, config.checkpoint
  return steps.RunSpec(
      seed=int(config.seed), batch_size=int(t.batch_size), num_steps=int(t.num_steps),
      optim=optimizer_lib.of_pretraining(config.optim), mesh=config.mesh,
      checkpoint=steps.Checkpointing(every_steps=int(c.every_steps), keep=int(c.keep),
                                      async_save=bool(c.async_save)),
      grad_accum_steps=int(t.grad_accum_steps), nonfinite_policy=str(t.nonfinite_policy),
      compilation_cache_dir=str(t.get('compilation_cache_dir', 'auto')),
      peak_tflops_per_device=float(t.get('peak_tflops_per_device', 0.0)),
      profile_steps=int(t.get('profile_steps', 0)),
      profile_first_step=int(t.get('profile_first_step', 1)))


def pieces(config: ml_collections.ConfigDict, mesh, objective=None, tx=None) -> steps.Pieces:
  """``steps.build`` of a pretraining config: what ``engine.run`` trains with and ``compile``
  compiles. ``objective``: what ``objectives.build(config)`` gives unless given (a run's
  reads the corpus's vocabulary tables); ``tx``: see ``steps.build``."""
  return steps.build(spec(config), objectives.build(config) if objective is None else objective,
                     mesh, tx)


def make_eval_step(config, objective, mesh, param_shardings, phase: length_phases.Phase):
  """A jitted ``(params, batch, index) -> metrics``: fixed masks, no dropout.

  With ``train.grad_accum_steps`` A > 1 the batch is evaluated in A micro-batches, rows i,
  i+A, ... as in training (a whole batch's forward pass would need A times the memory a
  training micro-batch's does), and their metrics combined as :func:`evaluate` combines
  batches': counts summed, a metric weighted by its count, the others averaged."""
  accum = int(config.train.grad_accum_steps)
  base_key = jax.random.fold_in(jax.random.key(config.seed), _EVAL)

  def metrics(params, batch, key):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # As the train step's.
      return objective.loss_fn(params, batch, key, phase, False)[1]

  def step_fn(params, batch, index):
    key = jax.random.fold_in(base_key, index)
    if accum == 1:
      return metrics(params, batch, key)
    micro = jax.tree.map(
        lambda x: x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1), batch)
    per = jax.lax.map(lambda ib: metrics(params, ib[1], jax.random.fold_in(key, ib[0])),
                      (jnp.arange(accum), micro))
    return combine_metrics(per, objective.metric_weights)

  return jax.jit(step_fn, in_shardings=(param_shardings, sharding.batch_sharding(mesh), None))


def reused_eval_step(config, tables: masking.VocabTables, objective, mesh, param_shardings,
                     phase: length_phases.Phase):
  """:func:`make_eval_step`'s step, or the one made earlier in this process for the same
  program (``engine.reused``): the same config and vocabulary tables, mesh, phase and param
  shardings. A checkpoint evaluated after its run in the same process (or one checkpoint
  after another) is not traced and compiled again."""
  key = ('eval', _program_key(config, tables), mesh, phase,
         jax.tree.structure(param_shardings), tuple(jax.tree.leaves(param_shardings)))
  return engine.reused(key, lambda: make_eval_step(config, objective, mesh, param_shardings,
                                                   phase))


def combine_metrics(per_part: dict, metric_weights: dict) -> dict:
  """Metrics of several parts (each a leading-axis array) as one: a count (a value of
  ``metric_weights``) summed, a metric named in it averaged weighted by its count, any
  other averaged."""
  counts = set(metric_weights.values())
  out = {}
  for k, v in per_part.items():
    v = v.astype(jnp.float32)
    if k in counts:
      out[k] = v.sum(0)
    elif k in metric_weights:
      w = per_part[metric_weights[k]].astype(jnp.float32)
      out[k] = (v * w).sum(0) / jnp.maximum(w.sum(0), 1.0)
    else:
      out[k] = v.mean(0)
  return out


def evaluate(eval_step, params, eval_batches, mesh, objective,
             global_rows: int | None = None) -> dict[str, float]:
  """Held-out metrics over a finite iterator of host batches.

  A metric named in the objective's ``metric_weights`` is a mean over a per-batch count and
  is weighted by it (MLM loss and accuracy per predicted token); counts are summed; other
  metrics are means over batches. The objective then adds what it derives (perplexity).
  """
  metric_weights = objective.metric_weights
  per_batch = [jax.device_get(eval_step(
      params, feeding.to_global(batch, sharding.batch_sharding(mesh), global_rows), i))
               for i, batch in enumerate(eval_batches)]
  if not per_batch:
    raise ValueError('The held-out split produced no evaluation batch')
  counts = set(metric_weights.values())
  out = {}
  for k in per_batch[0]:
    values = np.array([float(m[k]) for m in per_batch])
    if k in counts:
      out[k] = float(values.sum())
    elif k in metric_weights:
      w = np.array([float(m[metric_weights[k]]) for m in per_batch])
      out[k] = float((values * w).sum() / max(w.sum(), 1.0))
    else:
      out[k] = float(values.mean())
  out.update(objective.summarize(out))
  out['batches'] = len(per_batch)
  return out


def vocab_tables(config, prepared) -> masking.VocabTables:
  return objectives.vocab_tables(config, prepared.tokenizer, prepared.unigram_counts,
                                 str(prepared.directory))


def job(config: ml_collections.ConfigDict, workdir: str, mesh,
        source: train_state.Source | None) -> engine.Job:
  """The engine's job of a checked ``config`` (``source``: the model ``config.init`` names,
  already adopted into it) in ``workdir`` on ``mesh``. Refuses a resume whose config
  changes what a checkpoint depends on, and a held-out split that yields nothing, before
  anything in the workdir is written."""
  return _Adapter(config, workdir, mesh, source).job()


class _Adapter:
  """Pretraining's side of a run: the data, the objectives, the header and the hooks."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, mesh, source):
    self.config, self.workdir, self.mesh, self.source = config, workdir, mesh, source
    self.phases = length_phases.phases(config.train)
    for change in workdir_lib.check_resume_config(workdir, config):
      logging.warning('Resuming with a changed config: %s', change)
    self.prepared = data_lib.load_or_prepare(config)
    self.tables = vocab_tables(config, self.prepared)
    self.objective = objectives.build(config, self.tables)
    self.rows = sharding.process_rows(mesh, int(config.train.batch_size))
    self.lead = jax.process_index() == 0
    if self.lead:  # May refuse: nothing is written yet.
      workdir_lib.check_pinned_tokenizer(workdir, self.prepared.tokenizer)
    self.console = console_lib.Console(enabled=self.lead, shown=self.objective.console_metrics)
    self.eval_fns: dict[int, Any] = {}
    self.eval_sets: dict[int, list] = {}

  def job(self) -> engine.Job:
    t = self.config.train
    if t.eval_every_steps:  # An unusable held-out split fails now, not mid-run.
      self.eval_set(self.phases[0])
    return engine.Job(
        trainable=self.objective, hooks=self, console=self.console,
        batches=data_lib.make_train_iterator(self.config, self.prepared, rows=self.rows),
        init_rng=train_state.init_rng(self.config.seed),
        pretrained=None if self.source is None else self.pretrained, on_start=self.on_start,
        program_key=_program_key(self.config, self.tables), summary=self.summary)

  def pretrained(self):
    """The source's params, its untrained parts said as such."""
    params, untrained = self.source.load()
    return params, {part: f'untrained in the source ({why})' for part, why in untrained.items()}

  # ---- engine.Hooks

  def phase_at(self, step: int) -> length_phases.Phase:
    return length_phases.phase_at(self.phases, step)

  def due(self, step: int, data_state) -> engine.Due:
    del data_state
    t = self.config.train
    return engine.Due(
        log=step % t.log_every_steps == 0,
        evaluate=bool(t.eval_every_steps) and (step % t.eval_every_steps == 0
                                               or step == t.num_steps),
        save=step % self.config.checkpoint.every_steps == 0)

  def eval_set(self, phase):
    """The held-out batches at a phase's length: built once, the same at every eval."""
    if phase.index not in self.eval_sets:
      self.eval_sets[phase.index] = list(data_lib.make_eval_iterator(
          self.config, self.prepared, phase.seq_len, rows=self.rows))
    return self.eval_sets[phase.index]

  def evaluate(self, step: int, state, phase, data_state, out: engine.Out) -> None:
    del step, data_state
    if phase.index not in self.eval_fns:
      self.eval_fns[phase.index] = reused_eval_step(
          self.config, self.tables, self.objective, self.mesh, out.param_shardings, phase)
    out.report(evaluate(self.eval_fns[phase.index], state.params, self.eval_set(phase),
                        self.mesh, self.objective, self.config.train.batch_size), 'eval')

  # ---- the run's start and end

  def on_start(self, start: engine.Start, params) -> None:
    """Every refusal is behind: the workdir's files, then the header."""
    config, workdir, out = self.config, self.workdir, self.console
    table = sharding.describe(params, self.mesh)
    logging.info('Mesh %s; parameters:\n%s', dict(self.mesh.shape), table)
    if self.lead:
      workdir_lib.pin_tokenizer(workdir, self.prepared.tokenizer, self.prepared.unigram_counts)
      workdir_lib.write_config(workdir, config)
      workdir_lib.path(workdir, PARAMETERS_TXT).write_text(table + '\n')
    m_cfg, prepared = config.model, self.prepared
    train_split = prepared.manifest['splits']['train']
    out.say(f'encoder_jax: pretraining {m_cfg.kind} ({m_cfg.num_layers} x {m_cfg.hidden_size}, '
            f'{engine.param_count(params):,} parameters; table in '
            f'{workdir_lib.path(workdir, PARAMETERS_TXT)}) '
            f'with {" + ".join(config.objective.names)} in {workdir}')
    out.say(engine.mesh_line(self.mesh, config.train.batch_size) + '; phases ' + ', '.join(
        f'{p.end_step - p.start_step} steps at {p.seq_len}' for p in self.phases))
    out.say(f'  data {prepared.directory}: {train_split["documents"]:,} documents, '
            f'{train_split["tokens"]:,} tokens; {prepared.tokenizer.kind} tokenizer, '
            f'{prepared.tokenizer.vocab_size:,} pieces')
    cache = compilation_cache.in_use()
    out.say(f'  compiled programs cached in {cache}' if cache else
            '  no compilation cache (config.train.compilation_cache_dir)')
    for step_aside, reason, where in start.set_aside:
      out.say(f'  checkpoint step {step_aside} is damaged ({reason}); set aside in {where}')
    if start.resumed is not None:
      out.say(f'  resuming from checkpoint step {start.resumed}' + (
          f' (the run started from {self.source.description}: {INIT_REPORT})'
          if self.source is not None else ''))
    elif start.parts is not None:
      report = _init_report(config, self.source, start.parts)
      for line in train_state.report_lines(report):
        out.say('  ' + line)
      out.say(f'  report in {workdir_lib.path(workdir, INIT_REPORT)}')
      if self.lead:
        workdir_lib.path(workdir, INIT_REPORT).write_text(json.dumps(report, indent=2) + '\n')
    else:
      out.say('  starting from scratch')

  def summary(self, result: engine.Result) -> list[str]:
    """Where things are and what to run next."""
    workdir = self.workdir
    return [f'; checkpoints in {checkpointing.checkpoint_dir(workdir)}, metrics in '
            f'{workdir_lib.path(workdir, "metrics.jsonl")}. Next:'] + [
                f'  {command}' for command in console_lib.next_commands(workdir)]


def _init_report(config: ml_collections.ConfigDict, source: train_state.Source,
                 parts: dict) -> dict:
  """What a run started from ``source`` took and initialised (``init_report.json``)."""
  tok = source.tokenizer
  return dict(source=source.description, init=source.key, source_step=source.step, **parts,
              network=dict(config.model.to_dict()),
              tokenizer=dict(kind=str(tok.kind), path=str(tok.path),
                             vocab_size=int(tok.vocab_size)),
              optimizer='fresh (step 0): the source\'s optimizer state is not taken')


def _program_key(config: ml_collections.ConfigDict, tables: masking.VocabTables) -> str:
  """A digest of everything a pretraining run's compiled steps depend on besides the mesh
  and the phase: the whole config and the vocabulary tables the corruption reads."""
  h = hashlib.sha256(config.to_json_best_effort(sort_keys=True).encode('utf-8'))
  for a in (tables.is_special_V, tables.is_word_start_V, tables.unigram_counts_V):
    h.update(np.ascontiguousarray(a).tobytes())
  h.update(str(tables.mask_id).encode('utf-8'))
  return h.hexdigest()
