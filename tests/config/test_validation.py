"""Config validation: every bad value is refused before any work, naming key and range."""

import glob
import importlib.util
import os

import pytest

from encoder_jax.config import schema as config_base
from encoder_jax.core import fields
from encoder_jax.config import validation

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ROOT = support.ROOT


def _config():
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  return c


def _leaves(tree, prefix=''):
  for k, v in tree.items():
    if hasattr(v, 'items'):
      yield from _leaves(v, f'{prefix}{k}.')
    else:
      yield f'{prefix}{k}'


def test_every_field_is_declared_with_its_range_and_meaning():
  """The config is its declarations: every key a Field (default, range, meaning), every
  default in its own range, and the table lists every key."""
  schema = config_base.schema()
  declared = {fields.key(section, name) for section, fs in schema.items() for name in fs}
  assert sorted(_leaves(config_base.base_config())) == sorted(declared)
  table = config_base.fields_table()
  for section, fs in schema.items():
    for name, f in fs.items():
      key = fields.key(section, name)
      assert f.doc.strip(), f'config.{key} has no meaning declared'
      assert f.default is None or f.ok(f.default), f'config.{key}: default out of range'
      assert f'| `{key}` |' in table


def test_a_sections_api_for_other_configs():
  """Another config (fine-tuning's) declares its sections and is checked by the same code."""
  schema = {'': fields.section(fields.Field('seed', 0, fields.integer(), 'Seed.')),
            'optim': fields.section(
                fields.Field('epochs', 3, fields.integer(1), 'Passes over the data.'),
                fields.Field('policy', 'stop', fields.one_of('stop', 'skip'), 'On NaN.'))}
  c = fields.defaults(schema)
  assert c.to_dict() == {'seed': 0, 'optim': {'epochs': 3, 'policy': 'stop'}}
  assert validation.check_sections(c, schema) == []
  c.optim.epochs, c.optim.policy = 0, 'ignore'
  assert validation.check_sections(c, schema) == [
      'config.optim.epochs=0: expected an integer >= 1',
      "config.optim.policy='ignore': expected one of 'stop', 'skip'"]
  assert validation.check_sections({'seed': True}, schema) == [
      'config.seed=True: expected an integer']
  c.optim.epochs, c.optim.policy = 3, 'skip'
  with pytest.raises(validation.ConfigError, match=r'1 invalid value:\n  odd epochs'):
    validation.validate_sections(c, schema, [lambda c: 'odd epochs' if c.optim.epochs % 2 else
                                             None, lambda c: None])
  with pytest.raises(TypeError, match='declared twice'):
    fields.section(fields.Field('a', 0, fields.integer()), fields.Field('a', 1, fields.integer()))


@pytest.mark.parametrize('path', sorted(glob.glob(os.path.join(ROOT, 'configs', 'bert_*.py'))),
                         ids=os.path.basename)
