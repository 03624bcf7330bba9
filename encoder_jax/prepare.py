r"""Prepares the corpus of a config once: tokenizer + sharded pre-tokenized documents.

  python -m encoder_jax.prepare --config=configs/bert_small.py
  python -m encoder_jax.prepare --config=configs/bert_base.py \
      --config.data.tfds_data_dir=gs://my-bucket/tensorflow_datasets

Re-running with the same config reuses the prepared directory (and says so); training calls
the same ``encoder_jax.data.load_or_prepare``, so running this first is optional.
"""

from __future__ import annotations

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from encoder_jax import data

_CONFIG = config_flags.DEFINE_config_file('config', lock_config=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.INFO)
  prepared = data.load_or_prepare(_CONFIG.value)
  m = prepared.manifest
  print(f"Prepared data: {prepared.directory} (config hash {m['config_hash']}); "
        f"train {m['splits']['train']['documents']} documents / "
        f"{m['splits']['train']['tokens']} tokens, held-out "
        f"{m['splits']['held_out']['documents']} documents; {prepared.tokenizer}")


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main)
