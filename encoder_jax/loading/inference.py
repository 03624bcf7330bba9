"""Features and predictions of a loaded network: sentence embeddings and fill-mask.

The computations behind ``Loaded.embed`` / ``Loaded.fill_mask`` and the ``embed`` and
``fill_mask`` command lines, below both (the tools add flags, defaults and reporting).
Texts are framed with the tokenizer's own specials (``Tokenizer.frame``: ``[CLS] text
[SEP]``, ``<s> text </s>``, XLNet's ``text <sep> <cls>`` padded on the left), as
``AutoTokenizer`` does.

Embeddings: ``cls`` pooling takes the final hidden state of the summary token (the first,
or XLNet's last); ``mean`` averages the final hidden states of the real (non-padding)
tokens, the specials included (as sentence-transformers does). Batches are padded to a
multiple of 16 tokens; padding never changes an embedding.

Fill-mask: ``[MASK]`` marks a mask for every kind, as does the model's own mask token
(``<mask>``...); the tokenizer reads the masks its own way (``Tokenizer.encode_with_masks``:
an imported Hugging Face tokenizer as ``AutoTokenizer`` does). ``filled_text`` puts each
mask's best piece into the text as written, so the text keeps its own spacing: Chinese
reads without a space between characters (Hugging Face's fill-mask pipeline decodes the
whole row instead, one space between every two WordPiece pieces).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import unicodedata
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax.models import config as model_config_lib
from encoder_jax.models import registry as models

POOLINGS = ('mean', 'cls', 'max')
PAD_MULTIPLE = 16  # Padded lengths are rounded up to this, so few shapes get compiled.


def pool(sequence_BxLxE: jax.Array, input_mask_BxL: jax.Array, pooling: str,
         cls_index: int = 0) -> jax.Array:
  """Mean of the real tokens' states, their elementwise max (sentence-transformers'
  max pooling), or the state at ``cls_index`` (0, or -1 for a model whose summary token
  ends left-padded rows, as XLNet's ``<cls>``)."""
  if pooling == 'cls':
    return sequence_BxLxE[:, cls_index]
  if pooling == 'mean':
    mask_BxLx1 = input_mask_BxL[..., None].astype(jnp.float32)
    total_BxE = (sequence_BxLxE.astype(jnp.float32) * mask_BxLx1).sum(1)
    return total_BxE / jnp.maximum(mask_BxLx1.sum(1), 1.0)
  if pooling == 'max':
    real_BxLx1 = input_mask_BxL[..., None] > 0
    return jnp.where(real_BxLx1, sequence_BxLxE.astype(jnp.float32), -1e9).max(1)
  raise ValueError(f'pooling={pooling!r}; expected one of {POOLINGS}')


def l2_normalize(x_BxE: jax.Array) -> jax.Array:
  return x_BxE / jnp.maximum(jnp.linalg.norm(x_BxE, axis=-1, keepdims=True), 1e-12)


@functools.partial(jax.jit, static_argnames=('config', 'pooling', 'normalize', 'cls_index'))
def embed_batch(params, input_ids_BxL, input_mask_BxL, segment_ids_BxL=None, *,
                config: model_config_lib.EncoderConfig, pooling: str = 'mean',
                normalize: bool = True, cls_index: int = 0) -> jax.Array:
  """Pooled (and normalised) final hidden states of a padded batch, float32 [B, E]."""
  if segment_ids_BxL is None:
    segment_ids_BxL = jnp.zeros_like(input_ids_BxL)
  # The encoder alone: the pretraining heads' parameters, if present, are not read.
  out = models.network(config).encoder.apply({'params': params}, input_ids_BxL,
                                             segment_ids_BxL, input_mask_BxL)
  emb_BxE = pool(out['sequence_output'], input_mask_BxL, pooling, cls_index)
  return l2_normalize(emb_BxE) if normalize else emb_BxE


def pad_batch(tokenizer, rows: Sequence[Sequence[int]], segments: Sequence[Sequence[int]],
              max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """int32 ids, segment ids and mask [B, L], padded on the tokenizer's side; L = the
  longest row rounded up to PAD_MULTIPLE (<= max_len)."""
  longest = max(len(r) for r in rows)
  length = max(longest, min(max_len, -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE))
  return tokenizer.pad(rows, segments, length)


@dataclasses.dataclass
class Encoded:
  """Sentences as model-input rows (the tokenizer's specials around each, e.g.
  ``[CLS] ids [SEP]``), their segment ids, and what the encoding did to them."""
  rows: list[list[int]]
  segments: list[list[int]]
  blank: list[int]  # 0-based indices of empty / whitespace-only sentences.
  truncated: list[int]  # 0-based indices of sentences cut to max_len tokens.
  longest: int  # Tokens of the longest sentence before truncation, specials included.
  max_len: int

  def warnings(self, what: str = 'line') -> list[str]:
    """Human-readable notes on blank and truncated inputs (1-based ``what`` numbers)."""
    def where(indices):
      shown = ', '.join(str(i + 1) for i in indices[:10])
      return f'{what}s {shown}' + (f' and {len(indices) - 10} more' if len(indices) > 10 else '')
    out = []
    if self.blank:
      out.append(f'{len(self.blank)} of {len(self.rows)} inputs are blank ({where(self.blank)}): '
                 'each got the embedding of an empty text (the special tokens alone) so that '
                 f'row i is {what} i; drop them from the input if unwanted.')
    if self.truncated:
      out.append(f'{len(self.truncated)} of {len(self.rows)} inputs are longer than '
                 f'max_len={self.max_len} tokens and were truncated ({where(self.truncated)}; '
                 f'the longest has {self.longest} tokens with the special tokens).')
    return out


def encode_sentences(tokenizer, sentences: Sequence[str], max_len: int) -> Encoded:
  """The tokenizer's frame around each sentence (``[CLS] ids [SEP]``, XLNet's
  ``ids <sep> <cls>``...), truncated to ``max_len``, with blanks and cuts recorded."""
  ids = tokenizer.encode_batch(list(sentences)) if sentences else []
  added = tokenizer.num_added()
  framed = [tokenizer.frame(i[:max(max_len - added, 0)]) for i in ids]
  return Encoded(rows=[r for r, _ in framed], segments=[s for _, s in framed],
                 blank=[n for n, s in enumerate(sentences) if not s.strip()],
                 truncated=[n for n, i in enumerate(ids) if len(i) + added > max_len],
                 longest=max((len(i) + added for i in ids), default=0), max_len=max_len)


def embed_rows(params, config: model_config_lib.EncoderConfig, tokenizer,
               encoded: Encoded, *, pooling: str = 'mean', normalize: bool = True,
               batch_size: int = 32) -> np.ndarray:
  """float32 [len(rows), hidden] embeddings of encoded rows, in input order."""
  if pooling not in POOLINGS:
    raise ValueError(f'pooling={pooling!r}; expected one of {POOLINGS}')
  rows = encoded.rows
  max_len = max((len(r) for r in rows), default=1)
  out = np.zeros((len(rows), config.hidden_size), np.float32)
  # Similar lengths share a batch (less padding); results go back to input order.
  order = np.argsort([len(r) for r in rows], kind='stable')
  for start in range(0, len(rows), batch_size):
    idx = order[start:start + batch_size]
    ids, seg, mask = pad_batch(tokenizer, [rows[i] for i in idx],
                               [encoded.segments[i] for i in idx], max_len)
    out[idx] = np.asarray(embed_batch(params, ids, mask, seg, config=config, pooling=pooling,
                                      normalize=normalize, cls_index=tokenizer.cls_index))
  return out


def embed_sentences(params, config: model_config_lib.EncoderConfig, tokenizer,
                    sentences: Sequence[str], *,
                    pooling: str = 'mean', normalize: bool = True, batch_size: int = 32,
                    max_len: int | None = None) -> np.ndarray:
  """float32 [len(sentences), hidden] embeddings, in input order; one row per sentence.

  ``max_len`` (tokens with the specials) defaults to the model's position limit; a
  sentence-transformers model's own limit is ``Loaded.default_max_len`` (``Loaded.embed``
  and the command line use it). Blank sentences and truncation are not reported here: see
  :func:`encode_sentences`.
  """
  encoded = encode_sentences(tokenizer, sentences, min(max_len or config.max_length,
                                                       config.max_length))
  return embed_rows(params, config, tokenizer, encoded, pooling=pooling,
                    normalize=normalize, batch_size=batch_size)



# ------------------------------------------------------------------------ fill-mask


MASK = '[MASK]'


def mask_literals(tokenizer) -> tuple[str, ...]:
  """What marks a mask in the text: '[MASK]', and the tokenizer's own piece (``<mask>``)."""
  own = tokenizer.id_to_piece(tokenizer.mask_id)
  return (MASK,) if own == MASK else (MASK, own)


def tokenize_with_masks(tokenizer, text: str) -> tuple[list[int], list[int], list[int]]:
  """(ids with the tokenizer's specials, their segment ids, positions of the masks)."""
  literals = mask_literals(tokenizer)
  for literal in literals[1:]:
    text = text.replace(literal, MASK)
  body = tokenizer.encode_with_masks(text, MASK)
  if tokenizer.mask_id not in body:
    # A Chinese or Japanese input method types full-width brackets (［MASK］): text, not
    # a mask, here as in Hugging Face.
    hint = ('; its full-width ［MASK］ is text: write the mask with ASCII brackets'
            if MASK in unicodedata.normalize('NFKC', text) else '')
    raise ValueError(f'The text has no {" or ".join(literals)}: {text!r}{hint}')
  ids, segments = tokenizer.frame(body)
  positions = [i for i, t in enumerate(ids) if t == tokenizer.mask_id]
  return ids, segments, positions


@functools.partial(jax.jit, static_argnames=('config', 'top_k'))
def _top_k(params, ids_1xL, segments_1xL, positions_1xP, *,
           config: model_config_lib.EncoderConfig, top_k: int):
  out = models.network(config).pretraining.apply(
      {'params': params}, ids_1xL, segments_1xL, jnp.ones_like(ids_1xL),
      positions_1xP, deterministic=True)
  probs_1xPxV = jax.nn.softmax(out['mlm_logits'], axis=-1)
  return jax.lax.top_k(probs_1xPxV[0], top_k)


def fill_mask(params, config: model_config_lib.EncoderConfig, tokenizer, text: str,
              top_k: int = 5
              ) -> list[list[tuple[str, float]]]:
  """For each [MASK] in order: [(piece, probability)] best first."""
  ids, segments, positions = tokenize_with_masks(tokenizer, text)
  if len(ids) > config.max_length:
    raise ValueError(f'The text is {len(ids)} tokens; the model takes at most '
                     f'{config.max_length}')
  top_k = min(top_k, config.vocab_size)
  probs_PxK, ids_PxK = jax.device_get(_top_k(params, np.asarray([ids], np.int32),
                                             np.asarray([segments], np.int32),
                                             np.asarray([positions], np.int32), config=config,
                                             top_k=top_k))
  return [[(tokenizer.id_to_piece(int(i)), float(p)) for i, p in zip(row_ids, row_probs)]
          for row_ids, row_probs in zip(ids_PxK, probs_PxK)]


def piece_text(tokenizer, i: int) -> str:
  """The text piece ``i`` stands for in a word: decoded alone, without the surrounding
  space a decoder may give it and without WordPiece's ``##`` continuation mark."""
  text = tokenizer.decode([int(i)]).strip()
  if text.startswith('##') and len(text) > 2 and not tokenizer.is_word_start[int(i)]:
    text = text[2:]
  return text


def filled_text(tokenizer, text: str, predictions: list[list[tuple[str, float]]]) -> str:
  """``text`` with each mask (``mask_literals``), in order, replaced by the text of its best
  piece in ``predictions`` (``fill_mask``'s). The rest of the text stays as written."""
  literals = mask_literals(tokenizer)
  found = re.findall('|'.join(map(re.escape, literals)), text)
  if len(found) != len(predictions):
    raise ValueError(f'{len(predictions)} rows of predictions for the {len(found)} masks '
                     f'of {text!r}')
  def text_of(piece):  # A piece past the vocabulary (<unused:N>) stays as it is named.
    i = tokenizer.piece_to_id(piece)
    return piece_text(tokenizer, i) if tokenizer.id_to_piece(i) == piece else piece
  best = iter([text_of(row[0][0]) for row in predictions])
  return re.sub('|'.join(map(re.escape, literals)), lambda _: next(best), text)
