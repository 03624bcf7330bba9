"""Word starts per token (encoder_jax/data/words.py): from a real segmenter on real Chinese
text, stored beside the shards, read by masking; spaced text as the vocabulary marks it."""

import collections
import os

import jax
import numpy as np
import pytest

from encoder_jax.config import schema as config_base
from encoder_jax import data as data_lib
from encoder_jax.core import extras
from encoder_jax.data import packaged
from encoder_jax.data import preparation
from encoder_jax.data import sentences as sentences_lib
from encoder_jax.data import shards
from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.data import words
from encoder_jax.objectives import masking

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

SEEDS = os.path.join(support.ROOT, '..', 'shared', 'seeds')
SENTENCE = '然而，一旦我们在注意力机制中移除了因果掩码，这种语言建模任务就变得毫无意义。'


def chinese_config(prepared_dir: str, **data):
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  c.model.vocab_size = 2000
  c.data.update(dict(dict(sources='packaged:peoples_daily;max_documents=400',
                          prepared_dir=prepared_dir, num_workers=1, shuffle_pool_examples=64,
                          held_out_fraction=0.1), **data))
  c.objective.whole_word_masking = True
  c.train.update(batch_size=8, seq_lens=(64,), max_predictions=(10,), phase_fractions=(1.0,))
  return c


@pytest.fixture(scope='module')
def chinese(tmp_path_factory):
  """(config, PreparedData): 400 People's Daily paragraphs, SentencePiece trained on words."""
  c = chinese_config(str(tmp_path_factory.mktemp('zh') / 'p'))
  return c, data_lib.load_or_prepare(c)


