r"""BERT-base pretraining, the original recipe (Devlin et al. 2018).

12 layers, hidden 768, 12 heads, 110M parameters; batch 256 for 1M steps, 90% of the steps
at 128 tokens with 20 predictions, then 512 tokens with 80; AdamW lr 1e-4, 10k warmup.
Data: English Wikipedia from tensorflow-datasets (BookCorpus is no longer distributed).

  python -m encoder_jax.main --config=configs/bert_base.py --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/bert_base.py:runlocal=True --workdir=/tmp/b
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = config_base.base_config()
  c.data.sources = 'tfds:wikipedia/20230601.en:train'
  c.model.dtype = 'bfloat16'  # Activations; params and optimizer state stay float32.
  if args.runlocal:
    config_base.shrink_for_local_run(c)
  return c
