"""Example builders on real prepared text: NSP, SOP, FULL-SENTENCES, DOC-SENTENCES."""

import jax
import numpy as np
import pytest

from encoder_jax import data as data_lib
from encoder_jax import objectives
from encoder_jax.data import builders
from encoder_jax.data import iterators
from encoder_jax.data import mixing
from encoder_jax.data import tokenizer_files
from encoder_jax.objectives import masking

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def _one_epoch_stream(prepared, seed=0, process_index=0, process_count=1):
  corpus = prepared.split('train')
  return iterators.DocumentStream(
      corpus, lambda e: mixing.epoch_order(seed, 0, corpus.source_offsets, None, None)
      if e == 0 else None, process_index, process_count)


def _epoch_instances(prepared, kind, seq_len, **kw):
  builder = builders.make(kind, seed=0, short_seq_prob=0.1)
  return [inst for inst, _ in builder.generate(_one_epoch_stream(prepared, **kw), (0, 0, 0),
                                               seq_len)]


def _check_layout(batch, tok, seq_len, pairs):
  ids, seg, mask = batch['input_ids'], batch['segment_ids'], batch['input_mask']
  assert ids.shape[1] == seg.shape[1] == mask.shape[1] == seq_len
  assert all(a.dtype == np.int32 for a in batch.values())
  lengths = mask.sum(1)
  assert (lengths <= seq_len).all() and (lengths >= 3 if pairs else lengths >= 2).all()
  assert (ids[:, 0] == tok.cls_id).all()
  for row_ids, row_seg, row_mask, n in zip(ids, seg, mask, lengths):
    assert (row_mask[:n] == 1).all() and (row_mask[n:] == 0).all()  # Padding after the end.
    assert (row_ids[n:] == tok.pad_id).all() and (row_seg[n:] == 0).all()
    assert row_ids[n - 1] == tok.sep_id
    body = row_ids[1:n]
    assert not np.isin(body, [tok.cls_id, tok.pad_id, tok.mask_id]).any()
    seps = np.flatnonzero(row_ids[:n] == tok.sep_id)
    if pairs:
      assert len(seps) == 2 and seps[0] >= 2 and seps[1] - seps[0] >= 2  # A, B non-empty.
      assert (row_seg[:seps[0] + 1] == 0).all() and (row_seg[seps[0] + 1:n] == 1).all()
    else:
      assert (row_seg == 0).all() and np.diff(seps).min(initial=2) >= 2


@pytest.mark.parametrize('kind', ['nsp', 'sop', 'full_sentences', 'doc_sentences'])
def test_batches_have_the_right_layout(prepared_small, kind):
  c, prepared = prepared_small
  c = c.copy_and_resolve_references()
  c.data.pair_kind = kind
  it = iterators.make_train_iterator(c, prepared)
  labels = []
  for step in range(24):
    batch = next(it)
    seq_len = 64 if step < 20 else 128  # Phases: 50% of 40 steps at 64, then 128.
    _check_layout(batch, prepared.tokenizer, seq_len, pairs=kind in ('nsp', 'sop'))
    assert batch['pair_labels'].shape == (16,)
    labels.append(batch['pair_labels'])
  labels = np.concatenate(labels)
  if kind in ('nsp', 'sop'):
    assert 0.35 < labels.mean() < 0.65, labels.mean()
  else:
    assert (labels == 0).all()


def test_nsp_follows_create_instances_from_document(prepared_small):
  _, prepared = prepared_small
  instances = _epoch_instances(prepared, 'nsp', 128)
  corpus = prepared.split('train')
  labels = np.array([label for _, label in instances])
  assert 0.45 < labels.mean() < 0.62, labels.mean()  # 50% + chunks of one sentence.
  max_num_tokens = 128 - 3
  lengths = []
  for (a, b), label in instances:
    assert a[3] == 0 and b[3] == 1
    la, lb = a[2] - a[1], b[2] - b[1]
    assert la >= 1 and lb >= 1 and la + lb <= max_num_tokens
    lengths.append(la + lb)
    if label == 0:  # B continues A in the same document.
      assert b[0] is a[0] and a[2] <= b[1]
  lengths = np.array(lengths)
  # Most pairs fill the target; short_seq_prob = 0.1 documents draw a random shorter target.
  assert np.median(lengths) > 0.6 * max_num_tokens
  # Every document contributes (accumulating chunks until each document ends).
  assert len(instances) >= corpus.num_documents


