"""Span contrastive learning beside MLM (DeCLUTR, Giorgi et al. 2021; the InfoNCE loss of
SimCLR and SimCSE): the two halves of a row are two views of one text, the halves of the
other rows of the batch are the negatives.

Each row is cut at the middle of its tokens (``input_mask``) into two spans that do not
attend to each other: the objective gives the row ``document_ids`` 1 and 2 (0 on the
padding), so the encoder reads them as two packed documents (``models.packing``: attention
within a span, positions restarting at the second span's first token) and one span cannot
copy the other's content into its states. The embedding of a span is the mean of its final
token states (the pooling the probe and ``embed`` use), L2-normalised; with z1, z2 [B, H]
the spans of each row,

    L = contrastive_weight * (CE(z1 z2^T / t, I) + CE(z2 z1^T / t, I)) / 2

(``contrastive_weight`` 0.3 by default: at the bake-off's CPU budget it fine-tuned better
than 1 and kept more of MLM's accuracy; docs/results/bakeoff_cpu.md has the rows.)

over the rows with at least ``MIN_SPAN`` tokens in each half (``contrastive_rows``
counts them). In-batch negatives, so the batch is the number of candidates: the global
batch (the loss is computed on the whole sharded batch), or one micro-batch with
``train.grad_accum_steps`` > 1. Rows from one document are negatives of each other; the
shuffle pool (``data.shuffle_pool_examples``) keeps them rare. MLM reads the same pass
(its context is the row's half: the cost of sharing the pass). The loss needs every
position's final state, so the last layer runs at every row (counted in the FLOPs).

Every training row is split, so the network never attends over more than half a row
while it pretrains (rotary distances of L/2 and beyond are never trained); a learned
position table would leave its second half untrained (the halves restart their
positions), so the objective needs ``model.rotary=True``, unless the run continues a
pretrained model (``config.init``), whose table is already trained (e.g. all-MiniLM-L6-v2
continued on a domain's text). ``data.pair_kind=
'full_sentences'`` rows may run across a document boundary (their halves are then two
texts): measured better than ``'doc_sentences'`` on BBC News at the bake-off's budget,
whose single-document rows are often short.
"""

from __future__ import annotations

import jax.numpy as jnp

from encoder_jax import fields as fields_lib
from encoder_jax.objectives import base

MIN_SPAN = 4  # Tokens each half needs for its row to count.

FIELDS: tuple[fields_lib.Field, ...] = (
    fields_lib.Field('contrastive_weight', 0.3, fields_lib.number(0, lo_open=True),
                     'Weight of the span contrastive loss (added to the other objectives; '
                     "the bake-off's measured choice, docs/results/bakeoff_cpu.md)."),
    fields_lib.Field('contrastive_temperature', 0.05, fields_lib.number(0, lo_open=True),
                     'Temperature t of the span contrastive softmax (SimCSE: 0.05).'),
)


def check_config(c) -> str | None:
  """What the objective cannot train: an attention kind that reads no document ids (the
  halves would see each other), or a learned position table from scratch (half of it
  never trained)."""
  from encoder_jax.models import attention_kinds  # pylint: disable=g-import-not-at-top
  attention = c.model.get('attention_kind', 'dot_product')
  if not attention_kinds.reads_document_ids(attention):
    return (f"config.objective.names={tuple(c.objective.names)} has 'contrastive', which "
            f"keeps a row's halves apart by document ids, and config.model.attention_kind="
            f'{attention!r} reads none; expected one of {attention_kinds.document_readers()}')
  init = c.get('init')
  pretrained = bool(init and (init.get('workdir') or init.get('hf_dir')))
  if not c.model.get('rotary', False) and not pretrained:
    return (f"config.objective.names={tuple(c.objective.names)} has 'contrastive', whose "
            'halves restart their positions: a learned position table would train its first '
            'half only; expected config.model.rotary=True, or a run that starts from a '
            'pretrained model (config.init.workdir / hf_dir), whose table is trained')
  return None


