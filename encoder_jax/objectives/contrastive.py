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
shuffle pool (``data.shuffle_pool_examples``) keeps them rare. Beside MLM, both read the
same pass (its context is the row's half: the cost of sharing the pass); alone
(``names=('contrastive',)``), it continues a sentence encoder on a domain's text without
an MLM head to train (the network's head then runs at one position a row, unscored). The
loss needs every position's final state, so the last layer runs at every row (counted in
the FLOPs).

Every training row is split, so the network never attends over more than half a row
while it pretrains (rotary distances of L/2 and beyond are never trained); a learned
position table would leave its second half untrained (the halves restart their
positions), so the objective needs ``model.rotary=True``, unless the run continues a
pretrained model (``config.init``), whose table is already trained (e.g. all-MiniLM-L6-v2
continued on a domain's text). ``data.pair_kind=
'full_sentences'`` rows may run across a document boundary (their halves are then two
texts): measured better than ``'doc_sentences'`` on BBC News at the bake-off's budget,
whose single-document rows are often short, for a network from scratch. A sentence
encoder continued on a domain's text is the other way round: the halves of two texts
are false positives to it, and ``'doc_sentences'`` measured better (the ``minilm_continued``
row of the bake-off, docs/results/bakeoff_cpu_hour.md).

With ``data.pair_kind='packed_documents'`` (short texts packed several to a row, each read
as if alone) **every text of a row is cut in two** instead: the halves of one text are the
positives, the halves of every other text of the batch the negatives, so a row of short
texts (critics' snippets, tweets) yields several pairs, each from one text, where cutting
the row would pair two unrelated texts. A text counts with ``MIN_SPAN`` tokens in each
half (at most L // (2 * MIN_SPAN) of a row).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from encoder_jax.core import fields as fields_lib
from encoder_jax.models import packing
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


def halves(input_mask_BxL, document_ids_BxL=None):
  """int32 [B, L]: the span of each token, 0 on the padding. A row (no ``document_ids``):
  1 on the first half of its tokens, 2 on the second (a row of n tokens: positions below
  ceil(n / 2) are the first half). Packed rows: 2d - 1 on the first half of document d's
  tokens, 2d on its second, so every text of the row is cut in two."""
  mask_BxL = input_mask_BxL.astype(jnp.int32)
  if document_ids_BxL is None:
    n_B = mask_BxL.sum(axis=1)
    index_BxL = jnp.arange(mask_BxL.shape[1], dtype=jnp.int32)[None]
    return jnp.where(index_BxL < (n_B[:, None] + 1) // 2, 1, 2) * mask_BxL
  ids_BxL = document_ids_BxL.astype(jnp.int32) * mask_BxL
  b, length = ids_BxL.shape
  # Each token's document length: tokens counted per (row, document id), read back.
  segment_BxL = jnp.arange(b, dtype=jnp.int32)[:, None] * (length + 1) + ids_BxL
  counts = jax.ops.segment_sum(jnp.ones(b * length, jnp.int32), segment_BxL.reshape(-1),
                               b * (length + 1))
  n_BxL = counts[segment_BxL]
  first_BxL = (packing.positions(ids_BxL) < (n_BxL + 1) // 2).astype(jnp.int32)
  return jnp.where(ids_BxL > 0, 2 * ids_BxL - first_BxL, 0)


def span_means(h_BxLxH, spans_BxL, documents: int):
  """((z1, n1), (z2, n2)): the L2-normalised mean state of the first and second half of
  documents 1..``documents`` of every row, [B * documents, H], and their token counts
  [B * documents] (0 for a document the row does not have)."""
  b, length, hidden = h_BxLxH.shape
  slots = 2 * documents + 1  # Span ids 0 (padding), 1, 2 (document 1), 3, 4, ...
  spans_BxL = jnp.where(spans_BxL < slots, spans_BxL, 0)  # Documents past the last: unread.
  segment_N = (jnp.arange(b, dtype=jnp.int32)[:, None] * slots + spans_BxL).reshape(-1)
  sums = jax.ops.segment_sum(h_BxLxH.reshape(b * length, hidden), segment_N, b * slots)
  counts = jax.ops.segment_sum(jnp.ones((b * length,), jnp.float32), segment_N, b * slots)
  sums, counts = sums.reshape(b, slots, hidden), counts.reshape(b, slots)
  out = []
  for first in (1, 2):
    mean = sums[:, first::2][:, :documents] / jnp.maximum(counts[:, first::2][:, :documents],
                                                           1.0)[..., None]
    mean = mean.reshape(b * documents, hidden)
    norm = jnp.sqrt((mean ** 2).sum(axis=-1, keepdims=True) + 1e-12)
    out.append((mean / norm, counts[:, first::2][:, :documents].reshape(-1)))
  return out


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

  def __init__(self, weight: float, temperature: float, packed: bool = False):
    self.weight = float(weight)
    self.temperature = float(temperature)
    self.packed = bool(packed)  # data.pair_kind='packed_documents': each text cut in two.

  def check(self, network):
    if not network.kind.packed_rows:
      raise ValueError(f"config.objective.names includes 'contrastive', which keeps a row's "
                       f'two halves apart as packed documents, but config.model.kind='
                       f'{network.kind.name!r} cannot read packed rows')

  def corrupt(self, batch, rng, phase):
    del rng, phase
    if self.packed != ('document_ids' in batch):
      raise ValueError(f'the span contrastive objective was built for '
                       f'{"packed" if self.packed else "unpacked"} rows and got the other')
    return {**batch, 'document_ids': halves(batch['input_mask'], batch.get('document_ids'))}

  def gather_positions(self, batch, length):
    b = batch['input_ids'].shape[0]
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))

  def gathered_rows(self, phase):
    return int(phase.seq_len)

  def loss(self, outputs, batch):
    h_BxLxH = outputs['gathered'][self.name].astype(jnp.float32)
    ids_BxL = batch['document_ids']
    # A row is one text (or a stream of texts), cut in two. Packed rows: each document with
    # MIN_SPAN tokens in each half counts, so at most L // (2 * MIN_SPAN) of a row (the
    # first that many documents of a row are read: a later one counts only after as many
    # too short to count, which packing of real text does not make).
    documents = h_BxLxH.shape[1] // (2 * MIN_SPAN) if self.packed else 1
    (z1, n1), (z2, n2) = span_means(h_BxLxH, ids_BxL, documents)
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
