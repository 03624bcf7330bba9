"""Fine-tuning on the training engine: pretrained encoder + new head, evaluated per epoch.

``finetune(config, workdir)`` loads the encoder (a pretraining workdir or an HF directory),
reads and encodes the data, and trains the task (``finetune.task.Task``: head + loss +
metrics) with the pretraining engine's pieces: the mesh and its sharded state
(``train_state``), the train step (``train.make_train_step``: the model's dtype, e.g.
``config.dtype='bfloat16'``, and the non-finite policy), the workdir lock, Orbax
checkpoints with exact resume (``checkpointing.Checkpointer``: params, optimizer state and
the data position, saved at every epoch's end and on SIGTERM), the console and
``metrics.jsonl``. AdamW warms up then decays linearly. It returns the metrics of the last
evaluation; the final params also go to ``<workdir>/params`` with ``labels.json`` and
``finetune_config.json``, for evaluation scripts.
"""

from __future__ import annotations

import json
import math
import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from encoder_jax import checkpointing
from encoder_jax import console as console_lib
from encoder_jax import feeding
from encoder_jax import loading
from encoder_jax import metrics_log as metrics_writer
from encoder_jax import optimizer as optimizer_lib
from encoder_jax import sharding
from encoder_jax import train as engine
from encoder_jax import train_state
from encoder_jax import workdir as workdir_lib
from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import heads
from encoder_jax.finetune import scores as metrics_lib
from encoder_jax.finetune import task as task_lib
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


def learning_rate_schedule(o: ml_collections.ConfigDict, total_steps: int):
  warmup = int(round(float(o.warmup_fraction) * total_steps))
  return optimizer_lib.learning_rate_schedule(
      ml_collections.ConfigDict(dict(learning_rate=float(o.learning_rate), warmup_steps=warmup)),
      total_steps)


def make_optimizer(o: ml_collections.ConfigDict, total_steps: int):
  """AdamW with the pretraining schedule and decay mask (``encoder_jax.optimizer``).

  Linear warmup over ``warmup_fraction`` of the steps, then linear decay to 0; no weight
  decay on LayerNorm parameters and biases.
  """
  if not 0.0 <= float(o.warmup_fraction) <= 1.0:
    raise ValueError(f'config.optim.warmup_fraction={o.warmup_fraction}; expected a fraction '
                     'of the steps in [0, 1]')
  if o.grad_clip_norm < 0:
    raise ValueError(f'config.optim.grad_clip_norm={o.grad_clip_norm}; expected >= 0')
  tx = optax.adamw(learning_rate_schedule(o, total_steps), b1=0.9, b2=0.999, eps=1e-6,
                   weight_decay=o.weight_decay, mask=optimizer_lib.decay_mask)
  if o.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(o.grad_clip_norm), tx)
  return tx


def engine_config(config: ml_collections.ConfigDict, total_steps: int,
                  steps_per_epoch: int) -> ml_collections.ConfigDict:
  """The sections of a pretraining config the engine's pieces read, from a fine-tuning
  config: one optimizer step per batch, a checkpoint at every epoch's end."""
  o = config.optim
  return ml_collections.ConfigDict(dict(
      seed=int(config.seed),
      train=dict(batch_size=int(o.batch_size), grad_accum_steps=1, num_steps=total_steps,
                 nonfinite_policy=config.nonfinite_policy, dropout_rng_impl='threefry'),
      mesh=config.mesh.to_dict(),
      checkpoint=dict(every_steps=steps_per_epoch, keep=int(config.checkpoint_keep),
                      async_save=False)))


