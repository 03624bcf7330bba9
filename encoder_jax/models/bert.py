"""BERT (Devlin et al. 2018): the ``bert`` model kind, the shared trunk with every option
off (``models.trunk``: learned absolute positions, segments, post-LN blocks) plus a tanh
pooler on [CLS] and the two-way pair head (NSP/SOP). Parameter counts equal Hugging Face's
``BertForPreTraining`` (BERT-base: 110,106,428).
"""

from __future__ import annotations

from encoder_jax.models import config as config_lib
from encoder_jax.models import trunk

BertConfig = config_lib.EncoderConfig  # The BERT kind's config (all kinds share the schema).


def BertForPreTraining(  # pylint: disable=invalid-name
    config: config_lib.EncoderConfig) -> trunk.EncoderWithHeads:
  """Hugging Face's name for BERT's pretraining network."""
  return trunk.EncoderWithHeads(config, pooler=True, pair_head=True)


def BertModel(config: config_lib.EncoderConfig) -> trunk.EncoderOnly:  # pylint: disable=invalid-name
  return trunk.EncoderOnly(config, pooler=True)


def _check(c: config_lib.EncoderConfig) -> None:
  if c.share_layers != 'none' or c.embedding_size not in (0, c.hidden_size):
    raise ValueError('config.model.kind=bert has no factorized embedding or layer sharing '
                     f'(embedding_size={c.embedding_size}, share_layers={c.share_layers!r}); '
                     "use model.kind='albert'")


KIND = config_lib.ModelKind(
    name='bert', pretraining=BertForPreTraining, encoder=BertModel, encode=trunk.encode,
    pooler=True, pair_head=True, check=_check, last_layer_rows=trunk.rows_with_cls,
    block_options=config_lib.BLOCK_OPTION_NAMES, packed_rows=True,
    description='BERT: post-LN Transformer, absolute positions, segments, MLM + NSP/SOP heads',
    import_objectives=('mlm', 'nsp'), import_pair_kind='nsp')


def init_inputs(batch_size: int = 2, seq_len: int = 8, max_predictions: int = 2):
  return KIND.init_inputs(batch_size, seq_len, max_predictions)
