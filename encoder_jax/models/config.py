"""The encoder config every model kind reads, and what a model kind is.

``config.model`` (a ConfigDict, see ``config_base``) maps one-to-one onto
:class:`EncoderConfig`; ``config.model.kind`` names a :class:`ModelKind` in
``models.registry``. A kind says which network to build from the config, which heads
its pretraining network has, its FLOPs per token (for MFU), and which Hugging Face
parameter table converts it (``interop.hf_<kind>``, looked up by ``interop.registry``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from encoder_jax.core import fields as fields_lib
from encoder_jax.models import attention as attention_lib
from encoder_jax.models import attention_kinds

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def gelu(x: jax.Array) -> jax.Array:
  """Exact GELU, ``x * Phi(x)`` with ``Phi(x) = (1 + erf(x / sqrt(2))) / 2``: PyTorch's and
  Hugging Face's formula, computed in float32 whatever the input dtype (``1 + erf`` cancels
  for negative x, which bfloat16 could not resolve) and cast back. In float32,
  ``nn.gelu(approximate=False)`` (through ``erfc``) gives the same values within 1e-6 and
  is slower on XLA:CPU (``benchmarks/bench_ops.py`` times both).
  """
  x32 = x.astype(jnp.float32)
  return (x32 * (0.5 * (1.0 + jax.lax.erf(x32 * 0.7071067811865476)))).astype(x.dtype)


# HF names: 'gelu' is the exact erf GELU (BERT, RoBERTa); 'gelu_new' the tanh
# approximation (ALBERT's released models, GPT-2).
ACTIVATIONS = {
    'gelu': gelu,
    'gelu_new': functools.partial(nn.gelu, approximate=True),
    'relu': nn.relu,
    'silu': nn.silu,  # With gated_ffn: SwiGLU.
}
SHARE_LAYERS = ('none', 'all', 'attention', 'ffn')

T = TypeVar('T')
# Which part of the encoder reads a field (``_field``'s group): the kind's name, the trunk
# and its shared options, or one kind's own network (DeBERTa's relative positions, XLNet's
# memory), whose entry lists its group in ``ModelKind.fields`` (:func:`kind_fields`).
KIND_GROUP, SHARED, BLOCK, DEBERTA, XLNET = 'kind', 'shared', 'block', 'deberta', 'xlnet'


def _field(default: T, spec: fields_lib.Check, doc: str, group: str = SHARED) -> T:
  """One ``config.model`` field of :class:`EncoderConfig`: its default, allowed range and
  meaning; its name and type are the attribute's. Typed as its default, so a type checker
  reads ``hidden_size: int = _field(768, ...)`` as an int field with a default."""
  return dataclasses.field(default=default, metadata={'spec': spec, 'doc': doc, 'group': group})


def _block_option(default: T, spec: fields_lib.Check, doc: str) -> T:
  return _field(default, spec, doc, BLOCK)


F, B = _field, _block_option


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderConfig:
  """Shapes and options of a Transformer encoder: the values of ``config.model``.

  Every field is declared here, typed, with its default, range and meaning, so that code
  below the kinds (the trunk, attention, layers) and a type checker see one class; a kind
  with fields of its own names their group on its entry (``ModelKind.fields``). Each value
  is range-checked when the config is built (``__post_init__``, also on ``replace``), so a
  bad value is named here whichever way the config was made. Frozen and hashable (a static
  argument of jit and a Flax module attribute), equal by value, picklable.
  """
  # The kind's name; ``models.registry.KIND`` checks it is one (the registry knows them).
  kind: str = F('bert', fields_lib.string(non_empty=True),
                "Name in models.registry.KINDS: 'bert', 'roberta', 'albert', 'electra', ...",
                group=KIND_GROUP)
  # The fields every kind reads (the trunk); BERT-base defaults.
  vocab_size: int = F(30522, fields_lib.integer(1),
                      'Also the size of the tokenizer trained by prepare; checked at start-up.')
  hidden_size: int = F(768, fields_lib.integer(1), 'd_model.')
  num_layers: int = F(12, fields_lib.integer(1), 'Transformer layers.')
  num_heads: int = F(12, fields_lib.integer(1),
                     'Attention heads per layer (hidden_size must be a multiple).')
  intermediate_size: int = F(3072, fields_lib.integer(1), 'd_ff of the feed-forward block.')
  max_position_embeddings: int = F(512, fields_lib.integer(1), 'Learned absolute positions.')
  type_vocab_size: int = F(2, fields_lib.integer(0),
                           'Segment (A/B) embeddings; 0 = none (the released DeBERTa models).')
  hidden_dropout_rate: float = F(
      0.1, fields_lib.number(0, 1, hi_open=True),
      'Dropout on the embeddings and on each block\'s output, while training.')
  attention_dropout_rate: float = F(0.1, fields_lib.number(0, 1, hi_open=True),
                                    'Dropout on the attention probabilities, while training.')
  layer_norm_eps: float = F(1e-12, fields_lib.number(0, lo_open=True),
                            'Epsilon of every LayerNorm (BERT 1e-12, RoBERTa 1e-5).')
  initializer_range: float = F(0.02, fields_lib.number(0, lo_open=True),
                               'Std of the truncated-normal init.')
  attention_kind: str = F('dot_product',
                          fields_lib.names(lambda: attention_kinds.REGISTRY, 'an attention kind'),
                          'Name in models.attention_kinds.REGISTRY.')
  dtype: str = F('float32', fields_lib.one_of(*DTYPES),
                 "Activation dtype: 'float32' or 'bfloat16' (params stay float32).")
  remat: bool = F(False, fields_lib.boolean(),
                  'Rematerialise each layer in the backward pass (saves activation memory).')
  scan_unroll: int = F(
      1, fields_lib.integer(0),
      'Layers per iteration of the layer scan: 1 = a loop (shortest compile), 0 = every '
      'layer (straight-line code, no per-layer stacking of saved activations: faster '
      'steps, longer compiles). The parameters are the same either way.')
  activation: str = F(
      'gelu', fields_lib.one_of(*ACTIVATIONS),
      "Feed-forward/MLM-head activation: 'gelu' (erf), 'gelu_new' (tanh), 'relu'.")
  embedding_size: int = F(0, fields_lib.integer(0),
                          'Token embedding width E; 0 = hidden_size (ALBERT: 128, projected).')
  share_layers: str = F('none', fields_lib.one_of(*SHARE_LAYERS),
                        "Cross-layer sharing: 'none', 'all' (ALBERT), 'attention', 'ffn'.")
  position_offset: int = F(0, fields_lib.integer(0),
                           'First position id (RoBERTa: padding id + 1 = 2).')
  attention_implementation: str | None = F(
      None, fields_lib.one_of(*attention_lib.IMPLEMENTATIONS),
      "Dot-product attention backend: 'xla', 'cudnn' (jax.nn.dot_product_attention's fused "
      "flash attention; bf16, right-padded masks given as key lengths), 'splash' (the Pallas "
      'TPU splash-attention kernel: padding and packed documents as segment ids, local '
      'windows as its local mask; Pallas interpret mode on CPU), or None: splash on TPUs, '
      'cuDNN on GPUs in bf16, else XLA. Training with attention_dropout_rate > 0 always runs '
      "the explicit XLA softmax, as does XLNet's attention (a log line says so where splash was "
      "chosen) and queries at some rows (the last layer at the predicted ones); DeBERTa's "
      'disentangled attention runs its own Pallas kernel where splash is chosen.')
  scanned_attention: str = F(
      'by_layer', fields_lib.one_of(*attention_lib.SCANNED_ATTENTION),
      "With local_attention: 'by_layer' = each layer of the layer scan attends as its index "
      "says (a lax.cond on it); 'global' / 'local' = every scanned layer attends so, with no "
      'conditional (the last layer, outside the scan, keeps its own). For counting what each '
      "kind of layer costs (the compile command: XLA counts a conditional as its costliest "
      "branch); a run keeps 'by_layer'.")
  # Options of the Transformer block that several kinds share (one implementation, in
  # ``trunk``'s blocks). A kind lists the ones it implements in ``ModelKind.block_options``;
  # ``models.registry.make_config`` refuses a non-default value of any other, so an option
  # is never silently ignored. Their defaults are BERT's.
  pre_norm: bool = B(
      False, fields_lib.boolean(),
      'Pre-LN blocks: x + f(LayerNorm(x)) for attention and feed-forward, and a final '
      'LayerNorm after the last layer (Cramming, ModernBERT); False = post-LN (BERT).')
  gated_ffn: bool = B(
      False, fields_lib.boolean(),
      'GLU feed-forward: d -> 2 x d_ff (value, gate), activation(value) * gate, d_ff -> d '
      '(GeGLU with gelu, SwiGLU with silu); False = dense, activation, dense.')
  dense_bias: bool = B(
      True, fields_lib.boolean(),
      "Biases in the encoder's dense layers (attention, feed-forward, factorized embedding "
      "projection, the MLM head's transform); False = bias-free (Cramming, ModernBERT).")
  norm_bias: bool = B(
      True, fields_lib.boolean(),
      'A bias (shift) in every LayerNorm of the encoder and MLM head; False = scale only.')
  rotary: bool = B(
      False, fields_lib.boolean(),
      'Rotary position embeddings (RoPE) on the queries and keys of every layer, and no '
      'absolute position table (RoFormer, ModernBERT); False = learned absolute positions.')
  rope_theta: float = B(
      10000.0, fields_lib.number(1.0),
      'RoPE base: frequencies theta^(-2i/d) of the head dimension d (of the global layers '
      'when some layers are local: ModernBERT 160,000).')
  local_attention: int = B(
      0, fields_lib.integer(0),
      'Sliding-window attention, in tokens (ModernBERT: 128): on the local layers (see '
      'global_attn_every_n_layers) a token attends to the tokens at most local_attention // 2 '
      'positions away, computed band by band (memory linear in the length); 0 = every '
      'layer attends globally.')
  global_attn_every_n_layers: int = B(
      1, fields_lib.integer(1),
      'With local_attention: layer i (from 0) is global when i % n == 0, the others local '
      '(ModernBERT: 3, so layers 0, 3, 6, ... global).')
  local_rope_theta: float = B(
      0.0, fields_lib.number(0.0),
      'RoPE base of the local layers (ModernBERT: 10,000); 0 = rope_theta.')
  first_attention_norm: bool = B(
      True, fields_lib.boolean(),
      "With pre_norm: False = the first layer's attention reads its input without a "
      'LayerNorm (ModernBERT: the embedding LayerNorm has just normalised it; the stacked '
      "parameter's first slot is unused).")
  fused_qkv: bool = B(
      False, fields_lib.boolean(),
      'One query/key/value projection, kernel [embed, 3, heads, head_dim] (ModernBERT\'s '
      'Wqkv; one matmul instead of three); False = separate query, key, value.')
  # DeBERTa's own (models/deberta.py, and the 'disentangled' attention kind).
  position_biased_input: bool = F(
      True, fields_lib.boolean(),
      'Absolute positions added to the input embeddings (DeBERTa: False, with the EMD).',
      group=DEBERTA)
  max_relative_positions: int = F(
      -1, fields_lib.integer(-1),
      'Relative span k (distances clipped at k); < 1 = max_position_embeddings.', group=DEBERTA)
  position_buckets: int = F(
      0, fields_lib.integer(0),
      'deberta_v2: log buckets of relative positions (v2/v3: 256); 0 = off.', group=DEBERTA)
  share_att_key: bool = F(
      False, fields_lib.boolean(),
      'deberta_v2: position keys/queries use the content projections.', group=DEBERTA)
  norm_rel_ebd: bool = F(
      False, fields_lib.boolean(),
      'deberta_v2: LayerNorm on the relative-position embeddings.', group=DEBERTA)
  pos_att_type: str = F(
      'c2p|p2c', fields_lib.one_of('c2p|p2c', 'p2c|c2p', 'c2p', 'p2c', ''),
      "Disentangled terms beside c2c: 'c2p|p2c', 'c2p', 'p2c' or ''.", group=DEBERTA)
  emd_layers: int = F(
      0, fields_lib.integer(0),
      'Enhanced mask decoder: layers sharing the last layer\'s weights (2); 0 = off.',
      group=DEBERTA)
  # XLNet's own (models/xlnet.py).
  mem_len: int = F(
      0, fields_lib.integer(0),
      'Transformer-XL memory: cached states per layer, carried across steps in the training '
      'state (0 = none).', group=XLNET)
  clamp_len: int = F(-1, fields_lib.integer(1, also=(-1,)),
                     'Relative distances clipped to +-clamp_len (-1 = no clipping).', group=XLNET)

  def __post_init__(self):
    found = fields_lib.problems({'model': self.to_dict()}, {'model': _RECORDS})
    if found:
      raise ValueError(found[0])
    self._cross_check()

  def _cross_check(self) -> None:
    if self.hidden_size % self.num_heads:
      raise ValueError(f'config.model.hidden_size={self.hidden_size}: expected a multiple of '
                       f'model.num_heads={self.num_heads}')
    if not self.position_offset < self.max_position_embeddings:
      raise ValueError(f'config.model.position_offset={self.position_offset}: expected < '
                       f'model.max_position_embeddings={self.max_position_embeddings}')
    attention_kinds.get(self.attention_kind)  # Fails early, listing the valid kinds.
    if not self.first_attention_norm and not self.pre_norm:
      raise ValueError('config.model.first_attention_norm=False needs pre_norm=True (a post-LN '
                       "block's LayerNorm comes after the residual)")

  @classmethod
  def from_config(cls, model_config: ml_collections.ConfigDict | Mapping[str, Any]
                  ) -> EncoderConfig:
    values = dict(model_config.to_dict() if hasattr(model_config, 'to_dict') else model_config)
    _refuse_unknown(values)
    return cls(**values)

  def to_dict(self) -> dict[str, Any]:
    return {name: getattr(self, name) for name in _RECORDS}

  def replace(self, **kw: Any) -> EncoderConfig:
    _refuse_unknown(kw)
    return dataclasses.replace(self, **kw)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def embedding_width(self) -> int:
    """Width of the token embeddings (and of the tied MLM decoder)."""
    return self.embedding_size or self.hidden_size

  @property
  def has_dropout(self) -> bool:
    """Any dropout in the encoder (hidden or attention): training then needs 'dropout' keys."""
    return self.hidden_dropout_rate > 0 or self.attention_dropout_rate > 0

  @property
  def layers_per_iteration(self) -> int:
    """``scan_unroll`` as ``nn.scan``'s ``unroll``: 0 (or more than the layers) = all."""
    return min(self.scan_unroll or self.num_layers, self.num_layers)

  @property
  def max_length(self) -> int:
    """The longest sequence the position table holds (RoBERTa: 514 - 2 = 512)."""
    return self.max_position_embeddings - self.position_offset

  @property
  def jnp_dtype(self):
    return DTYPES[self.dtype]

  @property
  def has_local_layers(self) -> bool:
    """Some layers attend within a sliding window (``local_attention``)."""
    return self.local_attention > 0 and any(
        not self.layer_is_global(i) for i in range(self.num_layers))

  def layer_is_global(self, index):
    """Whether layer ``index`` (from 0; an int, or a traced int32 inside the layer scan)
    attends globally: every layer without ``local_attention``, else every n-th."""
    if self.local_attention <= 0:
      return True
    return index % self.global_attn_every_n_layers == 0

  @property
  def half_window(self) -> int:
    """Keys at most this far from the query on a local layer (``local_attention // 2``)."""
    return self.local_attention // 2

  @property
  def local_theta(self) -> float:
    return self.local_rope_theta or self.rope_theta

  def keys_per_query(self, index: int, seq_len: int) -> int:
    """Keys one query of layer ``index`` attends to at ``seq_len`` (model FLOPs: the band
    of a local layer, not the blocks its computation spans)."""
    if self.layer_is_global(index):
      return seq_len
    return min(seq_len, 2 * self.half_window + 1)