def check_config(config: ml_collections.ConfigDict) -> None:
  o = config.optim
  for key in ('epochs', 'batch_size', 'eval_batch_size'):
    if not isinstance(o[key], int) or o[key] < 1:
      raise ValueError(f'config.optim.{key}={o[key]!r}; expected an integer >= 1')
  if config.nonfinite_policy not in ('stop', 'skip'):
    raise ValueError(f'config.nonfinite_policy={config.nonfinite_policy!r}; expected one of '
                     "'stop', 'skip'")
  if config.dtype not in ('', 'float32', 'bfloat16'):
    raise ValueError(f"config.dtype={config.dtype!r}; expected '' (the checkpoint's), "
                     "'float32' or 'bfloat16'")
  if int(config.checkpoint_keep) < 1:
    raise ValueError(f'config.checkpoint_keep={config.checkpoint_keep}; expected >= 1')
  if config.data.get('packing', False) and (config.task != 'sequence_classification'
                                           or config.pooling != 'mean'):
    raise ValueError('config.data.packing=True packs whole examples of sequence '
                     "classification, pooled per example: expected task="
                     f"'sequence_classification' and pooling='mean'; got task={config.task!r}, "
                     f'pooling={config.pooling!r}')
  dropout = float(config.encoder_dropout)
  if dropout != -1.0 and not 0.0 <= dropout < 1.0:
    raise ValueError(f'config.encoder_dropout={dropout}; expected -1 (the checkpoint\'s rates) '
                     'or in [0, 1)')


