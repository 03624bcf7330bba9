"""SpanBERT's span boundary objective (Joshi et al. 2020, §3.2): L = MLM + SBO.

Every token x_i of a masked span (s, e) is predicted from the encoder's states at the span's
external boundaries and a relative position embedding:

    h_0 = [x_{s-1}; x_{e+1}; p_{i-s+1}]
    h_1 = LayerNorm(GeLU(W_1 h_0))
    y_i = LayerNorm(GeLU(W_2 h_1))
    logits_i = y_i E^T + b          (E: the word embedding the MLM decoder is tied to)

as ``BertPairTargetPredictionHead`` / ``MLPWithLayerNorm`` of facebookresearch/SpanBERT:
200-dimensional position embeddings for the first 15 tokens of a span (later tokens of a
longer span get no SBO prediction: SpanBERT truncates its pair targets at
``--max-pair-targets 15``, the value of its published pretraining command), the
network's activation and LayerNorm eps, an output bias of its own. Its loss is the mean
cross-entropy over the predicted tokens (SpanBERT's ``pair_loss / npairs``).

Spans are the maximal runs of the MLM objective's selected positions, so the boundaries
are the nearest unselected positions on each side (SpanBERT merges touching spans the same
way); with span masking (``objective.span_p``) they are SpanBERT's spans, but the
objective reads only ``masked_positions``/``masked_weights`` and composes with any MLM
masking. The head's parameters live in the params tree under ``'sbo_head'``, beside the
network's (whose layout, checkpoints and exports stay BERT's).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoder_jax.models import config as config_lib
from encoder_jax.models import layers
from encoder_jax.objectives import base

MAX_TARGETS = 15  # SpanBERT's --max-pair-targets: span tokens with a position embedding.
POSITION_SIZE = 200  # SpanBERT's --pair-positional-embedding-size.


def span_boundaries(positions_BxP, weights_BxP, length: int):
  """(left, right, relative) int32 [B, P] for each prediction slot.

  ``left``/``right``: the nearest unselected positions before and after (the span's
  external boundaries, clipped to the sequence); ``relative``: the slot's 0-based index
  inside its span.
  """
  b = positions_BxP.shape[0]
  scatter_BxP = jnp.where(weights_BxP > 0, positions_BxP, length)
  selected_BxL = jnp.zeros((b, length), bool).at[jnp.arange(b)[:, None], scatter_BxP].set(
      True, mode='drop')
  l_L = jnp.arange(length, dtype=jnp.int32)
  left_BxL = jax.lax.cummax(jnp.where(selected_BxL, -1, l_L[None]), axis=1)
  right_BxL = jax.lax.cummin(jnp.where(selected_BxL, length, l_L[None]), axis=1, reverse=True)
  left_BxP = jnp.take_along_axis(left_BxL, positions_BxP, 1)
  right_BxP = jnp.take_along_axis(right_BxL, positions_BxP, 1)
  relative_BxP = positions_BxP - left_BxP - 1
  return (jnp.clip(left_BxP, 0, length - 1), jnp.clip(right_BxP, 0, length - 1),
          jnp.maximum(relative_BxP, 0))


class SpanBoundaryHead(nn.Module):
  """[x_{s-1}; x_{e+1}; p_i] -> 2-layer FFN with GeLU + LayerNorm -> tied vocabulary logits."""
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, left_BxPxH, right_BxPxH, relative_BxP, embedding_VxE):
    """``left``/``right``: the encoder's states at each slot's two span boundaries."""
    c, dt = self.config, self.config.jnp_dtype
    h = c.hidden_size
    p_BxPxD = layers.Embed(MAX_TARGETS, POSITION_SIZE, (None, None), c.initializer_range, dt,
                           name='position_embeddings')(jnp.minimum(relative_BxP,
                                                                   MAX_TARGETS - 1))
    z_BxPxI = jnp.concatenate([left_BxPxH.astype(dt), right_BxPxH.astype(dt), p_BxPxD],
                              axis=-1)
    act = config_lib.ACTIVATIONS[c.activation]
    z_BxPxH = layers.Dense((2 * h + POSITION_SIZE,), (h,), (None,), ('embed',),
                           c.initializer_range, dt, name='dense_1')(z_BxPxI)
    z_BxPxH = layers.LayerNorm(c.layer_norm_eps, dt, name='layer_norm_1')(act(z_BxPxH))
    z_BxPxH = layers.Dense((h,), (h,), ('embed',), ('embed',), c.initializer_range, dt,
                           name='dense_2')(z_BxPxH)
    z_BxPxH = layers.LayerNorm(c.layer_norm_eps, dt, name='layer_norm_2')(act(z_BxPxH))
    bias_V = layers.param(self, 'output_bias', nn.initializers.zeros, (c.vocab_size,),
                          ('vocab',))
    return layers.tied_logits(z_BxPxH.astype(dt), embedding_VxE.astype(dt), bias_V)


class SpanBoundary(base.Objective):
  """SBO: reads the MLM objective's masked positions and the encoder's states at the span
  boundaries (``gather_positions``: the network computes its last layer there)."""
  name = 'sbo'
  head_key = 'sbo_head'
  metric_weights = {'sbo_loss': 'sbo_predictions', 'sbo_accuracy': 'sbo_predictions'}
  console_metrics = (('sbo_accuracy', 'sbo_acc', '{:.1%}'),)

  def __init__(self, config: config_lib.EncoderConfig):
    self.config = config  # The network's: hidden size, activation, eps, vocabulary.

  def check(self, network):
    c = network.config
    if c.embedding_width != c.hidden_size:
      raise ValueError(f'config.objective.names has \'sbo\', whose output layer is the word '
                       f'embedding (width {c.embedding_width}) applied to hidden states of width '
                       f'{c.hidden_size}; expected config.model.embedding_size 0 or hidden_size')

  def init_head(self, rng, network):
    c = network.config
    x = jnp.zeros((1, 2, c.hidden_size), c.jnp_dtype)
    return SpanBoundaryHead(c).init({'params': rng}, x, x, jnp.zeros((1, 2), jnp.int32),
                                    jnp.zeros((c.vocab_size, c.hidden_size)))['params']

  def gather_positions(self, batch, length):
    """The encoder rows the loss reads: each slot's left, then right boundary [B, 2P]."""
    left_BxP, right_BxP, _ = span_boundaries(batch['masked_positions'], batch['masked_weights'],
                                             length)
    return jnp.concatenate([left_BxP, right_BxP], axis=1)

  def gathered_rows(self, phase):
    return 2 * phase.max_predictions

  def loss(self, outputs, batch, params):
    positions_BxP, weights_BxP = batch['masked_positions'], batch['masked_weights']
    boundaries_Bx2PxH = outputs['gathered'][self.name]  # (gather_positions' rows)
    p = positions_BxP.shape[1]
    _, _, relative_BxP = span_boundaries(positions_BxP, weights_BxP, batch['input_ids'].shape[1])
    embedding_VxE = params['embeddings']['word_embeddings']['embedding']
    logits_BxPxV = SpanBoundaryHead(self.config).apply(
        {'params': params[self.head_key]}, boundaries_Bx2PxH[:, :p], boundaries_Bx2PxH[:, p:],
        relative_BxP, embedding_VxE)
    weights_BxP = weights_BxP * (relative_BxP < MAX_TARGETS)
    loss, accuracy = base.cross_entropy(logits_BxPxV, batch['masked_labels'], weights_BxP)
    return loss, {'sbo_loss': loss, 'sbo_accuracy': accuracy,
                  'sbo_predictions': weights_BxP.sum()}

  def head_flops_per_sequence(self, network, phase):
    """Two dense layers and the tied decoder at the predicted positions (x3: training)."""
    c = network.config
    h = c.hidden_size
    return float(6 * phase.max_predictions * ((2 * h + POSITION_SIZE) * h + h * h
                                              + h * c.vocab_size))

  def report_lines(self, metrics):
    if 'sbo_loss' not in metrics:
      return []
    return [f'  SBO   loss {metrics["sbo_loss"]:.4f}  accuracy {metrics["sbo_accuracy"]:.2%}  '
            f'({int(round(metrics["sbo_predictions"]))} predicted tokens)']
