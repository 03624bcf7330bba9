"""The training loop: ``train_and_evaluate(config, workdir)``.

It never names a model variant or an objective: the objective registry turns the config
into a pretraining setup (``objectives.build``) that owns the networks, their init and one
``loss_fn(params, batch, rng, phase, train)``, differentiated here. State is
born sharded (``eval_shape`` -> shardings -> ``jit(init, out_shardings=...)``), masks are
drawn on device from ``fold_in(key, step)``, and every ``checkpoint.every_steps`` the
params, optimizer state and data-iterator state are saved together.
"""

from __future__ import annotations

import signal
import time
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
from encoder_jax import metrics as metrics_lib
from encoder_jax import objectives
from encoder_jax import optimizer as optimizer_lib
from encoder_jax import schedule
from encoder_jax import sharding
from encoder_jax import train_state
from encoder_jax import validation
from encoder_jax import workdir as workdir_lib
from encoder_jax.models import registry as models
from encoder_jax.objectives import masking

PARAMETERS_TXT = 'parameters.txt'  # The full parameter table (shapes, logical/mesh specs).
TrainState = train_state.TrainState
state_shardings = train_state.state_shardings
abstract_state = train_state.abstract_state
create_train_state = train_state.create_train_state
_INIT, _TRAIN, _EVAL = train_state.INIT, train_state.TRAIN, train_state.EVAL


def make_train_step(config, objective, tx, schedule_fn, mesh, shards, phase: schedule.Phase):
  """A jitted ``(state, batch) -> (state, metrics)`` for one sequence-length phase."""
  accum = int(config.train.grad_accum_steps)
  skip_nonfinite = config.train.nonfinite_policy == 'skip'
  base_key = jax.random.fold_in(jax.random.key(config.seed), _TRAIN)
  # ``extra``: the setup's non-trained state carried across steps (None for most setups),
  # one row per batch row, read and renewed by ``stateful_loss_fn``.
  grad_fn = jax.value_and_grad(objective.stateful_loss_fn, has_aux=True)

  def micro_step(params, extra, batch, rng):
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


def make_eval_step(config, objective, mesh, param_shardings, phase: schedule.Phase):
  """A jitted ``(params, batch, index) -> metrics``: fixed masks, no dropout."""
  base_key = jax.random.fold_in(jax.random.key(config.seed), _EVAL)

  def step_fn(params, batch, index):
    _, m = objective.loss_fn(params, batch, jax.random.fold_in(base_key, index), phase, False)
    return m

  return jax.jit(step_fn, in_shardings=(param_shardings, sharding.batch_sharding(mesh), None))


