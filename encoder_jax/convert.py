r"""Converts checkpoints between Hugging Face BERT directories and encoder_jax workdirs.

  # HF (config.json + model.safetensors | pytorch_model.bin, vocab.txt | tokenizer.json)
  # -> a workdir with config.json, config.py, vocab.txt and a step-0 checkpoint:
  python -m encoder_jax.convert hf_to_workdir --hf_dir=HF_DIR --workdir=DIR \
      [--config=configs/bert_base.py]   # the training recipe to continue with (optional)
  python -m encoder_jax.main --config=DIR/config.py --workdir=DIR   # continue pretraining

  # A workdir checkpoint -> config.json + model.safetensors (+ vocab.txt) for
  # transformers.BertForPreTraining.from_pretrained(OUT):
  python -m encoder_jax.convert workdir_to_hf --workdir=DIR [--config=...] [--step=N] --out=OUT
"""

from __future__ import annotations

import os
import shutil

from absl import app
from absl import flags

from encoder_jax.interop import checkpoint_io
from encoder_jax.interop import hf
from encoder_jax.interop import tokenizer as tokenizer_io

COMMANDS = ('hf_to_workdir', 'workdir_to_hf')

# A config.py beside config.json, so main can be pointed at the workdir's own config
# (and command-line overrides such as --config.data.sources=... still work).
WORKDIR_CONFIG_PY = '''"""The config of this workdir (written by encoder_jax.convert): reads config.json here."""

import os

from encoder_jax.interop import checkpoint_io


def get_config(arg=None):
  del arg
  return checkpoint_io.read_run_config(os.path.dirname(os.path.abspath(__file__)))
'''


def hf_to_workdir(hf_dir: str, workdir: str, base_config=None) -> hf.ImportReport:
  report = checkpoint_io.import_hf_to_workdir(hf_dir, workdir, base_config)
  with open(os.path.join(workdir, 'config.py'), 'w', encoding='utf-8') as f:
    f.write(WORKDIR_CONFIG_PY)
  return report


def workdir_to_hf(workdir: str, out: str, config=None, step: int | None = None) -> str:
  """Writes ``out``; returns a one-line description."""
  loaded = checkpoint_io.load_workdir(workdir, config, step, with_tokenizer=False)
  t = loaded.run_config.tokenizer
  pad_id = 0
  if t.kind == 'wordpiece' and t.path:
    tok = tokenizer_io.wordpiece(t.path, bool(t.lowercase))
    pad_id = tok.pad_id
  hf.save_hf(out, loaded.model_config, checkpoint_io.to_host(loaded.params), pad_token_id=pad_id)
  if t.kind == 'wordpiece' and t.path:
    tokenizer_io.write_hf_tokenizer_files(t.path, out, bool(t.lowercase),
                                          loaded.model_config.max_position_embeddings)
    tokenizer_note = 'vocab.txt + tokenizer_config.json'
  elif t.path:
    shutil.copyfile(t.path, os.path.join(out, os.path.basename(t.path)))
    tokenizer_note = (f'{os.path.basename(t.path)} (SentencePiece: not loadable by '
                      'BertTokenizer; use it with sentencepiece)')
  else:
    tokenizer_note = 'no tokenizer (config.tokenizer.path is empty: it lives in prepared data)'
  return f'Wrote {out}: config.json + model.safetensors from {loaded.source}; {tokenizer_note}'


def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f'Usage: python -m encoder_jax.convert {{{"|".join(COMMANDS)}}} '
                         f'[flags]; got {argv[1:]}')
  f = flags.FLAGS
  if argv[1] == 'hf_to_workdir':
    if not f.hf_dir or not f.workdir:
      raise app.UsageError('hf_to_workdir needs --hf_dir and --workdir')
    report = hf_to_workdir(f.hf_dir, f.workdir, f.config)
    print(report.summary())
    print(f'Wrote {f.workdir}: checkpoints/0, config.json, config.py, vocab.txt. Continue '
          f'pretraining with: python -m encoder_jax.main --config={f.workdir}/config.py '
          f'--workdir={f.workdir}')
  else:
    if not f.workdir or not f.out:
      raise app.UsageError('workdir_to_hf needs --workdir and --out')
    print(workdir_to_hf(f.workdir, f.out, f.config, f.step))


if __name__ == '__main__':
  checkpoint_io.define_source_flags()
  flags.DEFINE_string('out', None, 'workdir_to_hf: the Hugging Face directory to write.')
  app.run(main)
