"""Masked language modelling: L = -1/|M| sum_{i in M} log P(x_i | h_i), M = the selected set.

Everything MLM-specific lives here: the masking recipe and vocabulary tables, the number
of predictions per sequence (``phase.max_predictions``), the head's FLOPs (the MLM head
runs at the predicted positions only), perplexity and the evaluation report line.
"""

from __future__ import annotations

import math

from encoder_jax.objectives import base
from encoder_jax.objectives import masking
from encoder_jax.objectives import span_masking


class MaskedLM(base.Objective):
  name = 'mlm'
  masks_tokens = True
  metric_weights = {'mlm_loss': 'mlm_predictions', 'mlm_accuracy': 'mlm_predictions'}
  console_metrics = (('mlm_accuracy', 'mlm_acc', '{:.1%}'), ('mlm_perplexity', 'ppl', '{:.2f}'))

  def __init__(self, recipe: masking.MaskingRecipe, tables: masking.VocabTables | None):
    self.recipe = recipe
    self.tables = tables  # None: the objective can describe a model but not corrupt data.

  def check(self, network):
    if not network.kind.mlm_head:
      raise ValueError(f"config.objective.names includes 'mlm', but config.model.kind="
                       f'{network.kind.name!r} has no MLM head')

  def corrupt(self, batch, rng, phase):
    if self.tables is None:
      raise ValueError('The MLM objective was built without vocabulary tables (no tokenizer); '
                       'it cannot mask a batch')
    # SpanBERT's geometric spans (span_p > 0) or BERT's tokens / whole words / n-grams.
    mask = span_masking.mask_spans if self.recipe.span_p > 0 else masking.mask_tokens
    return {**batch, **mask(
        rng, batch['input_ids'], batch['input_mask'], max_predictions=phase.max_predictions,
        recipe=self.recipe, tables=self.tables, word_starts_BxL=batch.get('word_starts'))}

  def loss(self, outputs, batch):
    loss, accuracy = base.cross_entropy(outputs['mlm_logits'], batch['masked_labels'],
                                        batch['masked_weights'])
    return loss, {'mlm_loss': loss, 'mlm_accuracy': accuracy,
                  'mlm_predictions': batch['masked_weights'].sum()}

  def head_flops_per_sequence(self, network, phase):
    """Transform (hidden x E) and tied decoder (E x vocab) at the predicted positions."""
    c = network.config
    w = c.embedding_width
    return float(6 * phase.max_predictions * (c.hidden_size * w + w * c.vocab_size))

  def summarize(self, metrics):
    return {'mlm_perplexity': math.exp(min(metrics['mlm_loss'], 50.0)),
            'mlm_predictions': int(round(metrics['mlm_predictions']))}

  def report_lines(self, metrics):
    if 'mlm_loss' not in metrics:
      return []
    return [f'  MLM   loss {metrics["mlm_loss"]:.4f}  accuracy {metrics["mlm_accuracy"]:.2%}  '
            f'perplexity {metrics["mlm_perplexity"]:.2f}  '
            f'({int(round(metrics["mlm_predictions"]))} predicted tokens)']
