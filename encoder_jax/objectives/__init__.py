"""Objective registry: ``config.objective.names`` picks entries, ``build`` composes them."""

from __future__ import annotations

from typing import Callable

import ml_collections

from encoder_jax.objectives import base
from encoder_jax.objectives import masking
from encoder_jax.objectives import mlm
from encoder_jax.objectives import pair

Factory = Callable[[ml_collections.ConfigDict, masking.VocabTables], base.Objective]


def _recipe(c: ml_collections.ConfigDict) -> masking.MaskingRecipe:
  o = c.objective
  return masking.MaskingRecipe(o.mask_rate, o.mask_token_rate, o.random_token_rate,
                               o.random_token_distribution, o.whole_word_masking)


REGISTRY: dict[str, Factory] = {
    'mlm': lambda c, tables: mlm.MaskedLM(_recipe(c), tables),
    'nsp': lambda c, tables: pair.PairClassification('nsp'),
    'sop': lambda c, tables: pair.PairClassification('sop'),
}


def build(config: ml_collections.ConfigDict, apply_fn, tables: masking.VocabTables
          ) -> base.Composite:
  """The summed objectives of ``config.objective.names`` around ``apply_fn`` (model.apply)."""
  names = tuple(config.objective.names)
  if not names:
    raise ValueError('config.objective.names is empty; valid names: ' + ', '.join(REGISTRY))
  unknown = [n for n in names if n not in REGISTRY]
  if unknown:
    raise ValueError(f'config.objective.names has unknown {unknown}; valid: {sorted(REGISTRY)}')
  objectives = [REGISTRY[n](config, tables) for n in names]
  base.check_pair_kind(objectives, config.data)
  return base.Composite(objectives, apply_fn, config.train.dropout_rng_impl)
