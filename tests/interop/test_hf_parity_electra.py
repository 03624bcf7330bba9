"""ELECTRA import/export against transformers (PyTorch, CPU): the discriminator (kind
``electra``) as ``ElectraForPreTraining``, the generator (kind ``electra_generator``) as
``ElectraForMaskedLM``; every hidden state and the head logits within 1e-5 in float32.

Randomised models (biases and LayerNorms too, ``hf_fixtures.randomize_``) of three shapes on
padded batches, compared over the non-padding positions: a factorized embedding narrower
than the hidden size (``embeddings_project``), none (E = hidden), and one wider than the
hidden size (the projection narrows, as a generator's does). ``pytest -s`` prints the max
|difference| of every case.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch
import transformers

from encoder_jax.interop import hf
from encoder_jax.interop import registry

from support import hf_fixtures


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ATOL = 1e-5
KINDS = {'electra': transformers.ElectraForPreTraining,
         'electra_generator': transformers.ElectraForMaskedLM}
SHAPES = [
    dict(vocab_size=97, embedding_size=20, hidden_size=36, num_layers=2, num_heads=3,
         intermediate_size=50, max_positions=24, length=11),
    dict(vocab_size=61, embedding_size=30, hidden_size=30, num_layers=3, num_heads=5,
         intermediate_size=37, max_positions=13, length=13),
    dict(vocab_size=131, embedding_size=22, hidden_size=14, num_layers=1, num_heads=1,
         intermediate_size=23, max_positions=11, length=11),
]
SHAPE_IDS = ['e{embedding_size}_h{hidden_size}_a{num_heads}_n{num_layers}'.format(**s)
             for s in SHAPES]

MAX_DIFF: dict[tuple[str, str, str], float] = {}


_print_max_diffs = hf_fixtures.max_diff_printer(MAX_DIFF, 'float32, non-padding positions')


def hf_config(shape) -> transformers.ElectraConfig:
  return transformers.ElectraConfig(
      vocab_size=shape['vocab_size'], embedding_size=shape['embedding_size'],
      hidden_size=shape['hidden_size'], num_hidden_layers=shape['num_layers'],
      num_attention_heads=shape['num_heads'], intermediate_size=shape['intermediate_size'],
      max_position_embeddings=shape['max_positions'], type_vocab_size=2, hidden_act='gelu',
      pad_token_id=0, attn_implementation='eager')


def random_model(cls, shape, seed=0):
  torch.manual_seed(seed)
  return hf_fixtures.randomize_(cls(hf_config(shape)).eval())


def _inputs(shape):
  return hf_fixtures.padded_inputs(shape['vocab_size'], length=shape['length'])


def _ours(config, params, ids, segments, mask):
  return registry.network(config).pretraining.apply({'params': params}, ids, segments, mask,
                                                    collect_hidden=True)


def _theirs(model, ids, segments, mask):
  t = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)
  with torch.no_grad():
    return model(input_ids=t(ids), token_type_ids=t(segments), attention_mask=t(mask),
                 output_hidden_states=True)


def _diff_at(mask, ours, theirs):
  sel = mask.astype(bool)
  return float(np.abs(np.asarray(ours)[sel] - np.asarray(theirs)[sel]).max())


def _compare(kind, mask, ours, theirs) -> float:
  """Every hidden state and the head's logits (RTD [B, L] or MLM [B, L, V]); the max diff."""
  assert len(ours['all_hidden_states']) == len(theirs.hidden_states)
  diffs = [_diff_at(mask, a, b) for a, b in zip(ours['all_hidden_states'], theirs.hidden_states)]
  head = ours['rtd_logits'] if kind == 'electra' else ours['mlm_logits']
  assert head.shape == tuple(theirs.logits.shape)
  diffs.append(_diff_at(mask, head, theirs.logits))
  return max(diffs)


