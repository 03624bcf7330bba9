r"""Held-out evaluation of a pretraining checkpoint: MLM loss / accuracy / perplexity, NSP/SOP.

  python -m encoder_jax.evaluate --config=configs/bert_small.py --workdir=DIR [--step=N]
  python -m encoder_jax.evaluate --workdir=DIR   # the workdir's own config.json
  python -m encoder_jax.evaluate --workdir=DIR --batch_size=8 --eval_batches=20  # a laptop

The metrics are the training-time evaluation's (``train.evaluate``): the objective's own
masks (``objectives.build``, 15% with 80/10/10 as configured), drawn with ``train=False``
from a key fixed by ``config.seed``, so two runs on the same checkpoint give the same
numbers, on any mesh; MLM loss and accuracy per predicted token over all batches (not a
mean of batch means); perplexity = exp(MLM loss). The pair (NSP/SOP) metrics appear when
``config.objective.names`` has that head. ``--batch_size`` / ``--eval_batches`` (default:
``config.train``'s) bound the memory and the time. The held-out split comes from the
prepared data of the config, which must have been tokenized with the tokenizer pinned in
the workdir (checked by sha256). Results go to ``<workdir>/eval_<step>.json`` and a
readable summary to stdout. The checkpoint is restored onto this machine's devices,
whatever wrote it.
"""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections
from absl import logging
from etils import epath

from encoder_jax.run import checkpointing
from encoder_jax.config import schema as config_base
from encoder_jax import objectives
from encoder_jax.core import length_phases
from encoder_jax import cli
from encoder_jax.loading import loaded as loading
from encoder_jax.core import sharding
from encoder_jax.run import workdir as workdir_lib

def _phase(config: ml_collections.ConfigDict, step: int,
           seq_len: int | None) -> length_phases.Phase:
  phases = length_phases.phases(config.train)
  if seq_len is None:
    return length_phases.phase_at(phases, step)
  for ph in phases:
    if ph.seq_len == seq_len:
      return ph
  raise ValueError(f'--seq_len={seq_len} is not one of config.train.seq_lens '
                   f'{[p.seq_len for p in phases]}')


def check_prepared_tokenizer(workdir: str, pinned, prepared) -> None:
  """The held-out data must be tokenized with the tokenizer the checkpoint was trained with."""
  ours, theirs = pinned.sha256(), prepared.tokenizer.sha256()
  if ours != theirs:
    raise ValueError(
        f'The data prepared for this config ({prepared.directory}) is tokenized with '
        f'{prepared.tokenizer.path} (sha256 {theirs[:12]}), not with the tokenizer {workdir} '
        f'was trained with ({pinned.path}, sha256 {ours[:12]}): the metrics would be '
        'meaningless. Evaluate with the config the run trained with (<workdir>/config.json, '
        'the default), or point config.data.prepared_dir at the data prepared for that run.')


