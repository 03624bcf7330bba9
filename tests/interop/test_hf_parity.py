"""Import/export against transformers (PyTorch, CPU) for every kind with a Hugging Face
table: the same hidden states and head logits, within 1e-5 in float32.

Every case runs randomised models (biases and LayerNorms too) of odd shapes on padded
batches, compared over the non-padding positions. The max |difference| of each case is
recorded in ``MAX_DIFF`` and printed at the end of the module (``pytest -s``), so the
figures can be reported.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from encoder_jax.config import schema as config_base
from encoder_jax.interop import hf
from encoder_jax.interop import registry

from support import hf_fixtures


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ATOL = 1e-5
# ModernBERT: GeGLU, rotary and pre-LN on random weights of std 0.2 give larger activations
# (logits ~30): agreement within 1e-4 (measured ~1e-5).
ATOLS = {'modernbert': 1e-4}
KINDS = ('bert', 'roberta', 'albert', 'modernbert')
ONE_SEGMENT = ('roberta', 'modernbert')  # No token types: the HF model takes none.
PAD_IDS = hf_fixtures.PAD_IDS

# Odd hidden sizes, head counts, intermediate and vocabulary sizes; ``length`` is the
# padded input length (the last two fill the position table exactly: RoBERTa's table then
# has length + 2 rows and its last row is used). ALBERT's embedding width is hidden/2 + 1.
SHAPES = [
    dict(vocab_size=97, hidden_size=36, num_layers=2, num_heads=3, intermediate_size=50,
         max_positions=24, length=11),
    dict(vocab_size=61, hidden_size=30, num_layers=3, num_heads=5, intermediate_size=37,
         max_positions=13, length=13),
    dict(vocab_size=131, hidden_size=14, num_layers=1, num_heads=1, intermediate_size=23,
         max_positions=11, length=11),
]
SHAPE_IDS = ['h{hidden_size}_a{num_heads}_n{num_layers}'.format(**s) for s in SHAPES]

# (test, kind, shape id) -> max |ours - transformers| over everything the case compared.
MAX_DIFF: dict[tuple[str, str, str], float] = {}


_print_max_diffs = hf_fixtures.max_diff_printer(MAX_DIFF, 'float32, non-padding positions')


def _model_shape(shape):
  return {k: v for k, v in shape.items() if k != 'length'}


def _inputs(kind, shape):
  return hf_fixtures.padded_inputs(shape['vocab_size'], length=shape['length'],
                                   pad_id=PAD_IDS[kind])


def _ours(config, params, ids, segments, mask):
  """Our pretraining network; RoBERTa gets the pair segment ids too (it must ignore them)."""
  return registry.network(config).pretraining.apply(
      {'params': params}, ids, segments, mask, collect_hidden=True)


def _theirs(model, kind, ids, segments, mask):
  t = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)
  kw = {} if kind in ONE_SEGMENT else {'token_type_ids': t(segments)}
  with torch.no_grad():
    return model(input_ids=t(ids), attention_mask=t(mask), output_hidden_states=True, **kw)


def _diff_at(mask, ours, theirs):
  """Max |difference| over the non-padding positions."""
  sel = mask.astype(bool)
  return float(np.abs(np.asarray(ours)[sel] - np.asarray(theirs)[sel]).max())


def _diff(ours, theirs):
  return float(np.abs(np.asarray(ours) - np.asarray(theirs)).max())


def _pair_logits(kind, out):
  return out.sop_logits if kind == 'albert' else out.seq_relationship_logits


def _hidden_diffs(kind, mask, ours, theirs) -> list[float]:
  """Every hidden state. ModernBERT's last one is after its final LayerNorm (ours collects
  the last layer's output, and the final LayerNorm's is the sequence output)."""
  assert len(ours['all_hidden_states']) == len(theirs.hidden_states)
  collected = list(ours['all_hidden_states'])
  if kind == 'modernbert':
    collected[-1] = ours['sequence_output']
  return [_diff_at(mask, a, b) for a, b in zip(collected, theirs.hidden_states)]


def _compare_pretraining(kind, mask, ours, theirs) -> float:
  """Every hidden state, the MLM logits and (BERT, ALBERT) the pair logits; the max diff."""
  diffs = _hidden_diffs(kind, mask, ours, theirs)
  mlm = theirs.logits if kind in ONE_SEGMENT else theirs.prediction_logits
  diffs.append(_diff_at(mask, ours['mlm_logits'], mlm))
  if kind in ONE_SEGMENT:
    assert 'pair_logits' not in ours and 'pooled_output' not in ours
  else:
    diffs.append(_diff(ours['pair_logits'], _pair_logits(kind, theirs)))
  return max(diffs)


@pytest.mark.parametrize('shape', SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize('kind', KINDS)
def test_import_matches_transformers(tmp_path, kind, shape):
  model = hf_fixtures.random_hf_model(hf_fixtures.HF_CLASSES[kind][0], **_model_shape(shape))
  model.save_pretrained(tmp_path)
  config, params, report = hf.load_hf(str(tmp_path))
  assert config.kind == kind
  assert report.initialised_groups == [] and report.ignored_keys == [], report.summary()
  ids, segments, mask = _inputs(kind, shape)
  ours = _ours(config, params, ids, segments, mask)
  theirs = _theirs(model, kind, ids, segments, mask)
  assert len(ours['all_hidden_states']) == shape['num_layers'] + 1
  diff = MAX_DIFF['import', kind, SHAPE_IDS[SHAPES.index(shape)]] = _compare_pretraining(
      kind, mask, ours, theirs)
  assert diff < ATOLS.get(kind, ATOL)


# (kind, HF class without some heads, the groups our import must report as fresh).
PARTIAL = [
    ('bert', transformers.BertModel, ['mlm_head', 'pair_head']),
    ('roberta', transformers.RobertaModel, ['mlm_head']),
    ('albert', transformers.AlbertForMaskedLM, ['pooler', 'pair_head']),
    ('albert', transformers.AlbertModel, ['mlm_head', 'pair_head']),
    ('modernbert', transformers.ModernBertModel, ['mlm_head']),
]  # BertForMaskedLM: test_import_masked_lm_from_pytorch_bin_with_gamma_beta.


@pytest.mark.parametrize('kind, cls, fresh', PARTIAL, ids=[c.__name__ for _, c, _ in PARTIAL])
def test_import_reports_initialised_heads(tmp_path, kind, cls, fresh):
  """Bare base models (saved without the ``bert.``/``roberta.``/``albert.`` prefix) and
  MaskedLM variants import; the heads they lack are freshly initialised and reported."""
  shape = SHAPES[0]
  model = hf_fixtures.random_hf_model(cls, **_model_shape(shape))
  model.save_pretrained(tmp_path)
  config, params, report = hf.load_hf(str(tmp_path))
  assert report.initialised_groups == fresh
  assert all(g in report.summary() for g in fresh)
  # RobertaModel has a pooler that RobertaForMaskedLM (and our RoBERTa) does not.
  assert all(k.startswith('roberta.pooler.') for k in report.ignored_keys), report.ignored_keys
  ids, segments, mask = _inputs(kind, shape)
  ours = _ours(config, params, ids, segments, mask)
  theirs = _theirs(model, kind, ids, segments, mask)
  diffs = _hidden_diffs(kind, mask, ours, theirs)
  if 'mlm_head' not in fresh:
    diffs.append(_diff_at(mask, ours['mlm_logits'], theirs.logits))
  if 'pooler' not in fresh and kind not in ONE_SEGMENT:
    diffs.append(_diff(ours['pooled_output'], theirs.pooler_output))
  diff = MAX_DIFF['partial', kind, cls.__name__] = max(diffs)
  assert diff < ATOLS.get(kind, ATOL)


def test_import_masked_lm_from_pytorch_bin_with_gamma_beta(tmp_path):
  """An old-style checkpoint: pytorch_model.bin, LayerNorm gamma/beta, no pooler/NSP head."""
  shape = SHAPES[1]
  model = hf_fixtures.random_hf_model(transformers.BertForMaskedLM, **_model_shape(shape))
  model.config.save_pretrained(tmp_path)
  state = {k.replace('LayerNorm.weight', 'LayerNorm.gamma').replace('LayerNorm.bias',
                                                                     'LayerNorm.beta'): v
           for k, v in model.state_dict().items()}
  assert any('gamma' in k for k in state)
  torch.save(state, os.path.join(tmp_path, 'pytorch_model.bin'))
  config, params, report = hf.load_hf(str(tmp_path))
  assert report.initialised_groups == ['pooler', 'pair_head']
  assert 'pooler' in report.summary() and 'pair_head' in report.summary()
  ids, segments, mask = _inputs('bert', shape)
  ours = _ours(config, params, ids, segments, mask)
  theirs = _theirs(model, 'bert', ids, segments, mask)
  diff = MAX_DIFF['partial', 'bert', 'BertForMaskedLM'] = _diff_at(mask, ours['mlm_logits'],
                                                                   theirs.logits)
  assert diff < ATOL


def _random_params(config, seed=0):
  """Our own init with every parameter (biases, LayerNorm too) perturbed; but the unused
  first slot of ModernBERT's stacked attention LayerNorm (its layer 0 has none) keeps the
  value an import gives it (ones), so that export -> import is the identity."""
  params = hf.init_params(config, seed)
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  params = jax.tree.unflatten(tree, [(x + 0.2 * rng.standard_normal(x.shape)).astype(np.float32)
                                     for x in leaves])
  if not config.first_attention_norm:
    params['encoder']['layers']['attention_layer_norm']['scale'][0] = 1.0
  return params


def _our_config(kind, shape):
  """Our config of ``kind`` at ``shape``, with the kind's conventions (RoBERTa's position
  offset and eps, ALBERT's factorized embedding, sharing and activation)."""
  hf_config = hf_fixtures.hf_config(kind, **_model_shape(shape)).to_dict()
  return hf.config_from_hf(dict(hf_config, model_type=kind))


