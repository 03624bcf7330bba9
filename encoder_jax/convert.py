r"""Converts checkpoints between Hugging Face directories and encoder_jax workdirs.

Every registered model kind converts: BERT (``BertForPreTraining``), RoBERTa
(``RobertaForMaskedLM``), ALBERT (``AlbertForPreTraining``), ELECTRA (the discriminator as
``ElectraForPreTraining`` in OUT, the generator as ``ElectraForMaskedLM`` in OUT/generator;
importing OUT takes the generator back when its shapes match the config's
``objective.generator_*_fraction``), DeBERTa, XLNet and ModernBERT
(``ModernBertForMaskedLM``: also the small-budget recipe of ``configs/crammed_small.py``);
import also takes their masked-LM and bare base models. A network no Hugging Face class
computes (e.g. the bert kind with pre-LN blocks) is refused, naming the option and the
nearest configuration that exports.

  # HF (config.json + model.safetensors | pytorch_model.bin; vocab.txt | tokenizer.json, or
  # the tokenizer.model of an encoder_jax export) -> a workdir with config.json, config.py,
  # the tokenizer file (pinned in tokenizer/) and a step-0 checkpoint:
  python -m encoder_jax.convert hf_to_workdir --hf_dir=HF_DIR --workdir=DIR \
      [--config=configs/bert_base.py]   # the training recipe to continue with (optional)
  python -m encoder_jax.main --config=DIR/config.py --workdir=DIR   # continue pretraining

  # A workdir checkpoint -> config.json + model.safetensors + the workdir's pinned tokenizer
  # (WordPiece: vocab.txt; SentencePiece: tokenizer.json + tokenizer.model) for
  # transformers.BertForPreTraining / AutoTokenizer .from_pretrained(OUT):
  python -m encoder_jax.convert workdir_to_hf --workdir=DIR [--config=...] [--step=N] --out=OUT

  # A workdir checkpoint -> a sentence-transformers directory (the HF export above as its
  # Transformer module, 1_Pooling, 2_Normalize, modules.json, sentence_bert_config.json):
  # SentenceTransformer(OUT).encode(texts) == encoder_jax.load(DIR).embed(texts). Mean
  # pooling and L2 normalisation (what the span contrastive objective trains, and embed's
  # defaults), cut at the model's position limit; a workdir imported from a
  # sentence-transformers model keeps its own settings. --pooling=cls|max overrides.
  python -m encoder_jax.convert workdir_to_sentence_transformers --workdir=DIR [--step=N] \
      --out=OUT [--pooling=mean]

  # A workdir without its pinned tokenizer (checkpoints copied without tokenizer/): pin the
  # one its run trained with.
  python -m encoder_jax.convert pin_tokenizer --workdir=DIR --tokenizer=PREPARED/tokenizer.model
"""

from __future__ import annotations

import os

from absl import app
from absl import flags

from encoder_jax import cli
from encoder_jax.loading import loaded as loading
from encoder_jax.storage import paths as storage
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.interop import hf
from encoder_jax.interop import hf_import
from encoder_jax.interop import sentence_transformers_dir
from encoder_jax.interop import tokenizer as tokenizer_io

COMMANDS = ('hf_to_workdir', 'workdir_to_hf', 'workdir_to_sentence_transformers',
            'pin_tokenizer')

# A config.py beside config.json, so main can be pointed at the workdir's own config
# (and command-line overrides such as --config.data.sources=... still work).
WORKDIR_CONFIG_PY = '''"""The config of this workdir (written by encoder_jax.convert): reads config.json here."""

import os

from encoder_jax.loading import loaded as loading


def get_config(arg=None):
  del arg
  return loading.read_run_config(os.path.dirname(os.path.abspath(__file__)))
'''


def hf_to_workdir(hf_dir: str, workdir: str, base_config=None) -> loading.ImportReport:
  report = hf_import.import_hf_to_workdir(hf_dir, workdir, base_config)
  workdir_lib.path(workdir, 'config.py').write_text(WORKDIR_CONFIG_PY)
  return report


def workdir_to_hf(workdir: str, out: str, config=None, step: int | None = None) -> str:
  """Writes ``out`` (weights and the workdir's pinned tokenizer); returns a description."""
  loaded = loading.load_workdir(workdir, config, step)
  tok = loaded.tokenizer
  # The downstream network at the top; more networks in subdirectories (ELECTRA: the
  # generator as ElectraForMaskedLM in OUT/generator), each with the tokenizer.
  lines = []
  with storage.staged(out) as local:  # gs://: written here, then uploaded.
    for sub, (network, params) in loaded.trainable.hf_exports(loaded.params).items():
      where = os.path.join(local, sub) if sub else local
      hf.save_hf(where, network.config, loading.to_host(params), pad_token_id=tok.pad_id)
      written = tokenizer_io.export_hf_tokenizer(tok, where, loaded.max_length)
      lines.append(f'Wrote {os.path.join(out, sub) if sub else out}: config.json + '
                   f'model.safetensors from {loaded.source}; {written}')
  return '\n'.join(lines)


