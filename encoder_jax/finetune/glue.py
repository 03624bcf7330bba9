r"""GLUE: the nine tasks from tensorflow-datasets, each with its official metric, one table.

  python -m encoder_jax.finetune.glue --workdir=PRETRAIN_DIR --out=/tmp/glue
  python -m encoder_jax.finetune.glue --hf_dir=HF_DIR --tasks=cola,stsb,mnli --out=/tmp/glue

Each task fine-tunes the encoder (``finetune.train``, the training engine) on its train
split and scores its validation split(s) (GLUE's test labels are not public), with the
metric GLUE reports: CoLA Matthews correlation; STS-B Pearson and Spearman (a regression
head, MSE); MRPC and QQP F1 and accuracy; MNLI accuracy on matched and mismatched; SST-2,
QNLI, RTE and WNLI accuracy. The GLUE score is the mean over tasks of each task's score
(the mean of its metrics where it has two; MNLI counts matched and mismatched as two
tasks, as the GLUE leaderboard does). Writes ``glue.md`` and ``glue.json`` into ``--out``
and each task's fine-tuning into ``--out/<task>`` (rerunning resumes).

The data are the tfds ``glue/<task>`` datasets (``--tfds_data_dir`` where they are
prepared; ``--tfds_name`` reads another dataset with the same configs and fields).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics

import ml_collections

from encoder_jax.finetune import config as finetune_config
from encoder_jax.finetune import train as finetune_train


@dataclasses.dataclass(frozen=True)
class GlueTask:
  text_fields: tuple[str, ...]
  metrics: tuple[str, ...]  # Result keys (without 'eval_') that make up the task's score.
  eval_split: str = 'validation'
  finetune_task: str = 'sequence_classification'  # The finetune.tasks entry it trains.
  more_evals: str = ''  # finetune config.data.more_evals, with {name} for the dataset.
  # Its GLUE columns (name -> result key), each a task of its own in the GLUE score (MNLI's
  # matched and mismatched); empty: the metrics, averaged into one task score.
  columns: tuple[tuple[str, str], ...] = ()

  def scores(self, result: dict) -> dict[str, float]:
    """The task's GLUE columns from a fine-tuning result."""
    pairs = self.columns or tuple((m, f'eval_{m}') for m in self.metrics)
    return {name: float(result[key]) for name, key in pairs}


TASKS: dict[str, GlueTask] = {
    'cola': GlueTask(('sentence',), ('matthews',)),
    'sst2': GlueTask(('sentence',), ('accuracy',)),
    'mrpc': GlueTask(('sentence1', 'sentence2'), ('f1', 'accuracy')),
    'qqp': GlueTask(('question1', 'question2'), ('f1', 'accuracy')),
    'stsb': GlueTask(('sentence1', 'sentence2'), ('pearson', 'spearman'),
                     finetune_task='sequence_regression'),
    'mnli': GlueTask(('premise', 'hypothesis'), ('accuracy',), eval_split='validation_matched',
                     more_evals='mismatched={name}:validation_mismatched',
                     columns=(('matched', 'eval_accuracy'),
                              ('mismatched', 'mismatched_accuracy'))),
    'qnli': GlueTask(('question', 'sentence'), ('accuracy',)),
    'rte': GlueTask(('sentence1', 'sentence2'), ('accuracy',)),
    'wnli': GlueTask(('sentence1', 'sentence2'), ('accuracy',)),
}


@dataclasses.dataclass
class GlueSettings:
  """BERT's GLUE fine-tuning recipe (one of its grid points)."""
  epochs: int = 3
  batch_size: int = 32
  learning_rate: float = 2e-5
  max_len: int = 128
  seed: int = 0
  dtype: str = ''


