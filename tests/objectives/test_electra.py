"""ELECTRA: one params tree (shared embeddings stored once), the generator's shape, the
replaced-token-detection labels, where gradients go (none through the sampling), metrics,
FLOPs, the HF import hook and configs/electra_{small,base}.py."""

import importlib.util
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.config import schema as config_base
from encoder_jax import objectives
from encoder_jax.core import length_phases
from encoder_jax.config import validation
from encoder_jax.interop import hf
from encoder_jax.models import electra as electra_models
from encoder_jax.models import registry as models
from encoder_jax.objectives import electra
from encoder_jax.objectives import masking

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ROOT = support.ROOT
V = 60


def _config(**model):
  c = config_base.base_config()
  c.model.update(kind='electra', vocab_size=V, hidden_size=32, num_layers=2, num_heads=2,
                 intermediate_size=40, max_position_embeddings=24, embedding_size=16, **model)
  c.objective.update(names=('electra',), mask_token_rate=0.85, random_token_rate=0.0,
                     generator_hidden_fraction=0.25)
  c.data.pair_kind = 'full_sentences'
  c.train.update(seq_lens=(16,), max_predictions=(4,), phase_fractions=(1.0,))
  return c


def _tables():
  special = np.zeros(V, bool)
  special[:5] = True
  return masking.VocabTables(special, np.ones(V, bool), np.ones(V), mask_id=4)


