"""ELECTRA (Clark et al. 2020): the discriminator and the generator networks.

Both are BERT's post-LN Transformer (``trunk.encode``) with ELECTRA's embedding: token,
position and segment embeddings of width ``embedding_size`` E, LayerNorm, dropout, then a
dense E -> hidden projection when E != hidden (``embeddings/projection``; Hugging Face's
``electra.embeddings_project``, outside its embeddings module). Neither has a pooler or a
pair head.

* ``electra`` (the **discriminator**, Hugging Face ``ElectraForPreTraining``): a
  per-token replaced/original logit from ``discriminator_predictions``: dense hidden ->
  hidden, the network's activation, dense hidden -> 1. Its pretraining network returns
  ``rtd_logits`` [B, L] (float32) instead of MLM logits. Downstream use (features,
  fine-tuning, export) takes this network.
* ``electra_generator`` (the **generator**, Hugging Face ``ElectraForMaskedLM``): a small
  BERT-style MLM whose head maps hidden -> E with exact GELU and LayerNorm, then the tied
  E x vocab decoder plus a bias (``generator_predictions`` + ``generator_lm_head``; the
  head's activation is GELU whatever ``activation`` says, as in Hugging Face).

ELECTRA's pretraining setup (``objectives.electra``) trains both in one params tree, the
embeddings (token, position, segment, LayerNorm) stored once and shared, as the original
code (google-research/electra, ``model/modeling.py``: both networks build their embeddings
in the one ``electra/embeddings`` scope).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from encoder_jax.models import config as config_lib
from encoder_jax.models import layers
from encoder_jax.models import trunk

# The embedding parameters the two networks share (everything in 'embeddings' except the
# per-network E -> hidden projection).
SHARED_EMBEDDINGS = ('word_embeddings', 'position_embeddings', 'token_type_embeddings',
                     'layer_norm')


class DiscriminatorHead(nn.Module):
  """Dense hidden -> hidden, activation, dense hidden -> 1: one logit per token."""
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxH):
    c, dt = self.config, self.config.jnp_dtype
    h = c.hidden_size
    x_BxLxH = layers.Dense((h,), (h,), ('embed',), ('embed',), c.initializer_range, dt,
                           name='dense')(x_BxLxH)
    x_BxLxH = config_lib.ACTIVATIONS[c.activation](x_BxLxH)
    logits_BxLx1 = layers.Dense((h,), (1,), ('embed',), (None,), c.initializer_range, dt,
                                name='dense_prediction')(x_BxLxH)
    return logits_BxLx1[..., 0].astype(jnp.float32)


class Discriminator(nn.Module):
  """Encoder + replaced-token-detection head (``ElectraForPreTraining``)."""
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, masked_positions_BxP=None,
               *, deterministic: bool = True, collect_hidden: bool = False,
               document_ids_BxL=None) -> dict[str, Any]:
    del masked_positions_BxP  # Every token is classified.
    out = trunk.encode(self.config, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                      deterministic=deterministic, pool=False, collect_hidden=collect_hidden,
                      document_ids_BxL=document_ids_BxL)
    del out['word_embed']
    out['rtd_logits'] = DiscriminatorHead(self.config, name='discriminator_predictions')(
        out['sequence_output'])
    return out


class Generator(nn.Module):
  """Encoder + MLM head with a GELU transform to E (``ElectraForMaskedLM``).

  ``masked_positions_BxP`` selects where the vocabulary logits are computed (all positions
  when None), and the last layer then runs only there, as BERT's ``EncoderWithHeads``.
  """
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, masked_positions_BxP=None,
               *, deterministic: bool = True, collect_hidden: bool = False,
               gather_positions_BxG=None, document_ids_BxL=None) -> dict[str, Any]:
    c = self.config
    length = input_ids_BxL.shape[1]
    rows_BxQ = None
    if masked_positions_BxP is None:
      masked_positions_BxP = jnp.broadcast_to(jnp.arange(length), input_ids_BxL.shape)
    else:  # The last layer at the masked (and gathered) rows only, as BERT's EncoderWithHeads.
      rows_BxQ = trunk.last_layer_rows(length, [masked_positions_BxP, gather_positions_BxG],
                                      False, collect_hidden)
    out = trunk.encode(c, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                      deterministic=deterministic, pool=False, collect_hidden=collect_hidden,
                      rows_BxQ=rows_BxQ, document_ids_BxL=document_ids_BxL)
    word_embed = out.pop('word_embed')
    h_BxPxH, gathered = trunk.read_rows(out, masked_positions_BxP, gather_positions_BxG)
    if gathered is not None:
      out['gathered_output'] = gathered
    out['mlm_logits'] = trunk.MlmHead(c.replace(activation='gelu'), name='mlm_head')(
        h_BxPxH, word_embed)
    return out


def ElectraModel(config: config_lib.EncoderConfig) -> trunk.EncoderOnly:  # pylint: disable=invalid-name
  return trunk.EncoderOnly(config, pooler=False)


def _check(c: config_lib.EncoderConfig) -> None:
  if c.share_layers != 'none':
    raise ValueError(f'config.model.kind={c.kind} has no cross-layer sharing; got share_layers='
                     f'{c.share_layers!r}')
  if c.position_offset:
    raise ValueError(f'config.model.kind={c.kind} numbers positions from 0; got position_offset='
                     f'{c.position_offset}')


GENERATOR_KIND = config_lib.ModelKind(
    name='electra_generator', pretraining=Generator, encoder=ElectraModel, encode=trunk.encode,
    pooler=False, pair_head=False, check=_check, last_layer_rows=trunk.rows_without_cls,
    block_options=config_lib.BLOCK_OPTION_NAMES, packed_rows=True,
    description='ELECTRA generator: factorized embedding, MLM head (GELU, tied decoder)')


def generator_config(discriminator: config_lib.EncoderConfig, hidden_fraction: float,
                     layers_fraction: float = 1.0) -> config_lib.EncoderConfig:
  """The generator's config, as ``get_generator_config`` of google-research/electra.

  Hidden size ``round(hidden * hidden_fraction)``, ``round(layers * layers_fraction)``
  layers, d_ff 4x its hidden size, one head per 64 dimensions (at least one); the token
  embeddings keep the discriminator's width E (they are shared), projected to the
  generator's hidden size.
  """
  hidden = int(round(discriminator.hidden_size * hidden_fraction))
  num_layers = int(round(discriminator.num_layers * layers_fraction))
  if hidden < 1 or num_layers < 1:
    raise ValueError(f'config.objective.generator_hidden_fraction={hidden_fraction} and '
                     f'generator_layers_fraction={layers_fraction} give a generator of hidden '
                     f'size {hidden} and {num_layers} layers; expected both >= 1')
  try:
    return discriminator.replace(
        kind=GENERATOR_KIND.name, hidden_size=hidden, num_layers=num_layers,
        intermediate_size=4 * hidden, num_heads=max(1, hidden // 64),
        embedding_size=discriminator.embedding_width)
  except ValueError as e:
    raise ValueError(f'config.objective.generator_hidden_fraction={hidden_fraction} gives a '
                     f'generator the network cannot have: {e}') from e


KIND = config_lib.ModelKind(
    name='electra', pretraining=Discriminator, encoder=ElectraModel, encode=trunk.encode,
    pooler=False, pair_head=False, mlm_head=False, check=_check,
    block_options=config_lib.BLOCK_OPTION_NAMES, packed_rows=True,
    description='ELECTRA discriminator: factorized embedding, replaced-token-detection head',
    import_objectives=('electra',), companion_config=generator_config,
    shared_embeddings=SHARED_EMBEDDINGS)
