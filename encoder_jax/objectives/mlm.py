"""Masked language modelling: L = -1/|M| sum_{i in M} log P(x_i | h_i), M = the selected set."""

from __future__ import annotations

import math

from encoder_jax.objectives import base
from encoder_jax.objectives import masking


class MaskedLM(base.Objective):
  name = 'mlm'
  metric_weights = {'mlm_loss': 'mlm_predictions', 'mlm_accuracy': 'mlm_predictions'}

  def __init__(self, recipe: masking.MaskingRecipe, tables: masking.VocabTables):
    self.recipe = recipe
    self.tables = tables

  def corrupt(self, batch, rng, phase):
    return {**batch, **masking.mask_tokens(
        rng, batch['input_ids'], batch['input_mask'], max_predictions=phase.max_predictions,
        recipe=self.recipe, tables=self.tables)}

  def loss(self, outputs, batch):
    loss, accuracy = base.cross_entropy(outputs['mlm_logits'], batch['masked_labels'],
                                        batch['masked_weights'])
    return loss, {'mlm_loss': loss, 'mlm_accuracy': accuracy,
                  'mlm_predictions': batch['masked_weights'].sum()}

  def summarize(self, metrics):
    return {'mlm_perplexity': math.exp(min(metrics['mlm_loss'], 50.0))}
