r"""Pieces of the training step timed in isolation, in one process (alternating rounds,
medians). Three whose arithmetic is written out for speed, each beside the plain formula it
replaces:

* the LM head with its loss, forward and backward: ``layers.tied_logits`` +
  ``objectives.base.cross_entropy`` (gradients written as ``jax.custom_vjp``) against the
  same einsum + bias + log-softmax cross-entropy differentiated by autodiff;
* exact GELU, forward and forward + backward: ``config.gelu`` (through ``erf``) against
  ``nn.gelu(approximate=False)`` (through ``erfc``);
* a feed-forward block with its dropouts on [batch, tokens, hidden] activations, forward
  and backward: ``layers.dense`` (the kernel's gradient one product over the flattened
  rows, ``layers.project``) against the same einsum + bias differentiated by autodiff (whose
  kernel gradients XLA:CPU runs after copying both operands transposed).

And one that explains a gap rather than closing it: the attention's batched per-(row, head)
products at the small encoder's shape (batch 32, 4 heads of 64, 128 tokens), as XLA runs
them on the CPU: on the [B, L, N, D] operands the projections produce (``blnd,bknd->bnlk``;
the position scores over the 2 x 128 distances with each row's encodings; the values) and
on head-major copies (XLNet's layer computes scores and values in that layout; its position
scores are one product per direction, ``models.xlnet.position_scores``), beside the same
products through ``torch.matmul`` on contiguous [B, N, L, D] tensors.

  python benchmarks/bench_ops.py                      # XLNet's head: 32 x 21 rows, vocab 30,522
  python benchmarks/bench_ops.py --rows=640 --hidden=768

Both sides compute the same values (printed: the largest difference of the outputs and of
every gradient).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_train import _time_steps  # noqa: E402  (the same timing as the training step's)


def _side_by_side(name: str, ours, plain, args, rounds: int, steps: int) -> None:
  import jax
  import numpy as np
  diff = max(float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max())
             for a, b in zip(jax.tree.leaves(ours(*args)), jax.tree.leaves(plain(*args))))
  times = {'ours': [], 'plain': []}
  for _ in range(rounds):  # Each round: one warm-up call, then the median of `steps` calls.
    for key, fn in (('ours', ours), ('plain', plain)):
      times[key].append(_time_steps(lambda: jax.block_until_ready(fn(*args)), steps, 1))
  a, b = (statistics.median(times[k]) * 1e3 for k in ('ours', 'plain'))
  print(f'{name:44s} ours {a:8.2f} ms   plain {b:8.2f} ms   {b / a:5.2f}x   '
        f'max |difference| {diff:.1e}', flush=True)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--rows', type=int, default=32 * 21, help='Predicted rows in the batch.')
  ap.add_argument('--hidden', type=int, default=256)
  ap.add_argument('--vocab_size', type=int, default=30522)
  ap.add_argument('--ffn_rows', type=int, default=32 * 128)
  ap.add_argument('--ffn_width', type=int, default=1024)
  ap.add_argument('--attention_batch', type=int, default=32)
  ap.add_argument('--heads', type=int, default=4)
  ap.add_argument('--head_dim', type=int, default=64)
  ap.add_argument('--seq_len', type=int, default=128)
  ap.add_argument('--rounds', type=int, default=3)
  ap.add_argument('--steps', type=int, default=5)
  args = ap.parse_args()

  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np

  from encoder_jax.models import config as config_lib
  from encoder_jax.models import layers
  from encoder_jax.objectives import base

  rng = np.random.default_rng(0)
  m, d, v = args.rows, args.hidden, args.vocab_size
  x = jnp.asarray(rng.normal(size=(m, d)), jnp.float32)
  table = jnp.asarray(rng.normal(size=(v, d)) * 0.02, jnp.float32)
  bias = jnp.asarray(rng.normal(size=(v,)) * 0.1, jnp.float32)
  labels = jnp.asarray(rng.integers(0, v, (m,)), jnp.int32)
  weights = jnp.asarray(rng.random(m) < 0.95, jnp.float32)

  def plain_loss(x, table, bias):
    logits = jnp.einsum('md,vd->mv', x, table, preferred_element_type=jnp.float32) + bias
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1)[:, 0]
    return (nll * weights).sum() / jnp.maximum(weights.sum(), 1.0)

  def our_loss(x, table, bias):
    return base.cross_entropy(layers.tied_logits(x, table, bias), labels, weights)[0]

  grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))
  print(f'JAX {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPU cores')
  _side_by_side(f'LM head + loss, fwd+bwd ({m} x {d} x {v:,})', grad(our_loss),
                grad(plain_loss), (x, table, bias), args.rounds, args.steps)

  h = jnp.asarray(rng.normal(size=(args.ffn_rows, args.ffn_width)), jnp.float32)
  g = jnp.asarray(rng.normal(size=h.shape), jnp.float32)
  erfc_gelu = lambda x: nn.gelu(x, approximate=False)
  shape = f'{args.ffn_rows} x {args.ffn_width}'
  _side_by_side(f'exact GELU, fwd ({shape})', jax.jit(config_lib.gelu), jax.jit(erfc_gelu),
                (h,), args.rounds, args.steps)
  vjp = lambda f: jax.jit(lambda x, g: jax.vjp(f, x)[1](g))
  _side_by_side(f'exact GELU, fwd+bwd ({shape})', vjp(config_lib.gelu), vjp(erfc_gelu),
                (h, g), args.rounds, args.steps)

  feed_forward(args)
  attention_products(args)


def feed_forward(args) -> None:
  """A feed-forward block (dense, GELU, dropout, dense, dropout) forward and backward:
  ``layers.dense`` against einsum + bias under autodiff."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from encoder_jax.models import config as config_lib
  from encoder_jax.models import layers

  rng = np.random.default_rng(2)
  b, l, e, f = args.attention_batch, args.seq_len, args.hidden, args.ffn_width
  arr = lambda *shape: jnp.asarray(rng.normal(size=shape) * 0.02, jnp.float32)
  operands = (arr(b, l, e) * 50, arr(e, f), arr(f), arr(f, e), arr(e))
  keys = jax.random.split(jax.random.key(0), 3)

  def block(dense):
    def loss(x, w_in, b_in, w_out, b_out):
      y = dense(layers.dropout(x, 0.1, keys[0]), w_in, b_in)
      y = dense(layers.dropout(config_lib.gelu(y), 0.1, keys[1]), w_out, b_out)
      return jnp.sum(layers.dropout(y, 0.1, keys[2]) + x)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))

  ours = block(lambda x, w, bias: layers.dense(x, w, bias, 1))
  plain = block(lambda x, w, bias: jnp.einsum('ble,ef->blf', x, w) + bias)
  _side_by_side(f'feed-forward block, fwd+bwd ({b}x{l}x{e}, {f})', ours, plain,
                operands, args.rounds, args.steps)


