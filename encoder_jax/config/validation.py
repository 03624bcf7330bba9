"""Every config value checked before any work, with the key and the expected range named.

Without this, bad values surfaced late and far from their cause: a negative learning rate
trained (loss up), a dropout rate of 1.5 trained into NaN, ``log_every_steps=0`` was a
ZeroDivisionError after compiling, ``batch_size=0`` an IndexError in the iterator. The
checks are the ranges every field declares (``config_base.schema()``: each section's
:class:`fields.Field` values, so a field is added once, with its range) plus the few rules
that involve several keys (``CROSS_RULES``, named functions here; the model's own are its
kind's ``check``, the objectives' their entries' declarations). A field the config does not
have is skipped, so one schema serves configs from before and after a field was added.

``validate(config)`` raises ``ConfigError`` listing every problem at once;
``workdir.check_workdir_writable`` is the workdir's counterpart. Another config (fine-tuning's)
is checked the same way: :func:`check_sections` / :func:`validate_sections` with its own
schema (``fields.section``) and cross rules.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import ml_collections

from encoder_jax.config import schema as config_base
from encoder_jax.core import fields as fields_lib
from encoder_jax import objectives
from encoder_jax.models import registry as models


class ConfigError(ValueError):
  """A config value out of range: a user error, reported without a traceback."""


# A rule over several keys: a message, a list of them, or None when satisfied.
CrossRule = Callable[[Any], 'str | None | list[str]']


def check_sections(config, schema: fields_lib.Schema,
                   cross_rules: Sequence[CrossRule] = ()) -> list[str]:
  """Every problem of ``config`` against a schema (section -> declared fields), one message
  each naming the key and what was expected; the cross rules run when every value is in its
  own range (they assume it)."""
  out = fields_lib.problems(config, schema)
  if not out:
    for rule in cross_rules:
      found = rule(config)
      out.extend([found] if isinstance(found, str) else found or [])
  return out


def validate_sections(config, schema: fields_lib.Schema,
                      cross_rules: Sequence[CrossRule] = ()) -> None:
  """Raises ConfigError listing every problem :func:`check_sections` finds."""
  found = check_sections(config, schema, cross_rules)
  if found:
    raise ConfigError(f'The config has {len(found)} invalid value{"s" * (len(found) > 1)}:\n  '
                      + '\n  '.join(found))


_get = fields_lib.lookup


# ---- rules over several keys: each returns a message, or None when satisfied ----


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
  if limit is None or offset >= limit:  # The latter is the model's own check (_model).
    return None
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


def _profile(c) -> str | None:
  count, first, steps = (_get(c, f'train.{k}') for k in
                         ('profile_steps', 'profile_first_step', 'num_steps'))
  if count and first is not None and steps is not None and first + count - 1 > steps:
    return (f'config.train.profile_first_step={first}, profile_steps={count}: expected the '
            f'traced steps {first}..{first + count - 1} within train.num_steps={steps}')
  return None


def _mesh(c) -> str | None:
  for prefix, what in (('', 'devices'), ('dcn_', 'slices')):
    sizes = {f'{prefix}{a}': _get(c, f'mesh.{prefix}{a}', None)
             for a in ('data', 'fsdp', 'tensor')}
    if list(sizes.values()).count(-1) > 1:
      return f'config.mesh={sizes}: expected at most one axis of -1 (= the remaining {what})'
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


def _init(c) -> str | None:
  """Continued pretraining starts from one source: a workdir (and its step) or an HF
  directory."""
  workdir, hf_dir, step = (_get(c, f'init.{k}', d) for k, d in
                           (('workdir', ''), ('hf_dir', ''), ('step', -1)))
  if workdir and hf_dir:
    return (f'config.init.workdir={workdir!r} and config.init.hf_dir={hf_dir!r}: expected at '
            'most one source to start from')
  if step != -1 and not workdir:
    return (f'config.init.step={step}: expected -1 unless config.init.workdir names the '
            'workdir whose checkpoint step it is')
  return None


CROSS_RULES: tuple[CrossRule, ...] = (
    _phases, _warmup, _batch, _positions, _eval, _profile, _mesh, _sources, _model,
    _objectives, _packing, _init)


def problems(config: ml_collections.ConfigDict) -> list[str]:
  """Every problem of a pretraining config, one message each (naming the key and what was
  expected)."""
  return check_sections(config, config_base.schema(), CROSS_RULES)


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError listing every out-of-range value; call before any work."""
  validate_sections(config, config_base.schema(), CROSS_RULES)
