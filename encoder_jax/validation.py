"""Every config value checked before any work, with the key and the expected range named.

Without this, bad values surfaced late and far from their cause: a negative learning rate
trained (loss up), a dropout rate of 1.5 trained into NaN, ``log_every_steps=0`` was a
ZeroDivisionError after compiling, ``batch_size=0`` an IndexError in the iterator. The
checks are a table (``RULES``: one line per key) plus the few that involve two keys
(``CROSS_RULES``); a rule whose key the config does not have is skipped, so one table
serves configs from before and after a field was added. Adding a field to
``config_base`` means adding its line here; ``test_validation`` fails until it has one.

``validate(config)`` raises ``ConfigError`` listing every problem at once;
``workdir.check_workdir_writable`` is the workdir's counterpart.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable, Sequence

import ml_collections


class ConfigError(ValueError):
  """A config value out of range: a user error, reported without a traceback."""


@dataclasses.dataclass(frozen=True)
class Rule:
  key: str  # Dotted, without 'config.'.
  check: Callable[[Any], bool]
  expected: str | Callable[[], str]  # Completes 'expected ...'; callable: built when needed.

  def describe(self) -> str:
    return self.expected() if callable(self.expected) else self.expected


# ---- value checks: each returns (check, expected) ----


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def integer(lo: int | None = None, also: Sequence[int] = ()):
  """An int >= lo (or one of ``also``, e.g. -1 for 'all remaining devices')."""
  text = 'an integer' + (f' >= {lo}' if lo is not None else '')
  text += ''.join(f', or {a}' for a in also)
  return (lambda v: _is_int(v) and (v in also or lo is None or v >= lo)), text


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
           hi_open: bool = False):
  """A finite int or float in the interval; open ends excluded."""
  def check(v):
    if not _is_number(v):
      return False
    if lo is not None and (v <= lo if lo_open else v < lo):
      return False
    return not (hi is not None and (v >= hi if hi_open else v > hi))
  if hi is not None:
    text = f'a number in {"(" if lo_open else "["}{lo}, {hi}{")" if hi_open else "]"}'
  else:
    text = f'a number {">" if lo_open else ">="} {lo}'
  return check, text


def one_of(*values):
  return (lambda v: v in values), 'one of ' + ', '.join(repr(v) for v in values)


def registry(module: str, attribute: str, what: str):
  """A name in a registry, read when checked (registries fill in as modules import)."""
  def names():
    try:
      return sorted(getattr(importlib.import_module(module), attribute))
    except (ImportError, AttributeError):
      return None  # No such registry in this version: the builder checks the name.
  def check(v):
    known = names()
    return isinstance(v, str) and bool(v) and (known is None or v in known)
  def expected():
    known = names()
    return f'{what}, one of {known}' if known else f'{what} (a non-empty string)'
  return check, expected


def boolean():
  return (lambda v: isinstance(v, bool)), 'True or False'


def string(non_empty: bool = False):
  return ((lambda v: isinstance(v, str) and (bool(v.strip()) or not non_empty)),
          'a non-empty string' if non_empty else 'a string')


def sequence_of(item):
  check, text = item
  def expected():
    return f'a non-empty tuple, each {text() if callable(text) else text}'
  return (lambda v: isinstance(v, tuple) and len(v) > 0 and all(check(x) for x in v)), expected


def _rule(key, spec) -> Rule:
  check, expected = spec
  return Rule(key, check, expected)


# ---- the table: one line per config_base / data.config field ----

RULES: tuple[Rule, ...] = tuple(_rule(k, s) for k, s in [
    ('seed', integer()),
    # model
    ('model.kind', registry('encoder_jax.models.registry', 'KINDS', 'a model kind')),
    ('model.vocab_size', integer(1)),
    ('model.hidden_size', integer(1)),
    ('model.num_layers', integer(1)),
    ('model.num_heads', integer(1)),
    ('model.intermediate_size', integer(1)),
    ('model.max_position_embeddings', integer(1)),
    ('model.type_vocab_size', integer(0)),  # 0: no segment embeddings (DeBERTa).
    ('model.hidden_dropout_rate', number(0, 1, hi_open=True)),
    ('model.attention_dropout_rate', number(0, 1, hi_open=True)),
    ('model.layer_norm_eps', number(0, lo_open=True)),
    ('model.initializer_range', number(0, lo_open=True)),
    ('model.attention_kind', registry('encoder_jax.models.attention_kinds', 'REGISTRY',
                                      'an attention kind')),
    ('model.dtype', one_of('float32', 'bfloat16')),
    ('model.remat', boolean()),
    ('model.activation', one_of('gelu', 'gelu_new', 'relu')),
    ('model.embedding_size', integer(0)),
    ('model.share_layers', one_of('none', 'all', 'attention', 'ffn')),
    ('model.position_offset', integer(0)),
    ('model.attention_implementation', one_of(None, 'xla', 'cudnn')),
    ('model.mem_len', integer(0)),
    ('model.clamp_len', integer(1, also=(-1,))),
    ('model.position_biased_input', boolean()),
    ('model.max_relative_positions', integer(-1)),
    ('model.position_buckets', integer(0)),
    ('model.share_att_key', boolean()),
    ('model.norm_rel_ebd', boolean()),
    ('model.pos_att_type', one_of('c2p|p2c', 'p2c|c2p', 'c2p', 'p2c', '')),
    ('model.emd_layers', integer(0)),
    # objective
    ('objective.names', sequence_of(registry('encoder_jax.objectives', 'REGISTRY',
                                             'an objective name'))),
    ('objective.mask_rate', number(0, 1, lo_open=True, hi_open=True)),
    ('objective.mask_token_rate', number(0, 1)),
    ('objective.random_token_rate', number(0, 1)),
    ('objective.random_token_distribution', one_of('uniform', 'unigram')),
    ('objective.whole_word_masking', boolean()),
    ('objective.max_ngram', integer(1)),
    ('objective.span_p', number(0, 1, hi_open=True)),
    ('objective.max_span_length', integer(1)),
    ('objective.generator_hidden_fraction', number(0, 1, lo_open=True)),
    ('objective.generator_layers_fraction', number(0, 1, lo_open=True)),
    ('objective.rtd_weight', number(0)),
    ('objective.partial_prediction_k', integer(1)),
    ('objective.bidirectional_data', boolean()),
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


def _heads(c) -> str | None:
  d, h = _get(c, 'model.hidden_size'), _get(c, 'model.num_heads')
  if d and h and d % h:
    return f'config.model.hidden_size={d}: expected a multiple of model.num_heads={h}'
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


def _masking(c) -> str | None:
  mask, rand = _get(c, 'objective.mask_token_rate'), _get(c, 'objective.random_token_rate')
  if mask is not None and rand is not None and mask + rand > 1.0 + 1e-9:
    return (f'config.objective.mask_token_rate={mask} + random_token_rate={rand}: expected a '
            'sum <= 1 (the rest of the selected tokens stay unchanged)')
  return None


def _pairs(c) -> str | None:
  names, kind = _get(c, 'objective.names'), _get(c, 'data.pair_kind')
  types = _get(c, 'model.type_vocab_size')
  pair = [n for n in (names or ()) if n in ('nsp', 'sop')]
  if pair and kind is not None and kind not in ('nsp', 'sop'):
    return (f'config.objective.names={tuple(names)} has {pair[0]!r}, which needs sentence pairs: '
            f"expected config.data.pair_kind 'nsp' or 'sop', got {kind!r}")
  if pair and types is not None and types < 2:
    return (f'config.model.type_vocab_size={types}: expected >= 2 for the pair objective '
            f'{pair[0]!r} (segments A and B)')
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


def _span_objectives(c) -> str | None:
  """SpanBERT's SBO reads MLM's spans; ELECTRA's setup stands alone on its own kind."""
  names, kind = tuple(_get(c, 'objective.names') or ()), _get(c, 'model.kind')
  if 'sbo' in names and 'mlm' not in names:
    return (f"config.objective.names={names} has 'sbo', which predicts the tokens of the "
            "spans 'mlm' masks: expected 'mlm' in the names too")
  if 'electra' in names and len(names) > 1:
    return (f"config.objective.names={names}: 'electra' is a whole pretraining setup "
            "(generator + discriminator) and must stand alone: expected ('electra',)")
  if kind is not None and ('electra' in names) != (kind == 'electra'):
    return (f"config.model.kind={kind!r} with config.objective.names={names}: ELECTRA's "
            "discriminator (kind 'electra') trains with names=('electra',), and only it")
  span_p, ngram = _get(c, 'objective.span_p'), _get(c, 'objective.max_ngram')
  if span_p and ngram is not None and ngram > 1:
    return (f'config.objective.span_p={span_p} (SpanBERT spans) and max_ngram={ngram} (ALBERT '
            'n-grams) select spans two ways: expected one of them off (0 / 1)')
  return None


CROSS_RULES: tuple[Callable[[Any], str | None], ...] = (
    _phases, _warmup, _batch, _heads, _positions, _masking, _pairs, _eval, _mesh, _sources,
    _span_objectives)


def problems(config: ml_collections.ConfigDict) -> list[str]:
  """Every problem found, one message each (naming the key and what was expected)."""
  out, bad_keys = [], set()
  for rule in RULES:
    value = _get(config, rule.key, _MISSING)
    if value is _MISSING:
      continue
    if isinstance(value, list):
      value = tuple(value)
    if not rule.check(value):
      out.append(f'config.{rule.key}={value!r}: expected {rule.describe()}')
      bad_keys.add(rule.key)
  if not bad_keys:  # Cross rules assume each value is in its own range.
    out.extend(m for m in (r(config) for r in CROSS_RULES) if m)
  return out


_MISSING = object()


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError listing every out-of-range value; call before any work."""
  found = problems(config)
  if found:
    raise ConfigError(f'The config has {len(found)} invalid value{"s" * (len(found) > 1)}:\n  '
                      + '\n  '.join(found))
