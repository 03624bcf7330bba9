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

import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import signal
import tempfile
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.experimental.compilation_cache import compilation_cache as jax_cache

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

PARAMETERS_TXT = 'parameters.txt'  # The full parameter table (shapes, logical/mesh specs).
INIT_REPORT = 'init_report.json'  # What a run started from a source took and initialised.
COMPILATION_CACHE = 'compilation_cache'  # compilation_cache_dir='auto' without JAX's own.
PROFILE_DIR = 'profile'  # jax.profiler traces: profile/plugins/profile/<run>/<host>.xplane.pb
TrainState = train_state.TrainState
state_shardings = train_state.state_shardings
abstract_state = train_state.abstract_state
create_train_state = train_state.create_train_state
_INIT, _TRAIN, _EVAL = train_state.INIT, train_state.TRAIN, train_state.EVAL


def make_train_step(config, objective, tx, schedule_fn, mesh, shards, phase: length_phases.Phase):
  """A jitted ``(state, batch) -> (state, metrics)`` for one sequence-length phase."""
  accum = int(config.train.grad_accum_steps)
  skip_nonfinite = config.train.nonfinite_policy == 'skip'
  base_key = jax.random.fold_in(jax.random.key(config.seed), _TRAIN)
  # ``extra``: the setup's non-trained state carried across steps (None for most setups),
  # one row per batch row, read and renewed by ``stateful_loss_fn``.
  grad_fn = jax.value_and_grad(objective.stateful_loss_fn, has_aux=True)

  def micro_step(params, extra, batch, rng):
    # Traced under the step's mesh (abstract: axis names and sizes), which the kernels that
    # must be placed explicitly read (splash attention's shard_map); nothing else reads it.
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      (_, (m, extra)), g = grad_fn(params, extra, batch, rng, phase, True)
    return (g, m), extra

  def step_fn(state: TrainState, batch):
    rng = jax.random.fold_in(base_key, state.step)
    if accum == 1:
      (grads, m), extra = micro_step(state.params, state.extra, batch, rng)
    else:
      # Micro-batch i takes rows i, i+A, i+2A, ...: every device keeps its share of each.
      split = lambda tree: jax.tree.map(
          lambda x: x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1), tree)
      micro, micro_extra = split(batch), split(state.extra)
      first = lambda tree: jax.tree.map(lambda x: x[0], tree)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), jax.eval_shape(
          micro_step, state.params, first(micro_extra), first(micro), rng)[0])

      def body(carry, xs):
        i, mb, me = xs
        out, extra = micro_step(state.params, me, mb, jax.random.fold_in(rng, i))
        return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), carry, out), extra

      (grads, m), extra = jax.lax.scan(body, zeros, (jnp.arange(accum), micro, micro_extra))
      extra = jax.tree.map(  # Back to rows i, i+A, ... of micro-batch i.
          lambda x: x.swapaxes(0, 1).reshape(-1, *x.shape[2:]), extra)
      grads, m = jax.tree.map(lambda x: x / accum, (grads, m))
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(m['loss']) & jnp.isfinite(grad_norm)
    if skip_nonfinite:  # Drop the update; the batch still counts as consumed.
      keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
      params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
      extra = keep(extra, state.extra)
    m = dict(m, grad_norm=grad_norm, learning_rate=schedule_fn(state.step),
             nonfinite=1.0 - finite.astype(jnp.float32))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state, extra=extra), m

  return jax.jit(step_fn, in_shardings=(shards, sharding.batch_sharding(mesh)),
                 out_shardings=(shards, None), donate_argnums=(0,))


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


class PreemptedError(RuntimeError):
  """A command of several runs (the bake-off, the probe, GLUE) stopped because one of its
  runs was preempted (SIGTERM): what finished is kept, and the message says what a rerun of
  the same command does. A single run (``encoder_jax.main``, ``finetune.main``) is not an
  error when preempted: it saves, says so and exits 0."""