def _check_export(tmp_path, kind, config, shape, case):
  """``config`` with random params exports to ``kind``'s HF class: loads with every key,
  computes the same hidden states and logits, and imports back to the same config and
  tensors."""
  params = _random_params(config)
  hf.save_hf(str(tmp_path), config, params, pad_token_id=PAD_IDS[kind])
  cls = hf_fixtures.HF_CLASSES[kind][0]
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['architectures'] == [cls.__name__]
  model, info = cls.from_pretrained(str(tmp_path), output_loading_info=True,
                                    attn_implementation='eager')
  model.eval()
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  assert not info['mismatched_keys'] and not info['error_msgs'], info
  ids, segments, mask = _inputs(kind, shape)
  ours = _ours(config, params, ids, segments, mask)
  theirs = _theirs(model, kind, ids, segments, mask)
  diff = MAX_DIFF[case, kind, SHAPE_IDS[SHAPES.index(shape)]] = _compare_pretraining(
      kind, mask, ours, theirs)
  assert diff < ATOLS.get(kind, ATOL)
  # The decoder really is our word embedding in the loaded model (tied, or untied beside a
  # token table with the shared offset folded in).
  np.testing.assert_array_equal(model.get_output_embeddings().weight.detach().numpy(),
                                params['embeddings']['word_embeddings']['embedding'])
  # And importing the export gives back our config and every tensor, bit for bit (but a
  # shared embedding offset folded into the token table: within float32 rounding).
  config2, params2, report = hf.load_hf(str(tmp_path))
  assert config2 == config and report.initialised_groups == [] and not report.ignored_keys
  assert jax.tree.structure(params2) == jax.tree.structure(params)
  offset = params2['embeddings'].pop('token_type_embeddings', None)
  if offset is not None:  # The rounding of table + offset: an ulp of the folded table.
    expected = params['embeddings']['token_type_embeddings']['embedding']
    folded = np.abs(params['embeddings']['word_embeddings']['embedding']).max() + np.abs(
        expected).max()
    np.testing.assert_allclose(offset['embedding'], expected, rtol=0,
                               atol=2.0 ** -23 * folded)
    params = dict(params, embeddings={k: v for k, v in params['embeddings'].items()
                                      if k != 'token_type_embeddings'})
  jax.tree.map(np.testing.assert_array_equal, params2, params)


