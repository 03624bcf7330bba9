"""ALBERT (Lan et al. 2019): factorized embeddings and cross-layer parameter sharing.

The token, position and segment embeddings have width ``embedding_size`` E (128), are
normalised there and projected to the hidden size (vocab -> E -> hidden); all layers
share one set of parameters (``share_layers='all'``; 'attention' and 'ffn' share only
that block, as the paper's ablation); the MLM head maps hidden -> E before the tied
E x vocab decoder; the pair head is SOP (sentence order) on the tanh pooler. The released
models use the tanh GELU approximation (``activation='gelu_new'``). With those settings
the base model has the parameter count of Hugging Face's ``AlbertForPreTraining``
(11,813,810 at vocabulary 30,000; the bare ``AlbertModel`` has 11,683,584), pinned by
``tests/models/test_models.py``.
"""

from __future__ import annotations

from encoder_jax.models import config as config_lib
from encoder_jax.models import trunk


def AlbertForPreTraining(  # pylint: disable=invalid-name
    config: config_lib.EncoderConfig) -> trunk.EncoderWithHeads:
  return trunk.EncoderWithHeads(config, pooler=True, pair_head=True)


def AlbertModel(config: config_lib.EncoderConfig) -> trunk.EncoderOnly:  # pylint: disable=invalid-name
  return trunk.EncoderOnly(config, pooler=True)


def _check(c: config_lib.EncoderConfig) -> None:
  if c.position_offset:
    raise ValueError(f'config.model.kind=albert numbers positions from 0; got position_offset='
                     f'{c.position_offset}')


def flops_per_token(c: config_lib.EncoderConfig, seq_len: int) -> float:
  """As BERT's (sharing saves parameters, not FLOPs), plus the E x hidden projection."""
  return config_lib.encoder_flops_per_token(c, seq_len)


KIND = config_lib.ModelKind(
    name='albert', pretraining=AlbertForPreTraining, encoder=AlbertModel, encode=trunk.encode,
    pooler=True, pair_head=True, check=_check, flops_per_token=flops_per_token,
    last_layer_rows=trunk.rows_with_cls, block_options=config_lib.BLOCK_OPTION_NAMES,
    packed_rows=True,
    description='ALBERT: factorized embedding, cross-layer sharing, SOP head',
    import_objectives=('mlm', 'sop'), import_pair_kind='sop')