def _record(f: dataclasses.Field) -> fields_lib.Field:
  return fields_lib.Field(f.name, f.default, f.metadata['spec'], f.metadata['doc'])


# Every config.model field's record (name, default, range, meaning), in declaration order.
_RECORDS: dict[str, fields_lib.Field] = {
    f.name: _record(f) for f in dataclasses.fields(EncoderConfig)}
_GROUPS: dict[str, str] = {f.name: f.metadata['group'] for f in dataclasses.fields(EncoderConfig)}


def _group(*groups: str) -> tuple[fields_lib.Field, ...]:
  return tuple(r for name, r in _RECORDS.items() if _GROUPS[name] in groups)


KIND_FIELD = _RECORDS['kind']
BLOCK_OPTIONS: tuple[fields_lib.Field, ...] = _group(BLOCK)
BLOCK_OPTION_NAMES = tuple(f.name for f in BLOCK_OPTIONS)
# The fields every kind reads (the trunk and its options).
FIELDS: tuple[fields_lib.Field, ...] = _group(SHARED, BLOCK)


def kind_fields(group: str) -> tuple[fields_lib.Field, ...]:
  """The records of one kind's own fields (``ModelKind.fields``), e.g. ``'xlnet'``."""
  found = _group(group)
  if group in (KIND_GROUP, SHARED, BLOCK) or not found:
    raise ValueError(f'no kind declares fields of group {group!r}; the kinds\' groups: '
                     f'{sorted(set(_GROUPS.values()) - {KIND_GROUP, SHARED, BLOCK})}')
  return found


