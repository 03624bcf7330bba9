"""Fine-tuning on the training engine: pretrained encoder + the task's head, per epoch.

``finetune(config, workdir)`` loads the encoder (a pretraining workdir or an HF directory),
lets the task of ``config.task`` (``finetune.tasks``: reader, head, loss, scorer) read and
encode its data, and trains it with the pretraining engine (``train.drive``): the same
train step (``train.make_train_step``: the model's dtype, e.g. ``config.dtype='bfloat16'``,
and the non-finite policy), optimizer (``optimizer.make``: AdamW, linear warmup then
decay), metrics flusher (the non-finite policy checked before every save, the one on
SIGTERM included), preemption, Orbax checkpoints with exact resume (params, optimizer state
and the position ``{epoch, batch}`` of :class:`finetune.data.EpochBatches`, saved at every
epoch's end and on SIGTERM), console and ``metrics.jsonl``. What differs from pretraining
is in :class:`_Hooks`: epochs instead of length phases, the task's scores at an epoch's end
instead of held-out MLM. It returns the metrics of the last evaluation; the final params
also go to ``<workdir>/params`` with ``labels.json`` and ``finetune_config.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoder_jax import checkpointing
from encoder_jax import console as console_lib
from encoder_jax import feeding
from encoder_jax import loading
from encoder_jax import metrics_log
from encoder_jax import optimizer as optimizer_lib
from encoder_jax import sharding
from encoder_jax import train as engine
from encoder_jax import train_state
from encoder_jax import workdir as workdir_lib
from encoder_jax.finetune import config as finetune_config
from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import heads
from encoder_jax.finetune import task as task_lib
from encoder_jax.finetune import tasks
from encoder_jax.interop import hf_import
from encoder_jax.models import registry as models


def load_pretrained(config: ml_collections.ConfigDict) -> loading.Loaded:
  i = config.init
  if bool(i.workdir) == bool(i.hf_dir):
    raise ValueError('Set exactly one of config.init.workdir and config.init.hf_dir; got '
                     f'workdir={i.workdir!r}, hf_dir={i.hf_dir!r}')
  if i.hf_dir:
    return hf_import.load_hf_dir(i.hf_dir)
  return loading.load_workdir(i.workdir, step=None if i.step < 0 else int(i.step))


def init_params(model: nn.Module, pretrained, max_len: int, seed: int, init_fn=None
                ) -> tuple[dict, dict[str, list[str]]]:
  """(params, what came from where): every top-level part of the model that the pretrained
  params have (same shapes) is taken from them, the task head (``heads.HEAD_PARTS``) and any
  part they lack (e.g. the pooler of a kind pretrained without one) is freshly initialised.
  The second value lists the parts 'taken', 'fresh' and pretrained ones 'unused'."""
  ids = jnp.zeros((1, max_len), jnp.int32)
  init_fn = init_fn or (lambda r: model.init(r, ids, ids, ids)['params'])
  params = dict(nn.unbox(jax.jit(init_fn)(jax.random.PRNGKey(seed))))
  pretrained = loading.to_host(pretrained)
  report = {'taken': [], 'fresh': [], 'unused': sorted(set(pretrained) - set(params))}
  for part in sorted(params):
    if part in heads.HEAD_PARTS or part not in pretrained:
      report['fresh'].append(part)
      continue
    want = jax.tree.map(np.shape, params[part])
    got = jax.tree.map(np.shape, pretrained[part])
    if want != got:
      raise ValueError(f'The pretrained {part!r} params do not fit the model: {got} vs {want}')
    params[part] = pretrained[part]
    report['taken'].append(part)
  return params, report


def engine_config(config: ml_collections.ConfigDict, total_steps: int,
                  steps_per_epoch: int) -> ml_collections.ConfigDict:
  """The sections of a pretraining config the engine's pieces read, from a fine-tuning
  config: one optimizer step per batch, the optimizer section as it is (``optimizer.make``
  reads its fields), a checkpoint at every epoch's end."""
  o = config.optim
  return ml_collections.ConfigDict(dict(
      seed=int(config.seed),
      train=dict(batch_size=int(o.batch_size), grad_accum_steps=1, num_steps=total_steps,
                 nonfinite_policy=config.nonfinite_policy, dropout_rng_impl='threefry',
                 peak_tflops_per_device=0.0),
      optim=o.to_dict(),
      mesh=config.mesh.to_dict(),
      checkpoint=dict(every_steps=steps_per_epoch, keep=int(config.checkpoint_keep),
                      async_save=False)))


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
  with engine.compilation_cache(config.get('compilation_cache_dir', 'auto'), workdir):
    pretrained = pretrained or load_pretrained(config)
    max_len = min(int(config.data.max_len), pretrained.max_length)
    prepared = entry.prepare(config, pretrained.tokenizer, max_len, workdir, log)
    result = run_task(config, workdir, pretrained, prepared, max_len)
  result.update(prepared.report)
  return result


