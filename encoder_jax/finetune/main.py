r"""Fine-tunes a pretrained encoder on a labelled task.

  python -m encoder_jax.finetune.main --config=configs/finetune_sst2.py \
      --config.init.workdir=PRETRAIN_DIR --workdir=/tmp/sst2
  python -m encoder_jax.finetune.main --config=configs/finetune_ner.py \
      --config.init.hf_dir=HF_BERT_DIR --config.data.train=jsonl:train.jsonl \
      --config.data.eval=jsonl:dev.jsonl --workdir=/tmp/ner
"""

from __future__ import annotations

from absl import app
from absl import flags
from ml_collections import config_flags

from encoder_jax import cli
from encoder_jax.finetune import train

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/finetune_*.py file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where metrics and the fine-tuned params go.')
flags.mark_flags_as_required(['config'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  cli.quiet_logging()
  result = train.finetune(_CONFIG.value, _WORKDIR.value)
  print('final: ' + ', '.join(f'{k}={v}' for k, v in result.items()))


if __name__ == '__main__':
  cli.run(main)