def evaluate(eval_step, params, eval_batches, mesh, objective) -> dict[str, float]:
  """Held-out metrics over a finite iterator of host batches.

  A metric named in the objective's ``metric_weights`` is a mean over a per-batch count and
  is weighted by it (MLM loss and accuracy per predicted token); counts are summed; other
  metrics are means over batches. The objective then adds what it derives (perplexity).
  """
  metric_weights = objective.metric_weights
  per_batch = [jax.device_get(eval_step(
      params, feeding.to_global(batch, sharding.batch_sharding(mesh)), i))
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


def validate(config: ml_collections.ConfigDict, mesh) -> tuple[schedule.Phase, ...]:
  """Checks the config fields that only make sense together; returns the phases."""
  t = config.train
  phases = schedule.phases(t)
  if t.nonfinite_policy not in ('stop', 'skip'):
    raise ValueError(f'config.train.nonfinite_policy={t.nonfinite_policy!r}; expected "stop" '
                     'or "skip"')
  if t.grad_accum_steps < 1 or t.batch_size % t.grad_accum_steps:
    raise ValueError(f'config.train.batch_size={t.batch_size} must be divisible by '
                     f'grad_accum_steps={t.grad_accum_steps} (>= 1)')
  sharding.check_batch(t.batch_size // t.grad_accum_steps, mesh,
                       'config.train.batch_size / grad_accum_steps')
  if t.batch_size % jax.process_count():
    raise ValueError(f'config.train.batch_size={t.batch_size} is not divisible by the '
                     f'{jax.process_count()} processes')
  longest = max(p.seq_len for p in phases)
  model = models.make_config(config.model)
  if longest > model.max_length:
    raise ValueError(f'config.train.seq_lens has {longest} > the {model.max_length} positions of '
                     f'model.max_position_embeddings={model.max_position_embeddings}'
                     + (f' - position_offset={model.position_offset}'
                        if model.position_offset else ''))
  return phases


def vocab_tables(config, prepared) -> masking.VocabTables:
  return objectives.vocab_tables(config, prepared.tokenizer, prepared.unigram_counts,
                                 str(prepared.directory))


class _Preempted:
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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Pretrains (or resumes) in ``workdir``; returns the last logged training metrics.

  Every config value and the workdir are checked before any work; the workdir is locked
  against a second run; a resume whose config changes what a checkpoint depends on is
  refused before anything in the workdir is written.
  """
  validation.validate(config)
  workdir_lib.check_workdir_writable(workdir)
  # SIGTERM (preemption) is heard from the start: during preparation, restore or compile
  # it ends the run cleanly before its first step instead of killing it.
  with workdir_lib.run_lock(workdir), _Preempted() as preempted:
    return _train_and_evaluate(config, workdir, preempted)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        preempted: '_Preempted') -> dict[str, float]:
  mesh = sharding.make_mesh(config.mesh)
  phases = validate(config, mesh)
  for change in workdir_lib.check_resume_config(workdir, config):
    logging.warning('Resuming with a changed config: %s', change)
  prepared = data_lib.load_or_prepare(config)
  tx = optimizer_lib.make(config)
  objective = objectives.build(config, vocab_tables(config, prepared))
  schedule_fn = optimizer_lib.learning_rate_schedule(config.optim, int(config.train.num_steps))
  boxed, shards = state_shardings(config, mesh, objective, tx)
  lead = jax.process_index() == 0
  out = console_lib.Console(enabled=lead, shown=objective.console_metrics)
  if lead:
    workdir_lib.check_pinned_tokenizer(workdir, prepared.tokenizer)  # May refuse: nothing written.
  table = sharding.describe(boxed.params, mesh)
  logging.info('Mesh %s; parameters:\n%s', dict(mesh.shape), table)
  n_params = sum(x.size for x in jax.tree.leaves(nn.unbox(boxed.params)))

  ckpt = checkpointing.Checkpointer(workdir, config.checkpoint)
  iterator = data_lib.make_train_iterator(config, prepared, jax.process_index(),
                                          jax.process_count())
  restored = ckpt.restore(abstract_state(config, mesh, objective))
  if restored is not None and restored[2]:
    try:  # The data state must fit this config too, before anything is written.
      iterator.set_state(restored[2])
    except ValueError as e:
      raise checkpointing.CheckpointError(
          f'checkpoint step {restored[3]} in {checkpointing.checkpoint_dir(workdir)}: its '
          f'data-iterator state ({restored[3]}/data) does not fit this config: {e}') from e
  if lead:  # Every refusal is behind us: now the workdir may be written.
    workdir_lib.pin_tokenizer(workdir, prepared.tokenizer, prepared.unigram_counts)
    workdir_lib.write_config(workdir, config)
    workdir_lib.path(workdir, PARAMETERS_TXT).write_text(table + '\n')
  m_cfg, train_split = config.model, prepared.manifest['splits']['train']
  out.say(f'encoder_jax: pretraining {m_cfg.kind} ({m_cfg.num_layers} x {m_cfg.hidden_size}, '
          f'{n_params:,} parameters; table in {workdir_lib.path(workdir, PARAMETERS_TXT)}) '
          f'with {" + ".join(config.objective.names)} in {workdir}')
  out.say(f'  mesh {dict(mesh.shape)} over {jax.device_count()} x {jax.devices()[0].device_kind}'
          f'; batch {config.train.batch_size}; phases '
          + ', '.join(f'{p.end_step - p.start_step} steps at {p.seq_len}' for p in phases))
  out.say(f'  data {prepared.directory}: {train_split["documents"]:,} documents, '
          f'{train_split["tokens"]:,} tokens; {prepared.tokenizer.kind} tokenizer, '
          f'{prepared.tokenizer.vocab_size:,} pieces')
  for step_aside, reason, where in getattr(ckpt, 'set_aside', []):
    out.say(f'  checkpoint step {step_aside} is damaged ({reason}); set aside in {where}')
  if restored is None:
    state = create_train_state(config, mesh, setup=objective, tx=tx)
    out.say('  starting from scratch')
  else:
    params, opt_state, data_state, step = restored
    extra = ckpt.restored_extra  # None: the setup carries none, or the checkpoint has none.
    if extra is None:
      extra = train_state.initial_extra(config, mesh, objective, shards)
    state = TrainState(step=jax.device_put(jnp.int32(step), shards.step), params=params,
                       opt_state=opt_state, extra=extra)
    out.say(f'  resuming from checkpoint step {step}')

  writer = metrics_lib.MetricWriter(workdir, enabled=lead,
                                    resume_step=0 if restored is None else restored[3])
  peak = metrics_lib.peak_tflops_per_device(config.train.peak_tflops_per_device)
  step_fns: dict[int, Any] = {}
  eval_fns: dict[int, Any] = {}
  eval_sets: dict[int, list] = {}

  def eval_set(phase):
    """The held-out batches at a phase's length: built once, the same at every eval."""
    if phase.index not in eval_sets:
      eval_sets[phase.index] = list(data_lib.make_eval_iterator(
          config, prepared, phase.seq_len, jax.process_index(), jax.process_count()))
    return eval_sets[phase.index]

  if config.train.eval_every_steps:  # An unusable held-out split fails now, not mid-run.
    eval_set(schedule.phase_at(phases, int(jax.device_get(state.step))))
  feed = feeding.Prefetcher(iterator)
  batch_shard = sharding.batch_sharding(mesh)
  t = config.train
  step = int(jax.device_get(state.step))
  data_state: dict = {}
  pending: list[dict] = []
  last: dict[str, float] = {}
  timer_start, timer_steps = None, 0
  skipped, run_steps = 0, 0  # Non-finite updates dropped (policy 'skip'), steps run here.

  def flush_metrics(phase):
    """Pulls pending step metrics to the host, checks them, logs their mean."""
    nonlocal pending, timer_start, timer_steps, last, skipped, run_steps
    if not pending:
      return
    host = jax.device_get(pending)
    # host[i] holds the metrics of the update that produced step (step - len(host) + i + 1),
    # the step number it is logged under.
    bad = [step - len(host) + i + 1 for i, m in enumerate(host) if m['nonfinite']]
    if bad and t.nonfinite_policy == 'stop':
      good = ckpt.latest_step()
      raise FloatingPointError(
          f'Non-finite loss or gradient at step {bad[0]} (its logged metrics; step '
          f'{bad[0] - 1} was finite); stopping. ' + (
              f'Last good checkpoint: step {good} in {checkpointing.checkpoint_dir(workdir)}; '
              'rerun to resume from it (e.g. with a lower config.optim.learning_rate), or set '
              "config.train.nonfinite_policy='skip'." if good is not None else
              'No checkpoint was saved yet. Lower config.optim.learning_rate or set '
              "config.train.nonfinite_policy='skip'."))
    skipped += len(bad)
    run_steps += len(host)
    last = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
    last['nonfinite'] = float(sum(m['nonfinite'] for m in host))
    if timer_start is not None and timer_steps:  # Steps since the timer (re)started.
      jax.block_until_ready(state.step)
      dt = (time.perf_counter() - timer_start) / timer_steps
      flops = objective.flops_per_sequence(phase) * t.batch_size
      last.update(step_time_s=dt, tokens_per_s=t.batch_size * phase.seq_len / dt,
                  model_tflops_per_s_per_device=flops / dt / 1e12 / jax.device_count())
      if peak:
        last['mfu'] = last['model_tflops_per_s_per_device'] / peak
    writer.write(step, last)
    eta = (t.num_steps - step) * last['step_time_s'] if 'step_time_s' in last else None
    out.metrics(step, t.num_steps, last, 'train', eta)
    pending = []
    timer_start, timer_steps = time.perf_counter(), 0

  try:
    if preempted.at(step):
      out.say(f'Preempted before step {step + 1}: nothing new to save, exiting; rerun the same '
              'command to resume.')
    else:
      while step < t.num_steps:
        phase = schedule.phase_at(phases, step)
        if phase.index not in step_fns:  # A new phase compiles a new step: time from after it.
          flush_metrics(schedule.phase_at(phases, max(step - 1, 0)))
          step_fns[phase.index] = make_train_step(config, objective, tx, schedule_fn, mesh,
                                                  shards, phase)
          timer_start = None
        batch, data_state = next(feed)
        if batch['input_ids'].shape[1] != phase.seq_len:
          raise RuntimeError(f'Step {step}: the data iterator gave length '
                             f'{batch["input_ids"].shape[1]}, phase {phase.index} needs '
                             f'{phase.seq_len}')
        state, m = step_fns[phase.index](state, feeding.to_global(batch, batch_shard))
        step += 1
        pending.append(m)
        if timer_start is None:
          jax.block_until_ready(state.step)
          timer_start, timer_steps = time.perf_counter(), 0
        else:
          timer_steps += 1
        if step % t.log_every_steps == 0 or step == t.num_steps:
          flush_metrics(phase)
        if t.eval_every_steps and (step % t.eval_every_steps == 0 or step == t.num_steps):
          if phase.index not in eval_fns:
            eval_fns[phase.index] = make_eval_step(config, objective, mesh, shards.params, phase)
          held_out = evaluate(eval_fns[phase.index], state.params, eval_set(phase), mesh,
                              objective)
          writer.write(step, held_out, prefix='eval')
          out.metrics(step, t.num_steps, held_out, 'eval')
          timer_start = None
        stop = preempted.at(step)
        if step % ckpt.every_steps == 0 or step == t.num_steps or stop:
          flush_metrics(phase)  # Never save over a non-finite step.
          ckpt.save(step, state, data_state)
          out.say(f'saving step {step} in {checkpointing.checkpoint_dir(workdir)}')
          timer_start = None
        if stop:
          out.say(f'Preempted at step {step}: checkpoint saved, exiting; rerun the same '
                  'command to resume.')
          break
  finally:
    feed.close()
    ckpt.close()
    writer.close()
  if step >= t.num_steps:
    out.say(f'done: step {step} in {out.elapsed()}; checkpoints in '
            f'{checkpointing.checkpoint_dir(workdir)}, metrics in '
            f'{workdir_lib.path(workdir, "metrics.jsonl")}. Next:')
    for command in console_lib.next_commands(workdir):
      out.say(f'  {command}')
  if skipped:
    logging.warning(
        '%d of the %d updates run in this session had a non-finite loss or gradient and were '
        "dropped (config.train.nonfinite_policy='skip')%s.", skipped, run_steps,
        ': most of the run did not train; lower config.optim.learning_rate' if
        skipped * 2 > run_steps else '')
  return last

