"""Sequence regression (STS-B): a real-valued score per text or text pair.

The reader takes ``config.data.text_fields`` and a numeric ``config.data.label_field``;
the head is one output on the pooled state, trained with the mean squared error; the
metrics are Pearson, Spearman and MSE (``finetune.scores.regression_metrics``).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import numpy as np

from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import heads
from encoder_jax.finetune import scores
from encoder_jax.finetune import task as task_lib


def read_split(spec: str, d: ml_collections.ConfigDict, names=None
               ) -> tuple[data_lib.Examples, list[str]]:
  """(examples, []) of one split: a score per text, no label names."""
  del names
  rows, _ = data_lib.read_labelled_rows(spec, d, d.label_field)
  out = data_lib.Examples()
  for r in rows:
    out.texts.append(tuple(str(data_lib.field(r, k, spec)) for k in d.text_fields))
    value = data_lib.field(r, d.label_field, spec)
    try:
      out.labels.append(float(value))
    except (TypeError, ValueError) as e:
      raise ValueError(f'{spec}: label {value!r} is not a number (task '
                       'sequence_regression)') from e
  return out, []


def encode(examples: data_lib.Examples, tokenizer, max_len: int):
  return data_lib.encode_texts(examples, tokenizer, max_len, np.float32)


def prepare(config, tokenizer, max_len: int, workdir=None, log=print) -> data_lib.Prepared:
  del workdir
  return data_lib.prepare_labelled(config, tokenizer, max_len, read_split, encode, log)


def head(model_config, config, prepared: data_lib.Prepared):
  del prepared
  return heads.Classifier(model_config, 1, config.dropout_rate, pooling=config.pooling)


def mse_loss(logits, batch):
  """Mean squared error of the one output, over real examples."""
  w = batch['weights']
  loss = (jnp.square(logits[:, 0] - batch['labels']) * w).sum() / jnp.maximum(w.sum(), 1.0)
  return loss, {'loss': loss, 'examples': w.sum()}


def setup(model, network, max_len: int, config) -> task_lib.Task:
  del config
  return task_lib.Task(model, network, max_len, mse_loss, lambda logits: logits[:, 0],
                       console_metrics=())


def score(config, prepared: data_lib.Prepared, split: str, arrays, predictions) -> dict:
  del config, prepared, split
  return scores.regression_metrics(predictions, arrays['labels'])
