"""Sequence classification (SST-2, MNLI, MRPC...): a label per text or text pair.

The reader takes ``config.data.text_fields`` (one field, or two for pairs) and
``config.data.label_field`` (class names or ids); the head is a softmax classifier on the
pooled state (``config.pooling``: the pooler's [CLS] or the tokens' mean); the metrics are
accuracy and F1 (binary) or macro-F1 (``finetune.scores.sequence_metrics``). Whole examples
may be packed into rows (``config.data.packing``, mean pooling).
"""

from __future__ import annotations

import ml_collections
import numpy as np

from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import heads
from encoder_jax.finetune import scores
from encoder_jax.finetune import task as task_lib


def read_split(spec: str, d: ml_collections.ConfigDict, names=None
               ) -> tuple[data_lib.Examples, list[str]]:
  """(examples, label names) of one split; ``names`` (train's) fixes the mapping."""
  rows, declared = data_lib.read_labelled_rows(spec, d, d.label_field)
  names = data_lib.label_names(rows, d.label_field, spec, names or d.labels, declared)
  to_id = data_lib.label_mapper(names)
  out = data_lib.Examples()
  for r in rows:
    out.texts.append(tuple(str(data_lib.field(r, k, spec)) for k in d.text_fields))
    out.labels.append(to_id(data_lib.field(r, d.label_field, spec), spec))
  return out, names


def encode(examples: data_lib.Examples, tokenizer, max_len: int):
  return data_lib.encode_texts(examples, tokenizer, max_len, np.int32)


def prepare(config, tokenizer, max_len: int, workdir=None, log=print) -> data_lib.Prepared:
  del workdir
  return data_lib.prepare_labelled(config, tokenizer, max_len, read_split, encode, log)


def head(model_config, config, prepared: data_lib.Prepared):
  return heads.Classifier(model_config, prepared.num_outputs, config.dropout_rate,
                          pooling=config.pooling)


def setup(model, network, max_len: int, config) -> task_lib.Task:
  del config
  return task_lib.Task(model, network, max_len, task_lib.classification_loss, task_lib.argmax)


def score(config, prepared: data_lib.Prepared, split: str, arrays, predictions) -> dict:
  del config, split
  return scores.sequence_metrics(predictions, arrays['labels'], len(prepared.names))
