"""Every config builds (under eval_shape), is locked, and rejects typos clearly."""

import glob
import importlib.util
import os
import runpy
import subprocess
import sys

import jax
import pytest

from encoder_jax.config import schema as config_base
from encoder_jax import data as data_lib
from encoder_jax.core import length_phases
from encoder_jax.core import sharding
from encoder_jax.run import pretraining

import support

ROOT = support.ROOT
PRETRAIN_CONFIGS = sorted(p for kind in ('bert', 'roberta', 'albert', 'xlnet', 'deberta',
                                               'spanbert', 'electra', 'modernbert', 'crammed')
                          for p in glob.glob(os.path.join(ROOT, 'configs', f'{kind}_*.py')))


def _load(path, arg=None):
  spec = importlib.util.spec_from_file_location('cfg', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


# Every config, plus the runlocal variant of those that take it.
VARIANTS = [(p, None) for p in PRETRAIN_CONFIGS] + [
    (p, 'runlocal=True') for p in PRETRAIN_CONFIGS if 'runlocal' in open(p).read()] + [
    (os.path.join(ROOT, 'configs', 'crammed_small.py'), 'contrastive=True')]


@pytest.mark.parametrize('path,arg', VARIANTS,
                         ids=[f'{os.path.basename(p)}:{a or ""}' for p, a in VARIANTS])
def test_config_builds_under_eval_shape(path, arg):
  c = _load(path, arg)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  state = pretraining.pieces(c, mesh).abstract_state()  # The batch checked against the mesh too.
  n = sum(x.size for x in jax.tree.leaves(state.params))
  assert n > 0
  assert length_phases.phases(c.train)[-1].end_step == c.train.num_steps
  if arg == 'contrastive=True':
    assert tuple(c.objective.names) == ('mlm', 'contrastive')


@pytest.mark.parametrize('name', ['bert_base.py', 'bert_large.py', 'roberta_base.py',
                                  'albert_base.py', 'xlnet_base.py'])
def test_runlocal_variant_prepares_the_embedded_corpus(name, tmp_path):
  c = _load(os.path.join(ROOT, 'configs', name), 'runlocal=True')
  c.data.prepared_dir = str(tmp_path / 'prepared')
  # Tokenized in this process: a pool of spawned workers (each a Python start) would give the
  # same shards (tests/data/test_preparation.py::test_workers_give_identical_shards).
  c.data.num_workers = 1
  prepared = data_lib.load_or_prepare(c)
  assert prepared.tokenizer.vocab_size == c.model.vocab_size
  assert prepared.tokenizer.kind == c.tokenizer.kind
  if c.model.position_offset:  # RoBERTa: positions are numbered from the pad id + 1.
    assert prepared.tokenizer.pad_id == c.model.position_offset - 1
  assert c.model.dtype == 'float32'  # bf16 is for accelerators; runlocal is for CPUs.


def test_bert_base_is_the_papers_recipe():
  c = _load(os.path.join(ROOT, 'configs', 'bert_base.py'))
  assert (c.model.num_layers, c.model.hidden_size, c.model.num_heads) == (12, 768, 12)
  assert c.train.batch_size == 256 and c.train.num_steps == 1_000_000
  ph = length_phases.phases(c.train)
  assert [(p.seq_len, p.max_predictions, p.end_step - p.start_step) for p in ph] == [
      (128, 20, 900_000), (512, 80, 100_000)]
  assert (c.optim.learning_rate, c.optim.warmup_steps, c.optim.eps) == (1e-4, 10_000, 1e-6)
  assert c.model.dtype == 'bfloat16' and c.objective.names == ('mlm', 'nsp')


def test_roberta_base_is_the_papers_recipe():
  c = _load(os.path.join(ROOT, 'configs', 'roberta_base.py'))
  assert (c.model.kind, c.model.vocab_size, c.model.max_position_embeddings,
          c.model.position_offset, c.model.type_vocab_size, c.model.layer_norm_eps) == (
              'roberta', 50265, 514, 2, 1, 1e-5)
  assert c.tokenizer.kind == 'bytelevel_bpe' and c.objective.names == ('mlm',)
  assert c.data.pair_kind == 'full_sentences'
  assert (c.train.batch_size, c.train.num_steps) == (8192, 500_000)
  assert [(p.seq_len, p.end_step - p.start_step) for p in length_phases.phases(c.train)] == [
      (512, 500_000)]
  o = c.optim
  assert (o.name, o.learning_rate, o.warmup_steps, o.b1, o.b2, o.eps, o.weight_decay) == (
      'adamw', 6e-4, 24_000, 0.9, 0.98, 1e-6, 0.01)


def test_albert_base_is_the_papers_recipe():
  c = _load(os.path.join(ROOT, 'configs', 'albert_base.py'))
  m = c.model
  assert (m.kind, m.vocab_size, m.embedding_size, m.hidden_size, m.num_layers,
          m.share_layers, m.activation, m.hidden_dropout_rate, m.attention_dropout_rate) == (
              'albert', 30000, 128, 768, 12, 'all', 'gelu_new', 0.0, 0.0)
  assert c.objective.names == ('mlm', 'sop') and c.data.pair_kind == 'sop'
  assert c.objective.max_ngram == 3 and c.objective.whole_word_masking
  assert (c.train.batch_size, c.train.num_steps, c.train.seq_lens) == (4096, 125_000, (512,))
  assert (c.optim.name, c.optim.learning_rate) == ('lamb', 0.00176)


def test_xlnet_large_is_the_papers_recipe():
  c = _load(os.path.join(ROOT, 'configs', 'xlnet_large.py'))
  m, o = c.model, c.optim
  assert (m.kind, m.vocab_size, m.num_layers, m.hidden_size, m.num_heads,
          m.intermediate_size) == ('xlnet', 32000, 24, 1024, 16, 4096)
  assert c.objective.names == ('plm',) and c.data.pair_kind == 'xlnet'
  assert (c.objective.partial_prediction_k, c.objective.max_ngram) == (6, 5)
  assert c.objective.bidirectional_data
  assert (c.train.batch_size, c.train.num_steps) == (8192, 500_000)
  assert [(p.seq_len, p.max_predictions) for p in length_phases.phases(c.train)] == [(512, 85)]
  assert (o.name, o.learning_rate, o.warmup_steps, o.eps, o.weight_decay) == (
      'adamw', 4e-4, 40_000, 1e-6, 0.01)


def test_unknown_config_argument_is_rejected():
  with pytest.raises(ValueError, match="Unknown config argument 'runlokal'"):
    _load(os.path.join(ROOT, 'configs', 'bert_base.py'), 'runlokal=True')


def test_misspelled_override_fails_clearly():
  """One line naming the key and the nearest field, exit status 2, before any work."""
  out = subprocess.run(
      [sys.executable, '-m', 'encoder_jax.main', '--config=configs/bert_small.py',
       '--workdir=/tmp/never_used', '--config.model.hiden_size=64'],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.splitlines() == [
      "error: --config.model.hiden_size: config.model has no field 'hiden_size'; nearest: "
      'config.model.hidden_size']


# Every command line that takes --config: a config it reads, a misspelled key, the nearest.
CONFIG_COMMANDS = [
    ('encoder_jax.main', 'bert_small.py', 'train.batch_sise', 'config.train.batch_size'),
    ('encoder_jax.prepare', 'bert_small.py', 'data.mixing_alpa', 'config.data.mixing_alpha'),
    ('encoder_jax.evaluate', 'bert_small.py', 'modle.vocab_size', 'config.model'),
    ('encoder_jax.embed', 'bert_small.py', 'model.hiden_size', 'config.model.hidden_size'),
    ('encoder_jax.fill_mask', 'bert_small.py', 'tokenizer.knd', 'config.tokenizer.kind'),
    ('encoder_jax.convert', 'roberta_base.py', 'optim.warmup', 'config.optim.warmup_steps'),
    ('encoder_jax.finetune.main', 'finetune_sst2.py', 'optim.learning_rat',
     'config.optim.learning_rate'),
    ('encoder_jax.compile', 'bert_base.py', 'model.remmat', 'config.model.remat'),
    ('encoder_jax.show_masks', 'chinese_bert_small.py', 'data.word_segmentr',
     'config.data.word_segmenter'),
]


def test_every_command_with_a_config_flag_is_listed():
  """A command line that takes --config without this check fails here."""
  found = set()
  for path in glob.glob(os.path.join(ROOT, 'encoder_jax', '**', '*.py'), recursive=True):
    source = open(path, encoding='utf-8').read()
    if "DEFINE_config_file('config'" in source or 'cli.define_source_flags()' in source:
      found.add(os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.'))
  assert found - {'encoder_jax.cli'} == {m for m, *_ in CONFIG_COMMANDS}


@pytest.mark.parametrize('module,config,key,nearest', CONFIG_COMMANDS,
                         ids=[m for m, *_ in CONFIG_COMMANDS])
def test_unknown_override_is_one_line_in_every_command(module, config, key, nearest,
                                                       monkeypatch, capsys):
  """Each command as ``python -m`` runs it, in this process: the flags fail to parse, so
  the command's main (and any JAX work) never starts."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  before = set(flags.FLAGS)
  monkeypatch.setattr(sys, 'argv', [module, f'--config={ROOT}/configs/{config}',
                                    f'--config.{key}=1'])
  try:
    with pytest.raises(SystemExit) as e:
      runpy.run_module(module, run_name='__main__')
  finally:
    for name in set(flags.FLAGS) - before:  # The command's flags, defined again next time.
      delattr(flags.FLAGS, name)
  owner = nearest.rpartition('.')[0]
  missing = key.split('.')[nearest.count('.') - 1]
  assert e.value.code == 2
  assert capsys.readouterr().err.splitlines() == [
      f'error: --config.{key}: {owner} has no field {missing!r}; nearest: {nearest}']


def test_phase_fractions_must_sum_to_one():
  c = config_base.base_config()
  c.train.phase_fractions = (0.5, 0.4)
  with pytest.raises(ValueError, match='phase_fractions'):
    length_phases.phases(c.train)


@pytest.mark.parametrize('arg', ['', 'version=2', 'sop=True', 'version=2,runlocal=True'])
def test_deberta_base_is_the_papers_recipe(arg):
  c = _load(os.path.join(ROOT, 'configs', 'deberta_base.py'), arg)
  m = c.model
  assert (m.num_layers, m.hidden_size, m.num_heads, m.attention_kind) == (
      (2, 128, 2, 'disentangled') if 'runlocal' in arg else (12, 768, 12, 'disentangled'))
  assert (m.position_biased_input, m.emd_layers, m.pos_att_type) == (False, 2, 'c2p|p2c')
  assert c.objective.whole_word_masking
  if 'version=2' in arg:
    assert (m.kind, m.share_att_key, m.norm_rel_ebd) == ('deberta_v2', True, True)
    assert m.position_buckets == (32 if 'runlocal' in arg else 256)
  else:
    assert (m.kind, m.position_buckets, m.max_relative_positions, m.max_position_embeddings) == (
        'deberta', 0, -1, 512)  # k = 512.
  if 'sop' in arg:
    assert c.objective.names == ('mlm', 'sop') and m.type_vocab_size == 2
  else:
    assert c.objective.names == ('mlm',) and m.type_vocab_size == 0
  if 'runlocal' not in arg:
    assert (c.train.batch_size, c.train.num_steps, c.optim.learning_rate) == (2048, 1_000_000, 2e-4)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  params = pretraining.pieces(c, mesh).abstract_state().params
  assert sum(x.size for x in jax.tree.leaves(params)) > 0
