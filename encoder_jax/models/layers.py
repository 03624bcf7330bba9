"""Layer helpers: the one place where parameters get their logical axis names.

Logical axes (mapped onto the mesh by ``sharding.LOGICAL_RULES``):
  batch, length, embed, heads, kv, mlp, vocab, layers.
Every parameter is created through :func:`param`, so every parameter is an
``nn.LogicallyPartitioned`` box whose names have the parameter's rank.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Axes = tuple[str | None, ...]


def truncated_normal(stddev: float):
  """BERT's initializer: normal truncated at 2 standard deviations."""
  return nn.initializers.truncated_normal(stddev=stddev)


def param(module: nn.Module, name: str, init, shape: Sequence[int], axes: Axes,
          dtype=jnp.float32) -> jax.Array:
  if len(axes) != len(shape):
    raise ValueError(f'{module.name}/{name}: axes {axes} do not match shape {shape}')
  return module.param(name, nn.with_logical_partitioning(init, axes), tuple(shape), dtype)


class Dense(nn.Module):
  """y = x @ kernel + bias, contracting the last ``len(in_shape)`` input axes.

  ``in_shape``/``out_shape`` may be multi-dimensional (e.g. (heads, kv)), so attention
  projections keep a head axis that tensor parallelism can shard.
  """
  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  in_axes: Axes
  out_axes: Axes
  init_stddev: float
  dtype: jnp.dtype = jnp.float32
  use_bias: bool = True

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = param(self, 'kernel', truncated_normal(self.init_stddev),
                   self.in_shape + self.out_shape, self.in_axes + self.out_axes)
    bias = None
    if self.use_bias:
      bias = param(self, 'bias', nn.initializers.zeros, self.out_shape, self.out_axes)
    return dense(x, kernel, bias, len(self.in_shape), self.dtype)


def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, n_in: int,
          dtype=jnp.float32) -> jax.Array:
  """:class:`Dense`'s computation on its arrays (``kernel`` [*in, *out], ``bias`` [*out])."""
  y = project(x.astype(dtype), kernel.astype(dtype), n_in)
  return y if bias is None else y + bias.astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def project(x: jax.Array, kernel: jax.Array, n_in: int, in_first: bool = True) -> jax.Array:
  """[*lead, *in] -> [*lead, *out]: ``x``'s last ``n_in`` axes contracted with ``kernel``
  [*in, *out] (``in_first``) or [*out, *in]: a dense layer's product, no casts.

  The kernel's gradient is written out as one product over the rows: ``x`` and the
  cotangent flattened to [rows, in] and [rows, out] (rows: the leading axes) and contracted
  over their first axis. Autodiff contracted the leading axes of the N-d arrays, and
  XLA:CPU then copied both operands transposed in memory before the product (per weight
  gradient); flattened, the product reads them as they are. The input's gradient is
  autodiff's product. Same values (``tests/models/test_layers.py``).
  """
  return jax.lax.dot_general(x, kernel, _contraction(x.ndim, kernel.ndim, n_in, in_first))


def _contraction(x_ndim: int, k_ndim: int, n_in: int, in_first: bool):
  k_in = tuple(range(n_in)) if in_first else tuple(range(k_ndim - n_in, k_ndim))
  return ((tuple(range(x_ndim - n_in, x_ndim)), k_in), ((), ()))


def _project_fwd(x, kernel, n_in, in_first):
  return project(x, kernel, n_in, in_first), (x, kernel)


def _project_bwd(n_in, in_first, residuals, g):
  x, kernel = residuals
  n_out = kernel.ndim - n_in
  lead = g.ndim - n_out
  k_out = tuple(range(n_in, kernel.ndim)) if in_first else tuple(range(n_out))
  dx = jax.lax.dot_general(g, kernel, ((tuple(range(lead, g.ndim)), k_out), ((), ())))
  rows = math.prod(x.shape[:lead])
  x_MxI = x.reshape(rows, math.prod(x.shape[lead:]))
  g_MxO = g.reshape(rows, math.prod(g.shape[lead:])).astype(x.dtype)
  rows_contracted = (((0,), (0,)), ((), ()))
  d_kernel = (jax.lax.dot_general(x_MxI, g_MxO, rows_contracted) if in_first
              else jax.lax.dot_general(g_MxO, x_MxI, rows_contracted))
  return dx.astype(x.dtype), d_kernel.reshape(kernel.shape).astype(kernel.dtype)


