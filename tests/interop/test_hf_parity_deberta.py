"""DeBERTa import/export against transformers (PyTorch, CPU): ``DebertaForMaskedLM`` (kind
``deberta``, v1) and ``DebertaV2ForMaskedLM`` (kind ``deberta_v2``, the v2/v3 options), the
same hidden states and MLM logits within 1e-5 in float32.

Randomised models (biases and LayerNorms too, ``hf_fixtures.randomize_``) of odd shapes on
padded batches, compared over the non-padding positions. Variants: v1 with distances clipped
at k=4 below the sequence length and absolute positions in the input; v1 as the released
deberta-base (no absolute positions, no segments); v2 as the released v3 (log buckets,
shared keys, LayerNorm-ed relative embeddings, p2c|c2p); v2 with buckets and unshared
position projections, c2p only. ``pytest -s`` prints the max |difference| of every case.
"""

from __future__ import annotations

import json
import logging
import os

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
HF_CLASSES = {'deberta': (transformers.DebertaForMaskedLM, transformers.DebertaModel,
                          transformers.DebertaConfig),
              'deberta_v2': (transformers.DebertaV2ForMaskedLM, transformers.DebertaV2Model,
                             transformers.DebertaV2Config)}
# variant -> (our kind, HF config options).
VARIANTS = {
    'v1_span4': ('deberta', dict(pos_att_type='c2p|p2c', max_relative_positions=4,
                                 position_biased_input=True, type_vocab_size=2)),
    'v1_base': ('deberta', dict(pos_att_type='c2p|p2c', max_relative_positions=-1,
                                position_biased_input=False, type_vocab_size=0)),
    'v3': ('deberta_v2', dict(pos_att_type='p2c|c2p', position_buckets=4, share_att_key=True,
                              norm_rel_ebd='layer_norm', position_biased_input=False,
                              type_vocab_size=0)),
    'v2_c2p': ('deberta_v2', dict(pos_att_type='c2p', position_buckets=6,
                                  max_relative_positions=10, share_att_key=False,
                                  norm_rel_ebd='none', position_biased_input=True,
                                  type_vocab_size=2)),
}
SHAPES = [
    dict(vocab_size=97, hidden_size=36, num_layers=2, num_heads=3, intermediate_size=50,
         max_positions=24, length=11),
    dict(vocab_size=61, hidden_size=30, num_layers=3, num_heads=5, intermediate_size=37,
         max_positions=13, length=13),
    dict(vocab_size=131, hidden_size=14, num_layers=1, num_heads=1, intermediate_size=23,
         max_positions=11, length=11),
]
SHAPE_IDS = ['h{hidden_size}_a{num_heads}_n{num_layers}'.format(**s) for s in SHAPES]
# Every variant, each version on two or three shapes (odd widths, one head, one layer).
IMPORT_CASES = [('v1_span4', 0), ('v1_base', 2), ('v3', 0), ('v3', 1), ('v2_c2p', 2)]
EXPORT_CASES = [('v1_span4', 1), ('v1_base', 2), ('v3', 2), ('v2_c2p', 1)]
# Pooler (ContextPooler) and pair head (SOP option) have no place in the HF MLM models.
OURS_ONLY = ['pooler', 'pair_head']

MAX_DIFF: dict[tuple[str, str, str], float] = {}


_print_max_diffs = hf_fixtures.max_diff_printer(MAX_DIFF, 'float32, non-padding positions')


def hf_config(variant: str, shape: dict, **overrides):
  kind, options = VARIANTS[variant]
  cfg = dict(vocab_size=shape['vocab_size'], hidden_size=shape['hidden_size'],
             num_hidden_layers=shape['num_layers'], num_attention_heads=shape['num_heads'],
             intermediate_size=shape['intermediate_size'],
             max_position_embeddings=shape['max_positions'], relative_attention=True,
             hidden_act='gelu', layer_norm_eps=1e-7, pad_token_id=0,
             attn_implementation='eager', **options)
  cfg.update(overrides)
  return HF_CLASSES[kind][2](**cfg)


def random_hf_model(cls, variant, shape, seed=0, **overrides):
  torch.manual_seed(seed)
  return hf_fixtures.randomize_(cls(hf_config(variant, shape, **overrides)).eval())


def _inputs(shape):
  return hf_fixtures.padded_inputs(shape['vocab_size'], length=shape['length'])


def _ours(config, params, ids, segments, mask):
  apply = jax.jit(registry.network(config).pretraining.apply, static_argnames='collect_hidden')
  return apply({'params': params}, ids, segments, mask, collect_hidden=True)


