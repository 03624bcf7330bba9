"""Loading: determinism, the same global batches on every topology, exact resume (on another
topology too), eval split, mixing."""

import collections
import json

import numpy as np
import pytest

from encoder_jax import data as data_lib
from encoder_jax.data import builders
from encoder_jax.data import iterators
from encoder_jax.data import mixing
from encoder_jax.data import tokenizer_training
from encoder_jax.data import sources

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def _config(prepared_small, **data):
  c, prepared = prepared_small
  c = c.copy_and_resolve_references()
  c.data.update(**data)
  return c, prepared


def _take(it, n):
  return [next(it) for _ in range(n)]


def _same(batches_a, batches_b):
  assert len(batches_a) == len(batches_b)
  for a, b in zip(batches_a, batches_b):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _rows(batches):
  return [tuple(r[m > 0]) for b in batches for r, m in zip(b['input_ids'], b['input_mask'])]


@pytest.mark.parametrize('kind', ['nsp', 'full_sentences'])
def test_same_seed_same_stream_other_seed_other_stream(prepared_small, kind):
  c, prepared = _config(prepared_small, pair_kind=kind)
  a = _take(data_lib.make_train_iterator(c, prepared), 6)
  _same(a, _take(data_lib.make_train_iterator(c, prepared), 6))
  c.seed = 1
  b = _take(data_lib.make_train_iterator(c, prepared), 6)
  assert len(set(_rows(a)) & set(_rows(b))) < len(_rows(a)) // 4


def test_streams_read_disjoint_slices_whose_union_is_everything(prepared_small):
  """NSP over one epoch: stream 0 + stream 1 give exactly the single-stream examples."""
  _, prepared = prepared_small
  corpus = prepared.split('train')

  def epoch_rows(process_index, process_count):
    stream = iterators.DocumentStream(
        corpus, lambda e: mixing.epoch_order(0, 0, corpus.source_offsets, None, None)
        if e == 0 else None, process_index, process_count)
    builder = builders.make('nsp', seed=0, short_seq_prob=0.1)
    instances = [inst for inst, _ in builder.generate(stream, (0, 0, 0), 64)]
    rows = iterators.render(instances, 64, builder.template(2, 3), 0)
    ids, lengths, labels = rows['input_ids'], rows['lengths'], rows['pair_labels']
    return collections.Counter((tuple(r[:n]), l) for r, n, l in zip(ids, lengths, labels))

  single = epoch_rows(0, 1)
  p0, p1 = epoch_rows(0, 2), epoch_rows(1, 2)
  assert not set(p0) & set(p1)
  assert p0 + p1 == single
  assert abs(sum(p0.values()) - sum(p1.values())) < 0.2 * sum(single.values())


def _global(c, prepared, n, steps, states=None):
  """``n`` processes' batches side by side (optionally restored from one global state)."""
  its = [data_lib.make_train_iterator(c, prepared, i, n) for i in range(n)]
  for it in its:
    if states is not None:
      it.set_state(json.loads(json.dumps(states)))  # As stored via ocp.args.JsonSave.
  batches = [[next(it) for it in its] for _ in range(steps)]
  out = [{k: np.concatenate([p[k] for p in parts]) for k in parts[0]} for parts in batches]
  return out, its


