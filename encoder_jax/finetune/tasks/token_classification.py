"""Token classification (tagging, e.g. NER): a label per word.

The reader takes ``config.data.tokens_field`` (a list of words, or a whitespace-separated
string) and ``config.data.tags_field`` (one label per word). Each word is tokenized on its
own and its label goes on its *first* piece; other pieces, the specials and padding get
label -1 (ignored by the loss and the metrics); words past ``max_len`` are dropped with
their labels, and counted. The head is a softmax classifier on every final state (no
pooling); the metrics are token accuracy and entity-level F1 (``scores.token_metrics``).
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
  """(examples, tag names) of one split; ``names`` (train's) fixes the mapping."""
  rows, declared = data_lib.read_labelled_rows(spec, d, d.tags_field)
  names = data_lib.label_names(rows, d.tags_field, spec, names or d.labels, declared,
                               split_strings=True)
  to_id = data_lib.label_mapper(names)
  out = data_lib.Examples()
  for r in rows:
    words, tags = data_lib.field(r, d.tokens_field, spec), data_lib.field(r, d.tags_field, spec)
    words = words.split() if isinstance(words, str) else list(words)
    tags = tags.split() if isinstance(tags, str) else list(tags)
    if len(words) != len(tags):
      raise ValueError(f'{spec}: an example has {len(words)} words but {len(tags)} tags')
    out.words.append([str(w) for w in words])
    out.tags.append([to_id(t, spec) for t in tags])
  return out, names


def encode(examples: data_lib.Examples, tokenizer, max_len: int
           ) -> tuple[dict[str, np.ndarray], data_lib.Truncation]:
  """int32 ``input_ids, segment_ids, input_mask`` and ``labels`` [N, max_len]; what was cut."""
  report = data_lib.Truncation(unit='words', max_len=max_len, examples=len(examples))
  rows, segments, row_labels = [], [], []
  added = tokenizer.num_added()
  for words, tags in zip(examples.words, examples.tags):
    body, body_labels = [], []
    pieces_per_word = [p or [tokenizer.unk_id]
                       for p in (tokenizer.encode_batch(list(words)) if words else [])]
    report.words += len(words)
    report.longest = max(report.longest, sum(map(len, pieces_per_word)) + added)
    for k, (pieces, tag) in enumerate(zip(pieces_per_word, tags)):
      if len(body) + len(pieces) > max_len - added:  # Truncated: the rest are dropped.
        report.truncated_examples += 1
        report.dropped_words += len(words) - k
        break
      body += pieces
      body_labels += [tag] + [data_lib.IGNORE] * (len(pieces) - 1)
    row, segs = tokenizer.frame(body)
    # The labels follow the body through the frame; the specials get IGNORE.
    marked, _ = tokenizer.frame([-1 - k for k in range(len(body))])
    row_labels.append([body_labels[-1 - m] if m < 0 else data_lib.IGNORE for m in marked])
    rows.append(row)
    segments.append(segs)
  ids, seg, mask = tokenizer.pad(rows, segments, max_len)
  labels, _, _ = tokenizer.pad(row_labels, None, max_len)
  labels = np.where(mask > 0, labels, data_lib.IGNORE).astype(np.int32)
  return {'input_ids': ids, 'segment_ids': seg, 'input_mask': mask, 'labels': labels}, report


def prepare(config, tokenizer, max_len: int, workdir=None, log=print) -> data_lib.Prepared:
  del workdir
  return data_lib.prepare_labelled(config, tokenizer, max_len, read_split, encode, log)


def head(model_config, config, prepared: data_lib.Prepared):
  return heads.Classifier(model_config, prepared.num_outputs, config.dropout_rate,
                          per_token=True)


def setup(model, network, max_len: int, config) -> task_lib.Task:
  del config
  return task_lib.Task(model, network, max_len, task_lib.classification_loss, task_lib.argmax)


def score(config, prepared: data_lib.Prepared, split: str, arrays, predictions) -> dict:
  del config, split
  return scores.token_metrics(predictions, arrays['labels'], prepared.names)
