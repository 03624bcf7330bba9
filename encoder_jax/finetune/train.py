"""Fine-tuning: an adapter of the training engine (``engine.run``).

``finetune(config, workdir)`` loads the encoder (a pretraining workdir or an HF directory),
lets the task of ``config.task`` (``finetune.tasks``: reader, head, loss, scorer) read and
encode its data, and runs it on the engine, which owns what every run does (the train step
with the model's dtype and the non-finite policy, the optimizer, preemption, Orbax
checkpoints with exact resume of the position ``{epoch, batch}`` of
:class:`finetune.data.EpochBatches`, the console and ``metrics.jsonl``). What is
fine-tuning's is :class:`_FineTuning`: its settings (:func:`spec`), the pretrained parts it
starts from (the task's head always fresh), epochs instead of length phases, the task's
scores at an epoch's end, and the final params in ``<workdir>/params`` with
``labels.json`` and ``finetune_config.json``. It returns the metrics of the last evaluation.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import jax
import ml_collections
import numpy as np

from encoder_jax.run import console as console_lib
from encoder_jax.run import engine
from encoder_jax.run import steps
from encoder_jax.run import feeding
from encoder_jax.run import compilation_cache
from encoder_jax.loading import loaded as loading
from encoder_jax.core import optimizer as optimizer_lib
from encoder_jax.core import sharding
from encoder_jax.api import source
from encoder_jax.run import train_state
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.finetune import config as finetune_config
from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import heads
from encoder_jax.finetune import task as task_lib
from encoder_jax.finetune import tasks
from encoder_jax.models import registry as models

# config.data fields that say where examples come from and how they are read, not what the
# compiled steps compute (the length, packing and labels are in the steps).
_SOURCE_FIELDS = ('train', 'eval', 'more_evals', 'tfds_data_dir', 'text_fields', 'label_field',
                  'tokens_field', 'tags_field')


def load_pretrained(config: ml_collections.ConfigDict) -> loading.Loaded:
  """The encoder ``config.init`` names (``source.load``)."""
  return source.load(source.of_init(config.init))


def spec(config: ml_collections.ConfigDict, total_steps: int,
         steps_per_epoch: int) -> steps.RunSpec:
  """The engine's settings of a fine-tuning config: one optimizer step per batch, the
  warmup a fraction of all steps, a checkpoint at every epoch's end."""
  o = config.optim
  return steps.RunSpec(
      seed=int(config.seed), batch_size=int(o.batch_size), num_steps=int(total_steps),
      optim=optimizer_lib.Optim.of(o, round(float(o.warmup_fraction) * total_steps)),
      mesh=config.mesh,
      checkpoint=steps.Checkpointing(every_steps=int(steps_per_epoch),
                                      keep=int(config.checkpoint_keep)),
      nonfinite_policy=str(config.nonfinite_policy),
      compilation_cache_dir=str(config.get('compilation_cache_dir', 'auto')),
      global_rows=False,
      keys=steps.Keys(nonfinite_policy='config.nonfinite_policy',
                       batch_size='config.optim.batch_size'))


def finetune(config: ml_collections.ConfigDict, workdir: str | None = None, log=print,
             pretrained: loading.Loaded | None = None) -> dict:
  """Fine-tunes (or resumes fine-tuning) ``config.task`` into ``workdir`` (None: in memory,
  no checkpoints).

  Returns the last epoch's metrics (``eval_*`` from the eval split, ``NAME_*`` from
  ``data.more_evals``) and what the task's reader reports (truncation counts, label
  names...). ``pretrained``: the encoder ``config.init`` names, when already loaded."""
  finetune_config.validate(config)
  entry = tasks.get(config.task)
  if workdir:
    workdir_lib.check_workdir_writable(workdir)
  # Pretraining's persistent compilation cache, set before the first compile ('auto' in
  # memory: the environment's, if any).
  with compilation_cache.use(config.get('compilation_cache_dir', 'auto'), workdir):
    pretrained = pretrained or load_pretrained(config)
    max_len = min(int(config.data.max_len), pretrained.max_length)
    prepared = entry.prepare(config, pretrained.tokenizer, max_len, workdir, log)
    result = run_task(config, workdir, pretrained, prepared, max_len)
  result.update(prepared.report)
  return result


def completed(result: dict, what: str, rerun: str) -> dict:
  """``result`` of :func:`finetune`; an ``engine.PreemptedError`` if the run was preempted
  instead: ``what`` names the run, ``rerun`` says what running the command again does."""
  if result.get('preempted'):
    raise engine.PreemptedError(f'{what} was preempted at step {result["step"]}; {rerun}')
  return result


