"""BERT (Devlin et al. 2018) as pure-functional Flax Linen modules.

Faithful to the original: token + learned absolute position + segment embeddings,
LayerNorm(eps 1e-12), post-LN blocks, exact-erf GELU, dropout, tanh pooler on [CLS],
MLM head (dense + GELU + LayerNorm, decoder tied to the token embedding, output bias)
and the two-way pair head (NSP/SOP) on the pooled output. Parameter counts equal
Hugging Face's ``BertForPreTraining`` (BERT-base: 110,106,428).

The layers are stacked with ``nn.scan`` (one compiled layer body, a leading 'layers'
axis on every layer parameter), which keeps compile time flat in depth.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from encoder_jax.models import attention as attention_lib
from encoder_jax.models import layers

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class BertConfig:
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

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(f'config.model.hidden_size={self.hidden_size} is not divisible by '
                       f'num_heads={self.num_heads}')
    if self.dtype not in DTYPES:
      raise ValueError(f'config.model.dtype={self.dtype!r}; expected one of {sorted(DTYPES)}')
    attention_lib.get(self.attention_kind)  # Fails early, listing the valid kinds.

  @classmethod
  def from_config(cls, model_config: ml_collections.ConfigDict) -> 'BertConfig':
    return cls(**model_config.to_dict())

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def jnp_dtype(self):
    return DTYPES[self.dtype]


class Embeddings(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, deterministic: bool):
    c = self.config
    emb = lambda n, v, axes: layers.Embed(v, c.hidden_size, axes, c.initializer_range,
                                          c.jnp_dtype, name=n)
    word = emb('word_embeddings', c.vocab_size, ('vocab', 'embed'))
    length = input_ids_BxL.shape[1]
    if length > c.max_position_embeddings:
      raise ValueError(f'Sequence length {length} exceeds config.model.max_position_embeddings='
                       f'{c.max_position_embeddings}')
    position = emb('position_embeddings', c.max_position_embeddings, ('length', 'embed'))
    segment = emb('token_type_embeddings', c.type_vocab_size, (None, 'embed'))
    x_BxLxE = (word(input_ids_BxL) + position(jnp.arange(length))[None]
               + segment(segment_ids_BxL))
    x_BxLxE = layers.LayerNorm(c.layer_norm_eps, c.jnp_dtype, name='layer_norm')(x_BxLxE)
    x_BxLxE = nn.Dropout(c.hidden_dropout_rate)(x_BxLxE, deterministic=deterministic)
    return x_BxLxE, word


class Layer(nn.Module):
  """One post-LN transformer block; the ``nn.scan`` body (carry in, carry out)."""
  config: BertConfig
  deterministic: bool
  collect_hidden: bool = False  # Also emit each layer's output (stacked by the scan).

  @nn.compact
  def __call__(self, x_BxLxE, mask_Bx1x1xL):
    c, dt = self.config, self.config.jnp_dtype
    h, d, e = c.num_heads, c.head_dim, c.hidden_size
    qkv = lambda n: layers.Dense((e,), (h, d), ('embed',), ('heads', 'kv'),
                                 c.initializer_range, dt, name=n)
    q_BxLxHxD, k_BxLxHxD, v_BxLxHxD = (qkv(n)(x_BxLxE) for n in ('query', 'key', 'value'))
    use_dropout = not self.deterministic and c.attention_dropout_rate > 0
    attend = attention_lib.get(c.attention_kind)
    a_BxLxHxD = attend(q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, mask_Bx1x1xL,
                       dropout_rate=c.attention_dropout_rate if use_dropout else 0.0,
                       dropout_rng=self.make_rng('dropout') if use_dropout else None)
    a_BxLxE = layers.Dense((h, d), (e,), ('heads', 'kv'), ('embed',), c.initializer_range, dt,
                           name='attention_output')(a_BxLxHxD)
    a_BxLxE = nn.Dropout(c.hidden_dropout_rate)(a_BxLxE, deterministic=self.deterministic)
    x_BxLxE = layers.LayerNorm(c.layer_norm_eps, dt, name='attention_layer_norm')(x_BxLxE + a_BxLxE)
    f_BxLxF = layers.Dense((e,), (c.intermediate_size,), ('embed',), ('mlp',),
                           c.initializer_range, dt, name='intermediate')(x_BxLxE)
    f_BxLxF = nn.gelu(f_BxLxF, approximate=False)
    f_BxLxE = layers.Dense((c.intermediate_size,), (e,), ('mlp',), ('embed',),
                           c.initializer_range, dt, name='output')(f_BxLxF)
    f_BxLxE = nn.Dropout(c.hidden_dropout_rate)(f_BxLxE, deterministic=self.deterministic)
    x_BxLxE = layers.LayerNorm(c.layer_norm_eps, dt, name='output_layer_norm')(x_BxLxE + f_BxLxE)
    return x_BxLxE, (x_BxLxE if self.collect_hidden else None)


class Encoder(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x_BxLxE, input_mask_BxL, deterministic: bool, collect_hidden: bool = False):
    c = self.config
    mask_Bx1x1xL = input_mask_BxL.astype(bool)[:, None, None, :]
    body = nn.remat(Layer, prevent_cse=False) if c.remat else Layer
    stack = nn.scan(body, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
                    in_axes=nn.broadcast, length=c.num_layers,
                    metadata_params={nn.PARTITION_NAME: 'layers'})
    x_BxLxE, all_NxBxLxE = stack(c, deterministic, collect_hidden, name='layers')(x_BxLxE,
                                                                             mask_Bx1x1xL)
    return x_BxLxE, all_NxBxLxE


def encode(c: BertConfig, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
           deterministic: bool, pool: bool = True, collect_hidden: bool = False
           ) -> dict[str, Any]:
  """Embeddings -> encoder [-> tanh pooler on [CLS]], inside the calling compact module.

  The submodules are named 'embeddings', 'encoder' and 'pooler' in whatever module calls
  this, so every model built on it (pretraining, encoder-only, fine-tuning heads) shares
  one parameter layout and loads the same checkpoints.
  """
  embedded_BxLxE, word_embed = Embeddings(c, name='embeddings')(
      input_ids_BxL, segment_ids_BxL, deterministic)
  x_BxLxE, all_NxBxLxE = Encoder(c, name='encoder')(embedded_BxLxE, input_mask_BxL,
                                                    deterministic, collect_hidden)
  out = {'sequence_output': x_BxLxE, 'word_embed': word_embed}
  if pool:
    out['pooled_output'] = jnp.tanh(layers.Dense(
        (c.hidden_size,), (c.hidden_size,), ('embed',), ('embed',), c.initializer_range,
        c.jnp_dtype, name='pooler')(x_BxLxE[:, 0]))
  if collect_hidden:  # Embedding output, then each layer's output (as Hugging Face).
    out['all_hidden_states'] = (embedded_BxLxE, *all_NxBxLxE)
  return out


class BertModel(nn.Module):
  """The encoder alone (embeddings, layers, pooler): sentence embeddings and features."""
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
               deterministic: bool = True, collect_hidden: bool = False) -> dict[str, Any]:
    out = encode(self.config, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                 deterministic=deterministic, collect_hidden=collect_hidden)
    del out['word_embed']
    return out


class BertForPreTraining(nn.Module):
  """Encoder + pooler + MLM head + pair (NSP/SOP) head.

  ``masked_positions_BxP`` selects where the MLM head runs: vocabulary logits are computed
  only there (the head is the most expensive part of a small model at full length).
  """
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, masked_positions_BxP=None,
               *, deterministic: bool = True, collect_hidden: bool = False) -> dict[str, Any]:
    c = self.config
    out = encode(c, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                 deterministic=deterministic, collect_hidden=collect_hidden)
    word_embed = out.pop('word_embed')
    x_BxLxE = out['sequence_output']
    out['pair_logits'] = layers.Dense(
        (c.hidden_size,), (2,), ('embed',), (None,), c.initializer_range, c.jnp_dtype,
        name='pair_head')(out['pooled_output']).astype(jnp.float32)
    if masked_positions_BxP is None:
      masked_positions_BxP = jnp.broadcast_to(jnp.arange(x_BxLxE.shape[1]), input_ids_BxL.shape)
    h_BxPxE = jnp.take_along_axis(x_BxLxE, masked_positions_BxP[..., None], axis=1)
    out['mlm_logits'] = MlmHead(c, name='mlm_head')(h_BxPxE, word_embed)
    return out


class MlmHead(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, h_BxPxE, word_embed: layers.Embed):
    c, dt = self.config, self.config.jnp_dtype
    h_BxPxE = layers.Dense((c.hidden_size,), (c.hidden_size,), ('embed',), ('embed',),
                           c.initializer_range, dt, name='transform')(h_BxPxE)
    h_BxPxE = nn.gelu(h_BxPxE, approximate=False)
    h_BxPxE = layers.LayerNorm(c.layer_norm_eps, dt, name='layer_norm')(h_BxPxE)
    bias_V = layers.param(self, 'output_bias', nn.initializers.zeros, (c.vocab_size,), ('vocab',))
    return word_embed.attend(h_BxPxE).astype(jnp.float32) + bias_V


def init_inputs(batch_size: int = 2, seq_len: int = 8, max_predictions: int = 2):
  """Dummy inputs of the right shapes and dtypes, for init and ``jax.eval_shape``."""
  ids = jnp.zeros((batch_size, seq_len), jnp.int32)
  return dict(input_ids_BxL=ids, segment_ids_BxL=ids, input_mask_BxL=jnp.ones_like(ids),
              masked_positions_BxP=jnp.zeros((batch_size, max_predictions), jnp.int32))
