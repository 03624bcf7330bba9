"""ELECTRA pretraining (Clark et al. 2020): generator + discriminator, one step, one tree.

Reproduces ``PretrainingModel`` of google-research/electra (run_pretraining.py,
pretrain/pretrain_helpers.py), on device with fixed shapes:

1. **Mask** 15% of the tokens (``objective.mask_rate``; ``masking.mask_tokens``): ELECTRA
   puts [MASK] at 85% of them and leaves the rest unchanged, with no random replacement
   (``configs/electra_*.py`` set ``mask_token_rate=0.85, random_token_rate=0``).
2. The **generator** (``models.electra.Generator``, hidden size a fraction of the
   discriminator's) predicts the masked tokens: ``MLM_gen``, the mean cross-entropy.
3. **Sample** a replacement at every masked position from the generator's softmax
   (temperature 1; ``jax.random.categorical`` is the Gumbel-max trick of ELECTRA's
   ``sample_from_softmax``), with no gradient through the sampling, and put the samples
   into the *original* sequence (ELECTRA's ``unmask`` then ``scatter_update``).
4. The **discriminator** (``models.electra.Discriminator``) classifies every non-padding
   token (specials included, as ``input_mask`` weights it there) as replaced or original;
   a sampled token equal to the original counts as original. ``RTD`` is the mean sigmoid
   cross-entropy over those tokens.
5. ``loss = MLM_gen + rtd_weight * RTD`` (``objective.rtd_weight``, 50 in the paper).

The params tree is ``{'discriminator': ..., 'generator': ...}``. The embeddings both
networks use (token, position and segment tables and their LayerNorm,
``models.electra.SHARED_EMBEDDINGS``) are stored once, in the discriminator's
``embeddings`` (ELECTRA's tying: one ``electra/embeddings`` scope); the generator keeps
only its own E -> hidden projection there. Both networks' gradients reach the shared
tensors. ``downstream`` is the discriminator (features, fine-tuning, export);
``masked_lm`` the generator with the shared embeddings (fill-mask), and both are exported
to Hugging Face (``hf_exports``).
"""

from __future__ import annotations

import math
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from encoder_jax.core import fields as fields_lib
from encoder_jax.models import registry as models
from encoder_jax.objectives import base
from encoder_jax.objectives import masking

GENERATOR_EXPORT_DIR = 'generator'  # workdir_to_hf writes the generator under OUT/generator.
# ELECTRA's own config.objective fields (it also reads masking's recipe).
FIELDS: tuple[fields_lib.Field, ...] = (
    fields_lib.Field('generator_hidden_fraction', 0.25, fields_lib.number(0, 1, lo_open=True),
                     "The generator's hidden size as a fraction of the discriminator's "
                     '(small/large: 1/4, base: 1/3).'),
    fields_lib.Field('generator_layers_fraction', 1.0, fields_lib.number(0, 1, lo_open=True),
                     "The generator's depth as a fraction of the discriminator's."),
    fields_lib.Field('rtd_weight', 50.0, fields_lib.number(0),
                     'Weight of replaced-token detection: loss = MLM_gen + rtd_weight * RTD.'),
)


def replace_tokens(ids_BxL, positions_BxP, weights_BxP, sampled_BxP):
  """(fake ids [B, L], replaced float32 [B, L]): the *original* sequence with the samples
  at the masked positions (padding slots, weight 0, write nowhere); a sample equal to the
  original token is not a replacement (ELECTRA's ``is_fake_tokens``)."""
  b, l = ids_BxL.shape
  scatter_BxP = jnp.where(weights_BxP > 0, positions_BxP, l)
  fake_BxL = ids_BxL.at[jnp.arange(b)[:, None], scatter_BxP].set(
      sampled_BxP.astype(ids_BxL.dtype), mode='drop')
  return fake_BxL, (fake_BxL != ids_BxL).astype(jnp.float32)


