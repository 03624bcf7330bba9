r"""Sentence embeddings: one sentence per line in, a float32 [N, hidden] ``.npy`` out.

Each sentence is framed with the model tokenizer's own specials, as ``AutoTokenizer`` does
(``[CLS] text [SEP]``, ``<s> text </s>``, XLNet's ``text <sep> <cls>`` padded on the left).
``[CLS]`` pooling takes the final hidden state of the summary token (the first, or XLNet's
last); mean pooling averages the final hidden states of the real (non-padding) tokens,
the specials included (as sentence-transformers does); ``encoder_jax.loading.inference`` computes
them. Embeddings are L2-normalised unless ``--normalize=false``.

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
  python -m encoder_jax.embed --hf_dir=HF_DIR --input=... --output=...
"""

from __future__ import annotations

import io
import sys

from etils import epath
import numpy as np

from encoder_jax import cli
from encoder_jax.loading import inference
from encoder_jax.storage import paths as storage


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


def read_lines(path: str) -> list[str]:
  """The lines of a local file or ``gs://`` object (universal newlines), without their ends."""
  with (io.TextIOWrapper(storage.open_read(path), encoding='utf-8') if path.startswith('gs://')
        else open(path, encoding='utf-8')) as fh:
    return [line.rstrip('\r\n') for line in fh]


def save(path: str, emb: np.ndarray) -> None:
  """``np.save`` to a local path, or to a ``gs://`` object (named as given)."""
  if not path.startswith('gs://'):
    np.save(path, emb)
    return
  buffer = io.BytesIO()
  np.save(buffer, emb)
  epath.Path(path).write_bytes(buffer.getvalue())


def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  cli.quiet_logging()
  if f.max_len is not None and f.max_len < 3:
    raise ValueError(f'--max_len={f.max_len}; expected >= 3 (the special tokens and a token)')
  loaded = cli.load_from_flags(f)
  sentences = read_lines(f.input)
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
  encoded = inference.encode_sentences(loaded.tokenizer, sentences, max_len)
  for warning in encoded.warnings():
    print(f'Warning: {f.input}: {warning}', file=sys.stderr)
  emb = inference.embed_rows(loaded.encoder_params, loaded.model_config, loaded.tokenizer, encoded,
                   pooling=pooling, normalize=f.normalize, batch_size=f.batch_size)
  save(f.output, emb)
  counts = [f'{len(encoded.blank)} blank', f'{len(encoded.truncated)} truncated']
  print(f'Embedded {len(sentences)} lines from {f.input} ({", ".join(counts)}) cut at max_len '
        f'{max_len} ({max_len_why}) with {pooling} pooling ({pooling_why}), '
        f'{"L2-normalised" if f.normalize else "not normalised"}, using '
        f'{loaded.source}: {f.output} float32 {emb.shape}')


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  cli.define_source_flags()
  flags.DEFINE_string('input', None, 'Text file, one sentence per line.', required=True)
  flags.DEFINE_string('output', None, 'Where to write the float32 [N, hidden] .npy.',
                      required=True)
  flags.DEFINE_enum('pooling', None, list(inference.POOLINGS), 'Mean of the token states, or [CLS] '
                    "(default: the model's sentence-transformers pooling, else mean).")
  flags.DEFINE_bool('normalize', True, 'L2-normalise each embedding.')
  flags.DEFINE_integer('batch_size', 32, 'Sentences per forward pass.')
  flags.DEFINE_integer('max_len', None, 'Tokens per sentence incl. [CLS]/[SEP] (truncation; '
                       "default: the model's sentence-transformers max_seq_length, else its "
                       'position limit).')


if __name__ == '__main__':
  _define_flags()
  cli.run(main)