class Preempted:
  """Tells the loop when to save and exit because the machine is being preempted.

  One process: our SIGTERM handler (how TPU VMs are preempted) sets a flag. Several
  processes must agree on the step, or they would enter the collective save at different
  steps: JAX's preemption service (started by ``jax.distributed.initialize``) hears the
  signal and ``reached_preemption_sync_point`` says the same step on every host.
  """

  def __init__(self):
    self._requested = False
    self._previous = None

  def at(self, step: int) -> bool:
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      return multihost_utils.reached_preemption_sync_point(step)
    return self._requested

  def __enter__(self):
    if jax.process_count() > 1:
      return self  # JAX's preemption service owns SIGTERM.
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # Not the main thread: no handler, nothing to restore.
      self._previous = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning('SIGTERM received: saving a checkpoint after the current step.')
    self._requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def compilation_cache_dir(setting: str, workdir: str | None) -> str | None:
  """The persistent compilation cache a run uses (None: none), from its
  ``compilation_cache_dir`` setting: a directory (local or ``gs://``) is that one, '' is none,
  and 'auto' is the one JAX is already given (``JAX_COMPILATION_CACHE_DIR``, or
  ``jax_compilation_cache_dir`` set by the caller; ``JAX_ENABLE_COMPILATION_CACHE=false``:
  none), else ``<workdir>/compilation_cache``, beside the checkpoints a restart reads."""
  if setting != 'auto':
    return (setting if '://' in setting else os.path.abspath(setting)) if setting else None
  if not jax.config.jax_enable_compilation_cache:
    return None
  if jax.config.jax_compilation_cache_dir:
    return jax.config.jax_compilation_cache_dir
  return str(workdir_lib.path(workdir, COMPILATION_CACHE)) if workdir else None


def _cache_in_use() -> str | None:
  return (jax.config.jax_compilation_cache_dir or None
          if jax.config.jax_enable_compilation_cache else None)


def _use_cache(directory: str | None, enabled: bool) -> None:
  jax.config.update('jax_compilation_cache_dir', directory)
  jax.config.update('jax_enable_compilation_cache', enabled)
  jax_cache.reset_cache()  # JAX opens its cache once: the next compile opens this one.


@contextlib.contextmanager
def compilation_cache(setting: str, workdir: str | None):
  """JAX's persistent compilation cache set to :func:`compilation_cache_dir` for the
  duration (enter before the run's first compile); the process's own setting is back
  after. Yields the directory (None: no cache). JAX caches the programs that took at least
  ``jax_persistent_cache_min_compile_time_secs`` (1 s unless the environment says) to
  compile, and only process 0 writes; a hit is the same executable, bit for bit."""
  want, before = compilation_cache_dir(setting, workdir), (
      jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache)
  change = want != _cache_in_use()
  if change:
    _use_cache(want or before[0], bool(want))
    logging.info('Persistent compilation cache: %s', want or 'off')
  try:
    yield want
  finally:
    if change:
      _use_cache(*before)


