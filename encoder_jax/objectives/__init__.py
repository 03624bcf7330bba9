"""Objective registry: ``config.objective.names`` picks entries, ``build`` makes the setup.

A registry entry is a factory ``(config, tables, network) -> Objective | Pretraining``.
Simple objectives (MLM, NSP, SOP) are composed into one :class:`base.Composite` (one
encoder pass); an entry that returns a whole :class:`base.Pretraining` (several networks,
its own forward passes, e.g. ELECTRA) stands alone.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from encoder_jax.core import fields as fields_lib
from encoder_jax.models import registry as models
from encoder_jax.objectives import base
from encoder_jax.objectives import contrastive
from encoder_jax.objectives import electra
from encoder_jax.objectives import masking
from encoder_jax.objectives import mlm
from encoder_jax.objectives import pair
from encoder_jax.objectives import plm
from encoder_jax.objectives import sbo

Factory = Callable[[ml_collections.ConfigDict, 'masking.VocabTables | None', models.Network],
                   'base.Objective | base.Pretraining']


@dataclasses.dataclass(frozen=True)
class Entry:
  """One objective: how to build it, and everything the config must satisfy for it.

  ``validation`` and ``build`` read these declarations; nothing outside the entry names it.
  """
  build: Factory
  fields: tuple[fields_lib.Field, ...] = ()  # The config.objective fields it reads.
  kinds: tuple[str, ...] | None = None  # The model kinds it trains; None: any with its heads.
  heads: tuple[str, ...] = ()  # ModelKind flags it needs ('mlm_head', 'pair_head').
  pair_kinds: tuple[str, ...] | None = None  # The data.pair_kind values it reads; None: any.
  segments: int = 0  # The segment embeddings it needs (model.type_vocab_size >= segments).
  needs: tuple[str, ...] = ()  # Objectives that must be chosen with it.
  stands_alone: bool = False  # A whole setup (its own networks and losses): no other name.
  check: Callable[[ml_collections.ConfigDict], str | None] = lambda c: None  # Further checks.
  # Its corruption changes what the encoder reads beyond the masks (the contrastive halves):
  # left out when MLM is scored alone (``evaluate.at_bert_masking``), on whole rows.
  alters_rows: bool = False
  description: str = ''


def _electra_check(c) -> str | None:
  if c.objective.span_p > 0 or c.objective.max_ngram > 1:
    return ("config.objective.names=('electra',) masks single tokens (or whole words): "
            f'expected span_p=0 and max_ngram=1, got {c.objective.span_p} and '
            f'{c.objective.max_ngram}')
  return masking.check_config(c)


# Entry.heads: ModelKind flags, and what a kind without one lacks.
HEADS = {'mlm_head': 'MLM head', 'pair_head': 'pair head',
         'packed_rows': 'attention that keeps the documents of a packed row apart'}
NAMES = fields_lib.Field(
    'names', ('mlm', 'nsp'),
    fields_lib.sequence_of(fields_lib.names(lambda: REGISTRY, 'an objective name')),
    'Losses to add up, each an entry of objectives.REGISTRY (see its declarations).')

REGISTRY: dict[str, Entry] = {
    'mlm': Entry(lambda c, tables, net: mlm.MaskedLM(masking.MaskingRecipe.from_config(
        c.objective), tables), fields=masking.FIELDS, heads=('mlm_head',),
                 check=masking.check_config, description='masked LM (BERT, RoBERTa, SpanBERT)'),
    'nsp': Entry(lambda c, tables, net: pair.PairClassification('nsp'), heads=('pair_head',),
                 pair_kinds=('nsp',), segments=2, description='next-sentence prediction'),
    'sop': Entry(lambda c, tables, net: pair.PairClassification('sop'), heads=('pair_head',),
                 pair_kinds=('sop',), segments=2, description='sentence-order prediction'),
    'contrastive': Entry(
        lambda c, tables, net: contrastive.SpanContrastive(
            c.objective.contrastive_weight, c.objective.contrastive_temperature,
            packed=c.get('data', {}).get('pair_kind') == 'packed_documents'),
        fields=contrastive.FIELDS, heads=('mlm_head', 'packed_rows'),
        pair_kinds=('full_sentences', 'doc_sentences', 'packed_documents'), alters_rows=True,
        check=contrastive.check_config,
        description="span contrastive: a row's two halves against the batch's (DeCLUTR)"),
    'sbo': Entry(lambda c, tables, net: sbo.SpanBoundary(net.config), heads=('mlm_head',),
                 needs=('mlm',), description="SpanBERT's span boundary objective"),
    'electra': Entry(lambda c, tables, net: electra.build(
        c, tables, masking.MaskingRecipe.from_config(c.objective)),
                     fields=masking.FIELDS + electra.FIELDS, kinds=('electra',),
                     stands_alone=True, check=_electra_check,
                     description='ELECTRA: generator + discriminator (replaced-token detection)'),
    'plm': Entry(plm.build, fields=plm.FIELDS, kinds=('xlnet',), pair_kinds=('xlnet',),
                 stands_alone=True, check=plm.check_config,
                 description="XLNet's permutation LM, two streams"),
}


def objective_fields() -> dict[str, fields_lib.Field]:
  """Every ``config.objective`` field: ``names``, then each entry's own."""
  return fields_lib.merge([(NAMES,), *(e.fields for e in REGISTRY.values())], 'objective')


