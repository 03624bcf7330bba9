"""The training loop: ``train_and_evaluate(config, workdir)``.

It never names a model variant or an objective: the objective registry turns the config
into a pretraining setup (``objectives.build``) that owns the networks, their init and one
``loss_fn(params, batch, rng, phase, train)``, differentiated here. State is
born sharded (``eval_shape`` -> shardings -> ``jit(init, out_shardings=...)``), masks are
drawn on device from ``fold_in(key, step)``, and every ``checkpoint.every_steps`` the
params, optimizer state and data-iterator state are saved together.

A run whose ``config.init`` names a model (continued pretraining) starts from its weights,
network and tokenizer (``train_state.Source``, resolved by ``encoder_jax.pretrain.run``)
with a fresh optimizer, and says what it took in ``<workdir>/init_report.json``; once it
has a checkpoint of its own it resumes from that, like any run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from encoder_jax import checkpointing
from encoder_jax import console as console_lib
from encoder_jax import data as data_lib
from encoder_jax import feeding
from encoder_jax import metrics_log as metrics_lib
from encoder_jax import objectives
from encoder_jax import optimizer as optimizer_lib
from encoder_jax import length_phases
from encoder_jax import sharding
from encoder_jax import train_state
from encoder_jax import validation
from encoder_jax import workdir as workdir_lib
from encoder_jax.objectives import masking

from encoder_jax.engine import (  # pylint: disable=unused-import
    make_train_step, PreemptedError, Preempted, MetricsFlusher, Loop, drive, warn_skipped,
    _reused, _PROGRAMS)
from encoder_jax.goodput import (  # pylint: disable=unused-import
    compilation_cache_dir, compilation_cache, ProfileWindow, _cache_in_use, _use_cache)

PARAMETERS_TXT = 'parameters.txt'  # The full parameter table (shapes, logical/mesh specs).
INIT_REPORT = 'init_report.json'  # What a run started from a source took and initialised.
from encoder_jax.goodput import COMPILATION_CACHE, PROFILE_DIR  # pylint: disable=unused-import
TrainState = train_state.TrainState
state_shardings = train_state.state_shardings
abstract_state = train_state.abstract_state
create_train_state = train_state.create_train_state
_INIT, _TRAIN, _EVAL = train_state.INIT, train_state.TRAIN, train_state.EVAL


def make_eval_step(config, objective, mesh, param_shardings, phase: length_phases.Phase):
  """A jitted ``(params, batch, index) -> metrics``: fixed masks, no dropout.

  With ``train.grad_accum_steps`` A > 1 the batch is evaluated in A micro-batches, rows i,
  i+A, ... as in training (a whole batch's forward pass would need A times the memory a
  training micro-batch's does), and their metrics combined as :func:`evaluate` combines
  batches': counts summed, a metric weighted by its count, the others averaged."""
  accum = int(config.train.grad_accum_steps)
  base_key = jax.random.fold_in(jax.random.key(config.seed), _EVAL)

  def metrics(params, batch, key):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # As make_train_step's.
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


def validate(config: ml_collections.ConfigDict, mesh) -> tuple[length_phases.Phase, ...]:
  """The check that needs the mesh (each micro-batch splits over its data axes); returns the
  phases. Every other check is ``validation.validate``'s, run before any work."""
  t = config.train
  phases = length_phases.phases(t)
  sharding.check_batch(t.batch_size // t.grad_accum_steps, mesh,
                       'config.train.batch_size / grad_accum_steps')
  return phases


def vocab_tables(config, prepared) -> masking.VocabTables:
  return objectives.vocab_tables(config, prepared.tokenizer, prepared.unigram_counts,
                                 str(prepared.directory))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       source: train_state.Source | None = None) -> dict[str, float]:
  """Pretrains (or resumes) in ``workdir``; returns the last logged training metrics.

  Every config value and the workdir are checked before any work; the workdir is locked
  against a second run; a resume whose config changes what a checkpoint depends on is
  refused before anything in the workdir is written. ``source``: the model ``config.init``
  names (``encoder_jax.pretrain.run`` loads it); its network and tokenizer replace the
  config's (``train_state.adopt``: a conflicting network field is refused by name).
  """
  named = (config.init.workdir or config.init.hf_dir) if 'init' in config else ''
  if bool(named) != (source is not None):
    raise ValueError(f'config.init names {named!r} but no source was loaded: start the run '
                     'with encoder_jax.main or encoder_jax.pretrain.run, which load it' if named
                     else 'a source was given but config.init names none')
  config = train_state.adopt(config, source)  # First: a conflict is named as such.
  validation.validate(config)
  workdir_lib.check_workdir_writable(workdir)
  # SIGTERM (preemption) is heard from the start: during preparation, restore or compile
  # it ends the run cleanly before its first step instead of killing it. The compilation
  # cache is set before the run's first compile.
  with workdir_lib.run_lock(workdir), Preempted() as preempted, compilation_cache(
      config.train.get('compilation_cache_dir', 'auto'), workdir):
    return _train_and_evaluate(config, workdir, preempted, source)


