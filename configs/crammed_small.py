r"""The small-budget recipe on the quickstart's network: pre-LN, GeGLU, no biases, no
dropout, MLM only, a higher peak rate with warmup-stable-decay
(``config_base.SMALL_BUDGET_RECIPE``; what each choice bought is in the README,
"Pretraining that pays").

  python -m encoder_jax.main --config=configs/crammed_small.py --workdir=/tmp/crammed_small
"""

from encoder_jax import config_base


def get_config(arg=None):
  del arg  # No variants.
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  config_base.apply_recipe(c, config_base.SMALL_BUDGET_RECIPE)
  return c
