r"""The small-budget recipe on the quickstart's network: a ModernBERT with every layer global
(pre-LN, GeGLU, fused QKV, rotary positions, no biases, no dropout), MLM only, a higher peak
rate with warmup-stable-decay (``config_base.SMALL_BUDGET_RECIPE``; what each choice buys is
in docs/results/recipe_ablation.md). ``:contrastive=True`` adds the span contrastive
objective beside MLM (the bake-off's ``modernbert_contrastive`` row: features that
fine-tune better than a random network's, for a lower MLM accuracy).

  python -m encoder_jax.main --config=configs/crammed_small.py --workdir=/tmp/crammed_small
  python -m encoder_jax.main --config=configs/crammed_small.py:contrastive=True \
      --workdir=/tmp/crammed_contrastive

Its checkpoints export to Hugging Face's ``ModernBertForMaskedLM`` (and a contrastive run's
also to sentence-transformers, mean-pooled and L2-normalised as the objective trains it):

  python -m encoder_jax.convert workdir_to_hf --workdir=/tmp/crammed_small --out=/tmp/hf
  python -m encoder_jax.convert workdir_to_sentence_transformers \
      --workdir=/tmp/crammed_contrastive --out=/tmp/st
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, contrastive=False)
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  recipe = config_base.SMALL_BUDGET_RECIPE
  if args.contrastive:
    recipe = config_base.with_objective(recipe, 'contrastive')
  config_base.apply_recipe(c, recipe)
  return c
