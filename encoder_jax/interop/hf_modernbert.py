"""The table between our ModernBERT parameters and Hugging Face ``ModernBertForMaskedLM``'s.

The trunk is under ``model.`` (``ModernBertModel`` saves it bare): ``embeddings.tok_embeddings``
and ``embeddings.norm``; per layer ``attn_norm`` (from layer 1: layer 0's is the identity),
the fused ``attn.Wqkv`` [3 * heads * head_dim, hidden] (rows ordered q, k, v, then heads)
and ``attn.Wo``, ``mlp_norm``, the GLU ``mlp.Wi`` [2 * d_ff, hidden] (its first half the
activated input, the second the gate: ``act(input) * gate``) and ``mlp.Wo``; ``final_norm``.
The MLM head is ``head.dense``, ``head.norm`` and ``decoder``, whose weight is the token
table (tied; written by neither side) and whose bias is ours. With ``type_vocab_size=1``
(our shared embedding offset, ``models.modernbert``) the export folds the offset into
``tok_embeddings`` and writes the decoder untied (``decoder.weight``: our token table,
``tie_word_embeddings=False``), which computes the same logits; an untied checkpoint whose
two tables differ by one shared row imports as such (the offset within float32 rounding of
the difference), any other untied one is refused.

Config: the attention, MLP and head biases are one option of ours (``dense_bias``) and the
activations one (``activation``): a checkpoint where they differ is refused. The layer
pattern is read from ``layer_types`` (transformers >= 5) or ``global_attn_every_n_layers``
(the Hub's checkpoints), the RoPE bases from ``rope_parameters`` or ``global_rope_theta`` /
``local_rope_theta``; export writes both spellings. Dropout: HF drops the MLP's hidden
activations (``mlp_dropout``), ours the block's output (``hidden_dropout_rate``, also the
embeddings'); the same computation without dropout (inference, and ModernBERT's recipe).
"""

from __future__ import annotations

import numpy as np

from encoder_jax.interop import hf_table as T
from encoder_jax.models import config as config_lib
from encoder_jax.models import registry as models_registry

ENCODER, MLM_HEAD = 'encoder', 'mlm_head'
GROUPS = (ENCODER, MLM_HEAD)

# Wqkv.weight [3*heads*head_dim, embed] <-> kernel [embed, 3, heads, head_dim].
QKV_FUSED_KERNEL = T.Transform(
    lambda x, c: x.T.reshape(c.hidden_size, 3, c.num_heads, c.head_dim),
    lambda x, c: x.reshape(c.hidden_size, 3 * c.num_heads * c.head_dim).T)
QKV_FUSED_BIAS = T.Transform(lambda x, c: x.reshape(3, c.num_heads, c.head_dim),
                             lambda x, c: x.reshape(3 * c.num_heads * c.head_dim))
# mlp.Wi.weight [2*d_ff, embed] (input, gate) <-> kernel [embed, 2, d_ff] (value, gate).
GLU_KERNEL = T.Transform(lambda x, c: x.T.reshape(c.hidden_size, 2, c.intermediate_size),
                         lambda x, c: x.reshape(c.hidden_size, 2 * c.intermediate_size).T)
GLU_BIAS = T.Transform(lambda x, c: x.reshape(2, c.intermediate_size),
                       lambda x, c: x.reshape(2 * c.intermediate_size))

_bias = lambda c: c.dense_bias
_norm_bias = lambda c: c.norm_bias
_after_first = lambda c: 0 if c.first_attention_norm else 1


def _layer(ours, hf, transform, when=None, **kw) -> T.Entry:
  return T.Entry('encoder/layers/' + ours, 'model.layers.{i}.' + hf, transform, ENCODER,
                 when=when, **kw)


TOKENS = 'model.embeddings.tok_embeddings.weight'
# Our shared embedding offset [1, hidden] (type_vocab_size=1): no HF tensor of its own, it is
# folded into TOKENS on export and taken out of it on import (_fold, _unfold).
OFFSET = 'model.embeddings.token_offset'
_offset = lambda c: c.type_vocab_size == 1

