"""XLNet's pretraining inputs: two segments laid out ``A [SEP] B [SEP] [CLS]``.

XLNet (``data_utils.create_tfrecords`` / ``_split_a_and_b``) samples two segments, B being
the continuation of A or, half of the time, text from elsewhere, and concatenates them as
one sequence with the classification token *last*; the segment ids are 0 for A and its
[SEP], 1 for B and its [SEP], 2 for [CLS]. Its model never reads the pair label (XLNet has
no NSP loss; only the relative segment encoding sees the two segments). So the instances
are BERT's next-sentence pairs (``nsp.NextSentencePairs``: the same 50% random B, within
``seq_len - 3`` tokens) framed by XLNet's template (``tokenizer_files.Template.xlnet``,
as Hugging Face's XLNet tokenizer frames a pair), which ``iterators.render`` lays out.

Differences from the original kept on purpose: segments are cut at sentence boundaries
from one document at a time (the original cuts a token stream that runs across documents
and trims the longer segment from its end); the random B comes from another document
(``nsp``); rows shorter than ``seq_len`` are padded on the right (the original's rows are
always full). Transformer-XL's ``reuse_len`` prefix (the part of a row cached as memory
for the next row of the same stream) is not built: rows are shuffled examples, not
consecutive segments of a stream. The bidirectional data (half of each batch reversed)
is produced on device by the permutation objective (``objectives/plm.py``).
"""

from __future__ import annotations

from encoder_jax.data import tokenizer_files
from encoder_jax.data.builders import nsp


class XLNetPairs(nsp.NextSentencePairs):
  """NSP's pairs (label unused) framed as ``A [SEP] B [SEP] [CLS]``."""

  pair_labels = False  # The label is not a training target: no one-class warning.
  template = tokenizer_files.Template.xlnet  # [CLS] last, in segment 2 (SEG_ID_CLS).

  @staticmethod
  def check_corpus(documents: int, sentences: int, tokens: int, where: str) -> list[str]:
    """Stops where no pair can be built (as NSP); the label balance does not matter here."""
    nsp.NextSentencePairs.check_corpus(documents, sentences, tokens, where)
    return []
