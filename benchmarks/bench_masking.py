r"""On-device masking step: compiled memory and time per call, new sampler beside the old one.

The masking step (``masking.mask_tokens``: select 15%, 80/10/10 corruption) used to draw
the random 10% with ``jax.random.categorical`` over the vocabulary, which materialises
[batch, predictions, vocab] Gumbel noise. It now draws an index into a table of allowed ids
(uniform) or inverts the unigram CDF, so its memory is O(batch x length). This script
compiles both at the same shapes (``jax.jit(...).lower(...).compile()``) and prints
``memory_analysis()``'s temp and peak bytes, then times the new step (and the old one with
--time_reference: it needs its multi-GB temporaries for real). Read ``temp``: on the CPU
backend XLA's ``peak`` covers arguments, outputs and constants but not the temporaries.

  python benchmarks/bench_masking.py                          # 256 x 512, 80 predictions, 30K
  python benchmarks/bench_masking.py --distribution=unigram --max_ngram=3 --whole_word_masking
  python benchmarks/bench_masking.py --batch_size=32 --time_reference

Token ids and unigram counts are random: neither the memory nor the time depends on them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _old_mask_tokens(rng, input_ids_BxL, input_mask_BxL, *, max_predictions, recipe, tables):
  """The former formulation (plain selection), for comparison only: a categorical draw
  over the whole vocabulary for every prediction slot."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  b, l = input_ids_BxL.shape
  p = max_predictions
  k_select, k_kind, k_random = jax.random.split(rng, 3)
  maskable_BxL = (input_mask_BxL > 0) & ~jnp.asarray(tables.is_special_V)[input_ids_BxL]
  n_maskable_B = maskable_BxL.sum(-1)
  n_B = jnp.minimum(jnp.clip(jnp.round(n_maskable_B * recipe.mask_rate).astype(jnp.int32),
                             1, p), n_maskable_B)
  u_BxL = jax.random.uniform(k_select, (b, l))
  _, positions_BxP = jax.lax.top_k(jnp.where(maskable_BxL, u_BxL, -1.0), p)
  weights_BxP = jnp.arange(p)[None, :] < n_B[:, None]
  positions_BxP = jnp.where(weights_BxP, positions_BxP, 0).astype(jnp.int32)
  labels_BxP = jnp.where(weights_BxP, jnp.take_along_axis(input_ids_BxL, positions_BxP, 1), 0)
  allowed_V = ~tables.is_special_V
  weights_V = (allowed_V.astype(np.float64) if recipe.random_token_distribution == 'uniform'
               else np.where(allowed_V, tables.unigram_counts_V, 0.0))
  with np.errstate(divide='ignore'):
    logits_V = jnp.asarray(np.log(weights_V), jnp.float32)
  random_ids_BxP = jax.random.categorical(k_random, logits_V, shape=(b, p))  # [B, P, V] noise.
  kind_BxP = jax.random.uniform(k_kind, (b, p))
  new_BxP = jnp.where(kind_BxP < recipe.mask_token_rate, tables.mask_id,
                      jnp.where(kind_BxP < recipe.mask_token_rate + recipe.random_token_rate,
                                random_ids_BxP, labels_BxP)).astype(input_ids_BxL.dtype)
  scatter_BxP = jnp.where(weights_BxP, positions_BxP, l)
  masked_BxL = input_ids_BxL.at[jnp.arange(b)[:, None], scatter_BxP].set(new_BxP, mode='drop')
  return dict(masked_input_ids=masked_BxL, masked_positions=positions_BxP,
              masked_labels=labels_BxP.astype(jnp.int32),
              masked_weights=weights_BxP.astype(jnp.float32))


