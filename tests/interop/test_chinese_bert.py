"""Chinese BERT checkpoints (bert-base-chinese, hfl/chinese-roberta-wwm-ext,
hfl/chinese-bert-wwm-ext) import, tokenize, fill masks in Chinese and export as
``transformers`` does: tiny checkpoints of their layout (21,128 real pieces, their files),
built offline by ``chinese_bert_dirs``.

Per layout, against ``transformers``: the ids of real Chinese sentences (People's Daily,
full-width digits and punctuation; mixed with ASCII words, digits and accents) from the
``wordpiece`` kind that reads the checkpoint's vocab.txt and from the ``hf`` kind that runs
its tokenizer.json, singly and as pairs; every CJK character its own piece; the MLM logits
(float32, within 1e-5 as ``test_hf_parity``); fill-mask's top 5 against the fill-mask
pipeline, and the filled text; the workdir import and its export (the exported directory's
ids and logits). The max |difference| of each case is printed after the module
(``pytest -s``).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import transformers

import encoder_jax
from encoder_jax import convert
from encoder_jax.loading import inference
from encoder_jax.loading import loaded as loading
from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.interop import tokenizer as tokenizer_io

from support import chinese_bert_dirs as dirs
from support import hf_fixtures


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

ATOL = 1e-5  # As tests/interop/test_hf_parity.py.
FILL = '巴黎是法国的[MASK]都。'
# Chinese with ASCII words, digits, accents and full-width punctuation in one text.
MIXED = (
    '巴黎是法国的首都，也是全国的政治和文化中心。',
    '我们在2019年用BERT-base做了3次实验（准确率达到92.5%）！',
    'Café au lait和naïve都是外来词；ＡＢＣ与１２３是全角字符。',
    '他说：“Transformer模型的注意力机制很重要。”',
)

# (case, layout) -> max |ours - transformers|, printed after the module.
MAX_DIFF: dict[tuple[str, str], float] = {}
_print_max_diffs = hf_fixtures.max_diff_printer(MAX_DIFF, 'float32 MLM logits, real tokens')


def sentences() -> list[str]:
  """Four People's Daily lines, and MIXED: as pairs too, within the tiny models' 64
  positions."""
  daily = [line for line in dirs.people_daily_lines() if 16 <= len(line) <= 30]
  return daily[:4] + list(MIXED)


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  """layout -> (directory, AutoTokenizer, HF model), each built once."""
  root, cache = tmp_path_factory.mktemp('chinese_bert'), {}

  def get(layout):
    if layout not in cache:
      path = str(root / layout)
      cache[layout] = (path, *dirs.make_dir(layout, path, seed=dirs.LAYOUTS.index(layout)))
    return cache[layout]
  return get


def _theirs_inputs(auto, texts, pairs=None):
  return auto(list(texts), None if pairs is None else list(pairs), padding=True,
              return_token_type_ids=True, return_tensors='np')


def _assert_ids_equal(tok, auto, texts, pairs=None):
  ours = tok.encode_inputs(list(texts), None if pairs is None else list(pairs))
  theirs = _theirs_inputs(auto, texts, pairs)
  for a, b in (('input_ids', 'input_ids'), ('segment_ids', 'token_type_ids'),
               ('input_mask', 'attention_mask')):
    np.testing.assert_array_equal(ours[a], theirs[b], err_msg=f'{tok.kind}: {a}')


def _hf_logits(model, x) -> np.ndarray:
  t = lambda a: torch.tensor(np.asarray(a), dtype=torch.long)
  with torch.no_grad():
    out = model(input_ids=t(x['input_ids']), attention_mask=t(x['input_mask']),
                token_type_ids=t(x['segment_ids']))
  return (out.prediction_logits if hasattr(out, 'prediction_logits') else out.logits).numpy()


def _max_diff(mask, ours, theirs) -> float:
  sel = np.asarray(mask).astype(bool)
  return float(np.abs(np.asarray(ours)[sel] - np.asarray(theirs)[sel]).max())


@pytest.mark.parametrize('layout', dirs.LAYOUTS)
def test_chinese_checkpoint_imports_tokenizes_fills_and_exports(layout, built, tmp_path):
  hf_dir, auto, model = built(layout)
  texts = sentences()
  m = encoder_jax.load(hf_dir)
  assert m.kind == 'bert' and m.config.model.vocab_size == dirs.VOCAB_SIZE
  tok = m.tokenizer
  assert (tok.kind, tok.lowercase) == ('wordpiece', dirs.LOWERCASE[layout])
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
  assert 'mlm_head' not in m.untrained_heads

  # BERT's basic tokenizer: every CJK character is a piece of its own, and so is each
  # full-width punctuation mark.
  text = MIXED[0]
  assert [tok.id_to_piece(i) for i in tok.encode(text)] == list(text)
  hf_tok = tokenizer_lib.Tokenizer.from_hf_json(
      tokenizer_io.write_hf_bundle(hf_dir, str(tmp_path / 'hf_kind')))
  for ours in (tok, hf_tok):
    _assert_ids_equal(ours, auto, texts)
    _assert_ids_equal(ours, auto, texts[:4], texts[4:])
  assert tok.unk_id not in tok.encode(texts[0])  # The vocabulary covers the corpus.

  x = m.encode(texts)
  theirs = _hf_logits(model, x)
  diff = MAX_DIFF['import', layout] = _max_diff(x['input_mask'], m.mlm_logits(**x), theirs)
  assert diff < ATOL

  got = m.fill_mask(FILL, top_k=5)
  pipeline = transformers.pipeline('fill-mask', model=hf_dir, top_k=5)  # As users run it.
  expected = pipeline(FILL)
  assert [p for p, _ in got[0]] == [auto.convert_ids_to_tokens(e['token']) for e in expected]
  np.testing.assert_allclose([p for _, p in got[0]], [e['score'] for e in expected], atol=1e-5)
  best = got[0][0][0]
  assert len(best) == 1 and dirs.is_cjk(best), got  # A Chinese character.
  filled = inference.filled_text(tok, FILL, got)
  # The text as written with the character in place; the pipeline decodes the whole row
  # instead, a space between every two pieces.
  assert filled == FILL.replace('[MASK]', best) and ' ' not in filled
  assert expected[0]['sequence'] == ' '.join(filled)

  workdir, out = str(tmp_path / 'workdir'), str(tmp_path / 'out')
  convert.hf_to_workdir(hf_dir, workdir)
  config = loading.read_run_config(workdir)
  assert (config.tokenizer.kind, bool(config.tokenizer.lowercase)) == (
      'wordpiece', dirs.LOWERCASE[layout])
  convert.workdir_to_hf(workdir, out)
  with open(os.path.join(out, 'tokenizer_config.json'), encoding='utf-8') as f:
    assert json.load(f)['do_lower_case'] == dirs.LOWERCASE[layout]
  exported_auto = transformers.AutoTokenizer.from_pretrained(out)
  for a, b in ((texts, None), (texts[:4], texts[4:])):
    ours, ref = _theirs_inputs(exported_auto, a, b), _theirs_inputs(auto, a, b)
    for key in ('input_ids', 'token_type_ids', 'attention_mask'):
      np.testing.assert_array_equal(ours[key], ref[key])
  exported, info = transformers.BertForPreTraining.from_pretrained(
      out, output_loading_info=True, attn_implementation='eager')
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  exported_logits = _hf_logits(exported.eval(), x)
  from_workdir = encoder_jax.load(workdir)
  assert from_workdir.tokenizer.encode_inputs(texts)['input_ids'].tolist() == (
      x['input_ids'].tolist())
  diff = MAX_DIFF['export', layout] = _max_diff(
      x['input_mask'], from_workdir.mlm_logits(**x), exported_logits)
  assert diff < ATOL
  np.testing.assert_array_equal(exported_logits, theirs)  # The very weights, back.


def test_filled_text_and_a_full_width_mask(built):
  tok = encoder_jax.load(built('bert-base-chinese')[0]).tokenizer
  # A continuation piece joins the text without its mark; each mask takes its own best.
  assert inference.filled_text(tok, '苹果[MASK]和[MASK]。', [[('##汁', 0.5)], [('梨', 0.4)]]) == (
      '苹果汁和梨。')
  assert inference.filled_text(tok, 'The capital is [MASK].', [[('p', 0.2)]]) == (
      'The capital is p.')
  with pytest.raises(ValueError, match='2 rows of predictions for the 1 masks'):
    inference.filled_text(tok, '苹果[MASK]', [[('汁', 0.5)], [('梨', 0.4)]])
  with pytest.raises(ValueError, match='full-width ［MASK］ is text: write the mask with ASCII'):
    inference.tokenize_with_masks(tok, '巴黎是法国的［ＭＡＳＫ］都。')


# (tokenizer.json lowercases, tokenizer_config.json as saved with these keys changed (None:
# removed), the kind that reads it). AutoTokenizer sets a BERT tokenizer class's normalizer
# from tokenizer_config.json, BertTokenizer's defaults where it says nothing, whatever
# tokenizer.json says.
SETTINGS = [
    (False, {'do_lower_case': None}, 'wordpiece'),  # The default: lowercase.
    (False, {'do_lower_case': None, 'tokenizer_class': None, 'strip_accents': None,
             'tokenize_chinese_chars': None, 'init_inputs': []}, 'wordpiece'),  # hfl's file.
    (True, {'do_lower_case': False}, 'wordpiece'),
    (False, {'do_lower_case': True}, 'wordpiece'),
    (True, {'strip_accents': False}, 'hf'),  # Lowercase, keep accents.
    (False, {'tokenize_chinese_chars': False}, 'hf'),  # Chinese text as words.
    (False, {'do_lower_case': None, 'tokenizer_class': 'PreTrainedTokenizerFast'},
     'wordpiece'),  # Not a BERT class: tokenizer.json's own normalizer.
]


SETTING_IDS = ['no_do_lower_case', 'hfl_config', 'cased_config', 'uncased_config', 'keep_accents',
               'no_cjk_split', 'not_a_bert_class']


@pytest.mark.parametrize('saved_lowercase, changes, kind', SETTINGS, ids=SETTING_IDS)
def test_tokenizer_settings_are_read_as_autotokenizer_applies_them(
    saved_lowercase, changes, kind, tmp_path):
  path = str(tmp_path)
  dirs.write_vocab(os.path.join(path, 'vocab.txt'))
  transformers.BertTokenizerFast.from_pretrained(
      path, do_lower_case=saved_lowercase).save_pretrained(path)
  config_path = os.path.join(path, 'tokenizer_config.json')
  with open(config_path, encoding='utf-8') as f:
    config = json.load(f)
  for key, value in changes.items():
    config.pop(key, None) if value is None else config.update({key: value})
  with open(config_path, 'w', encoding='utf-8') as f:
    json.dump(config, f)
  with open(os.path.join(path, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump({'model_type': 'bert'}, f)
  auto = transformers.AutoTokenizer.from_pretrained(path)
  tok = tokenizer_io.load_hf_tokenizer(path)
  assert tok.kind == kind
  _assert_ids_equal(tok, auto, sentences())
