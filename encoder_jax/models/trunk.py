"""The Transformer encoder six kinds share (BERT, RoBERTa, ALBERT, ELECTRA, ModernBERT, and
DeBERTa's layer stack), as pure-functional Flax Linen modules: embeddings, the attention
and feed-forward blocks, the layer stack, ``encode`` (the trunk inside any compact module),
the MLM head and the pretraining / encoder-only networks a kind configures.

BERT's network (Devlin et al. 2018) with every option off: token + learned absolute
position + segment embeddings, LayerNorm(eps 1e-12), post-LN blocks, exact-erf GELU,
dropout, tanh pooler on [CLS], MLM head (dense + GELU + LayerNorm, decoder tied to the
token embedding, output bias) and the two-way pair head (NSP/SOP) on the pooled output.
The ``bert`` kind itself is ``models/bert.py``.

Options other kinds set (``models.config.EncoderConfig``): a factorized embedding of width
``embedding_size`` projected to the hidden size (ALBERT, ELECTRA), cross-layer parameter
sharing (ALBERT), position ids that start after the padding id (RoBERTa), the activation,
and the shared block options (pre-LN, gated feed-forward, rotary positions, local
attention...).

The layers are stacked with ``nn.scan`` (one compiled layer body, a leading 'layers'
axis on every layer parameter), which keeps compile time flat in depth; with all layers
shared the scan broadcasts one set of parameters instead.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoder_jax.models import attention_kinds
from encoder_jax.models import config as config_lib
from encoder_jax.models import layers
from encoder_jax.models import packing

DTYPES = config_lib.DTYPES


def position_ids(c: config_lib.EncoderConfig, input_mask_BxL, positions_BxL=None):
  """Absolute position ids: 0..L-1 (BERT), or as RoBERTa (fairseq) numbers them.

  RoBERTa counts real tokens from ``position_offset`` (= padding id + 1) and gives padding
  the padding id, so its table has ``max_length + position_offset`` rows.
  ``positions_BxL`` (packed rows, ``models.packing``): each token's position in its own
  document instead of in the row, numbered the same way.
  """
  length = input_mask_BxL.shape[1]
  if length > c.max_length:
    raise ValueError(f'Sequence length {length} exceeds the {c.max_length} positions of '
                     f'config.model.max_position_embeddings={c.max_position_embeddings}'
                     + (f' - position_offset={c.position_offset}' if c.position_offset else ''))
  if positions_BxL is not None:
    if not c.position_offset:
      return positions_BxL
    return jnp.where(input_mask_BxL > 0, positions_BxL + c.position_offset,
                     c.position_offset - 1)
  if not c.position_offset:
    return jnp.arange(length)[None]
  real_BxL = (input_mask_BxL > 0).astype(jnp.int32)
  return jnp.cumsum(real_BxL, axis=1) * real_BxL + (c.position_offset - 1)


class Embeddings(nn.Module):
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, deterministic: bool,
               positions_BxL=None):
    c = self.config
    emb = lambda n, v, axes: layers.Embed(v, c.embedding_width, axes, c.initializer_range,
                                          c.jnp_dtype, name=n)
    word = emb('word_embeddings', c.vocab_size, ('vocab', 'embed'))
    segment = emb('token_type_embeddings', c.type_vocab_size, (None, 'embed'))
    if c.type_vocab_size == 1:  # RoBERTa: one segment row; pair inputs must not index past it.
      segment_ids_BxL = jnp.zeros_like(segment_ids_BxL)
    x_BxLxW = word(input_ids_BxL)
    ids_1xL = position_ids(c, input_mask_BxL, positions_BxL)  # Also checks the length.
    if not c.rotary:  # Rotary: positions enter in every layer's attention instead.
      position = emb('position_embeddings', c.max_position_embeddings, ('length', 'embed'))
      x_BxLxW = x_BxLxW + position(ids_1xL)
    if c.type_vocab_size:  # 0: no segment embeddings at all (no table).
      x_BxLxW = x_BxLxW + segment(segment_ids_BxL)
    x_BxLxW = norm(c, 'layer_norm')(x_BxLxW)
    x_BxLxW = layers.Dropout(c.hidden_dropout_rate)(x_BxLxW, deterministic=deterministic)
    if c.embedding_width != c.hidden_size:  # Factorized: vocab -> E -> hidden.
      x_BxLxW = layers.Dense((c.embedding_width,), (c.hidden_size,), ('embed',), ('embed',),
                             c.initializer_range, c.jnp_dtype, use_bias=c.dense_bias,
                             name='projection')(x_BxLxW)
    return x_BxLxW, word


def norm(c: config_lib.EncoderConfig, name: str) -> layers.LayerNorm:
  """A LayerNorm of the encoder (``norm_bias``: with or without its bias)."""
  return layers.LayerNorm(c.layer_norm_eps, c.jnp_dtype, use_bias=c.norm_bias, name=name)


def skip_first_norm(c: config_lib.EncoderConfig, layer, x, layer_norm):
  """``layer_norm(x)``, or x itself in layer 0 when ``first_attention_norm`` is False (the
  layer index is a Python int, or the layer scan's traced index: then both are computed
  and one is selected; the norm's parameters in slot 0 get no gradient)."""
  if c.first_attention_norm:
    return layer_norm(x)
  if layer is None:
    raise ValueError('config.model.first_attention_norm=False: the block was called without '
                     "its layer index (context['layer'])")
  if isinstance(layer, int):
    return x if layer == 0 else layer_norm(x)
  return jnp.where(layer == 0, x, layer_norm(x))


class AttentionBlock(nn.Module):
  """Self-attention (the configured kind), dropout, residual, LayerNorm.

  Post-LN (BERT): ``LayerNorm(x + attend(x))``. ``pre_norm``: ``x + attend(LayerNorm(x))``,
  the keys and values read from the normalised ``context['kv_states']`` too; with
  ``first_attention_norm=False`` layer 0 (``context['layer']``) attends to x itself.
  """
  config: config_lib.EncoderConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxLxE, mask_Bx1x1xL, context):
    c = self.config
    attend = attention_kinds.get(c.attention_kind)(c, self.deterministic)
    nn.share_scope(self, attend)  # Its parameters live here: query/key/value/attention_output.
    layer_norm = norm(c, 'attention_layer_norm')
    h_BxLxE = x_BxLxE
    if c.pre_norm:
      normed = lambda x: skip_first_norm(c, context.get('layer'), x, layer_norm)
      h_BxLxE = normed(x_BxLxE)
      if 'kv_states' in context:
        context = {**context, 'kv_states': normed(context['kv_states'])}
    a_BxLxE = attend(h_BxLxE, mask_Bx1x1xL, context)
    a_BxLxE = layers.Dropout(c.hidden_dropout_rate, name='attention_dropout')(
        a_BxLxE, deterministic=self.deterministic)
    return x_BxLxE + a_BxLxE if c.pre_norm else layer_norm(x_BxLxE + a_BxLxE)


