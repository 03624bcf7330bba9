"""Objective registry: ``config.objective.names`` picks entries, ``build`` makes the setup.

A registry entry is a factory ``(config, tables, network) -> Objective | Pretraining``.
Simple objectives (MLM, NSP, SOP) are composed into one :class:`base.Composite` (one
encoder pass); an entry that returns a whole :class:`base.Pretraining` (several networks,
its own forward passes, e.g. ELECTRA) stands alone.
"""

from __future__ import annotations

from typing import Callable

import ml_collections

from encoder_jax.models import registry as models
from encoder_jax.objectives import base
from encoder_jax.objectives import electra
from encoder_jax.objectives import masking
from encoder_jax.objectives import mlm
from encoder_jax.objectives import pair
from encoder_jax.objectives import plm
from encoder_jax.objectives import sbo

Factory = Callable[[ml_collections.ConfigDict, 'masking.VocabTables | None', models.Network],
                   'base.Objective | base.Pretraining']


def masking_recipe(c: ml_collections.ConfigDict) -> masking.MaskingRecipe:
  o = c.objective
  return masking.MaskingRecipe(o.mask_rate, o.mask_token_rate, o.random_token_rate,
                               o.random_token_distribution, o.whole_word_masking,
                               max_ngram=int(o.max_ngram), span_p=float(o.span_p),
                               max_span_length=int(o.max_span_length))


REGISTRY: dict[str, Factory] = {
    'mlm': lambda c, tables, net: mlm.MaskedLM(masking_recipe(c), tables),
    'nsp': lambda c, tables, net: pair.PairClassification('nsp'),
    'sop': lambda c, tables, net: pair.PairClassification('sop'),
    'sbo': lambda c, tables, net: sbo.build(c, net),
    'electra': lambda c, tables, net: electra.build(c, tables, masking_recipe(c)),
    'plm': plm.build,  # XLNet: permutation LM, two streams; stands alone.
}


def build(config: ml_collections.ConfigDict, tables: masking.VocabTables | None = None
          ) -> base.Pretraining:
  """The pretraining setup of ``config`` (``config.model`` + ``config.objective.names``).

  ``tables`` (from the tokenizer, :func:`vocab_tables`) are needed to corrupt batches;
  without them the setup still initialises, restores and runs its networks (loading).
  """
  names = tuple(config.objective.names)
  if not names:
    raise ValueError('config.objective.names is empty; valid names: ' + ', '.join(REGISTRY))
  unknown = [n for n in names if n not in REGISTRY]
  if unknown:
    raise ValueError(f'config.objective.names has unknown {unknown}; valid: {sorted(REGISTRY)}')
  network = models.network(config.model)
  built = [REGISTRY[n](config, tables, network) for n in names]
  setups = [b for b in built if isinstance(b, base.Pretraining)]
  if setups:
    if len(built) > 1:
      raise ValueError(f'config.objective.names={list(names)}: {setups[0].name!r} is a whole '
                       'pretraining setup (its own networks and losses) and must stand alone')
    return setups[0]
  base.check_pair_kind(built, config.data)
  return base.Composite(built, network, config.train.dropout_rng_impl)


def vocab_tables(config: ml_collections.ConfigDict, tokenizer, unigram_counts,
                 where: str = 'the prepared data') -> masking.VocabTables:
  """Masking tables of ``tokenizer``, checked against ``config.model.vocab_size``."""
  if not tokenizer.fits(int(config.model.vocab_size)):
    raise ValueError(
        f'config.model.vocab_size={config.model.vocab_size} but the tokenizer of {where} '
        f'({tokenizer.path}) has {tokenizer.vocab_size} pieces; set model.vocab_size to match '
        '(it is also the size prepare trains)')
  return masking.VocabTables.from_tokenizer(tokenizer, unigram_counts,
                                            int(config.model.vocab_size))
