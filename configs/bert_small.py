r"""A tiny BERT (2 layers, hidden 128) on the embedded corpus: runs on a laptop CPU in minutes.

Same recipe as bert_base (MLM + NSP, two length phases, AdamW with warmup), scaled down.

  python -m encoder_jax.main --config=configs/bert_small.py --workdir=/tmp/bert_small
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  del arg  # No variants.
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  return c
