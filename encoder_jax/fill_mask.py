r"""Fill-mask: the top-k predictions, with probabilities, for each [MASK] in a text.

  python -m encoder_jax.fill_mask --workdir=DIR [--config=...] [--step=N] \
      --text="The capital of France is [MASK]." [--top_k=5]
  python -m encoder_jax.fill_mask --hf_dir=HF_BERT_DIR --text="..."

``[MASK]`` marks a mask for every kind, as does the model's own mask token (``<mask>``...).
With a fixed-layout tokenizer the text is split at the masks, the pieces between are
tokenized as usual and one mask token goes where each was; an imported Hugging Face
tokenizer (the ``hf`` kind) reads the text with its mask token in place, as
``AutoTokenizer`` does. The tokenizer's specials go around the whole. A model whose MLM head is the random one
an import initialised (an HF base model such as ``BertModel``, or a workdir imported from
one and not pretrained since: its ``import_report.json``) is used, with a warning on stderr
that the predictions are random.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax.models import config as model_config_lib
from encoder_jax.models import registry as models

MASK = '[MASK]'


def mask_literals(tokenizer) -> tuple[str, ...]:
  """What marks a mask in the text: '[MASK]', and the tokenizer's own piece (``<mask>``)."""
  own = tokenizer.id_to_piece(tokenizer.mask_id)
  return (MASK,) if own == MASK else (MASK, own)


def tokenize_with_masks(tokenizer, text: str) -> tuple[list[int], list[int], list[int]]:
  """(ids with the tokenizer's specials, their segment ids, positions of the masks)."""
  literals = mask_literals(tokenizer)
  own = tokenizer.id_to_piece(tokenizer.mask_id)
  if tokenizer.kind == 'hf':  # The checkpoint's own tokenizer matches its mask token, as HF.
    for literal in literals:
      text = text.replace(literal, own)
    body = tokenizer.encode_matching_specials(text)
  else:
    for literal in literals[1:]:
      text = text.replace(literal, MASK)
    parts = text.split(MASK)
    byte_level = tokenizer.kind == 'bytelevel_bpe'
    body = []
    for i, part in enumerate(parts):
      if byte_level and i < len(parts) - 1:
        part = part.rstrip(' ')  # As RoBERTa's <mask> (lstrip): the space goes with the mask.
      body.extend(tokenizer.encode(part) if part.strip() else [])
      if i < len(parts) - 1:
        body.append(tokenizer.mask_id)
  if tokenizer.mask_id not in body:
    raise ValueError(f'The text has no {" or ".join(literals)}: {text!r}')
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


def format_predictions(text: str, predictions: list[list[tuple[str, float]]]) -> str:
  lines = [text]
  for n, row in enumerate(predictions, 1):
    lines.append(f'  [MASK] #{n}: ' + '  '.join(f'{piece} {p:.3f}' for piece, p in row))
  return '\n'.join(lines)


def main(argv):
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax.interop import checkpoint_io  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  f = flags.FLAGS
  checkpoint_io.quiet_logging()
  loaded = checkpoint_io.load_from_flags(f)
  if 'mlm_head' in loaded.untrained_heads:  # HF directory, or a workdir's import report.
    print(f'Warning: {loaded.untrained_mlm_warning()}', file=sys.stderr)
  for text in f.text:
    print(format_predictions(text, loaded.fill_mask(text, f.top_k, warn=False)))


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax.interop import checkpoint_io  # pylint: disable=g-import-not-at-top
  checkpoint_io.define_source_flags()
  flags.DEFINE_multi_string('text', None, 'Text with one or more [MASK] (repeatable).',
                            required=True)
  flags.DEFINE_integer('top_k', 5, 'Predictions per mask.')
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main)