@pytest.mark.parametrize('kind, streams', [('nsp', 0), ('full_sentences', 0), ('sop', 4)])
def test_global_batches_do_not_depend_on_the_number_of_processes(prepared_small, kind,
                                                                 streams):
  """Steps 0..23 across the 64 -> 128 switch: 2, 4, 8 processes side by side give exactly
  the 1-process batches (with 4 streams, 8 processes split streams in half)."""
  c, prepared = _config(prepared_small, pair_kind=kind, streams=streams)
  reference, (single,) = _global(c, prepared, 1, 24)
  assert single.num_streams == (streams or 16) and single.streams == list(range(
      single.num_streams))
  for n in (2, 4, 8):
    got, its = _global(c, prepared, n, 24)
    _same(reference, got)
    assert got[0]['input_ids'].shape == (16, 64) and its[0].batch_size == 16 // n
  # A process builds only the streams of its rows.
  assert [it.streams for it in its] == ([[2 * j, 2 * j + 1] for j in range(8)] if not streams else
                                        [[j // 2] for j in range(8)])
  # Any contiguous rows (e.g. a process's from a mesh) are the same rows of the batch.
  part = _take(data_lib.make_train_iterator(c, prepared, rows=(3, 11)), 24)
  _same([{k: v[3:11] for k, v in b.items()} for b in reference], part)
  with pytest.raises(ValueError, match='divisible by process_count = 3'):
    data_lib.make_train_iterator(c, prepared, 0, 3)


@pytest.mark.parametrize('saved_by, resumed_by', [(1, 2), (2, 1), (4, 2), (8, 1)])
def test_resume_on_another_number_of_processes(prepared_small, saved_by, resumed_by):
  c, prepared = _config(prepared_small, pair_kind='nsp')
  reference, _ = _global(c, prepared, 1, 30)
  _, its = _global(c, prepared, saved_by, 17)  # Mid-pool, after the phase switch.
  state = data_lib.merge_states([it.get_state() for it in its])
  assert sorted(map(int, state['streams'])) == list(range(16)) and state['step'] == 17
  got, _ = _global(c, prepared, resumed_by, 13, state)
  _same(reference[17:], got)


def test_a_changed_batch_size_on_resume_is_refused(prepared_small):
  c, prepared = _config(prepared_small)
  it = data_lib.make_train_iterator(c, prepared)
  next(it)
  state = it.get_state()
  c.train.batch_size = 32
  with pytest.raises(ValueError, match=r'trained with config.train.batch_size = 16; this run '
                     'has 32.*same global batch'):
    data_lib.make_train_iterator(c, prepared).set_state(state)
  c.train.batch_size, c.data.streams = 16, 5
  with pytest.raises(ValueError, match=r'config.data.streams = 5 must divide '
                     'config.train.batch_size = 16'):
    data_lib.make_train_iterator(c, prepared)


@pytest.mark.parametrize('kind', ['nsp', 'sop', 'full_sentences', 'doc_sentences',
                                  'packed_documents'])
def test_restore_gives_identical_batches_across_the_phase_switch(prepared_small, kind):
  # pool of 256 examples, 16 per batch: pools end at steps 16, 32...; the length switches
  # from 64 to 128 at step 20 (50% of 40 steps).
  c, prepared = _config(prepared_small, pair_kind=kind)
  reference = _take(data_lib.make_train_iterator(c, prepared), 30)
  assert reference[19]['input_ids'].shape[1] == 64 and reference[20]['input_ids'].shape[1] == 128
  it = data_lib.make_train_iterator(c, prepared)
  states = []
  for _ in range(30):
    states.append(json.loads(json.dumps(it.get_state())))  # As stored via ocp.args.JsonSave.
    next(it)
  for k in (0, 1, 15, 16, 17, 19, 20, 21, 29):
    restored = data_lib.make_train_iterator(c, prepared)
    restored.set_state(states[k])
    _same(reference[k:], _take(restored, 30 - k))


def test_restore_when_the_length_shrinks(prepared_small):
  """128 -> 64: the rest of the 128-token pool is dropped, resume is still exact."""
  c, prepared = _config(prepared_small, pair_kind='nsp')
  c.train.update(seq_lens=(128, 64), max_predictions=(20, 10))
  reference = _take(data_lib.make_train_iterator(c, prepared), 26)
  assert [b['input_ids'].shape[1] for b in reference[19:21]] == [128, 64]
  it = data_lib.make_train_iterator(c, prepared)
  _take(it, 20)
  state = json.loads(json.dumps(it.get_state()))
  restored = data_lib.make_train_iterator(c, prepared)
  restored.set_state(state)
  _same(reference[20:], _take(restored, 6))


def test_restore_refuses_a_state_from_other_settings(prepared_small):
  c, prepared = _config(prepared_small)
  it = data_lib.make_train_iterator(c, prepared)
  next(it)
  state = it.get_state()
  c.data.pair_kind = 'sop'
  with pytest.raises(ValueError, match=r"pair_kind.*'nsp', 'sop'"):
    data_lib.make_train_iterator(c, prepared).set_state(state)
  c.data.pair_kind = 'nsp'
  with pytest.raises(ValueError, match=r"'streams': \(16, 8\)"):
    c.data.streams = 8
    data_lib.make_train_iterator(c, prepared, 0, 2).set_state(state)
  with pytest.raises(ValueError, match='format 1'):
    data_lib.make_train_iterator(c, prepared).set_state(dict(state, format=1))


def test_epochs_reshuffle_and_cover_every_document(prepared_small):
  _, prepared = prepared_small
  corpus = prepared.split('train')
  orders = [mixing.epoch_order(0, e, corpus.source_offsets, None, None) for e in range(2)]
  for order in orders:
    assert sorted(order.tolist()) == list(range(corpus.num_documents))
  assert (orders[0] != orders[1]).any()


def test_eval_iterator_is_finite_deterministic_and_held_out(prepared_small):
  c, prepared = _config(prepared_small)
  a = list(data_lib.make_eval_iterator(c, prepared, 64))
  assert 1 <= len(a) <= c.train.eval_batches
  _same(a, list(data_lib.make_eval_iterator(c, prepared, 64)))
  assert a[0]['input_ids'].shape == (16, 64)
  train_rows = set(_rows(_take(data_lib.make_train_iterator(c, prepared), 20)))
  assert not set(_rows(a)) & train_rows
  # Each process keeps its rows of the same global batches.
  halves = [list(data_lib.make_eval_iterator(c, prepared, 64, i, 2)) for i in range(2)]
  assert halves[0][0]['input_ids'].shape == (8, 64)
  _same(a, [{k: np.concatenate([h0[k], h1[k]]) for k in h0} for h0, h1 in zip(*halves)])
  c.train.batch_size = 4096
  with pytest.raises(ValueError, match='smaller than one batch'):
    data_lib.make_eval_iterator(c, prepared, 64)


def test_alpha_sampling_proportions(tmp_path, corpus_docs, make_config, sp_model_path,
                                    write_docs):
  """Two sources of very different size: sentence shares follow q ~ p**0.3."""
  write_docs(tmp_path / 'big.txt', corpus_docs[:300])
  write_docs(tmp_path / 'small.txt', corpus_docs[300:330])
  c = make_config(str(tmp_path / 'p'), sources=f'text:{tmp_path}/big.txt,'
                  f'text:{tmp_path}/small.txt', held_out_fraction=0.0, mixing_alpha=0.3)
  c.tokenizer.path = sp_model_path
  prepared = data_lib.load_or_prepare(c)
  n = np.array([s['train']['sentences'] for s in prepared.manifest['sources']], float)
  p = n / n.sum()
  q = p ** 0.3 / (p ** 0.3).sum()
  assert q[1] > 2 * p[1]  # The small source is up-sampled.
  corpus = prepared.split('train')
  counts = corpus.sentence_counts_by_source()
  shares = []
  for epoch in range(20):
    order = mixing.epoch_order(0, epoch, corpus.source_offsets, q, counts)
    small = order >= corpus.source_offsets[1]
    per_doc = np.concatenate(counts)[order]
    shares.append(per_doc[small].sum() / per_doc.sum())
  assert abs(np.mean(shares) - q[1]) < 0.02, (np.mean(shares), q[1])
  # Each epoch holds about one corpus worth of sentences.
  assert abs(per_doc.sum() / n.sum() - 1) < 0.05
  # The iterator mixes them; explicit weights override alpha.
  it = data_lib.make_train_iterator(c, prepared)
  np.testing.assert_allclose(it.source_probabilities, q)
  c.data.sources = f'text:{tmp_path}/big.txt@3,text:{tmp_path}/small.txt@1'
  weights = [s.weight for s in sources.parse_sources(c.data)]
  np.testing.assert_allclose(mixing.source_probabilities([1, 1], weights, 0.3), [0.75, 0.25])
  # Tokenizer training sentences are sampled with the same q (here from byte sizes).
  c.data.sources = f'text:{tmp_path}/big.txt,text:{tmp_path}/small.txt'
  c.tokenizer.train_sentences = 5000
  srcs = sources.parse_sources(c.data)
  sents = tokenizer_training.training_sentences(c, srcs)
  small_set = {s for d in corpus_docs[300:330] for s in d}
  sizes = np.array([s.size_hint_bytes() for s in srcs], float)
  q_bytes = (sizes / sizes.sum()) ** 0.3
  q_bytes /= q_bytes.sum()
  share = np.mean([s in small_set for s in sents])
  assert len(sents) == 5000 and abs(share - q_bytes[1]) < 0.01
  # A corpus smaller than the budget is not repeated up to it.
  c.tokenizer.train_sentences = 10 ** 6
  sents = tokenizer_training.training_sentences(c, srcs)
  assert len(sents) == sum(len(d) for d in corpus_docs[:330])
  assert abs(np.mean([s in small_set for s in sents]) - q_bytes[1]) < 0.01