def completed(result: dict, what: str, rerun: str) -> dict:
  """``result`` of :func:`finetune`; a ``train.PreemptedError`` if the run was preempted
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


@dataclasses.dataclass
class _Session:
  """What one fine-tuning run works with, built once by :func:`run_task`."""
  config: ml_collections.ConfigDict
  ec: ml_collections.ConfigDict  # The engine's view of the config (engine_config).
  workdir: str | None
  pretrained: Any  # loading.Loaded
  prepared: data_lib.Prepared
  task: Any  # task.Task
  batches: data_lib.EpochBatches
  mesh: jax.sharding.Mesh
  tx: Any
  max_len: int
  console: console_lib.Console
  ckpt: checkpointing.Checkpointer | None
  lead: bool


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
  ec = engine_config(config, sum(epoch_steps), max(epoch_steps))
  mesh = sharding.make_mesh(ec.mesh)
  sharding.check_batch(int(o.batch_size), mesh, 'config.optim.batch_size')
  sharding.check_batch(int(o.eval_batch_size), mesh, 'config.optim.eval_batch_size')
  lead = jax.process_index() == 0
  lock = workdir_lib.run_lock(workdir) if workdir else _NoLock()
  with lock, engine.Preempted() as preempted:
    session = _Session(
        config=config, ec=ec, workdir=workdir, pretrained=pretrained, prepared=prepared,
        task=task, batches=batches, mesh=mesh, tx=optimizer_lib.make(ec), max_len=max_len,
        console=console_lib.Console(enabled=lead, shown=task.console_metrics),
        ckpt=checkpointing.Checkpointer(workdir, ec.checkpoint) if workdir else None,
        lead=lead)
    return _train(session, preempted)


class _NoLock:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def _state(s: _Session):
  """(state, its shardings, what came from where or None when resumed); a restored
  checkpoint's position is applied to the batches."""
  _, shards = train_state.state_shardings(s.ec, s.mesh, s.task, s.tx)
  restored = None
  if s.ckpt is not None:
    restored = s.ckpt.restore(train_state.abstract_state(s.ec, s.mesh, s.task, s.tx))
  if restored is not None:
    params, opt_state, data_state, step = restored
    state = train_state.TrainState(step=jax.device_put(jnp.int32(step), shards.step),
                                   params=params, opt_state=opt_state)
    s.batches.set_state(data_state or {'epoch': 1, 'batch': 0})
    return state, shards, None
  source = {} if s.config.init.from_scratch else s.pretrained.encoder_params
  params, parts = init_params(s.task.model, source, s.max_len, int(s.config.seed), s.task.init)
  state = train_state.create_train_state(s.ec, s.mesh, params=params, setup=s.task, tx=s.tx)
  return state, shards, parts


def _header(s: _Session, parts, state) -> None:
  c, o, out, names = s.config, s.config.optim, s.console, s.prepared.names
  n = sum(x.size for x in jax.tree.leaves(state.params))
  out.say(f'encoder_jax: fine-tuning {c.task} from {s.pretrained.source} '
          f'({s.task.network.config.kind}, {n:,} parameters'
          + (f', labels {list(names)}' if names else '') + ')'
          + (f' in {s.workdir}' if s.workdir else ''))
  out.say(f'  mesh {dict(s.mesh.shape)} over {jax.device_count()} x '
          f'{jax.devices()[0].device_kind}; batch {o.batch_size}; {o.epochs} epochs x '
          f'{s.ec.checkpoint.every_steps} steps at {s.max_len} tokens; dtype '
          f'{s.task.network.config.dtype}')
  if parts is None:
    out.say(f'  resuming from checkpoint step {int(jax.device_get(state.step))}')
  else:
    out.say(f'  taken from the checkpoint: {", ".join(parts["taken"]) or "nothing"}'
            + (' (config.init.from_scratch)' if c.init.from_scratch else '') + '; '
            f'freshly initialised: {", ".join(parts["fresh"])}'
            + (f'; not used: {", ".join(parts["unused"])}' if parts['unused'] else '') + '.')


