"""Config sections owned by the input pipeline: ``data`` and ``tokenizer``.

DRAFT: the data pipeline owner refines these fields; every key must be read by code.
"""

from __future__ import annotations

import ml_collections


def data_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      sources='embedded',  # Comma-separated source specs; see encoder_jax.data.sources.
      pair_kind='nsp',  # Example builder: 'nsp', 'sop', 'full_sentences', 'doc_sentences'.
      short_seq_prob=0.1,  # Probability of a shorter target length (BERT recipe).
      prepared_dir='',  # Where prepared shards go; '' = data/prepared/<config hash>.
  ))


def tokenizer_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      kind='sentencepiece',  # 'sentencepiece' (train or load) or 'wordpiece' (vocab.txt).
      model_type='unigram',  # SentencePiece training: 'unigram' or 'bpe'.
      path='',  # Existing .model or vocab.txt; '' = train one on the corpus.
  ))