def task_config(task: str, init: dict, s: GlueSettings, tfds_name: str = 'glue',
                tfds_data_dir: str = '') -> ml_collections.ConfigDict:
  t = TASKS[task]
  name = f'tfds:{tfds_name}/{task}'
  c = finetune_config.base_config()
  c.task = t.finetune_task
  c.seed = int(s.seed)
  c.init.update(init)
  c.data.update(train=f'{name}:train', eval=f'{name}:{t.eval_split}',
                more_evals=t.more_evals.format(name=name), tfds_data_dir=tfds_data_dir,
                text_fields=t.text_fields, label_field='label', max_len=int(s.max_len))
  c.optim.update(learning_rate=float(s.learning_rate), epochs=int(s.epochs),
                 batch_size=int(s.batch_size), eval_batch_size=64, warmup_fraction=0.1)
  c.eval_every_epoch = False
  c.dtype = s.dtype
  return c


def scores(task: str, result: dict) -> dict[str, float]:
  """The task's GLUE columns from a fine-tuning result (MNLI: matched and mismatched)."""
  return TASKS[task].scores(result)


def glue_score(columns: dict[str, dict[str, float]]) -> float:
  """The mean over tasks of each task's mean metric (MNLI-m and -mm as two tasks)."""
  per_task = []
  for task, cols in columns.items():
    if TASKS[task].columns:
      per_task += list(cols.values())
    else:
      per_task.append(statistics.fmean(cols.values()))
  return statistics.fmean(per_task)


def table(columns: dict[str, dict[str, float]]) -> str:
  head = ['| task | metric | score |', '|---|---|---|']
  rows = [f'| {task} | {m} | {100 * v:.1f} |' for task, cols in columns.items()
          for m, v in cols.items()]
  return '\n'.join(head + rows + [f'| GLUE score | mean over tasks | '
                                  f'{100 * glue_score(columns):.1f} |'])


def run(init: dict, out: str, tasks=None, settings: GlueSettings | None = None,
        tfds_name: str = 'glue', tfds_data_dir: str = '', log=print) -> dict:
  s = settings or GlueSettings()
  tasks = list(tasks or TASKS)
  unknown = [t for t in tasks if t not in TASKS]
  if unknown:
    raise ValueError(f'--tasks has unknown {unknown}; expected some of {list(TASKS)}')
  os.makedirs(out, exist_ok=True)
  columns, results = {}, {}
  for task in tasks:
    log(f'GLUE: fine-tuning {task}')
    workdir = os.path.join(out, task)
    result = finetune_train.completed(
        finetune_train.finetune(task_config(task, init, s, tfds_name, tfds_data_dir), workdir),
        f'GLUE: {task}\'s fine-tune', f'its checkpoints in {workdir} are kept, and rerunning '
        'the same command resumes it')
    results[task] = {k: v for k, v in result.items() if k != 'labels'}
    columns[task] = scores(task, result)
    summary = dict(init=dict(init), settings=dataclasses.asdict(s), columns=columns,
                   glue_score=glue_score(columns), results=results)
    with open(os.path.join(out, 'glue.json'), 'w', encoding='utf-8') as f:
      json.dump(summary, f, indent=2)
    with open(os.path.join(out, 'glue.md'), 'w', encoding='utf-8') as f:
      f.write(table(columns) + '\n')
  log(table(columns))
  return summary


def main(argv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  del argv
  f = flags.FLAGS
  s = GlueSettings(epochs=f.epochs, batch_size=f.batch_size, learning_rate=f.learning_rate,
                   max_len=f.max_len, seed=f.seed, dtype=f.dtype)
  init = dict(workdir=f.workdir or '', hf_dir=f.hf_dir or '')
  run(init, f.out, [t.strip() for t in f.tasks.split(',') if t.strip()] or None, s,
      f.tfds_name, f.tfds_data_dir)


if __name__ == '__main__':
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.define_finetune_flags('Where each task runs and glue.md / glue.json go.',
                            epochs=3, batch_size=32, learning_rate=2e-5, max_len=128)
  flags.DEFINE_string('tasks', '', f'Comma-separated subset of {list(TASKS)}; default all.')
  flags.DEFINE_string('dtype', '', "'' (the checkpoint's), 'float32' or 'bfloat16'.")
  flags.DEFINE_string('tfds_name', 'glue', 'The tfds dataset holding the task configs.')
  cli.run(main)