project.defvjp(_project_fwd, _project_bwd)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis; statistics in float32 whatever the activation dtype."""
  eps: float
  dtype: jnp.dtype = jnp.float32
  use_bias: bool = True  # False: scale only (no 'bias' parameter).

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d = x.shape[-1]
    scale = param(self, 'scale', nn.initializers.ones, (d,), ('embed',))
    bias = param(self, 'bias', nn.initializers.zeros, (d,), ('embed',)) if self.use_bias else None
    return layer_norm(x, scale, bias, self.eps, self.dtype)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array | None, eps: float,
               dtype=jnp.float32) -> jax.Array:
  """:class:`LayerNorm`'s computation on its arrays (``bias`` None: scale only)."""
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = jnp.square(x32 - mean).mean(-1, keepdims=True)
  y = (x32 - mean) * jax.lax.rsqrt(var + eps) * scale
  return (y if bias is None else y + bias).astype(dtype)


class ParamGroup(nn.Module):
  """Parameters in a scope of their own, returned as arrays, for code that computes with
  plain functions (e.g. inside ``jax.lax.cond``, where modules cannot be called).

  ``specs``: ((name, init, shape, axes), ...). :func:`dense_params` and
  :func:`layer_norm_params` make the same tree and initial values as :class:`Dense` and
  :class:`LayerNorm` of the same name.
  """
  specs: tuple

  @nn.compact
  def __call__(self) -> dict[str, jax.Array]:
    return {name: param(self, name, init, shape, axes) for name, init, shape, axes in self.specs}


def dense_params(in_shape: tuple[int, ...], out_shape: tuple[int, ...], in_axes: Axes,
                 out_axes: Axes, init_stddev: float) -> tuple:
  return (('kernel', truncated_normal(init_stddev), in_shape + out_shape, in_axes + out_axes),
          ('bias', nn.initializers.zeros, out_shape, out_axes))


def layer_norm_params(d: int) -> tuple:
  return (('scale', nn.initializers.ones, (d,), ('embed',)),
          ('bias', nn.initializers.zeros, (d,), ('embed',)))


class Embed(nn.Module):
  """A lookup table; ``attend`` multiplies by its transpose (the tied MLM decoder)."""
  num_embeddings: int
  features: int
  axes: Axes
  init_stddev: float
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.embedding = param(self, 'embedding', truncated_normal(self.init_stddev),
                           (self.num_embeddings, self.features), self.axes)

  def __call__(self, ids: jax.Array) -> jax.Array:
    return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

  def attend(self, x: jax.Array, bias: jax.Array) -> jax.Array:
    """float32 logits ``x @ embedding.T + bias`` (:func:`tied_logits`)."""
    return tied_logits(x.astype(self.dtype), self.embedding.astype(self.dtype),
                       bias.astype(jnp.float32))


@jax.custom_vjp
def tied_logits(x: jax.Array, table_VxD: jax.Array, bias_V: jax.Array) -> jax.Array:
  """float32 [..., V] ``x @ table.T + bias``: the tied decoder of an LM head.

  Vocabulary logits feed a softmax over ~30k classes: accumulated and returned in float32.
  The gradient is written out (``_tied_logits_bwd``) rather than left to autodiff, which on
  XLA:CPU transposed the [rows, V] cotangent in memory for the table's product and took the
  bias gradient as a slow reduction. In float32 the values are the same products; under a
  bfloat16 compute dtype the float32 cotangent is rounded to bfloat16 for the two products
  (as a bfloat16 ``Dense`` layer's backward; autodiff kept it in float32). With
  ``objectives.base.cross_entropy`` (its gradient written out too), ``benchmarks/bench_ops.py``
  times the head and loss forward and backward.
  """
  return jnp.einsum('...d,vd->...v', x, table_VxD, preferred_element_type=jnp.float32) + bias_V


def _tied_logits_fwd(x, table_VxD, bias_V):
  return tied_logits(x, table_VxD, bias_V), (x, table_VxD)


