"""ModernBERT (Warner et al. 2024): the BERT trunk with its modern block options.

No network code of its own: every part is a declared option of the shared trunk
(``models.config.BLOCK_OPTIONS``, implemented once in ``trunk`` / ``attention``), which this
kind requires as ModernBERT has them (``_check``), so that a ``modernbert`` config is always
what Hugging Face's ``ModernBertForMaskedLM`` computes (``interop.hf_modernbert``;
``configs/modernbert_base.py`` sets them from :data:`PUBLISHED`):

* embeddings: the token table, LayerNorm, dropout; no positions, no segments
  (``rotary=True``, ``type_vocab_size=0``); or ``type_vocab_size=1``: one learned row added
  to every token's embedding before the LayerNorm (a shared offset, as RoBERTa's single
  token type; segment ids are not read). Hugging Face computes it with the offset folded
  into its token table and the MLM decoder untied (the table without the offset), so it
  exports (``interop.hf_modernbert``); the small-budget recipe trains with it;
* pre-LN blocks with a final LayerNorm, the first layer's attention without its LayerNorm
  (``pre_norm=True``, ``first_attention_norm=False``);
* one fused query/key/value projection (``fused_qkv=True``), rotary positions with a base
  for the global layers (``rope_theta``, 160,000) and one for the local ones
  (``local_rope_theta``, 10,000); every ``global_attn_every_n_layers``-th layer global, the
  others a sliding window of ``local_attention`` tokens (half either side), computed band by
  band;
* GeGLU feed-forward (``gated_ffn=True``); dense layers and LayerNorms with or without
  biases (``dense_bias``, ``norm_bias``: False in the released models);
* MLM head: dense, activation, LayerNorm, decoder tied to the token table with its bias;
  only at the masked positions (HF's ``sparse_prediction``). No pooler and no pair head:
  fine-tuning reads ``cls`` or ``mean`` pooling (``finetune`` ``config.pooling``, as HF's
  ``classifier_pooling``).

The recipe (30% masking, warmup-stable-decay, 1,024 tokens then 8,192) is
``configs/modernbert_base.py``.
"""

from __future__ import annotations

from encoder_jax.models import config as config_lib
from encoder_jax.models import trunk

# The trunk options that make the trunk ModernBERT's (``ModelKind.requires``: refused
# otherwise; set on import from Hugging Face).
REQUIRED = dict(pre_norm=True, gated_ffn=True, rotary=True, fused_qkv=True,
                first_attention_norm=False, position_offset=0, share_layers='none',
                attention_kind='dot_product')
# type_vocab_size: 0 (ModernBERT's) or 1 (a shared embedding offset; see the docstring).
TOKEN_TYPES = (0, 1)
# The released models' settings (answerdotai/ModernBERT-base's config.json), without the
# shape: ``config.model`` fields for configs, the bake-off row and the benchmarks.
PUBLISHED = dict(REQUIRED, kind='modernbert', type_vocab_size=0, rope_theta=160_000.0,
                 local_rope_theta=10_000.0, local_attention=128, global_attn_every_n_layers=3,
                 dense_bias=False,
                 norm_bias=False, layer_norm_eps=1e-5, hidden_dropout_rate=0.0,
                 attention_dropout_rate=0.0)


def ModernBertForMaskedLM(  # pylint: disable=invalid-name
    config: config_lib.EncoderConfig) -> trunk.EncoderWithHeads:
  return trunk.EncoderWithHeads(config, pooler=False, pair_head=False)


def ModernBertModel(config: config_lib.EncoderConfig) -> trunk.EncoderOnly:  # pylint: disable=invalid-name
  return trunk.EncoderOnly(config, pooler=False)


def _check(c: config_lib.EncoderConfig) -> None:
  if c.type_vocab_size not in TOKEN_TYPES:
    raise ValueError(f'config.model.kind=modernbert has no segments: type_vocab_size='
                     f'{c.type_vocab_size}; expected 0 (ModernBERT) or 1 (a shared embedding '
                     'offset)')
  if c.embedding_size not in (0, c.hidden_size):
    raise ValueError('config.model.kind=modernbert has no factorized embedding '
                     f'(embedding_size={c.embedding_size})')


KIND = config_lib.ModelKind(
    name='modernbert', pretraining=ModernBertForMaskedLM, encoder=ModernBertModel,
    encode=trunk.encode, pooler=False, pair_head=False, check=_check,
    last_layer_rows=trunk.rows_without_cls, block_options=config_lib.BLOCK_OPTION_NAMES,
    packed_rows=True,
    requires=REQUIRED,
    description='ModernBERT: pre-LN, GeGLU, rotary, alternating local/global attention, MLM head')