class ProfileWindow:
  """A ``jax.profiler`` trace of a few steps, ``count`` from step ``first`` (the numbering
  of metrics.jsonl), into ``<workdir>/profile`` (TensorBoard's profile plugin and xprof
  read ``plugins/profile/<run>/*.xplane.pb`` there). The trace starts just before a step
  whose program already ran in this process (else one step later: no compile traced), and
  only in a session that starts at or before ``first`` (a run resumed past it traces no
  more); it stops after the window's last step, blocked on its outputs, or when the loop
  ends early (preemption, failure). A ``gs://`` workdir gets the trace copied in."""

  def __init__(self, first: int, count: int, workdir: str, console: console_lib.Console):
    self.first, self.count, self.console = int(first), int(count), console
    self.target = workdir_lib.path(workdir, PROFILE_DIR)
    self.remote = '://' in str(self.target)
    self.start_step = self.last_step = None  # Of the trace running now.
    self.session_first = None  # The first step this session runs (set by the first call).
    self.log_dir, self.earlier = '', set()

  def before(self, step: int, compiled: bool) -> None:
    """Called before the update that produces ``step``; ``compiled``: its program ran."""
    if self.session_first is None:
      self.session_first = step
    if (self.start_step is not None or self.log_dir or step < self.first or not compiled
        or self.session_first > self.first):
      return
    self.log_dir = (tempfile.mkdtemp(prefix='encoder_jax_profile_') if self.remote
                    else str(self.target))
    self.earlier = set(self._runs())
    try:
      jax.profiler.start_trace(self.log_dir)
    except RuntimeError as e:  # Another trace runs (started by the caller): leave it.
      logging.warning('No profile of steps from %d: %s', step, e)
      return
    self.start_step, self.last_step = step, step + self.count - 1

  def after(self, step: int, outputs) -> bool:
    """Called after the update that produced ``step``; True when it stopped the trace."""
    if self.start_step is None or step < self.last_step:
      return False
    jax.block_until_ready(outputs)  # The window holds the steps' execution, not dispatch.
    self.stop(step)
    return True

  def _runs(self) -> list[pathlib.Path]:
    runs = pathlib.Path(self.log_dir, 'plugins', 'profile')
    return [d for d in runs.iterdir() if d.is_dir()] if runs.is_dir() else []

  def stop(self, step: int) -> None:
    """Ends the trace (if one runs) after ``step`` and says where it is."""
    if self.start_step is None:
      return
    start, self.start_step = self.start_step, None
    jax.profiler.stop_trace()
    newest = max(set(self._runs()) - self.earlier or self._runs(), key=lambda d: d.name)
    where = self.target.joinpath('plugins', 'profile', newest.name)
    if self.remote:
      for f in (f for f in newest.rglob('*') if f.is_file()):
        dest = where.joinpath(*f.relative_to(newest).parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.read_bytes())
      shutil.rmtree(self.log_dir, ignore_errors=True)
    self.console.say(f'profiled steps {start}-{step}: trace in {where}; view: xprof '
                     f'--logdir={self.target}, or tensorboard --logdir={self.target} with its '
                     'profile plugin (pip install xprof)')


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


# The jitted steps of this process's recent pretraining runs, by (kind, program key, mesh,
# phase): a run of the same config again in this process (a resume after a failure or a
# preemption, the reruns of a sweep) reuses the traced and compiled steps instead of
# tracing them anew. A few are kept (each holds its executable).
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_PROGRAMS_KEPT = 6


def _reused(key: tuple, build):
  if key not in _PROGRAMS:
    _PROGRAMS[key] = build()
    while len(_PROGRAMS) > _PROGRAMS_KEPT:
      _PROGRAMS.popitem(last=False)
  _PROGRAMS.move_to_end(key)
  return _PROGRAMS[key]


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


