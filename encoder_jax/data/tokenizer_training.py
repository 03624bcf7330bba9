"""Training the tokenizer on the configured corpus (run by preparation): SentencePiece, or
byte-level BPE (``config.tokenizer.kind='bytelevel_bpe'``, RoBERTa's GPT-2 scheme).

The vocabulary size is ``config.model.vocab_size`` (single source of truth) and the special
pieces get the fixed ids ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4`` (control symbols, so
the text "[MASK]" is never turned into the mask id). Training sentences are drawn from the
sources in proportion to ``mixing.source_probabilities`` (alpha sampling for multilingual
corpora): source ``i`` gives its first ``q_i * config.tokenizer.train_sentences`` sentences
in its stream order (see ``training_sentences``), so nothing is read beyond that budget.
Byte-level BPE trains on the same sentences and gets RoBERTa's ids instead:
``<s>=0 <pad>=1 </s>=2 <unk>=3``, the 256 byte pieces, the merges, ``<mask>`` last.
"""

from __future__ import annotations

import json
import logging
import os

import sentencepiece as spm

from encoder_jax.data import mixing
from encoder_jax.data import sentences as sentences_lib
from encoder_jax.data import sources as sources_lib
from encoder_jax.data import tokenizer_files
from encoder_jax.data import words as words_lib

_SEED = 12345  # SentencePiece's sampling seed: fixed, so the model depends only on config.
PRETOKENIZATION_DELIMITER = '\u2063'  # INVISIBLE SEPARATOR: not in running text.


def training_sentences(config, sources: list[sources_lib.Source]) -> list[str]:
  """The alpha-sampled (or weighted) sentences the tokenizer is trained on.

  Source ``i`` is read up to its quota ``q_i * train_sentences``. If every source runs out
  first (the corpus is smaller than the budget), the total is the corpus size instead, so
  a small corpus is not repeated for nothing; a source below its quota is repeated
  (up-sampled, which is what ``q_i > p_i`` means).
  """
  budget = int(config.tokenizer.train_sentences)
  if budget < 1:
    raise ValueError(f'config.tokenizer.train_sentences must be >= 1; got {budget}')
  sizes = [s.size_hint_bytes() for s in sources] if len(sources) > 1 else [1]
  q = mixing.source_probabilities(sizes, [s.weight for s in sources],
                                  float(config.data.mixing_alpha))
  max_chars = int(config.data.max_sentence_chars)
  taken: list[list[str]] = []
  exhausted = []
  for source, q_i in zip(sources, q):
    quota = max(1, int(round(q_i * budget)))
    got: list[str] = []
    report = sources_lib.Report()  # Counted for real in the tokenization pass.
    for doc in source.documents(report):
      sents, _ = sentences_lib.document_sentences(doc.lines, source.lines_are_sentences,
                                                  max_chars)
      got.extend(sents[:quota - len(got)])
      if len(got) >= quota:
        break
    taken.append(got)
    exhausted.append(len(got) < quota)
  total = sum(len(t) for t in taken)
  if total == 0:
    raise ValueError(f'config.data.sources = {config.data.sources!r}: the corpus has no '
                     'sentences to train a tokenizer on (all sources are empty).')
  if all(exhausted):
    budget = total
  out = []
  for source, q_i, got in zip(sources, q, taken):
    if not got:
      continue
    quota = max(1, int(round(q_i * budget)))
    repeats = -(-quota // len(got))
    out.extend((got * repeats)[:quota])
    logging.info('Tokenizer training: %d sentences (q=%.3f, %d distinct) from %s', quota,
                 q_i, min(len(got), quota), source.spec)
  return out


def train_sentencepiece(config, sources: list[sources_lib.Source], model_path: str) -> None:
  """Trains ``model_path`` (a .model file) for ``config``; errors name the setting."""
  model_type = str(config.tokenizer.model_type)
  if model_type not in ('unigram', 'bpe'):
    raise ValueError(f"config.tokenizer.model_type must be 'unigram' or 'bpe'; got "
                     f'{model_type!r}')
  vocab_size = int(config.model.vocab_size)
  sentences = training_sentences(config, sources)
  logging.info('Training a SentencePiece %s model, vocab_size=%d, on %d sentences',
               model_type, vocab_size, len(sentences))
  # Trained on words where a segmenter finds them (words.py), its pieces seldom cross a
  # word: whole-word masking then masks what the segmenter calls words. Spaced text has no
  # delimiter put in, and without one the option is left out: the model is unchanged.
  pretokenized = {}
  resolved = words_lib.resolve(config.data.word_segmenter)
  if resolved:
    sentences, changed = words_lib.Words(str(config.data.word_segmenter), resolved).pretokenize(
        sentences, PRETOKENIZATION_DELIMITER)
    if changed:
      pretokenized = dict(pretokenization_delimiter=PRETOKENIZATION_DELIMITER)
      logging.info('Tokenizer training: %d of %d sentences split into words', changed,
                   len(sentences))
  spm.set_random_generator_seed(_SEED)
  prefix = model_path[:-len('.model')] if model_path.endswith('.model') else model_path
  try:
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(sentences),
        model_prefix=prefix,
        model_type=model_type,
        vocab_size=vocab_size,
        character_coverage=float(config.tokenizer.character_coverage),
        normalization_rule_name='nmt_nfkc_cf' if config.tokenizer.lowercase else 'nmt_nfkc',
        pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        pad_piece='[PAD]', unk_piece='[UNK]', bos_piece='[CLS]', eos_piece='[SEP]',
        control_symbols=['[MASK]'],
        input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=1 << 16,
        num_threads=os.cpu_count() or 1,
        minloglevel=2, **pretokenized)
  except RuntimeError as e:
    raise ValueError(
        f'SentencePiece training failed for config.model.vocab_size={vocab_size} on '
        f'{len(sentences)} sentences from config.data.sources={config.data.sources!r}: {e}. '
        'A small corpus cannot support a large vocabulary: lower config.model.vocab_size '
        'or add data.') from e
  trained = tokenizer_files.read_sentencepiece(model_path)
  tokenizer_files.check_vocab_size(model_path, len(trained.pieces), vocab_size, False)


