"""DeBERTa (He et al. 2020, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention").

BERT's post-LN Transformer (``trunk.Layer``, unchanged) with two changes:

1. **Disentangled attention** (``attention_kind='disentangled'``, see
   ``models/disentangled_attention.py``): content and relative-position terms computed
   separately, relative distances clipped at k, no absolute positions in the input
   (``position_biased_input=False``). The encoder builds the per-pass ``context`` once: the
   relative-position table ``encoder/rel_embeddings`` [2k, E] (its reachable rows; v2:
   LayerNorm-ed by ``encoder/rel_layer_norm`` when ``norm_rel_ebd``); each attention maps
   distances to its rows statically.
2. **Enhanced mask decoder (EMD)**, pretraining only: the absolute positions enter just
   before MLM decoding. With H the output of layer N-1 and P the absolute position
   embeddings, the query I = H + P goes through ``emd_layers`` (n = 2) applications of the
   *last* layer's weights, each attending to H (keys and values) with the previous output
   as the next query; their output feeds the MLM head. That is the paper's section 3.3
   and microsoft/DeBERTa ``apps/models/masked_language_model.py`` (``EnhancedMaskDecoder``:
   ``encoder_layers[-2]``, ``z_states += hidden_states``, ``encoder.layer[-1]`` twice). The
   decoding layers add no parameters (they *are* the last layer's); only the absolute
   position table ``embeddings/position_embeddings`` is used by nothing else. A query's
   output depends only on its own input and on H, so the EMD runs at the ``masked_positions``
   only (B x P queries, not B x L): exact, and much cheaper. Features and fine-tuning
   (``encode``, ``EncoderOnly``) use the encoder output, as the paper does.

Two kinds, one per Hugging Face layout (``interop/hf_deberta.py``): ``deberta`` (v1,
``DebertaForMaskedLM``: fused bias-free q/k/v projection with q/v biases, span k) and
``deberta_v2`` (``DebertaV2ForMaskedLM``: biased projections; the v2/v3 options
``position_buckets``, ``share_att_key``, ``norm_rel_ebd``; the v2 convolution layer is
not implemented: ``conv_kernel_size`` must be 0). Embeddings as DeBERTa's: word [+ absolute
position if ``position_biased_input``] [+ segment if ``type_vocab_size`` > 0], LayerNorm,
padding positions zeroed, dropout. The MLM head is BERT's (dense, activation, LayerNorm,
decoder tied to the word embedding, bias: HF's ``cls.predictions``). The pretraining network
also has a pooler (DeBERTa's ``ContextPooler``: dense + GELU on the first token) and a
two-way pair head, for the SOP option; Hugging Face's MLM models have neither.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoder_jax.models import config as config_lib
from encoder_jax.models import disentangled_attention as da
from encoder_jax.models import layers
from encoder_jax.models import trunk

# Fraction of positions the EMD's query side runs at, for MFU (the MLM masking rate).
EMD_FLOPS_FRACTION = 0.15


def has_position_table(c: config_lib.EncoderConfig) -> bool:
  """Absolute positions are in the input (BERT-like) or in the enhanced mask decoder."""
  return c.position_biased_input or c.emd_layers > 0


class Embeddings(nn.Module):
  """Word [+ position] [+ segment] -> LayerNorm -> zero padding -> dropout (DeBERTa's order)."""
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, deterministic: bool):
    c = self.config
    emb = lambda n, v, axes: layers.Embed(v, c.hidden_size, axes, c.initializer_range,
                                          c.jnp_dtype, name=n)
    word = emb('word_embeddings', c.vocab_size, ('vocab', 'embed'))
    x_BxLxE = word(input_ids_BxL)
    position_PxE = None
    if has_position_table(c):  # Created here even when only the EMD reads it (one layout).
      position_PxE = emb('position_embeddings', c.max_position_embeddings,
                         ('length', 'embed')).embedding.astype(c.jnp_dtype)
      length = input_ids_BxL.shape[1]
      if length > c.max_position_embeddings:
        raise ValueError(f'Sequence length {length} exceeds the {c.max_position_embeddings} '
                         'absolute positions of config.model.max_position_embeddings')
      if c.position_biased_input:
        x_BxLxE = x_BxLxE + position_PxE[:length][None]
    if c.type_vocab_size:
      x_BxLxE = x_BxLxE + emb('token_type_embeddings', c.type_vocab_size, (None, 'embed'))(
          segment_ids_BxL)
    x_BxLxE = layers.LayerNorm(c.layer_norm_eps, c.jnp_dtype, name='layer_norm')(x_BxLxE)
    x_BxLxE = x_BxLxE * input_mask_BxL[..., None].astype(x_BxLxE.dtype)
    x_BxLxE = layers.Dropout(c.hidden_dropout_rate)(x_BxLxE, deterministic=deterministic)
    return x_BxLxE, word, position_PxE