def workdir_to_sentence_transformers(workdir: str, out: str, config=None,
                                     step: int | None = None,
                                     pooling: str | None = None) -> str:
  """Writes ``out``, a directory ``SentenceTransformer(out)`` loads and embeds with as
  ``encoder_jax.load(workdir, step).embed`` does; returns a description."""
  loaded = loading.load_workdir(workdir, config, step)
  with storage.staged(out) as local:  # gs://: written here, then uploaded.
    written = sentence_transformers_dir.write_loaded(loaded, local, pooling=pooling)
  names = list(loaded.run_config.objective.names) if loaded.run_config else []
  note = ('' if 'contrastive' in names or loaded.sentence_settings else
          f'. Note: the run trained {names}, not the contrastive objective; its pooled '
          'states were not trained as sentence embeddings')
  return (f'Wrote {out}: a sentence-transformers directory from {loaded.source}; {written}'
          + note)


def pin_tokenizer(workdir: str, tokenizer_path: str, config=None) -> str:
  """Pins ``tokenizer_path`` in a workdir that has none (checkpoints copied without their
  ``tokenizer/``)."""
  config = config if config is not None else loading.read_run_config(workdir)
  kind = tokenizer_io.kind_of_file(tokenizer_path)
  tok = tokenizer_io.from_path(kind, tokenizer_path, bool(config.tokenizer.lowercase))
  tok.check_vocab_size(int(config.model.vocab_size), f'config.model.vocab_size of {workdir}')
  if kind != config.tokenizer.kind:
    raise ValueError(f'{tokenizer_path} is a {kind} tokenizer but the config of {workdir} says '
                     f'tokenizer.kind={config.tokenizer.kind!r}')
  workdir_lib.pin_tokenizer(workdir, tok, None)  # Raises if a different one is pinned.
  return (f'Pinned {tokenizer_path} ({kind}, {tok.vocab_size} pieces) in '
          f'{workdir_lib.path(workdir, workdir_lib.TOKENIZER_DIR)}')


def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f'Usage: python -m encoder_jax.convert {{{"|".join(COMMANDS)}}} '
                         f'[flags]; got {argv[1:]}')
  f = flags.FLAGS
  cli.quiet_logging()
  if argv[1] == 'hf_to_workdir':
    if not f.hf_dir or not f.workdir:
      raise app.UsageError('hf_to_workdir needs --hf_dir and --workdir')
    report = hf_to_workdir(f.hf_dir, f.workdir, f.config)
    print(report.summary())
    tokenizer_file = os.path.basename(loading.read_run_config(f.workdir).tokenizer.path)
    print(f'Wrote {f.workdir}: checkpoints/0, config.json, config.py, {tokenizer_file} (also '
          'pinned in tokenizer/). Continue pretraining with: python -m encoder_jax.main '
          f'--config={f.workdir}/config.py --workdir={f.workdir}')
  elif argv[1] == 'workdir_to_hf':
    if not f.workdir or not f.out:
      raise app.UsageError('workdir_to_hf needs --workdir and --out')
    print(workdir_to_hf(f.workdir, f.out, f.config, f.step))
  elif argv[1] == 'workdir_to_sentence_transformers':
    if not f.workdir or not f.out:
      raise app.UsageError('workdir_to_sentence_transformers needs --workdir and --out')
    print(workdir_to_sentence_transformers(f.workdir, f.out, f.config, f.step, f.pooling))
  else:
    if not f.workdir or not f.tokenizer:
      raise app.UsageError('pin_tokenizer needs --workdir and --tokenizer')
    print(pin_tokenizer(f.workdir, f.tokenizer, f.config))


if __name__ == '__main__':
  cli.define_source_flags()
  flags.DEFINE_string('out', None, 'workdir_to_hf / workdir_to_sentence_transformers: the '
                      'directory to write.')
  flags.DEFINE_enum('pooling', None, list(sentence_transformers_dir.POOLINGS),
                    "workdir_to_sentence_transformers: the pooling (default: the model's "
                    'sentence-transformers pooling, else mean).')
  flags.DEFINE_string('tokenizer', None, 'pin_tokenizer: the tokenizer.model (SentencePiece) '
                      'or vocab.txt (WordPiece) the run trained with.')
  cli.run(main)
