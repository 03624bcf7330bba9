"""RoBERTa (Liu et al. 2019): BERT's network with fairseq's embedding conventions.

What differs from BERT in the network (the recipe differences — no NSP, FULL-SENTENCES,
dynamic masking, large batches, Adam beta2 0.98 — live in ``configs/roberta_base.py``):
position ids start after the padding id (``position_offset`` = pad id + 1 = 2, so the
table has 512 + 2 rows) and padding gets the padding id's row; one token-type row (no
segment signal); LayerNorm eps 1e-5; a byte-level BPE vocabulary with ``<s>``/``</s>``
specials (``tokenizer.kind='bytelevel_bpe'``). The pretraining network has the MLM head
only (``RobertaForMaskedLM``: no pooler, no pair head); fine-tuning heads bring their own.
"""

from __future__ import annotations

from encoder_jax.models import config as config_lib
from encoder_jax.models import trunk


def RobertaForMaskedLM(  # pylint: disable=invalid-name
    config: config_lib.EncoderConfig) -> trunk.EncoderWithHeads:
  return trunk.EncoderWithHeads(config, pooler=False, pair_head=False)


def RobertaModel(config: config_lib.EncoderConfig) -> trunk.EncoderOnly:  # pylint: disable=invalid-name
  return trunk.EncoderOnly(config, pooler=False)


def _check(c: config_lib.EncoderConfig) -> None:
  if c.position_offset < 1:
    raise ValueError(f'config.model.kind=roberta needs position_offset >= 1 (padding id + 1; '
                     f'2 with the RoBERTa vocabulary); got {c.position_offset}')
  if c.type_vocab_size != 1:
    raise ValueError(f'config.model.kind=roberta has one token type; got type_vocab_size='
                     f'{c.type_vocab_size} (expected 1)')
  if c.share_layers != 'none' or c.embedding_size not in (0, c.hidden_size):
    raise ValueError('config.model.kind=roberta has no factorized embedding or layer sharing')


KIND = config_lib.ModelKind(
    name='roberta', pretraining=RobertaForMaskedLM, encoder=RobertaModel, encode=trunk.encode,
    pooler=False, pair_head=False, check=_check, last_layer_rows=trunk.rows_without_cls,
    block_options=config_lib.BLOCK_OPTION_NAMES, packed_rows=True,
    description='RoBERTa: BERT network, positions after the padding id, one segment, MLM head')