def _refuse_unknown(values: Mapping[str, Any]) -> None:
  unknown = sorted(set(values) - set(_RECORDS))
  if unknown:
    raise ValueError(f'config.model has unknown fields {unknown}; expected {sorted(_RECORDS)}')


def encoder_flops_per_token(c: EncoderConfig, seq_len: int) -> float:
  """Training FLOPs (forward + backward = 3x forward) of the encoder for one token.

  ``6*L*(4*d^2 + 2*d*d_ff) + 12*L*s*d``: the q/k/v/output projections and the
  feed-forward block (2 FLOPs per multiply-add, 3 passes; ``3*d*d_ff`` gated), plus the
  attention scores and weighted sum (a local layer's over the
  ``2 * (local_attention // 2) + 1`` keys of its band, ``keys_per_query``). Sharing layers
  (ALBERT) saves parameters, not FLOPs; a factorized embedding adds its E x d projection.
  """
  L, d = c.num_layers, c.hidden_size
  keys = sum(c.keys_per_query(i, seq_len) for i in range(L))  # L * seq_len if all global.
  flops = 6 * L * (4 * d * d + ffn_macs(c)) + 12 * keys * d
  if c.embedding_width != d:
    flops += 6 * c.embedding_width * d
  return float(flops)


def encoder_row_flops(c: EncoderConfig, seq_len: int) -> float:
  """Training FLOPs of one layer's query side for one row: the q and output projections,
  the feed-forward block and the row's attention scores and weighted sum (its keys and
  values stay). What the last layer saves per row when the loss does not read it."""
  d = c.hidden_size
  keys = c.keys_per_query(c.num_layers - 1, seq_len)
  return float(6 * (2 * d * d + ffn_macs(c)) + 12 * keys * d)


