"""The table between our BERT parameters and Hugging Face ``BertForPreTraining``'s.

The MLM decoder is tied: HF's ``cls.predictions.decoder.weight`` *is* the word embedding
and ``cls.predictions.decoder.bias`` *is* ``cls.predictions.bias`` (``save_pretrained``
writes neither; neither do we).
"""

from __future__ import annotations

from encoder_jax.interop import hf_table as T

# Parameter groups. 'encoder' must be present in every checkpoint we import; the
# others are heads that a BertModel / BertForMaskedLM checkpoint may lack (then they
# keep their fresh initialisation, and the import report says so).
ENCODER, POOLER, MLM_HEAD, PAIR_HEAD = 'encoder', 'pooler', 'mlm_head', 'pair_head'
GROUPS = (ENCODER, POOLER, MLM_HEAD, PAIR_HEAD)


def _layer(ours: str, hf: str, transform: T.Transform) -> T.Entry:
  return T.Entry('encoder/layers/' + ours, 'bert.encoder.layer.{i}.' + hf, transform, ENCODER)


PARAMS: tuple[T.Entry, ...] = (
    T.Entry('embeddings/word_embeddings/embedding', 'bert.embeddings.word_embeddings.weight',
          T.IDENTITY, ENCODER),
    T.Entry('embeddings/position_embeddings/embedding',
          'bert.embeddings.position_embeddings.weight', T.IDENTITY, ENCODER),
    T.Entry('embeddings/token_type_embeddings/embedding',
          'bert.embeddings.token_type_embeddings.weight', T.IDENTITY, ENCODER),
    T.Entry('embeddings/layer_norm/scale', 'bert.embeddings.LayerNorm.weight', T.IDENTITY, ENCODER),
    T.Entry('embeddings/layer_norm/bias', 'bert.embeddings.LayerNorm.bias', T.IDENTITY, ENCODER),
    _layer('query/kernel', 'attention.self.query.weight', T.QKV_KERNEL),
    _layer('query/bias', 'attention.self.query.bias', T.QKV_BIAS),
    _layer('key/kernel', 'attention.self.key.weight', T.QKV_KERNEL),
    _layer('key/bias', 'attention.self.key.bias', T.QKV_BIAS),
    _layer('value/kernel', 'attention.self.value.weight', T.QKV_KERNEL),
    _layer('value/bias', 'attention.self.value.bias', T.QKV_BIAS),
    _layer('attention_output/kernel', 'attention.output.dense.weight', T.ATTENTION_OUT_KERNEL),
    _layer('attention_output/bias', 'attention.output.dense.bias', T.IDENTITY),
    _layer('attention_layer_norm/scale', 'attention.output.LayerNorm.weight', T.IDENTITY),
    _layer('attention_layer_norm/bias', 'attention.output.LayerNorm.bias', T.IDENTITY),
    _layer('intermediate/kernel', 'intermediate.dense.weight', T.LINEAR),
    _layer('intermediate/bias', 'intermediate.dense.bias', T.IDENTITY),
    _layer('output/kernel', 'output.dense.weight', T.LINEAR),
    _layer('output/bias', 'output.dense.bias', T.IDENTITY),
    _layer('output_layer_norm/scale', 'output.LayerNorm.weight', T.IDENTITY),
    _layer('output_layer_norm/bias', 'output.LayerNorm.bias', T.IDENTITY),
    T.Entry('pooler/kernel', 'bert.pooler.dense.weight', T.LINEAR, POOLER),
    T.Entry('pooler/bias', 'bert.pooler.dense.bias', T.IDENTITY, POOLER),
    T.Entry('mlm_head/transform/kernel', 'cls.predictions.transform.dense.weight', T.LINEAR,
          MLM_HEAD),
    T.Entry('mlm_head/transform/bias', 'cls.predictions.transform.dense.bias', T.IDENTITY, MLM_HEAD),
    T.Entry('mlm_head/layer_norm/scale', 'cls.predictions.transform.LayerNorm.weight', T.IDENTITY,
          MLM_HEAD),
    T.Entry('mlm_head/layer_norm/bias', 'cls.predictions.transform.LayerNorm.bias', T.IDENTITY,
          MLM_HEAD),
    T.Entry('mlm_head/output_bias', 'cls.predictions.bias', T.IDENTITY, MLM_HEAD),
    T.Entry('pair_head/kernel', 'cls.seq_relationship.weight', T.LINEAR, PAIR_HEAD),
    T.Entry('pair_head/bias', 'cls.seq_relationship.bias', T.IDENTITY, PAIR_HEAD),
)

# HF keys that are aliases of a tensor in PARAMS (tied, or buffers): never imported.
TIED = {
    'cls.predictions.decoder.weight': 'bert.embeddings.word_embeddings.weight',
    'cls.predictions.decoder.bias': 'cls.predictions.bias',
}
BUFFERS = ('bert.embeddings.position_ids',)

# (our EncoderConfig field, HF BertConfig field). Other fields of ours (attention_kind,
# dtype, remat) have no HF counterpart and keep their defaults on import.
CONFIG_FIELDS: tuple[tuple[str, str], ...] = T.SHAPE_FIELDS + (
    ('max_position_embeddings', 'max_position_embeddings'),
    ('type_vocab_size', 'type_vocab_size'),
    ('hidden_dropout_rate', 'hidden_dropout_prob'),
    ('attention_dropout_rate', 'attention_probs_dropout_prob'),
    ('layer_norm_eps', 'layer_norm_eps'),
    ('initializer_range', 'initializer_range'),
    ('activation', 'hidden_act'),
)
# HF fields whose value must be exactly this for our architecture to compute the same thing
# (a missing field takes HF's default, which is this value).
REQUIRED_HF_VALUES = {'position_embedding_type': 'absolute'}


def _check_exportable(c) -> None:
  if c.attention_kind != 'dot_product':
    raise ValueError(f"config.model.attention_kind={c.attention_kind!r} has no Hugging Face "
                     "BERT equivalent; expected 'dot_product'")


SPEC = T.HfSpec(
    kind='bert', model_type='bert',
    architectures=('BertForPreTraining', 'BertForMaskedLM', 'BertModel'),
    params=PARAMS, groups=GROUPS, config_fields=CONFIG_FIELDS,
    required_hf_values=REQUIRED_HF_VALUES, base_prefix='bert.',
    base_parts=('embeddings', 'encoder', 'pooler'), layer_prefix='bert.encoder.layer.',
    tied=TIED, buffers=BUFFERS, check_exportable=_check_exportable,
    config_to_hf=lambda c, pad: {'pad_token_id': pad, 'tie_word_embeddings': True},
    key_renames=(('LayerNorm.gamma', 'LayerNorm.weight'), ('LayerNorm.beta', 'LayerNorm.bias')))