class Electra(base.Pretraining):
  name = 'electra'
  console_metrics = (('generator_mlm_accuracy', 'gen_acc', '{:.1%}'),
                     ('rtd_accuracy', 'rtd_acc', '{:.1%}'))
  metric_weights = {
      'generator_mlm_loss': 'mlm_predictions', 'generator_mlm_accuracy': 'mlm_predictions',
      'rtd_loss': 'rtd_tokens', 'rtd_accuracy': 'rtd_tokens',
      'replaced_fraction': 'rtd_tokens',
      'rtd_precision': 'rtd_predicted_replaced', 'rtd_recall': 'rtd_replaced',
  }

  def __init__(self, config: ml_collections.ConfigDict, tables: masking.VocabTables | None,
               recipe: masking.MaskingRecipe):
    super().__init__(config.train.dropout_rng_impl)
    self.discriminator = models.network(config.model)
    o = config.objective
    self.shared = self.discriminator.kind.shared_embeddings
    self.generator = models.network(self.discriminator.kind.companion_config(
        self.discriminator.config, float(o.generator_hidden_fraction),
        float(o.generator_layers_fraction)))
    self.rtd_weight = float(o.rtd_weight)
    self.recipe = recipe
    if recipe.span_p > 0 or recipe.max_ngram > 1:
      raise ValueError('config.objective.names=(\'electra\',) masks single tokens (or whole '
                       'words); expected span_p=0 and max_ngram=1')
    self.tables = tables  # None: the setup can describe and run the networks, not mask.

  # ------------------------------------------------------------------------- params

  def init(self, rng):
    k_disc, k_gen = jax.random.split(rng)
    return {'discriminator': self.discriminator.init(k_disc),
            'generator': self._own(self.generator.init(k_gen))}

  def generator_params(self, params) -> Any:
    """The generator's full params tree: its own plus the shared embeddings."""
    shared = {k: v for k, v in params['discriminator']['embeddings'].items()
              if k in self.shared}  # Those the config has (rotary: no position table).
    generator = dict(params['generator'])
    generator['embeddings'] = {**shared, **generator.get('embeddings', {})}
    return generator

  def _own(self, generator_params) -> dict:
    """The generator's tree without the shared embeddings (as stored)."""
    generator = dict(generator_params)
    own = {k: v for k, v in generator.get('embeddings', {}).items()
           if k not in self.shared}
    generator.pop('embeddings', None)
    if own:
      generator['embeddings'] = own
    return generator

  hf_export_dirs = (GENERATOR_EXPORT_DIR,)

  def from_downstream(self, params, rng, exported=None, where=''):
    """Imported discriminator params + the generator: the one ``workdir_to_hf`` wrote to
    ``<where>/generator`` when the import found it there with this config's generator
    shapes, else a fresh one (reported as initialised)."""
    _, k_gen = jax.random.split(rng)
    path = os.path.join(where, GENERATOR_EXPORT_DIR)
    if (exported or {}).get(GENERATOR_EXPORT_DIR) is not None:
      config, imported = exported[GENERATOR_EXPORT_DIR]
      shapes = lambda tree: jax.tree.map(np.shape, tree)
      # The shapes alone: a fresh generator is initialised only when it is used.
      wanted = nn.unbox(jax.eval_shape(self.generator.init, k_gen))
      if config.kind == self.generator.kind.name and shapes(imported) == shapes(wanted):
        same = lambda k: all(np.array_equal(a, b) for a, b in zip(
            jax.tree.leaves(imported['embeddings'][k]), jax.tree.leaves(params['embeddings'][k])))
        differ = [k for k in self.shared if k in params['embeddings'] and not same(k)]
        if differ:
          logging.warning('%s: the generator\'s %s differ from the discriminator\'s; ELECTRA '
                          'shares them: the discriminator\'s are used.', path, differ)
        return {'discriminator': params, 'generator': self._own(imported)}, []
      logging.warning('%s holds a generator of other shapes than config.objective.'
                      'generator_hidden_fraction / generator_layers_fraction give (%s); it is '
                      'not imported: the generator starts fresh. Pass the config it was '
                      'trained with (e.g. --config=configs/electra_base.py).', path,
                      self.generator.config)
    fresh = jax.tree.map(np.asarray, nn.unbox(jax.jit(self.generator.init)(k_gen)))
    return {'discriminator': params, 'generator': self._own(fresh)}, ['generator']

  def downstream(self, params):
    return self.discriminator, params['discriminator']

  def masked_lm(self, params):
    return self.generator, self.generator_params(params)

  def hf_exports(self, params):
    return {'': self.downstream(params), GENERATOR_EXPORT_DIR: self.masked_lm(params)}

  # --------------------------------------------------------------------------- loss

  def corruption(self, batch, rng, phase):
    """The generator's input: the batch masked with the first of ``loss_fn``'s keys."""
    if self.tables is None:
      raise ValueError('The ELECTRA setup was built without vocabulary tables (no tokenizer); '
                       'it cannot mask a batch')
    ids_BxL, mask_BxL = jnp.asarray(batch['input_ids']), jnp.asarray(batch['input_mask'])
    return {**batch, **masking.mask_tokens(
        jax.random.split(rng, 4)[0], ids_BxL, mask_BxL, max_predictions=phase.max_predictions,
        recipe=self.recipe, tables=self.tables, word_starts_BxL=batch.get('word_starts'))}

  def loss_fn(self, params, batch, rng, phase, train):
    masked = self.corruption(batch, rng, phase)
    _, k_sample, k_gen, k_disc = jax.random.split(rng, 4)
    ids_BxL, segments_BxL, mask_BxL = (jnp.asarray(batch[k]) for k in
                                       ('input_ids', 'segment_ids', 'input_mask'))
    positions_BxP, weights_BxP = masked['masked_positions'], masked['masked_weights']
    dropout = lambda key: {'dropout': self.dropout_key(key)} if train else None

    generated = self.generator.pretraining.apply(
        {'params': self.generator_params(params)}, masked['masked_input_ids'], segments_BxL,
        mask_BxL, positions_BxP, deterministic=not train, rngs=dropout(k_gen),
        **base.packed_inputs(self.generator, batch))
    logits_BxPxV = generated['mlm_logits']
    mlm_loss, mlm_accuracy = base.cross_entropy(logits_BxPxV, masked['masked_labels'],
                                                weights_BxP)

    # Replacements sampled from the generator (Gumbel-max), no gradient through them.
    sampled_BxP = jax.random.categorical(k_sample, jax.lax.stop_gradient(logits_BxPxV))
    fake_BxL, replaced_BxL = replace_tokens(ids_BxL, positions_BxP, weights_BxP, sampled_BxP)

    judged = self.discriminator.pretraining.apply(
        {'params': params['discriminator']}, fake_BxL, segments_BxL, mask_BxL,
        deterministic=not train, rngs=dropout(k_disc),
        **base.packed_inputs(self.discriminator, batch))
    logits_BxL = judged['rtd_logits']
    w_BxL = (mask_BxL > 0).astype(jnp.float32)
    n_tokens = jnp.maximum(w_BxL.sum(), 1.0)
    # Sigmoid cross-entropy, stable form: max(x, 0) - x*z + log(1 + exp(-|x|)).
    bce_BxL = (jnp.maximum(logits_BxL, 0) - logits_BxL * replaced_BxL
               + jnp.log1p(jnp.exp(-jnp.abs(logits_BxL))))
    rtd_loss = (bce_BxL * w_BxL).sum() / n_tokens
    predicted_BxL = (logits_BxL > 0).astype(jnp.float32)
    true_positive = (predicted_BxL * replaced_BxL * w_BxL).sum()
    n_predicted = (predicted_BxL * w_BxL).sum()
    n_replaced = (replaced_BxL * w_BxL).sum()

    loss = mlm_loss + self.rtd_weight * rtd_loss
    metrics = {
        'loss': loss,
        'generator_mlm_loss': mlm_loss, 'generator_mlm_accuracy': mlm_accuracy,
        'mlm_predictions': weights_BxP.sum(),
        'rtd_loss': rtd_loss,
        'rtd_accuracy': ((predicted_BxL == replaced_BxL) * w_BxL).sum() / n_tokens,
        'rtd_precision': true_positive / jnp.maximum(n_predicted, 1.0),
        'rtd_recall': true_positive / jnp.maximum(n_replaced, 1.0),
        'replaced_fraction': n_replaced / n_tokens,
        'rtd_tokens': w_BxL.sum(), 'rtd_predicted_replaced': n_predicted,
        'rtd_replaced': n_replaced,
    }
    return loss, metrics

  # ---------------------------------------------------------------------- reporting

  def flops_per_sequence(self, phase):
    """Both networks (forward + backward), their heads included.

    Generator: encoder over every token, MLM head (hidden_g x E transform, E x vocab
    decoder) at the ``max_predictions`` positions. Discriminator: encoder over every token
    and its head (hidden x hidden, hidden x 1) at every token. Sampling is not counted.
    """
    s, p = phase.seq_len, phase.max_predictions
    g, d = self.generator.config, self.discriminator.config
    e = g.embedding_width
    generator = (self.generator.pretraining_flops(s, p)  # Last layer at the p positions.
                 + 6 * p * (g.hidden_size * e + e * g.vocab_size))
    discriminator = (self.discriminator.flops_per_token(s) * s
                     + 6 * s * (d.hidden_size * d.hidden_size + d.hidden_size))
    return float(generator + discriminator)

  def summarize(self, metrics):
    if 'generator_mlm_loss' not in metrics:
      return {}
    return {'generator_mlm_perplexity': math.exp(min(metrics['generator_mlm_loss'], 50.0))}

  def report_lines(self, metrics):
    if 'rtd_loss' not in metrics:
      return []
    return [
        f'  Generator MLM  loss {metrics["generator_mlm_loss"]:.4f}  accuracy '
        f'{metrics["generator_mlm_accuracy"]:.2%}  perplexity '
        f'{metrics.get("generator_mlm_perplexity", float("nan")):.2f}  '
        f'({int(round(metrics["mlm_predictions"]))} predicted tokens)',
        f'  Discriminator  loss {metrics["rtd_loss"]:.4f}  accuracy {metrics["rtd_accuracy"]:.2%}'
        f'  precision {metrics["rtd_precision"]:.2%}  recall {metrics["rtd_recall"]:.2%} '
        f'(replaced class)  replaced {metrics["replaced_fraction"]:.2%} of '
        f'{int(round(metrics["rtd_tokens"]))} tokens',
    ]


def build(config: ml_collections.ConfigDict, tables, recipe) -> Electra:
  return Electra(config, tables, recipe)