@dataclasses.dataclass
class _Run:
  """What one training session works with, built once by :func:`_setup`."""
  config: ml_collections.ConfigDict
  workdir: str
  mesh: jax.sharding.Mesh
  phases: tuple[length_phases.Phase, ...]
  prepared: Any  # data.Prepared
  tx: optax.GradientTransformation
  objective: Any  # objectives.base.Pretraining
  schedule_fn: Any
  shards: Any  # TrainState of shardings
  console: console_lib.Console
  ckpt: checkpointing.Checkpointer
  iterator: Any  # data iterator with get/set_state
  rows: tuple[int, int]  # The global batch rows this process feeds.
  lead: bool  # Process 0: prints and writes the workdir.
  table: str  # The parameter table (parameters.txt).
  n_params: int
  source: train_state.Source | None = None  # What config.init names (continued pretraining).
  programs: str = ''  # What determines the compiled steps (see :func:`_program_key`).


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        preempted: 'Preempted', source=None) -> dict[str, float]:
  run = dataclasses.replace(_setup(config, workdir), source=source)
  restored = _restore(run)
  _header(run, restored)
  state = _state(run, restored)
  writer = metrics_lib.MetricWriter(workdir, enabled=run.lead,
                                    resume_step=0 if restored is None else restored[3])
  flusher = MetricsFlusher(config.train, run.objective, run.console, writer, run.ckpt, workdir)
  try:
    step = _loop(run, state, preempted, writer, flusher)
  finally:
    run.ckpt.close()
    writer.close()
  _summary(run, step, flusher)
  return flusher.last


def _setup(config: ml_collections.ConfigDict, workdir: str) -> _Run:
  """Checks and builds everything; refuses (raises) before the workdir is written."""
  mesh = sharding.make_mesh(config.mesh)
  phases = validate(config, mesh)
  for change in workdir_lib.check_resume_config(workdir, config):
    logging.warning('Resuming with a changed config: %s', change)
  prepared = data_lib.load_or_prepare(config)
  tx = optimizer_lib.make(config)
  tables = vocab_tables(config, prepared)
  objective = objectives.build(config, tables)
  schedule_fn = optimizer_lib.learning_rate_schedule(config.optim, int(config.train.num_steps))
  boxed, shards = state_shardings(config, mesh, objective, tx)
  rows = sharding.process_rows(mesh, int(config.train.batch_size))
  lead = jax.process_index() == 0
  if lead:
    workdir_lib.check_pinned_tokenizer(workdir, prepared.tokenizer)  # May refuse: nothing written.
  table = sharding.describe(boxed.params, mesh)
  logging.info('Mesh %s; parameters:\n%s', dict(mesh.shape), table)
  return _Run(config=config, workdir=workdir, mesh=mesh, phases=phases, prepared=prepared,
              tx=tx, objective=objective, schedule_fn=schedule_fn, shards=shards,
              console=console_lib.Console(enabled=lead, shown=objective.console_metrics),
              ckpt=checkpointing.Checkpointer(workdir, config.checkpoint),
              iterator=data_lib.make_train_iterator(config, prepared, rows=rows), rows=rows,
              lead=lead, table=table,
              n_params=sum(x.size for x in jax.tree.leaves(nn.unbox(boxed.params))),
              programs=_program_key(config, tables))