class MetricsFlusher:
  """Pending step metrics -> host: checked for non-finite values (the policy), averaged,
  timed (tokens/s, MFU), written and printed at each flush. The one non-finite check of
  every run: the loop flushes before every save, so no checkpoint holds a non-finite step.

  ``train``: the run's ``batch_size``, ``num_steps``, ``nonfinite_policy`` and
  ``peak_tflops_per_device``; ``ckpt``: None for a run kept in memory; ``policy_key``: the
  config key of the policy, named in the error."""

  def __init__(self, train: ml_collections.ConfigDict, objective, console, writer,
               ckpt: checkpointing.Checkpointer | None, workdir: str | None,
               policy_key: str = 'config.train.nonfinite_policy'):
    self.t, self.objective, self.console, self.writer = train, objective, console, writer
    self.ckpt, self.workdir, self.policy_key = ckpt, workdir, policy_key
    self.peak = metrics_lib.peak_tflops_per_device(train.get('peak_tflops_per_device', 0.0))
    self.pending: list[dict] = []
    self.last: dict[str, float] = {}
    self.timer_start, self.timer_steps = None, 0
    self.skipped = self.run_steps = 0  # Non-finite updates dropped (policy 'skip'), steps run.

  def add(self, metrics, state) -> None:
    """One step's (device) metrics; the first step after a (re)start starts the timer."""
    self.pending.append(metrics)
    if self.timer_start is None:
      jax.block_until_ready(state.step)
      self.timer_start, self.timer_steps = time.perf_counter(), 0
    else:
      self.timer_steps += 1

  def restart_timer(self) -> None:
    """After a compile, an evaluation or a save: time from the next step on."""
    self.timer_start = None

  def _check(self, bad: list[int]) -> None:
    """The non-finite policy: 'stop' raises, naming the last good checkpoint."""
    if not bad or self.t.nonfinite_policy != 'stop':
      return
    good = self.ckpt.latest_step() if self.ckpt is not None else None
    raise FloatingPointError(
        f'Non-finite loss or gradient at step {bad[0]} (its logged metrics; step '
        f'{bad[0] - 1} was finite); stopping. ' + (
            f'Last good checkpoint: step {good} in '
            f'{checkpointing.checkpoint_dir(self.workdir)}; rerun to resume from it (e.g. '
            f'with a lower config.optim.learning_rate), or set {self.policy_key}=\'skip\'.'
            if good is not None else
            'No checkpoint was saved yet. Lower config.optim.learning_rate or set '
            f"{self.policy_key}='skip'."))

  def flush(self, step: int, phase, state) -> None:
    if not self.pending:
      return
    t = self.t
    host = jax.device_get(self.pending)
    # host[i] holds the metrics of the update that produced step (step - len(host) + i + 1),
    # the step number it is logged under.
    bad = [step - len(host) + i + 1 for i, m in enumerate(host) if m['nonfinite']]
    self._check(bad)
    self.skipped += len(bad)
    self.run_steps += len(host)
    last = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
    last['nonfinite'] = float(sum(m['nonfinite'] for m in host))
    if self.timer_start is not None and self.timer_steps:  # Steps since the timer started.
      jax.block_until_ready(state.step)
      dt = (time.perf_counter() - self.timer_start) / self.timer_steps
      flops = self.objective.flops_per_sequence(phase) * t.batch_size
      last.update(step_time_s=dt, tokens_per_s=t.batch_size * phase.seq_len / dt,
                  model_tflops_per_s_per_device=flops / dt / 1e12 / jax.device_count())
      if self.peak:
        last['mfu'] = last['model_tflops_per_s_per_device'] / self.peak
    self.writer.write(step, last)
    eta = (t.num_steps - step) * last['step_time_s'] if 'step_time_s' in last else None
    self.console.metrics(step, t.num_steps, last, 'train', eta)
    self.last, self.pending = last, []
    self.timer_start, self.timer_steps = time.perf_counter(), 0


@dataclasses.dataclass
class Loop:
  """What every training run's loop works with; :func:`drive` runs it. What differs
  between runs (pretraining's length phases and held-out MLM, fine-tuning's epochs and task
  scores) is the ``hooks`` object's:

  * ``phase_at(step)`` -> the ``length_phases.Phase`` of the step;
  * ``make_step(phase)`` -> the jitted ``(state, batch) -> (state, metrics)`` of a phase;
  * ``check_batch(step, batch, phase)``: raises on a batch that does not fit the phase;
  * ``log_now(step, data_state)``, ``save_now(step, data_state)`` -> bool: whether to
    flush the metrics, or save a checkpoint, after this step (the last step always does);
  * ``evaluate(step, state, phase, data_state)`` -> bool: evaluates if it is time (True
    when it did).
  """
  hooks: Any
  iterator: Any  # next() -> host batch; get_state / set_state: the checkpointed position.
  num_steps: int
  # Global rows of a batch (each process feeds its share); None: every process's rows side
  # by side (one process: its batch).
  batch_size: int | None
  mesh: jax.sharding.Mesh
  flusher: MetricsFlusher
  console: console_lib.Console
  ckpt: checkpointing.Checkpointer | None  # None: a run kept in memory (nothing saved).
  workdir: str | None
  position: Any = None  # The data state after the last step taken (drive sets it).
  profile: ProfileWindow | None = None  # A trace of a few steps (config.train.profile_steps).


