"""Sentence-BERT (Reimers & Gurevych, 2019): the siamese network, its task, its data.

See ``encoder_jax.finetune.sbert`` for the command, the objectives and the export.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoder_jax.core import fields as fields_lib
from encoder_jax.loading import inference
from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import scores
from encoder_jax.finetune import task as task_lib
from encoder_jax.models import layers
from encoder_jax.models import registry as models

OBJECTIVES = ('classification', 'contrastive')  # Registered as the tasks sbert_<objective>.
SIDES = ('', 'b_', 'c_')  # Array-name prefixes of the first, second and third text.


class Siamese(nn.Module):
  """One encoder for every side (rows of all sides stacked on the batch axis, one pass),
  pooled; ``classify``: the softmax head on (u, v, |u - v|) of the first two sides."""
  config: object
  pooling: str = 'mean'
  cls_index: int = 0
  num_labels: int = 0

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, *, deterministic: bool = True,
               classify: bool = False):
    c = self.config
    out = models.get(c.kind).encode(c, input_ids, segment_ids, input_mask,
                                    deterministic=deterministic, pool=False)
    emb = inference.pool(out['sequence_output'], input_mask, self.pooling, self.cls_index)
    if not classify:
      return emb
    u, v = jnp.split(emb[:2 * (emb.shape[0] // 2)], 2)
    features = jnp.concatenate([u, v, jnp.abs(u - v)], axis=-1)
    return layers.Dense((3 * emb.shape[-1],), (self.num_labels,), ('embed',), (None,),
                        c.initializer_range, jnp.float32, name='classifier')(features)


def _stack(batch, sides):
  return [jnp.concatenate([batch[f'{p}{k}'] for p in sides])
          for k in ('input_ids', 'segment_ids', 'input_mask')]


class SiameseTask(task_lib.Task):
  """The engine's contract for Sentence-BERT: every side through one encoder, the
  objective's loss on the embeddings; prediction = the cosine of the first two sides
  (scored against the gold similarity)."""

  def __init__(self, model: Siamese, network, max_len: int, loss, sides: int,
               classify: bool = False):
    super().__init__(model, network, max_len, loss, task_lib.identity)
    self.sides, self.classify = sides, classify

  def init(self, rng):
    ids = jnp.zeros((2, self.max_len), jnp.int32)
    return self.model.init(rng, ids, ids, ids, classify=self.classify)['params']

  def logits(self, params, batch, rng=None, train: bool = False):
    """The classifier's logits (``classify``), else the embeddings of every side."""
    rngs = {'dropout': self.dropout_key(rng)} if train else {}
    sides = SIDES[:2] if self.classify else SIDES[:self.sides]
    return self.model.apply({'params': params}, *_stack(batch, sides), deterministic=not train,
                            classify=self.classify, rngs=rngs)

  def predict(self, params, batch):
    emb = inference.l2_normalize(self.model.apply({'params': params}, *_stack(batch, SIDES[:2])))
    n = batch['input_ids'].shape[0]
    return (emb[:n] * emb[n:]).sum(-1)


def contrastive_loss(scale: float, sides: int):
  """In-batch negatives (MultipleNegativesRankingLoss): each anchor's positive against every
  other positive of the batch (and every hard negative), cross-entropy over scale x cosine."""
  def loss(emb, batch):
    w = batch['weights']
    n = w.shape[0]
    emb = inference.l2_normalize(emb)
    anchors, candidates = emb[:n], emb[n:]  # Positives, then hard negatives.
    scores = scale * anchors @ candidates.T  # [B, B * (sides - 1)]
    real = jnp.tile(w > 0, sides - 1)
    scores = jnp.where(real[None, :], scores, -1e9)  # Padding rows are no candidates.
    return task_lib.classification_loss(scores, {'labels': jnp.arange(n), 'weights': w})
  return loss


# ---------------------------------------------------------------------------- data


def read_texts(spec: str, fields: tuple[str, ...], label_field: str | None,
               data_config: ml_collections.ConfigDict) -> tuple[list[tuple[str, ...]], list, int]:
  """(texts per row, labels or [], rows skipped for a missing gold label)."""
  rows, _ = data_lib.read_rows(spec, data_config, [label_field] if label_field else [])
  texts, labels, skipped = [], [], 0
  for r in rows:
    if label_field:
      label = data_lib.field(r, label_field, spec)
      if isinstance(label, (int, np.integer)) and int(label) < 0:  # SNLI: no gold label.
        skipped += 1
        continue
      labels.append(label)
    texts.append(tuple(str(data_lib.field(r, f, spec)) for f in fields))
  if not texts:
    raise ValueError(f'{spec!r} has no usable rows ({skipped} without a gold label)')
  return texts, labels, skipped


