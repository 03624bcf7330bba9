r"""Fine-tuning on GLUE MRPC (sentence-pair paraphrase) from tensorflow-datasets.

  python -m encoder_jax.finetune.main --config=configs/finetune_mrpc.py \
      --config.init.hf_dir=HF_BERT_DIR --workdir=/tmp/mrpc
"""

from encoder_jax.config import schema as config_base
from encoder_jax.finetune import config as finetune_config


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = finetune_config.base_config()
  c.task = 'sequence_classification'
  c.data.update(train='tfds:glue/mrpc:train', eval='tfds:glue/mrpc:validation',
                text_fields=('sentence1', 'sentence2'), label_field='label', max_len=128)
  c.optim.update(learning_rate=2e-5, epochs=3, batch_size=32)
  if args.runlocal:
    c.data.max_len = 64
    c.optim.update(epochs=1, batch_size=16)
  return c