def _program_key(config: ml_collections.ConfigDict, tables: masking.VocabTables) -> str:
  """A digest of everything a pretraining run's compiled steps depend on besides the mesh
  and the phase: the whole config and the vocabulary tables the corruption reads."""
  h = hashlib.sha256(config.to_json_best_effort(sort_keys=True).encode('utf-8'))
  for a in (tables.is_special_V, tables.is_word_start_V, tables.unigram_counts_V):
    h.update(np.ascontiguousarray(a).tobytes())
  h.update(str(tables.mask_id).encode('utf-8'))
  return h.hexdigest()


def _restore(run: _Run):
  """The newest restorable checkpoint (params, opt_state, data_state, step), or None; its
  data state is applied to the iterator. Then, every refusal behind us, the workdir is
  written: pinned tokenizer, config, parameter table."""
  restored = run.ckpt.restore(abstract_state(run.config, run.mesh, run.objective))
  if restored is not None and restored[2]:
    try:  # The data state must fit this config too, before anything is written.
      run.iterator.set_state(restored[2])
    except ValueError as e:
      raise checkpointing.CheckpointError(
          f'checkpoint step {restored[3]} in {checkpointing.checkpoint_dir(run.workdir)}: its '
          f'data-iterator state ({restored[3]}/data) does not fit this config: {e}') from e
  if run.lead:
    workdir_lib.pin_tokenizer(run.workdir, run.prepared.tokenizer, run.prepared.unigram_counts)
    workdir_lib.write_config(run.workdir, run.config)
    workdir_lib.path(run.workdir, PARAMETERS_TXT).write_text(run.table + '\n')
  return restored


def _header(run: _Run, restored) -> None:
  """The console's header: what runs, on what, with which data, from where."""
  config, out, prepared = run.config, run.console, run.prepared
  m_cfg, train_split = config.model, prepared.manifest['splits']['train']
  out.say(f'encoder_jax: pretraining {m_cfg.kind} ({m_cfg.num_layers} x {m_cfg.hidden_size}, '
          f'{run.n_params:,} parameters; table in '
          f'{workdir_lib.path(run.workdir, PARAMETERS_TXT)}) '
          f'with {" + ".join(config.objective.names)} in {run.workdir}')
  out.say(f'  mesh {dict(run.mesh.shape)} over {jax.device_count()} x '
          f'{jax.devices()[0].device_kind}; batch {config.train.batch_size}; phases '
          + ', '.join(f'{p.end_step - p.start_step} steps at {p.seq_len}' for p in run.phases))
  out.say(f'  data {prepared.directory}: {train_split["documents"]:,} documents, '
          f'{train_split["tokens"]:,} tokens; {prepared.tokenizer.kind} tokenizer, '
          f'{prepared.tokenizer.vocab_size:,} pieces')
  cache = _cache_in_use()
  out.say(f'  compiled programs cached in {cache}' if cache else
          '  no compilation cache (config.train.compilation_cache_dir)')
  for step_aside, reason, where in getattr(run.ckpt, 'set_aside', []):
    out.say(f'  checkpoint step {step_aside} is damaged ({reason}); set aside in {where}')
  if restored is not None:
    out.say(f'  resuming from checkpoint step {restored[3]}' + (
        f' (the run started from {run.source.description}: {INIT_REPORT})'
        if run.source is not None else ''))
  elif run.source is None:
    out.say('  starting from scratch')


def _state(run: _Run, restored) -> TrainState:
  """A fresh sharded state (from the source's weights when there is one), or the restored
  one (with the setup's extra state)."""
  if restored is None and run.source is not None:
    params, report = train_state.start_params(run.config, run.objective, run.source)
    for line in train_state.report_lines(report):
      run.console.say('  ' + line)
    run.console.say(f'  report in {workdir_lib.path(run.workdir, INIT_REPORT)}')
    if run.lead:
      workdir_lib.path(run.workdir, INIT_REPORT).write_text(json.dumps(report, indent=2) + '\n')
    # Global arrays from the host copy every process holds (any mesh, any process count).
    params = jax.tree.map(lambda x, s: jax.make_array_from_callback(
        np.shape(x), s, lambda index, x=x: np.asarray(x)[index]), params, run.shards.params)
    return create_train_state(run.config, run.mesh, params=params, setup=run.objective,
                              tx=run.tx)
  if restored is None:
    return create_train_state(run.config, run.mesh, setup=run.objective, tx=run.tx)
  params, opt_state, _, step = restored
  extra = run.ckpt.restored_extra  # None: the setup carries none, or the checkpoint has none.
  if extra is None:
    extra = train_state.initial_extra(run.config, run.mesh, run.objective, run.shards)
  return TrainState(step=jax.device_put(jnp.int32(step), run.shards.step), params=params,
                    opt_state=opt_state, extra=extra)