class FeedForwardBlock(nn.Module):
  """Dense d -> d_ff, activation, dense d_ff -> d, dropout, residual, LayerNorm.

  ``gated_ffn`` (GLU): one input projection d -> [2, d_ff] (value, gate), then
  ``activation(value) * gate`` (GeGLU with gelu, SwiGLU with silu). ``pre_norm``: the
  LayerNorm before the block, ``x + ffn(LayerNorm(x))``.
  """
  config: config_lib.EncoderConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxLxE):
    c, dt = self.config, self.config.jnp_dtype
    e, f = c.hidden_size, c.intermediate_size
    layer_norm = norm(c, 'output_layer_norm')
    h_BxLxE = layer_norm(x_BxLxE) if c.pre_norm else x_BxLxE
    activation = config_lib.ACTIVATIONS[c.activation]
    if c.gated_ffn:  # [e, 2, f]: a tensor-parallel shard of 'mlp' holds both halves.
      vg_BxLx2xF = layers.Dense((e,), (2, f), ('embed',), (None, 'mlp'), c.initializer_range,
                                dt, use_bias=c.dense_bias, name='intermediate')(h_BxLxE)
      f_BxLxF = activation(vg_BxLx2xF[..., 0, :]) * vg_BxLx2xF[..., 1, :]
    else:
      f_BxLxF = activation(layers.Dense((e,), (f,), ('embed',), ('mlp',), c.initializer_range,
                                        dt, use_bias=c.dense_bias, name='intermediate')(h_BxLxE))
    f_BxLxE = layers.Dense((f,), (e,), ('mlp',), ('embed',), c.initializer_range, dt,
                           use_bias=c.dense_bias, name='output')(f_BxLxF)
    f_BxLxE = layers.Dropout(c.hidden_dropout_rate, name='output_dropout')(
        f_BxLxE, deterministic=self.deterministic)
    return x_BxLxE + f_BxLxE if c.pre_norm else layer_norm(x_BxLxE + f_BxLxE)


