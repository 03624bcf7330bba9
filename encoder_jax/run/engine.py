"""The training engine: one run, from a typed spec to a typed result.

:func:`run` owns everything a training run does around what it trains: the workdir lock,
preemption (SIGTERM), the persistent compilation cache, the mesh, the pieces of the run
(``steps.build``: optimizer, schedule, state shardings, train step), restore or start
(from scratch, or from pretrained parts by one rule, ``train_state.start_params``), the
loop (train, log, evaluate, save), the checkpoints, the profiler window and the closing
lines; it returns a :class:`Result`. What a run trains and reads is its adapter's
(``run/pretraining.py``: pretraining, ``finetune/train.py``: fine-tuning), handed over as a
:class:`Job`; when it logs, evaluates and saves, and what an evaluation is, are the job's
:class:`Hooks`. Its settings are one :class:`steps.RunSpec`, which each config schema makes
(``pretraining.spec``, ``finetune.train.spec``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import signal
import time
from typing import Any, Callable, NamedTuple, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from encoder_jax.run import checkpointing
from encoder_jax.run import console as console_lib
from encoder_jax.run import feeding
from encoder_jax.run import compilation_cache
from encoder_jax.run import profiler
from encoder_jax.core import length_phases
from encoder_jax.run import metrics_log as metrics_lib
from encoder_jax.core import sharding
from encoder_jax.run import steps
from encoder_jax.run import train_state
from encoder_jax.run import workdir as workdir_lib

TrainState = train_state.TrainState


class Due(NamedTuple):
  """What happens after a step (the last step always logs and saves)."""
  log: bool = False
  evaluate: bool = False
  save: bool = False


class Out(Protocol):
  """What an evaluation reports through: ``report(metrics, split)`` writes them to
  metrics.jsonl and the console; ``last`` holds the last logged training metrics;
  ``param_shardings``: where the params live (an evaluation step's input shardings)."""
  last: dict[str, float]
  param_shardings: Any

  def report(self, metrics: dict[str, float], split: str) -> None: ...


class Hooks(Protocol):
  """What differs between runs: which phase a step is in, when to log, evaluate and save,
  and what an evaluation is."""

  def phase_at(self, step: int) -> length_phases.Phase: ...

  def due(self, step: int, data_state: Any) -> Due: ...

  def evaluate(self, step: int, state: TrainState, phase: length_phases.Phase,
               data_state: Any, out: Out) -> None: ...


@dataclasses.dataclass(frozen=True)
class Start:
  """How the run starts, for its header: ``resumed`` (the checkpoint step) or ``parts``
  (a fresh start from pretrained parts: ``train_state.start_params``'s report), or neither
  (from scratch); ``set_aside``: damaged checkpoints moved out of the way."""
  resumed: int | None = None
  parts: dict | None = None
  set_aside: tuple = ()


@dataclasses.dataclass
class Job:
  """What an adapter hands the engine once the mesh exists."""
  trainable: Any  # trainable.Trainable: init, init_extra, losses, flops, metric weights.
  batches: Any  # next() -> host batch; get_state() / set_state(): the checkpointed position.
  hooks: Hooks
  console: console_lib.Console
  init_rng: Any  # The key fresh params are drawn from.
  # () -> (host params, {part: why untrained}): pretrained parts to start from (None: from
  # scratch); read only for a fresh start, never on a resume.
  pretrained: Callable[[], tuple[Any, dict[str, str]]] | None = None
  # After restore or the fresh params, before the state is placed: the header, the
  # workdir's files (every refusal is behind by then). Its second argument: the params'
  # abstract tree, boxed with their logical axes (the parameter table, the count).
  on_start: Callable[[Start, Any], None] = lambda start, params: None
  # Equal keys (with the mesh and the phase) reuse a compiled step across runs in this
  # process; '' never.
  program_key: str = ''
  # After the loop (not when preempted), inside the lock: the last scores, saved outputs.
  finish: Callable[['Result', Out], None] | None = None
  # The end of the closing line "done: step N in T" and the lines after it.
  summary: Callable[['Result'], list[str]] = lambda result: []


@dataclasses.dataclass
class Result:
  state: TrainState
  step: int
  preempted: bool
  metrics: dict[str, float]  # The last logged training metrics.
  data_state: Any  # The batches' position after the last step.
  resumed: int | None = None  # The checkpoint step this session started from.


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

  ``ckpt``: None for a run kept in memory."""

  def __init__(self, spec: steps.RunSpec, trainable, console, writer,
               ckpt: checkpointing.Checkpointer | None, workdir: str | None):
    self.t, self.trainable, self.console, self.writer = spec, trainable, console, writer
    self.ckpt, self.workdir, self.policy_key = ckpt, workdir, spec.keys.nonfinite_policy
    self.peak = metrics_lib.peak_tflops_per_device(spec.peak_tflops_per_device)
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
      flops = self.trainable.flops_per_sequence(phase) * t.batch_size
      last.update(step_time_s=dt, tokens_per_s=t.batch_size * phase.seq_len / dt,
                  model_tflops_per_s_per_device=flops / dt / 1e12 / jax.device_count())
      if self.peak:
        last['mfu'] = last['model_tflops_per_s_per_device'] / self.peak
    self.writer.write(step, last)
    eta = (t.num_steps - step) * last['step_time_s'] if 'step_time_s' in last else None
    self.console.metrics(step, t.num_steps, last, 'train', eta)
    self.last, self.pending = last, []
    self.timer_start, self.timer_steps = time.perf_counter(), 0


def run(spec: steps.RunSpec, workdir: str | None, job_for: Callable[[jax.sharding.Mesh], Job]
        ) -> Result:
  """Trains (or resumes) in ``workdir`` (None: in memory, nothing saved). ``job_for(mesh)``
  builds the job under the lock, with SIGTERM already heard (a preemption while it
  prepares data ends the run before its first step)."""
  if workdir:
    workdir_lib.check_workdir_writable(workdir)
  lock = workdir_lib.run_lock(workdir) if workdir else contextlib.nullcontext()
  with lock as held, Preempted() as preempted, compilation_cache.use(
      spec.compilation_cache_dir, workdir):
    mesh = sharding.make_mesh(spec.mesh)
    steps.check_batch(spec, mesh)  # Before the job prepares its data.
    return _Session(spec, workdir, mesh, job_for(mesh), preempted, held).run()


def mesh_line(mesh, batch_size: int) -> str:
  """The header's line of where a run runs."""
  return (f'  mesh {dict(mesh.shape)} over {jax.device_count()} x '
          f'{jax.devices()[0].device_kind}; batch {batch_size}')


def param_count(boxed_params) -> int:
  """The number of parameters of an abstract (boxed) params tree."""
  return int(sum(x.size for x in jax.tree.leaves(nn.unbox(boxed_params))))


class _Reporter:
  def __init__(self, step_of, num_steps: int, console, writer, flusher, param_shardings):
    self.step_of, self.num_steps = step_of, num_steps
    self.console, self.writer, self.flusher = console, writer, flusher
    self.param_shardings = param_shardings

  @property
  def last(self) -> dict[str, float]:
    return self.flusher.last

  def report(self, metrics: dict[str, float], split: str) -> None:
    step = self.step_of()
    self.writer.write(step, metrics, prefix=split)
    self.console.metrics(step, self.num_steps, metrics, split)


class _Session:
  """One run's restore-or-start, loop and close (:func:`run`)."""

  def __init__(self, spec: steps.RunSpec, workdir: str | None, mesh, job: Job, preempted,
               lock=None):
    self.spec, self.workdir, self.mesh, self.job, self.preempted = (
        spec, workdir, mesh, job, preempted)
    self.lock = lock  # workdir.WorkdirLock (None: in memory), checked before writing.
    self.lead = jax.process_index() == 0
    self.pieces = steps.build(spec, job.trainable, mesh)
    self.shards = self.pieces.shards
    self.boxed_params = self.pieces.boxed.params
    self.ckpt = (checkpointing.Checkpointer(workdir, spec.checkpoint) if workdir else None)
    self.step = 0

  def _restore(self) -> checkpointing.Restored | None:
    """The newest restorable checkpoint, its data state applied to the batches."""
    restored = self.ckpt.restore(self.pieces.abstract_state()) if self.ckpt is not None else None
    if restored is not None and restored.data_state:
      try:  # The data state must fit this run too, before anything is written.
        self.job.batches.set_state(restored.data_state)
      except ValueError as e:
        raise checkpointing.CheckpointError(
            f'checkpoint step {restored.step} in {checkpointing.checkpoint_dir(self.workdir)}: '
            f'its data-iterator state ({restored.step}/data) does not fit this run: {e}') from e
    return restored

  def _state(self, restored) -> tuple[TrainState, Start]:
    spec, job, shards = self.spec, self.job, self.shards
    set_aside = tuple(self.ckpt.set_aside) if self.ckpt is not None else ()
    if restored is not None:
      extra = self.ckpt.restored_extra  # None: the trainable carries none, or the checkpoint none.
      if extra is None:
        extra = train_state.initial_extra(job.trainable, spec.batch_size, shards)
      job.on_start(Start(resumed=restored.step, set_aside=set_aside), self.boxed_params)
      return TrainState(step=jax.device_put(jnp.int32(restored.step), shards.step),
                        params=restored.params, opt_state=restored.opt_state, extra=extra), (
                            Start(resumed=restored.step))
    if job.pretrained is None:
      start = Start(set_aside=set_aside)
      job.on_start(start, self.boxed_params)
      return self.pieces.create_state(job.init_rng), start
    params, parts = train_state.start_params(job.trainable, job.init_rng, *job.pretrained())
    start = Start(parts=parts, set_aside=set_aside)
    job.on_start(start, self.boxed_params)
    # Global arrays from the host copy every process holds (any mesh, any process count).
    params = jax.tree.map(lambda x, s: jax.make_array_from_callback(
        np.shape(x), s, lambda index, x=x: np.asarray(x)[index]), params, shards.params)
    return self.pieces.create_state(job.init_rng, params), start

  def make_step(self, phase):
    job = self.job
    if not job.program_key:
      return self.pieces.train_step(phase)
    return reused(('train', job.program_key, self.mesh, phase),
                  lambda: self.pieces.train_step(phase))

  def run(self) -> Result:
    spec, job = self.spec, self.job
    try:
      restored = self._restore()
      state, start = self._state(restored)
      writer = metrics_lib.MetricWriter(
          self.workdir or '', enabled=bool(self.workdir) and self.lead,
          resume_step=0 if restored is None else restored.step)
      flusher = MetricsFlusher(spec, job.trainable, job.console, writer, self.ckpt,
                               self.workdir)
      out = _Reporter(lambda: self.step, spec.num_steps, job.console, writer, flusher,
                      self.shards.params)
      profile = None
      if spec.profile_steps and self.lead and self.workdir:  # One host's trace.
        profile = profiler.ProfileWindow(spec.profile_first_step, spec.profile_steps,
                                        self.workdir, job.console)
      try:
        state, preempted, position = _loop(self, state, flusher, out, profile)
        result = Result(state=state, step=self.step, preempted=preempted, metrics=flusher.last,
                        data_state=position, resumed=start.resumed)
        if job.finish is not None and not preempted:
          job.finish(result, out)
      finally:
        writer.close()
    finally:
      if self.ckpt is not None:
        self.ckpt.close()
    if result.step >= spec.num_steps:
      lines = job.summary(result)
      job.console.say(f'done: step {result.step} in {job.console.elapsed()}'
                      + (lines[0] if lines else ''))
      for line in lines[1:]:
        job.console.say(line)
    warn_skipped(flusher)
    return result


def _after_step(session: _Session, step: int, phase, state, data_state, stop: bool, flusher,
                out) -> None:
  """Log, evaluate and save as the hooks say; the metrics are flushed (and checked for
  non-finite values) before every save, the one on preemption included."""
  end = step == session.spec.num_steps
  due = session.job.hooks.due(step, data_state)
  if session.lock is not None and (due.log or due.save or end or stop):
    # A lost workdir lock stops the run before it writes again (every process at the same
    # steps: the hooks' decisions are deterministic), before another run takes the workdir.
    session.lock.check(everywhere=True)
  if due.log or end:
    flusher.flush(step, phase, state)
  if due.evaluate:
    session.job.hooks.evaluate(step, state, phase, data_state, out)
    flusher.restart_timer()
  if due.save or end or stop:
    flusher.flush(step, phase, state)  # Never save over a non-finite step.
    if session.ckpt is not None:
      session.ckpt.save(step, state, data_state)
      session.job.console.say(
          f'saving step {step} in {checkpointing.checkpoint_dir(session.workdir)}')
    flusher.restart_timer()


def _loop(session: _Session, state, flusher, out, profile) -> tuple[TrainState, bool, Any]:
  """Steps from ``state.step`` until ``num_steps`` or preemption. Returns (state, whether
  preempted, the batches' position)."""
  job, console, hooks = session.job, session.job.console, session.job.hooks
  step = session.step = int(jax.device_get(state.step))
  position = job.batches.get_state()
  if session.preempted.at(step):
    console.say(f'Preempted before step {step + 1}: nothing new to save, exiting; rerun the '
                'same command to resume.')
    return state, True, position
  step_fns: dict[int, Any] = {}
  ran: set[int] = set()  # Phases whose step ran in this session: compiled.
  feed = feeding.Prefetcher(job.batches)
  batch_shard = sharding.batch_sharding(session.mesh)
  rows = session.spec.batch_size if session.spec.global_rows else None
  try:
    while step < session.spec.num_steps:
      phase = hooks.phase_at(step)
      if phase.index not in step_fns:  # A new phase compiles a new step: time from after.
        flusher.flush(step, hooks.phase_at(max(step - 1, 0)), state)
        step_fns[phase.index] = session.make_step(phase)
        flusher.restart_timer()
      batch, data_state = next(feed)
      if batch['input_ids'].shape[1] != phase.seq_len:
        raise RuntimeError(f'Step {step + 1}: the batches have length '
                           f'{batch["input_ids"].shape[1]}; phase {phase.index} needs '
                           f'{phase.seq_len}')
      if profile is not None:
        profile.before(step + 1, compiled=phase.index in ran)
      with jax.profiler.StepTraceAnnotation('train', step_num=step + 1):
        state, m = step_fns[phase.index](state, feeding.to_global(batch, batch_shard, rows))
      step = session.step = step + 1
      position = data_state
      ran.add(phase.index)
      flusher.add(m, state)
      if profile is not None and profile.after(step, (state, m)):
        flusher.restart_timer()  # Writing the trace is no step's time.
      stop = session.preempted.at(step)
      _after_step(session, step, phase, state, data_state, stop, flusher, out)
      if stop:
        console.say(f'Preempted at step {step}: checkpoint saved, exiting; rerun the same '
                    'command to resume.')
        return state, True, position
  finally:
    feed.close()
    if profile is not None:  # Preempted or failed inside the window: the trace so far.
      try:
        profile.stop(step)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning('Could not write the profile trace: %s', e)
  return state, False, position


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


def reused(key: tuple, build):
  """``build()``, or what it built for ``key`` earlier in this process."""
  if key not in _PROGRAMS:
    _PROGRAMS[key] = build()
    while len(_PROGRAMS) > _PROGRAMS_KEPT:
      _PROGRAMS.popitem(last=False)
  _PROGRAMS.move_to_end(key)
  return _PROGRAMS[key]
