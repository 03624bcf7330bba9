"""Every config value checked before any work, with the key and the expected range named.

Without this, bad values surfaced late and far from their cause: a negative learning rate
trained (loss up), a dropout rate of 1.5 trained into NaN, ``log_every_steps=0`` was a
ZeroDivisionError after compiling, ``batch_size=0`` an IndexError in the iterator. The
checks are one rule per key (:func:`rules`) plus the few that involve several keys
(``CROSS_RULES``); a rule whose key the config does not have is skipped, so one table
serves configs from before and after a field was added. The ``model`` and ``objective``
rules are not written here: they are the ranges the registry entries declare with their
fields (``encoder_jax.fields``), and the cross-checks of those sections are the kind's
``check`` and the objective entries' declarations (``objectives.problems``). The other
sections' rules are ``OWN_RULES``: adding a field to ``config_base`` or ``data.config``
means adding its line there; ``test_validation`` fails until it has one.

``validate(config)`` raises ``ConfigError`` listing every problem at once;
``workdir.check_workdir_writable`` is the workdir's counterpart.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import ml_collections

from encoder_jax import fields as fields_lib
from encoder_jax import objectives
from encoder_jax import optimizer
from encoder_jax.models import registry as models


class ConfigError(ValueError):
  """A config value out of range: a user error, reported without a traceback."""


@dataclasses.dataclass(frozen=True)
class Rule:
  key: str  # Dotted, without 'config.'.
  check: Callable[[Any], bool]
  expected: str | Callable[[], str]  # Completes 'expected ...'; callable: built when needed.

  def describe(self) -> str:
    return self.expected() if callable(self.expected) else self.expected


# The check builders live with the field declarations (one vocabulary for both).
integer, number, one_of, registry = (fields_lib.integer, fields_lib.number, fields_lib.one_of,
                                     fields_lib.registry)
boolean, string, sequence_of = fields_lib.boolean, fields_lib.string, fields_lib.sequence_of


def _rule(key, spec) -> Rule:
  check, expected = spec
  return Rule(key, check, expected)


# ---- the table: one line per field that no registry declares ----

OWN_RULES: tuple[Rule, ...] = tuple(_rule(k, s) for k, s in [
    ('seed', integer()),
    # data
    ('data.sources', string(non_empty=True)),
    ('data.mixing_alpha', number(0, lo_open=True)),
    ('data.tfds_data_dir', string()),
    ('data.max_line_bytes', integer(1)),
    ('data.max_sentence_chars', integer(1)),
    ('data.held_out_fraction', number(0, 1, hi_open=True)),
    ('data.held_out_max_documents', integer(0)),
    ('data.shard_max_tokens', integer(1)),
    ('data.num_workers', integer(0)),
    ('data.prepared_dir', string()),
    ('data.pair_kind', registry('encoder_jax.data.builders', 'REGISTRY', 'an example builder')),
    ('data.short_seq_prob', number(0, 1)),
    ('data.shuffle_pool_examples', integer(1)),
    ('data.streams', integer(0)),
    # tokenizer
    ('tokenizer.kind', registry('encoder_jax.data.tokenizer', 'KINDS', 'a tokenizer kind')),
    ('tokenizer.path', string()),
    ('tokenizer.model_type', one_of('unigram', 'bpe')),
    ('tokenizer.lowercase', boolean()),
    ('tokenizer.train_sentences', integer(1)),
    ('tokenizer.character_coverage', number(0, 1, lo_open=True)),
    # train
    ('train.num_steps', integer(1)),
    ('train.batch_size', integer(1)),
    ('train.grad_accum_steps', integer(1)),
    ('train.seq_lens', sequence_of(integer(8))),
    ('train.max_predictions', sequence_of(integer(1))),
    ('train.phase_fractions', sequence_of(number(0, 1))),
    ('train.log_every_steps', integer(1)),
    ('train.eval_every_steps', integer(0)),
    ('train.eval_batches', integer(0)),
    ('train.dropout_rng_impl', one_of('rbg', 'threefry')),
    ('train.nonfinite_policy', one_of('stop', 'skip')),
    ('train.peak_tflops_per_device', number(0)),
    # optim
    ('optim.name', one_of('adamw', 'lamb')),
    ('optim.learning_rate', number(0, lo_open=True)),
    ('optim.warmup_steps', integer(0)),
    ('optim.schedule', one_of(*optimizer.SCHEDULES)),
    ('optim.decay_fraction', number(0, 1, lo_open=True)),
    ('optim.b1', number(0, 1, hi_open=True)),
    ('optim.b2', number(0, 1, hi_open=True)),
    ('optim.eps', number(0, lo_open=True)),
    ('optim.weight_decay', number(0)),
    ('optim.grad_clip_norm', number(0)),
    # mesh: -1 = the remaining devices (at most one axis, see CROSS_RULES)
    ('mesh.data', integer(1, also=(-1,))),
    ('mesh.fsdp', integer(1, also=(-1,))),
    ('mesh.tensor', integer(1, also=(-1,))),
    # checkpoint
    ('checkpoint.every_steps', integer(1)),
    ('checkpoint.keep', integer(1)),
    ('checkpoint.async_save', boolean()),
])


def declared_rules() -> tuple[Rule, ...]:
  """The rules of the fields the model and objective registries declare."""
  return tuple(Rule(f'{section}.{f.name}', f.spec[0], f.spec[1])
               for section, declared in (('model', models.model_fields()),
                                         ('objective', objectives.objective_fields()))
               for f in declared.values())


def rules() -> tuple[Rule, ...]:
  return declared_rules() + OWN_RULES


# ---- rules over several keys: each returns a message, or None when satisfied ----


def _get(config, key: str, default=None):
  node = config
  for part in key.split('.'):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
      return default
    node = node[part]
  return node


def _phases(c) -> str | None:
  seq, preds, fracs = (_get(c, f'train.{k}') for k in
                       ('seq_lens', 'max_predictions', 'phase_fractions'))
  if seq is None or preds is None or fracs is None:
    return None
  if not len(seq) == len(preds) == len(fracs):
    return (f'config.train.seq_lens={tuple(seq)}, max_predictions={tuple(preds)} and '
            f'phase_fractions={tuple(fracs)}: expected one entry per phase in each')
  if abs(sum(fracs) - 1.0) > 1e-6:
    return f'config.train.phase_fractions={tuple(fracs)}: expected fractions summing to 1'
  for s, p in zip(seq, preds):
    if p > s:
      return (f'config.train.max_predictions={tuple(preds)}: expected each <= its phase\'s '
              f'seq_len {tuple(seq)}')
  return None


def _warmup(c) -> str | None:
  warmup, steps = _get(c, 'optim.warmup_steps'), _get(c, 'train.num_steps')
  if warmup is not None and steps is not None and warmup > steps:
    return (f'config.optim.warmup_steps={warmup}: expected <= train.num_steps={steps} (the '
            'learning rate warms up over warmup_steps, then decays to 0 at num_steps)')
  return None


def _batch(c) -> str | None:
  batch, accum = _get(c, 'train.batch_size'), _get(c, 'train.grad_accum_steps')
  if batch is not None and accum and batch % accum:
    return (f'config.train.batch_size={batch}: expected a multiple of '
            f'train.grad_accum_steps={accum} (the global batch is split into micro-batches)')
  return None


def _positions(c) -> str | None:
  limit, offset = _get(c, 'model.max_position_embeddings'), _get(c, 'model.position_offset', 0)
  seq = _get(c, 'train.seq_lens')
  if limit is None:
    return None
  if offset >= limit:
    return (f'config.model.position_offset={offset}: expected < model.max_position_embeddings='
            f'{limit}')
  if seq and max(seq) > limit - offset:
    return (f'config.train.seq_lens={tuple(seq)}: expected each <= model.max_position_embeddings'
            f' - position_offset = {limit - offset}')
  return None


def _eval(c) -> str | None:
  every, batches = _get(c, 'train.eval_every_steps'), _get(c, 'train.eval_batches')
  if every and batches is not None and batches < 1:
    return (f'config.train.eval_batches={batches}: expected >= 1 while train.eval_every_steps='
            f'{every} (set eval_every_steps=0 to disable evaluation)')
  return None


def _mesh(c) -> str | None:
  sizes = {a: _get(c, f'mesh.{a}') for a in ('data', 'fsdp', 'tensor')}
  if list(sizes.values()).count(-1) > 1:
    return f'config.mesh={sizes}: expected at most one axis of -1 (= the remaining devices)'
  return None


def _sources(c) -> str | None:
  if not isinstance(_get(c, 'data.sources'), str) or _get(c, 'data.tfds_data_dir') is None:
    return None
  from encoder_jax.data import sources  # pylint: disable=g-import-not-at-top
  try:
    sources.parse_sources(c.data)  # Parses only; files are looked for when preparing.
  except ValueError as e:
    return str(e)
  return None


def _model(c) -> list[str]:
  """The model's checks over several fields and its kind's own (``ModelKind.check``)."""
  if not isinstance(_get(c, 'model'), ml_collections.ConfigDict):
    return []
  try:
    models.make_config(c.model)
  except ValueError as e:
    return [str(e)]
  return []


def _objectives(c) -> list[str]:
  """What the chosen objectives declare they need (``objectives.Entry``)."""
  if _get(c, 'objective.names') is None or _get(c, 'model.kind') is None:
    return []
  return objectives.problems(c)


def _packing(c) -> str | None:
  """Rows of several documents (a builder with ``packs_documents``) need a model kind and
  an attention kind that keep them apart (``ModelKind.packed_rows``)."""
  pair_kind, kind = _get(c, 'data.pair_kind'), _get(c, 'model.kind')
  from encoder_jax.data import builders  # pylint: disable=g-import-not-at-top
  if not getattr(builders.REGISTRY.get(pair_kind), 'packs_documents', False):
    return None
  from encoder_jax.models import attention_kinds  # pylint: disable=g-import-not-at-top
  able = sorted(n for n, k in models.KINDS.items() if k.packed_rows)
  where = (f'config.data.pair_kind={pair_kind!r} puts several documents in one row, and '
           f'config.model.kind={kind!r}')
  if not models.KINDS[kind].packed_rows:
    return (f"{where} cannot keep them apart (its attention reads no document ids): use "
            f"one of the kinds {able}, or pair_kind='full_sentences' / 'doc_sentences'")
  attention = _get(c, 'model.attention_kind', 'dot_product')
  if not attention_kinds.reads_document_ids(attention):
    return (f'{where} with config.model.attention_kind={attention!r}: that attention kind '
            f'reads no document ids; expected one of {attention_kinds.document_readers()}, '
            "or pair_kind='full_sentences'")
  return None


CROSS_RULES: tuple[Callable[[Any], str | None | list[str]], ...] = (
    _phases, _warmup, _batch, _positions, _eval, _mesh, _sources, _model, _objectives,
    _packing)


def problems(config: ml_collections.ConfigDict) -> list[str]:
  """Every problem found, one message each (naming the key and what was expected)."""
  out, bad_keys = [], set()
  for rule in rules():
    value = _get(config, rule.key, _MISSING)
    if value is _MISSING:
      continue
    if isinstance(value, list):
      value = tuple(value)
    if not rule.check(value):
      out.append(f'config.{rule.key}={value!r}: expected {rule.describe()}')
      bad_keys.add(rule.key)
  if not bad_keys:  # Cross rules assume each value is in its own range.
    for r in CROSS_RULES:
      found = r(config)
      out.extend([found] if isinstance(found, str) else found or [])
  return out


_MISSING = object()


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError listing every out-of-range value; call before any work."""
  found = problems(config)
  if found:
    raise ConfigError(f'The config has {len(found)} invalid value{"s" * (len(found) > 1)}:\n  '
                      + '\n  '.join(found))
