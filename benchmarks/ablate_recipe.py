r"""What each choice of the small-budget recipe buys: the quickstart run of
``configs/crammed_small.py`` (``config_base.SMALL_BUDGET_RECIPE``), the same run with one
choice at a time set back to BERT's, and BERT's quickstart (``configs/bert_small.py``), each
scored on the held-out split at BERT's 15% masking (the same masks for every run, whatever
rate it trained at) after the same number of steps.

  python benchmarks/ablate_recipe.py --out=/tmp/ablate            # every variant (~10 min, 2 cores)
  python benchmarks/ablate_recipe.py --out=/tmp/ablate --only=recipe,absolute_positions

Prints a Markdown table (held-out MLM accuracy and loss at 15%, at the run's own rate, the
training wall time and FLOPs) and writes it to ``OUT/ablation.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# A change the modernbert kind does not compute (it requires pre-LN, GLU and rotary) runs
# on the bert kind's trunk with the recipe's other options unchanged.
BERT_TRUNK = dict(kind='bert')

# name -> (what it changes, overrides on the recipe's config, section -> fields).
VARIANTS = {
    'recipe': ('the recipe', {}),
    'post_ln': ('post-LN blocks (BERT)',
                dict(model=dict(BERT_TRUNK, pre_norm=False, first_attention_norm=True))),
    'no_glu': ('dense-GELU-dense feed-forward', dict(model=dict(BERT_TRUNK, gated_ffn=False))),
    'biases': ('biases in dense layers and LayerNorms',
               dict(model=dict(dense_bias=True, norm_bias=True))),
    'absolute_positions': ('learned absolute positions, no rotary',
                           dict(model=dict(BERT_TRUNK, rotary=False))),
    'dropout': ('dropout 0.1', dict(model=dict(hidden_dropout_rate=0.1,
                                               attention_dropout_rate=0.1))),
    'mask_15': ('15% masking', dict(objective=dict(mask_rate=0.15))),
    'linear_schedule': ('linear decay after warmup', dict(optim=dict(schedule='linear'))),
    'lr_1e-3': ("BERT quickstart's peak rate 1e-3", dict(optim=dict(learning_rate=1e-3))),
    'contrastive': ('the span contrastive objective added (crammed_small.py:contrastive=True)',
                    dict(objective=dict(names=('mlm', 'contrastive')))),
    'bert': ('configs/bert_small.py (MLM + NSP, post-LN, ...)', None),
}


def _config(name: str):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, 'configs', name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def variant_config(name: str, steps: int, prepared_dir: str):
  from encoder_jax.config import schema as config_base  # pylint: disable=g-import-not-at-top
  _, overrides = VARIANTS[name]
  if overrides is None:
    c = _config('bert_small.py')
  else:
    c = _config('crammed_small.py')
    config_base.apply_recipe(c, overrides)
  c.train.update(num_steps=steps, eval_every_steps=0, eval_batches=0)
  c.data.prepared_dir = prepared_dir
  c.checkpoint.update(every_steps=steps, keep=1, async_save=False)
  return c


def run(name: str, out: str, steps: int, eval_batches: int) -> dict:
  from encoder_jax import bakeoff  # pylint: disable=g-import-not-at-top
  from encoder_jax import evaluate  # pylint: disable=g-import-not-at-top
  from encoder_jax.api import pretrain  # pylint: disable=g-import-not-at-top
  c = variant_config(name, steps, os.path.join(out, 'prepared'))
  workdir = os.path.join(out, name)
  start = time.perf_counter()
  pretrain.run(c, workdir)
  wall = time.perf_counter() - start  # Preparation (first run only) and compiles included.
  own = evaluate.evaluate_checkpoint(c, workdir, eval_batches=eval_batches)
  bert = evaluate.evaluate_checkpoint(evaluate.at_bert_masking(c), workdir,
                                     eval_batches=eval_batches)
  return dict(variant=name, change=VARIANTS[name][0], steps=steps, wall_s=wall,
              flops=bakeoff.flops_per_step(c) * steps,
              mlm_accuracy_15=bert['mlm_accuracy'], mlm_loss_15=bert['mlm_loss'],
              mask_rate=float(c.objective.mask_rate), mlm_accuracy_own=own['mlm_accuracy'],
              mlm_loss_own=own['mlm_loss'])


def table(rows: list[dict]) -> str:
  lines = ['| variant | change from the recipe | held-out MLM accuracy (15% masks) | loss (15%) '
           '| accuracy at its own rate | wall time | training FLOPs |',
           '|---|---|---|---|---|---|---|']
  for r in rows:
    lines.append(f'| {r["variant"]} | {r["change"]} | {r["mlm_accuracy_15"]:.1%} | '
                 f'{r["mlm_loss_15"]:.3f} | {r["mlm_accuracy_own"]:.1%} at '
                 f'{r["mask_rate"]:.0%} | {r["wall_s"]:.0f} s | {r["flops"]:.3g} |')
  return '\n'.join(lines)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--out', required=True)
  ap.add_argument('--only', default='', help=f'Comma-separated of {list(VARIANTS)}.')
  ap.add_argument('--steps', type=int, default=0, help="0 = the quickstart's (300).")
  ap.add_argument('--eval_batches', type=int, default=8)
  args = ap.parse_args(argv)
  names = [n.strip() for n in args.only.split(',') if n.strip()] or list(VARIANTS)
  unknown = [n for n in names if n not in VARIANTS]
  if unknown:
    raise SystemExit(f'--only: unknown variants {unknown}; expected some of {list(VARIANTS)}')
  steps = args.steps or int(_config('crammed_small.py').train.num_steps)
  os.makedirs(args.out, exist_ok=True)
  rows = []
  for name in names:
    rows.append(run(name, args.out, steps, args.eval_batches))
    text = table(rows)
    with open(os.path.join(args.out, 'ablation.md'), 'w', encoding='utf-8') as f:
      f.write(text + '\n')
    with open(os.path.join(args.out, 'ablation.json'), 'w', encoding='utf-8') as f:
      json.dump(rows, f, indent=2)
  print(text)
  return rows


if __name__ == '__main__':
  main()
