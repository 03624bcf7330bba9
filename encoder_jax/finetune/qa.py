r"""Extractive question answering (SQuAD v1.1 / v2.0) on any registered encoder kind.

  python -m encoder_jax.finetune.qa --workdir=PRETRAIN_DIR --out=/tmp/squad \
      --train=tfds:squad/v1.1:train --eval=tfds:squad/v1.1:validation
  python -m encoder_jax.finetune.qa --hf_dir=HF_DIR --out=/tmp/squad2 --version_2 \
      --train=json:train-v2.0.json --eval=json:dev-v2.0.json

As google-research/bert's ``run_squad.py``:

- **Windows.** The question (at most ``max_query_length`` pieces) and a window of the
  context share one row of ``max_len``; a context longer than the window is covered by
  windows whose starts are ``doc_stride`` pieces apart (384 / 128 by default), each framed
  as the tokenizer frames a pair (``[CLS] q [SEP] c [SEP]``, or the checkpoint's own).
- **Labels.** A window holding the whole answer is labelled with its first and last
  piece; a window that does not (and a SQuAD v2 question without an answer) points at
  the classifier token, as run_squad does.
- **Decoding.** In every window the ``n_best`` highest start and end logits over context
  pieces give candidate spans (end >= start, at most ``max_answer_length`` pieces); the
  best-scoring span over all windows of a question (start + end logit) is the answer,
  cut from the original context by **character offsets** (every tokenizer kind reports
  them, ``Tokenizer.encode_with_offsets``), so answers map back exactly, unicode included.
  SQuAD v2 answers "" when the null score (the classifier token's start + end logits,
  smallest over windows) exceeds the best span's by more than ``null_score_threshold``.
- **Metrics.** Exact match and F1 of the official evaluation script (v2.0's): answers
  normalised (lower case, punctuation and the articles a / an / the removed, whitespace
  collapsed), the best over the gold answers; a question without an answer scores 1 only
  for "". v2 also reports HasAns and NoAns.

Data: tfds ``squad/v1.1`` and ``squad/v2.0`` (``tfds:NAME:SPLIT``), or a SQuAD-format JSON
file (``json:PATH``: ``data[].paragraphs[].{context, qas[].{id, question, answers,
is_impossible}}``). Training uses the first gold answer of each question, as run_squad does.
"""

from __future__ import annotations

import ml_collections

from encoder_jax.core import fields as fields_lib
from encoder_jax.finetune import config as finetune_config
from encoder_jax.finetune import train as finetune_train
from encoder_jax.finetune.tasks import question_answering
from encoder_jax.finetune.tasks.question_answering import (  # pylint: disable=unused-import
    Example, Windows, decode, exact, f1, normalize_answer, read, squad_metrics, windows)


# ---------------------------------------------------------------------------- fine-tuning


def qa_config(init: dict, train_spec: str, eval_spec: str, epochs: int = 2,
              batch_size: int = 32, learning_rate: float = 3e-5, seed: int = 0,
              tfds_data_dir: str = '', max_len: int = 384, **settings
              ) -> ml_collections.ConfigDict:
  """The fine-tuning config of the task ``question_answering`` at run_squad's budget;
  ``settings`` set its ``task_settings`` (``question_answering.FIELDS``: their defaults
  are run_squad's, checked with the rest of the config when it runs)."""
  c = finetune_config.base_config()
  c.task = 'question_answering'
  c.seed = seed
  c.init.update(init)
  c.data.update(train=train_spec, eval=eval_spec, tfds_data_dir=tfds_data_dir, max_len=max_len)
  c.optim.update(learning_rate=learning_rate, epochs=epochs, batch_size=batch_size,
                 eval_batch_size=32, warmup_fraction=0.1)
  c.task_settings.update(settings)
  return c


def finetune(config: ml_collections.ConfigDict, workdir: str | None = None, log=print) -> dict:
  """Fine-tunes the span head on ``config.data.train`` and scores ``config.data.eval``
  (the registered task ``question_answering``, its settings in ``config.task_settings``)."""
  config = config.copy_and_resolve_references()
  config.task = 'question_answering'
  return finetune_train.finetune(config, workdir, log)


def main(argv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  del argv
  f = flags.FLAGS
  c = qa_config(dict(workdir=f.workdir or '', hf_dir=f.hf_dir or ''), f.train, f.eval,
                f.epochs, f.batch_size, f.learning_rate, f.seed, f.tfds_data_dir, f.max_len,
                **fields_lib.flag_values(question_answering.FIELDS))
  result = finetune(c, f.out)
  print('final: ' + ', '.join(f'{k}={v}' for k, v in result.items()))


if __name__ == '__main__':
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.define_finetune_flags('The fine-tuning workdir (checkpoints, predictions.json).',
                            epochs=2, batch_size=32, learning_rate=3e-5, max_len=384)
  flags.DEFINE_string('train', 'tfds:squad/v1.1:train', "'tfds:NAME:SPLIT' or 'json:PATH'.")
  flags.DEFINE_string('eval', 'tfds:squad/v1.1:validation', 'The scored split.')
  fields_lib.define_flags(question_answering.FIELDS)  # --doc_stride, --version_2, ...
  cli.run(main)