def halves(input_mask_BxL):
  """int32 [B, L]: 1 on the first half of each row's tokens, 2 on the second, 0 on the
  padding (a row of n tokens: positions below ceil(n / 2) are the first half)."""
  mask_BxL = input_mask_BxL.astype(jnp.int32)
  n_B = mask_BxL.sum(axis=1)
  index_BxL = jnp.arange(mask_BxL.shape[1], dtype=jnp.int32)[None]
  return jnp.where(index_BxL < (n_B[:, None] + 1) // 2, 1, 2) * mask_BxL


def info_nce(z1_BxH, z2_BxH, weights_B, temperature: float):
  """(symmetric InfoNCE loss, accuracy: the share of spans whose partner scores highest)
  over the rows of weight 1; the other rows are neither anchors nor candidates."""
  logits_BxB = (z1_BxH @ z2_BxH.T) / temperature
  valid_BxB = (weights_B[:, None] * weights_B[None, :]) > 0
  logits_BxB = jnp.where(valid_BxB, logits_BxB, -1e9)
  labels_B = jnp.arange(z1_BxH.shape[0])
  a, acc_a = base.cross_entropy(logits_BxB, labels_B, weights_B)
  b, acc_b = base.cross_entropy(logits_BxB.T, labels_B, weights_B)
  return (a + b) / 2, (acc_a + acc_b) / 2


class SpanContrastive(base.Objective):
  name = 'contrastive'
  metric_weights = {'contrastive_loss': 'contrastive_rows',
                    'contrastive_accuracy': 'contrastive_rows'}
  console_metrics = (('contrastive_accuracy', 'ctr_acc', '{:.1%}'),)

  def __init__(self, weight: float, temperature: float):
    self.weight = float(weight)
    self.temperature = float(temperature)

  def check(self, network):
    if not network.kind.packed_rows:
      raise ValueError(f"config.objective.names includes 'contrastive', which keeps a row's "
                       f'two halves apart as packed documents, but config.model.kind='
                       f'{network.kind.name!r} cannot read packed rows')

  def corrupt(self, batch, rng, phase):
    del rng, phase
    return {**batch, 'document_ids': halves(batch['input_mask'])}

  def gather_positions(self, batch, length):
    b = batch['input_ids'].shape[0]
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))

  def gathered_rows(self, phase):
    return int(phase.seq_len)

  def loss(self, outputs, batch):
    h_BxLxH = outputs['gathered'][self.name].astype(jnp.float32)
    ids_BxL = batch['document_ids']
    spans = []
    for span in (1, 2):
      w_BxL = (ids_BxL == span).astype(jnp.float32)
      count_B = w_BxL.sum(axis=1)
      mean_BxH = (h_BxLxH * w_BxL[..., None]).sum(axis=1) / jnp.maximum(count_B, 1.0)[:, None]
      norm_B = jnp.sqrt((mean_BxH ** 2).sum(axis=-1, keepdims=True) + 1e-12)
      spans.append((mean_BxH / norm_B, count_B))
    (z1, n1), (z2, n2) = spans
    weights_B = ((n1 >= MIN_SPAN) & (n2 >= MIN_SPAN)).astype(jnp.float32)
    loss, accuracy = info_nce(z1, z2, weights_B, self.temperature)
    return self.weight * loss, {'contrastive_loss': loss, 'contrastive_accuracy': accuracy,
                                'contrastive_rows': weights_B.sum()}

  def head_flops_per_sequence(self, network, phase):
    """The similarity of a span with every span of the batch is not counted per sequence
    (it is B x B x hidden a batch, well under the encoder's cost)."""
    return 0.0

  def report_lines(self, metrics):
    if 'contrastive_loss' not in metrics:
      return []
    return [f'  SPANS loss {metrics["contrastive_loss"]:.4f}  accuracy '
            f'{metrics["contrastive_accuracy"]:.2%}  '
            f'({int(round(metrics["contrastive_rows"]))} rows)']
