r"""Fill-mask: the top-k predictions, with probabilities, for each [MASK] in a text.

  python -m encoder_jax.fill_mask --workdir=DIR [--config=...] [--step=N] \
      --text="The capital of France is [MASK]." [--top_k=5]
  python -m encoder_jax.fill_mask --hf_dir=HF_DIR --text="..."

``[MASK]`` marks a mask for every kind, as does the model's own mask token (``<mask>``...).
With a fixed-layout tokenizer the text is split at the masks, the pieces between are
tokenized as usual and one mask token goes where each was; an imported Hugging Face
tokenizer (the ``hf`` kind) reads the text with its mask token in place, as
``AutoTokenizer`` does (``encoder_jax.loading.inference`` computes it). A model whose MLM head is the
random one an import initialised (an HF base model such as ``BertModel``, or a workdir imported from
one and not pretrained since: its ``import_report.json``) is used, with a warning on stderr
that the predictions are random. After each text's predictions, ``filled:`` shows the text
with the best piece in each mask (``inference.filled_text``: the text as written, so
Chinese keeps its characters together).
"""

from __future__ import annotations

import sys

from encoder_jax import cli


def format_predictions(text: str, predictions: list[list[tuple[str, float]]],
                       filled: str | None = None) -> str:
  """The text, each mask's predictions, and (``filled``) the text with the best ones."""
  lines = [text]
  for n, row in enumerate(predictions, 1):
    lines.append(f'  [MASK] #{n}: ' + '  '.join(f'{piece} {p:.3f}' for piece, p in row))
  if filled is not None:
    lines.append(f'  filled: {filled}')
  return '\n'.join(lines)


def main(argv):
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  f = flags.FLAGS
  cli.quiet_logging()
  loaded = cli.load_from_flags(f)
  if 'mlm_head' in loaded.untrained_heads:  # HF directory, or a workdir's import report.
    print(f'Warning: {loaded.untrained_mlm_warning()}', file=sys.stderr)
  from encoder_jax.loading import inference  # pylint: disable=g-import-not-at-top
  for text in f.text:
    predictions = loaded.fill_mask(text, f.top_k, warn=False)
    print(format_predictions(text, predictions,
                             inference.filled_text(loaded.tokenizer, text, predictions)))


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  cli.define_source_flags()
  flags.DEFINE_multi_string('text', None, 'Text with one or more [MASK] (repeatable).',
                            required=True)
  flags.DEFINE_integer('top_k', 5, 'Predictions per mask.')
  cli.run(main)
