"""The tables between our ELECTRA networks and Hugging Face's (``model_type='electra'``).

* :data:`DISCRIMINATOR` (kind ``electra``) <-> ``ElectraForPreTraining``: the trunk
  ``electra.`` (BERT's layer names; the embedding LayerNorm at width E) with
  ``electra.embeddings_project`` (E -> hidden) only when ``embedding_size != hidden_size``,
  and the ``discriminator_predictions`` head (dense, activation, dense_prediction -> 1).
  A bare ``ElectraModel`` (fine-tuning's base) imports with the head freshly initialised.
* :data:`GENERATOR` (kind ``electra_generator``) <-> ``ElectraForMaskedLM``: the same trunk,
  ``generator_predictions`` (dense hidden -> E, GELU, LayerNorm) and ``generator_lm_head``
  (E -> vocabulary), whose weight *is* the word embedding (tied: neither side writes it)
  and whose bias is our ``mlm_head/output_bias``.

Both have ``model_type='electra'``; ``config.json``'s first architecture picks the table
(``interop.registry.hf_spec_for_model_type``). HF's ``embedding_size`` is always
written (our ``embedding_size=0`` exports as the hidden size and imports back as 0).
"""

from __future__ import annotations

from encoder_jax.interop import hf_bert
from encoder_jax.interop import hf_table as T

ENCODER, RTD_HEAD, MLM_HEAD = 'encoder', 'rtd_head', 'mlm_head'
_BERT = 'bert.'


def _factorized(c) -> bool:
  return c.embedding_width != c.hidden_size


# The trunk: BERT's embedding and layer entries under 'electra.', plus the projection.
TRUNK: tuple[T.Entry, ...] = tuple(
    T.Entry(e.ours, 'electra.' + e.hf[len(_BERT):], e.transform, ENCODER)
    for e in hf_bert.PARAMS if e.group == hf_bert.ENCODER) + (
    T.Entry('embeddings/projection/kernel', 'electra.embeddings_project.weight', T.LINEAR,
            ENCODER, when=_factorized),
    T.Entry('embeddings/projection/bias', 'electra.embeddings_project.bias', T.IDENTITY,
            ENCODER, when=_factorized),
)

DISCRIMINATOR_HEAD: tuple[T.Entry, ...] = (
    T.Entry('discriminator_predictions/dense/kernel', 'discriminator_predictions.dense.weight',
            T.LINEAR, RTD_HEAD),
    T.Entry('discriminator_predictions/dense/bias', 'discriminator_predictions.dense.bias',
            T.IDENTITY, RTD_HEAD),
    T.Entry('discriminator_predictions/dense_prediction/kernel',
            'discriminator_predictions.dense_prediction.weight', T.LINEAR, RTD_HEAD),
    T.Entry('discriminator_predictions/dense_prediction/bias',
            'discriminator_predictions.dense_prediction.bias', T.IDENTITY, RTD_HEAD),
)

GENERATOR_HEAD: tuple[T.Entry, ...] = (
    T.Entry('mlm_head/transform/kernel', 'generator_predictions.dense.weight', T.LINEAR,
            MLM_HEAD),
    T.Entry('mlm_head/transform/bias', 'generator_predictions.dense.bias', T.IDENTITY, MLM_HEAD),
    T.Entry('mlm_head/layer_norm/scale', 'generator_predictions.LayerNorm.weight', T.IDENTITY,
            MLM_HEAD),
    T.Entry('mlm_head/layer_norm/bias', 'generator_predictions.LayerNorm.bias', T.IDENTITY,
            MLM_HEAD),
    T.Entry('mlm_head/output_bias', 'generator_lm_head.bias', T.IDENTITY, MLM_HEAD),
)

BUFFERS = ('electra.embeddings.position_ids', 'electra.embeddings.token_type_ids')

# BERT's fields plus the factorized embedding width.
CONFIG_FIELDS: tuple[tuple[str, str], ...] = hf_bert.CONFIG_FIELDS + (
    ('embedding_size', 'embedding_size'),)
REQUIRED_HF_VALUES = {'position_embedding_type': 'absolute'}


def _config_from_hf(hf) -> dict:
  """E == hidden is our unfactorized embedding (``embedding_size=0``): no projection."""
  return {'embedding_size': 0 if hf['embedding_size'] == hf['hidden_size']
          else hf['embedding_size']}


def _config_to_hf(c, pad: int) -> dict:
  return {'embedding_size': c.embedding_width, 'pad_token_id': pad,
          'tie_word_embeddings': True}


def _check_exportable(c) -> None:
  if c.attention_kind != 'dot_product':
    raise ValueError(f"config.model.attention_kind={c.attention_kind!r} has no Hugging Face "
                     "ELECTRA equivalent; expected 'dot_product'")


_COMMON = dict(
    model_type='electra', config_fields=CONFIG_FIELDS, required_hf_values=REQUIRED_HF_VALUES,
    base_prefix='electra.', base_parts=('embeddings', 'embeddings_project', 'encoder'),
    layer_prefix='electra.encoder.layer.', buffers=BUFFERS, check_exportable=_check_exportable,
    config_from_hf=_config_from_hf, config_to_hf=_config_to_hf,
    key_renames=(('LayerNorm.gamma', 'LayerNorm.weight'), ('LayerNorm.beta', 'LayerNorm.bias')))

DISCRIMINATOR = T.HfSpec(
    kind='electra', architectures=('ElectraForPreTraining', 'ElectraModel'),
    params=TRUNK + DISCRIMINATOR_HEAD, groups=(ENCODER, RTD_HEAD), **_COMMON)

GENERATOR = T.HfSpec(
    kind='electra_generator', architectures=('ElectraForMaskedLM',),
    params=TRUNK + GENERATOR_HEAD, groups=(ENCODER, MLM_HEAD),
    tied={'generator_lm_head.weight': 'electra.embeddings.word_embeddings.weight'}, **_COMMON)