class Encoder(nn.Module):
  """The relative-position context, then BERT's layer stack (``trunk.Encoder``) with it.

  Parameters: ``rel_embeddings`` [2 * span, E], ``rel_layer_norm`` (``norm_rel_ebd``) and
  the scanned ``layers`` (BERT's layout; the attention's own projections inside).
  """
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxE, input_mask_BxL, deterministic: bool, collect_hidden: bool = False,
               rows_BxQ=None):
    c = self.config
    span = da.relative_span(c)
    table_RxE = layers.param(self, 'rel_embeddings', layers.truncated_normal(c.initializer_range),
                             (2 * span, c.hidden_size), (None, 'embed'))
    _, lo, hi = da.relative_layout(c, x_BxLxE.shape[1])
    rel_RxE = table_RxE[lo:hi]  # Only the rows reachable at this length.
    if c.norm_rel_ebd:
      rel_RxE = layers.LayerNorm(c.layer_norm_eps, c.jnp_dtype, name='rel_layer_norm')(rel_RxE)
    context = {'rel_embeddings': rel_RxE.astype(c.jnp_dtype)}
    stack = trunk.Encoder(c)
    nn.share_scope(self, stack)  # Its 'layers' sit here, as in BERT: encoder/layers/...
    # With rows (``trunk.Encoder``), the last layer's queries are at the rows, which it
    # passes as context['query_positions'].
    x_BxLxE, all_NxBxLxE = stack(x_BxLxE, input_mask_BxL, deterministic, collect_hidden, context,
                                 rows_BxQ=rows_BxQ)
    return x_BxLxE, all_NxBxLxE, context


def _trunk(c: config_lib.EncoderConfig, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
           deterministic: bool, pool: bool, collect_hidden: bool, rows_BxQ=None
           ) -> dict[str, Any]:
  """``encode`` plus what the EMD needs (position table, relative context).

  ``rows_BxQ`` as ``trunk.encode``'s: the last layer at those rows ([CLS] first when
  pooling) only; ``row_output`` replaces ``sequence_output`` and ``layer_input`` is the
  last layer's input (the output of layer N-1, which the EMD reads).
  """
  embedded_BxLxE, word_embed, position_PxE = Embeddings(c, name='embeddings')(
      input_ids_BxL, segment_ids_BxL, input_mask_BxL, deterministic)
  if rows_BxQ is not None and pool:
    rows_BxQ = trunk.with_cls(rows_BxQ)
  x_BxLxE, all_NxBxLxE, context = Encoder(c, name='encoder')(
      embedded_BxLxE, input_mask_BxL, deterministic, collect_hidden, rows_BxQ)
  out = {'word_embed': word_embed, 'position_table': position_PxE, 'context': context}
  if rows_BxQ is None:
    out['sequence_output'] = x_BxLxE
  else:  # x is [B, Q, E] at the rows; the second output is the last layer's input.
    out['row_output'] = x_BxLxE[:, 1:] if pool else x_BxLxE
    out['layer_input'], all_NxBxLxE = all_NxBxLxE, None
  if pool:  # DeBERTa's ContextPooler: dense + GELU on the first token.
    out['pooled_output'] = config_lib.ACTIVATIONS['gelu'](layers.Dense(
        (c.hidden_size,), (c.hidden_size,), ('embed',), ('embed',), c.initializer_range,
        c.jnp_dtype, name='pooler')(x_BxLxE[:, 0]))
  if collect_hidden:  # Embedding output, then each layer's output (as Hugging Face).
    out['all_hidden_states'] = (embedded_BxLxE, *all_NxBxLxE)
  return out