@pytest.mark.parametrize('shape', SHAPES[:2], ids=SHAPE_IDS[:2])
@pytest.mark.parametrize('kind', KINDS)
def test_export_loads_in_transformers_with_same_logits(tmp_path, kind, shape):
  _check_export(tmp_path, kind, _our_config(kind, shape), shape, 'export')


@pytest.mark.parametrize('shape', SHAPES, ids=SHAPE_IDS)
def test_small_budget_recipe_exports_to_modernbert(tmp_path, shape):
  """The quickstart's network (``config_base.SMALL_BUDGET_RECIPE``: a ModernBERT with every
  layer global, RoPE base 10,000, no biases, a shared embedding offset) is
  ``ModernBertForMaskedLM``'s computation (the offset folded into its token table, the
  decoder untied)."""
  model = dict(config_base.SMALL_BUDGET_RECIPE['model'],
               **{k: v for k, v in _model_shape(shape).items() if k != 'max_positions'},
               max_position_embeddings=shape['max_positions'])
  config = registry.make_config(model)
  assert config.kind == 'modernbert' and not config.has_local_layers
  assert config.type_vocab_size == 1
  _check_export(tmp_path, 'modernbert', config, shape, 'recipe export')
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['tie_word_embeddings'] is False


@pytest.mark.parametrize('kind', KINDS)
def test_import_export_import_is_identity(tmp_path, kind):
  shape = SHAPES[1]
  model = hf_fixtures.random_hf_model(hf_fixtures.HF_CLASSES[kind][0], **_model_shape(shape))
  model.save_pretrained(tmp_path / 'a')
  config, params, _ = hf.load_hf(str(tmp_path / 'a'))
  hf.save_hf(str(tmp_path / 'b'), config, params, pad_token_id=PAD_IDS[kind])
  config2, params2, report = hf.load_hf(str(tmp_path / 'b'))
  assert config2 == config and report.initialised_groups == []
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  # The exported tensors are HF's own, bit for bit, under the same names.
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


