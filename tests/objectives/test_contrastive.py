"""The span contrastive objective: halves kept apart, InfoNCE as written, declared limits."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.config import schema as config_base
from encoder_jax import evaluate
from encoder_jax import objectives
from encoder_jax.core import length_phases
from encoder_jax.config import validation
from encoder_jax.objectives import contrastive
from encoder_jax.objectives import masking

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

TINY = dict(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
            max_position_embeddings=20, hidden_dropout_rate=0.0, attention_dropout_rate=0.0,
            rotary=True)


def _config(**model):
  c = config_base.base_config()
  c.model.update(**TINY, **model)
  c.objective.names = ('mlm', 'contrastive')
  c.data.pair_kind = 'full_sentences'
  c.train.update(seq_lens=(12,), max_predictions=(3,), phase_fractions=(1.0,))
  return c


def _built(c):
  """(the setup of ``c`` over a 50-id vocabulary whose first 5 are special, its initial
  params, its phase)."""
  special = np.zeros(50, bool)
  special[:5] = True
  setup = objectives.build(c, masking.VocabTables(special, np.ones(50, bool), np.ones(50),
                                                  mask_id=4))
  params = nn.unbox(jax.jit(setup.init)(jax.random.key(0)))
  return setup, params, length_phases.phases(c.train)[0]


def test_halves_split_each_row_at_the_middle_of_its_tokens():
  mask = np.zeros((3, 8), np.int32)
  mask[0, :8], mask[1, :5], mask[2, :1] = 1, 1, 1
  np.testing.assert_array_equal(contrastive.halves(jnp.asarray(mask)), [
      [1, 1, 1, 1, 2, 2, 2, 2],
      [1, 1, 1, 2, 2, 0, 0, 0],
      [1, 0, 0, 0, 0, 0, 0, 0]])


def test_packed_rows_cut_each_document_in_two_and_pool_each_half():
  documents = np.array([[1, 1, 1, 1, 2, 2, 2, 3, 0], [1, 1, 1, 1, 1, 1, 1, 1, 1]], np.int32)
  spans = contrastive.halves(jnp.asarray(documents > 0), jnp.asarray(documents))
  np.testing.assert_array_equal(spans, [[1, 1, 2, 2, 3, 3, 4, 5, 0],
                                        [1, 1, 1, 1, 1, 2, 2, 2, 2]])
  h = np.random.RandomState(0).randn(2, 9, 3).astype(np.float32)
  (z1, n1), (z2, n2) = contrastive.span_means(jnp.asarray(h), spans, documents=2)
  np.testing.assert_array_equal(n1, [2, 2, 5, 0])
  np.testing.assert_array_equal(n2, [2, 1, 4, 0])
  unit = lambda v: v / np.linalg.norm(v)
  np.testing.assert_allclose(z1[1], unit(h[0, 4:6].mean(0)), rtol=1e-5)  # Row 0, document 2.
  np.testing.assert_allclose(z2[2], unit(h[1, 5:].mean(0)), rtol=1e-5)  # Row 1, document 1.


def test_on_packed_rows_every_text_long_enough_is_a_candidate():
  c = _config()
  c.data.pair_kind = 'packed_documents'
  c.train.update(seq_lens=(16,), max_predictions=(4,))
  assert not validation.problems(c), validation.problems(c)
  setup, params, phase = _built(c)
  ids = np.random.RandomState(1).randint(5, 50, (3, 16)).astype(np.int32)
  # Two texts of 8 tokens a row (both count), then one of 10 and one of 6 (too short).
  docs = np.array([[1] * 8 + [2] * 8, [1] * 8 + [2] * 8, [1] * 10 + [2] * 6], np.int32)
  batch = dict(input_ids=ids, segment_ids=np.zeros_like(ids), input_mask=np.ones_like(ids),
               document_ids=docs)
  loss, metrics = jax.jit(lambda p: setup.loss_fn(p, batch, jax.random.key(2), phase, True))(
      params)
  assert np.isfinite(float(loss)) and float(metrics['contrastive_rows']) == 5


def test_info_nce_is_the_symmetric_cross_entropy_over_the_counted_rows():
  rng = np.random.RandomState(0)
  z1, z2 = rng.randn(5, 4), rng.randn(5, 4)
  weights = np.array([1, 1, 0, 1, 1], np.float32)
  t = 0.5
  loss, accuracy = contrastive.info_nce(jnp.asarray(z1), jnp.asarray(z2), jnp.asarray(weights), t)
  keep = weights > 0
  s = (z1[keep] @ z2[keep].T) / t

  def ce(m):
    m = m - m.max(axis=1, keepdims=True)
    return -np.mean(np.diag(m) - np.log(np.exp(m).sum(axis=1)))

  np.testing.assert_allclose(float(loss), (ce(s) + ce(s.T)) / 2, rtol=1e-5)
  hits = (np.argmax(s, 1) == np.arange(4)).mean() + (np.argmax(s.T, 1) == np.arange(4)).mean()
  np.testing.assert_allclose(float(accuracy), hits / 2, rtol=1e-6)


def test_one_half_never_sees_the_other_and_the_loss_trains():
  """The training pass hands the network the halves as document ids, with which the first
  half's states are the same whatever the second half holds; the loss and its gradient are
  finite, with one encoder pass shared with MLM."""
  c = _config()
  setup, params, phase = _built(c)
  rng = np.random.RandomState(1)
  ids = rng.randint(5, 50, (4, 12)).astype(np.int32)
  batch = dict(input_ids=ids, segment_ids=np.zeros_like(ids), input_mask=np.ones_like(ids))
  split = setup.objectives[1].corrupt(batch, None, phase)['document_ids']
  network = setup.network

  def first_half(ids_BxL):
    out = network.encoder.apply({'params': setup.network_params(params)}, ids_BxL,
                                batch['segment_ids'], batch['input_mask'],
                                document_ids_BxL=split)
    return np.asarray(out['sequence_output'][:, :6])

  changed = ids.copy()
  changed[:, 9] = 7
  np.testing.assert_array_equal(first_half(ids), first_half(changed))
  seen = []

  def record(next_fun, args, kwargs, context):
    if context.method_name == '__call__' and type(context.module).__name__ == 'EncoderWithHeads':
      seen.append(kwargs.get('document_ids_BxL'))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):  # Recorded while tracing: one pass, with the halves.
    (loss, metrics), grads = jax.jit(jax.value_and_grad(
        lambda p: setup.loss_fn(p, batch, jax.random.key(2), phase, True), has_aux=True))(
            params)
  assert len(seen) == 1 and seen[0] is not None
  assert np.isfinite(float(loss)) and float(metrics['contrastive_rows']) == 4
  assert 0.0 <= float(metrics['contrastive_accuracy']) <= 1.0
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


@pytest.mark.parametrize('change,expected', [
    (dict(model=dict(kind='deberta', attention_kind='disentangled', type_vocab_size=0)),
     r"the kind has no attention that keeps the documents of a packed row apart, which "
     r"'contrastive' needs"),
    (dict(model=dict(attention_kind='disentangled', position_biased_input=False)),
     r"config.model.attention_kind='disentangled' reads none"),
    (dict(model=dict(rotary=False)), r'expected config.model.rotary=True'),
    (dict(data=dict(pair_kind='nsp')),
     r"'contrastive', which reads the examples of config.data.pair_kind 'full_sentences' or "
     r"'doc_sentences' or 'packed_documents': got 'nsp'"),
])
def test_settings_it_cannot_train_are_refused_by_name(change, expected):
  c = _config()
  for section, fields in change.items():
    c[section].update(fields)
  assert any(re.search(expected, p) for p in validation.problems(c)), (
      validation.problems(c))


def test_a_learned_position_table_is_taken_when_the_run_starts_from_a_pretrained_model():
  c = _config()
  c.model.rotary = False
  assert any('rotary' in p for p in validation.problems(c))
  c.init.hf_dir = '/a/pretrained/model'  # Its table is trained: the halves reuse its rows.
  assert not any('rotary' in p for p in validation.problems(c)), validation.problems(c)


def test_mlm_is_scored_on_whole_rows_at_bert_masking():
  assert tuple(evaluate.at_bert_masking(_config()).objective.names) == ('mlm',)


def test_alone_it_trains_the_encoder_and_leaves_the_mlm_head_untouched():
  """``names=('contrastive',)``: the loss is the contrastive loss alone (no MLM figure), the
  encoder's layers get a gradient and no parameter of the MLM head does (it is not scored)."""
  c = _config()
  c.objective.names = ('contrastive',)
  assert not validation.problems(c), validation.problems(c)
  setup, params, phase = _built(c)
  ids = np.random.RandomState(3).randint(5, 50, (4, 12)).astype(np.int32)
  batch = dict(input_ids=ids, segment_ids=np.zeros_like(ids), input_mask=np.ones_like(ids))
  (loss, metrics), grads = jax.jit(jax.value_and_grad(
      lambda p: setup.loss_fn(p, batch, jax.random.key(2), phase, True), has_aux=True))(params)
  assert 'mlm_loss' not in metrics
  np.testing.assert_allclose(float(loss), c.objective.contrastive_weight
                             * float(metrics['contrastive_loss']), rtol=1e-6)
  flat = {'/'.join(map(str, k)): np.abs(np.asarray(v)).max()
          for k, v in jax.tree_util.tree_flatten_with_path(grads)[0]}
  head = [k for k in flat if 'mlm' in k.lower()]
  layers = [k for k in flat if 'layer' in k.lower() and k not in head]
  assert head and layers, sorted(flat)
  assert max(flat[k] for k in layers) > 0
  assert all(flat[k] == 0 for k in head), {k: flat[k] for k in head}
