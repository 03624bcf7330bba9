"""The table between our XLNet parameters and Hugging Face ``XLNetLMHeadModel``'s.

The trunk is ``transformer.``: ``word_embedding``, ``mask_emb`` [1, 1, d] (ours [d]) and per
layer ``rel_attn`` (``q k v o r`` [d, heads, head_dim], the same layout as ours;
``r_w_bias r_r_bias r_s_bias`` [heads, head_dim]; ``seg_embed`` [2, heads, head_dim];
``layer_norm``) and ``ff`` (``layer_1``, ``layer_2``, ``layer_norm``). The LM head is
``lm_loss``: its weight is the word embedding (tied), its bias ours ``lm_bias``.

HF XLNet has one ``dropout`` for everything (ours: hidden and attention rates, both set
from it) and no position table (``max_position_embeddings`` is ours alone: imports get 512,
the released models' training length; exports leave it out, as HF refuses the field).
Our network computes ``attn_type='bi'`` without ``same_length``, and ``bi_data`` is an
argument of the call (the pretraining objective passes it), not a config field: the import
requires HF's ``bi_data`` and ``same_length`` off. Our
``mem_len`` (a memory carried through pretraining) is HF's ``mem_len`` when
``use_mems_train`` is on, else 0; HF's ``reuse_len`` (which part of a row to cache) is not
modelled: our memory caches whole rows.
"""

from __future__ import annotations

from encoder_jax.interop import hf_table as T

ENCODER, MLM_HEAD = 'encoder', 'mlm_head'
GROUPS = (ENCODER, MLM_HEAD)
_LAYER = 'transformer.layer.{i}.'
_OURS = 'encoder/layers/'

MASK_EMB = T.Transform(lambda x, c: x.reshape(c.hidden_size),
                       lambda x, c: x.reshape(1, 1, c.hidden_size))

PARAMS: tuple[T.Entry, ...] = (
    T.Entry('embeddings/word_embeddings/embedding', 'transformer.word_embedding.weight',
            T.IDENTITY, ENCODER),
    T.Entry('mask_emb', 'transformer.mask_emb', MASK_EMB, ENCODER),
    *(T.Entry(_OURS + name, _LAYER + 'rel_attn.' + name, T.IDENTITY, ENCODER)
      for name in ('q', 'k', 'v', 'o', 'r', 'r_w_bias', 'r_r_bias', 'r_s_bias', 'seg_embed')),
    T.Entry(_OURS + 'attention_layer_norm/scale', _LAYER + 'rel_attn.layer_norm.weight',
            T.IDENTITY, ENCODER),
    T.Entry(_OURS + 'attention_layer_norm/bias', _LAYER + 'rel_attn.layer_norm.bias',
            T.IDENTITY, ENCODER),
    T.Entry(_OURS + 'intermediate/kernel', _LAYER + 'ff.layer_1.weight', T.LINEAR, ENCODER),
    T.Entry(_OURS + 'intermediate/bias', _LAYER + 'ff.layer_1.bias', T.IDENTITY, ENCODER),
    T.Entry(_OURS + 'output/kernel', _LAYER + 'ff.layer_2.weight', T.LINEAR, ENCODER),
    T.Entry(_OURS + 'output/bias', _LAYER + 'ff.layer_2.bias', T.IDENTITY, ENCODER),
    T.Entry(_OURS + 'output_layer_norm/scale', _LAYER + 'ff.layer_norm.weight', T.IDENTITY,
            ENCODER),
    T.Entry(_OURS + 'output_layer_norm/bias', _LAYER + 'ff.layer_norm.bias', T.IDENTITY,
            ENCODER),
    T.Entry('lm_bias', 'lm_loss.bias', T.IDENTITY, MLM_HEAD),
)
TIED = {'lm_loss.weight': 'transformer.word_embedding.weight'}

CONFIG_FIELDS: tuple[tuple[str, str], ...] = (
    ('vocab_size', 'vocab_size'),
    ('hidden_size', 'd_model'),
    ('num_layers', 'n_layer'),
    ('num_heads', 'n_head'),
    ('intermediate_size', 'd_inner'),
    ('activation', 'ff_activation'),
    ('layer_norm_eps', 'layer_norm_eps'),
    ('initializer_range', 'initializer_range'),
    ('hidden_dropout_rate', 'dropout'),
)
REQUIRED_HF_VALUES = {'attn_type': 'bi', 'bi_data': False, 'same_length': False}
MAX_LENGTH = 512  # Our position limit for imported models (XLNet's pretraining length).


def _config_from_hf(hf) -> dict:
  # Our mem_len means "carry the memory while pretraining": HF's mem_len with use_mems_train
  # (off by default: HF's default mem_len=512 is then an inference-time cache only).
  mem_len = int(hf.get('mem_len') or 0) if hf.get('use_mems_train', False) else 0
  return {'attention_dropout_rate': hf['dropout'], 'mem_len': mem_len,
          'clamp_len': int(hf.get('clamp_len', -1)), 'max_position_embeddings': MAX_LENGTH}


def _config_to_hf(c, pad_token_id: int) -> dict:
  return {'pad_token_id': pad_token_id, 'mem_len': c.mem_len or None,
          'use_mems_train': c.mem_len > 0, 'clamp_len': c.clamp_len, 'd_head': c.head_dim,
          'tie_word_embeddings': True}


SPEC = T.HfSpec(
    kind='xlnet', model_type='xlnet', architectures=('XLNetLMHeadModel', 'XLNetModel'),
    params=PARAMS, groups=GROUPS, config_fields=CONFIG_FIELDS,
    required_hf_values=REQUIRED_HF_VALUES, base_prefix='transformer.',
    base_parts=('word_embedding', 'mask_emb', 'layer'), layer_prefix='transformer.layer.',
    tied=TIED, config_from_hf=_config_from_hf, config_to_hf=_config_to_hf)