def _batch(b=4, l=16):
  rng = np.random.RandomState(0)
  ids = rng.randint(5, V, (b, l)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  mask = np.ones((b, l), np.int32)
  mask[1, 10:] = 0
  return dict(input_ids=ids * mask, segment_ids=np.zeros_like(ids), input_mask=mask)


def _setup_and_params(c=None):
  c = c or _config()
  setup = objectives.build(c, _tables())
  return c, setup, nn.unbox(jax.jit(setup.init)(jax.random.key(0)))


def test_one_tree_with_the_embeddings_stored_once():
  _, setup, params = _setup_and_params()
  assert set(params) == {'discriminator', 'generator'}
  disc, gen = params['discriminator'], params['generator']
  assert set(disc) == {'embeddings', 'encoder', 'discriminator_predictions'}
  assert set(disc['embeddings']) == {*electra_models.SHARED_EMBEDDINGS, 'projection'}
  # The generator keeps only its own projection of the shared 16-wide embeddings (16 -> 8).
  assert set(gen) == {'embeddings', 'encoder', 'mlm_head'}
  assert set(gen['embeddings']) == {'projection'}
  assert gen['embeddings']['projection']['kernel'].shape == (16, 8)
  g = setup.generator.config
  assert (g.kind, g.hidden_size, g.num_heads, g.intermediate_size, g.num_layers,
          g.embedding_width) == ('electra_generator', 8, 1, 32, 2, 16)
  # downstream = the discriminator; masked_lm = the generator with the shared embeddings.
  network, downstream = setup.downstream(params)
  assert network.kind.name == 'electra' and downstream is disc
  network, full = setup.masked_lm(params)
  assert network.kind.name == 'electra_generator'
  assert full['embeddings']['word_embeddings'] is disc['embeddings']['word_embeddings']
  assert set(setup.hf_exports(params)) == {'', 'generator'}
  # Each full subtree is exactly its network's own layout.
  for net, tree in (setup.downstream(params), setup.masked_lm(params)):
    shapes = jax.tree.map(np.shape, nn.unbox(jax.eval_shape(net.init, jax.random.key(0))))
    assert jax.tree.map(np.shape, tree) == shapes


def test_replaced_labels_count_a_correct_sample_as_original():
  ids = jnp.array([[2, 10, 11, 12, 13, 3]])
  positions = jnp.array([[1, 3, 4, 0]])
  weights = jnp.array([[1, 1, 1, 0.]])
  sampled = jnp.array([[20, 12, 21, 99]])  # 12 at position 3 is the original token.
  fake, replaced = electra.replace_tokens(ids, positions, weights, sampled)
  np.testing.assert_array_equal(fake, [[2, 20, 11, 12, 21, 3]])  # Padding slot: nowhere.
  np.testing.assert_array_equal(replaced, [[0, 1, 0, 0, 1, 0]])


def test_loss_metrics_and_where_the_gradients_go():
  c, setup, params = _setup_and_params()
  phase = length_phases.phases(c.train)[0]
  batch = _batch()

  def parts(p):
    _, m = setup.loss_fn(p, batch, jax.random.key(1), phase, True)
    return m

  def losses(p):
    m = parts(p)
    return (m['rtd_loss'], m['generator_mlm_loss']), m

  @jax.jit
  def grads(p):  # One forward pass, the gradient of each loss pulled back from it.
    (rtd, _), pull, m = jax.vjp(losses, p, has_aux=True)
    one, zero = jnp.ones_like(rtd), jnp.zeros_like(rtd)
    return m, pull((one, zero))[0], pull((zero, one))[0]

  m, g_rtd, g_mlm = grads(params)
  np.testing.assert_allclose(m['loss'], m['generator_mlm_loss'] + 50.0 * m['rtd_loss'],
                             rtol=1e-6)
  n_tokens = batch['input_mask'].sum()
  assert m['rtd_tokens'] == n_tokens  # Every non-padding token, specials included.
  assert 0 < m['rtd_replaced'] <= m['mlm_predictions']  # Only masked positions change.
  np.testing.assert_allclose(m['replaced_fraction'], m['rtd_replaced'] / n_tokens, rtol=1e-6)
  tp = m['rtd_precision'] * max(m['rtd_predicted_replaced'], 1)
  np.testing.assert_allclose(tp, m['rtd_recall'] * m['rtd_replaced'], atol=1e-4)
  for key in setup.metric_weights.values():  # Evaluation aggregates by these counts.
    assert key in m
  # No gradient through the sampling: RTD reaches the generator only via the shared tables.
  assert not any(np.abs(x).any() for x in jax.tree.leaves(g_rtd['generator']))
  assert np.abs(g_rtd['discriminator']['encoder']['layers']['query']['kernel']).sum() > 0
  # The generator's MLM trains the shared embeddings, not the discriminator's own layers.
  shared = g_mlm['discriminator']['embeddings']
  assert np.abs(shared['word_embeddings']['embedding']).sum() > 0
  assert np.abs(shared['layer_norm']['scale']).sum() > 0
  assert not np.abs(shared['projection']['kernel']).any()
  assert not any(np.abs(x).any() for x in jax.tree.leaves(g_mlm['discriminator']['encoder']))
  assert np.abs(g_mlm['generator']['encoder']['layers']['query']['kernel']).sum() > 0


def test_flops_count_both_networks():
  c = _config()
  setup = objectives.build(c)
  phase = length_phases.phases(c.train)[0]
  s = phase.seq_len
  disc = models.network(c.model).flops_per_token(s) * s
  gen = setup.generator.flops_per_token(s) * s
  assert setup.flops_per_sequence(phase) > disc + gen


def test_report_lines_name_every_metric():
  setup = objectives.build(_config())
  m = dict(generator_mlm_loss=2.0, generator_mlm_accuracy=0.5, mlm_predictions=40.0,
           rtd_loss=0.3, rtd_accuracy=0.9, rtd_precision=0.7, rtd_recall=0.6,
           replaced_fraction=0.12, rtd_tokens=300.0)
  m.update(setup.summarize(m))
  text = '\n'.join(setup.report_lines(m))
  for word in ('Generator MLM', 'accuracy 50.00%', 'perplexity 7.39', 'Discriminator',
               'precision 70.00%', 'recall 60.00%', 'replaced 12.00% of 300 tokens'):
    assert word in text, text


def test_wrong_kind_or_objective_is_a_clear_error():
  c = _config()
  c.model.update(kind='bert', embedding_size=0)
  with pytest.raises(ValueError, match="expected config.model.kind='electra'"):
    objectives.build(c)
  c = _config()
  c.objective.names = ('mlm',)
  with pytest.raises(ValueError,
                     match=r"kind='electra'.*no MLM head.*train 'electra': \['electra'\]"):
    objectives.build(c)
  c = _config()
  c.objective.names = ('electra', 'mlm')
  with pytest.raises(ValueError, match='must stand alone'):
    objectives.build(c)
  c = _config()
  c.objective.generator_hidden_fraction = 0.01
  with pytest.raises(ValueError, match='generator_hidden_fraction=0.01'):
    objectives.build(c)


def test_hf_import_gets_a_generator(tmp_path):
  """An imported discriminator gets the generator exported beside it when its shapes fit,
  else a fresh one (reported)."""
  c, setup, params = _setup_and_params()
  tree, fresh = setup.from_downstream(params['discriminator'], jax.random.key(0))
  assert fresh == ['generator']
  assert jax.tree.map(np.shape, tree) == jax.tree.map(np.shape, params)
  gen_network, gen_params = setup.masked_lm(params)
  hf.save_hf(str(tmp_path / 'generator'), gen_network.config, gen_params)
  assert setup.hf_export_dirs == ('generator',)  # What the import reads beside the model.
  config, exported_params, _ = hf.load_hf(str(tmp_path / 'generator'))
  exported = {'generator': (config, exported_params)}
  tree, fresh = setup.from_downstream(params['discriminator'], jax.random.key(1), exported,
                                      str(tmp_path))
  assert fresh == []
  jax.tree.map(np.testing.assert_array_equal, tree, params)
  other = objectives.build(_config(), _tables())
  other.generator = models.network(electra_models.generator_config(
      other.discriminator.config, 0.5))
  tree, fresh = other.from_downstream(params['discriminator'], jax.random.key(0), exported,
                                      str(tmp_path))
  assert fresh == ['generator']  # Shapes differ from the export: not taken.


def _load(name, arg=None):
  spec = importlib.util.spec_from_file_location('cfg', os.path.join(ROOT, 'configs', name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def test_electra_small_is_the_papers_recipe():
  c = _load('electra_small.py')
  m, o, t = c.model, c.objective, c.train
  assert (m.kind, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size,
          m.embedding_size) == ('electra', 256, 12, 4, 1024, 128)
  assert (o.names, o.generator_hidden_fraction, o.rtd_weight) == (('electra',), 0.25, 50.0)
  assert (o.mask_rate, o.mask_token_rate, o.random_token_rate) == (0.15, 0.85, 0.0)
  assert (t.batch_size, t.num_steps, t.seq_lens) == (128, 1_000_000, (128,))
  assert (c.optim.learning_rate, c.optim.warmup_steps) == (5e-4, 10_000)
  g = objectives.build(c).generator.config
  assert (g.hidden_size, g.num_heads, g.intermediate_size, g.embedding_width) == (64, 1, 256, 128)


def test_electra_base_is_the_papers_recipe():
  c = _load('electra_base.py')
  m, t = c.model, c.train
  assert (m.kind, m.hidden_size, m.num_layers, m.num_heads, m.embedding_size) == (
      'electra', 768, 12, 12, 768)
  assert (t.batch_size, t.num_steps, t.seq_lens) == (256, 766_000, (512,))
  assert c.optim.learning_rate == 2e-4
  g = objectives.build(c).generator.config
  assert (g.hidden_size, g.num_heads, g.intermediate_size) == (256, 4, 1024)  # 1/3.
  for name in ('electra_small.py', 'electra_base.py'):
    local = _load(name, 'runlocal=True')
    assert local.model.kind == 'electra' and local.objective.names == ('electra',)


@pytest.mark.parametrize('changes, expected', [
    (dict(names=('mlm', 'sbo'), kind='electra'), "kind='electra' with config.objective.names"),
    (dict(names=('electra',), kind='bert'), "kind='bert' with config.objective.names"),
    (dict(names=('electra', 'nsp')), "'electra' is a whole pretraining setup"),
    (dict(names=('sbo',), kind='bert'), "has 'sbo'.*expected 'mlm' in the names too"),
], ids=['mlm-on-electra', 'electra-on-bert', 'electra-plus', 'sbo-alone'])
def test_validation_names_the_objective_mistakes_before_any_work(changes, expected):
  c = _config()
  c.objective.names = changes['names']
  c.model.kind = changes.get('kind', 'electra')
  c.data.pair_kind = 'nsp' if 'nsp' in changes['names'] else 'full_sentences'
  found = validation.problems(c)
  assert any(re.search(expected, p) for p in found), found
