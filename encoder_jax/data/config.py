"""Config sections owned by the input pipeline: ``data`` and ``tokenizer``.

Every key is read by ``encoder_jax.data``; the ones that change the prepared shards are
hashed into the manifest (see ``preparation.CONTENT_KEYS``), so a prepared directory can
never be silently reused for a different corpus, tokenizer or vocabulary size.
"""

from __future__ import annotations

import ml_collections


def data_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      # Comma-separated source specs (grammar in encoder_jax/data/sources.py), e.g.
      #   'embedded'                                   stdlib docstrings, offline everywhere
      #   'text:/corpus/*.txt'                         one sentence per line, blank line = new doc
      #   'jsonl:/corpus/*.jsonl;field=text'           one document per JSON line
      #   'tfds:wikipedia/20230601.en:train'           tensorflow-datasets name[:split]
      #   'tfds:wiki40b/sw:train;data_dir=gs://b/tfds@0.2'  per-source options and weight
      sources='embedded',
      # Mixing of several sources (by sentences): explicit '@weight' on every spec, or else
      # q_i = p_i**alpha / sum_j p_j**alpha (XLM-R). 1.0 = natural proportions.
      mixing_alpha=0.3,
      tfds_data_dir='',  # Default tfds data_dir for 'tfds:' sources ('' = tfds default).
      max_line_bytes=1 << 20,  # Longer raw lines are truncated ('text') or skipped ('jsonl').
      max_sentence_chars=5000,  # Longer split sentences are cut at whitespace into pieces.
      held_out_fraction=0.05,  # Share of documents reserved for evaluation (by hash).
      held_out_max_documents=2000,  # Cap on the held-out documents (the lowest hashes win).
      shard_max_tokens=50_000_000,  # Tokens per prepared shard file (~100 MB as uint16).
      num_workers=0,  # Tokenization processes in preparation; 0 = all CPU cores.
      prepared_dir='',  # Where prepared shards go; '' = data/prepared/<config hash>.
      # Example builder: 'nsp' (BERT), 'sop' (ALBERT), 'full_sentences' or
      # 'doc_sentences' (RoBERTa). Must match the objective (nsp/sop heads need pairs).
      pair_kind='nsp',
      short_seq_prob=0.1,  # nsp/sop: probability of a random shorter target length.
      # Examples built and shuffled together at load time (over all streams together).
      shuffle_pool_examples=4096,
      # Independent example streams that every global batch draws from equally (batch_size /
      # streams rows each). They, not the processes, split the documents, so the batches do
      # not depend on the topology. 0 = the largest divisor of batch_size <= 64 (and <= the
      # train documents); a process count that divides it feeds whole streams.
      streams=0,
  ))


def tokenizer_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      # 'sentencepiece' (train or load a .model), 'wordpiece' (load a vocab.txt) or
      # 'bytelevel_bpe' (RoBERTa/GPT-2 byte-level BPE: train or load a tokenizer.json with
      # <s>=0 <pad>=1 </s>=2 <unk>=3 and <mask> = vocab_size - 1).
      kind='sentencepiece',
      # Existing .model, vocab.txt or tokenizer.json; '' = train one (sentencepiece or
      # bytelevel_bpe) on the corpus, of config.model.vocab_size pieces.
      path='',
      model_type='unigram',  # SentencePiece training: 'unigram' or 'bpe'.
      # WordPiece: lowercase input; SentencePiece training: case folding. Ignored by
      # bytelevel_bpe, which is cased and lossless.
      lowercase=True,
      # Tokenizer training budget in sentences (SentencePiece and byte-level BPE),
      # alpha-sampled across sources (a smaller corpus is used whole).
      train_sentences=2_000_000,
      character_coverage=0.9995,  # SentencePiece: share of characters kept as pieces.
  ))
