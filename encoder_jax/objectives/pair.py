"""Two-way classification of the pooled first-token state: NSP (BERT) and SOP (ALBERT).

Both read ``pair_labels`` built by the data pipeline (NSP: 1 = B is a random segment;
SOP: 1 = the two segments are swapped); they differ only in the data they need.
"""

from __future__ import annotations

import jax.numpy as jnp

from encoder_jax.objectives import base


class PairClassification(base.Objective):
  console_metrics = (('pair_accuracy', 'pair_acc', '{:.1%}'),)

  def __init__(self, name: str):
    self.name = name

  def check(self, network):
    if not network.kind.pair_head:
      raise ValueError(f'config.objective.names includes {self.name!r}, but config.model.kind='
                       f'{network.kind.name!r} has no pair head; drop {self.name!r} (e.g. '
                       "names=('mlm',) with data.pair_kind='full_sentences')")

  def loss(self, outputs, batch):
    labels = batch['pair_labels']
    loss, accuracy = base.cross_entropy(outputs['pair_logits'], labels,
                                        jnp.ones(labels.shape, jnp.float32))
    return loss, {'pair_loss': loss, 'pair_accuracy': accuracy}

  def head_flops_per_sequence(self, network, phase):
    """The tanh pooler (hidden x hidden) and the hidden x 2 head, once per sequence."""
    d = network.config.hidden_size
    return float(6 * (d * d + 2 * d))

  def report_lines(self, metrics):
    if 'pair_loss' not in metrics:
      return []
    return [f'  {self.name.upper():5s} loss {metrics["pair_loss"]:.4f}  accuracy '
            f'{metrics["pair_accuracy"]:.2%}']