def _theirs(model, ids, segments, mask):
  t = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)
  with torch.no_grad():
    return model(input_ids=t(ids), attention_mask=t(mask), token_type_ids=t(segments),
                 output_hidden_states=True)


def _diff_at(mask, ours, theirs):
  sel = mask.astype(bool)
  return float(np.abs(np.asarray(ours)[sel] - np.asarray(theirs)[sel]).max())


def _compare(mask, ours, theirs, logits=True) -> float:
  assert len(ours['all_hidden_states']) == len(theirs.hidden_states)
  diffs = [_diff_at(mask, a, b) for a, b in zip(ours['all_hidden_states'], theirs.hidden_states)]
  if logits:
    diffs.append(_diff_at(mask, ours['mlm_logits'], theirs.logits))
  return max(diffs)


def _trunk_and_mlm(params):
  return {k: v for k, v in params.items() if k not in OURS_ONLY}


@pytest.mark.parametrize('variant, shape_index', IMPORT_CASES,
                         ids=[f'{v}-{SHAPE_IDS[i]}' for v, i in IMPORT_CASES])
def test_import_matches_transformers(tmp_path, variant, shape_index):
  shape = SHAPES[shape_index]
  kind = VARIANTS[variant][0]
  model = random_hf_model(HF_CLASSES[kind][0], variant, shape)
  model.save_pretrained(tmp_path)
  config, params, report = hf.load_hf(str(tmp_path))
  assert config.kind == kind and config.emd_layers == 0
  assert report.initialised_groups == OURS_ONLY and report.ignored_keys == [], report.summary()
  ids, segments, mask = _inputs(shape)
  diff = MAX_DIFF['import', variant, SHAPE_IDS[shape_index]] = _compare(
      mask, _ours(config, params, ids, segments, mask), _theirs(model, ids, segments, mask))
  assert diff < ATOL


def _random_params(config, seed=0):
  """Every parameter random (LayerNorm scales near 1), in the shapes of our init (not run:
  compiling an init costs seconds on 2 cores)."""
  rng = np.random.default_rng(seed)
  def draw(path, x):
    noise = 0.2 * rng.standard_normal(x.shape)
    return (1.0 + noise if path[-1].key == 'scale' else noise).astype(np.float32)
  return jax.tree_util.tree_map_with_path(draw, hf.abstract_params(config))


def _our_config(variant, shape, **overrides):
  kind = VARIANTS[variant][0]
  model_type = HF_CLASSES[kind][2].model_type
  return hf.config_from_hf(dict(hf_config(variant, shape).to_dict(), model_type=model_type),
                           **overrides)


def _load_export(tmp_path, kind):
  cls = HF_CLASSES[kind][0]
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['architectures'] == [cls.__name__]
  model, info = cls.from_pretrained(str(tmp_path), output_loading_info=True,
                                    attn_implementation='eager')
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  assert not info['mismatched_keys'] and not info['error_msgs'], info
  return model.eval()


@pytest.mark.parametrize('variant, shape_index', EXPORT_CASES,
                         ids=[f'{v}-{SHAPE_IDS[i]}' for v, i in EXPORT_CASES])
def test_export_loads_in_transformers_with_same_logits(tmp_path, variant, shape_index):
  shape = SHAPES[shape_index]
  config = _our_config(variant, shape)
  params = _random_params(config)
  hf.save_hf(str(tmp_path), config, params, pad_token_id=0)
  model = _load_export(tmp_path, config.kind)
  ids, segments, mask = _inputs(shape)
  diff = MAX_DIFF['export', variant, SHAPE_IDS[shape_index]] = _compare(
      mask, _ours(config, params, ids, segments, mask), _theirs(model, ids, segments, mask))
  assert diff < ATOL
  np.testing.assert_array_equal(model.get_output_embeddings().weight.detach().numpy(),
                                params['embeddings']['word_embeddings']['embedding'])
  # Importing the export gives back our config and every tensor HF holds, bit for bit.
  config2, params2, report = hf.load_hf(str(tmp_path))
  assert config2 == config and report.initialised_groups == OURS_ONLY
  assert not report.ignored_keys
  jax.tree.map(np.testing.assert_array_equal, _trunk_and_mlm(params2), _trunk_and_mlm(params))