def encode(c: config_lib.EncoderConfig, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
           deterministic: bool, pool: bool = True, collect_hidden: bool = False
           ) -> dict[str, Any]:
  """Embeddings -> encoder [-> pooler], inside the calling module (``ModelKind.encode``)."""
  out = _trunk(c, input_ids_BxL, segment_ids_BxL, input_mask_BxL, deterministic=deterministic,
               pool=pool, collect_hidden=collect_hidden)
  del out['position_table'], out['context']
  return out


class EncoderOnly(nn.Module):
  """The encoder and pooler (``DebertaModel`` + ContextPooler): features, fine-tuning."""
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
               deterministic: bool = True, collect_hidden: bool = False) -> dict[str, Any]:
    out = encode(self.config, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                 deterministic=deterministic, pool=True, collect_hidden=collect_hidden)
    del out['word_embed']
    return out


class EncoderWithHeads(nn.Module):
  """Encoder, enhanced mask decoder (``emd_layers`` > 0), MLM head, pooler and pair head.

  ``mlm_logits`` are computed at ``masked_positions_BxP`` only (all positions if None);
  ``sequence_output`` is the encoder's output (the EMD's is ``emd_output`` [B, P, E]).
  With positions given it is absent (unless those rows would be as many as the sequence's):
  the last layer runs only at the rows the losses read
  (``trunk.last_layer_rows``): [CLS] and ``gather_positions_BxG`` (returned as
  ``gathered_output``), plus the masked positions without the EMD. With the EMD, whose
  keys and values are layer N-1's output, the last layer otherwise feeds nothing.
  """
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, masked_positions_BxP=None,
               *, deterministic: bool = True, collect_hidden: bool = False,
               gather_positions_BxG=None) -> dict[str, Any]:
    c = self.config
    emd = c.emd_layers > 0
    length = input_ids_BxL.shape[1]
    rows_BxQ = None
    if masked_positions_BxP is None:
      masked_positions_BxP = jnp.broadcast_to(jnp.arange(length), input_ids_BxL.shape)
    elif emd and not collect_hidden:  # The EMD decodes; the last layer feeds [CLS] (+ gathers).
      rows_BxQ = (jnp.zeros((input_ids_BxL.shape[0], 0), jnp.int32)
                  if gather_positions_BxG is None else gather_positions_BxG)
      rows_BxQ = rows_BxQ if rows_BxQ.shape[1] + 1 < length else None
    elif not emd:
      rows_BxQ = trunk.last_layer_rows(length, [masked_positions_BxP, gather_positions_BxG],
                                      True, collect_hidden)
    out = _trunk(c, input_ids_BxL, segment_ids_BxL, input_mask_BxL, deterministic=deterministic,
                 pool=True, collect_hidden=collect_hidden or (emd and rows_BxQ is None),
                 rows_BxQ=rows_BxQ)
    word_embed, position_PxE = out.pop('word_embed'), out.pop('position_table')
    context = out.pop('context')
    out['pair_logits'] = layers.Dense(
        (c.hidden_size,), (2,), ('embed',), (None,), c.initializer_range, c.jnp_dtype,
        name='pair_head')(out['pooled_output']).astype(jnp.float32)
    if emd:
      if rows_BxQ is None:
        hidden_BxLxE = out['all_hidden_states'][-2]  # Output of layer N-1 (embeddings if N=1).
        if not collect_hidden:
          del out['all_hidden_states']
        if gather_positions_BxG is not None:
          out['gathered_output'] = jnp.take_along_axis(
              out['sequence_output'], gather_positions_BxG[..., None], axis=1)
      else:
        hidden_BxLxE = out.pop('layer_input')
        if gather_positions_BxG is not None:
          out['gathered_output'] = out['row_output']
        del out['row_output']
      h_BxPxE = self.enhanced_mask_decoder(hidden_BxLxE, input_mask_BxL, masked_positions_BxP,
                                           position_PxE, context, deterministic)
      out['emd_output'] = h_BxPxE
    else:
      out.pop('layer_input', None)
      h_BxPxE, gathered = trunk.read_rows(out, masked_positions_BxP, gather_positions_BxG)
      if gathered is not None:
        out['gathered_output'] = gathered
    out['mlm_logits'] = trunk.MlmHead(c, name='mlm_head')(h_BxPxE, word_embed)
    return out

  def enhanced_mask_decoder(self, hidden_BxLxE, input_mask_BxL, positions_BxP, position_PxE,
                            context, deterministic: bool):
    """I = H + P at the predicted positions, then ``emd_layers`` x the last layer (K, V = H)."""
    c = self.config
    # The last layer's parameters: the scan's stacked ones, sliced (no new parameters).
    stacked = nn.meta.unbox(self.variables['params']['encoder']['layers'])
    last_layer = jax.tree.map(lambda p: p[-1], stacked)
    q_BxPxE = (jnp.take_along_axis(hidden_BxLxE, positions_BxP[..., None], axis=1)
               + jnp.take(position_PxE, positions_BxP, axis=0))
    emd_context = {'rel_embeddings': context['rel_embeddings'], 'query_positions': positions_BxP,
                   'kv_states': hidden_BxLxE}
    mask_Bx1x1xL = input_mask_BxL.astype(bool)[:, None, None, :]
    layer = trunk.Layer(c, deterministic, parent=None)
    for _ in range(c.emd_layers):
      rngs = None if deterministic else {'dropout': self.make_rng('dropout')}
      q_BxPxE, _ = layer.apply({'params': last_layer}, q_BxPxE, mask_Bx1x1xL, emd_context,
                               rngs=rngs)
    return q_BxPxE