class Layer(nn.Module):
  """One post-LN transformer block; the ``nn.scan`` body (carry in, carry out).

  The two blocks share this module's scope, so a layer's parameters are one flat group
  (query, key, value, attention_output, attention_layer_norm, intermediate, output,
  output_layer_norm).
  """
  config: config_lib.EncoderConfig
  deterministic: bool
  collect_hidden: bool = False  # Also emit each layer's output (stacked by the scan).

  @nn.compact
  def __call__(self, x_BxLxE, mask_Bx1x1xL, context, layer=None):
    """``layer``: this layer's index (the scan's traced int32, or an int), handed to the
    blocks as ``context['layer']`` (local/global attention, the first layer's norm)."""
    context = {**context, 'layer': layer}
    attention = AttentionBlock(self.config, self.deterministic)
    ffn = FeedForwardBlock(self.config, self.deterministic)
    nn.share_scope(self, attention)
    nn.share_scope(self, ffn)
    x_BxLxE = ffn(attention(x_BxLxE, mask_Bx1x1xL, context))
    return x_BxLxE, (x_BxLxE if self.collect_hidden else None)


class Encoder(nn.Module):
  """The stack of layers: scanned (own or shared parameters), or partly shared (ALBERT).

  ``share_layers``: 'none' (BERT; parameters under ``layers`` with a leading layer axis),
  'all' (ALBERT; one set under ``layers``, applied ``num_layers`` times), 'attention' or
  'ffn' (that block shared under ``shared``, the other per layer under ``layer_<i>``).
  """
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxE, input_mask_BxL, deterministic: bool, collect_hidden: bool = False,
               context: dict[str, Any] | None = None, rows_BxQ=None,
               rows_context: dict[str, Any] | None = None):
    c = self.config
    context = {} if context is None else context
    mask_Bx1x1xL = input_mask_BxL.astype(bool)[:, None, None, :]
    if rows_BxQ is not None:
      if collect_hidden:
        raise ValueError('Encoder: rows_BxQ (the last layer at some rows) and collect_hidden '
                         '(every layer at every row) exclude each other')
      if not self.is_initializing():
        y_BxQxE, before_BxLxE = self._last_layer_at_rows(
            x_BxLxE, mask_Bx1x1xL, deterministic, context, rows_BxQ, rows_context or {})
        return self._final_norm(y_BxQxE), before_BxLxE
      collect_hidden = True  # Initialising: the whole stack (it creates the parameters).
    embedded_BxLxE = x_BxLxE
    x_BxLxE, all_NxBxLxE = self._stack(x_BxLxE, mask_Bx1x1xL, deterministic, collect_hidden,
                                       context)
    x_BxLxE = self._final_norm(x_BxLxE)
    if rows_BxQ is None:
      return x_BxLxE, all_NxBxLxE
    before_BxLxE = all_NxBxLxE[-2] if c.num_layers > 1 else embedded_BxLxE
    return jnp.take_along_axis(x_BxLxE, rows_BxQ[..., None], axis=1), before_BxLxE

  def _final_norm(self, x_BxLxE):
    """Pre-LN: the LayerNorm after the last layer (its output is the sequence output; the
    collected per-layer states stay un-normalised, as Hugging Face's pre-LN models)."""
    return norm(self.config, 'final_layer_norm')(x_BxLxE) if self.config.pre_norm else x_BxLxE

  def _stack(self, x_BxLxE, mask_Bx1x1xL, deterministic, collect_hidden, context):
    c = self.config
    if c.share_layers in ('none', 'all'):
      body = nn.remat(Layer, prevent_cse=False) if c.remat else Layer
      shared = c.share_layers == 'all'
      stack = nn.scan(body, variable_axes={} if shared else {'params': 0},
                      variable_broadcast='params' if shared else False,
                      split_rngs={'params': not shared, 'dropout': True},
                      in_axes=(nn.broadcast, nn.broadcast, 0), length=c.num_layers,
                      unroll=c.layers_per_iteration,
                      metadata_params={nn.PARTITION_NAME: 'layers'})
      # The layer index is scanned with the layers (per-layer behaviour: local/global).
      x_BxLxE, all_NxBxLxE = stack(c, deterministic, collect_hidden, name='layers')(
          x_BxLxE, mask_Bx1x1xL, context, jnp.arange(c.num_layers, dtype=jnp.int32))
      return x_BxLxE, all_NxBxLxE
    wrap = (lambda m: nn.remat(m, prevent_cse=False)) if c.remat else (lambda m: m)
    shared_attention = c.share_layers == 'attention'
    shared_cls = wrap(AttentionBlock if shared_attention else FeedForwardBlock)
    own_cls = wrap(FeedForwardBlock if shared_attention else AttentionBlock)
    shared = shared_cls(c, deterministic, name='shared')
    outputs = []
    for i in range(c.num_layers):
      own = own_cls(c, deterministic, name=f'layer_{i}')
      context_i = {**context, 'layer': i}
      if shared_attention:
        x_BxLxE = own(shared(x_BxLxE, mask_Bx1x1xL, context_i))
      else:
        x_BxLxE = shared(own(x_BxLxE, mask_Bx1x1xL, context_i))
      outputs.append(x_BxLxE)
    return x_BxLxE, (jnp.stack(outputs) if collect_hidden else None)

  def _last_layer_at_rows(self, x_BxLxE, mask_Bx1x1xL, deterministic, context, rows_BxQ,
                          rows_context):
    """Layers 1..N-1 at every row, then layer N at ``rows_BxQ`` only: (x_BxQxE, input of N).

    A row's output depends on its own input and on every row's keys and values, so layer
    N runs its queries, residuals and feed-forward at the Q rows and its keys and values at
    all L (``context['kv_states']``): exact, and layer N costs about Q/L of a layer when
    the loss reads only those rows (the MLM head's positions, [CLS], SBO's boundaries).
    ``rows_context`` replaces context entries for layer N (e.g. DeBERTa's relative index
    at the rows). The parameters are the scan's, sliced: layout and checkpoints unchanged.
    When initialising, the whole stack runs (it creates the parameters) and the rows are
    taken from its output.

    A position listed twice (e.g. one span boundary read by several SBO slots) is computed
    twice, and in training each copy draws its own dropout: every prediction still reads
    a proper dropout sample of that state, but two predictions no longer share one.
    """
    c = self.config
    take = lambda x_BxLxE: jnp.take_along_axis(x_BxLxE, rows_BxQ[..., None], axis=1)
    n = c.num_layers
    params = nn.meta.unbox(self.variables['params'])
    dropout_keys = (None if deterministic or not c.has_dropout
                    else jax.random.split(self.make_rng('dropout'), n))

    def rngs(key):
      return None if key is None else {'dropout': key}

    last_context = {**context, **rows_context, 'kv_states': x_BxLxE,
                    'query_positions': rows_BxQ}
    if c.share_layers in ('none', 'all'):
      shared = c.share_layers == 'all'
      stacked = params['layers']
      layer = Layer(c, deterministic, parent=None)

      def body(x_BxLxE, p_key_index):
        p, key, index = p_key_index
        return layer.apply({'params': stacked if shared else p}, x_BxLxE, mask_Bx1x1xL,
                           context, index, rngs=rngs(key))[0], None

      if c.remat:
        body = jax.checkpoint(body, prevent_cse=False)
      head = None if shared else jax.tree.map(lambda p: p[:-1], stacked)
      keys = None if dropout_keys is None else dropout_keys[:-1]
      if n > 1:
        x_BxLxE, _ = layers.layer_scan(body, x_BxLxE,
                                       (head, keys, jnp.arange(n - 1, dtype=jnp.int32)), n - 1,
                                       min(c.layers_per_iteration, n - 1))
      last = stacked if shared else jax.tree.map(lambda p: p[-1], stacked)
      last_context['kv_states'] = x_BxLxE
      y_BxQxE, _ = layer.apply({'params': last}, take(x_BxLxE), mask_Bx1x1xL, last_context,
                               n - 1,
                               rngs=rngs(None if dropout_keys is None else dropout_keys[-1]))
      return y_BxQxE, x_BxLxE
    shared_attention = c.share_layers == 'attention'
    block = lambda cls, name: lambda *a, key: cls(c, deterministic, parent=None).apply(
        {'params': params[name]}, *a, rngs=rngs(key))
    for i in range(n):
      key = None if dropout_keys is None else dropout_keys[i]
      k1, k2 = (None, None) if key is None else jax.random.split(key)
      context_i = {**context, 'layer': i}
      attention = block(AttentionBlock, 'shared' if shared_attention else f'layer_{i}')
      ffn = block(FeedForwardBlock, f'layer_{i}' if shared_attention else 'shared')
      if i < n - 1:
        run = lambda x, k1, k2, attention=attention, ffn=ffn, context_i=context_i: ffn(
            attention(x, mask_Bx1x1xL, context_i, key=k1), key=k2)
        if c.remat:  # As _stack's nn.remat blocks.
          run = jax.checkpoint(run, prevent_cse=False)
        x_BxLxE = run(x_BxLxE, k1, k2)
      else:
        last_context.update(kv_states=x_BxLxE, layer=i)
        y_BxQxE = ffn(attention(take(x_BxLxE), mask_Bx1x1xL, last_context, key=k1), key=k2)
    return y_BxQxE, x_BxLxE