def finetune(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
  """Fine-tunes (or resumes fine-tuning) into ``workdir`` (None: in memory, no checkpoints).

  Returns the last epoch's metrics (``eval_*`` from the eval split), the truncation counts
  and the label names."""
  check_config(config)
  d = config.data
  if workdir:
    workdir_lib.check_workdir_writable(workdir)
  pretrained = load_pretrained(config)
  tok = pretrained.tokenizer
  max_len = min(int(d.max_len), pretrained.max_length)
  train_ex, names = data_lib.read(d.train, config.task, d)
  eval_ex, _ = data_lib.read(d.eval, config.task, d, names) if d.eval else (None, names)
  train, train_cut = data_lib.encode_with_report(train_ex, tok, config.task, max_len)
  evals, eval_cut = (data_lib.encode_with_report(eval_ex, tok, config.task, max_len)
                     if eval_ex is not None else (None, None))
  logging.info('Fine-tuning %s from %s: %d train / %d eval examples, labels %s', config.task,
               pretrained.source, len(train_ex), len(eval_ex or []), names)
  for split, cut in (('train', train_cut), ('eval', eval_cut)):
    if cut is not None:
      logging.info('%s', cut.summary(split))
      if cut.truncated_examples:
        print(f'Warning: {cut.summary(split)}', flush=True)

  scorer = lambda arrays, pred: classification_scores(config.task, names, arrays, pred)
  result = run_task(config, workdir, pretrained, train, evals, scorer, max(1, len(names)),
                    max_len, _more_evals(config, tok, names, max_len), names)
  if evals is not None:
    result.update({f'eval_{k}': v for k, v in eval_cut.metrics().items()})
  result.update({f'train_{k}': v for k, v in train_cut.metrics().items()})
  result['labels'] = list(names)
  return result


def classification_scores(task: str, names, arrays, pred) -> dict:
  if task == 'sequence_classification':
    return metrics_lib.sequence_metrics(pred, arrays['labels'], len(names))
  if task == 'sequence_regression':
    return metrics_lib.regression_metrics(pred, arrays['labels'])
  return metrics_lib.token_metrics(pred, arrays['labels'], names)


def run_task(config: ml_collections.ConfigDict, workdir: str | None, pretrained, train: dict,
             evals: dict | None, scorer, num_outputs: int, max_len: int,
             more_evals: dict | None = None, names=(), task=None) -> dict:
  """Trains ``config.task``'s head on ``train`` (encoded arrays) with the engine; scores
  ``evals`` with ``scorer(arrays, predictions) -> metrics`` (predictions of the rows, in
  order). Any task whose arrays and scorer fit this runs here (classification, QA...);
  ``task`` replaces the head task ``config.task`` names (e.g. Sentence-BERT's siamese one)."""
  o = config.optim
  model_config = pretrained.model_config
  if config.dtype:
    model_config = model_config.replace(dtype=config.dtype)
  if float(config.encoder_dropout) >= 0:
    rate = float(config.encoder_dropout)
    model_config = model_config.replace(hidden_dropout_rate=rate, attention_dropout_rate=rate)
  if task is None:
    model = heads.make(config.task, model_config, num_outputs, config.dropout_rate,
                       config.pooling)
    task = task_lib.Task(config.task, model, models.network(model_config), max_len)
  packing = bool(config.data.get('packing', False))
  if packing and not models.get(model_config.kind).packed_rows:
    raise ValueError(f'config.data.packing=True: model kind {model_config.kind!r} does not '
                     'take packed rows (its attention reads no document ids); expected one of '
                     f'{sorted(k for k, v in models.KINDS.items() if v.packed_rows)}')
  epoch_steps = [math.ceil(rows_in_epoch(train, config, e, packing) / o.batch_size)
                 for e in range(1, int(o.epochs) + 1)]
  steps_per_epoch, total = max(epoch_steps), sum(epoch_steps)
  ec = engine_config(config, total, steps_per_epoch)
  mesh = sharding.make_mesh(ec.mesh)
  sharding.check_batch(int(o.batch_size), mesh, 'config.optim.batch_size')
  sharding.check_batch(int(o.eval_batch_size), mesh, 'config.optim.eval_batch_size')
  tx = make_optimizer(o, total)
  lock = workdir_lib.run_lock(workdir) if workdir else _NoLock()
  with lock, engine.Preempted() as preempted:
    run = _Run(config, workdir, pretrained, task, ec, mesh, tx, train, evals, names, total,
               steps_per_epoch, max_len)
    run.scorer = scorer
    run.more_evals = more_evals or {}
    return run.go(preempted)


def rows_in_epoch(train: dict, config: ml_collections.ConfigDict, epoch: int,
                  packing: bool) -> int:
  """Batch rows of one epoch: the examples, or the packed rows of the epoch's order."""
  n = len(train['input_ids'])
  if not packing:
    return n
  return len(data_lib.pack(train, task_lib.epoch_order(n, int(config.seed), epoch))
             ['input_ids'])


def _more_evals(config, tok, names, max_len) -> dict[str, dict]:
  """``config.data.more_evals`` ('name=SPEC,name=SPEC'): splits scored after the last epoch."""
  out = {}
  for item in filter(None, (x.strip() for x in config.data.more_evals.split(','))):
    name, sep, spec = item.partition('=')
    if not sep or not name.isidentifier():
      raise ValueError(f'config.data.more_evals has {item!r}; expected NAME=SPEC, e.g. '
                       "'mismatched=tfds:glue/mnli:validation_mismatched'")
    examples, _ = data_lib.read(spec, config.task, config.data, names)
    out[name] = data_lib.encode(examples, tok, config.task, max_len)
  return out


class _NoLock:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


class _Run:
  """One fine-tuning session on the engine: state, header, epochs, checkpoints."""

  def __init__(self, config, workdir, pretrained, task, ec, mesh, tx, train, evals, names,
               total, steps_per_epoch, max_len):
    self.config, self.workdir, self.pretrained, self.task = config, workdir, pretrained, task
    self.ec, self.mesh, self.tx = ec, mesh, tx
    self.train, self.evals, self.names = train, evals, names
    self.total, self.steps_per_epoch, self.max_len = total, steps_per_epoch, max_len
    self.packing = bool(config.data.get('packing', False))  # Examples packed into rows.
    self.lead = jax.process_index() == 0
    self.console = console_lib.Console(enabled=self.lead, shown=task.console_metrics)
    self.ckpt = (checkpointing.Checkpointer(workdir, ec.checkpoint) if workdir else None)
    self.more_evals: dict[str, dict] = {}  # name -> encoded split, scored after the last epoch.
    self.scorer = None  # (arrays, predictions) -> metrics.

  def _state(self):
    """(state, data position, what came from where or None when resumed)."""
    _, shards = train_state.state_shardings(self.ec, self.mesh, self.task, self.tx)
    restored = None
    if self.ckpt is not None:
      restored = self.ckpt.restore(train_state.abstract_state(self.ec, self.mesh, self.task,
                                                              self.tx))
    if restored is not None:
      params, opt_state, data_state, step = restored
      state = train_state.TrainState(step=jax.device_put(jnp.int32(step), shards.step),
                                     params=params, opt_state=opt_state)
      return state, shards, data_state or {'epoch': 1, 'batch': 0}, None
    source = {} if self.config.init.from_scratch else self.pretrained.encoder_params
    params, parts = init_params(self.task.model, source, self.max_len, int(self.config.seed),
                                self.task.init)
    state = train_state.create_train_state(self.ec, self.mesh, params=params, setup=self.task,
                                           tx=self.tx)
    return state, shards, {'epoch': 1, 'batch': 0}, parts

  def _header(self, parts, state) -> None:
    c, o, out = self.config, self.config.optim, self.console
    n = sum(x.size for x in jax.tree.leaves(state.params))
    out.say(f'encoder_jax: fine-tuning {c.task} from {self.pretrained.source} '
            f'({self.task.network.config.kind}, {n:,} parameters'
            + (f', labels {list(self.names)}' if self.names else '') + ')'
            + (f' in {self.workdir}' if self.workdir else ''))
    out.say(f'  mesh {dict(self.mesh.shape)} over {jax.device_count()} x '
            f'{jax.devices()[0].device_kind}; batch {o.batch_size}; {o.epochs} epochs x '
            f'{self.steps_per_epoch} steps at {self.max_len} tokens; dtype '
            f'{self.task.network.config.dtype}')
    if parts is None:
      out.say(f'  resuming from checkpoint step {int(jax.device_get(state.step))}')
    else:
      out.say(f'  taken from the checkpoint: {", ".join(parts["taken"]) or "nothing"}'
              + (' (config.init.from_scratch)' if c.init.from_scratch else '') + '; '
              f'freshly initialised: {", ".join(parts["fresh"])}'
              + (f'; not used: {", ".join(parts["unused"])}' if parts['unused'] else '') + '.')

  def evaluate(self, params, predict, arrays=None) -> dict:
    arrays = self.evals if arrays is None else arrays
    rows = data_lib.pack(arrays) if self.packing else arrays  # In order: example d of a row, slot d.
    preds = []
    shard = sharding.batch_sharding(self.mesh)
    for batch in data_lib.batches(rows, int(self.config.optim.eval_batch_size), None):
      keep = batch['weights'] > 0
      pred = np.asarray(jax.device_get(predict(params, feeding.to_global(batch, shard))))[keep]
      if self.packing:  # [rows, slots] -> the examples of each row, in order.
        count = batch['document_ids'][keep].max(axis=1)
        pred = np.concatenate([p[:k] for p, k in zip(pred, count)])
      preds.append(pred)
    return self.scorer(arrays, np.concatenate(preds))

  def go(self, preempted) -> dict:
    c, o = self.config, self.config.optim
    state, shards, position, parts = self._state()
    self._header(parts, state)
    if self.workdir and self.lead:
      os.makedirs(self.workdir, exist_ok=True)
    step = int(jax.device_get(state.step))
    writer = metrics_writer.MetricWriter(self.workdir, enabled=bool(self.workdir) and self.lead,
                                         resume_step=step) if self.workdir else None
    phase = task_lib.phase(self.max_len)
    schedule_fn = learning_rate_schedule(o, self.total)
    train_step = engine.make_train_step(self.ec, self.task, self.tx, schedule_fn, self.mesh,
                                        shards, phase)
    predict = jax.jit(self.task.predict, in_shardings=(shards.params,
                                                       sharding.batch_sharding(self.mesh)))
    shard = sharding.batch_sharding(self.mesh)
    n = len(self.train['input_ids'])
    result: dict = {}
    try:
      for epoch in range(int(position['epoch']), int(o.epochs) + 1):
        start, metrics = time.perf_counter(), []
        first = int(position['batch']) if epoch == int(position['epoch']) else 0
        order = task_lib.epoch_order(n, int(c.seed), epoch)
        rows = self.train
        if self.packing:  # The epoch's examples, packed in its order.
          rows, order = data_lib.pack(self.train, order), None
        stopped = False
        for i, batch in enumerate(data_lib.batches(rows, int(o.batch_size), None, order,
                                                   first), start=first):
          state, m = train_step(state, feeding.to_global(batch, shard))
          metrics.append(m)
          step += 1
          stopped = preempted.at(step)
          if stopped:
            self._save(step, state, {'epoch': epoch, 'batch': i + 1})
            self.console.say(f'Preempted at step {step}: checkpoint saved, exiting; rerun the '
                             'same command to resume.')
            return {'epoch': epoch, 'step': step, 'preempted': True}
        host = jax.device_get(metrics)
        self._check_finite(host, step)
        keys = [k for k in ('loss', 'accuracy') if host and k in host[0]]
        means = {k: float(np.mean([x[k] for x in host])) for k in keys}
        result = {'epoch': epoch, 'step': step, **{f'train_{k}': v for k, v in means.items()},
                  'epoch_time_s': time.perf_counter() - start}
        self.console.metrics(step, self.total, means, 'train')
        if writer:
          writer.write(step, {k: v for k, v in result.items() if k != 'step'}, 'train')
        if self.evals is not None and (c.eval_every_epoch or epoch == int(o.epochs)):
          held_out = self.evaluate(state.params, predict)
          result.update({f'eval_{k}': v for k, v in held_out.items()})
          self.console.metrics(step, self.total, held_out, 'eval')
          if writer:
            writer.write(step, held_out, 'eval')
        self._save(step, state, {'epoch': epoch + 1, 'batch': 0})
      for name, arrays in self.more_evals.items():  # E.g. MNLI's mismatched split.
        held_out = self.evaluate(state.params, predict, arrays)
        result.update({f'{name}_{k}': v for k, v in held_out.items()})
        self.console.metrics(step, self.total, held_out, name)
        if writer:
          writer.write(step, held_out, name)
      if self.workdir and self.lead:
        _save(self.workdir, jax.device_get(state.params), c, self.names)
    finally:
      if self.ckpt is not None:
        self.ckpt.close()
      if writer:
        writer.close()
    if not result and self.evals is not None:  # Resumed after the last epoch: report it.
      result = {f'eval_{k}': v for k, v in self.evaluate(state.params, predict).items()}
      result['step'] = step
    self.console.say(f'done: step {step} in {self.console.elapsed()}'
                     + (f'; fine-tuned params in {os.path.join(self.workdir, "params")}'
                        if self.workdir else ''))
    return result

  def _save(self, step, state, position) -> None:
    if self.ckpt is not None:
      self.ckpt.save(step, state, position)

  def _check_finite(self, host, step) -> None:
    bad = sum(int(m['nonfinite']) for m in host)
    if bad and self.config.nonfinite_policy == 'stop':
      raise FloatingPointError(
          f'Non-finite loss or gradient in the epoch ending at step {step}; stopping. Lower '
          "config.optim.learning_rate or set config.nonfinite_policy='skip'.")
    if bad:
      logging.warning('%d updates with a non-finite loss or gradient were dropped', bad)


def read_final_params(workdir: str) -> dict:
  """The params a finished fine-tuning saved in ``<workdir>/params`` (host arrays)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  with ocp.StandardCheckpointer() as ckpt:
    return ckpt.restore(os.path.join(os.path.abspath(workdir), 'params'))


def _save(workdir: str, params, config: ml_collections.ConfigDict, names) -> None:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.abspath(workdir), 'params')
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(path, params, force=True)
  with open(os.path.join(workdir, 'finetune_config.json'), 'w', encoding='utf-8') as f:
    f.write(config.to_json_best_effort(indent=2))
  with open(os.path.join(workdir, 'labels.json'), 'w', encoding='utf-8') as f:
    json.dump(list(names), f)
