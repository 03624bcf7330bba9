"""Packed rows (``models.packing``): a row of several documents gives each document the
states it has alone in its own row (absolute positions, RoPE, a local window, the last
layer at some rows), nothing attends across documents, and kinds that cannot keep the
documents apart are refused, naming the kind."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.config import schema as config_base
from encoder_jax.config import validation
from encoder_jax.models import modernbert
from encoder_jax.models import packing
from encoder_jax.models import registry
from encoder_jax.objectives import base

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

TINY = dict(vocab_size=97, hidden_size=24, num_layers=3, num_heads=2, intermediate_size=40,
            max_position_embeddings=32, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
# Kind -> its overrides: BERT (absolute positions), RoBERTa (positions after the padding
# id), ModernBERT (rotary, a 4-token window on layers 1 and 2 at 24 tokens: band by band).
KINDS = {
    'bert': {},
    'roberta': dict(position_offset=2, type_vocab_size=1, max_position_embeddings=34),
    'modernbert': dict(modernbert.PUBLISHED, local_attention=4, global_attn_every_n_layers=3),
}
LENGTH = 24
DOCS = (9, 11)  # Two documents ([CLS] ... [SEP]) packed into one row of 24: 4 padding.


def _network(kind):
  return registry.network({**TINY, 'kind': kind, **KINDS[kind]})


def _rows(rng):
  """(packed ids, document ids, and each document alone in its own row)."""
  ids = np.zeros((1, LENGTH), np.int32)
  documents = np.zeros((1, LENGTH), np.int32)
  alone, pos = [], 0
  for d, n in enumerate(DOCS):
    doc = np.concatenate([[2], rng.integers(5, 97, n - 2), [3]]).astype(np.int32)
    ids[0, pos:pos + n], documents[0, pos:pos + n] = doc, d + 1
    row = np.zeros((1, LENGTH), np.int32)
    row[0, :n] = doc
    alone.append(row)
    pos += n
  return ids, documents, alone


@pytest.mark.parametrize('kind', sorted(KINDS))
def test_each_document_of_a_packed_row_reads_as_if_alone(kind):
  net = _network(kind)
  params = net.init(jax.random.key(0))
  # Compiled whole (a program per input shape), not run op by op.
  encode, read = jax.jit(net.encoder.apply), jax.jit(net.pretraining.apply)
  ids, documents, alone = _rows(np.random.default_rng(0))
  zeros = np.zeros_like(ids)
  packed = encode({'params': params}, ids, zeros, (documents > 0).astype(np.int32),
                  document_ids_BxL=documents)['sequence_output']
  # The last layer at some rows (the MLM head's positions) reads the same documents.
  rows = np.array([[1, 5, 10, 17]], np.int32)
  logits = read({'params': params}, ids, zeros, (documents > 0).astype(np.int32), rows,
                document_ids_BxL=documents)['mlm_logits']
  start = 0
  for d, (n, row) in enumerate(zip(DOCS, alone)):
    mask = (row > 0).astype(np.int32)
    single = encode({'params': params}, row, zeros, mask)['sequence_output']
    np.testing.assert_allclose(packed[0, start:start + n], single[0, :n], atol=2e-5,
                               err_msg=f'document {d + 1}')
    mine = [i for i, r in enumerate(rows[0]) if start <= r < start + n]
    single_logits = read({'params': params}, row, zeros, mask, rows[:, mine] - start)['mlm_logits']
    np.testing.assert_allclose(logits[0, mine], single_logits[0], atol=1e-4)
    start += n


def test_nothing_attends_across_documents():
  net = _network('modernbert')
  params = net.init(jax.random.key(1))
  ids, documents, _ = _rows(np.random.default_rng(1))
  other = ids.copy()
  other[0, DOCS[0] + 1:DOCS[0] + DOCS[1] - 1] = 7  # The second document's words changed.
  run = lambda x: net.encoder.apply({'params': params}, x, np.zeros_like(x),
                                    (documents > 0).astype(np.int32),
                                    document_ids_BxL=documents)['sequence_output']
  a, b = run(ids), run(other)
  np.testing.assert_array_equal(a[0, :DOCS[0]], b[0, :DOCS[0]])
  assert np.abs(a[0, DOCS[0]:sum(DOCS)] - b[0, DOCS[0]:sum(DOCS)]).max() > 1e-3


def test_positions_restart_at_each_document():
  documents = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(packing.positions(documents),
                                [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))])
  mask = packing.same_document(documents, documents)[:, 0]
  assert mask.shape == (2, 8, 8) and bool(mask[1].all())
  assert not bool(mask[0, 2, 3]) and bool(mask[0, 3, 4]) and not bool(mask[0, 5, 6])


def _packed_config(**model):
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  c.objective.names = ('mlm',)
  c.data.pair_kind = 'packed_documents'
  c.model.update(model)
  return c


@pytest.mark.parametrize('kind', ['bert', 'roberta', 'albert', 'modernbert'])
def test_kinds_that_keep_documents_apart_accept_packed_rows(kind):
  model = {**KINDS.get(kind, dict(embedding_size=16)), 'kind': kind}
  if kind == 'roberta':
    model['max_position_embeddings'] = 130  # The local run's 128 tokens after offset 2.
  assert validation.problems(_packed_config(**model)) == []


def test_a_kind_that_cannot_keep_documents_apart_is_refused_by_name():
  c = _packed_config(kind='xlnet', type_vocab_size=3)
  c.objective.names = ('plm',)
  found = validation.problems(c)
  assert any("config.model.kind='xlnet' cannot keep them apart" in p and 'modernbert' in p
             for p in found), found
  c = _packed_config(kind='deberta', attention_kind='disentangled', type_vocab_size=0,
                     position_biased_input=False)
  found = validation.problems(c)
  assert any("config.model.kind='deberta' cannot keep them apart" in p for p in found), found
  with pytest.raises(validation.ConfigError, match='packed_documents'):
    validation.validate(c)
  # And at run time, should a packed batch reach such a network anyway.
  with pytest.raises(ValueError, match="kind='deberta' cannot read packed rows"):
    base.packed_inputs(registry.network(c.model), {'document_ids': np.ones((1, 4))})