def test_sop_pairs_are_consecutive_and_swapped_half_the_time(prepared_small):
  _, prepared = prepared_small
  instances = _epoch_instances(prepared, 'sop', 64)
  labels = np.array([label for _, label in instances])
  assert 0.45 < labels.mean() < 0.55
  for (first, second), label in instances:
    assert first[0] is second[0]  # Same document.
    a, b = (second, first) if label else (first, second)
    assert a[2] <= b[1]  # In order (truncation may trim A's end and B's start).
    assert first[3] == 0 and second[3] == 1


@pytest.mark.parametrize('kind', ['full_sentences', 'doc_sentences'])
def test_packing_uses_every_sentence_once(prepared_small, kind):
  _, prepared = prepared_small
  seq_len = 48  # Short, so that some sentences are longer and must be truncated.
  instances = _epoch_instances(prepared, kind, seq_len)
  corpus = prepared.split('train')
  coverage = {}
  for pieces, label in instances:
    assert label == 0
    n = 1 + sum(stop - start + 1 for _, start, stop, _ in pieces)
    assert n <= seq_len
    if kind == 'doc_sentences':
      assert len(pieces) == 1
    for tokens, start, stop, _ in pieces:
      cov = coverage.setdefault(id(tokens), np.zeros(len(tokens), np.int64))
      cov[start:stop] += 1
  truncated = 0
  for g in range(corpus.num_documents):
    tokens, bounds = corpus.document(g)
    cov = coverage[id(tokens)]
    for s0, s1 in zip(bounds[:-1], bounds[1:]):
      keep = min(s1 - s0, seq_len - 2)  # A longer sentence keeps its first seq_len-2 tokens.
      truncated += keep < s1 - s0
      assert (cov[s0:s0 + keep] == 1).all() and (cov[s0 + keep:s1] == 0).all()
  assert truncated > 0
  fill = np.mean([1 + sum(p[2] - p[1] + 1 for p in pieces) for pieces, _ in instances])
  if kind == 'full_sentences':
    assert fill > 0.75 * seq_len  # Crossing documents packs tightly.
    assert any(len(pieces) > 1 for pieces, _ in instances)


def test_packed_documents_use_every_token_once_in_full_rows(prepared_small):
  """Unpadded rows: documents back to back, each [CLS] ... [SEP] under its own id, cut at
  the row's end and continued in the next; padding only at a row's tail (< 3 tokens)."""
  c, prepared = prepared_small
  seq_len = 48
  instances = _epoch_instances(prepared, 'packed_documents', seq_len)
  corpus = prepared.split('train')
  coverage = {}
  for pieces, _ in instances:
    for tokens, start, stop, _ in pieces:
      assert stop > start
      cov = coverage.setdefault(id(tokens), np.zeros(len(tokens), np.int64))
      cov[start:stop] += 1
  for g in range(corpus.num_documents):
    tokens, bounds = corpus.document(g)
    assert (coverage[id(tokens)][bounds[0]:bounds[-1]] == 1).all()
  tok = prepared.tokenizer
  builder = builders.make('packed_documents', seed=0, short_seq_prob=0.1)
  rows = iterators.render(
      instances, seq_len, builder.template(tok.cls_id, tok.sep_id), tok.pad_id,
      per_document=builder.packs_documents)
  ids, seg, lengths, labels, documents = (rows[k] for k in (
      'input_ids', 'segment_ids', 'lengths', 'pair_labels', 'document_ids'))
  assert (seq_len - lengths[:-1] < 3).all() and (seg == 0).all() and (labels == 0).all()
  assert ((documents > 0) == (np.arange(seq_len) < lengths[:, None])).all()
  assert (ids[documents == 0] == tok.pad_id).all()
  for row_ids, row_docs in zip(ids, documents):
    starts = np.flatnonzero(np.diff(row_docs, prepend=0) > 0)
    ends = np.flatnonzero(np.diff(row_docs, append=0) != 0)
    assert (row_docs[starts] == np.arange(1, len(starts) + 1)).all()  # 1, 2, ... in order.
    assert (row_ids[starts] == tok.cls_id).all() and (row_ids[ends] == tok.sep_id).all()
    assert (ends - starts >= 2).all()  # At least one token between [CLS] and [SEP].
  assert max(len(p) for p, _ in instances) > 1  # Rows do hold several documents.
  # Through the iterator: the batches carry the ids, and MLM never selects a special token
  # (each document's [CLS]/[SEP]) or padding.
  c = c.copy_and_resolve_references()
  c.data.pair_kind = 'packed_documents'
  batch = next(iterators.make_train_iterator(c, prepared))
  assert batch['document_ids'].shape == batch['input_ids'].shape == (16, 64)
  tables = objectives.vocab_tables(c, tok, prepared.unigram_counts)
  masked = masking.mask_tokens(jax.random.key(0), batch['input_ids'], batch['input_mask'],
                               max_predictions=20, recipe=masking.MaskingRecipe(mask_rate=0.3),
                               tables=tables)
  picked = np.asarray(masked['masked_positions'])[np.asarray(masked['masked_weights']) > 0]
  rows = np.repeat(np.arange(16), 20).reshape(16, 20)[np.asarray(masked['masked_weights']) > 0]
  assert len(picked) > 100
  assert not np.isin(batch['input_ids'][rows, picked], tok.special_ids).any()
  assert (batch['document_ids'][rows, picked] > 0).all()