def ffn_macs(c: EncoderConfig) -> int:
  """Multiply-adds of one token through the feed-forward block: ``2 d d_ff``, or
  ``3 d d_ff`` with ``gated_ffn`` (the input projection is twice as wide)."""
  return (3 if c.gated_ffn else 2) * c.hidden_size * c.intermediate_size


@dataclasses.dataclass(frozen=True)
class ModelKind:
  """One entry of ``models.registry``: how to build and count a kind of encoder.

  ``pretraining(cfg)`` is called as ``(input_ids, segment_ids, input_mask,
  masked_positions=None, *, deterministic, collect_hidden)`` and returns a dict with
  ``sequence_output`` [B, L, H], ``mlm_logits`` [B, P, V] (float32, only at
  ``masked_positions``), ``pooled_output`` / ``pair_logits`` when the kind has a pooler /
  pair head, and ``all_hidden_states`` when ``collect_hidden``. A kind with
  ``last_layer_rows`` also takes ``gather_positions_BxG`` (more rows a loss reads, returned
  as ``gathered_output``) and, given ``masked_positions`` without ``collect_hidden``, runs
  its last layer at the rows the losses read only when those are fewer than the
  sequence's: ``sequence_output`` is then absent. A kind with ``packed_rows`` also takes
  ``document_ids_BxL`` (packed rows). ``encoder(cfg)`` is the
  same network without the pretraining heads (same parameter paths, so it runs on the
  pretraining params); ``encode`` builds that trunk inside any compact module (for task
  heads).
  """
  name: str
  pretraining: Callable[[EncoderConfig], nn.Module]
  encoder: Callable[[EncoderConfig], nn.Module]
  encode: Callable[..., dict[str, Any]]
  pooler: bool  # A tanh pooler on the first token ('pooled_output').
  pair_head: bool  # A two-way head on the pooled state (NSP / SOP).
  mlm_head: bool = True  # 'mlm_logits' at masked_positions (False: ELECTRA's discriminator).
  check: Callable[[EncoderConfig], None] = lambda c: None  # Kind-specific constraints.
  flops_per_token: Callable[[EncoderConfig, int], float] = encoder_flops_per_token
  description: str = ''
  # What a checkpoint of this kind imported from Hugging Face continues pretraining with by
  # default: config.objective.names and config.data.pair_kind.
  import_objectives: tuple[str, ...] = ('mlm',)
  import_pair_kind: str = 'full_sentences'
  # The records of the kind's own config.model fields (beside FIELDS): ``kind_fields`` of
  # its group of ``EncoderConfig``'s fields.
  fields: tuple[fields_lib.Field, ...] = ()
  # A kind trained beside a second network (ELECTRA's discriminator): the second network's
  # config from this one's and (hidden fraction, layers fraction), and the parameter
  # subtrees of ``embeddings`` the two share (stored once, in this kind's tree).
  companion_config: Callable[..., EncoderConfig] | None = None
  shared_embeddings: tuple[str, ...] = ()
  # Rows the pretraining network's last layer computes, from (config, masked positions,
  # gathered positions): the rows its losses read ([CLS] included when pooling), as the
  # module decides them (e.g. ``trunk.last_layer_rows``); None = every row. With
  # ``row_flops`` (one row's query-side FLOPs) it keeps the MFU count to the work done.
  last_layer_rows: Callable[[EncoderConfig, int, int], int] | None = None
  row_flops: Callable[[EncoderConfig, int], float] = encoder_row_flops
  # The shared block options (``BLOCK_OPTION_NAMES``) this kind implements; any other set
  # away from its default is refused by ``models.registry.make_config``.
  block_options: tuple[str, ...] = ()
  # Whether the kind's networks take ``document_ids_BxL`` (packed rows, several documents
  # per row: ``models.packing``) in ``pretraining``, ``encoder`` and ``encode``; rows
  # of ``data.pair_kind='packed_documents'`` are refused for a kind without it, and for an
  # attention kind without a ``packed_rows`` attribute (``validation``).
  packed_rows: bool = False
  # ``config.model`` values the kind is defined by (ModernBERT: pre_norm=True, ...): any
  # other is refused by ``models.registry.make_config``, naming the key; an import from
  # Hugging Face sets them (``interop``), so its table need not import the kind's module.
  requires: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

  def pretraining_flops(self, c: EncoderConfig, seq_len: int, predictions: int,
                        gathered: int = 0) -> float:
    """Training FLOPs of the encoder for one sequence whose losses read ``predictions``
    masked positions and ``gathered`` other rows (the last layer skips the rest)."""
    flops = self.flops_per_token(c, seq_len) * seq_len
    if self.last_layer_rows is not None:
      rows = self.last_layer_rows(c, predictions, gathered)
      if rows < seq_len:
        flops -= (seq_len - rows) * self.row_flops(c, seq_len)
    return float(flops)

  def init_inputs(self, batch_size: int = 2, seq_len: int = 8, max_predictions: int = 2):
    """Dummy inputs of the right shapes and dtypes, for init and ``jax.eval_shape``."""
    ids = jnp.zeros((batch_size, seq_len), jnp.int32)
    return dict(input_ids_BxL=ids, segment_ids_BxL=ids, input_mask_BxL=jnp.ones_like(ids),
                masked_positions_BxP=jnp.zeros((batch_size, max_predictions), jnp.int32))
