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
from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# HF names: 'gelu' is the exact erf GELU (BERT, RoBERTa); 'gelu_new' the tanh
# approximation (ALBERT's released models, GPT-2).
ACTIVATIONS = {
    'gelu': functools.partial(nn.gelu, approximate=False),
    'gelu_new': functools.partial(nn.gelu, approximate=True),
    'relu': nn.relu,
}
SHARE_LAYERS = ('none', 'all', 'attention', 'ffn')


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Shapes and options of a Transformer encoder (BERT-base defaults)."""
  kind: str = 'bert'
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  attention_kind: str = 'dot_product'
  dtype: str = 'float32'
  remat: bool = False
  activation: str = 'gelu'
  embedding_size: int = 0  # 0 = hidden_size; else factorized embeddings (ALBERT, ELECTRA).
  share_layers: str = 'none'  # Cross-layer sharing (ALBERT): none, all, attention, ffn.
  position_offset: int = 0  # First position id (RoBERTa: padding id + 1 = 2).
  attention_implementation: str | None = None  # 'xla', 'cudnn'; None: cuDNN on GPUs.
  mem_len: int = 0  # XLNet: Transformer-XL memory, cached states per layer; 0 = none.
  clamp_len: int = -1  # XLNet: relative distances clipped to +-clamp_len; -1 = no clipping.
  # DeBERTa (models/deberta.py; attention_kind='disentangled'), read by no other kind.
  position_biased_input: bool = True  # Absolute positions added to the input embeddings.
  max_relative_positions: int = -1  # Relative span k; < 1 = max_position_embeddings.
  position_buckets: int = 0  # v2: log-bucketed relative positions (256); 0 = off.
  share_att_key: bool = False  # v2: position projections are the content q/k projections.
  norm_rel_ebd: bool = False  # v2: LayerNorm on the relative embeddings.
  pos_att_type: str = 'c2p|p2c'  # Position terms beside content-to-content.
  emd_layers: int = 0  # Enhanced mask decoder layers (shared with the last layer); 0 = off.

  def __post_init__(self):
    from encoder_jax.models import attention as attention_lib  # pylint: disable=g-import-not-at-top
    from encoder_jax.models import attention_kinds  # pylint: disable=g-import-not-at-top
    for name in ('vocab_size', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
                 'max_position_embeddings'):
      if int(getattr(self, name)) < 1:
        raise ValueError(f'config.model.{name}={getattr(self, name)}; expected >= 1')
    if self.type_vocab_size < 0:
      raise ValueError(f'config.model.type_vocab_size={self.type_vocab_size}; expected >= 0 '
                       '(0 = no segment embeddings, as in the released DeBERTa models)')
    if self.hidden_size % self.num_heads:
      raise ValueError(f'config.model.hidden_size={self.hidden_size} is not divisible by '
                       f'num_heads={self.num_heads}')
    if self.dtype not in DTYPES:
      raise ValueError(f'config.model.dtype={self.dtype!r}; expected one of {sorted(DTYPES)}')
    if self.activation not in ACTIVATIONS:
      raise ValueError(f'config.model.activation={self.activation!r}; expected one of '
                       f'{sorted(ACTIVATIONS)}')
    if self.share_layers not in SHARE_LAYERS:
      raise ValueError(f'config.model.share_layers={self.share_layers!r}; expected one of '
                       f'{list(SHARE_LAYERS)}')
    if self.embedding_size < 0:
      raise ValueError(f'config.model.embedding_size={self.embedding_size}; expected >= 0 '
                       '(0 = hidden_size)')
    if not 0 <= self.position_offset < self.max_position_embeddings:
      raise ValueError(f'config.model.position_offset={self.position_offset}; expected in '
                       f'[0, max_position_embeddings={self.max_position_embeddings})')
    if self.mem_len < 0:
      raise ValueError(f'config.model.mem_len={self.mem_len}; expected >= 0 (0 = no memory)')
    for name in ('hidden_dropout_rate', 'attention_dropout_rate'):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f'config.model.{name}={getattr(self, name)}; expected in [0, 1)')
    attention_kinds.get(self.attention_kind)  # Fails early, listing the valid kinds.
    if self.attention_implementation not in attention_lib.IMPLEMENTATIONS:
      raise ValueError(f'config.model.attention_implementation={self.attention_implementation!r}'
                       f'; expected one of {list(attention_lib.IMPLEMENTATIONS)}')

  @classmethod
  def from_config(cls, model_config: ml_collections.ConfigDict | dict) -> 'EncoderConfig':
    values = dict(model_config.to_dict() if hasattr(model_config, 'to_dict') else model_config)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f'config.model has unknown fields {unknown}; expected {sorted(known)}')
    return cls(**values)

  def replace(self, **kw) -> 'EncoderConfig':
    return dataclasses.replace(self, **kw)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def embedding_width(self) -> int:
    """Width of the token embeddings (and of the tied MLM decoder)."""
    return self.embedding_size or self.hidden_size

  @property
  def max_length(self) -> int:
    """The longest sequence the position table holds (RoBERTa: 514 - 2 = 512)."""
    return self.max_position_embeddings - self.position_offset

  @property
  def jnp_dtype(self):
    return DTYPES[self.dtype]


def encoder_flops_per_token(c: EncoderConfig, seq_len: int) -> float:
  """Training FLOPs (forward + backward = 3x forward) of the encoder for one token.

  ``6*L*(4*d^2 + 2*d*d_ff) + 12*L*s*d``: the q/k/v/output projections and the
  feed-forward block (2 FLOPs per multiply-add, 3 passes), plus the attention scores and
  weighted sum. Sharing layers (ALBERT) saves parameters, not FLOPs; a factorized
  embedding adds its E x d projection.
  """
  L, d, f = c.num_layers, c.hidden_size, c.intermediate_size
  flops = 6 * L * (4 * d * d + 2 * d * f) + 12 * L * seq_len * d
  if c.embedding_width != d:
    flops += 6 * c.embedding_width * d
  return float(flops)


@dataclasses.dataclass(frozen=True)
class ModelKind:
  """One entry of ``models.registry``: how to build and count a kind of encoder.

  ``pretraining(cfg)`` is called as ``(input_ids, segment_ids, input_mask,
  masked_positions=None, *, deterministic, collect_hidden)`` and returns a dict with
  ``sequence_output`` [B, L, H], ``mlm_logits`` [B, P, V] (float32, only at
  ``masked_positions``), ``pooled_output`` / ``pair_logits`` when the kind has a pooler /
  pair head, and ``all_hidden_states`` when ``collect_hidden``. ``encoder(cfg)`` is the
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

  def init_inputs(self, batch_size: int = 2, seq_len: int = 8, max_predictions: int = 2):
    """Dummy inputs of the right shapes and dtypes, for init and ``jax.eval_shape``."""
    ids = jnp.zeros((batch_size, seq_len), jnp.int32)
    return dict(input_ids_BxL=ids, segment_ids_BxL=ids, input_mask_BxL=jnp.ones_like(ids),
                masked_positions_BxP=jnp.zeros((batch_size, max_predictions), jnp.int32))
