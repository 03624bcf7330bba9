"""The tables between our DeBERTa parameters and Hugging Face's ``DebertaForMaskedLM`` (kind
``deberta``, model_type 'deberta') and ``DebertaV2ForMaskedLM`` (kind ``deberta_v2``,
model_type 'deberta-v2', the v2/v3 checkpoints).

Layouts (ours <- HF, per layer ``deberta.encoder.layer.{i}.attention.self.``):

* v1: ``in_proj`` [embed, heads, 3, d] <- ``in_proj.weight`` [3 * heads * d, embed], whose
  rows are per head (q, k, v) as ``DisentangledSelfAttention.transpose_for_scores`` splits
  them; ``q_bias``/``v_bias`` (no key bias); ``pos_key`` <- ``pos_proj`` (no bias, c2p);
  ``pos_query`` <- ``pos_q_proj`` (p2c).
* v2: ``query``/``key``/``value`` <- ``query_proj``/``key_proj``/``value_proj``; ``pos_key``/
  ``pos_query`` <- ``pos_key_proj``/``pos_query_proj`` (absent with ``share_att_key``);
  ``encoder/rel_layer_norm`` <- ``deberta.encoder.LayerNorm`` (``norm_rel_ebd='layer_norm'``).
* Both: ``encoder/rel_embeddings`` <- ``deberta.encoder.rel_embeddings.weight``; the
  absolute position table only with ``position_biased_input``, segment embeddings only with
  ``type_vocab_size`` > 0; the MLM head is ``cls.predictions`` (``legacy=True``; the
  original ``lm_predictions.lm_head.*`` spelling of Microsoft's checkpoints is renamed on
  import), its decoder tied to the word embedding.

What Hugging Face cannot represent, and what we do about it:

* **Enhanced mask decoder**: HF's ``Deberta*ForMaskedLM`` has none (its MLM logits read the
  encoder output; Microsoft's released checkpoints were trained with EMD and are run without
  it there too). Import gives ``emd_layers=0`` (the model HF computes); pass
  ``emd_layers=2`` (``load_hf(..., emd_layers=2)``) to continue pretraining with it (the
  EMD's absolute position table is then freshly initialised and reported as group 'emd').
  Export *drops* the EMD with a logged note: the encoder, and hence fine-tuning and features,
  are exact; HF's MLM logits are those of our network with ``emd_layers=0``. The EMD's
  position table (only used by it) is not written.
* Our pooler (ContextPooler) and pair head (SOP option): not in the MLM models; freshly
  initialised on import (groups 'pooler', 'pair_head'), not written on export.
* Refused on import: ``relative_attention`` false, ``talking_head``, the v2 convolution
  layer (``conv_kernel_size`` > 0), ``attention_head_size`` != hidden / heads, a factorized
  ``embedding_size``, position terms other than c2p/p2c.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from encoder_jax.interop import hf_bert
from encoder_jax.interop import hf_table as T
from encoder_jax.models import layers as da

ENCODER, MLM_HEAD, EMD, POOLER, PAIR_HEAD = 'encoder', 'mlm_head', 'emd', 'pooler', 'pair_head'
GROUPS = (ENCODER, MLM_HEAD, EMD, POOLER, PAIR_HEAD)
_LAYER = 'deberta.encoder.layer.{i}.'

# v1's fused q/k/v weight [heads*3*d, embed] <-> kernel [embed, heads, 3, d].
IN_PROJ_KERNEL = T.Transform(
    lambda x, c: x.reshape(c.num_heads, 3, c.head_dim, c.hidden_size).transpose(3, 0, 1, 2),
    lambda x, c: x.transpose(1, 2, 3, 0).reshape(3 * c.num_heads * c.head_dim, c.hidden_size))


def _terms(c) -> tuple[str, ...]:
  return da.position_terms(c)


def _c2p(c) -> bool:
  return 'c2p' in _terms(c) and not c.share_att_key


def _p2c(c) -> bool:
  return 'p2c' in _terms(c) and not c.share_att_key


def _layer(ours: str, hf: str, transform: T.Transform, when=None) -> T.Entry:
  return T.Entry('encoder/layers/' + ours, _LAYER + hf, transform, ENCODER, when)


def _common_layer() -> tuple[T.Entry, ...]:
  """The layer tensors outside the attention's projections (BERT's names under deberta.)."""
  return tuple(_layer(e.ours[len('encoder/layers/'):], e.hf[len('bert.encoder.layer.{i}.'):],
                      e.transform)
               for e in hf_bert.PARAMS
               if e.group == hf_bert.ENCODER and e.per_layer
               and not e.hf.split('.{i}.')[1].startswith('attention.self.'))


def _trunk() -> tuple[T.Entry, ...]:
  emb = lambda ours, hf, when=None: T.Entry('embeddings/' + ours, 'deberta.embeddings.' + hf,
                                            T.IDENTITY, ENCODER, when)
  return (
      emb('word_embeddings/embedding', 'word_embeddings.weight'),
      emb('position_embeddings/embedding', 'position_embeddings.weight',
          lambda c: c.position_biased_input),
      emb('token_type_embeddings/embedding', 'token_type_embeddings.weight',
          lambda c: c.type_vocab_size > 0),
      emb('layer_norm/scale', 'LayerNorm.weight'),
      emb('layer_norm/bias', 'LayerNorm.bias'),
      T.Entry('encoder/rel_embeddings', 'deberta.encoder.rel_embeddings.weight', T.IDENTITY,
              ENCODER),
  ) + _common_layer()


def _heads() -> tuple[T.Entry, ...]:
  """MLM head (legacy ``cls.predictions``), and what has no HF place (hf=None)."""
  return (
      T.Entry('mlm_head/transform/kernel', 'cls.predictions.transform.dense.weight', T.LINEAR,
              MLM_HEAD),
      T.Entry('mlm_head/transform/bias', 'cls.predictions.transform.dense.bias', T.IDENTITY,
              MLM_HEAD),
      T.Entry('mlm_head/layer_norm/scale', 'cls.predictions.transform.LayerNorm.weight',
              T.IDENTITY, MLM_HEAD),
      T.Entry('mlm_head/layer_norm/bias', 'cls.predictions.transform.LayerNorm.bias',
              T.IDENTITY, MLM_HEAD),
      T.Entry('mlm_head/output_bias', 'cls.predictions.bias', T.IDENTITY, MLM_HEAD),
      T.Entry('embeddings/position_embeddings/embedding', None, T.IDENTITY, EMD,
              lambda c: c.emd_layers > 0 and not c.position_biased_input),
      T.Entry('pooler/kernel', None, T.IDENTITY, POOLER),
      T.Entry('pooler/bias', None, T.IDENTITY, POOLER),
      T.Entry('pair_head/kernel', None, T.IDENTITY, PAIR_HEAD),
      T.Entry('pair_head/bias', None, T.IDENTITY, PAIR_HEAD),
  )


V1_PARAMS: tuple[T.Entry, ...] = _trunk() + (
    _layer('in_proj/kernel', 'attention.self.in_proj.weight', IN_PROJ_KERNEL),
    _layer('q_bias', 'attention.self.q_bias', T.QKV_BIAS),
    _layer('v_bias', 'attention.self.v_bias', T.QKV_BIAS),
    _layer('pos_key/kernel', 'attention.self.pos_proj.weight', T.QKV_KERNEL, _c2p),
    _layer('pos_query/kernel', 'attention.self.pos_q_proj.weight', T.QKV_KERNEL, _p2c),
    _layer('pos_query/bias', 'attention.self.pos_q_proj.bias', T.QKV_BIAS, _p2c),
) + _heads()

V2_PARAMS: tuple[T.Entry, ...] = _trunk() + (
    T.Entry('encoder/rel_layer_norm/scale', 'deberta.encoder.LayerNorm.weight', T.IDENTITY,
            ENCODER, lambda c: c.norm_rel_ebd),
    T.Entry('encoder/rel_layer_norm/bias', 'deberta.encoder.LayerNorm.bias', T.IDENTITY,
            ENCODER, lambda c: c.norm_rel_ebd),
    _layer('query/kernel', 'attention.self.query_proj.weight', T.QKV_KERNEL),
    _layer('query/bias', 'attention.self.query_proj.bias', T.QKV_BIAS),
    _layer('key/kernel', 'attention.self.key_proj.weight', T.QKV_KERNEL),
    _layer('key/bias', 'attention.self.key_proj.bias', T.QKV_BIAS),
    _layer('value/kernel', 'attention.self.value_proj.weight', T.QKV_KERNEL),
    _layer('value/bias', 'attention.self.value_proj.bias', T.QKV_BIAS),
    _layer('pos_key/kernel', 'attention.self.pos_key_proj.weight', T.QKV_KERNEL, _c2p),
    _layer('pos_key/bias', 'attention.self.pos_key_proj.bias', T.QKV_BIAS, _c2p),
    _layer('pos_query/kernel', 'attention.self.pos_query_proj.weight', T.QKV_KERNEL, _p2c),
    _layer('pos_query/bias', 'attention.self.pos_query_proj.bias', T.QKV_BIAS, _p2c),
) + _heads()

TIED = {
    'cls.predictions.decoder.weight': 'deberta.embeddings.word_embeddings.weight',
    'cls.predictions.decoder.bias': 'cls.predictions.bias',
}
BUFFERS = ('deberta.embeddings.position_ids',)
# Microsoft's checkpoints (and HF's legacy=False head) spell the MLM head lm_predictions.
KEY_RENAMES = (
    ('lm_predictions.lm_head.dense.', 'cls.predictions.transform.dense.'),
    ('lm_predictions.lm_head.LayerNorm.', 'cls.predictions.transform.LayerNorm.'),
    ('lm_predictions.lm_head.bias', 'cls.predictions.bias'),
)

# (our field, HF field): present in every DeBERTa config.json. The DeBERTa options have
# defaults in HF that differ between versions and are read in _config_from_hf.
CONFIG_FIELDS: tuple[tuple[str, str], ...] = hf_bert.CONFIG_FIELDS


def _pos_att_type(value) -> str:
  if value is None:
    return ''
  names = value.lower().split('|') if isinstance(value, str) else [str(v).lower() for v in value]
  names = [n.strip() for n in names if n.strip()]
  unknown = sorted(set(names) - set(da.POSITION_TERMS))
  if unknown:
    raise ValueError(f'pos_att_type={value!r} has {unknown}; only c2p and p2c are supported')
  return '|'.join(t for t in da.POSITION_TERMS if t in names)


def _config_from_hf(version: int):
  def convert(hf: Mapping[str, Any]) -> dict[str, Any]:
    if not hf.get('relative_attention', False):
      raise ValueError('relative_attention=False is not supported; expected True (our DeBERTa '
                       'always uses disentangled attention)')
    hidden, heads = hf['hidden_size'], hf['num_attention_heads']
    for key, ok, expected in (
        ('talking_head', not hf.get('talking_head', False), 'False'),
        ('conv_kernel_size', not hf.get('conv_kernel_size', 0), '0 (no convolution layer)'),
        ('attention_head_size', hf.get('attention_head_size', hidden // heads) == hidden // heads,
         f'hidden_size / num_attention_heads = {hidden // heads}'),
        ('embedding_size', hf.get('embedding_size', hidden) == hidden,
         f'hidden_size = {hidden}')):
      if not ok:
        raise ValueError(f'{key}={hf.get(key)!r} is not supported; expected {expected}')
    out = dict(
        attention_kind='disentangled',
        position_biased_input=bool(hf.get('position_biased_input', True)),
        max_relative_positions=int(hf.get('max_relative_positions', -1)),
        pos_att_type=_pos_att_type(hf.get('pos_att_type')),
        emd_layers=0,  # HF has no enhanced mask decoder (see the module doc).
    )
    if version == 2:
      norm = [x.strip() for x in str(hf.get('norm_rel_ebd', 'none')).lower().split('|')]
      out.update(position_buckets=max(0, int(hf.get('position_buckets', -1))),
                 share_att_key=bool(hf.get('share_att_key', False)),
                 norm_rel_ebd='layer_norm' in norm)
    return out
  return convert


def _config_to_hf(version: int):
  def convert(c, pad_token_id: int) -> dict[str, Any]:
    if c.emd_layers:
      logging.warning(
          'Exporting kind=%s with emd_layers=%d: Hugging Face\'s %s has no enhanced mask '
          'decoder, so the export leaves it out (and its absolute position table). The encoder '
          'is exact; HF\'s MLM logits are those of this model with emd_layers=0.', c.kind,
          c.emd_layers, 'DebertaForMaskedLM' if version == 1 else 'DebertaV2ForMaskedLM')
    out = dict(relative_attention=True, max_relative_positions=c.max_relative_positions,
               position_biased_input=c.position_biased_input,
               pos_att_type=list(da.position_terms(c)), pad_token_id=pad_token_id, legacy=True,
               tie_word_embeddings=True)
    if version == 2:
      out.update(position_buckets=c.position_buckets if c.position_buckets else -1,
                 share_att_key=c.share_att_key,
                 norm_rel_ebd='layer_norm' if c.norm_rel_ebd else 'none')
    return out
  return convert


def _check_exportable(kind: str):
  def check(c) -> None:
    if c.kind != kind or c.attention_kind != 'disentangled':
      raise ValueError(f'config.model.kind={c.kind!r} attention_kind={c.attention_kind!r} has '
                       f"no {kind} table; expected kind={kind!r} with "
                       "attention_kind='disentangled'")
  return check


def _spec(kind: str, model_type: str, architectures, params, version: int) -> T.HfSpec:
  return T.HfSpec(
      kind=kind, model_type=model_type, architectures=architectures, params=params,
      groups=GROUPS, config_fields=CONFIG_FIELDS, required_hf_values={},
      base_prefix='deberta.', base_parts=('embeddings', 'encoder'),
      layer_prefix='deberta.encoder.layer.', tied=TIED, buffers=BUFFERS,
      config_from_hf=_config_from_hf(version), config_to_hf=_config_to_hf(version),
      check_exportable=_check_exportable(kind), key_renames=KEY_RENAMES)


SPEC_V1 = _spec('deberta', 'deberta', ('DebertaForMaskedLM', 'DebertaModel'), V1_PARAMS, 1)
SPEC_V2 = _spec('deberta_v2', 'deberta-v2', ('DebertaV2ForMaskedLM', 'DebertaV2Model'),
                V2_PARAMS, 2)
