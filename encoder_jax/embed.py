r"""Sentence embeddings: one sentence per line in, a float32 [N, hidden] ``.npy`` out.

``[CLS]`` pooling takes the final hidden state of the first token; mean pooling averages
the final hidden states of the real (non-padding) tokens, [CLS] and [SEP] included (as
sentence-transformers does). Embeddings are L2-normalised unless ``--normalize=false``.
Batches are padded to a multiple of 16 tokens; padding never changes an embedding.

  python -m encoder_jax.embed --workdir=DIR [--config=...] [--step=N] \
      --input=sentences.txt --output=emb.npy [--pooling=mean|cls] [--normalize=true]
  python -m encoder_jax.embed --hf_dir=HF_BERT_DIR --input=... --output=...
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax.models import bert

POOLINGS = ('mean', 'cls')
PAD_MULTIPLE = 16  # Padded lengths are rounded up to this, so few shapes get compiled.


def pool(sequence_BxLxE: jax.Array, input_mask_BxL: jax.Array, pooling: str) -> jax.Array:
  if pooling == 'cls':
    return sequence_BxLxE[:, 0]
  if pooling == 'mean':
    mask_BxLx1 = input_mask_BxL[..., None].astype(jnp.float32)
    total_BxE = (sequence_BxLxE.astype(jnp.float32) * mask_BxLx1).sum(1)
    return total_BxE / jnp.maximum(mask_BxLx1.sum(1), 1.0)
  raise ValueError(f'pooling={pooling!r}; expected one of {POOLINGS}')


def l2_normalize(x_BxE: jax.Array) -> jax.Array:
  return x_BxE / jnp.maximum(jnp.linalg.norm(x_BxE, axis=-1, keepdims=True), 1e-12)


@functools.partial(jax.jit, static_argnames=('config', 'pooling', 'normalize'))
def embed_batch(params, input_ids_BxL, input_mask_BxL, *, config: bert.BertConfig,
                pooling: str = 'mean', normalize: bool = True) -> jax.Array:
  """Pooled (and normalised) final hidden states of a padded batch, float32 [B, E]."""
  # The encoder alone: the pretraining heads' parameters, if present, are not read.
  out = bert.BertModel(config).apply({'params': params}, input_ids_BxL,
                                     jnp.zeros_like(input_ids_BxL), input_mask_BxL)
  emb_BxE = pool(out['sequence_output'], input_mask_BxL, pooling)
  return l2_normalize(emb_BxE) if normalize else emb_BxE


def with_specials(tokenizer, ids: Sequence[int], max_len: int) -> list[int]:
  """[CLS] ids [SEP], the ids truncated so that the whole is at most ``max_len``."""
  return [tokenizer.cls_id, *list(ids)[:max_len - 2], tokenizer.sep_id]


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int, max_len: int
              ) -> tuple[np.ndarray, np.ndarray]:
  """int32 ids and mask [B, L], L = the longest row rounded up to PAD_MULTIPLE (<= max_len)."""
  longest = max(len(r) for r in rows)
  length = min(max_len, -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE)
  ids = np.full((len(rows), length), pad_id, np.int32)
  mask = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
    mask[i, :len(r)] = 1
  return ids, mask


def embed_sentences(params, config: bert.BertConfig, tokenizer, sentences: Sequence[str], *,
                    pooling: str = 'mean', normalize: bool = True, batch_size: int = 32,
                    max_len: int = 128) -> np.ndarray:
  """float32 [len(sentences), hidden] embeddings, in input order."""
  if pooling not in POOLINGS:
    raise ValueError(f'pooling={pooling!r}; expected one of {POOLINGS}')
  max_len = min(max_len, config.max_position_embeddings)
  rows = [with_specials(tokenizer, tokenizer.encode(s), max_len) for s in sentences]
  out = np.zeros((len(rows), config.hidden_size), np.float32)
  # Similar lengths share a batch (less padding); results go back to input order.
  order = np.argsort([len(r) for r in rows], kind='stable')
  for start in range(0, len(rows), batch_size):
    idx = order[start:start + batch_size]
    ids, mask = pad_batch([rows[i] for i in idx], tokenizer.pad_id, max_len)
    out[idx] = np.asarray(embed_batch(params, ids, mask, config=config, pooling=pooling,
                                      normalize=normalize))
  return out


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax.interop import checkpoint_io  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  loaded = checkpoint_io.load_from_flags(f)
  with open(f.input, encoding='utf-8') as fh:
    sentences = [line.rstrip('\n') for line in fh]
  emb = embed_sentences(loaded.params, loaded.model_config, loaded.tokenizer, sentences,
                        pooling=f.pooling, normalize=f.normalize, batch_size=f.batch_size,
                        max_len=f.max_len)
  np.save(f.output, emb)
  print(f'Embedded {len(sentences)} sentences from {f.input} with {f.pooling} pooling '
        f'({"L2-normalised" if f.normalize else "not normalised"}) using {loaded.source}: '
        f'{f.output} float32 {emb.shape}')


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax.interop import checkpoint_io  # pylint: disable=g-import-not-at-top
  checkpoint_io.define_source_flags()
  flags.DEFINE_string('input', None, 'Text file, one sentence per line.', required=True)
  flags.DEFINE_string('output', None, 'Where to write the float32 [N, hidden] .npy.',
                      required=True)
  flags.DEFINE_enum('pooling', 'mean', list(POOLINGS), 'Mean of the token states, or [CLS].')
  flags.DEFINE_bool('normalize', True, 'L2-normalise each embedding.')
  flags.DEFINE_integer('batch_size', 32, 'Sentences per forward pass.')
  flags.DEFINE_integer('max_len', 128, 'Tokens per sentence incl. [CLS]/[SEP] (truncation).')


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  _define_flags()
  app.run(main)