def test_shipped_configs_are_valid(path):
  spec = importlib.util.spec_from_file_location('config_under_test', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  validation.validate(module.get_config())
  validation.validate(module.get_config('runlocal=True'))


BAD = [  # (key, value, what the message must say after 'config.<key>=<value>: expected')
    ('optim.learning_rate', -1.0, 'a number > 0'),
    ('optim.learning_rate', 0.0, 'a number > 0'),
    ('optim.learning_rate', float('nan'), 'a number > 0'),
    ('model.hidden_dropout_rate', 1.5, r'a number in \[0, 1\)'),
    ('model.attention_dropout_rate', -0.1, r'a number in \[0, 1\)'),
    ('train.log_every_steps', 0, 'an integer >= 1'),
    ('train.batch_size', 0, 'an integer >= 1'),
    ('train.num_steps', 0, 'an integer >= 1'),
    ('train.num_steps', -5, 'an integer >= 1'),
    ('optim.warmup_steps', -1, 'an integer >= 0'),
    ('optim.eps', 0.0, 'a number > 0'),
    ('optim.b1', 1.0, r'a number in \[0, 1\)'),
    ('optim.b2', -0.5, r'a number in \[0, 1\)'),
    ('optim.weight_decay', -0.01, 'a number >= 0'),
    ('optim.grad_clip_norm', -1.0, 'a number >= 0'),
    ('optim.name', 'sgd', "one of 'adamw', 'lamb'"),
    ('objective.mask_rate', 0.0, r'a number in \(0, 1\)'),
    ('objective.mask_rate', 1.0, r'a number in \(0, 1\)'),
    ('objective.mask_token_rate', 1.2, r'a number in \[0, 1\]'),
    ('objective.random_token_distribution', 'zipf', "one of 'uniform', 'unigram'"),
    ('objective.names', ('mlm', 'causal_lm'),
     r"a non-empty tuple, each an objective name, one of \[.*'mlm'"),
    ('train.seq_lens', (64, 4), 'a non-empty tuple, each an integer >= 8'),
    ('train.max_predictions', (0, 20), 'a non-empty tuple, each an integer >= 1'),
    ('train.phase_fractions', (1.5, -0.5), r'a non-empty tuple, each a number in \[0, 1\]'),
    ('train.eval_every_steps', -1, 'an integer >= 0'),
    ('train.nonfinite_policy', 'ignore', "one of 'stop', 'skip'"),
    ('train.dropout_rng_impl', 'philox', "one of 'rbg', 'threefry'"),
    ('checkpoint.every_steps', 0, 'an integer >= 1'),
    ('checkpoint.keep', 0, 'an integer >= 1'),
    ('mesh.data', 0, 'an integer >= 1, or -1'),
    ('model.num_heads', 0, 'an integer >= 1'),
    ('model.layer_norm_eps', 0.0, 'a number > 0'),
    ('model.dtype', 'float16', "one of 'float32', 'bfloat16'"),
    ('model.attention_kind', 'flash', r"an attention kind, one of \[.*'dot_product'"),
    ('data.held_out_fraction', 1.0, r'a number in \[0, 1\)'),
    ('data.mixing_alpha', 0.0, 'a number > 0'),
    ('data.pair_kind', 'triples', r"an example builder, one of \['doc_sentences'"),
    ('data.short_seq_prob', 2.0, r'a number in \[0, 1\]'),
    ('data.shuffle_pool_examples', 0, 'an integer >= 1'),
    ('data.sources', '', 'a non-empty string'),
    ('tokenizer.character_coverage', 0.0, r'a number in \(0, 1\]'),
    ('tokenizer.kind', 'bpe', r"a tokenizer kind, one of \['bytelevel_bpe'"),
    ('model.kind', 'gpt', r"a model kind, one of \['albert', 'bert'"),
    ('model.activation', 'swish', "one of 'gelu', 'gelu_new', 'relu'"),
    ('model.share_layers', 'some', "one of 'none', 'all', 'attention', 'ffn'"),
    ('model.embedding_size', -1, 'an integer >= 0'),
    ('objective.max_ngram', 0, 'an integer >= 1'),
    ('train.seq_lens', (), 'a non-empty tuple'),
]


@pytest.mark.parametrize('key,value,expected', BAD, ids=[f'{k}={v}' for k, v, _ in BAD])
def test_bad_value_is_named_with_its_range(key, value, expected):
  c = _config()
  section, _, name = key.rpartition('.')
  (c[section] if section else c)[name] = value
  with pytest.raises(validation.ConfigError,
                     match=rf'config\.{key}=.*: expected {expected}') as e:
    validation.validate(c)
  assert 'invalid value:' in str(e.value)  # Exactly one problem: nothing else blamed.


CROSS = [  # Values fine one by one, wrong together.
    ({'optim.warmup_steps': 400}, r'config.optim.warmup_steps=400: expected <= '
                                  r'train.num_steps=300'),
    ({'train.batch_size': 30, 'train.grad_accum_steps': 4},
     'batch_size=30: expected a multiple of train.grad_accum_steps=4'),
    ({'objective.names': ('plm',), 'model.kind': 'xlnet', 'data.pair_kind': 'xlnet',
      'model.type_vocab_size': 3, 'objective.bidirectional_data': True,
      'train.batch_size': 30, 'train.grad_accum_steps': 2},
     r'batch_size=30 / grad_accum_steps=2 = 15 rows per step: expected an even number'),
    ({'model.num_heads': 3}, 'hidden_size=128: expected a multiple of model.num_heads=3'),
    ({'train.seq_lens': (64, 256)}, r'seq_lens=\(64, 256\): expected each <= '
                                    r'model.max_position_embeddings - position_offset = 128'),
    ({'train.max_predictions': (10, 200)}, r"expected each <= its phase's seq_len"),
    ({'train.phase_fractions': (0.5, 0.2)}, 'expected fractions summing to 1'),
    ({'train.seq_lens': (64,)}, 'expected one entry per phase'),
    ({'objective.mask_token_rate': 0.8, 'objective.random_token_rate': 0.3},
     'mask_token_rate=0.8 \\+ random_token_rate=0.3: expected a sum <= 1'),
    ({'data.pair_kind': 'full_sentences'},
     "has 'nsp', which reads the examples of config.data.pair_kind 'nsp': got 'full_sentences'"),
    ({'model.type_vocab_size': 1}, 'type_vocab_size=1: expected >= 2'),
    ({'train.eval_batches': 0}, 'eval_batches=0: expected >= 1 while'),
    ({'mesh.data': -1, 'mesh.fsdp': -1}, 'expected at most one axis of -1'),
    ({'mesh.dcn_fsdp': -1}, r'at most one axis of -1 \(= the remaining slices\)'),
    ({'data.sources': 'csv:/x.csv'}, "config.data.sources: 'csv:/x.csv': unknown source kind"),
    ({'model.position_offset': 128}, 'position_offset=128: expected < '),
]


@pytest.mark.parametrize('changes,expected', CROSS, ids=[str(c) for c, _ in CROSS])
def test_values_wrong_together_are_named(changes, expected):
  c = _config()
  for key, value in changes.items():
    section, _, name = key.rpartition('.')
    if name in c[section]:
      c[section][name] = value
  if not all(k.rpartition('.')[2] in c[k.rpartition('.')[0]] for k in changes):
    pytest.skip(f'{changes} names a field this schema does not have yet')
  with pytest.raises(validation.ConfigError, match=expected):
    validation.validate(c)


def test_every_problem_is_listed_at_once_and_disabled_eval_needs_no_batches():
  c = _config()
  c.optim.learning_rate = -1.0
  c.train.batch_size = 0
  c.model.hidden_dropout_rate = 1.5
  with pytest.raises(validation.ConfigError, match='3 invalid values') as e:
    validation.validate(c)
  assert str(e.value).count('\n  config.') == 3
  c = _config()
  c.train.update(eval_every_steps=0, eval_batches=0)
  validation.validate(c)


def test_rules_skip_keys_a_config_does_not_have():
  c = _config()
  del c.model['remat']  # An older schema.
  assert validation.problems(c) == []
