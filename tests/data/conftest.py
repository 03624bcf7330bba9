"""Fixtures for the input-pipeline tests: a small real corpus, prepared once per session."""

import os

import pytest

from encoder_jax.config import schema as config_base
from encoder_jax import data as data_lib
from encoder_jax.data import embedded

SMALL_DOCS = 400  # Embedded documents in the shared small corpus.
SMALL_VOCAB = 1000


def small_config(prepared_dir: str = '', **data_overrides):
  """The local-run recipe, cut to a corpus and vocabulary that prepare in seconds."""
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  c.model.vocab_size = SMALL_VOCAB
  c.data.update(sources=f'embedded;max_documents={SMALL_DOCS}', prepared_dir=prepared_dir,
                num_workers=1, shuffle_pool_examples=256, held_out_fraction=0.1)
  c.data.update(**data_overrides)
  c.tokenizer.train_sentences = 20_000
  c.train.update(batch_size=16, num_steps=40, seq_lens=(64, 128), max_predictions=(10, 20),
                 phase_fractions=(0.5, 0.5), eval_batches=3)
  return c


@pytest.fixture(scope='session')
def prepared_small(tmp_path_factory):
  """(config, PreparedData) for the shared small corpus (SentencePiece trained on it)."""
  d = str(tmp_path_factory.mktemp('prepared_small') / 'p')
  c = small_config(d)
  return c, data_lib.load_or_prepare(c)


@pytest.fixture(scope='session')
def sp_model_path(prepared_small):
  """A trained SentencePiece model with encoder_jax's ids (reused to skip training)."""
  _, prepared = prepared_small
  return os.path.join(prepared.directory, 'tokenizer.model')


@pytest.fixture(scope='session')
def corpus_docs():
  """The embedded corpus (documents as lists of sentences), parsed once."""
  return embedded.embedded_corpus()


def write_bert_layout(path, documents):
  """google-research/bert layout: one sentence per line, a blank line between documents."""
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n\n'.join('\n'.join(doc) for doc in documents) + '\n')
  return str(path)


@pytest.fixture(scope='session')
def make_config():
  """``small_config(prepared_dir, **data_overrides)``."""
  return small_config


@pytest.fixture(scope='session')
def write_docs():
  """``write_bert_layout(path, documents) -> str(path)``."""
  return write_bert_layout