def _model_config(config: ml_collections.ConfigDict, pretrained):
  """The pretrained network's config with the fine-tuning's dtype and encoder dropout."""
  model_config = pretrained.model_config
  if config.dtype:
    model_config = model_config.replace(dtype=config.dtype)
  if float(config.encoder_dropout) >= 0:
    rate = float(config.encoder_dropout)
    model_config = model_config.replace(hidden_dropout_rate=rate, attention_dropout_rate=rate)
  return model_config


def run_task(config: ml_collections.ConfigDict, workdir: str | None, pretrained,
             prepared: data_lib.Prepared, max_len: int) -> dict:
  """Trains ``config.task``'s head on ``prepared.train`` with the engine and scores the
  eval splits with the task's scorer."""
  o, entry = config.optim, tasks.get(config.task)
  model_config = _model_config(config, pretrained)
  task = entry.setup(entry.head(model_config, config, prepared), models.network(model_config),
                     max_len, config)
  packing = bool(config.data.get('packing', False))
  if packing and not models.get(model_config.kind).packed_rows:
    raise ValueError(f'config.data.packing=True: model kind {model_config.kind!r} does not '
                     'take packed rows (its attention reads no document ids); expected one of '
                     f'{sorted(k for k, v in models.KINDS.items() if v.packed_rows)}')
  batches = data_lib.EpochBatches(prepared.train, o.batch_size, config.seed, o.epochs, packing)
  epoch_steps = [batches.steps(e) for e in range(1, int(o.epochs) + 1)]
  run_spec = spec(config, sum(epoch_steps), max(epoch_steps))

  def job_for(mesh) -> engine.Job:
    sharding.check_batch(int(o.eval_batch_size), mesh, 'config.optim.eval_batch_size')
    return _FineTuning(config, workdir, mesh, pretrained, prepared, task, batches, max_len,
                       run_spec).job()

  result = engine.run(run_spec, workdir, job_for)
  if result.preempted:
    return {'epoch': int(result.data_state['epoch']), 'step': result.step, 'preempted': True}
  return result.metrics