def attention_products(args) -> None:
  """XLA's batched attention products (on [B, L, N, D] and on head-major operands) beside
  ``torch.matmul``'s."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from encoder_jax.core import extras
  torch = extras.require('torch', extra='peers', what='the PyTorch side of the op benchmark')
  torch.set_num_threads(os.cpu_count() or 1)
  b, n, l, d = args.attention_batch, args.heads, args.seq_len, args.head_dim
  rng = np.random.default_rng(1)
  arr = lambda *shape: rng.normal(size=shape).astype(np.float32)
  q, k, kr = arr(b, l, n, d), arr(b, l, n, d), arr(b, 2 * l, n, d)
  prob = rng.random((b, n, l, l)).astype(np.float32)
  head_major = lambda x: torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1, 3)))
  tq, tk, tkr, tprob = head_major(q), head_major(k), head_major(kr), torch.from_numpy(prob)
  print(f'Attention products, batch {b} x {n} heads x {l} tokens x {d}: XLA (einsums on '
        '[B, L, N, D] operands, and on head-major copies) beside torch.matmul on head-major '
        f'tensors (torch {torch.__version__}, {torch.get_num_threads()} threads)')
  # (name, the einsum on [B, L, N, D] operands, its operands, the head-major einsum, torch).
  cases = (
      ('scores q.k', 'blnd,bknd->bnlk', (q, k), 'bnld,bnkd->bnlk',
       lambda: tq @ tk.transpose(-1, -2), l),
      ('position scores', 'blnd,brnd->bnlr', (q, kr), 'bnld,bnrd->bnlr',
       lambda: tq @ tkr.transpose(-1, -2), 2 * l),
      ('values', 'bnlk,bknd->blnd', (prob, k), 'bnlk,bnkd->bnld', lambda: tprob @ tk, l),
  )
  for name, spec, operands, spec_hm, torch_fn, keys in cases:
    xla_fn = jax.jit(lambda x, y, spec=spec: jnp.einsum(spec, x, y))
    hm_fn = jax.jit(lambda x, y, spec=spec_hm: jnp.einsum(spec, x, y))
    ops = [jnp.asarray(o) for o in operands]
    ops_hm = [jnp.asarray(o if o is prob else o.transpose(0, 2, 1, 3)) for o in operands]
    theirs = torch_fn().numpy()
    ours, ours_hm = np.asarray(xla_fn(*ops)), np.asarray(hm_fn(*ops_hm))
    diff = max(float(np.abs(ours_hm - theirs).max()), float(np.abs(
        (ours.transpose(0, 2, 1, 3) if spec.endswith('blnd') else ours) - theirs).max()))
    times = {'xla': [], 'hm': [], 'torch': []}
    for _ in range(args.rounds):
      times['xla'].append(_time_steps(lambda: jax.block_until_ready(xla_fn(*ops)), args.steps, 1))
      times['hm'].append(_time_steps(lambda: jax.block_until_ready(hm_fn(*ops_hm)), args.steps,
                                     1))
      times['torch'].append(_time_steps(torch_fn, args.steps, 1))
    a, h, t = (statistics.median(times[k]) * 1e3 for k in ('xla', 'hm', 'torch'))
    rate = lambda ms: f'{2 * b * n * l * keys * d / 1e9 / ms * 1e3:4.0f} GFLOP/s'
    print(f'  {name:16s} ({spec}): XLA {a:6.2f} ms ({rate(a)}); XLA on [B, N, L, D] operands '
          f'{h:5.2f} ms ({rate(h)}); torch {t:5.2f} ms ({rate(t)}); max |difference| '
          f'{diff:.1e}', flush=True)


if __name__ == '__main__':
  main()
