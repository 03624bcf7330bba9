r"""BERT-large pretraining, the original recipe: 24 layers, hidden 1024, 16 heads, 340M params.

  python -m encoder_jax.main --config=configs/bert_large.py --workdir=$WORKDIR
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = config_base.base_config()
  c.model.update(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096)
  c.data.sources = 'tfds:wikipedia/20230601.en:train'
  c.model.dtype = 'bfloat16'  # Activations; params and optimizer state stay float32.
  if args.runlocal:
    config_base.shrink_for_local_run(c)
  return c