def last_layer_rows(length: int, wanted: list, pool: bool, collect_hidden: bool = False):
  """The rows [B, Q] the last layer computes when a pretraining loss reads only ``wanted``
  ([B, k] position arrays, concatenated; [CLS] comes first inside ``encode`` when
  ``pool``), or None for every row: when every layer's states are collected, or when Q
  would not be below the sequence length (then the plain full pass is as cheap)."""
  wanted = [w for w in wanted if w is not None]
  if collect_hidden or not wanted:
    return None
  rows_BxQ = jnp.concatenate(wanted, axis=1) if len(wanted) > 1 else wanted[0]
  return rows_BxQ if rows_BxQ.shape[1] + int(pool) < length else None


def with_cls(rows_BxQ):
  """[CLS] (position 0) first, then ``rows_BxQ``: the rows of a pass that also pools."""
  return jnp.concatenate([jnp.zeros((rows_BxQ.shape[0], 1), rows_BxQ.dtype), rows_BxQ], 1)


def encode(c: config_lib.EncoderConfig, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
           deterministic: bool, pool: bool = True, collect_hidden: bool = False, rows_BxQ=None,
           document_ids_BxL=None) -> dict[str, Any]:
  """Embeddings -> encoder [-> tanh pooler on the first token], inside the calling module.

  The submodules are named 'embeddings', 'encoder' and 'pooler' in whatever module calls
  this, so every model built on it (pretraining, encoder-only, fine-tuning heads) shares
  one parameter layout and loads the same checkpoints.

  ``rows_BxQ`` (pretraining, see ``last_layer_rows``): the last layer runs at those rows
  (and [CLS] for the pooler) only, and ``row_output`` [B, Q, H] replaces
  ``sequence_output``.

  ``document_ids_BxL`` (packed rows, ``models.packing``): each document attends to itself
  only, with its positions restarting at its first token; the pooler reads the first
  token of the row (the first document's [CLS]).
  """
  packed = packing.context(document_ids_BxL)
  embedded_BxLxE, word_embed = Embeddings(c, name='embeddings')(
      input_ids_BxL, segment_ids_BxL, input_mask_BxL, deterministic, packed.get('positions'))
  if rows_BxQ is not None and pool:
    rows_BxQ = with_cls(rows_BxQ)
  x_BxLxE, all_NxBxLxE = Encoder(c, name='encoder')(embedded_BxLxE, input_mask_BxL,
                                                    deterministic, collect_hidden,
                                                    context=packed, rows_BxQ=rows_BxQ)
  if rows_BxQ is None:
    out = {'sequence_output': x_BxLxE, 'word_embed': word_embed}
  else:  # x is [B, Q, H] at the rows ([CLS] first when pooling).
    out = {'row_output': x_BxLxE[:, 1:] if pool else x_BxLxE, 'word_embed': word_embed}
  if pool:
    out['pooled_output'] = jnp.tanh(layers.Dense(
        (c.hidden_size,), (c.hidden_size,), ('embed',), ('embed',), c.initializer_range,
        c.jnp_dtype, name='pooler')(x_BxLxE[:, 0]))
  if collect_hidden:  # Embedding output, then each layer's output (as Hugging Face).
    out['all_hidden_states'] = (embedded_BxLxE, *all_NxBxLxE)
  return out


