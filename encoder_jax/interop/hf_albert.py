"""The table between our ALBERT parameters and Hugging Face ``AlbertForPreTraining``'s.

Hugging Face keeps the one shared layer at ``albert.encoder.albert_layer_groups.0.
albert_layers.0`` (``num_hidden_groups = inner_group_num = 1``: all layers share it, our
``share_layers='all'``, whose parameters have no layer axis). The embedding projection is
``albert.encoder.embedding_hidden_mapping_in``; the MLM head ``predictions`` (dense
hidden -> E, LayerNorm, decoder tied to the word embedding, bias); the SOP head
``sop_classifier.classifier``; the pooler ``albert.pooler`` (a Linear, tanh applied).
"""

from __future__ import annotations

from encoder_jax.interop import hf_bert
from encoder_jax.interop import hf_table as T

ENCODER, POOLER, MLM_HEAD, PAIR_HEAD = 'encoder', 'pooler', 'mlm_head', 'pair_head'
GROUPS = (ENCODER, POOLER, MLM_HEAD, PAIR_HEAD)
_LAYER = 'albert.encoder.albert_layer_groups.0.albert_layers.0.'


def _layer(ours: str, hf: str, transform: T.Transform) -> T.Entry:
  return T.Entry('encoder/layers/' + ours, _LAYER + hf, transform, ENCODER)


def _embedding(ours: str, hf: str) -> T.Entry:
  return T.Entry('embeddings/' + ours, 'albert.embeddings.' + hf, T.IDENTITY, ENCODER)


PARAMS: tuple[T.Entry, ...] = (
    _embedding('word_embeddings/embedding', 'word_embeddings.weight'),
    _embedding('position_embeddings/embedding', 'position_embeddings.weight'),
    _embedding('token_type_embeddings/embedding', 'token_type_embeddings.weight'),
    _embedding('layer_norm/scale', 'LayerNorm.weight'),
    _embedding('layer_norm/bias', 'LayerNorm.bias'),
    T.Entry('embeddings/projection/kernel', 'albert.encoder.embedding_hidden_mapping_in.weight',
            T.LINEAR, ENCODER),
    T.Entry('embeddings/projection/bias', 'albert.encoder.embedding_hidden_mapping_in.bias',
            T.IDENTITY, ENCODER),
    _layer('query/kernel', 'attention.query.weight', T.QKV_KERNEL),
    _layer('query/bias', 'attention.query.bias', T.QKV_BIAS),
    _layer('key/kernel', 'attention.key.weight', T.QKV_KERNEL),
    _layer('key/bias', 'attention.key.bias', T.QKV_BIAS),
    _layer('value/kernel', 'attention.value.weight', T.QKV_KERNEL),
    _layer('value/bias', 'attention.value.bias', T.QKV_BIAS),
    _layer('attention_output/kernel', 'attention.dense.weight', T.ATTENTION_OUT_KERNEL),
    _layer('attention_output/bias', 'attention.dense.bias', T.IDENTITY),
    _layer('attention_layer_norm/scale', 'attention.LayerNorm.weight', T.IDENTITY),
    _layer('attention_layer_norm/bias', 'attention.LayerNorm.bias', T.IDENTITY),
    _layer('intermediate/kernel', 'ffn.weight', T.LINEAR),
    _layer('intermediate/bias', 'ffn.bias', T.IDENTITY),
    _layer('output/kernel', 'ffn_output.weight', T.LINEAR),
    _layer('output/bias', 'ffn_output.bias', T.IDENTITY),
    _layer('output_layer_norm/scale', 'full_layer_layer_norm.weight', T.IDENTITY),
    _layer('output_layer_norm/bias', 'full_layer_layer_norm.bias', T.IDENTITY),
    T.Entry('pooler/kernel', 'albert.pooler.weight', T.LINEAR, POOLER),
    T.Entry('pooler/bias', 'albert.pooler.bias', T.IDENTITY, POOLER),
    T.Entry('mlm_head/transform/kernel', 'predictions.dense.weight', T.LINEAR, MLM_HEAD),
    T.Entry('mlm_head/transform/bias', 'predictions.dense.bias', T.IDENTITY, MLM_HEAD),
    T.Entry('mlm_head/layer_norm/scale', 'predictions.LayerNorm.weight', T.IDENTITY, MLM_HEAD),
    T.Entry('mlm_head/layer_norm/bias', 'predictions.LayerNorm.bias', T.IDENTITY, MLM_HEAD),
    T.Entry('mlm_head/output_bias', 'predictions.bias', T.IDENTITY, MLM_HEAD),
    T.Entry('pair_head/kernel', 'sop_classifier.classifier.weight', T.LINEAR, PAIR_HEAD),
    T.Entry('pair_head/bias', 'sop_classifier.classifier.bias', T.IDENTITY, PAIR_HEAD),
)
TIED = {
    'predictions.decoder.weight': 'albert.embeddings.word_embeddings.weight',
    'predictions.decoder.bias': 'predictions.bias',
}
BUFFERS = ('albert.embeddings.position_ids', 'albert.embeddings.token_type_ids')

# BERT's fields plus the factorized embedding width.
CONFIG_FIELDS: tuple[tuple[str, str], ...] = hf_bert.CONFIG_FIELDS + (
    ('embedding_size', 'embedding_size'),)
# One group of one layer shared by all layers; absolute positions.
REQUIRED_HF_VALUES = {'num_hidden_groups': 1, 'inner_group_num': 1,
                      'position_embedding_type': 'absolute'}


def _check_exportable(c) -> None:
  if c.embedding_width == c.hidden_size:
    # HF's AlbertTransformer applies embedding_hidden_mapping_in whatever the widths; ours
    # (as the original ALBERT code) projects only when they differ.
    raise ValueError(f'config.model.embedding_size={c.embedding_size} gives embeddings as wide as '
                     f'hidden_size={c.hidden_size}: Hugging Face ALBERT would still apply its '
                     'embedding_hidden_mapping_in projection, which our ALBERT does not have; '
                     'expected embedding_size != hidden_size (ALBERT: 128)')
  if c.share_layers != 'all':
    raise ValueError(f"config.model.share_layers={c.share_layers!r} has no Hugging Face ALBERT "
                     "equivalent; expected 'all' (one layer group shared by every layer)")
  if c.attention_kind != 'dot_product':
    raise ValueError(f"config.model.attention_kind={c.attention_kind!r} has no Hugging Face "
                     "ALBERT equivalent; expected 'dot_product'")


SPEC = T.HfSpec(
    kind='albert', model_type='albert',
    architectures=('AlbertForPreTraining', 'AlbertForMaskedLM', 'AlbertModel'),
    params=PARAMS, groups=GROUPS, config_fields=CONFIG_FIELDS,
    required_hf_values=REQUIRED_HF_VALUES, base_prefix='albert.',
    base_parts=('embeddings', 'encoder', 'pooler'), layer_prefix=_LAYER,
    tied=TIED, buffers=BUFFERS, check_exportable=_check_exportable,
    config_from_hf=lambda hf: {'share_layers': 'all'},
    config_to_hf=lambda c, pad: {'pad_token_id': pad, 'tie_word_embeddings': True,
                                 'classifier_dropout_prob': 0.1})