@pytest.mark.parametrize('shape', SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize('kind', sorted(KINDS))
def test_import_matches_transformers(tmp_path, kind, shape):
  model = random_model(KINDS[kind], shape)
  model.save_pretrained(tmp_path)
  config, params, report = hf.load_hf(str(tmp_path))
  assert config.kind == kind and config.embedding_width == shape['embedding_size']
  assert report.initialised_groups == [] and report.ignored_keys == [], report.summary()
  ids, segments, mask = _inputs(shape)
  diff = MAX_DIFF['import', kind, SHAPE_IDS[SHAPES.index(shape)]] = _compare(
      kind, mask, _ours(config, params, ids, segments, mask),
      _theirs(model, ids, segments, mask))
  assert diff < ATOL


def _random_params(config, seed=0):
  """Our own init with every parameter (biases, LayerNorm too) perturbed."""
  params = hf.init_params(config, seed)
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(tree, [(x + 0.2 * rng.standard_normal(x.shape)).astype(np.float32)
                                   for x in leaves])


def _our_config(kind, shape):
  hf_dict = dict(hf_config(shape).to_dict(), architectures=[KINDS[kind].__name__])
  return hf.config_from_hf(hf_dict)


@pytest.mark.parametrize('shape', SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize('kind', sorted(KINDS))
def test_export_loads_in_transformers_with_same_logits(tmp_path, kind, shape):
  config = _our_config(kind, shape)
  assert config.kind == kind
  params = _random_params(config)
  hf.save_hf(str(tmp_path), config, params)
  cls = KINDS[kind]
  with open(tmp_path / 'config.json') as f:
    written = json.load(f)
  assert written['architectures'] == [cls.__name__]
  assert written['embedding_size'] == shape['embedding_size']
  model, info = cls.from_pretrained(str(tmp_path), output_loading_info=True,
                                    attn_implementation='eager')
  model.eval()
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  assert not info['mismatched_keys'] and not info['error_msgs'], info
  ids, segments, mask = _inputs(shape)
  diff = MAX_DIFF['export', kind, SHAPE_IDS[SHAPES.index(shape)]] = _compare(
      kind, mask, _ours(config, params, ids, segments, mask),
      _theirs(model, ids, segments, mask))
  assert diff < ATOL
  if kind == 'electra_generator':  # The tied decoder really is the word embedding.
    np.testing.assert_array_equal(model.get_output_embeddings().weight.detach().numpy(),
                                  params['embeddings']['word_embeddings']['embedding'])
  config2, params2, report = hf.load_hf(str(tmp_path))
  assert config2 == config and report.initialised_groups == [] and not report.ignored_keys
  assert jax.tree.structure(params2) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, params2, params)


@pytest.mark.parametrize('shape', SHAPES[:2], ids=SHAPE_IDS[:2])
def test_exported_discriminator_loads_as_electra_model(tmp_path, shape):
  """Fine-tuning's base: ``ElectraModel`` takes the export's trunk (only the RTD head is
  left over) and computes the same hidden states."""
  config = _our_config('electra', shape)
  params = _random_params(config)
  hf.save_hf(str(tmp_path), config, params)
  model, info = transformers.ElectraModel.from_pretrained(
      str(tmp_path), output_loading_info=True, attn_implementation='eager')
  model.eval()
  assert not info['missing_keys'] and not info['mismatched_keys'], info
  assert all(k.startswith('discriminator_predictions.') for k in info['unexpected_keys']), info
  ids, segments, mask = _inputs(shape)
  ours = _ours(config, params, ids, segments, mask)
  theirs = _theirs(model, ids, segments, mask)
  diff = MAX_DIFF['as_model', 'electra', SHAPE_IDS[SHAPES.index(shape)]] = max(
      _diff_at(mask, a, b) for a, b in zip(ours['all_hidden_states'], theirs.hidden_states))
  assert diff < ATOL


def test_bare_electra_model_imports_with_a_fresh_head(tmp_path):
  shape = SHAPES[0]
  model = random_model(transformers.ElectraModel, shape)
  model.save_pretrained(tmp_path)  # Keys without the 'electra.' prefix.
  config, params, report = hf.load_hf(str(tmp_path))
  assert config.kind == 'electra' and report.initialised_groups == ['rtd_head']
  assert not report.ignored_keys
  ids, segments, mask = _inputs(shape)
  ours = _ours(config, params, ids, segments, mask)
  theirs = _theirs(model, ids, segments, mask)
  assert max(_diff_at(mask, a, b)
             for a, b in zip(ours['all_hidden_states'], theirs.hidden_states)) < ATOL


def test_the_architecture_picks_the_table(tmp_path):
  """Both ELECTRA networks have model_type 'electra': config.json's architecture decides."""
  fields = hf_config(SHAPES[1]).to_dict()
  for arch, kind in [('ElectraForPreTraining', 'electra'), ('ElectraModel', 'electra'),
                     ('ElectraForMaskedLM', 'electra_generator')]:
    config = hf.config_from_hf(dict(fields, architectures=[arch]))
    assert config.kind == kind
    assert config.embedding_size == 0  # E == hidden: no projection (exported as E).
