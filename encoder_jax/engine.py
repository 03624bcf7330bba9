"""The training engine: the train step, the loop, preemption and the metrics flusher.

What is trained (a ``trainable.Trainable``: pretraining's objectives, a fine-tuning task)
and when it logs, evaluates and saves (the hooks) are the callers'; everything else about a
run is here.
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from encoder_jax import checkpointing
from encoder_jax import console as console_lib
from encoder_jax import feeding
from encoder_jax import goodput
from encoder_jax import length_phases
from encoder_jax import metrics_log as metrics_lib
from encoder_jax import sharding
from encoder_jax import train_state

TrainState = train_state.TrainState
_TRAIN = train_state.TRAIN


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
  profile: goodput.ProfileWindow | None = None  # A trace of a few steps (config.train.profile_steps).


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


def drive(loop: Loop, state, preempted: Preempted) -> tuple[Any, int, bool]:
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


def warn_skipped(flusher: MetricsFlusher) -> None:
  """A run's closing warning when the 'skip' policy dropped updates."""
  if flusher.skipped:
    logging.warning(
        '%d of the %d updates run in this session had a non-finite loss or gradient and were '
        "dropped (%s='skip')%s.", flusher.skipped, flusher.run_steps, flusher.policy_key,
        ': most of the run did not train; lower config.optim.learning_rate' if
        flusher.skipped * 2 > flusher.run_steps else '')


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
