"""Sentence-BERT fine-tuning (both objectives), its STS evaluation, and the exports: the
sentence-transformers directory embeds as encoder_jax does, and the workdir is what `embed`
and `encoder_jax.load` read."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import encoder_jax
from encoder_jax.loading import inference
from encoder_jax.finetune import sbert
from encoder_jax.finetune.tasks import sentence_embedding

from support import hf_tokenizer_dirs


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

NLI = [  # (premise, hypothesis, label)
    ('A man is playing a guitar on stage.', 'A man is performing music.', 'entailment'),
    ('A man is playing a guitar on stage.', 'The man is famous.', 'neutral'),
    ('A man is playing a guitar on stage.', 'The man is asleep in bed.', 'contradiction'),
    ('Two dogs run through the snow.', 'Animals are outside.', 'entailment'),
    ('Two dogs run through the snow.', 'The dogs are chasing a ball.', 'neutral'),
    ('Two dogs run through the snow.', 'The dogs are sleeping indoors.', 'contradiction'),
    ('A woman slices an onion in the kitchen.', 'Someone is cooking.', 'entailment'),
    ('A woman slices an onion in the kitchen.', 'The woman is a chef.', 'neutral')]
STS = [('A man is playing a guitar.', 'A man plays the guitar.', 4.8),
       ('A woman is slicing an onion.', 'A woman is cutting an onion.', 4.2),
       ('A dog runs in the field.', 'A dog is running across a field.', 3.8),
       ('A child is reading a book.', 'A man is driving a car.', 0.2),
       ('The sun is shining.', 'It is raining heavily.', 0.6),
       ('Two people are dancing.', 'A cat sleeps on the sofa.', 0.0),
       ('A plane is taking off.', 'An airplane is departing.', 4.5),
       ('A boy kicks a ball.', 'The stock market fell today.', 0.1)]


@pytest.fixture(scope='module')
def bert_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('sbert') / 'hf')
  hf_tokenizer_dirs.make_dir('bert', path)
  return path


def _jsonl(path, rows):
  with open(path, 'w', encoding='utf-8') as f:
    for r in rows:
      f.write(json.dumps(r) + '\n')
  return f'jsonl:{path}'


@pytest.mark.slow  # A tokenizer, a fine-tune, two exports, sentence-transformers loading.
def test_nli_classification_exports_for_sentence_transformers_and_embed(bert_dir, tmp_path):
  train = _jsonl(tmp_path / 'nli.jsonl', [dict(premise=a, hypothesis=b, label=y)
                                          for a, b, y in NLI])
  sts = _jsonl(tmp_path / 'sts.jsonl', [dict(sentence1=a, sentence2=b, label=y)
                                        for a, b, y in STS])
  config = sbert.sbert_config(dict(hf_dir=bert_dir), train, sts, epochs=2,
                              batch_size=8, learning_rate=1e-3, max_len=32)
  out = str(tmp_path / 'out')
  result = sbert.finetune(config, out)
  assert result['train_rows'] == 8 and -1.0 <= result['eval_spearman'] <= 1.0
  assert result['eval_examples'] == 8
  print(f"STS (8 pairs, tiny BERT after 2 NLI epochs): Spearman {result['eval_spearman']:.3f}")
  # The sentence-transformers export embeds as encoder_jax's workdir does.
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  st = SentenceTransformer(result['export'], device='cpu')
  sentences = [s for a, b, _ in STS for s in (a, b)]
  theirs = st.encode(sentences, convert_to_numpy=True)
  loaded = encoder_jax.load(result['workdir'])
  ours = loaded.embed(sentences)  # Pooling and normalisation: the export's, by default.
  cosine = (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(
      theirs, axis=-1)
  assert cosine.min() >= 0.9999, cosine.min()
  assert np.allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-5)
  # The classifier head was trained and dropped: the export is the encoder alone.
  modules = json.load(open(os.path.join(result['export'], 'modules.json')))
  assert [m['type'].rsplit('.', 1)[1] for m in modules] == ['Transformer', 'Pooling',
                                                            'Normalize']


@pytest.mark.slow
def test_contrastive_triples_loss_is_in_batch_cross_entropy(bert_dir, tmp_path):
  rows = [dict(anchor=a, positive=b, negative=NLI[(i + 2) % len(NLI)][1])
          for i, (a, b, y) in enumerate(NLI) if y == 'entailment'] * 3
  train = _jsonl(tmp_path / 'triples.jsonl', rows)
  config = sbert.sbert_config(dict(hf_dir=bert_dir), train, epochs=1,
                              batch_size=8, learning_rate=1e-3, objective='contrastive',
                              fields=('anchor', 'positive', 'negative'), max_len=32,
                              pooling='max')
  result = sbert.finetune(config, str(tmp_path / 'out'))
  assert np.isfinite(result['train_loss']) and result['train_rows'] == 9
  # The loss on a batch equals cross-entropy over scale x cosine against every candidate.
  loaded = encoder_jax.load(bert_dir)
  tok = loaded.tokenizer
  texts = [(r['anchor'], r['positive'], r['negative']) for r in rows[:3]]
  batch = {k: jnp.asarray(v) for k, v in sentence_embedding.encode(tok, texts, 32, 3).items()}
  batch['weights'] = jnp.ones(3, jnp.float32)
  model = sentence_embedding.Siamese(loaded.model_config, 'mean', tok.cls_index)
  task = sentence_embedding.SiameseTask(model, None, 32,
                                        sentence_embedding.contrastive_loss(20.0, 3), 3)
  params = task.init(jax.random.PRNGKey(0))
  loss, _ = task.loss_fn(params, batch, None, None, False)
  stack = sentence_embedding._stack  # pylint: disable=protected-access
  sides = stack(batch, sentence_embedding.SIDES)
  emb = np.asarray(inference.l2_normalize(model.apply({'params': params}, *sides)))
  scores = 20.0 * emb[:3] @ emb[3:].T
  logp = scores - np.log(np.exp(scores).sum(-1, keepdims=True))
  assert float(loss) == pytest.approx(-np.mean(np.diag(logp)), rel=1e-4)


def test_bad_settings_are_named():
  """The settings are the config's fields, checked where they are declared, before the
  encoder is loaded."""
  for bad, says in ((dict(objective='triplet'), "config.task='sbert_triplet'"),
                    (dict(fields=('a', 'b', 'c')), 'three .*contrastive'),
                    (dict(pooling='first'), "config.pooling='first'"),
                    (dict(scale=0.0), r'config.task_settings.scale=0.0: expected a number > 0')):
    config = sbert.sbert_config(dict(hf_dir='/nowhere'), 'jsonl:/x', **bad)
    with pytest.raises(ValueError, match=says):
      sbert.finetune(config, '/tmp/x')
