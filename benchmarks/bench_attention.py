r"""Memory of one attention layer at length 512: BERT's dot product beside DeBERTa's
disentangled attention (v1: span k = 512; v2: 256 log buckets, shared keys), and beside a
direct implementation that materialises the [L, L, d] position vectors.

Each variant is one attention module (BERT-base width: 12 heads x 64) compiled with
``jax.jit`` for the forward pass and for forward + backward (gradient of the output's sum
w.r.t. params and input), and the compiled executable's ``memory_analysis()`` is printed:
temporaries (XLA's scratch for intermediates: what the attention itself costs) and the peak
(arguments + outputs + temporaries). Nothing runs unless ``--time`` is given, so the figures
are the compiler's on this backend (CPU here; pass ``JAX_PLATFORMS=cuda`` on a GPU host).

  python benchmarks/bench_attention.py                       # batch 8 x 512, base width
  python benchmarks/bench_attention.py --seq_len=128 --time  # + forward/backward ms
  python benchmarks/bench_attention.py --local               # ModernBERT at 8,192 tokens

``--local``: ModernBERT's attention (fused QKV, rotary) on a global layer beside a local one
(a 128-token sliding window, ``config.model.local_attention``, computed band by band), at
batch 1 x 8,192 tokens unless given: the global layer's [heads, L, L] scores against the
local layer's [heads, L, 3 x 64] band blocks, so memory linear in the length.

The disentangled terms are [B, heads, L, R] score tensors (R = the 2L - 1 reachable rows of
v1's 2k table at L <= k, or <= 2 x 256 buckets) gathered to [B, heads, L, L]; the direct form
builds position keys/queries for every (i, j) pair: [L, L, heads, d] per term, batch-free
but L / (2 B) times the [B, heads, L, L] scores in size (and more once the batch axis is
broadcast into the products).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GIB = 2.0 ** 30


def modernbert_configs(args):
  """ModernBERT's layer 0 (global) and layer 1 (local): config and the layer index."""
  from encoder_jax.models import registry
  c = registry.make_config(dict(
      kind='modernbert', vocab_size=1000, hidden_size=args.hidden_size,
      num_heads=args.num_heads, num_layers=3, intermediate_size=4 * args.hidden_size,
      max_position_embeddings=max(8192, args.seq_len), hidden_dropout_rate=0.0,
      attention_dropout_rate=0.0, dtype=args.dtype, pre_norm=True, gated_ffn=True,
      rotary=True, fused_qkv=True, first_attention_norm=False, type_vocab_size=0,
      dense_bias=False, norm_bias=False, local_attention=args.local_attention,
      global_attn_every_n_layers=3, rope_theta=160000.0, local_rope_theta=10000.0))
  return {'modernbert global layer': (c, 0),
          f'modernbert local layer (window {args.local_attention})': (c, 1)}


def configs(args):
  from encoder_jax.models import registry
  common = dict(vocab_size=1000, hidden_size=args.hidden_size, num_heads=args.num_heads,
                num_layers=1, intermediate_size=4 * args.hidden_size,
                max_position_embeddings=max(512, args.seq_len), hidden_dropout_rate=0.0,
                attention_dropout_rate=0.0, dtype=args.dtype)
  deberta = dict(common, attention_kind='disentangled', position_biased_input=False,
                 type_vocab_size=0)
  return {
      'bert dot_product': registry.make_config(dict(common, kind='bert')),
      'deberta v1 (k=512)': registry.make_config(dict(deberta, kind='deberta')),
      'deberta v2 (256 buckets, shared keys)': registry.make_config(dict(
          deberta, kind='deberta_v2', position_buckets=256, share_att_key=True,
          norm_rel_ebd=True)),
  }


def direct_disentangled(c, rel_RxE, q, k, index_LxL, scale):
  """The O(L^2 d) form: position keys/queries for every (i, j), then per-pair products."""
  import jax.numpy as jnp
  pos_LxLxE = rel_RxE[index_LxL]  # [L, L, E]
  h, d = c.num_heads, c.head_dim
  pos_LxLxHxD = pos_LxLxE.reshape(pos_LxLxE.shape[:2] + (h, d))  # Identity projection.
  c2p = jnp.einsum('bihd,ijhd->bhij', q, pos_LxLxHxD)
  p2c = jnp.einsum('bjhd,ijhd->bhij', k, pos_LxLxHxD)
  return (jnp.einsum('bihd,bjhd->bhij', q, k) + c2p + p2c) / scale