def rows_with_cls(c: config_lib.EncoderConfig, predictions: int, gathered: int) -> int:
  """``ModelKind.last_layer_rows`` of a pretraining network with a pooler."""
  del c
  return predictions + gathered + 1


def rows_without_cls(c: config_lib.EncoderConfig, predictions: int, gathered: int) -> int:
  """``ModelKind.last_layer_rows`` of a pretraining network without a pooler."""
  del c
  return predictions + gathered


def read_rows(out: dict[str, Any], masked_positions_BxP, gather_positions_BxG):
  """(states at the masked positions, states at the gathered positions or None) from an
  ``encode`` output with or without ``row_output`` (rows = masked, then gathered)."""
  p = masked_positions_BxP.shape[1]
  if 'row_output' in out:
    h_BxQxE = out.pop('row_output')
  else:
    positions = [masked_positions_BxP, gather_positions_BxG]
    rows_BxQ = jnp.concatenate([x for x in positions if x is not None], axis=1)
    h_BxQxE = jnp.take_along_axis(out['sequence_output'], rows_BxQ[..., None], axis=1)
  return h_BxQxE[:, :p], (None if gather_positions_BxG is None else h_BxQxE[:, p:])


class MlmHead(nn.Module):
  """Dense hidden -> E, activation, LayerNorm, tied decoder E -> vocabulary, output bias."""
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, h_BxPxE, word_embed: layers.Embed):
    c, dt = self.config, self.config.jnp_dtype
    w = c.embedding_width
    h_BxPxW = layers.Dense((c.hidden_size,), (w,), ('embed',), ('embed',),
                           c.initializer_range, dt, use_bias=c.dense_bias,
                           name='transform')(h_BxPxE)
    h_BxPxW = config_lib.ACTIVATIONS[c.activation](h_BxPxW)
    h_BxPxW = norm(c, 'layer_norm')(h_BxPxW)
    bias_V = layers.param(self, 'output_bias', nn.initializers.zeros, (c.vocab_size,), ('vocab',))
    return word_embed.attend(h_BxPxW, bias_V)