@pytest.mark.parametrize('fields', [
    dict(model_type='gpt2', architectures=['GPT2LMHeadModel']),
    dict(model_type='t5', architectures=['T5ForConditionalGeneration']),
    dict(architectures=['BertForPreTraining']),  # No model_type at all.
], ids=['gpt2', 't5', 'no_model_type'])
def test_other_architectures_are_refused(tmp_path, fields):
  _write_config(tmp_path, **fields)
  expected = (f"config.json: model_type={fields.get('model_type')!r} cannot be imported; "
              r"expected one of \['albert', 'bert', 'deberta', 'deberta-v2', ")
  with pytest.raises(ValueError, match=expected):
    hf.load_hf(str(tmp_path))


# (kind, HF config field, a value our network would compute differently).
UNSUPPORTED = [
    ('bert', 'position_embedding_type', 'relative_key'),
    ('roberta', 'position_embedding_type', 'relative_key_query'),
    ('albert', 'position_embedding_type', 'relative_key'),
    ('albert', 'num_hidden_groups', 2),  # Two groups of layers, each shared within.
    ('albert', 'inner_group_num', 2),  # Two different layers per group.
]


@pytest.mark.parametrize('kind, field, value', UNSUPPORTED,
                         ids=[f'{k}-{f}' for k, f, _ in UNSUPPORTED])