def _tied_logits_bwd(residuals, g):
  x, table_VxD = residuals
  f32 = jnp.float32
  g_MxV = g.reshape(-1, g.shape[-1])
  gc_MxV = g_MxV.astype(x.dtype)  # The products run in the compute dtype, as the forward.
  x_MxD = x.reshape(-1, x.shape[-1])
  dx = jnp.dot(gc_MxV, table_VxD, preferred_element_type=f32).astype(x.dtype)
  d_table = jnp.einsum('mv,md->vd', gc_MxV, x_MxD, preferred_element_type=f32)
  # The bias gradient (column sums) as a product with ones: one pass at GEMM speed.
  d_bias = jnp.dot(jnp.ones((g_MxV.shape[0],), f32), g_MxV.astype(f32))
  return dx.reshape(x.shape), d_table.astype(table_VxD.dtype), d_bias


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


# Dropout decides two elements per 32-bit random word: a 16-bit draw below
# round(rate * 2**16) drops. The rate is quantised to 1/65536 (0.1 -> 0.100006).
#
# The words are a counter-based hash, not a generator's output: word i of a call is
# mix(mix(i + s0) ^ s1), with (s0, s1) two words drawn from the call's key and ``mix`` the
# 32-bit integer finaliser "lowbias32" (C. Wellons' hash-prospector: two multiplies, three
# xor-shifts, a bijection of uint32). It is a few integer operations per word that XLA
# fuses into the op that applies the mask, so no [*, d/2] array of bits is generated,
# written and read back: on XLA:CPU the generator (``jax.random.bits``, either key
# implementation) was most of dropout's cost (``benchmarks/bench_ops.py``). The words
# depend on the key and on each element's global index only (past 2**32 words too, see
# ``random_words``), so they are the same on any mesh and sharding.
# Statistics tested: kept share, both halves, no correlation between neighbours or between
# two keys' masks (``tests/models/test_attention.py``).
_DROP_RESOLUTION = 1 << 16


def rel_shift(bd_AxLxR: jax.Array, klen: int) -> jax.Array:
  """[..., L, klen + L] scores against distances -> [..., L, klen] scores against keys
  (A: any leading axes).

  Transformer-XL's shift (Hugging Face ``rel_shift_bnij``): row ``i`` moves left by
  ``L - i``, so entry ``[i, j]`` is ``bd[i, L - i + j]``; two reshapes and a slice, no
  gather (a gather over the scores with an index per element is the TPU compiler's
  slowest pattern).
  """
  *lead, l, r = bd_AxLxR.shape
  x_AxRxL = bd_AxLxR.reshape(*lead, r, l)[..., 1:, :]
  return x_AxRxL.reshape(*lead, l, r - 1)[..., :klen]


def shift_rows(x_AxQxU: jax.Array, shift_AxQ: jax.Array, width: int,
               max_shift: int) -> jax.Array:
  """``out[..., q, m] = x[..., q, shift[..., q] + m]`` for m < ``width``: each row's window
  from a traced start in ``[0, max_shift]`` (``shift_AxQ`` broadcasts against x's leading
  axes and rows).

  One select per bit of the shift between two static slices (a barrel shifter):
  elementwise passes over [..., Q, U], for rows picked at run time (the rows a loss
  reads), where a gather with an index per element is slow on a TPU and one with a window
  per row is compiled as a loop over the rows.
  """
  bits = int(max_shift).bit_length()
  need = width + (1 << bits) - 1
  if x_AxQxU.shape[-1] < need:
    x_AxQxU = jnp.pad(x_AxQxU, [(0, 0)] * (x_AxQxU.ndim - 1) + [(0, need - x_AxQxU.shape[-1])])
  shift_AxQx1 = shift_AxQ[..., None]
  for k in reversed(range(bits)):
    size = x_AxQxU.shape[-1] - (1 << k)
    x_AxQxU = jnp.where((shift_AxQx1 >> k) & 1 == 1, x_AxQxU[..., 1 << k:], x_AxQxU[..., :size])
  return x_AxQxU[..., :width]