def trainers_of(kind: models.ModelKind) -> list[str]:
  """The objectives that can train ``kind`` (its kind named, or the heads they need)."""
  return [n for n, e in REGISTRY.items()
          if (e.kinds is None or kind.name in e.kinds) and all(getattr(kind, h) for h in e.heads)]


def problems(config: ml_collections.ConfigDict) -> list[str]:
  """What ``config`` breaks of its objectives' declarations, one message each."""
  names = tuple(config.objective.names)
  chosen = {n: REGISTRY[n] for n in names if n in REGISTRY}
  kind = models.KINDS.get(config.model.kind)
  out = []
  for name, e in chosen.items():
    if e.stands_alone and len(names) > 1:
      out.append(f'config.objective.names={names}: {name!r} is a whole pretraining setup (its '
                 f'own networks and losses) and must stand alone: expected ({name!r},)')
    missing = [n for n in e.needs if n not in names]
    if missing:
      out.append(f'config.objective.names={names} has {name!r}, which reads what '
                 f'{missing[0]!r} produces: expected {missing[0]!r} in the names too')
    if kind is not None:
      lacks = [HEADS[h] for h in e.heads if not getattr(kind, h)]
      if e.kinds is not None and kind.name not in e.kinds:
        why = (f'{name!r} trains kind {" or ".join(map(repr, e.kinds))} only: expected '
               f'config.model.kind={e.kinds[0]!r}')
      elif lacks:
        why = f'the kind has no {lacks[0]}, which {name!r} needs'
      else:
        why = None
      if why:
        out.append(f'config.model.kind={kind.name!r} with config.objective.names={names}: '
                   f'{why}; objectives that train {kind.name!r}: {trainers_of(kind)}')
    pair_kind = config.data.get('pair_kind') if 'data' in config else None
    if e.pair_kinds is not None and pair_kind is not None and pair_kind not in e.pair_kinds:
      out.append(f'config.objective.names={names} has {name!r}, which reads the examples of '
                 f'config.data.pair_kind {" or ".join(map(repr, e.pair_kinds))}: got '
                 f'{pair_kind!r}')
    types = config.model.get('type_vocab_size')
    if e.segments and types is not None and types < e.segments:
      out.append(f'config.model.type_vocab_size={types}: expected >= {e.segments} for the '
                 f'objective {name!r} (segments A and B)')
    found = e.check(config)
    if found:
      out.append(found)
  return list(dict.fromkeys(out))


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
  found = problems(config)
  if found:
    raise ValueError('; '.join(found))
  network = models.network(config.model)
  built = [REGISTRY[n].build(config, tables, network) for n in names]
  if len(built) == 1 and isinstance(built[0], base.Pretraining):
    return built[0]
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