@pytest.fixture(scope='module')
def chinese_bert_vocab(tmp_path_factory):
  """A WordPiece vocab.txt of Chinese BERT's layout: its specials, then the corpus's
  characters and their ## forms (every CJK character a piece, as in bert-base-chinese)."""
  counts = collections.Counter(ch for ws in packaged.gold_words('peoples_daily')
                               for w in ws for ch in w)
  chars = [c for c, _ in counts.most_common()]
  path = tmp_path_factory.mktemp('vocab') / 'vocab.txt'
  path.write_text('\n'.join(['[PAD]'] + [f'[unused{i}]' for i in range(1, 100)] + [
      '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + chars + ['##' + c for c in chars]) + '\n',
                  encoding='utf-8')
  return str(path)


def _flags(tok, texts, segmenter='auto'):
  report = collections.Counter()
  if segmenter == 'none':  # What masking reads from data prepared without word starts.
    ids = tok.encode_batch(texts)
    flags, stats = tok.is_word_start[np.concatenate(ids)], {}
  else:
    w = words.Words(segmenter, words.resolve(segmenter), tok.is_word_start)
    ids, flags, stats = w.encode(texts, tok, lambda reason, n: report.update({reason: n}))
  out, pos = [], 0
  for i in ids:
    out.append(flags[pos:pos + len(i)])
    pos += len(i)
  return ids, out, stats, report


def _gold(lines: int, corpus: str = 'peoples_daily'):
  return packaged.gold_sentences(corpus, lines)


def _f1(tok, gold, segmenter):
  ids, flags, _, _ = _flags(tok, [t for t, _ in gold], segmenter)
  tp = flagged = total = 0
  for (text, starts), f in zip(gold, flags):
    _, spans = tok.encode_with_offsets(text)
    anchors = [s + len(text[s:e]) - len(text[s:e].lstrip()) for s, e in spans]
    anchors = [a if a < e else (spans[k + 1][0] if k + 1 < len(spans) else a)
               for k, (a, (_, e)) in enumerate(zip(anchors, spans))]
    hit = {a for a, x in zip(anchors, f) if x}
    flagged, tp, total = flagged + int(f.sum()), tp + len(hit & starts), total + len(starts)
  p, r = tp / flagged, tp / total
  return p, r, 2 * p * r / (p + r)


@pytest.mark.parametrize('kind', ['sentencepiece', 'wordpiece'])
def test_stored_word_starts_match_hand_segmented_chinese(chinese, chinese_bert_vocab, kind):
  """On hand-segmented People's Daily, the word starts of a real segmenter are close to the
  gold words; the vocabulary alone finds almost none (SentencePiece: one a run between
  spaces) or calls every character a word (WordPiece)."""
  _, prepared = chinese
  tok = prepared.tokenizer if kind == 'sentencepiece' else tokenizer_lib.Tokenizer.from_file(
      'wordpiece', chinese_bert_vocab, True)
  gold = _gold(150)
  p, r, f1 = _f1(tok, gold, 'auto')
  assert f1 > 0.85 and p > 0.85 and r > 0.8, (p, r, f1)
  p0, r0, f0 = _f1(tok, gold, 'none')
  assert f1 > f0 + 0.1, (f1, f0)
  if kind == 'sentencepiece':
    assert r0 < 0.1
  else:
    assert r0 > 0.99 and p0 < 0.7


@pytest.fixture(scope='module')
def mixed(tmp_path_factory):
  """English, Chinese and Thai, mixed by alpha sampling (SentencePiece trained on all)."""
  c = chinese_config(str(tmp_path_factory.mktemp('mixed') / 'p'), sources=(
      'embedded;max_documents=150,packaged:peoples_daily;max_documents=150,'
      'packaged:orchid;max_documents=6'), pair_kind='doc_sentences')
  c.train.batch_size = 32
  return c, data_lib.load_or_prepare(c)


def test_thai_word_starts_match_hand_segmented_orchid(mixed):
  """ORCHID's Thai, segmented by pythainlp: most gold word starts are found, against a few
  from the vocabulary alone."""
  _, prepared = mixed
  gold = _gold(100, 'orchid')
  p, r, f1 = _f1(prepared.tokenizer, gold, 'auto')
  assert f1 > 0.8, (p, r, f1)
  assert _f1(prepared.tokenizer, gold, 'none')[1] < 0.3


def test_a_mixed_corpus_masks_whole_words_in_each_script(mixed):
  """English, Chinese and Thai mixed by alpha sampling: the manifest counts sentences,
  tokens and words per script, and whole-word masks take whole words in each."""
  c, prepared = mixed
  by_script = prepared.manifest['words']['by_script']
  assert set(by_script) == {'spaced', 'chinese', 'thai'}
  for counts in by_script.values():
    assert 0 < counts['sentences'] and 0 < counts['words'] < counts['tokens']
  assert prepared.manifest['words']['segmenters']['thai'].startswith('pythainlp ')
  it = data_lib.make_train_iterator(c, prepared)
  assert len(set(np.round(it.source_probabilities, 6))) == 3
  tables = masking.VocabTables.from_tokenizer(prepared.tokenizer, prepared.unigram_counts)
  seen = set()
  for _ in range(3):
    batch = next(it)
    out = masking.mask_tokens(jax.random.key(1), batch['input_ids'], batch['input_mask'],
                              max_predictions=10, tables=tables,
                              recipe=masking.MaskingRecipe(whole_word_masking=True),
                              word_starts_BxL=batch['word_starts'])
    maskable, _ = masking.selection_budget(batch['input_ids'], batch['input_mask'], tables,
                                           0.15, 10)
    _, word_id = (np.asarray(a) for a in masking._words(  # pylint: disable=protected-access
        maskable, batch['word_starts'].astype(bool)))
    for r, (pos, w) in enumerate(zip(np.asarray(out['masked_positions']),
                                     np.asarray(out['masked_weights']))):
      text = prepared.tokenizer.decode(batch['input_ids'][r][batch['input_mask'][r] > 0])
      script = ('thai' if any('\u0e00' <= ch <= '\u0e7f' for ch in text) else 'chinese'
                if any('\u4e00' <= ch <= '\u9fff' for ch in text) else 'spaced')
      seen.add(script)
      chosen = set(pos[w > 0].tolist())
      for word in np.unique(word_id[r][sorted(chosen)]):
        assert set(np.flatnonzero(word_id[r] == word).tolist()) <= chosen, (script, text)
  assert seen == {'spaced', 'chinese', 'thai'}


def test_whole_word_masking_masks_every_piece_of_a_segmented_word(chinese):
  """Masks drawn on device from the stored starts take whole words: every selected piece's
  word is selected whole, and words of several pieces are among them."""
  c, prepared = chinese
  batch = next(data_lib.make_train_iterator(c, prepared))
  assert batch['word_starts'].dtype == np.int32
  tables = masking.VocabTables.from_tokenizer(prepared.tokenizer, prepared.unigram_counts)
  recipe = masking.MaskingRecipe(whole_word_masking=True)
  out = masking.mask_tokens(jax.random.key(0), batch['input_ids'], batch['input_mask'],
                            max_predictions=10, recipe=recipe, tables=tables,
                            word_starts_BxL=batch['word_starts'])
  maskable, _ = masking.selection_budget(batch['input_ids'], batch['input_mask'], tables,
                                         0.15, 10)
  starts, word_id = (np.asarray(a) for a in masking._words(  # pylint: disable=protected-access
      maskable, batch['word_starts'].astype(bool)))
  selected = np.zeros(batch['input_ids'].shape, bool)
  for r, (pos, w) in enumerate(zip(np.asarray(out['masked_positions']),
                                   np.asarray(out['masked_weights']))):
    selected[r, pos[w > 0]] = True
  multi = 0
  for r in range(len(selected)):
    for w in np.unique(word_id[r][selected[r]]):
      in_word = word_id[r] == w
      assert selected[r][in_word].all()
      multi += in_word.sum() > 1
  assert multi > 0
  # The vocabulary's word starts (one a run between spaces) would mask other units.
  vocab = np.asarray(tables.is_word_start_V)[batch['input_ids']]
  assert (vocab.astype(np.int32) != batch['word_starts']).any()


def test_spaced_text_is_stored_as_the_vocabulary_marks_it(prepared_small, tmp_path):
  """English: the same token shards with the segmenter on or off, and word starts equal to
  the vocabulary's (its masks do not move); 'none' stores none and the batches take the
  vocabulary's."""
  c, auto = prepared_small
  none = data_lib.load_or_prepare(_none_config(c, tmp_path))
  for name in sorted(e['name'] for e in auto.manifest['splits']['train']['shards']):
    a = np.load(os.path.join(auto.directory, f'{name}.tokens.npy'))
    b = np.load(os.path.join(none.directory, f'{name}.tokens.npy'))
    np.testing.assert_array_equal(a, b)
    ws = np.load(os.path.join(auto.directory, f'{name}.{shards.WORD_STARTS}.npy'))
    np.testing.assert_array_equal(ws, auto.tokenizer.is_word_start[a])
    assert not os.path.exists(os.path.join(none.directory, f'{name}.{shards.WORD_STARTS}.npy'))
  assert none.manifest['words'] is None and set(auto.manifest['words']['by_script']) == {
      'spaced'}
  # The same pieces (the model files differ only in the path they were trained at).
  assert [auto.tokenizer.id_to_piece(i) for i in range(auto.tokenizer.vocab_size)] == [
      none.tokenizer.id_to_piece(i) for i in range(none.tokenizer.vocab_size)]
  batch_a = next(data_lib.make_train_iterator(c, auto))
  batch_n = next(data_lib.make_train_iterator(_none_config(c, tmp_path), none))
  for k in batch_a:
    np.testing.assert_array_equal(batch_a[k], batch_n[k])


def _none_config(c, tmp_path):
  n = c.copy_and_resolve_references()
  n.data.update(word_segmenter='none', prepared_dir=str(tmp_path / 'none'))
  return n


def test_segmenters_split_chinese_into_words():
  """Every Chinese segmenter gives words of the sentence; rjieba and jieba agree."""
  tok_free = {name: words.SEGMENTERS[name].load()(SENTENCE) for name in ('rjieba', 'jieba',
                                                                          'chars')}
  for name, spans in tok_free.items():
    assert spans and all(0 <= s < e <= len(SENTENCE) for s, e in spans), name
  assert tok_free['rjieba'] == tok_free['jieba']
  assert SENTENCE[slice(*tok_free['rjieba'][0])] == '然而'
  assert len(tok_free['chars']) == len(SENTENCE)


def test_a_line_of_the_seeds_gets_words_inside_it(chinese):
  """The issue's line: the vocabulary sees one word start in it, the segmenter many."""
  _, prepared = chinese
  with open(os.path.join(SEEDS, sorted(os.listdir(SEEDS))[0]), encoding='utf-8') as f:
    line = next(l.strip() for l in f if l.startswith('然而'))
  sentence = sentences_lib.split_paragraph(line, 5000)[0][0]
  _, (none,), _, _ = _flags(prepared.tokenizer, [sentence], 'none')
  _, (auto,), stats, _ = _flags(prepared.tokenizer, [sentence], 'auto')
  assert none.sum() <= 2 and auto.sum() > 8
  assert stats == {'chinese': [1, len(auto), int(auto.sum())]}


def test_bad_segmenter_settings_are_named():
  with pytest.raises(ValueError, match='does not segment chinese'):
    words.parse('chinese=fugashi')
  with pytest.raises(ValueError, match="unknown script 'klingon'"):
    words.parse('klingon=chars')
  with pytest.raises(ValueError, match='is not a segmenter'):
    words.parse('ltp')
  assert words.parse('auto') == {} and words.parse('none') is None
  assert words.parse('jieba,japanese=fugashi') == {'chinese': 'jieba', 'japanese': 'fugashi'}
  c = config_base.base_config()
  c.data.word_segmenter = 'chinese=mecab'
  from encoder_jax.config import validation  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match='config.data.word_segmenter'):
    validation.validate(c)


def test_a_segmenter_that_is_not_installed_names_its_extra(monkeypatch):
  """Absence simulated as a machine without rjieba has it: its import fails."""
  monkeypatch.setitem(__import__('sys').modules, 'rjieba', None)
  monkeypatch.setattr(words, '_installed', lambda s: s.name != 'rjieba')
  with pytest.raises(extras.MissingExtra, match=r"pip install 'encoder_jax\[chinese\]'"):
    words.resolve('chinese=rjieba')
  assert words.resolve('auto')['chinese'].startswith('jieba ')  # 'auto' takes the next.


def test_the_manifest_names_the_segmenters_and_the_hash_covers_them(chinese):
  c, prepared = chinese
  w = prepared.manifest['words']
  assert w['segmenter'] == 'auto' and w['segmenters']['chinese'].startswith('rjieba rjieba==')
  assert w['by_script']['chinese']['words'] > 0
  fields = preparation.content_fields(c)
  assert fields['word_segmenters'] == w['segmenters']
  other = c.copy_and_resolve_references()
  other.data.word_segmenter = 'chinese=chars'
  assert preparation.config_hash(preparation.content_fields(other)) != prepared.manifest[
      'config_hash']