PARAMS: tuple[T.Entry, ...] = (
    T.Entry('embeddings/word_embeddings/embedding', TOKENS, T.IDENTITY, ENCODER),
    T.Entry('embeddings/token_type_embeddings/embedding', OFFSET, T.IDENTITY, ENCODER,
            when=_offset),
    T.Entry('embeddings/layer_norm/scale', 'model.embeddings.norm.weight', T.IDENTITY, ENCODER),
    T.Entry('embeddings/layer_norm/bias', 'model.embeddings.norm.bias', T.IDENTITY, ENCODER,
            when=_norm_bias),
    _layer('attention_layer_norm/scale', 'attn_norm.weight', T.IDENTITY,
           first_layer=_after_first),
    _layer('attention_layer_norm/bias', 'attn_norm.bias', T.IDENTITY, _norm_bias,
           first_layer=_after_first, unused_value=0.0),
    _layer('qkv/kernel', 'attn.Wqkv.weight', QKV_FUSED_KERNEL),
    _layer('qkv/bias', 'attn.Wqkv.bias', QKV_FUSED_BIAS, _bias),
    _layer('attention_output/kernel', 'attn.Wo.weight', T.ATTENTION_OUT_KERNEL),
    _layer('attention_output/bias', 'attn.Wo.bias', T.IDENTITY, _bias),
    _layer('output_layer_norm/scale', 'mlp_norm.weight', T.IDENTITY),
    _layer('output_layer_norm/bias', 'mlp_norm.bias', T.IDENTITY, _norm_bias),
    _layer('intermediate/kernel', 'mlp.Wi.weight', GLU_KERNEL),
    _layer('intermediate/bias', 'mlp.Wi.bias', GLU_BIAS, _bias),
    _layer('output/kernel', 'mlp.Wo.weight', T.LINEAR),
    _layer('output/bias', 'mlp.Wo.bias', T.IDENTITY, _bias),
    T.Entry('encoder/final_layer_norm/scale', 'model.final_norm.weight', T.IDENTITY, ENCODER),
    T.Entry('encoder/final_layer_norm/bias', 'model.final_norm.bias', T.IDENTITY, ENCODER,
            when=_norm_bias),
    T.Entry('mlm_head/transform/kernel', 'head.dense.weight', T.LINEAR, MLM_HEAD),
    T.Entry('mlm_head/transform/bias', 'head.dense.bias', T.IDENTITY, MLM_HEAD, when=_bias),
    T.Entry('mlm_head/layer_norm/scale', 'head.norm.weight', T.IDENTITY, MLM_HEAD),
    T.Entry('mlm_head/layer_norm/bias', 'head.norm.bias', T.IDENTITY, MLM_HEAD,
            when=_norm_bias),
    T.Entry('mlm_head/output_bias', 'decoder.bias', T.IDENTITY, MLM_HEAD),
)
TIED = {'decoder.weight': TOKENS}

CONFIG_FIELDS: tuple[tuple[str, str], ...] = T.SHAPE_FIELDS
# ModernBertConfig's defaults of the fields read in _config_from_hf (a config.json may
# leave a default out).
DEFAULTS = dict(max_position_embeddings=8192, initializer_range=0.02, norm_eps=1e-5,
                norm_bias=False, hidden_activation='gelu', local_attention=128,
                global_attn_every_n_layers=3, global_rope_theta=160000.0,
                local_rope_theta=10000.0, embedding_dropout=0.0, attention_dropout=0.0)
_BIASES = ('attention_bias', 'mlp_bias', 'classifier_bias')
GLOBAL, LOCAL = 'full_attention', 'sliding_attention'


def layer_types(c) -> list[str]:
  return [GLOBAL if c.layer_is_global(i) else LOCAL for i in range(c.num_layers)]


def _every_n(hf) -> int:
  """``global_attn_every_n_layers``, or the period of ``layer_types`` (a global layer every
  n-th from layer 0 is the only pattern ours computes: checked against ``layer_types``)."""
  if hf.get('global_attn_every_n_layers') is not None:
    return int(hf['global_attn_every_n_layers'])
  types = hf.get('layer_types')
  if not types:
    return DEFAULTS['global_attn_every_n_layers']
  globals_ = [i for i, t in enumerate(types) if t == GLOBAL]
  return globals_[1] if len(globals_) > 1 else len(types)


def _rope_theta(hf, layer_type: str, legacy: str) -> float:
  params = (hf.get('rope_parameters') or {}).get(layer_type) or {}
  if params.get('rope_type', 'default') != 'default' or hf.get('rope_scaling'):
    raise ValueError(f'rope_parameters[{layer_type!r}]={params} / rope_scaling='
                     f"{hf.get('rope_scaling')}: only the default RoPE is supported")
  return float(params.get('rope_theta') or hf.get(legacy) or DEFAULTS[legacy])