def _after_step(loop: Loop, step: int, phase, state, data_state, stop: bool) -> None:
  """Log, evaluate and save as the hooks say; the metrics are flushed (and checked for
  non-finite values) before every save, the one on preemption included."""
  hooks, flusher = loop.hooks, loop.flusher
  end = step == loop.num_steps
  if hooks.log_now(step, data_state) or end:
    flusher.flush(step, phase, state)
  if hooks.evaluate(step, state, phase, data_state):
    flusher.restart_timer()
  if hooks.save_now(step, data_state) or end or stop:
    flusher.flush(step, phase, state)  # Never save over a non-finite step.
    if loop.ckpt is not None:
      loop.ckpt.save(step, state, data_state)
      loop.console.say(f'saving step {step} in {checkpointing.checkpoint_dir(loop.workdir)}')
    flusher.restart_timer()


def drive(loop: Loop, state, preempted: 'Preempted') -> tuple[Any, int, bool]:
  """Steps from ``state.step`` until ``loop.num_steps`` or preemption: train, log,
  evaluate, save. Returns (state, the step reached, whether preempted)."""
  out, flusher = loop.console, loop.flusher
  step = int(jax.device_get(state.step))
  loop.position = loop.iterator.get_state()
  if preempted.at(step):
    out.say(f'Preempted before step {step + 1}: nothing new to save, exiting; rerun the same '
            'command to resume.')
    return state, step, True
  step_fns: dict[int, Any] = {}
  ran: set[int] = set()  # Phases whose step ran in this session: compiled.
  feed = feeding.Prefetcher(loop.iterator)
  batch_shard = sharding.batch_sharding(loop.mesh)
  try:
    while step < loop.num_steps:
      phase = loop.hooks.phase_at(step)
      if phase.index not in step_fns:  # A new phase compiles a new step: time from after it.
        flusher.flush(step, loop.hooks.phase_at(max(step - 1, 0)), state)
        step_fns[phase.index] = loop.hooks.make_step(phase)
        flusher.restart_timer()
      batch, data_state = next(feed)
      loop.hooks.check_batch(step, batch, phase)
      if loop.profile is not None:
        loop.profile.before(step + 1, compiled=phase.index in ran)
      with jax.profiler.StepTraceAnnotation('train', step_num=step + 1):
        state, m = step_fns[phase.index](state, feeding.to_global(batch, batch_shard,
                                                                  loop.batch_size))
      step, loop.position = step + 1, data_state
      ran.add(phase.index)
      flusher.add(m, state)
      if loop.profile is not None and loop.profile.after(step, (state, m)):
        flusher.restart_timer()  # Writing the trace is no step's time.
      stop = preempted.at(step)
      _after_step(loop, step, phase, state, data_state, stop)
      if stop:
        out.say(f'Preempted at step {step}: checkpoint saved, exiting; rerun the same '
                'command to resume.')
        return state, step, True
  finally:
    feed.close()
    if loop.profile is not None:  # Preempted or failed inside the window: the trace so far.
      try:
        loop.profile.stop(step)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning('Could not write the profile trace: %s', e)
  return state, step, False


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


def warn_skipped(flusher: MetricsFlusher) -> None:
  """A run's closing warning when the 'skip' policy dropped updates."""
  if flusher.skipped:
    logging.warning(
        '%d of the %d updates run in this session had a non-finite loss or gradient and were '
        "dropped (%s='skip')%s.", flusher.skipped, flusher.run_steps, flusher.policy_key,
        ': most of the run did not train; lower config.optim.learning_rate' if
        flusher.skipped * 2 > flusher.run_steps else '')