def layer_scan(body, init, xs, length: int, unroll: int):
  """``jax.lax.scan`` over a stack of layers' sliced parameters (the layer loops that run
  outside ``nn.scan``: the last layer at some rows, XLNet's skipped content stream). One
  name, so ``benchmarks/bench_train.py`` can trace it unrolled for XLA's FLOP count."""
  return jax.lax.scan(body, init, xs, length=length, unroll=unroll)


def _mix32(x: jax.Array) -> jax.Array:
  """lowbias32: a 32-bit integer hash with low bias (bijective on uint32)."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def random_words(rng: jax.Array, shape: Sequence[int]) -> jax.Array:
  """uint32 ``shape``: hashed words, a pure function of the key and each element's index.

  Word i is ``mix(mix(lo + s0) ^ (s1 + hi * golden))``, with ``lo`` the flat index mod 2**32
  and ``hi`` the leading (row) index divided by a block of rows short enough that two
  elements with the same ``lo`` are never in one block: distinct elements hash distinct
  inputs even past 2**32 words (a global attention-dropout array of BERT-large at 512
  tokens reaches that at a batch of 2,048).
  """
  *lead, d = shape
  rows = 1
  for n in lead:
    rows *= n
  if rows >= 1 << 32:
    raise ValueError(f'dropout over {shape}: more than 2**32 rows of the last axis')
  seeds = jax.random.bits(rng, (2,), jnp.uint32)
  row = jax.lax.iota(jnp.uint32, rows).reshape(*lead, 1)
  col = jax.lax.broadcasted_iota(jnp.uint32, shape, len(shape) - 1)
  return hash_words(row, col, d, seeds)


def hash_words(row: jax.Array, col: jax.Array, width: int, seeds: jax.Array) -> jax.Array:
  """The word of element (row, col) of rows ``width`` long (``random_words``)."""
  lo = row * jnp.uint32(width) + col  # The flat index, mod 2**32.
  block = max(1, (1 << 32) // width - 1)  # Same lo => row indices at least this far apart.
  hi = row // jnp.uint32(block)
  return _mix32(_mix32(lo + seeds[0]) ^ (seeds[1] + hi * jnp.uint32(0x9E3779B9)))


def keep_mask(rng: jax.Array, shape: Sequence[int], rate: float) -> jax.Array:
  """bool ``shape``: True where dropout keeps the element (probability 1 - rate).

  The two 16-bit halves of each word cover the first and the second half of the last axis.
  """
  *lead, d = shape
  half = (d + 1) // 2
  words = random_words(rng, (*lead, half))
  threshold = jnp.uint32(round(rate * _DROP_RESOLUTION))
  return jnp.concatenate([(words & 0xFFFF) >= threshold, (words >> 16) >= threshold],
                         axis=-1)[..., :d]


def dropout(x: jax.Array, rate: float, rng: jax.Array) -> jax.Array:
  """Inverted dropout: kept elements scaled by 1 / (1 - rate), the rest 0."""
  if rate <= 0.0:
    return x
  if rate >= 1.0:
    return jnp.zeros_like(x)
  keep = keep_mask(rng, x.shape, rate)
  return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - rate), x.dtype), jnp.zeros((), x.dtype))


class Dropout(nn.Module):
  """``nn.Dropout`` with :func:`keep_mask`'s decisions (rng stream 'dropout')."""
  rate: float

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    if deterministic or self.rate <= 0.0:
      return x
    return dropout(x, self.rate, self.make_rng('dropout'))


# DeBERTa's disentangled position terms (config.model.pos_att_type), read by the attention
# kind and by its Hugging Face table.
POSITION_TERMS = ('c2p', 'p2c')


def position_terms(c) -> tuple[str, ...]:
  """The disentangled terms of ``config.model.pos_att_type`` ('c2p|p2c'), in a fixed order."""
  names = [t.strip() for t in c.pos_att_type.lower().split('|') if t.strip()]
  unknown = sorted(set(names) - set(POSITION_TERMS))
  if unknown or len(set(names)) != len(names):
    raise ValueError(f'config.model.pos_att_type={c.pos_att_type!r}; expected terms from '
                     f"{list(POSITION_TERMS)} joined by '|' (e.g. 'c2p|p2c'), each once")
  return tuple(t for t in POSITION_TERMS if t in names)