class _FineTuning:
  """Fine-tuning's side of a run (``engine.Hooks`` and the job): one length phase; at each
  epoch's end the metrics are logged, the eval split scored (every epoch, or the last one
  only) and a checkpoint saved; after the last epoch, the more splits scored and the
  params saved."""

  def __init__(self, config, workdir, mesh, pretrained, prepared, task, batches, max_len,
               run_spec):
    self.config, self.workdir, self.mesh = config, workdir, mesh
    self.pretrained, self.prepared, self.task, self.batches = pretrained, prepared, task, batches
    self.max_len, self.spec = max_len, run_spec
    self.phase = task_lib.phase(max_len)
    self.lead = jax.process_index() == 0
    self.console = console_lib.Console(enabled=self.lead, shown=task.console_metrics)
    self.result: dict = {}  # The metrics of the last epoch that ended in this session.
    self.epoch_start = time.perf_counter()
    self.predict = None

  def job(self) -> engine.Job:
    def pretrained():
      if self.config.init.from_scratch:
        return {}, {}
      return loading.to_host(self.pretrained.encoder_params), {
          part: "the task's head" for part in heads.HEAD_PARTS}

    return engine.Job(trainable=self.task, batches=self.batches, hooks=self,
                      console=self.console, init_rng=jax.random.PRNGKey(int(self.config.seed)),
                      pretrained=pretrained, on_start=self.on_start, finish=self.finish,
                      program_key=self.program_key, summary=self.summary)

  @property
  def program_key(self) -> str:
    """A digest of everything the task's compiled steps depend on besides the mesh and the
    phase: the config (less where the params and examples come from: ``init`` and the data
    sources and their field names), the network's config, the head's outputs (label count,
    the classifier's side index), the length and the step count (the schedule). A resumed
    run, the next seed of a sweep, or a fine-tune of another checkpoint of the same network
    on other files, in this process reuses the traced steps."""
    c = self.config.to_dict()
    del c['init']
    for name in _SOURCE_FIELDS:
      c['data'].pop(name, None)
    h = hashlib.sha256(json.dumps(c, sort_keys=True, default=repr).encode('utf-8'))
    p = self.prepared
    h.update(repr((type(self.task).__name__, self.task.network.config, self.max_len,
                   p.num_outputs, list(p.names), p.context.get('cls_index'),
                   self.spec.num_steps)).encode('utf-8'))
    return h.hexdigest()

  def on_start(self, start: engine.Start, params) -> None:
    c, o, out, names = self.config, self.config.optim, self.console, self.prepared.names
    if self.workdir and self.lead:
      workdir_lib.path(self.workdir).mkdir(parents=True, exist_ok=True)
    out.say(f'encoder_jax: fine-tuning {c.task} from {self.pretrained.source} '
            f'({self.task.network.config.kind}, {engine.param_count(params):,} parameters'
            + (f', labels {list(names)}' if names else '') + ')'
            + (f' in {self.workdir}' if self.workdir else ''))
    out.say(engine.mesh_line(self.mesh, o.batch_size) + f'; {o.epochs} epochs x '
            f'{self.spec.checkpoint.every_steps} steps at {self.max_len} tokens; dtype '
            f'{self.task.network.config.dtype}')
    if start.resumed is not None:
      out.say(f'  resuming from checkpoint step {start.resumed}')
    elif start.parts is not None:
      lines = train_state.parts_lines(start.parts)
      if c.init.from_scratch:
        lines[0] += ' (config.init.from_scratch)'
      for line in lines:
        out.say('  ' + line)

  # ---- engine.Hooks

  def phase_at(self, step: int):
    del step
    return self.phase

  def due(self, step: int, data_state) -> engine.Due:
    """At an epoch's end: log, evaluate (the epoch's result) and save."""
    del step
    end = int(data_state['batch']) == 0
    return engine.Due(log=end, evaluate=end, save=end)

  def evaluate(self, step: int, state, phase, data_state, out: engine.Out) -> None:
    """The epoch's result, with the eval split's scores when due."""
    del phase
    c, epoch = self.config, int(data_state['epoch']) - 1
    last, now = out.last, time.perf_counter()
    self.result = {'epoch': epoch, 'step': step,
                   **{f'train_{k}': last[k] for k in ('loss', 'accuracy') if k in last},
                   'epoch_time_s': now - self.epoch_start}
    self.epoch_start = now
    if self.prepared.evals is None or not (c.eval_every_epoch or epoch == int(c.optim.epochs)):
      return
    self.result.update(self.report(state.params, 'eval', self.prepared.evals, out))
    self.epoch_start = time.perf_counter()

  def report(self, params, split: str, arrays, out: engine.Out) -> dict:
    """A split's scores, written and printed; prefixed with the split's name."""
    if self.predict is None:
      self.predict = engine.reused(('predict', self.program_key, self.mesh), lambda: jax.jit(
          self.task.predict, in_shardings=(out.param_shardings,
                                           sharding.batch_sharding(self.mesh))))
    held_out = score(self, self.predict, params, split, arrays)
    out.report(held_out, split)
    return {f'{split}_{k}': v for k, v in held_out.items()}

  def finish(self, result: engine.Result, out: engine.Out) -> None:
    """The last scores (resumed after the last epoch: the eval split now; the more splits)
    and the params saved; ``result.metrics`` becomes the run's result."""
    final = self.result
    if not final and self.prepared.evals is not None:  # Resumed after the last epoch.
      final = dict(self.report(result.state.params, 'eval', self.prepared.evals, out),
                   step=result.step)
    for name, arrays in self.prepared.more_evals.items():  # E.g. MNLI's mismatched split.
      final.update(self.report(result.state.params, name, arrays, out))
    if self.workdir and self.lead:
      _save(self.workdir, jax.device_get(result.state.params), self.config, self.prepared.names)
    result.metrics = final

  def summary(self, result: engine.Result) -> list[str]:
    del result
    return [f'; fine-tuned params in {os.path.join(self.workdir, "params")}'
            if self.workdir else '']


def score(s: _FineTuning, predict, params, split: str, arrays) -> dict:
  """The task's metrics of one split: predictions of its rows in order, then the scorer
  (packed rows: each row's slots mapped back to its examples)."""
  packing = s.batches.packing
  rows = data_lib.pack(arrays) if packing else arrays  # In order: example d of a row, slot d.
  preds = []
  shard = sharding.batch_sharding(s.mesh)
  for batch in data_lib.batches(rows, int(s.config.optim.eval_batch_size), None):
    keep = batch['weights'] > 0
    pred = np.asarray(jax.device_get(predict(params, feeding.to_global(batch, shard))))[keep]
    if packing:  # [rows, slots] -> the examples of each row, in order.
      count = batch['document_ids'][keep].max(axis=1)
      pred = np.concatenate([p[:k] for p, k in zip(pred, count)])
    preds.append(pred)
  entry = tasks.get(s.config.task)
  return entry.score(s.config, s.prepared, split, arrays, np.concatenate(preds))


def read_final_params(workdir: str) -> dict:
  """The params a finished fine-tuning saved in ``<workdir>/params`` (host arrays)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  with ocp.StandardCheckpointer() as ckpt:
    return ckpt.restore(workdir_lib.path(workdir, 'params'))


def _save(workdir: str, params, config: ml_collections.ConfigDict, names) -> None:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = workdir_lib.path(workdir, 'params')  # A local directory or gs:// alike.
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(path, params, force=True)
  workdir_lib.path(workdir, 'finetune_config.json').write_text(
      config.to_json_best_effort(indent=2))
  workdir_lib.path(workdir, 'labels.json').write_text(json.dumps(list(names)))