def flops_per_token(c: config_lib.EncoderConfig, seq_len: int) -> float:
  """BERT's encoder FLOPs plus the relative terms and the enhanced mask decoder (6 FLOPs per
  multiply-add: 2 per MAC, 3 passes).

  Per layer and token, each position term multiplies the token's query (c2p) or key (p2c)
  with the projected table at the 2L - 1 distances (``disentangled_attention``'s
  shifts): (2L - 1) * d MACs. (Projecting the table's R reachable rows costs R * d^2 per
  layer per *batch*, negligible per token at training batch sizes: left out.)
  Each EMD layer projects keys and values of every token (2 d^2) and runs a layer's query
  side (q and output projections, attention over the L keys, feed-forward, position terms)
  at the predicted positions, counted as ``EMD_FLOPS_FRACTION`` (the masking rate) of the
  tokens. XLA's count of the compiled step agrees within a few percent
  (``benchmarks/bench_train.py --check_flops --kind deberta``).
  """
  d = c.hidden_size
  flops = config_lib.encoder_flops_per_token(c, seq_len)
  terms = len(da.position_terms(c))
  rows = 2 * seq_len - 1
  flops += 6 * c.num_layers * terms * rows * d
  if c.emd_layers:
    query_side = 2 * d * d + 2 * seq_len * d + config_lib.ffn_macs(c) + terms * rows * d
    flops += 6 * c.emd_layers * (2 * d * d + EMD_FLOPS_FRACTION * query_side)
  return float(flops)


def last_layer_rows(c: config_lib.EncoderConfig, predictions: int, gathered: int) -> int:
  """Rows of the pretraining network's last layer: [CLS] and the gathered rows, plus the
  masked positions unless the EMD decodes them (from layer N-1's output)."""
  return gathered + 1 + (0 if c.emd_layers else predictions)