class _Hooks:
  """Fine-tuning's side of the engine's loop (``train.Loop``): one length phase; at each
  epoch's end the metrics are logged, the eval split scored (every epoch, or the last
  one only) and a checkpoint saved."""

  def __init__(self, s: _Session, shards, writer, flusher):
    self.s, self.writer, self.flusher = s, writer, flusher
    self.shards, self.phase = shards, task_lib.phase(s.max_len)
    self.predict = jax.jit(s.task.predict, in_shardings=(shards.params,
                                                         sharding.batch_sharding(s.mesh)))
    self.result: dict = {}  # The metrics of the last epoch that ended in this session.
    self.epoch_start = time.perf_counter()

  def phase_at(self, step: int):
    del step
    return self.phase

  def make_step(self, phase):
    s = self.s
    schedule_fn = optimizer_lib.learning_rate_schedule(s.ec.optim, int(s.ec.train.num_steps))
    return engine.make_train_step(s.ec, s.task, s.tx, schedule_fn, s.mesh, self.shards, phase)

  def check_batch(self, step, batch, phase) -> None:
    del step, batch, phase

  def log_now(self, step: int, data_state) -> bool:
    del step
    return int(data_state['batch']) == 0  # An epoch ended.

  save_now = log_now

  def evaluate(self, step: int, state, phase, data_state) -> bool:
    """At an epoch's end: the epoch's result, with the eval split's scores when due."""
    del phase
    if int(data_state['batch']) != 0:
      return False
    c, epoch = self.s.config, int(data_state['epoch']) - 1
    last, now = self.flusher.last, time.perf_counter()
    self.result = {'epoch': epoch, 'step': step,
                   **{f'train_{k}': last[k] for k in ('loss', 'accuracy') if k in last},
                   'epoch_time_s': now - self.epoch_start}
    self.epoch_start = now
    if self.s.prepared.evals is None or not (c.eval_every_epoch or epoch == int(c.optim.epochs)):
      return False
    self.result.update(self.report(step, state.params, 'eval', self.s.prepared.evals))
    self.epoch_start = time.perf_counter()
    return True

  def report(self, step: int, params, split: str, arrays) -> dict:
    """A split's scores, written and printed; prefixed with the split's name."""
    held_out = score(self.s, self.predict, params, split, arrays)
    self.s.console.metrics(step, int(self.s.ec.train.num_steps), held_out, split)
    self.writer.write(step, held_out, split)
    return {f'{split}_{k}': v for k, v in held_out.items()}


def score(s: _Session, predict, params, split: str, arrays) -> dict:
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


def _train(s: _Session, preempted) -> dict:
  """Restores or initialises, runs the engine's loop, then the last scores and the saved
  params; a preempted run returns its position with ``preempted=True``."""
  state, shards, parts = _state(s)
  _header(s, parts, state)
  if s.workdir and s.lead:
    workdir_lib.path(s.workdir).mkdir(parents=True, exist_ok=True)
  writer = metrics_log.MetricWriter(s.workdir or '', enabled=bool(s.workdir) and s.lead,
                                    resume_step=int(jax.device_get(state.step)))
  flusher = engine.MetricsFlusher(s.ec.train, s.task, s.console, writer, s.ckpt, s.workdir,
                                  policy_key='config.nonfinite_policy')
  hooks = _Hooks(s, shards, writer, flusher)
  loop = engine.Loop(hooks=hooks, iterator=s.batches, num_steps=int(s.ec.train.num_steps),
                     batch_size=None, mesh=s.mesh, flusher=flusher,
                     console=s.console, ckpt=s.ckpt, workdir=s.workdir)
  try:
    state, step, stopped = engine.drive(loop, state, preempted)
    if stopped:
      return {'epoch': int(loop.position['epoch']), 'step': step, 'preempted': True}
    result = hooks.result
    if not result and s.prepared.evals is not None:  # Resumed after the last epoch.
      result = dict(hooks.report(step, state.params, 'eval', s.prepared.evals), step=step)
    for name, arrays in s.prepared.more_evals.items():  # E.g. MNLI's mismatched split.
      result.update(hooks.report(step, state.params, name, arrays))
    if s.workdir and s.lead:
      _save(s.workdir, jax.device_get(state.params), s.config, s.prepared.names)
  finally:
    if s.ckpt is not None:
      s.ckpt.close()
    writer.close()
  engine.warn_skipped(flusher)
  s.console.say(f'done: step {step} in {s.console.elapsed()}'
                + (f'; fine-tuned params in {os.path.join(s.workdir, "params")}'
                   if s.workdir else ''))
  return result


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
