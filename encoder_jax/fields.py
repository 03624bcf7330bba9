"""Config fields declared once, where they are read: name, default, allowed range, meaning.

A registry entry (a model kind in ``models.registry``, an objective in ``objectives``)
declares the fields it reads as :class:`Field` values next to its code. Everything else
derives from those declarations: the config schema (``config_base`` builds
``config.model`` and ``config.objective`` from them), the range checks
(``validation`` turns each field into a rule), :class:`models.config.EncoderConfig` (its
attributes and the checks run when it is built) and the objectives' recipes. Sections that
no registry owns (``train``, ``optim``, ``data``...) keep their rules in ``validation``.

The check builders (:func:`integer`, :func:`number`, :func:`one_of`...) return a
``(check, expected)`` pair: ``check(value) -> bool`` and the text that completes
"expected ..." in the error, so every message names the key and the allowed range.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable, Iterable, Sequence

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
    return f'config.{section}.{self.name}={value!r}: expected {self.expected()}'


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


def registry(module: str, attribute: str, what: str) -> Check:
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