def encode(tok, texts: list[tuple[str, ...]], max_len: int, sides: int) -> dict[str, np.ndarray]:
  out = {}
  for k, prefix in enumerate(SIDES[:sides]):
    x = tok.encode_inputs([t[k] for t in texts], max_len=max_len, length=max_len)
    out.update({f'{prefix}{name}': x[name] for name in ('input_ids', 'segment_ids',
                                                        'input_mask')})
  return out


# ---------------------------------------------------------------------------- the task

FIELDS = (
    fields_lib.Field('eval_text_fields', ('sentence1', 'sentence2'),
                     fields_lib.sequence_of(fields_lib.string(non_empty=True)),
                     'Sentence-BERT: the two text fields of a row of the STS evaluation data.'),
    fields_lib.Field('eval_label_field', 'label', fields_lib.string(non_empty=True),
                     'Sentence-BERT: the gold similarity field of the STS evaluation data.'),
    fields_lib.Field('normalize', True, fields_lib.boolean(),
                     'Sentence-BERT: the export embeds L2-normalised (a Normalize module).'),
    fields_lib.Field('scale', 20.0, fields_lib.number(0.0, lo_open=True),
                     'Sentence-BERT contrastive: the scale of the cosines in the softmax.'),
)
POOLINGS = inference.POOLINGS


def check(config, classify: bool = True) -> str | None:
  """Pairs for the classification objective; pairs or triples for the contrastive one."""
  sides = len(config.data.text_fields)
  if sides not in (2, 3) or (classify and sides != 2):
    return (f'config.data.text_fields={tuple(config.data.text_fields)}: expected two fields '
            '(pairs), or three (anchor, positive, hard negative) for the contrastive '
            f'objective (task {config.task})')
  return None


def prepare(config, tokenizer, max_len: int, workdir=None, log=print,
         classify: bool = True) -> data_lib.Prepared:
  """Training pairs (labelled, ``classify``) or pairs / triples, and the STS evaluation
  pairs with their gold similarity; rows without a gold label are skipped and counted."""
  del workdir
  d, s = config.data, config.task_settings
  sides = len(d.text_fields)
  label_field = d.label_field if classify else ''
  texts, labels, skipped = read_texts(d.train, tuple(d.text_fields), label_field, d)
  out = data_lib.Prepared(train=encode(tokenizer, texts, max_len, sides),
                          context={'cls_index': tokenizer.cls_index})
  if label_field:
    out.names = sorted({str(l) for l in labels}, key=lambda x: (len(x), x))
    to_id = data_lib.label_mapper(out.names)
    out.train['labels'] = np.asarray([to_id(l, d.train) for l in labels], np.int32)
    out.num_outputs = max(1, len(out.names))
  log(f'Sentence-BERT ({config.task}, {config.pooling} pooling): {len(texts)} training rows'
      + (f', {skipped} without a gold label skipped' if skipped else '')
      + (f', labels {out.names}' if out.names else ''))
  if d.eval:
    eval_texts, gold, _ = read_texts(d.eval, tuple(s.eval_text_fields), s.eval_label_field, d)
    out.evals = encode(tokenizer, eval_texts, max_len, 2)
    out.context['eval'] = np.asarray(gold, np.float64)
  out.report.update(train_rows=len(texts), train_skipped=skipped)
  return out


def head(model_config, config, prepared: data_lib.Prepared) -> Siamese:
  return Siamese(model_config, config.pooling, prepared.context['cls_index'],
                 len(prepared.names))


def setup_classification(model, network, max_len: int, config) -> SiameseTask:
  del config
  return SiameseTask(model, network, max_len, task_lib.classification_loss, 2, classify=True)


def setup_contrastive(model, network, max_len: int, config) -> SiameseTask:
  sides = len(config.data.text_fields)
  return SiameseTask(model, network, max_len,
                     contrastive_loss(float(config.task_settings.scale), sides), sides)


def score(config, prepared: data_lib.Prepared, split: str, arrays, cosine) -> dict:
  """STS: Spearman and Pearson correlation of the cosines with the gold similarity."""
  del config, arrays
  gold = prepared.context[split]
  return {'spearman': scores.spearman(cosine, gold), 'pearson': scores.pearson(cosine, gold),
          'examples': len(gold)}
