r"""The small-budget recipe on the quickstart's network: pre-LN, GeGLU, no biases, no
dropout, MLM only, a higher peak rate with warmup-stable-decay
(``config_base.SMALL_BUDGET_RECIPE``; what each choice bought is in the README,
"Pretraining that pays"). ``:contrastive=True`` adds the span contrastive objective beside
MLM (the bake-off's ``crammed_contrastive`` row: features that fine-tune better than a
random network's, for a lower MLM accuracy).

  python -m encoder_jax.main --config=configs/crammed_small.py --workdir=/tmp/crammed_small
  python -m encoder_jax.main --config=configs/crammed_small.py:contrastive=True \
      --workdir=/tmp/crammed_contrastive
"""

from encoder_jax import config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, contrastive=False)
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  recipe = config_base.SMALL_BUDGET_RECIPE
  if args.contrastive:
    recipe = config_base.with_objective(recipe, 'contrastive')
  config_base.apply_recipe(c, recipe)
  return c
