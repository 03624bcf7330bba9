"""The GLUE runner: official metrics on hand-made cases, and three task types end to end on
a tfds dataset built in the test (GLUE's configs and fields, real sentences, no network)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from encoder_jax.finetune import glue
from encoder_jax.finetune import scores as metrics

from support import hf_fixtures


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def test_matthews_correlation_by_its_definition():
  gold = np.array([1, 1, 1, 0, 0, 0, 1, 0])
  pred = np.array([1, 1, 0, 0, 0, 1, 1, 0])  # tp=3 tn=3 fp=1 fn=1.
  assert metrics.matthews(pred, gold) == pytest.approx((9 - 1) / 16)
  assert metrics.matthews(gold, gold) == pytest.approx(1.0)
  assert metrics.matthews(1 - gold, gold) == pytest.approx(-1.0)
  assert metrics.matthews(np.ones(8, int), gold) == 0.0  # Undefined: one class predicted.


def test_pearson_and_spearman_with_ties():
  a = np.array([1.0, 2.0, 2.0, 3.0, 5.0])
  b = np.array([2.0, 1.0, 4.0, 4.0, 9.0])
  # Ranks with ties averaged: a -> 1, 2.5, 2.5, 4, 5; b -> 2, 1, 3.5, 3.5, 5.
  ra, rb = np.array([1, 2.5, 2.5, 4, 5]), np.array([2, 1, 3.5, 3.5, 5])
  assert metrics.spearman(a, b) == pytest.approx(np.corrcoef(ra, rb)[0, 1])
  assert metrics.pearson(a, b) == pytest.approx(np.corrcoef(a, b)[0, 1])
  assert metrics.spearman(a, a ** 3) == pytest.approx(1.0)  # Monotone: rank-perfect.


def test_glue_score_counts_mnli_twice_and_averages_two_metric_tasks():
  columns = {'cola': {'matthews': 0.5}, 'mrpc': {'f1': 0.9, 'accuracy': 0.8},
             'mnli': {'matched': 0.7, 'mismatched': 0.6}}
  assert glue.glue_score(columns) == pytest.approx((0.5 + 0.85 + 0.7 + 0.6) / 4)
  assert '| GLUE score | mean over tasks | 66.2 |' in glue.table(columns)  # 66.25.


ACCEPTABLE = ['The cat sat on the mat.', 'She reads a book every night.',
              'They went to the market yesterday.', 'The children played in the park.',
              'He wrote a long letter to his mother.', 'We will visit Paris next summer.']
UNACCEPTABLE = ['Cat the mat sat on the.', 'She a book reads night every.',
                'Went they market to yesterday the.', 'Played the park children in the.',
                'Letter long wrote he mother his to a.', 'Summer will next we Paris visit.']
PAIRS = [  # (sentence1, sentence2, similarity 0..5)
    ('A man is playing a guitar.', 'A man is playing a guitar.', 5.0),
    ('A woman is slicing an onion.', 'A woman is cutting an onion.', 4.2),
    ('A dog runs in the field.', 'A dog is running across a field.', 3.8),
    ('A child is reading a book.', 'A man is driving a car.', 0.2),
    ('The sun is shining.', 'It is raining heavily.', 0.6),
    ('Two people are dancing.', 'A cat sleeps on the sofa.', 0.0)]
NLI = [  # (premise, hypothesis, label: entailment, neutral, contradiction)
    ('A man is playing a guitar on stage.', 'A man is performing music.', 0),
    ('A man is playing a guitar on stage.', 'The man is famous.', 1),
    ('A man is playing a guitar on stage.', 'The man is asleep in bed.', 2),
    ('Two dogs run through the snow.', 'Animals are outside.', 0),
    ('Two dogs run through the snow.', 'The dogs are chasing a ball.', 1),
    ('Two dogs run through the snow.', 'The dogs are sleeping indoors.', 2)]


def _build_tiny_glue(data_dir: str):
  tfds = pytest.importorskip('tensorflow_datasets')

  class TinyGlue(tfds.core.GeneratorBasedBuilder):  # pylint: disable=unused-variable
    """GLUE's configs and fields for three task types, built locally."""
    VERSION = tfds.core.Version('1.0.0')
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=n) for n in ('cola', 'stsb', 'mnli')]

    def _info(self):
      name = self.builder_config.name
      if name == 'cola':
        features = {'sentence': tfds.features.Text(),
                    'label': tfds.features.ClassLabel(names=['unacceptable', 'acceptable'])}
      elif name == 'stsb':
        features = {'sentence1': tfds.features.Text(), 'sentence2': tfds.features.Text(),
                    'label': tfds.features.Scalar(np.float32)}
      else:
        features = {'premise': tfds.features.Text(), 'hypothesis': tfds.features.Text(),
                    'label': tfds.features.ClassLabel(
                        names=['entailment', 'neutral', 'contradiction'])}
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
      del dl_manager
      if self.builder_config.name == 'mnli':
        return {'train': self._generate_examples(3),
                'validation_matched': self._generate_examples(1),
                'validation_mismatched': self._generate_examples(1)}
      return {'train': self._generate_examples(3), 'validation': self._generate_examples(1)}

    def _generate_examples(self, repeat):
      name = self.builder_config.name
      if name == 'cola':
        rows = ([{'sentence': s, 'label': 1} for s in ACCEPTABLE]
                + [{'sentence': s, 'label': 0} for s in UNACCEPTABLE])
      elif name == 'stsb':
        rows = [{'sentence1': a, 'sentence2': b, 'label': y} for a, b, y in PAIRS]
      else:
        rows = [{'premise': a, 'hypothesis': b, 'label': y} for a, b, y in NLI]
      for i, row in enumerate(rows * repeat):
        yield i, row

  for name in ('stsb', 'mnli'):
    tfds.builder(f'tiny_glue/{name}', data_dir=data_dir).download_and_prepare()


@pytest.mark.slow  # Two fine-tunes: regression, and classification scored on two splits.
def test_glue_runner_regression_and_matched_mismatched(tmp_path):
  hf_dir = str(tmp_path / 'hf')
  os.makedirs(hf_dir)
  vocab_size = hf_fixtures.write_vocab(os.path.join(hf_dir, 'vocab.txt'))
  hf_fixtures.random_hf_model(vocab_size=vocab_size, hidden_size=32, num_layers=1, num_heads=4,
                              intermediate_size=48, max_positions=64,
                              randomize=False).save_pretrained(hf_dir)
  data_dir = str(tmp_path / 'tfds')
  _build_tiny_glue(data_dir)
  out = str(tmp_path / 'glue')
  s = glue.GlueSettings(epochs=1, batch_size=8, learning_rate=3e-3, max_len=32)
  summary = glue.run(dict(hf_dir=hf_dir), out, ['stsb', 'mnli'], s, 'tiny_glue', data_dir)
  cols = summary['columns']
  assert set(cols) == {'stsb', 'mnli'}
  assert set(cols['stsb']) == {'pearson', 'spearman'}
  assert set(cols['mnli']) == {'matched', 'mismatched'}
  # Matched and mismatched are the same rows here, so the same predictions.
  assert cols['mnli']['matched'] == cols['mnli']['mismatched']
  assert summary['results']['stsb']['eval_examples'] == 6
  assert json.load(open(os.path.join(out, 'glue.json')))['glue_score'] == pytest.approx(
      summary['glue_score'])
  assert '| GLUE score |' in open(os.path.join(out, 'glue.md')).read()
  assert os.path.isdir(os.path.join(out, 'stsb', 'checkpoints'))  # The engine's checkpoints.