def train_bytelevel_bpe(config, sources: list[sources_lib.Source], path: str) -> None:
  """Trains RoBERTa's byte-level BPE into ``path`` (a tokenizer.json) for ``config``.

  ``BpeTrainer`` learns ``vocab_size - 1`` pieces (the four leading specials, all 256 bytes
  via ``initial_alphabet``, then merges of pairs seen at least twice); ``<mask>`` is then
  appended as the last id, as in RoBERTa (50264 of 50265), and the file is written by
  ``tokenizer_files.build_bytelevel_bpe``. The trainer is deterministic for the same sentences
  (checked by the tests), so the tokenizer depends only on the config and the corpus.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top,g-multiple-import
  vocab_size = int(config.model.vocab_size)
  fixed_ids = tokenizer_files.BYTELEVEL_BPE_IDS
  leading = sorted(fixed_ids, key=fixed_ids.get)
  smallest = len(leading) + 256 + 1
  if vocab_size < smallest:
    raise ValueError(f'config.model.vocab_size={vocab_size} is too small for byte-level BPE: '
                     f'it needs at least {smallest} (4 specials, 256 bytes, <mask>).')
  sentences = training_sentences(config, sources)
  logging.info('Training a byte-level BPE tokenizer, vocab_size=%d, on %d sentences',
               vocab_size, len(sentences))
  hf = tokenizers.Tokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, min_frequency=2,
                                special_tokens=leading, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  hf.train_from_iterator(sentences, trainer, length=len(sentences))
  spec = json.loads(hf.to_str())
  vocab = dict(spec['model']['vocab'])
  if len(vocab) != vocab_size - 1:
    raise ValueError(
        f'Byte-level BPE training reached {len(vocab) + 1} pieces, not '
        f'config.model.vocab_size={vocab_size}, on {len(sentences)} sentences from '
        f'config.data.sources={config.data.sources!r}: the corpus has too few pairs seen twice '
        'to merge. Lower config.model.vocab_size or add data.')
  vocab[tokenizer_files.BYTELEVEL_BPE_MASK] = vocab_size - 1
  tokenizer_files.build_bytelevel_bpe(vocab, tokenizer_files.bpe_merges(spec)).save(path)
  trained = tokenizer_files.read_bytelevel_bpe(path)
  tokenizer_files.check_vocab_size(path, len(trained.pieces), vocab_size, False)
