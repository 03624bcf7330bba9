"""The table between our RoBERTa parameters and Hugging Face ``RobertaForMaskedLM``'s.

The trunk is BERT's under ``roberta.``; the MLM head is ``lm_head`` (dense, layer_norm,
decoder tied to the word embedding, bias). ``pad_token_id`` fixes where position ids
start: ours is ``position_offset = pad_token_id + 1`` (fairseq's numbering).
"""

from __future__ import annotations

from encoder_jax.interop import hf_bert
from encoder_jax.interop import hf_table as T

ENCODER, MLM_HEAD = 'encoder', 'mlm_head'
GROUPS = (ENCODER, MLM_HEAD)


def _trunk(entry: T.Entry) -> T.Entry:
  return T.Entry(entry.ours, 'roberta.' + entry.hf[len('bert.'):], entry.transform, ENCODER)


PARAMS: tuple[T.Entry, ...] = tuple(
    _trunk(e) for e in hf_bert.PARAMS if e.group == hf_bert.ENCODER) + (
    T.Entry('mlm_head/transform/kernel', 'lm_head.dense.weight', T.LINEAR, MLM_HEAD),
    T.Entry('mlm_head/transform/bias', 'lm_head.dense.bias', T.IDENTITY, MLM_HEAD),
    T.Entry('mlm_head/layer_norm/scale', 'lm_head.layer_norm.weight', T.IDENTITY, MLM_HEAD),
    T.Entry('mlm_head/layer_norm/bias', 'lm_head.layer_norm.bias', T.IDENTITY, MLM_HEAD),
    T.Entry('mlm_head/output_bias', 'lm_head.bias', T.IDENTITY, MLM_HEAD),
)
TIED = {
    'lm_head.decoder.weight': 'roberta.embeddings.word_embeddings.weight',
    'lm_head.decoder.bias': 'lm_head.bias',
}
BUFFERS = ('roberta.embeddings.position_ids', 'roberta.embeddings.token_type_ids')


def _config_from_hf(hf) -> dict:
  return {'position_offset': int(hf.get('pad_token_id', 1)) + 1}


def _config_to_hf(c, pad_token_id: int) -> dict:
  if pad_token_id != c.position_offset - 1:
    raise ValueError(f'The tokenizer pads with id {pad_token_id} but config.model.'
                     f'position_offset={c.position_offset} numbers positions from pad id '
                     f'{c.position_offset - 1} + 1: RobertaForMaskedLM would number them '
                     'differently')
  return {'pad_token_id': pad_token_id, 'bos_token_id': 0, 'eos_token_id': 2,
          'tie_word_embeddings': True}


SPEC = T.HfSpec(
    kind='roberta', model_type='roberta',
    architectures=('RobertaForMaskedLM', 'RobertaModel'),
    params=PARAMS, groups=GROUPS, config_fields=hf_bert.CONFIG_FIELDS,
    required_hf_values=hf_bert.REQUIRED_HF_VALUES, base_prefix='roberta.',
    base_parts=('embeddings', 'encoder', 'pooler'), layer_prefix='roberta.encoder.layer.',
    tied=TIED, buffers=BUFFERS, config_from_hf=_config_from_hf, config_to_hf=_config_to_hf,
    check_exportable=hf_bert.SPEC.check_exportable)
