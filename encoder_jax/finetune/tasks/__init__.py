"""Fine-tuning task registry: ``config.task`` picks an entry; nothing else names a task.

A task is a file in this package and an :class:`Entry` here that declares what the task
is made of: its reader (``prepare``: the splits read and encoded into arrays), its head
(a flax module on the encoder), its engine setup (loss and predictions,
``finetune.task.Task``), its scorer (the metrics of a split), the poolings it reads and
the ``config.task_settings`` fields it reads (:class:`encoder_jax.core.fields.Field`).
``finetune.train`` runs any entry on the training engine.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

from encoder_jax.core import fields as fields_lib
from encoder_jax.finetune.tasks import question_answering
from encoder_jax.finetune.tasks import sentence_embedding
from encoder_jax.finetune.tasks import sequence_classification
from encoder_jax.finetune.tasks import sequence_regression
from encoder_jax.finetune.tasks import token_classification

HEAD_POOLINGS = ('cls', 'mean')  # The classification head: the pooler's [CLS] or the mean.


@dataclasses.dataclass(frozen=True)
class Entry:
  """One fine-tuning task; ``finetune.train`` and validation read only these declarations."""
  # (config, tokenizer, max_len, workdir, log) -> data.Prepared: the splits, encoded.
  prepare: Callable[..., Any]
  # (model_config, config, prepared) -> flax module: the encoder and the task's head.
  head: Callable[..., Any]
  # (head, network, max_len, config) -> task.Task: its loss and predictions for the engine.
  setup: Callable[..., Any]
  # (config, prepared, split, arrays, predictions) -> metrics of a split.
  score: Callable[..., Any]
  poolings: tuple[str, ...] = HEAD_POOLINGS  # The config.pooling values it reads.
  packing: bool = False  # config.data.packing: whole examples packed into rows.
  fields: tuple[fields_lib.Field, ...] = ()  # The config.task_settings fields it reads.
  # config -> the problem with the config for this task (fields that only make sense
  # together), or None; checked before anything is loaded.
  check: Callable[[Any], str | None] = lambda config: None
  description: str = ''


REGISTRY: dict[str, Entry] = {
    'sequence_classification': Entry(
        sequence_classification.prepare, sequence_classification.head,
        sequence_classification.setup, sequence_classification.score, packing=True,
        description='a label per text or pair (SST-2, MNLI): accuracy, F1'),
    'sequence_regression': Entry(
        sequence_regression.prepare, sequence_regression.head, sequence_regression.setup,
        sequence_regression.score, description='a score per text or pair (STS-B): Pearson'),
    'token_classification': Entry(
        token_classification.prepare, token_classification.head, token_classification.setup,
        token_classification.score, poolings=(),
        description='a label per word (NER): entity F1'),
    'question_answering': Entry(
        question_answering.prepare, question_answering.head, question_answering.setup,
        question_answering.score, poolings=(), fields=question_answering.FIELDS,
        description='an answer span in a context (SQuAD): EM, F1'),
    'sbert_classification': Entry(
        functools.partial(sentence_embedding.prepare, classify=True), sentence_embedding.head,
        sentence_embedding.setup_classification, sentence_embedding.score,
        poolings=sentence_embedding.POOLINGS, fields=sentence_embedding.FIELDS,
        check=functools.partial(sentence_embedding.check, classify=True),
        description='Sentence-BERT on labelled pairs (NLI): STS Spearman'),
    'sbert_contrastive': Entry(
        functools.partial(sentence_embedding.prepare, classify=False), sentence_embedding.head,
        sentence_embedding.setup_contrastive, sentence_embedding.score,
        poolings=sentence_embedding.POOLINGS, fields=sentence_embedding.FIELDS,
        check=functools.partial(sentence_embedding.check, classify=False),
        description='Sentence-BERT, in-batch negatives on pairs or triples: STS Spearman'),
}

TASK = fields_lib.Field('task', 'sequence_classification',
                        fields_lib.names(lambda: REGISTRY, 'a fine-tuning task'),
                        'The task, an entry of finetune.tasks.REGISTRY.')
FIELDS: dict[str, fields_lib.Field] = fields_lib.merge(
    (e.fields for e in REGISTRY.values()), 'task_settings')


def get(name: str) -> Entry:
  """The entry of ``config.task``; an unknown name is an error naming the registered ones."""
  if name not in REGISTRY:
    raise ValueError(f'config.task={name!r}; expected one of {sorted(REGISTRY)}')
  return REGISTRY[name]
