"""Fine-tuning loop: pretrained encoder + new head, all layers trained, evaluated per epoch.

``finetune(config, workdir)`` loads the encoder (a pretraining workdir or an HF directory),
reads and encodes the data, trains with AdamW (warmup then linear decay) and returns the
metrics of the last evaluation; the fine-tuned params go to ``<workdir>/params``
(Orbax) and every epoch's metrics to ``<workdir>/metrics.jsonl``.
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

from encoder_jax import loading
from encoder_jax import optimizer as optimizer_lib
from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import heads
from encoder_jax.finetune import metrics as metrics_lib
from encoder_jax.interop import hf_import


def load_pretrained(config: ml_collections.ConfigDict) -> loading.Loaded:
  i = config.init
  if bool(i.workdir) == bool(i.hf_dir):
    raise ValueError('Set exactly one of config.init.workdir and config.init.hf_dir; got '
                     f'workdir={i.workdir!r}, hf_dir={i.hf_dir!r}')
  if i.hf_dir:
    return hf_import.load_hf_dir(i.hf_dir)
  return loading.load_workdir(i.workdir, step=None if i.step < 0 else int(i.step))


def init_params(model: nn.Module, pretrained, max_len: int, seed: int
                ) -> tuple[dict, dict[str, list[str]]]:
  """(params, what came from where): every top-level part of the model that the pretrained
  params have (same shapes) is taken from them, the task head (``heads.HEAD_PARTS``) and any
  part they lack (e.g. the pooler of a kind pretrained without one) is freshly initialised.
  The second value lists the parts 'taken', 'fresh' and pretrained ones 'unused'."""
  ids = jnp.zeros((1, max_len), jnp.int32)
  fresh = nn.unbox(jax.jit(lambda r: model.init(r, ids, ids, ids))(jax.random.PRNGKey(seed)))
  params = dict(fresh['params'])
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
  warmup = int(round(float(o.warmup_fraction) * total_steps))
  schedule = optimizer_lib.learning_rate_schedule(
      ml_collections.ConfigDict(dict(learning_rate=float(o.learning_rate), warmup_steps=warmup)),
      total_steps)
  tx = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=o.weight_decay,
                   mask=optimizer_lib.decay_mask)
  if o.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(o.grad_clip_norm), tx)
  return tx


def _loss(logits, labels, weights):
  """Mean cross-entropy over real examples / labelled tokens (label -1 = ignored)."""
  if labels.ndim == 2:
    weights = weights[:, None] * (labels != data_lib.IGNORE)
  safe = jnp.maximum(labels, 0)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), safe[..., None], -1)[..., 0]
  return (nll * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def finetune(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
  d, o = config.data, config.optim
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

  model = heads.make(config.task, pretrained.model_config, len(names), config.dropout_rate)
  params, parts = init_params(model, pretrained.encoder_params, max_len, config.seed)
  print(f'Fine-tuning {config.task} from {pretrained.source}: taken from the checkpoint: '
        f'{", ".join(parts["taken"]) or "nothing"}; freshly initialised: '
        f'{", ".join(parts["fresh"])}'
        + (f'; not used: {", ".join(parts["unused"])}' if parts['unused'] else '') + '.',
        flush=True)
  steps_per_epoch = math.ceil(len(train_ex) / o.batch_size)
  total = steps_per_epoch * int(o.epochs)
  tx = make_optimizer(o, total)
  opt_state = tx.init(params)
  base_key = jax.random.PRNGKey(config.seed)

  @jax.jit
  def train_step(params, opt_state, batch, step):
    def loss_fn(p):
      logits = model.apply({'params': p}, batch['input_ids'], batch['segment_ids'],
                           batch['input_mask'], deterministic=False,
                           rngs={'dropout': jax.random.fold_in(base_key, step)})
      return _loss(logits, batch['labels'], batch['weights'])
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  @jax.jit
  def predict(params, batch):
    logits = model.apply({'params': params}, batch['input_ids'], batch['segment_ids'],
                         batch['input_mask'], deterministic=True)
    return jnp.argmax(logits, -1)

  def evaluate(params) -> dict:
    preds = []
    for batch in data_lib.batches(evals, int(o.eval_batch_size), None):
      keep = batch['weights'] > 0
      preds.append(np.asarray(predict(params, batch))[keep])
    pred = np.concatenate(preds)
    if config.task == 'sequence_classification':
      return metrics_lib.sequence_metrics(pred, evals['labels'], len(names))
    return metrics_lib.token_metrics(pred, evals['labels'], names)

  if workdir:
    os.makedirs(workdir, exist_ok=True)
  rng = np.random.default_rng(config.seed)
  step, result = 0, {}
  for epoch in range(1, int(o.epochs) + 1):
    start, losses = time.perf_counter(), []
    for batch in data_lib.batches(train, int(o.batch_size), rng):
      params, opt_state, loss = train_step(params, opt_state, batch, step)
      losses.append(loss)
      step += 1
    result = {'epoch': epoch, 'step': step, 'train_loss': float(np.mean(jax.device_get(losses))),
              'epoch_time_s': time.perf_counter() - start}
    if evals is not None:
      result.update({f'eval_{k}': v for k, v in evaluate(params).items()})
      result.update({f'eval_{k}': v for k, v in eval_cut.metrics().items()})
    logging.info('epoch %d: %s', epoch, result)
    print(' '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}'
                   for k, v in result.items()), flush=True)
    if workdir:
      with open(os.path.join(workdir, 'metrics.jsonl'), 'a', encoding='utf-8') as f:
        f.write(json.dumps(result) + '\n')
  if workdir:
    _save(workdir, params, config, names)
  result.update({f'train_{k}': v for k, v in train_cut.metrics().items()})
  result['labels'] = list(names)
  return result


def _save(workdir: str, params, config: ml_collections.ConfigDict, names) -> None:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.abspath(workdir), 'params')
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(path, params, force=True)
  with open(os.path.join(workdir, 'finetune_config.json'), 'w', encoding='utf-8') as f:
    f.write(config.to_json_best_effort(indent=2))
  with open(os.path.join(workdir, 'labels.json'), 'w', encoding='utf-8') as f:
    json.dump(list(names), f)
