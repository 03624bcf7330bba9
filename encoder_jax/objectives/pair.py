"""Two-way classification of the pooled [CLS] state: NSP (BERT) and SOP (ALBERT).

Both read ``pair_labels`` built by the data pipeline (NSP: 1 = B is a random segment;
SOP: 1 = the two segments are swapped); they differ only in the data they need.
"""

from __future__ import annotations

import jax.numpy as jnp

from encoder_jax.objectives import base


class PairClassification(base.Objective):

  def __init__(self, name: str):
    self.name = name
    self.pair_kinds = (name,)

  def loss(self, outputs, batch):
    labels = batch['pair_labels']
    loss, accuracy = base.cross_entropy(outputs['pair_logits'], labels,
                                        jnp.ones(labels.shape, jnp.float32))
    return loss, {'pair_loss': loss, 'pair_accuracy': accuracy}