class _PretrainingHooks:
  """Pretraining's loop: length phases, held-out MLM every ``train.eval_every_steps``,
  metrics every ``train.log_every_steps``, checkpoints every ``checkpoint.every_steps``."""

  def __init__(self, run: _Run, writer):
    self.run, self.writer, self.t = run, writer, run.config.train
    self.eval_fns: dict[int, Any] = {}
    self.eval_sets: dict[int, list] = {}

  def phase_at(self, step: int):
    return length_phases.phase_at(self.run.phases, step)

  def make_step(self, phase):
    run = self.run
    return _reused(('train', run.programs, run.mesh, phase), lambda: make_train_step(
        run.config, run.objective, run.tx, run.schedule_fn, run.mesh, run.shards, phase))

  def check_batch(self, step: int, batch, phase) -> None:
    if batch['input_ids'].shape[1] != phase.seq_len:
      raise RuntimeError(f'Step {step}: the data iterator gave length '
                         f'{batch["input_ids"].shape[1]}, phase {phase.index} needs '
                         f'{phase.seq_len}')

  def eval_set(self, phase):
    """The held-out batches at a phase's length: built once, the same at every eval."""
    if phase.index not in self.eval_sets:
      self.eval_sets[phase.index] = list(data_lib.make_eval_iterator(
          self.run.config, self.run.prepared, phase.seq_len, rows=self.run.rows))
    return self.eval_sets[phase.index]

  def log_now(self, step: int, data_state) -> bool:
    del data_state
    return step % self.t.log_every_steps == 0

  def save_now(self, step: int, data_state) -> bool:
    del data_state
    return step % self.run.ckpt.every_steps == 0

  def evaluate(self, step: int, state, phase, data_state) -> bool:
    del data_state
    t, run = self.t, self.run
    if not t.eval_every_steps or (step % t.eval_every_steps and step != t.num_steps):
      return False
    if phase.index not in self.eval_fns:
      self.eval_fns[phase.index] = _reused(
          ('eval', run.programs, run.mesh, phase), lambda: make_eval_step(
              run.config, run.objective, run.mesh, run.shards.params, phase))
    held_out = evaluate(self.eval_fns[phase.index], state.params, self.eval_set(phase),
                        run.mesh, run.objective, t.batch_size)
    self.writer.write(step, held_out, prefix='eval')
    run.console.metrics(step, t.num_steps, held_out, 'eval')
    return True


def _loop(run: _Run, state, preempted: 'Preempted', writer, flusher: MetricsFlusher) -> int:
  """Steps until ``train.num_steps`` or preemption: train, log, evaluate, save. The step
  reached."""
  t = run.config.train
  hooks = _PretrainingHooks(run, writer)
  step = int(jax.device_get(state.step))
  if t.eval_every_steps:  # An unusable held-out split fails now, not mid-run.
    hooks.eval_set(length_phases.phase_at(run.phases, step))
  profile = None
  if t.get('profile_steps', 0) and run.lead:  # One host's trace: every host runs the same.
    profile = ProfileWindow(t.profile_first_step, t.profile_steps, run.workdir, run.console)
  loop = Loop(hooks=hooks, iterator=run.iterator, num_steps=int(t.num_steps),
              batch_size=int(t.batch_size), mesh=run.mesh, flusher=flusher,
              console=run.console, ckpt=run.ckpt, workdir=run.workdir, profile=profile)
  _, step, _ = drive(loop, state, preempted)
  return step


def _summary(run: _Run, step: int, flusher: MetricsFlusher) -> None:
  """The closing lines: where things are and what to run next; dropped updates warned."""
  out = run.console
  if step >= run.config.train.num_steps:
    out.say(f'done: step {step} in {out.elapsed()}; checkpoints in '
            f'{checkpointing.checkpoint_dir(run.workdir)}, metrics in '
            f'{workdir_lib.path(run.workdir, "metrics.jsonl")}. Next:')
    for command in console_lib.next_commands(run.workdir):
      out.say(f'  {command}')
  warn_skipped(flusher)


