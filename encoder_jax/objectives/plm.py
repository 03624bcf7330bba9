"""XLNet's permutation language modelling (Yang et al. 2019), on device, fixed shapes.

Every step, from the step's key, for each sequence (``A [SEP] B [SEP] [CLS]``, the
``'xlnet'`` builder):

1. **Targets** as XLNet's ``data_utils._sample_mask``: walk the sequence; draw a span
   length n in 1..``max_ngram`` (5) with p(n) ~ 1/n, clipped to the remaining budget; the
   span sits in a context of ``K * n`` tokens (``mask_alpha / mask_beta`` = K =
   ``partial_prediction_k``, 6): skip a uniform ``l_ctx`` in [0, K n), move to the next
   word start, take n tokens, skip the rest of the context. The original's n-gram loop
   tests the span's first piece (``seg[beg]``) instead of each next piece, so a span is n
   *tokens* from a word start; that is what it trained with and what is done here. A span
   that would reach the last token ends the walk; the budget is then filled with uniformly
   drawn unselected tokens. The budget is ``round(length / K)`` (XLNet: 85 of 512), at most
   ``max_predictions``. [SEP]/[CLS] (any special id) may be drawn but are never predicted
   (the original's "extra padding due to CLS/SEP").
2. **Bidirectional data** (``bidirectional_data``, the paper's pipeline): the second half
   of the batch is the backward stream: each such row becomes ``rev(B) [SEP] rev(A) [SEP]
   [CLS]`` (targets carried along; segments renumbered) and reads negated relative
   distances (the model's ``bi_data``), as the original's ``bi_data``.
3. **Factorization order**: a uniform permutation per sequence (``_local_perm`` with
   ``perm_size = seq_len``); non-target, non-special tokens come first (index -1: every
   query sees them, they see no target), so the targets are exactly the last ~1/K of the
   order (partial prediction). ``perm_mask[i, j] = 1`` (i may not read j) iff j is a target
   or special and i is not after j in the order; a target never sees itself.
4. **Two streams**: the content stream reads the true tokens (the mask hides them); the
   query stream predicts the P = ``max_predictions`` target slots (``target_mapping``
   [B, P, L], ascending positions, zero rows for unused slots) through the tied LM head.
   ``L = -1/|T| sum_{t in T} log p(x_t | x_{z<t})`` over the targets T.

With ``model.mem_len`` > 0 the Transformer-XL memory is state carried from step to step
(``init_extra`` / ``stateful_loss_fn``; the training state and checkpoints hold it): row r
of a batch attends to the cached states of row r of the previous batch. Evaluation runs
without memory. What is left out: the ``reuse_len`` half-rows and the block-wise
permutation (``perm_size`` < ``seq_len``) that only make sense when consecutive batches
continue the same text streams, which this pipeline's shuffled examples do not.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoder_jax.core import fields as fields_lib
from encoder_jax.models import registry as models
from encoder_jax.objectives import base
from encoder_jax.objectives import masking

# PLM's config.objective fields (and masking's max_ngram, read as the longest span).
FIELDS: tuple[fields_lib.Field, ...] = (
    fields_lib.Field('partial_prediction_k', 6, fields_lib.integer(1),
                     'About 1/K of each sequence is predicted, spans of 1..max_ngram tokens each '
                     'in a context of K x its length (XLNet: K=6, max_ngram=5).'),
    fields_lib.Field('bidirectional_data', False, fields_lib.boolean(),
                     "The second half of each batch is the backward stream (the paper's "
                     'bi_data): batch_size / grad_accum_steps must be even, and the halves '
                     'should each span whole batch shards (data x fsdp even or 1), else XLA '
                     'replicates the position scores on every device.'),
    masking.MAX_NGRAM,
)


@dataclasses.dataclass(frozen=True)
class PlmRecipe:
  partial_prediction_k: int = 6  # K: about 1/K of the tokens are targets (the paper: 6 or 7).
  max_span: int = 5  # Spans of 1..max_span tokens, p(n) ~ 1/n (XLNet's max_gram).
  bidirectional_data: bool = False  # The second half of each batch is the backward stream.

  def __post_init__(self):
    if not isinstance(self.partial_prediction_k, (int, np.integer)) or (
        self.partial_prediction_k < 1):
      raise ValueError(f'config.objective.partial_prediction_k={self.partial_prediction_k!r}; '
                       'expected an integer >= 1 (XLNet: 6)')
    if not isinstance(self.max_span, (int, np.integer)) or self.max_span < 1:
      raise ValueError(f'config.objective.max_ngram={self.max_span!r}; expected an integer '
                       '>= 1 (XLNet: spans of up to 5 tokens)')


def check_config(config) -> str | None:
  """``bidirectional_data`` splits each step's rows in halves: their number must be even."""
  if not config.objective.get('bidirectional_data'):
    return None
  batch, accum = config.train.get('batch_size'), config.train.get('grad_accum_steps') or 1
  if batch and batch % accum == 0 and (batch // accum) % 2:
    return (f'config.train.batch_size={batch} / grad_accum_steps={accum} = {batch // accum} '
            'rows per step: expected an even number with objective.bidirectional_data (the '
            'second half of each batch is the backward stream)')
  return None


def prediction_budget(length_B: jax.Array, k: int, max_predictions: int) -> jax.Array:
  """Targets per row: round(length / K), in [1, max_predictions] and at most the length."""
  goal_B = jnp.round(length_B / k).astype(jnp.int32)
  return jnp.minimum(jnp.clip(goal_B, 1, max_predictions), length_B)


def sample_spans(rng: jax.Array, is_start_BxL: jax.Array, length_B: jax.Array,
                 goal_B: jax.Array, *, k: int, max_span: int, max_iterations: int
                 ) -> jax.Array:
  """bool [B, L]: ``goal`` positions per row chosen as ``_sample_mask`` (module docstring).

  ``is_start`` marks word starts; rows are real for positions < ``length`` (right padding).
  ``max_iterations`` >= max(goal): each span adds at least one position.
  """
  b, l = is_start_BxL.shape
  pos_L = jnp.arange(l)
  log_p_S = jnp.log(1.0 / jnp.arange(1, max_span + 1))

  def row(key, is_start_L, length, goal):
    k_fill, k_walk = jax.random.split(key)
    cand_L = jnp.where(is_start_L & (pos_L < length), pos_L, l)
    next_start = jnp.append(jax.lax.cummin(cand_L, reverse=True), l)  # [L + 1]

    def span(i, state):
      cur, num, done, mask_L = state
      k_n, k_ctx = jax.random.split(jax.random.fold_in(k_walk, i))
      done = done | (cur >= length) | (num >= goal)
      n = jnp.minimum(jax.random.categorical(k_n, log_p_S) + 1, goal - num)
      ctx = jnp.maximum(n * k, 1)
      l_ctx = jax.random.randint(k_ctx, (), 0, ctx)
      beg = next_start[jnp.minimum(cur + l_ctx, l)]
      end = beg + n
      done = done | (beg >= length) | (end >= length)
      mask_L = mask_L | ((pos_L >= beg) & (pos_L < end) & ~done)
      return (jnp.where(done, cur, end + ctx - l_ctx), jnp.where(done, num, num + n), done,
              mask_L)

    _, num, _, mask_L = jax.lax.fori_loop(
        0, max_iterations, span, (jnp.int32(0), jnp.int32(0), jnp.bool_(False),
                                  jnp.zeros(l, bool)))
    # Top up to the budget with uniformly drawn unselected real positions.
    eligible_L = (pos_L < length) & ~mask_L
    score_L = jnp.where(eligible_L, jax.random.uniform(k_fill, (l,)), -1.0)
    rank_L = jnp.argsort(jnp.argsort(-score_L))
    return mask_L | (eligible_L & (rank_L < goal - num))

  return jax.vmap(row)(jax.random.split(rng, b), is_start_BxL, length_B, goal_B)


def reverse_rows(backward_B, input_ids_BxL, segment_ids_BxL, selected_BxL, length_B):
  """Backward rows: ``A [SEP] B [SEP] [CLS]`` -> ``rev(B) [SEP] rev(A) [SEP] [CLS]``.

  Reversing the first ``length - 2`` tokens (``A [SEP] B``) gives exactly that; the
  segments are renumbered (0 up to and including the first [SEP], then 1, 2 for [CLS]).
  """
  b, l = input_ids_BxL.shape
  pos_BxL = jnp.broadcast_to(jnp.arange(l), (b, l))
  m_Bx1 = (length_B - 2)[:, None]
  flip_BxL = backward_B[:, None] & (pos_BxL < m_Bx1)
  src_BxL = jnp.where(flip_BxL, m_Bx1 - 1 - pos_BxL, pos_BxL)
  take = lambda x: jnp.take_along_axis(x, src_BxL, axis=1)
  second_Bx1 = ((segment_ids_BxL == 1) & (pos_BxL < length_B[:, None])).sum(1, keepdims=True)
  renumbered_BxL = jnp.where(pos_BxL < second_Bx1, 0, 1)
  renumbered_BxL = jnp.where(pos_BxL == length_B[:, None] - 1, segment_ids_BxL, renumbered_BxL)
  renumbered_BxL = jnp.where(pos_BxL < length_B[:, None], renumbered_BxL, segment_ids_BxL)
  segments_BxL = jnp.where(backward_B[:, None], renumbered_BxL, segment_ids_BxL)
  return take(input_ids_BxL), segments_BxL.astype(segment_ids_BxL.dtype), take(selected_BxL)


def permutation_masks(rng: jax.Array, selected_BxL: jax.Array, functional_BxL: jax.Array):
  """XLNet's ``_local_perm``: (perm_mask bool [B, L, L], targets bool [B, L]).

  ``perm_mask[b, i, j]``: query i may not read key j. Non-selected, non-functional tokens
  get order index -1 (seen by all, see no target); a target never sees itself; a
  functional token ([SEP], [CLS]) is ordered like a target but sees itself.
  """
  b, l = selected_BxL.shape
  index_BxL = jax.vmap(lambda key: jax.random.permutation(key, l))(jax.random.split(rng, b))
  plain_BxL = ~selected_BxL & ~functional_BxL
  rev_BxL = jnp.where(plain_BxL, -1, index_BxL)
  targets_BxL = selected_BxL & ~functional_BxL
  self_rev_BxL = jnp.where(targets_BxL, rev_BxL, rev_BxL + 1)
  perm_BxLxL = (self_rev_BxL[:, :, None] <= rev_BxL[:, None, :]) & ~plain_BxL[:, None, :]
  return perm_BxLxL, targets_BxL


def target_slots(targets_BxL: jax.Array, input_ids_BxL: jax.Array, max_predictions: int):
  """(target_mapping float32 [B, P, L], labels int32 [B, P], weights float32 [B, P]):
  the targets in ascending position, then empty slots (zero rows, weight 0)."""
  l = targets_BxL.shape[1]
  order_BxL = jnp.argsort(~targets_BxL, axis=1, stable=True)
  positions_BxP = order_BxL[:, :max_predictions]
  weights_BxP = (jnp.arange(max_predictions)[None] < targets_BxL.sum(1, keepdims=True)
                 ).astype(jnp.float32)
  mapping_BxPxL = jax.nn.one_hot(positions_BxP, l, dtype=jnp.float32) * weights_BxP[..., None]
  labels_BxP = jnp.take_along_axis(input_ids_BxL, positions_BxP, axis=1) * (weights_BxP > 0)
  return mapping_BxPxL, labels_BxP.astype(jnp.int32), weights_BxP


def permute_batch(rng: jax.Array, batch, *, max_predictions: int, recipe: PlmRecipe,
                  tables: masking.VocabTables) -> dict:
  """The model inputs of one PLM step (steps 1-3 of the module docstring)."""
  ids_BxL, seg_BxL, mask_BxL = batch['input_ids'], batch['segment_ids'], batch['input_mask']
  b = ids_BxL.shape[0]
  k_spans, k_perm = jax.random.split(rng)
  length_B = (mask_BxL > 0).sum(1).astype(jnp.int32)
  special_V, start_V = jnp.asarray(tables.is_special_V), jnp.asarray(tables.is_word_start_V)
  # XLNet: word starts ('▁' pieces, or as stored per position) and '<...>' pieces.
  starts_BxL = batch.get('word_starts')
  starts_BxL = start_V[ids_BxL] if starts_BxL is None else jnp.asarray(starts_BxL, bool)
  is_start_BxL = starts_BxL | special_V[ids_BxL]
  goal_B = prediction_budget(length_B, recipe.partial_prediction_k, max_predictions)
  selected_BxL = sample_spans(k_spans, is_start_BxL, length_B, goal_B,
                              k=recipe.partial_prediction_k, max_span=recipe.max_span,
                              max_iterations=max_predictions)
  backward_B = None
  if recipe.bidirectional_data:
    backward_B = jnp.arange(b) >= b // 2
    ids_BxL, seg_BxL, selected_BxL = reverse_rows(backward_B, ids_BxL, seg_BxL, selected_BxL,
                                                  length_B)
  functional_BxL = special_V[ids_BxL] | (mask_BxL == 0)
  perm_BxLxL, targets_BxL = permutation_masks(k_perm, selected_BxL, functional_BxL)
  mapping_BxPxL, labels_BxP, weights_BxP = target_slots(targets_BxL, ids_BxL, max_predictions)
  return dict(input_ids=ids_BxL, segment_ids=seg_BxL, input_mask=mask_BxL, perm_mask=perm_BxLxL,
              target_mapping=mapping_BxPxL, target_labels=labels_BxP, target_weights=weights_BxP)


class PermutationLM(base.Pretraining):
  """XLNet pretraining: one network, both streams, PLM loss (and the memory when on)."""
  name = 'plm'
  metric_weights = {'plm_loss': 'plm_predictions', 'plm_accuracy': 'plm_predictions'}
  console_metrics = (('plm_accuracy', 'plm_acc', '{:.1%}'),)

  def __init__(self, network: models.Network, recipe: PlmRecipe,
               tables: masking.VocabTables | None, dropout_rng_impl: str = 'threefry'):
    super().__init__(dropout_rng_impl)
    self.network = network
    self.recipe = recipe
    self.tables = tables  # None: the setup can describe and run the network, not permute.

  def init(self, rng):
    return self.network.init(rng)

  def init_extra(self, batch_size: int):
    """The Transformer-XL memory, empty (all-zero validity mask), or None without one."""
    c = self.network.config
    if not c.mem_len:
      return None
    mems = jnp.zeros((batch_size, c.num_layers, c.mem_len, c.hidden_size), c.jnp_dtype)
    mem_mask = jnp.zeros((batch_size, c.mem_len), jnp.int32)
    return {'mems': nn.LogicallyPartitioned(mems, ('batch', 'layers', 'length', 'embed')),
            'mem_mask': nn.LogicallyPartitioned(mem_mask, ('batch', 'length'))}

  def _forward(self, params, batch, rng, phase, train, extra):
    if self.tables is None:
      raise ValueError('The PLM objective was built without vocabulary tables (no tokenizer); '
                       'it cannot sample targets')
    rows = batch['input_ids'].shape[0]
    if self.recipe.bidirectional_data and rows % 2:
      raise ValueError(f'config.objective.bidirectional_data reads the second half of each '
                       f'batch backward; a batch of {rows} rows came in (expected an even '
                       'number: train.batch_size / train.grad_accum_steps in training, '
                       "evaluate's --batch_size; or set bidirectional_data=False)")
    base.packed_inputs(self.network, batch)  # Refuses packed rows (XLNet has no packing).
    k_perm, k_dropout = jax.random.split(rng)
    x = permute_batch(k_perm, batch, max_predictions=phase.max_predictions, recipe=self.recipe,
                      tables=self.tables)
    out = self.network.pretraining.apply(
        {'params': params}, x['input_ids'], x['segment_ids'], x['input_mask'],
        perm_mask=x['perm_mask'], target_mapping=x['target_mapping'],
        mems=None if extra is None else extra['mems'],
        mem_mask=None if extra is None else extra['mem_mask'],
        bi_data=self.recipe.bidirectional_data,
        content_output=False, deterministic=not train,
        rngs={'dropout': self.dropout_key(k_dropout)} if train else None)
    loss, accuracy = base.cross_entropy(out['mlm_logits'], x['target_labels'],
                                        x['target_weights'])
    metrics = {'plm_loss': loss, 'plm_accuracy': accuracy,
               'plm_predictions': x['target_weights'].sum(), 'loss': loss}
    new_extra = None
    if extra is not None:
      new_extra = {'mems': out['new_mems'].astype(extra['mems'].dtype),
                   'mem_mask': out['new_mem_mask'].astype(extra['mem_mask'].dtype)}
    return loss, metrics, new_extra

  def loss_fn(self, params, batch, rng, phase, train):
    """Without memory (evaluation; training too when ``mem_len`` = 0)."""
    loss, metrics, _ = self._forward(params, batch, rng, phase, train, None)
    return loss, metrics

  def stateful_loss_fn(self, params, extra, batch, rng, phase, train):
    loss, metrics, new_extra = self._forward(params, batch, rng, phase, train, extra)
    return loss, (metrics, new_extra)

  def flops_per_sequence(self, phase):
    """Content stream (``models.xlnet.flops_per_token``) + query stream + LM head, 3x fwd.

    The query stream, per layer, on the P target rows only: q/o projections, attention
    over the ``L + M`` keys and ``2L + M`` distances, and the feed-forward block. The last
    layer's content stream is not computed (nothing reads it; ``content_output=False``)
    except its keys and values, which the query stream reads.
    """
    c = self.network.config
    d, f, v, n_layers, m = c.hidden_size, c.intermediate_size, c.vocab_size, c.num_layers, c.mem_len
    l, p = phase.seq_len, phase.max_predictions
    per_row = 4 * d * d + 4 * d * (l + m) + 2 * d * (2 * l + m) + 4 * d * f
    content = self.network.flops_per_token(l) * l - 3 * l * per_row
    return float(content + 3 * (n_layers * p * per_row + 2 * p * d * v))

  def downstream(self, params):
    return self.network, params

  def summarize(self, metrics):
    return {'plm_perplexity': math.exp(min(metrics['plm_loss'], 50.0))}

  def report_lines(self, metrics):
    if 'plm_loss' not in metrics:
      return []
    return [f'  PLM   loss {metrics["plm_loss"]:.4f}  accuracy {metrics["plm_accuracy"]:.2%}  '
            f'perplexity {metrics["plm_perplexity"]:.2f}  '
            f'({int(round(metrics["plm_predictions"]))} predicted tokens)']


def build(config: ml_collections.ConfigDict, tables: masking.VocabTables | None,
          network: models.Network) -> PermutationLM:
  o = config.objective
  recipe = PlmRecipe(int(o.partial_prediction_k), int(o.max_ngram), bool(o.bidirectional_data))
  return PermutationLM(network, recipe, tables, config.train.dropout_rng_impl)