def at_bert_masking(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` with BERT's masks (15%, 80/10/10, the predictions that rate needs): held-out
  MLM figures of runs trained at other rates, comparable with each other and with BERT's.
  Objectives that change the rows beyond the masks (``Entry.alters_rows``: the contrastive
  halves) are left out, so MLM reads whole rows as BERT's does."""
  e = config.copy_and_resolve_references()
  names = tuple(n for n in e.objective.names
                if not (n in objectives.REGISTRY and objectives.REGISTRY[n].alters_rows))
  if not names:
    raise ValueError(f'config.objective.names={tuple(config.objective.names)}: no MLM '
                     'objective to score at BERT\'s masks')
  e.objective.names = names
  config_base.apply_recipe(e, dict(objective=dict(mask_rate=0.15, mask_token_rate=0.8,
                                                  random_token_rate=0.1)))
  return e


def evaluate_checkpoint(config: ml_collections.ConfigDict, workdir: str,
                        step: int | None = None, seq_len: int | None = None,
                        devices=None, batch_size: int | None = None,
                        eval_batches: int | None = None) -> dict:
  """The metrics of one checkpoint on the held-out split (see the module docstring).

  ``batch_size`` / ``eval_batches`` override ``config.train.batch_size`` / ``eval_batches``.
  """
  from encoder_jax import data  # pylint: disable=g-import-not-at-top
  from encoder_jax.run import pretraining  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  for name, value in (('batch_size', batch_size), ('eval_batches', eval_batches)):
    if value is not None:
      if value < 1:
        raise ValueError(f'--{name}={value}; expected >= 1')
      config.train[name] = int(value)
  mesh = None
  if devices is not None:
    mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1)),
                              devices)
  step = checkpointing.resolve_step(workdir, step)
  mesh = mesh or loading.local_mesh(config)
  sharding.check_batch(int(config.train.batch_size), mesh,
                       '--batch_size (default config.train.batch_size)')
  pinned = loading.tokenizer_for_workdir(workdir, config)  # None pinned: fail before preparing.
  prepared = data.load_or_prepare(config)
  check_prepared_tokenizer(workdir, pinned, prepared)
  params, step, mesh = loading.restore_params(config, workdir, step, mesh)
  tables = pretraining.vocab_tables(config, prepared)
  objective = objectives.build(config, tables)
  phase = _phase(config, step, seq_len)
  param_shardings = jax.tree.map(lambda x: x.sharding, params)
  # The step the run evaluated with, when it ran in this process (or a checkpoint of the
  # same config was evaluated before): not traced and compiled again.
  eval_step = pretraining.reused_eval_step(config, tables, objective, mesh, param_shardings, phase)

  start = time.perf_counter()
  sequences = 0

  def counted(batches):
    nonlocal sequences
    for batch in batches:
      sequences += int(config.train.batch_size)
      yield batch

  rows = sharding.process_rows(mesh, int(config.train.batch_size))
  m = pretraining.evaluate(eval_step, params, counted(data.make_eval_iterator(
      config, prepared, phase.seq_len, rows=rows)), mesh, objective,
                     int(config.train.batch_size))
  out = {'step': int(step), 'seq_len': phase.seq_len, 'max_predictions': phase.max_predictions,
         'batches': int(m.pop('batches')), 'batch_size': int(config.train.batch_size),
         'sequences': sequences, 'seed': int(config.seed),
         'mask_rate': float(config.objective.mask_rate),
         'objectives': list(config.objective.names)}
  out.update(m)
  out['report'] = objective.report_lines(m)  # Each objective's own summary lines.
  out['eval_time_s'] = time.perf_counter() - start
  return out


def summary(metrics: dict, workdir: str) -> str:
  lines = [f'Evaluation of {workdir} step {metrics["step"]} on the held-out split: '
           f'{metrics["batches"]} batches of {metrics["batch_size"]}, {metrics["sequences"]} '
           f'sequences of {metrics["seq_len"]} tokens (seed {metrics["seed"]}, mask rate '
           f'{metrics["mask_rate"]:.0%}).']
  lines.extend(metrics.get('report', []))
  note = os.path.join(workdir, loading.IMPORT_REPORT)
  if os.path.exists(note):
    with open(note, encoding='utf-8') as f:
      fresh = [line for line in f if 'freshly initialised' in line]
    if fresh:  # E.g. the NSP head of an imported BertModel: its accuracy means nothing yet.
      lines.append('  Note (imported checkpoint): ' + fresh[0].strip())
  return '\n'.join(lines)


def write(metrics: dict, workdir: str, path: str | None = None) -> str:
  path = path or str(workdir_lib.path(workdir, f'eval_{metrics["step"]}.json'))
  epath.Path(path).write_text(json.dumps(metrics, indent=2, sort_keys=True))
  return path


def main(argv):
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  f = flags.FLAGS
  if not f.workdir:
    raise app.UsageError('--workdir is required')
  cli.quiet_logging()
  config = f.config if f.config is not None else loading.read_run_config(f.workdir)
  metrics = evaluate_checkpoint(config, f.workdir, f.step, f.seq_len,
                                batch_size=f.batch_size, eval_batches=f.eval_batches)
  if jax.process_index() == 0:
    path = write(metrics, f.workdir, f.output)
    print(summary(metrics, f.workdir))
    print(f'Wrote {path}')
    logging.info('eval metrics: %s', metrics)


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file('config', None, 'Run config (default: <workdir>/config.json).',
                                  lock_config=True)
  flags.DEFINE_string('workdir', None, 'Pretraining workdir holding checkpoints/.')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
  flags.DEFINE_integer('seq_len', None, 'Evaluate at this phase length (default: the phase '
                       'of the checkpoint step).')
  flags.DEFINE_integer('batch_size', None, 'Sequences per evaluation batch (default: '
                       'config.train.batch_size); lower it to evaluate a big model on a CPU.')
  flags.DEFINE_integer('eval_batches', None, 'Held-out batches to evaluate (default: '
                       'config.train.eval_batches).')
  flags.DEFINE_string('output', None, 'JSON path (default: <workdir>/eval_<step>.json).')
  cli.run(main)