def _config_from_hf(hf) -> dict:
  g = lambda k: hf.get(k, DEFAULTS.get(k))
  biases = {k: bool(hf.get(k, False)) for k in _BIASES}
  if len(set(biases.values())) > 1:
    raise ValueError(f'{biases}: encoder_jax has one bias option for every dense layer '
                     '(config.model.dense_bias); expected them equal')
  activation = g('hidden_activation')
  if hf.get('classifier_activation', activation) != activation:
    raise ValueError(f"classifier_activation={hf['classifier_activation']!r} differs from "
                     f'hidden_activation={activation!r}; encoder_jax uses one activation '
                     '(config.model.activation) for both')
  if not hf.get('decoder_bias', True):
    raise ValueError('decoder_bias=False is not supported (our MLM decoder has a bias)')
  fields = dict(
      models_registry.get('modernbert').requires,
      # Untied: the token table is the decoder's plus a shared offset (checked on the weights).
      type_vocab_size=0 if hf.get('tie_word_embeddings', True) else 1,
      max_position_embeddings=int(g('max_position_embeddings')),
      initializer_range=float(g('initializer_range')), layer_norm_eps=float(g('norm_eps')),
      norm_bias=bool(g('norm_bias')), dense_bias=biases['attention_bias'], activation=activation,
      hidden_dropout_rate=float(g('embedding_dropout')),
      attention_dropout_rate=float(g('attention_dropout')),
      local_attention=int(g('local_attention')), global_attn_every_n_layers=_every_n(hf),
      rope_theta=_rope_theta(hf, GLOBAL, 'global_rope_theta'),
      local_rope_theta=_rope_theta(hf, LOCAL, 'local_rope_theta'))
  types = hf.get('layer_types')
  if types:
    n = fields['global_attn_every_n_layers']
    expected = [GLOBAL if i % n == 0 or not fields['local_attention'] else LOCAL
                for i in range(len(types))]
    if list(types) != expected:
      raise ValueError(f'layer_types={types}: encoder_jax computes a global layer every n-th '
                       f'from layer 0 (global_attn_every_n_layers={n}: {expected})')
  if fields['global_attn_every_n_layers'] == 1 or not fields['local_attention']:
    # Every layer global: the window and the local RoPE base are read by no layer, and are
    # kept as the config that computes this writes them (no window, one base), so that
    # configs/crammed_small.py's network imports back to the same config.
    fields.update(global_attn_every_n_layers=1, local_attention=0, local_rope_theta=0.0)
  return fields


def _config_to_hf(c, pad_token_id: int) -> dict:
  theta = {GLOBAL: c.rope_theta, LOCAL: c.local_theta}
  return dict(
      max_position_embeddings=c.max_position_embeddings,
      initializer_range=c.initializer_range, norm_eps=c.layer_norm_eps, norm_bias=c.norm_bias,
      **{k: c.dense_bias for k in _BIASES}, hidden_activation=c.activation,
      classifier_activation=c.activation, embedding_dropout=c.hidden_dropout_rate,
      mlp_dropout=c.hidden_dropout_rate, attention_dropout=c.attention_dropout_rate,
      local_attention=c.local_attention,
      global_attn_every_n_layers=c.global_attn_every_n_layers, layer_types=layer_types(c),
      global_rope_theta=theta[GLOBAL], local_rope_theta=theta[LOCAL],
      rope_parameters={t: {'rope_type': 'default', 'rope_theta': v} for t, v in theta.items()},
      # Only the padding id is known here (it is the embedding's padding_idx in HF); the
      # others are left unset rather than ModernBERT's vocabulary's.
      pad_token_id=pad_token_id, bos_token_id=None, eos_token_id=None, cls_token_id=None,
      sep_token_id=None, tie_word_embeddings=not _offset(c), decoder_bias=True)


def _fold(state: dict, c) -> dict:
  """Export: our offset added to every row of the token table; the decoder, untied, is the
  table without it (so the logits are ours)."""
  if not _offset(c):
    return state
  state = dict(state)
  offset = state.pop(OFFSET)
  state['decoder.weight'] = state[TOKENS]
  state[TOKENS] = state[TOKENS] + offset
  return state


def _unfold(state: dict, c) -> dict:
  """Import of an untied checkpoint: the decoder's table is our token table, and the
  difference to the embedding's, one row shared by every token, our offset."""
  if not _offset(c):
    return state
  if 'decoder.weight' not in state or TOKENS not in state:
    raise ValueError(f'tie_word_embeddings=False: expected both {TOKENS} and decoder.weight')
  state = dict(state)
  table = state.pop('decoder.weight')
  difference = state[TOKENS].astype(np.float64) - table
  offset = difference.mean(axis=0, keepdims=True)
  scale = float(np.abs(state[TOKENS]).max()) or 1.0
  if float(np.abs(difference - offset).max()) > 1e-6 * scale:
    raise ValueError('tie_word_embeddings=False with a decoder that is not the token table '
                     'less one row shared by every token: encoder_jax ties its MLM decoder to '
                     'the token table (type_vocab_size=1 adds a shared offset, no more)')
  state[TOKENS], state[OFFSET] = table, offset.astype(np.float32)
  return state


def _check_exportable(c) -> None:
  models_registry.make_config(c)  # The kind's requires and checks (ModernBERT's network).


SPEC = T.HfSpec(
    kind='modernbert', model_type='modernbert',
    architectures=('ModernBertForMaskedLM', 'ModernBertModel'),
    params=PARAMS, groups=GROUPS, config_fields=CONFIG_FIELDS, required_hf_values={},
    base_prefix='model.', base_parts=('embeddings', 'layers', 'final_norm'),
    layer_prefix='model.layers.', tied=TIED, config_from_hf=_config_from_hf,
    config_to_hf=_config_to_hf, check_exportable=_check_exportable, state_from_hf=_unfold,
    state_to_hf=_fold,
    block_options=config_lib.BLOCK_OPTION_NAMES,  # The kind's requires pin them.
    example_config='configs/crammed_small.py')