def _time_calls(fn, steps: int, warmup: int) -> float:
  import jax
  for i in range(warmup):
    jax.block_until_ready(fn(i))
  times = []
  for i in range(steps):
    t = time.perf_counter()
    jax.block_until_ready(fn(warmup + i))
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def _mib(n: int) -> str:
  return f'{n / 2**20:10.1f} MiB'


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--batch_size', type=int, default=256)
  ap.add_argument('--seq_len', type=int, default=512)
  ap.add_argument('--max_predictions', type=int, default=80)
  ap.add_argument('--vocab_size', type=int, default=30000)
  ap.add_argument('--distribution', choices=('uniform', 'unigram'), default='uniform')
  ap.add_argument('--whole_word_masking', action='store_true')
  ap.add_argument('--max_ngram', type=int, default=1)
  ap.add_argument('--steps', type=int, default=10)
  ap.add_argument('--warmup', type=int, default=2)
  ap.add_argument('--time_reference', action='store_true',
                  help='Also run the old categorical step (allocates its [B, P, V] noise).')
  args = ap.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np

  from encoder_jax.objectives import masking

  b, l, p, v = args.batch_size, args.seq_len, args.max_predictions, args.vocab_size
  rng = np.random.RandomState(0)
  special_V = np.zeros(v, bool)
  special_V[:5] = True
  tables = masking.VocabTables(special_V, rng.rand(v) < 0.6,
                               rng.randint(0, 1000, v).astype(np.float64), mask_id=4)
  recipe = masking.MaskingRecipe(random_token_distribution=args.distribution,
                                 whole_word_masking=args.whole_word_masking,
                                 max_ngram=args.max_ngram)
  lengths_B = rng.randint(l // 2, l + 1, b)
  mask_BxL = (np.arange(l)[None] < lengths_B[:, None]).astype(np.int32)
  ids_BxL = rng.randint(5, v, (b, l)).astype(np.int32) * mask_BxL
  ids_BxL[:, 0] = 2
  ids_BxL[np.arange(b), lengths_B - 1] = 3
  ids_BxL, mask_BxL = jnp.asarray(ids_BxL), jnp.asarray(mask_BxL)
  key = jax.random.key(0)

  print(f'masking step: batch {b} x {l}, {p} predictions/seq, vocab {v}, '
        f'{args.distribution} replacements, whole_word_masking={args.whole_word_masking}, '
        f'max_ngram={args.max_ngram}; {os.cpu_count()} CPU cores, JAX {jax.__version__} '
        f'backend {jax.default_backend()} [{jax.devices()[0].device_kind}]')
  print(f'[B, P, V] float32 would be {_mib(b * p * v * 4).strip()}')
  rows = [('new (table / inverse CDF)', masking.mask_tokens, recipe, True)]
  old_recipe = masking.MaskingRecipe(random_token_distribution=args.distribution)
  rows.append(('old (categorical, plain selection)', _old_mask_tokens, old_recipe,
               args.time_reference))
  for name, fn, rec, timed in rows:
    step = jax.jit(lambda k, i, m, fn=fn, rec=rec: fn(k, i, m, max_predictions=p, recipe=rec,
                                                      tables=tables))
    t = time.perf_counter()
    compiled = step.lower(key, ids_BxL, mask_BxL).compile()
    compile_s = time.perf_counter() - t
    stats = compiled.memory_analysis()
    peak = getattr(stats, 'peak_memory_in_bytes', None)
    io = stats.argument_size_in_bytes + stats.output_size_in_bytes
    line = (f'{name:36s} temp {_mib(stats.temp_size_in_bytes)}  peak '
            + (_mib(peak) if peak is not None else '       n/a')
            + f'  args+out {_mib(io)}  compile {compile_s:5.1f} s')
    if timed:
      keys = jax.random.split(key, args.steps + args.warmup)
      dt = _time_calls(lambda i: compiled(keys[i], ids_BxL, mask_BxL), args.steps, args.warmup)
      line += f'  {dt * 1e3:9.2f} ms/call'
    else:
      line += '  (not run: --time_reference)'
    print(line)


if __name__ == '__main__':
  main()
