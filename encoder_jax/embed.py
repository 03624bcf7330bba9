r"""Sentence embeddings: one sentence per line in, a float32 [N, hidden] ``.npy`` out.

Each sentence is framed with the model tokenizer's own specials, as ``AutoTokenizer`` does
(``[CLS] text [SEP]``, ``<s> text </s>``, XLNet's ``text <sep> <cls>`` padded on the left).
``[CLS]`` pooling takes the final hidden state of the summary token (the first, or XLNet's
last); mean pooling averages the final hidden states of the real (non-padding) tokens,
the specials included (as sentence-transformers does). Embeddings are L2-normalised unless ``--normalize=false``.
Batches are padded to a multiple of 16 tokens; padding never changes an embedding.

Row i of the output is line i of the input, always. Nothing is dropped silently: blank
(or whitespace-only) lines still get a row, the embedding of the empty text ``[CLS] [SEP]``,
and are reported with their line numbers on stderr (drop them from the input if unwanted);
sentences longer than ``--max_len`` tokens (with [CLS]/[SEP]) are truncated to it and
reported likewise.

``--max_len`` and ``--pooling`` default to the model's own: a sentence-transformers model
(an HF directory with ``sentence_bert_config.json``, or a workdir imported from one, which
keeps those settings in ``sentence_transformers.json``) is embedded as
sentence-transformers does, cut at its ``max_seq_length`` (256 for all-MiniLM-L6-v2) with
its pooling (mean or cls); any other model is cut at its position limit
(``Loaded.max_length``) and mean-pooled.

  python -m encoder_jax.embed --workdir=DIR [--config=...] [--step=N] \
      --input=sentences.txt --output=emb.npy [--pooling=mean|cls] [--normalize=true]
  python -m encoder_jax.embed --hf_dir=HF_BERT_DIR --input=... --output=...
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax.models import config as model_config_lib
from encoder_jax.models import registry as models

POOLINGS = ('mean', 'cls')
PAD_MULTIPLE = 16  # Padded lengths are rounded up to this, so few shapes get compiled.


def pool(sequence_BxLxE: jax.Array, input_mask_BxL: jax.Array, pooling: str,
         cls_index: int = 0) -> jax.Array:
  """Mean of the real tokens' states, or the state at ``cls_index`` (0, or -1 for a model
  whose summary token ends left-padded rows, as XLNet's ``<cls>``)."""
  if pooling == 'cls':
    return sequence_BxLxE[:, cls_index]
  if pooling == 'mean':
    mask_BxLx1 = input_mask_BxL[..., None].astype(jnp.float32)
    total_BxE = (sequence_BxLxE.astype(jnp.float32) * mask_BxLx1).sum(1)
    return total_BxE / jnp.maximum(mask_BxLx1.sum(1), 1.0)
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


def defaults_from_model(loaded) -> tuple[tuple[int, str], tuple[str, str], list[str]]:
  """((max_len, why), (pooling, why), warnings): the defaults ``loaded`` implies.

  A sentence-transformers model's ``max_seq_length`` and pooling (``loaded.sentence_settings``),
  else the model's position limit and mean pooling; a warning when its pooling is one this
  tool does not compute.
  """
  settings = loaded.sentence_settings or {}
  files = ', '.join(settings.get('files', [])) or 'sentence-transformers settings'
  if settings.get('max_seq_length'):
    why = f'max_seq_length of {files}'
    if settings['max_seq_length'] > loaded.max_length:
      why += f", capped at the model's {loaded.max_length} positions"
  else:
    why = "the model's position limit"
  pooling, theirs, warnings = loaded.default_pooling, settings.get('pooling'), []
  if theirs and theirs != pooling:
    warnings.append(f'{loaded.source} is pooled with {theirs!r} by sentence-transformers '
                    f'({files}), which this tool does not compute; using {pooling!r} pooling, '
                    "so the embeddings differ from sentence-transformers'.")
  return ((loaded.default_max_len, why),
          (pooling, files if theirs == pooling else 'default'), warnings)


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax.interop import checkpoint_io  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  checkpoint_io.quiet_logging()
  if f.max_len is not None and f.max_len < 3:
    raise ValueError(f'--max_len={f.max_len}; expected >= 3 (the special tokens and a token)')
  loaded = checkpoint_io.load_from_flags(f)
  with open(f.input, encoding='utf-8') as fh:
    sentences = [line.rstrip('\r\n') for line in fh]
  (max_len, max_len_why), (pooling, pooling_why), warnings = defaults_from_model(loaded)
  if f.max_len is not None:
    max_len, max_len_why = min(f.max_len, loaded.max_length), '--max_len'
    if max_len < f.max_len:
      print(f'Note: --max_len={f.max_len} is more than the model takes; using {max_len}.',
            file=sys.stderr)
  if f.pooling is not None:
    pooling, pooling_why, warnings = f.pooling, '--pooling', []
  for warning in warnings:
    print(f'Warning: {warning}', file=sys.stderr)
  encoded = encode_sentences(loaded.tokenizer, sentences, max_len)
  for warning in encoded.warnings():
    print(f'Warning: {f.input}: {warning}', file=sys.stderr)
  emb = embed_rows(loaded.encoder_params, loaded.model_config, loaded.tokenizer, encoded,
                   pooling=pooling, normalize=f.normalize, batch_size=f.batch_size)
  np.save(f.output, emb)
  counts = [f'{len(encoded.blank)} blank', f'{len(encoded.truncated)} truncated']
  print(f'Embedded {len(sentences)} lines from {f.input} ({", ".join(counts)}) cut at max_len '
        f'{max_len} ({max_len_why}) with {pooling} pooling ({pooling_why}), '
        f'{"L2-normalised" if f.normalize else "not normalised"}, using '
        f'{loaded.source}: {f.output} float32 {emb.shape}')


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax.interop import checkpoint_io  # pylint: disable=g-import-not-at-top
  checkpoint_io.define_source_flags()
  flags.DEFINE_string('input', None, 'Text file, one sentence per line.', required=True)
  flags.DEFINE_string('output', None, 'Where to write the float32 [N, hidden] .npy.',
                      required=True)
  flags.DEFINE_enum('pooling', None, list(POOLINGS), 'Mean of the token states, or [CLS] '
                    "(default: the model's sentence-transformers pooling, else mean).")
  flags.DEFINE_bool('normalize', True, 'L2-normalise each embedding.')
  flags.DEFINE_integer('batch_size', 32, 'Sentences per forward pass.')
  flags.DEFINE_integer('max_len', None, 'Tokens per sentence incl. [CLS]/[SEP] (truncation; '
                       "default: the model's sentence-transformers max_seq_length, else its "
                       'position limit).')


if __name__ == '__main__':
  _define_flags()
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main)