def test_unknown_pair_kind_lists_valid_ones():
  with pytest.raises(ValueError, match=r"unknown; valid: \['doc_sentences', "
                                       r"'full_sentences', 'nsp', 'packed_documents', 'sop', "
                                       r"'xlnet'\]"):
    builders.make('mlm_only', seed=0, short_seq_prob=0.1)


def test_xlnet_layout_puts_cls_last_in_its_own_segment():
  """XLNet's A [SEP] B [SEP] [CLS]: segments 0 (A and its [SEP]), 1 (B and its), 2 ([CLS])."""
  tokens = np.arange(100, 120)
  instances = [([(tokens, 0, 3, 0), (tokens, 10, 12, 1)], 1), ([(tokens, 5, 6, 0),
                                                             (tokens, 7, 8, 1)], 0)]
  builder = builders.REGISTRY['xlnet']
  rows = iterators.render(instances, 9, builder.template(2, 3), 0, builder.packs_documents)
  ids, seg, lengths, labels = (rows[k] for k in (
      'input_ids', 'segment_ids', 'lengths', 'pair_labels'))
  np.testing.assert_array_equal(ids[0], [100, 101, 102, 3, 110, 111, 3, 2, 0])
  np.testing.assert_array_equal(seg[0], [0, 0, 0, 0, 1, 1, 1, 2, 0])
  np.testing.assert_array_equal(ids[1], [105, 3, 107, 3, 2, 0, 0, 0, 0])
  np.testing.assert_array_equal(lengths, [8, 5])
  np.testing.assert_array_equal(labels, [1, 0])
  assert not builder.pair_labels  # XLNet reads no pair label.


