"""Config sections owned by the input pipeline: ``data`` and ``tokenizer``, declared as
fields (``encoder_jax.core.fields``): name, default, allowed range and meaning.

Every key is read by ``encoder_jax.data``; the ones that change the prepared shards are
hashed into the manifest (see ``preparation.CONTENT_KEYS``), so a prepared directory can
never be silently reused for a different corpus, tokenizer or vocabulary size.
"""

from __future__ import annotations

import ml_collections

from encoder_jax.core import fields as fields_lib
from encoder_jax.data import builders
from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.data import words

F = fields_lib.Field

DATA: dict[str, fields_lib.Field] = fields_lib.section(
    F('sources', 'embedded', fields_lib.string(non_empty=True),
      "Comma-separated source specs (grammar in encoder_jax/data/sources.py): 'embedded' "
      "(stdlib docstrings, offline everywhere), 'text:/corpus/*.txt' (one sentence per line, "
      "blank line = new document), 'jsonl:/corpus/*.jsonl;field=text' (one document per JSON "
      "line), 'tfds:wikipedia/20230601.en:train' (tensorflow-datasets name[:split]), "
      "'tfds:wiki40b/sw:train;data_dir=gs://b/tfds@0.2' (per-source options and weight)."),
    F('mixing_alpha', 0.3, fields_lib.number(0, lo_open=True),
      "Mixing of several sources (by sentences): explicit '@weight' on every spec, or else "
      'q_i = p_i**alpha / sum_j p_j**alpha (XLM-R); 1.0 = natural proportions.'),
    F('tfds_data_dir', '', fields_lib.string(),
      "Default tfds data_dir for 'tfds:' sources ('' = the tfds default)."),
    F('max_line_bytes', 1 << 20, fields_lib.integer(1),
      "Bytes; longer raw lines are truncated ('text') or skipped ('jsonl')."),
    F('max_sentence_chars', 5000, fields_lib.integer(1),
      'Characters; longer split sentences are cut at whitespace into pieces.'),
    F('word_segmenter', 'auto', words.CHECK,
      "Where words start in scripts written without spaces (encoder_jax/data/words.py), "
      "stored per token for whole-word, n-gram and span masking: 'auto' (Chinese rjieba or "
      "jieba, Japanese sudachipy or fugashi, Thai pythainlp; spaced text as the vocabulary "
      "marks it), 'none' (the vocabulary's word starts only), or overrides such as "
      "'chinese=chars' (every Han character a word, google-research/bert) or "
      "'japanese=fugashi'."),
    F('held_out_fraction', 0.05, fields_lib.number(0, 1, hi_open=True),
      'Share of documents reserved for evaluation (by hash).'),
    F('held_out_max_documents', 2000, fields_lib.integer(0),
      'Cap on the held-out documents (the lowest hashes win).'),
    F('shard_max_tokens', 50_000_000, fields_lib.integer(1),
      'Tokens per prepared shard file (~100 MB as uint16).'),
    F('num_workers', 0, fields_lib.integer(0),
      'Tokenization processes in preparation; 0 = all CPU cores.'),
    F('prepared_dir', '', fields_lib.string(),
      "Where prepared shards go; '' = data/prepared/<config hash>."),
    F('pair_kind', 'nsp', fields_lib.names(lambda: builders.REGISTRY, 'an example builder'),
      "Example builder: 'nsp' (BERT), 'sop' (ALBERT), 'full_sentences' or 'doc_sentences' "
      '(RoBERTa)... Must match the objective (nsp/sop heads need pairs).'),
    F('short_seq_prob', 0.1, fields_lib.number(0, 1),
      'nsp/sop: probability of a random shorter target length.'),
    F('shuffle_pool_examples', 4096, fields_lib.integer(1),
      'Examples built and shuffled together at load time (over all streams together).'),
    F('streams', 0, fields_lib.integer(0),
      'Independent example streams that every global batch draws from equally (batch_size / '
      'streams rows each). They, not the processes, split the documents, so the batches do '
      'not depend on the topology. 0 = the largest divisor of batch_size <= 64 (and <= the '
      'train documents); a process count that divides it feeds whole streams.'),
)

TOKENIZER: dict[str, fields_lib.Field] = fields_lib.section(
    F('kind', 'sentencepiece', fields_lib.names(lambda: tokenizer_lib.KINDS, 'a tokenizer kind'),
      "'sentencepiece' (train or load a .model), 'wordpiece' (load a vocab.txt) or "
      "'bytelevel_bpe' (RoBERTa/GPT-2 byte-level BPE: train or load a tokenizer.json with "
      '<s>=0 <pad>=1 </s>=2 <unk>=3 and <mask> = vocab_size - 1).'),
    F('path', '', fields_lib.string(),
      "Existing .model, vocab.txt or tokenizer.json; '' = train one (sentencepiece or "
      'bytelevel_bpe) on the corpus, of config.model.vocab_size pieces.'),
    F('model_type', 'unigram', fields_lib.one_of('unigram', 'bpe'),
      "SentencePiece training: 'unigram' or 'bpe'."),
    F('lowercase', True, fields_lib.boolean(),
      'WordPiece: lowercase input; SentencePiece training: case folding. Ignored by '
      'bytelevel_bpe, which is cased and lossless.'),
    F('train_sentences', 2_000_000, fields_lib.integer(1),
      'Tokenizer training budget in sentences (SentencePiece and byte-level BPE), '
      'alpha-sampled across sources (a smaller corpus is used whole).'),
    F('character_coverage', 0.9995, fields_lib.number(0, 1, lo_open=True),
      'SentencePiece: share of characters kept as pieces.'),
)


def data_config() -> ml_collections.ConfigDict:
  """``config.data`` at its defaults."""
  return fields_lib.defaults({'data': DATA}).data


def tokenizer_config() -> ml_collections.ConfigDict:
  """``config.tokenizer`` at its defaults."""
  return fields_lib.defaults({'tokenizer': TOKENIZER}).tokenizer