@pytest.mark.parametrize('variant', ['v3'])
def test_export_drops_the_enhanced_mask_decoder_with_a_note(tmp_path, caplog, variant):
  """HF has no EMD: the encoder is exact, HF's MLM logits are ours with emd_layers=0."""
  shape = SHAPES[0]
  config = _our_config(variant, shape, emd_layers=2)
  params = _random_params(config)
  with caplog.at_level(logging.WARNING):
    hf.save_hf(str(tmp_path), config, params, pad_token_id=0)
  assert 'no enhanced mask decoder' in caplog.text and 'emd_layers=0' in caplog.text
  model = _load_export(tmp_path, config.kind)
  ids, segments, mask = _inputs(shape)
  theirs = _theirs(model, ids, segments, mask)
  with_emd = _ours(config, params, ids, segments, mask)
  without = _ours(config.replace(emd_layers=0), params, ids, segments, mask)
  # The same encoder in two programs: equal to float32 rounding (an EMD that reached the
  # sequence output would move it by orders more).
  np.testing.assert_allclose(with_emd['sequence_output'], without['sequence_output'],
                             rtol=0, atol=1e-5)
  assert _compare(mask, without, theirs) < ATOL
  assert _diff_at(mask, with_emd['mlm_logits'], theirs.logits) > 1e-2  # The EMD is not in HF.
  config2, _, report = hf.load_hf(str(tmp_path))
  assert config2.emd_layers == 0 and report.initialised_groups == OURS_ONLY
  config3, _, report = hf.load_hf(str(tmp_path), emd_layers=2)
  assert config3 == config and report.initialised_groups == ['emd'] + OURS_ONLY


@pytest.mark.parametrize('kind', sorted(HF_CLASSES))
def test_import_export_import_is_identity(tmp_path, kind):
  variant = 'v1_span4' if kind == 'deberta' else 'v3'
  model = random_hf_model(HF_CLASSES[kind][0], variant, SHAPES[1])
  model.save_pretrained(tmp_path / 'a')
  config, params, _ = hf.load_hf(str(tmp_path / 'a'))
  hf.save_hf(str(tmp_path / 'b'), config, params, pad_token_id=0)
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  original = load_file(str(tmp_path / 'a' / 'model.safetensors'))
  exported = load_file(str(tmp_path / 'b' / 'model.safetensors'))
  assert set(exported) == set(original)
  for k in original:
    np.testing.assert_array_equal(exported[k], original[k], err_msg=k)


def test_bare_model_and_microsoft_head_names_import(tmp_path):
  """``DebertaModel`` (keys without 'deberta.') imports with a fresh MLM head; a
  ``legacy=False`` model (Microsoft's ``lm_predictions.lm_head`` names) imports its head."""
  shape = SHAPES[0]
  bare = random_hf_model(transformers.DebertaModel, 'v1_base', shape)
  bare.save_pretrained(tmp_path / 'bare')
  config, params, report = hf.load_hf(str(tmp_path / 'bare'))
  assert report.initialised_groups == ['mlm_head'] + OURS_ONLY
  ids, segments, mask = _inputs(shape)
  theirs = _theirs(bare, ids, segments, mask)
  diff = MAX_DIFF['bare', 'v1_base', 'DebertaModel'] = _compare(
      mask, _ours(config, params, ids, segments, mask), theirs, logits=False)
  assert diff < ATOL

  msft = random_hf_model(transformers.DebertaV2ForMaskedLM, 'v3', shape, legacy=False)
  msft.save_pretrained(tmp_path / 'msft')
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  assert any(k.startswith('lm_predictions.lm_head.') for k in
             load_file(str(tmp_path / 'msft' / 'model.safetensors')))
  config, params, report = hf.load_hf(str(tmp_path / 'msft'))
  assert report.initialised_groups == OURS_ONLY and not report.ignored_keys
  diff = MAX_DIFF['legacy0', 'v3', 'lm_predictions'] = _compare(
      mask, _ours(config, params, ids, segments, mask), _theirs(msft, ids, segments, mask))
  assert diff < ATOL


def _write_config(path, fields):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(fields, f)


@pytest.mark.parametrize('variant, fields, expected', [
    ('v3', {'conv_kernel_size': 3}, 'conv_kernel_size=3 is not supported'),
    ('v1_base', {'relative_attention': False}, 'relative_attention=False is not supported'),
    ('v1_base', {'talking_head': True}, 'talking_head=True is not supported'),
    ('v3', {'pos_att_type': ['p2c', 'p2p']}, r"only c2p and p2c are supported"),
    ('v3', {'attention_head_size': 5}, 'attention_head_size=5 is not supported'),
], ids=['conv', 'absolute_only', 'talking_head', 'p2p', 'head_size'])
def test_variants_we_do_not_compute_are_refused(tmp_path, variant, fields, expected):
  kind = VARIANTS[variant][0]
  config = hf_config(variant, SHAPES[2]).to_dict()
  config.update(fields, model_type=HF_CLASSES[kind][2].model_type)
  _write_config(tmp_path, config)
  with pytest.raises(ValueError, match=f'config.json: .*{expected}'):
    hf.load_hf(str(tmp_path))

