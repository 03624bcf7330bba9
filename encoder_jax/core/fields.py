"""Config fields declared once, where they are read: name, default, allowed range, meaning.

Every config value is a :class:`Field`. A registry entry (an objective in ``objectives``,
a fine-tuning task) declares the fields it reads next to its code; ``config.model``'s are the
typed fields of :class:`models.config.EncoderConfig`, which records one :class:`Field` per
attribute; the sections no registry owns are declared beside the code that reads them
(``config_base``: ``train``, ``optim``, ``mesh``, ``checkpoint``, the top level;
``data.config``: ``data`` and ``tokenizer``). A *schema* maps each section name ('' for the
top level) to its fields (:func:`section`), and everything else derives from it: the config
at its defaults (:func:`defaults`), every range check (:func:`problems`, run by
``validation``, and when an ``EncoderConfig`` is built), the table of every field
(:func:`table`) and the objectives' recipes. Another
config (fine-tuning's) declares its sections the same way and is checked by the same code.

The check builders (:func:`integer`, :func:`number`, :func:`one_of`, :func:`names`...)
return a ``(check, expected)`` pair: ``check(value) -> bool`` and the text that completes
"expected ..." in the error, so every message names the key and the allowed range.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import ml_collections

Check = tuple[Callable[[Any], bool], 'str | Callable[[], str]']


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: ``<section>.<name>``, its default, its allowed values and meaning."""
  name: str
  default: Any
  spec: Check
  doc: str = ''

  def ok(self, value) -> bool:
    return self.spec[0](tuple(value) if isinstance(value, list) else value)

  def expected(self) -> str:
    text = self.spec[1]
    return text() if callable(text) else text

  def problem(self, section: str, value) -> str | None:
    """The error message for ``value``, or None when it is in range."""
    if self.ok(value):
      return None
    return f'config.{key(section, self.name)}={value!r}: expected {self.expected()}'


# A config's declaration: section name ('' = the top level) -> its fields by name.
Schema = Mapping[str, Mapping[str, Field]]


def key(section: str, name: str) -> str:
  """The dotted key of a field, without 'config.' (a top-level field has no section)."""
  return f'{section}.{name}' if section else name


def section(*declared: Field) -> dict[str, Field]:
  """A config section: its fields by name, in declaration order (one name, one field)."""
  return merge([declared], 'section')


def defaults(schema: Schema) -> ml_collections.ConfigDict:
  """The config a schema declares, at its defaults: the top-level fields, then one
  ConfigDict per section (a None default is a typed placeholder the command line can set)."""
  def value(f: Field):
    return ml_collections.config_dict.placeholder(str) if f.default is None else f.default
  c = ml_collections.ConfigDict()
  for name, declared in schema.items():
    if name:
      c[name] = ml_collections.ConfigDict({n: value(f) for n, f in declared.items()})
    else:
      for n, f in declared.items():
        c[n] = value(f)
  return c


_MISSING = object()


def lookup(config, dotted: str, default=None):
  """``config.<dotted>``, or ``default`` when a part is absent."""
  node = config
  for part in dotted.split('.'):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
      return default
    node = node[part]
  return node


def problems(config, schema: Schema) -> list[str]:
  """One message per value of ``config`` out of its declared range, naming the key and the
  range. A field the config does not have is skipped (a config from before it existed)."""
  out = []
  for name, declared in schema.items():
    for f in declared.values():
      value = lookup(config, key(name, f.name), _MISSING)
      if value is not _MISSING:
        found = f.problem(name, tuple(value) if isinstance(value, list) else value)
        out.extend([found] if found else [])
  return out


def table(schema: Schema) -> str:
  """Every field of a schema as Markdown: key, default, allowed values, meaning."""
  rows = ['| key | default | allowed | meaning |', '|---|---|---|---|']
  for name, declared in schema.items():
    for f in declared.values():
      rows.append(f'| `{key(name, f.name)}` | `{f.default!r}` | {f.expected()} | {f.doc} |')
  return '\n'.join(rows)


def merge(groups: Iterable[Sequence[Field]], section: str) -> dict[str, Field]:
  """One field per name from several registry entries (an entry may share another's field
  object, e.g. the masking recipe of MLM and ELECTRA); two different declarations of one
  name are a programming error, named here."""
  out: dict[str, Field] = {}
  for group in groups:
    for f in group:
      if f.name in out and out[f.name] != f:
        raise TypeError(f'config.{section}.{f.name} is declared twice, differently: '
                        f'{out[f.name]} and {f}')
      out[f.name] = f
  return out


# ---- value checks: each returns (check, expected) ----


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def integer(lo: int | None = None, also: Sequence[int] = ()) -> Check:
  """An int >= lo (or one of ``also``, e.g. -1 for 'all remaining devices')."""
  text = 'an integer' + (f' >= {lo}' if lo is not None else '')
  text += ''.join(f', or {a}' for a in also)
  return (lambda v: _is_int(v) and (v in also or lo is None or v >= lo)), text


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
           hi_open: bool = False) -> Check:
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


def one_of(*values) -> Check:
  return (lambda v: v in values), 'one of ' + ', '.join(repr(v) for v in values)


def names(source: Callable[[], Iterable[str]], what: str) -> Check:
  """A name among ``source()`` (a registry's keys, read when checked: it may fill in as
  modules import), e.g. ``names(lambda: KINDS, 'a model kind')``."""
  def check(v):
    return isinstance(v, str) and bool(v) and v in source()
  return check, lambda: f'{what}, one of {sorted(source())}'


def boolean() -> Check:
  return (lambda v: isinstance(v, bool)), 'True or False'


def string(non_empty: bool = False) -> Check:
  return ((lambda v: isinstance(v, str) and (bool(v.strip()) or not non_empty)),
          'a non-empty string' if non_empty else 'a string')


def sequence_of(item: Check) -> Check:
  check, text = item
  def expected():
    return f'a non-empty tuple, each {text() if callable(text) else text}'
  return (lambda v: isinstance(v, tuple) and len(v) > 0 and all(check(x) for x in v)), expected


# ---- command-line flags: one per field, declared by the field ----


def define_flags(declared: Iterable[Field], flag_values=None) -> None:
  """An absl flag ``--<name>`` per field: its default the field's, its type the default's
  (bool, int, float, str; a tuple: a comma-separated list), its help the field's meaning.
  The values are checked where the config is (:func:`problems`), not by the flag."""
  from absl import flags  # pylint: disable=g-import-not-at-top  (only commands need absl)
  flag_values = flags.FLAGS if flag_values is None else flag_values
  for f in declared:
    define = (flags.DEFINE_bool if isinstance(f.default, bool) else
              flags.DEFINE_integer if isinstance(f.default, int) else
              flags.DEFINE_float if isinstance(f.default, float) else
              flags.DEFINE_list if isinstance(f.default, tuple) else flags.DEFINE_string)
    default = list(f.default) if isinstance(f.default, tuple) else f.default
    define(f.name, default, f'{f.doc} Expected: {f.expected()}.', flag_values=flag_values)


def flag_values(declared: Iterable[Field], flag_values_=None) -> dict[str, Any]:
  """The fields' values from their flags (:func:`define_flags`), as a config holds them
  (a list flag as a tuple), by name."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  values = flags.FLAGS if flag_values_ is None else flag_values_
  return {f.name: tuple(values[f.name].value) if isinstance(f.default, tuple)
          else values[f.name].value for f in declared}