def row_flops(c: config_lib.EncoderConfig, seq_len: int) -> float:
  """One row's query-side FLOPs in a layer: BERT's plus its content-to-position scores
  (c2p; the position-to-content scores are a product over every key, all still run)."""
  c2p = 'c2p' in da.position_terms(c)
  return config_lib.encoder_row_flops(c, seq_len) + 6 * c2p * (2 * seq_len - 1) * c.hidden_size


# DeBERTa's own config.model fields (read here and by the 'disentangled' attention kind),
# declared with the others on EncoderConfig.
FIELDS = config_lib.kind_fields(config_lib.DEBERTA)


def _check(c: config_lib.EncoderConfig) -> None:
  kind = c.kind
  if c.attention_kind != 'disentangled':
    raise ValueError(f"config.model.kind={kind} needs config.model.attention_kind='disentangled'; "
                     f'got {c.attention_kind!r}')
  if c.share_layers != 'none':
    raise ValueError(f'config.model.kind={kind} has no cross-layer sharing; got share_layers='
                     f'{c.share_layers!r}')
  if c.embedding_size not in (0, c.hidden_size):
    raise ValueError(f'config.model.kind={kind} has no factorized embedding; got embedding_size='
                     f'{c.embedding_size} (expected 0 or hidden_size={c.hidden_size})')
  if c.position_offset:
    raise ValueError(f'config.model.kind={kind} numbers positions from 0; got position_offset='
                     f'{c.position_offset}')
  da.position_terms(c)  # Raises on a bad pos_att_type.
  if c.emd_layers < 0:
    raise ValueError(f'config.model.emd_layers={c.emd_layers}; expected >= 0 (0 = off)')
  if c.emd_layers and c.position_biased_input:
    raise ValueError('config.model.emd_layers > 0 adds the absolute positions in the enhanced '
                     'mask decoder; expected config.model.position_biased_input=False with it '
                     '(the DeBERTa code applies the EMD only then)')
  if c.position_buckets < 0:
    raise ValueError(f'config.model.position_buckets={c.position_buckets}; expected >= 0 (0 = off)')
  if c.position_buckets and c.position_buckets < 2:
    raise ValueError(f'config.model.position_buckets={c.position_buckets}; expected 0 or >= 2')
  if c.position_buckets and da.max_relative_distance(c) <= c.position_buckets // 2 + 1:
    raise ValueError(f'config.model.position_buckets={c.position_buckets} needs '
                     f'max_relative_positions (or max_position_embeddings) > buckets / 2 + 1; got '
                     f'{da.max_relative_distance(c)}')


def _check_v1(c: config_lib.EncoderConfig) -> None:
  _check(c)
  v2 = {k: getattr(c, k) for k in ('position_buckets', 'share_att_key', 'norm_rel_ebd')
        if getattr(c, k)}
  if v2:
    raise ValueError(f"config.model.kind='deberta' (v1) has no {sorted(v2)} ({v2}); those are "
                     "DeBERTa-v2/v3 options: use config.model.kind='deberta_v2'")


KIND = config_lib.ModelKind(
    name='deberta', pretraining=EncoderWithHeads, encoder=EncoderOnly, encode=encode, pooler=True,
    pair_head=True, check=_check_v1, flops_per_token=flops_per_token, fields=FIELDS,
    last_layer_rows=last_layer_rows, row_flops=row_flops, block_options=('gated_ffn',),
    description='DeBERTa v1: disentangled attention (relative span k), enhanced mask decoder')
KIND_V2 = config_lib.ModelKind(
    name='deberta_v2', pretraining=EncoderWithHeads, encoder=EncoderOnly, encode=encode,
    pooler=True, pair_head=True, check=_check, flops_per_token=flops_per_token, fields=FIELDS,
    last_layer_rows=last_layer_rows, row_flops=row_flops, block_options=('gated_ffn',),
    description='DeBERTa v2/v3: + log-bucketed positions, shared keys, normalised relative '
                'embeddings')
