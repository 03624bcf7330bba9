"""EncoderConfig is a typed frozen dataclass: one declaration per config.model field (type,
default, range, meaning), the registry's schema read from it, and a type checker sees it."""

import dataclasses
import os
import pickle
import textwrap
import typing

import pytest

from encoder_jax.models import config as config_lib
from encoder_jax.models import registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(vocab_size=40, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)


def test_the_registry_schema_is_the_dataclass_fields_typed_as_declared():
  declared = dataclasses.fields(config_lib.EncoderConfig)
  schema = registry.model_fields()
  assert [f.name for f in declared] == list(schema)
  hints = typing.get_type_hints(config_lib.EncoderConfig)
  for f in declared:
    assert isinstance(f.default, hints[f.name]), (f.name, hints[f.name], f.default)
    assert schema[f.name].default == f.default and schema[f.name].doc == f.metadata['doc']
  shared = {f.name for f in config_lib.FIELDS}
  owned = [f.name for k in registry.KINDS.values() for f in k.fields]
  # Every field beyond 'kind' and the shared ones is some kind's own, read by that kind.
  assert set(owned) == set(schema) - shared - {'kind'} and not set(owned) & shared


def test_frozen_hashable_equal_by_value_and_picklable():
  c = config_lib.EncoderConfig(**TINY)
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.hidden_size = 16  # type: ignore[misc]
  same = config_lib.EncoderConfig.from_config(dict(TINY))
  assert c == same and hash(c) == hash(same) and {c: 1}[same] == 1
  assert pickle.loads(pickle.dumps(c)) == c
  assert c.replace(num_layers=2) != c and c.replace(num_layers=2).num_layers == 2
  assert c.to_dict()['hidden_size'] == 8 and list(c.to_dict()) == list(registry.model_fields())
  with pytest.raises(TypeError):
    config_lib.EncoderConfig(8)  # type: ignore[misc]  # Keywords only: no field order to rely on.


def test_unknown_fields_range_and_cross_checks_name_the_key():
  with pytest.raises(ValueError, match=r"config.model has unknown fields \['hiden_size'\]"):
    config_lib.EncoderConfig.from_config(dict(TINY, hiden_size=8))
  with pytest.raises(ValueError, match=r"config.model has unknown fields \['heads'\]"):
    config_lib.EncoderConfig(**TINY).replace(heads=4)
  with pytest.raises(ValueError, match=r'config.model.hidden_dropout_rate=1.5: expected a number'):
    config_lib.EncoderConfig(**TINY, hidden_dropout_rate=1.5)
  with pytest.raises(ValueError, match=r'config.model.mem_len=-1: expected an integer >= 0'):
    config_lib.EncoderConfig(**TINY).replace(mem_len=-1)
  with pytest.raises(ValueError, match=r'hidden_size=8: expected a multiple of model.num_heads=3'):
    config_lib.EncoderConfig(**TINY).replace(num_heads=3)
  with pytest.raises(ValueError, match=r"config.model.kind='gpt': expected a model kind"):
    registry.make_config(dict(TINY, kind='gpt'))


def test_a_type_checker_sees_every_field(tmp_path):
  """mypy reads each field's type from the class body: a misspelt field, a wrong type and an
  assignment are errors before anything runs."""
  api = pytest.importorskip('mypy.api')
  snippet = tmp_path / 'uses_config.py'
  snippet.write_text(textwrap.dedent('''\
      from encoder_jax.models import config
      c = config.EncoderConfig(hidden_size=8, num_heads=2)
      reveal_type(c.hidden_size)
      reveal_type(c.attention_implementation)
      reveal_type(c.mem_len)
      reveal_type(c.replace(num_layers=2))
      c.hiden_size
      c.hidden_size = 16
      config.EncoderConfig(hidden_size='8')
      '''))
  out, err, _ = api.run([
      '--follow-imports=skip', '--ignore-missing-imports', '--no-error-summary',
      '--cache-dir', str(tmp_path / 'cache'), str(snippet),
      os.path.join(ROOT, 'encoder_jax', 'models', 'config.py'),
      os.path.join(ROOT, 'encoder_jax', 'core', 'fields.py')])
  found = {int(l.split(':')[1]): l for l in out.splitlines() if l.startswith(str(snippet))}
  expected = {3: 'Revealed type is "int"', 4: 'Revealed type is "str | None"',
              5: 'Revealed type is "int"',
              6: 'Revealed type is "encoder_jax.models.config.EncoderConfig"',
              7: 'has no attribute "hiden_size"', 8: 'read-only',
              9: 'incompatible type "str"; expected "int"'}
  assert sorted(found) == sorted(expected), out + err
  for line, text in expected.items():
    assert text in found[line], found[line]
  # models/config.py itself checks clean: the declared defaults match the declared types.
  assert not [l for l in out.splitlines() if 'models/config.py' in l and 'error' in l], out