class EncoderOnly(nn.Module):
  """The encoder alone (embeddings, layers, pooler if the kind has one): features."""
  config: config_lib.EncoderConfig
  pooler: bool = True

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
               deterministic: bool = True, collect_hidden: bool = False,
               document_ids_BxL=None) -> dict[str, Any]:
    out = encode(self.config, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                 deterministic=deterministic, pool=self.pooler, collect_hidden=collect_hidden,
                 document_ids_BxL=document_ids_BxL)
    del out['word_embed']
    return out


class EncoderWithHeads(nn.Module):
  """Encoder + MLM head [+ pooler] [+ pair (NSP/SOP) head].

  ``masked_positions_BxP`` selects where the MLM head runs: vocabulary logits are computed
  only there (the head is the most expensive part of a small model at full length).
  ``gather_positions_BxG``: more rows a loss reads (SpanBERT's span boundaries), returned as
  ``gathered_output`` [B, G, H]. With positions given, the last layer runs only at those
  rows and [CLS] when they are fewer than the sequence's (``last_layer_rows``), and
  ``sequence_output`` is then absent.
  """
  config: config_lib.EncoderConfig
  pooler: bool = True
  pair_head: bool = True

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, masked_positions_BxP=None,
               *, deterministic: bool = True, collect_hidden: bool = False,
               gather_positions_BxG=None, document_ids_BxL=None) -> dict[str, Any]:
    c = self.config
    length = input_ids_BxL.shape[1]
    rows_BxQ = None
    if masked_positions_BxP is None:
      masked_positions_BxP = jnp.broadcast_to(jnp.arange(length), input_ids_BxL.shape)
    else:
      rows_BxQ = last_layer_rows(length, [masked_positions_BxP, gather_positions_BxG],
                                 self.pooler, collect_hidden)
    out = encode(c, input_ids_BxL, segment_ids_BxL, input_mask_BxL, deterministic=deterministic,
                 pool=self.pooler, collect_hidden=collect_hidden, rows_BxQ=rows_BxQ,
                 document_ids_BxL=document_ids_BxL)
    word_embed = out.pop('word_embed')
    if self.pair_head:
      out['pair_logits'] = layers.Dense(
          (c.hidden_size,), (2,), ('embed',), (None,), c.initializer_range, c.jnp_dtype,
          name='pair_head')(out['pooled_output']).astype(jnp.float32)
    h_BxPxE, gathered = read_rows(out, masked_positions_BxP, gather_positions_BxG)
    if gathered is not None:
      out['gathered_output'] = gathered
    out['mlm_logits'] = MlmHead(c, name='mlm_head')(h_BxPxE, word_embed)
    return out