def test_unsupported_variants_are_refused(tmp_path, kind, field, value):
  config = hf_fixtures.hf_config(kind, vocab_size=11, hidden_size=8, num_layers=2,
                                 num_heads=2, intermediate_size=9).to_dict()
  config.update({field: value, 'model_type': kind})
  _write_config(tmp_path, **config)
  with pytest.raises(ValueError, match=f'{field}={value!r} is not supported'):
    hf.load_hf(str(tmp_path))


@pytest.mark.parametrize('kind, fields, expected', [
    ('bert', {'hidden_act': 'tanh'}, r"activation='tanh': expected one of 'gelu'"),
    ('roberta', {'type_vocab_size': 2}, 'kind=roberta has one token type'),
    ('modernbert', {'mlp_bias': True}, 'one bias option for every dense layer'),
    ('modernbert', {'classifier_activation': 'silu'}, 'one activation'),
    ('modernbert', {'layer_types': ['sliding_attention', 'full_attention']},
     'a global layer every n-th from layer 0'),
], ids=['bert-tanh', 'roberta-two-token-types', 'modernbert-mixed-biases',
        'modernbert-two-activations', 'modernbert-layer-pattern'])
def test_configs_we_cannot_compute_are_refused(tmp_path, kind, fields, expected):
  config = hf_fixtures.hf_config(kind, vocab_size=11, hidden_size=8, num_layers=1,
                                 num_heads=2, intermediate_size=9).to_dict()
  config.update(fields, model_type=kind)
  _write_config(tmp_path, **config)
  with pytest.raises(ValueError, match=f'config.json: .*{expected}'):
    hf.load_hf(str(tmp_path))


def test_albert_without_a_factorized_embedding_is_refused(tmp_path):
  """HF ALBERT projects E -> hidden even when E == hidden; ours (as the ALBERT code) does
  not, so such a checkpoint neither imports nor exports."""
  shape = dict(_model_shape(SHAPES[2]), embedding_size=SHAPES[2]['hidden_size'])
  hf_fixtures.random_hf_model(transformers.AlbertForPreTraining, **shape).save_pretrained(
      tmp_path)
  expected = 'embedding_size=14 gives embeddings as wide as hidden_size=14'
  with pytest.raises(ValueError, match=expected):
    hf.load_hf(str(tmp_path))
  config = _our_config('albert', SHAPES[2]).replace(embedding_size=0)
  with pytest.raises(ValueError, match='embedding_size=0 gives embeddings as wide'):
    hf.save_hf(str(tmp_path / 'out'), config, hf.init_params(config))


def test_export_refuses_what_the_hf_architecture_cannot_represent(tmp_path):
  out = tmp_path / 'out'
  albert = _our_config('albert', SHAPES[2])
  for share in ('attention', 'ffn'):
    partial = albert.replace(share_layers=share)
    with pytest.raises(ValueError, match=f"share_layers='{share}'.*expected 'all'"):
      hf.save_hf(str(out), partial, hf.init_params(partial))
  roberta = _our_config('roberta', SHAPES[2])
  with pytest.raises(ValueError, match='pads with id 0.*position_offset=2'):
    hf.save_hf(str(out), roberta, hf.init_params(roberta), pad_token_id=0)
  assert not out.exists()  # Nothing half-written.


def test_missing_directory_and_weights(tmp_path):
  with pytest.raises(FileNotFoundError, match='does not exist'):
    hf.load_hf(str(tmp_path / 'nope'))
  config = transformers.BertConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=9)
  config.save_pretrained(tmp_path)
  with pytest.raises(FileNotFoundError, match='no model.safetensors'):
    hf.load_hf(str(tmp_path))


def test_weights_that_do_not_fit_the_config(tmp_path):
  model = hf_fixtures.random_hf_model(**_model_shape(SHAPES[0]))
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