def compile_variant(name, c, args, layer=None):
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np

  from encoder_jax.models import attention_kinds
  from encoder_jax.models import disentangled_attention as da

  b, l, e = args.batch_size, args.seq_len, c.hidden_size
  x = jax.ShapeDtypeStruct((b, l, e), c.jnp_dtype)
  mask = jax.ShapeDtypeStruct((b, 1, 1, l), jnp.bool_)
  context = {}
  if c.attention_kind == 'disentangled':
    _, lo, hi = da.relative_layout(c, l)
    context = dict(rel_embeddings=jax.ShapeDtypeStruct((hi - lo, e), c.jnp_dtype))
  module = attention_kinds.get(c.attention_kind)(c, deterministic=True)
  params = jax.eval_shape(lambda: nn.unbox(module.init(
      jax.random.key(0), jnp.zeros(x.shape, x.dtype), jnp.ones(mask.shape, bool),
      dict(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype) if hasattr(s, 'shape') and not
                        isinstance(s, jax.Array) else s, context),
           **({} if layer is None else {'layer': layer})))))

  def forward(p, x, mask, ctx):  # The layer index stays a Python int (static).
    return module.apply(p, x, mask, ctx if layer is None else dict(ctx, layer=layer))

  def train(p, x, mask, ctx):
    return jax.grad(lambda p, x: forward(p, x, mask, ctx).astype(jnp.float32).sum(),
                    argnums=(0, 1))(p, x)

  out = {}
  for what, fn in (('forward', forward), ('forward+backward', train)):
    compiled = jax.jit(fn).lower(params, x, mask, context).compile()
    m = compiled.memory_analysis()
    out[what] = dict(temporaries=m.temp_size_in_bytes,
                     peak=m.argument_size_in_bytes + m.output_size_in_bytes
                     - m.alias_size_in_bytes + m.temp_size_in_bytes, compiled=compiled)
  if args.time:
    rng = np.random.default_rng(0)
    real = lambda s: jnp.asarray(rng.standard_normal(s.shape), s.dtype) if s.dtype != bool else (
        jnp.ones(s.shape, bool))
    p_real = jax.tree.map(real, params)
    ctx_real = jax.tree.map(lambda s: real(s) if isinstance(s, jax.ShapeDtypeStruct) else s,
                            context)
    args_real = (p_real, real(x), real(mask), ctx_real)
    for what in out:
      f = out[what]['compiled']
      jax.block_until_ready(f(*args_real))
      t = time.perf_counter()
      for _ in range(args.steps):
        jax.block_until_ready(f(*args_real))
      out[what]['ms'] = (time.perf_counter() - t) / args.steps * 1e3
  return out


def compile_direct(c, args):
  """The direct O(L^2 d) form (c2c + c2p + p2c, one projection-free head split), forward."""
  import jax
  import jax.numpy as jnp

  from encoder_jax.models import disentangled_attention as da

  b, l, e = args.batch_size, args.seq_len, c.hidden_size
  h, d = c.num_heads, c.head_dim
  index, lo, hi = da.relative_layout(c, l)
  q = jax.ShapeDtypeStruct((b, l, h, d), c.jnp_dtype)
  rel = jax.ShapeDtypeStruct((hi - lo, e), c.jnp_dtype)
  fn = lambda rel, q, k: jax.nn.softmax(direct_disentangled(
      c, rel, q, k, jnp.asarray(index), (3 * d) ** 0.5), -1)
  m = jax.jit(fn).lower(rel, q, q).compile().memory_analysis()
  return dict(temporaries=m.temp_size_in_bytes,
              peak=m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--batch_size', type=int, default=None, help='Default 8 (--local: 1).')
  ap.add_argument('--seq_len', type=int, default=None, help='Default 512 (--local: 8,192).')
  ap.add_argument('--local', action='store_true',
                  help="ModernBERT's global against its local (sliding-window) layer.")
  ap.add_argument('--local_attention', type=int, default=128,
                  help='--local: the window in tokens (half either side).')
  ap.add_argument('--hidden_size', type=int, default=768)
  ap.add_argument('--num_heads', type=int, default=12)
  ap.add_argument('--dtype', default='float32')
  ap.add_argument('--time', action='store_true', help='Also run and time each executable.')
  ap.add_argument('--steps', type=int, default=5)
  args = ap.parse_args()
  args.batch_size = args.batch_size or (1 if args.local else 8)
  args.seq_len = args.seq_len or (8192 if args.local else 512)

  import jax
  print(f'One attention layer, batch {args.batch_size} x {args.seq_len}, hidden '
        f'{args.hidden_size} ({args.num_heads} heads), {args.dtype}, JAX backend '
        f'{jax.default_backend()} ({jax.devices()[0].device_kind}); compiled memory_analysis():')
  scores = args.batch_size * args.num_heads * args.seq_len ** 2 * 4
  print(f'  (one [B, heads, L, L] float32 score tensor is {scores / GIB:.3f} GiB)')
  if args.local:
    variants = modernbert_configs(args)
  else:
    cs = configs(args)
    variants = {name: (c, None) for name, c in cs.items()}
  for name, (c, layer) in variants.items():
    out = compile_variant(name, c, args, layer)
    for what, m in out.items():
      ms = f'  {m["ms"]:8.1f} ms' if 'ms' in m else ''
      print(f'  {name:40s} {what:17s} temporaries {m["temporaries"] / GIB:7.3f} GiB  '
            f'peak {m["peak"] / GIB:7.3f} GiB{ms}', flush=True)
  if args.local:
    return
  direct = compile_direct(cs['deberta v1 (k=512)'], args)
  print(f'  {"direct [L, L, d] disentangled (c2c+c2p+p2c)":40s} {"forward (scores)":17s} '
        f'temporaries {direct["temporaries"] / GIB:7.3f} GiB  peak {direct["peak"] / GIB:7.3f} GiB')


if __name__ == '__main__':
  main()
