"""Import/export against transformers (PyTorch, CPU): same logits and hidden states."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from encoder_jax.interop import hf
from encoder_jax.models import bert

import hf_fixtures

ATOL = 1e-4

# Odd hidden sizes, head counts, intermediate and vocabulary sizes.
SHAPES = [
    dict(vocab_size=97, hidden_size=36, num_layers=2, num_heads=3, intermediate_size=50),
    dict(vocab_size=61, hidden_size=30, num_layers=3, num_heads=5, intermediate_size=37),
    dict(vocab_size=131, hidden_size=14, num_layers=1, num_heads=1, intermediate_size=23),
]


def _ours(config, params, ids, segments, mask):
  return bert.BertForPreTraining(config).apply({'params': params}, ids, segments, mask,
                                               collect_hidden=True)


def _theirs(model, ids, segments, mask, **kw):
  t = lambda x: torch.tensor(x, dtype=torch.long)
  with torch.no_grad():
    return model(input_ids=t(ids), token_type_ids=t(segments), attention_mask=t(mask),
                 output_hidden_states=True, **kw)


def _close_at(mask, ours, theirs):
  """Max |difference| over the non-padding positions."""
  sel = mask.astype(bool)
  return float(np.abs(np.asarray(ours)[sel] - np.asarray(theirs)[sel]).max())


@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'h{hidden_size}_a{num_heads}'.format(**s))
def test_import_pretraining_matches_transformers(tmp_path, shape):
  model = hf_fixtures.random_hf_model(**shape)
  model.save_pretrained(tmp_path)
  config, params, report = hf.load_hf(str(tmp_path))
  assert report.initialised_groups == [] and report.ignored_keys == []
  ids, segments, mask = hf_fixtures.padded_inputs(shape['vocab_size'])
  ours = _ours(config, params, ids, segments, mask)
  theirs = _theirs(model, ids, segments, mask)
  assert _close_at(mask, ours['mlm_logits'], theirs.prediction_logits) < ATOL
  np.testing.assert_allclose(ours['pair_logits'], theirs.seq_relationship_logits, atol=ATOL)
  assert len(ours['all_hidden_states']) == len(theirs.hidden_states) == shape['num_layers'] + 1
  for a, b in zip(ours['all_hidden_states'], theirs.hidden_states):
    assert _close_at(mask, a, b) < ATOL


def test_import_masked_lm_from_pytorch_bin_with_gamma_beta(tmp_path):
  """An old-style checkpoint: pytorch_model.bin, LayerNorm gamma/beta, no pooler/NSP head."""
  shape = SHAPES[1]
  model = hf_fixtures.random_hf_model(transformers.BertForMaskedLM, **shape)
  model.config.save_pretrained(tmp_path)
  state = {k.replace('LayerNorm.weight', 'LayerNorm.gamma').replace('LayerNorm.bias',
                                                                     'LayerNorm.beta'): v
           for k, v in model.state_dict().items()}
  assert any('gamma' in k for k in state)
  torch.save(state, os.path.join(tmp_path, 'pytorch_model.bin'))
  config, params, report = hf.load_hf(str(tmp_path))
  assert report.initialised_groups == ['pooler', 'pair_head']
  assert 'pooler' in report.summary() and 'pair_head' in report.summary()
  ids, segments, mask = hf_fixtures.padded_inputs(shape['vocab_size'])
  ours = _ours(config, params, ids, segments, mask)
  theirs = _theirs(model, ids, segments, mask)
  assert _close_at(mask, ours['mlm_logits'], theirs.logits) < ATOL


def test_import_bare_bert_model(tmp_path):
  """BertModel saves keys without the 'bert.' prefix and has no pretraining heads."""
  shape = SHAPES[0]
  model = hf_fixtures.random_hf_model(transformers.BertModel, **shape)
  model.save_pretrained(tmp_path)
  config, params, report = hf.load_hf(str(tmp_path))
  assert report.initialised_groups == ['mlm_head', 'pair_head']
  ids, segments, mask = hf_fixtures.padded_inputs(shape['vocab_size'])
  ours = _ours(config, params, ids, segments, mask)
  theirs = _theirs(model, ids, segments, mask)
  assert _close_at(mask, ours['sequence_output'], theirs.last_hidden_state) < ATOL
  np.testing.assert_allclose(ours['pooled_output'], theirs.pooler_output, atol=ATOL)


def _random_params(config, seed=0):
  """Our own init with every parameter (biases, LayerNorm too) randomised."""
  params = hf.init_params(config, seed)
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(tree, [(x + 0.2 * rng.standard_normal(x.shape)).astype(np.float32)
                                   for x in leaves])


@pytest.mark.parametrize('shape', SHAPES[:2], ids=lambda s: f'h{s["hidden_size"]}')
def test_export_loads_in_transformers_with_same_logits(tmp_path, shape):
  config = bert.BertConfig(**shape, max_position_embeddings=24)
  params = _random_params(config)
  hf.save_hf(str(tmp_path), config, params)
  model, info = transformers.BertForPreTraining.from_pretrained(
      str(tmp_path), output_loading_info=True, attn_implementation='eager')
  model.eval()
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  assert not info['mismatched_keys'] and not info['error_msgs'], info
  ids, segments, mask = hf_fixtures.padded_inputs(shape['vocab_size'])
  ours = _ours(config, params, ids, segments, mask)
  theirs = _theirs(model, ids, segments, mask)
  assert _close_at(mask, ours['mlm_logits'], theirs.prediction_logits) < ATOL
  np.testing.assert_allclose(ours['pair_logits'], theirs.seq_relationship_logits, atol=ATOL)
  # The tied decoder really is the word embedding in the loaded model.
  np.testing.assert_array_equal(model.cls.predictions.decoder.weight.detach().numpy(),
                                params['embeddings']['word_embeddings']['embedding'])


def test_import_export_import_is_identity(tmp_path):
  shape = SHAPES[1]
  model = hf_fixtures.random_hf_model(**shape)
  model.save_pretrained(tmp_path / 'a')
  config, params, _ = hf.load_hf(str(tmp_path / 'a'))
  hf.save_hf(str(tmp_path / 'b'), config, params)
  config2, params2, report = hf.load_hf(str(tmp_path / 'b'))
  assert config2 == config and report.initialised_groups == []
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  # The exported tensors are HF's own, bit for bit.
  original = load_file(str(tmp_path / 'a' / 'model.safetensors'))
  exported = load_file(str(tmp_path / 'b' / 'model.safetensors'))
  assert set(exported) == set(original)
  for k in original:
    np.testing.assert_array_equal(exported[k], original[k], err_msg=k)


# ----------------------------------------------------------------------- bad input


def _write_config(path, **fields):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(fields, f)


@pytest.mark.parametrize('fields, expected', [
    (dict(model_type='roberta', architectures=['RobertaForMaskedLM']),
     "model_type='roberta'.*RobertaForMaskedLM.*expected model_type='bert'"),
    (dict(model_type='gpt2', architectures=['GPT2LMHeadModel']),
     "model_type='gpt2'.*GPT2LMHeadModel.*expected model_type='bert'"),
])
def test_other_architectures_are_refused(tmp_path, fields, expected):
  _write_config(tmp_path, **fields)
  with pytest.raises(ValueError, match=expected):
    hf.load_hf(str(tmp_path))


@pytest.mark.parametrize('field, value', [('hidden_act', 'gelu_new'),
                                          ('position_embedding_type', 'relative_key')])
def test_unsupported_bert_variants_are_refused(tmp_path, field, value):
  config = transformers.BertConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=9).to_dict()
  config[field] = value
  _write_config(tmp_path, **config)
  with pytest.raises(ValueError, match=f"{field}='{value}' is not supported"):
    hf.load_hf(str(tmp_path))


def test_missing_directory_and_weights(tmp_path):
  with pytest.raises(FileNotFoundError, match='does not exist'):
    hf.load_hf(str(tmp_path / 'nope'))
  config = transformers.BertConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=9)
  config.save_pretrained(tmp_path)
  with pytest.raises(FileNotFoundError, match='no model.safetensors'):
    hf.load_hf(str(tmp_path))


def test_weights_that_do_not_fit_the_config(tmp_path):
  model = hf_fixtures.random_hf_model(**SHAPES[0])
  model.save_pretrained(tmp_path)
  with open(tmp_path / 'config.json') as f:
    config = json.load(f)
  config['num_hidden_layers'] = 1  # The checkpoint has 2.
  _write_config(tmp_path, **config)
  with pytest.raises(ValueError, match='layer 1.*num_hidden_layers=1'):
    hf.load_hf(str(tmp_path))
  config['num_hidden_layers'], config['hidden_size'], config['num_attention_heads'] = 2, 30, 3
  _write_config(tmp_path, **config)
  with pytest.raises(ValueError, match='shape'):
    hf.load_hf(str(tmp_path))
