"""XLNet against transformers' ``XLNetLMHeadModel`` (PyTorch, CPU), both ways: given the
same ``perm_mask`` and ``target_mapping``, every content-stream and query-stream hidden
state, the LM logits and the new memory agree within 1e-5 in float32.

Randomised models (biases and LayerNorms too) of odd shapes on padded batches with three
segments (A, B, [CLS] = 2), random permutation masks and a zero (padding) target slot; with
and without a Transformer-XL memory; with HF's ``bi_data`` (ours too: the second half of
the batch reads negated distances) and ``clamp_len``. ``pytest -s`` prints the max |difference|
of every case (``MAX_DIFF``).
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
SHAPES = [
    dict(vocab_size=97, d_model=36, n_layer=2, n_head=3, d_inner=50, length=11, batch=4,
         predict=4),
    dict(vocab_size=61, d_model=30, n_layer=3, n_head=5, d_inner=37, length=13, batch=2,
         predict=5),
    dict(vocab_size=131, d_model=14, n_layer=1, n_head=1, d_inner=23, length=9, batch=4,
         predict=3),
]
SHAPE_IDS = ['d{d_model}_h{n_head}_n{n_layer}'.format(**s) for s in SHAPES]
# HF options each case turns on: a memory of mem_len states, or bi_data with clamp_len.
CASES = {'plain': {}, 'memory': dict(mem_len=5, use_mems_train=True),
         'bi_data_clamp': dict(bi_data=True, clamp_len=3)}
MAX_DIFF: dict[tuple[str, str, str], float] = {}


_print_max_diffs = hf_fixtures.max_diff_printer(MAX_DIFF, 'XLNet, float32, both streams + logits + memory')


def _hf_config(shape, **options):
  arch = {k: v for k, v in shape.items() if k not in ('length', 'batch', 'predict')}
  return transformers.XLNetConfig(**arch, ff_activation='gelu', attn_type='bi',
                                  **{'mem_len': None, **options})


def _inputs(shape, seed=0):
  """ids, segments (A 0, B 1, [CLS] 2), mask (row 1 padded), perm_mask, target_mapping
  (the last slot of the last row empty), and a memory [layers, mem, batch, d]."""
  rng = np.random.default_rng(seed)
  b, l, p = shape['batch'], shape['length'], shape['predict']
  ids = rng.integers(0, shape['vocab_size'], (b, l))
  mask = np.ones((b, l), np.int64)
  mask[1, -3:] = 0
  seg = np.zeros((b, l), np.int64)
  seg[:, l // 2:] = 1
  seg[:, -1] = 2
  perm = (rng.random((b, l, l)) < 0.4).astype(np.float32)
  tm = np.zeros((b, p, l), np.float32)
  for r in range(b):
    tm[r, np.arange(p), rng.choice(l - 3, p, replace=False)] = 1.0
  tm[-1, -1] = 0.0
  return ids, seg, mask, perm, tm, rng


def _theirs(model, ids, seg, mask, perm, tm, mems):
  t = lambda x, dt=torch.long: torch.tensor(np.asarray(x), dtype=dt)
  with torch.no_grad():
    return model(input_ids=t(ids), attention_mask=t(mask, torch.float32),
                 token_type_ids=t(seg), perm_mask=t(perm, torch.float32),
                 target_mapping=t(tm, torch.float32), use_mems=True, output_hidden_states=True,
                 mems=None if mems is None else [t(m, torch.float32) for m in mems])


def _ours(config, params, ids, seg, mask, perm, tm, mems, bi_data):
  apply = jax.jit(registry.network(config).pretraining.apply,
                  static_argnames=('collect_hidden', 'bi_data'))
  return apply({'params': params}, np.int32(ids), np.int32(seg), np.int32(mask), perm_mask=perm,
               target_mapping=tm, mems=None if mems is None else mems.transpose(2, 0, 1, 3),
               bi_data=bi_data, collect_hidden=True)


def _compare(shape, case, ours, theirs, mask, mems) -> float:
  n = shape['n_layer']
  real = mask.astype(bool)
  diffs = [np.abs(np.asarray(ours['mlm_logits']) - theirs.logits.numpy()).max()]
  assert len(theirs.hidden_states) == 2 * (n + 1)  # (h, g) before each layer and after.
  for i in range(n + 1):
    h, g = theirs.hidden_states[2 * i].numpy(), theirs.hidden_states[2 * i + 1].numpy()
    diffs.append(np.abs(np.asarray(ours['all_hidden_states'][i]) - h)[real].max())
    diffs.append(np.abs(np.asarray(ours['all_query_states'][i]) - g).max())
  if mems is not None:
    for i in range(n):  # HF keeps [mem, batch, d] per layer; ours [batch, layer, mem, d].
      diffs.append(np.abs(np.asarray(ours['new_mems'][:, i])
                          - theirs.mems[i].numpy().transpose(1, 0, 2)).max())
  return float(max(diffs))


@pytest.mark.parametrize('case', sorted(CASES))
@pytest.mark.parametrize('shape', SHAPES, ids=SHAPE_IDS)
def test_import_matches_transformers(tmp_path, shape, case):
  options = CASES[case]
  torch.manual_seed(0)
  model = hf_fixtures.randomize_(transformers.XLNetLMHeadModel(_hf_config(shape, **options))
                                 .eval(), seed=1)
  model.save_pretrained(tmp_path)
  if options.get('bi_data'):  # For us the backward rows are an input, not a config field.
    with open(tmp_path / 'config.json') as f:
      saved = json.load(f)
    with open(tmp_path / 'config.json', 'w') as f:
      json.dump(dict(saved, bi_data=False), f)
  config, params, report = hf.load_hf(str(tmp_path))
  assert config.kind == 'xlnet' and config.mem_len == options.get('mem_len', 0)
  assert config.clamp_len == options.get('clamp_len', -1)
  assert report.initialised_groups == [] and report.ignored_keys == [], report.summary()
  ids, seg, mask, perm, tm, rng = _inputs(shape)
  mems = None
  if options.get('mem_len'):
    mems = rng.normal(size=(shape['n_layer'], options['mem_len'], shape['batch'],
                            shape['d_model'])).astype(np.float32)
  theirs = _theirs(model, ids, seg, mask, perm, tm, mems)
  ours = _ours(config, params, ids, seg, mask, perm, tm, mems, options.get('bi_data', False))
  diff = MAX_DIFF['import', case, SHAPE_IDS[SHAPES.index(shape)]] = _compare(
      shape, case, ours, theirs, mask, mems)
  assert diff < ATOL


@pytest.mark.parametrize('shape', SHAPES[:2], ids=SHAPE_IDS[:2])
def test_export_loads_in_transformers_with_the_same_outputs(tmp_path, shape):
  config = hf.config_from_hf(_hf_config(shape).to_dict())
  rng = np.random.default_rng(3)  # Every tensor random (biases and LayerNorms too).
  params = jax.tree.map(lambda x: (x + 0.2 * rng.standard_normal(x.shape)).astype(np.float32),
                        hf.init_params(config, seed=3))
  hf.save_hf(str(tmp_path), config, params, pad_token_id=5)
  with open(tmp_path / 'config.json') as f:
    written = json.load(f)
  assert written['architectures'] == ['XLNetLMHeadModel'] and written['model_type'] == 'xlnet'
  assert 'max_position_embeddings' not in written  # HF's XLNetConfig refuses the field.
  model, info = transformers.XLNetLMHeadModel.from_pretrained(str(tmp_path),
                                                              output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  model.eval()
  ids, seg, mask, perm, tm, _ = _inputs(shape, seed=1)
  theirs = _theirs(model, ids, seg, mask, perm, tm, None)
  ours = _ours(config, params, ids, seg, mask, perm, tm, None, False)
  diff = MAX_DIFF['export', 'plain', SHAPE_IDS[SHAPES.index(shape)]] = _compare(
      shape, 'plain', ours, theirs, mask, None)
  assert diff < ATOL
  # And back: the exported directory imports to the same parameters.
  _, again, _ = hf.load_hf(str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, again, params)


def test_hf_defaults_are_what_our_network_computes():
  """HF's defaults (attn_type='bi', no bi_data, no same_length, clamp_len=-1) import as
  they are; what our network does not compute is refused, naming the field."""
  default = transformers.XLNetConfig()
  assert (default.attn_type, default.bi_data, default.same_length, default.clamp_len) == (
      'bi', False, False, -1)
  config = hf.config_from_hf(default.to_dict())
  # HF's default mem_len (512) is an inference cache (use_mems_train=False): no memory here.
  assert config.clamp_len == -1 and config.mem_len == 0
  assert hf.config_from_hf(dict(default.to_dict(), use_mems_train=True)).mem_len == 512
  assert registry.hf_spec_for_model_type('xlnet').kind == 'xlnet'
  for field, value in (('attn_type', 'uni'), ('same_length', True), ('bi_data', True)):
    with pytest.raises(ValueError, match=field):
      hf.config_from_hf(dict(default.to_dict(), **{field: value}))