def test_one_render_frames_every_builder_by_its_template():
  """``iterators.render`` lays out any template: the head before the first piece, each
  piece closed in its own segment, the tail after the last; per document, each piece alone
  under its own id. A row that does not fit is a builder's bug."""
  tokens = np.arange(100, 120)
  pieces = [(tokens, 0, 2, 0), (tokens, 4, 5, 1)]
  templates = {'bert': tokenizer_files.Template.bert(2, 3),
               'xlnet': tokenizer_files.Template.xlnet(2, 3)}
  assert {k: t.around_pieces() for k, t in templates.items()} == {
      'bert': (((2, 0),), (3,), ()), 'xlnet': ((), (3,), ((2, 2),))}
  rows = {(k, per): iterators.render([(pieces, 1)], 10, t, 0, per)
          for k, t in templates.items() for per in (False, True)}
  np.testing.assert_array_equal(rows['bert', False]['input_ids'][0], [2, 100, 101, 3, 104, 3, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows['bert', False]['segment_ids'][0], [0, 0, 0, 0, 1, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows['bert', True]['input_ids'][0], [2, 100, 101, 3, 2, 104, 3, 0, 0, 0])
  np.testing.assert_array_equal(rows['bert', True]['document_ids'][0], [1, 1, 1, 1, 2, 2, 2, 0, 0, 0])
  np.testing.assert_array_equal(rows['xlnet', True]['input_ids'][0], [100, 101, 3, 2, 104, 3, 2, 0, 0, 0])
  np.testing.assert_array_equal(rows['xlnet', True]['segment_ids'][0], [0, 0, 0, 2, 1, 1, 2, 0, 0, 0])
  assert ['document_ids' in rows['bert', per] for per in (False, True)] == [False, True]
  np.testing.assert_array_equal(rows['xlnet', False]['lengths'], [6])
  for seq_len, per in ((6, True), (5, False)):  # Rows of 7 and 6 tokens.
    with pytest.raises(AssertionError, match=f'more than {seq_len} tokens'):
      iterators.render([(pieces, 0)], seq_len, templates['bert'], 0, per)
  iterators.render([(pieces, 0)], 7, templates['bert'], 0, per_document=True)
  # A frame that does not close each text alike has no layout for several texts.
  with pytest.raises(ValueError, match='does not close each text alike'):
    tokenizer_files.Template.roberta(0, 2).around_pieces()
  # Every builder declares its template; only the packing of documents frames per piece.
  for kind, builder in builders.REGISTRY.items():
    want = tokenizer_files.Template.xlnet if kind == 'xlnet' else tokenizer_files.Template.bert
    assert builder.template(2, 3) == want(2, 3), kind
    assert builder.packs_documents == (kind == 'packed_documents'), kind


def _tiny_corpus(tmp_path, make_config, sp_model_path, kind, sources):
  c = make_config(str(tmp_path / f'prepared-{kind}'), sources=sources, held_out_fraction=0.0,
                  pair_kind=kind)
  c.tokenizer.path = sp_model_path  # The small corpus's SentencePiece: no training here.
  return c, data_lib.load_or_prepare(c)


def test_corpus_too_small_for_nsp_is_named_before_training(tmp_path, corpus_docs, write_docs,
                                                           make_config, sp_model_path, caplog):
  """One document, one-sentence documents: warned with the reason; no pair at all: stopped."""
  # The embedded corpus cut to its first document (18 sentences): negatives from itself.
  c, prepared = _tiny_corpus(tmp_path / 'one', make_config, sp_model_path, 'nsp',
                             'embedded;max_documents=1')
  assert prepared.manifest['splits']['train']['documents'] == 1
  with caplog.at_level('WARNING'):
    it = iterators.make_train_iterator(c, prepared)
  (warning,) = it.corpus_warnings
  assert 'has a single document' in warning and 'same document' in warning
  assert "pair_kind='full_sentences'" in warning and warning in caplog.text
  next(it)  # Warned, not stopped: the positives are real.

  # Real first sentences, one per document: no next sentence, so every label is 1.
  path = write_docs(tmp_path / 'first_sentences.txt', [d[:1] for d in corpus_docs[:60]])
  c, prepared = _tiny_corpus(tmp_path / 'first', make_config, sp_model_path, 'nsp',
                             f'text:{path}')
  it = iterators.make_train_iterator(c, prepared)
  assert len(it.corpus_warnings) == 1  # The first-pool check does not say it again.
  assert 'every one of its 60 documents has one sentence' in it.corpus_warnings[0]
  assert 'labels are all 1' in it.corpus_warnings[0]
  assert (np.concatenate([next(it)['pair_labels'] for _ in range(4)]) == 1).all()
  with pytest.raises(ValueError, match='has no held-out documents'):
    iterators.make_eval_iterator(c, prepared, 64)  # Held out is checked as well, when used.

  # One document of one sentence: nothing to pair with; stopped before any batch.
  path = write_docs(tmp_path / 'one_sentence.txt', [corpus_docs[0][:1]])
  c, prepared = _tiny_corpus(tmp_path / 'single', make_config, sp_model_path, 'nsp',
                             f'text:{path}')
  with pytest.raises(ValueError, match=r"1 document of 1 sentence: NSP \(config.data.pair_kind="
                                       r"'nsp'\) can build no pair"):
    iterators.make_train_iterator(c, prepared)
  c.data.pair_kind = 'full_sentences'  # Packing needs no pairs.
  assert not iterators.make_train_iterator(c, prepared).corpus_warnings


def test_corpus_too_small_for_sop_is_named_before_training(tmp_path, corpus_docs, write_docs,
                                                           make_config, sp_model_path):
  path = write_docs(tmp_path / 'first_sentences.txt', [d[:1] for d in corpus_docs[:60]])
  c, prepared = _tiny_corpus(tmp_path / 'first', make_config, sp_model_path, 'sop',
                             f'text:{path}')
  (warning,) = iterators.make_train_iterator(c, prepared).corpus_warnings
  assert 'no sentence order to learn' in warning
  # Documents of one token each: SOP has nothing to cut (without the check: an endless
  # search for a first example).
  path = write_docs(tmp_path / 'words.txt', [['the'], ['a'], ['is']])
  c, prepared = _tiny_corpus(tmp_path / 'words', make_config, sp_model_path, 'sop',
                             f'text:{path}')
  assert prepared.manifest['splits']['train']['tokens'] == 3
  with pytest.raises(ValueError, match='3 documents of one token each: SOP'):
    iterators.make_train_iterator(c, prepared)


def test_first_pool_of_one_pair_label_is_warned(make_config):
  c = make_config()
  ones = np.ones(iterators._ONE_CLASS_MIN_EXAMPLES, np.int32)  # pylint: disable=protected-access
  warning = iterators._one_class_warning(c, ones, 64)  # pylint: disable=protected-access
  assert 'have pair label 1' in warning and 'seq_len - 3 = 61 tokens' in warning
  ones[3] = 0
  assert iterators._one_class_warning(c, ones, 64) is None  # pylint: disable=protected-access
  assert iterators._one_class_warning(c, ones[4:], 64) is None  # Too few to tell.
