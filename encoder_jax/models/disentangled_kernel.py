"""A Pallas TPU kernel for DeBERTa's disentangled attention (c2c + c2p + p2c), flash-style.

``attend(q, k, v, kr, qr, ...)`` is softmax((q k^T + c2p + p2c) / scale) v over one
sequence of P = n * bl positions (``bl`` the block), computed a [bl, bl] block of scores at
a time with an online softmax (forward) and the saved log-sum-exp (backward): no [P, P]
array reaches HBM. Its gradients (``jax.custom_vjp``) go to q, k, v and to the two
distance-expanded position tables.

Tables. Both relative terms read a table row per distance i - j (DeBERTa's clipping, v2's
log buckets and the share_att_key projection all happen outside, in the static
distance -> row map of ``disentangled_attention.kernel_rows``):

* ``kr`` [H, 2P, D], ascending: row t holds K^r at distance i - j = P - 1 - t
  (t = j - i + P - 1). c2p[i, j] = q_i . kr[j - i + P - 1].
* ``qr`` [H, 2P, D], descending: row t holds Q^r at distance i - j = t - P + 1
  (t = i - j + P - 1). p2c[i, j] = k_j . qr[i - j + P - 1].

Row 2P - 1 is never read (a block's window reads it only in a column the skew drops).

Blocks. For query block I and key block J (rows i = I bl + r, keys j = J bl + c) the c2p
rows form the aligned window kr[w0 : w0 + 2 bl], w0 = (J - I) bl + P - bl, at column
c - r + bl - 1: ``q_I @ window^T`` is [bl, 2 bl] and row r moves left by bl - 1 - r, a
per-row rotation (``pltpu.roll`` with a stride along the rows, the TPU's skew; 32-bit
only, so the products are skewed in float32), then its first bl columns are the block.
p2c is the same with k_J and the window qr[u0 : u0 + 2 bl], u0 = (I - J) bl + P - bl,
giving p2c^T of the block, transposed. The backward pass needs the inverse skew (row r
moving right by bl - 1 - r), a rotation with a negative stride, which Mosaic does not
lower; reversing the key axis of dS (a product with the [bl, bl] anti-identity on the
MXU: exact) turns it into a rotation with stride +1 against the window of the *reversed*
table (kr read descending, qr ascending), so the backward kernel takes both orders of
each table and returns the gradients of the reversed ones, which are reversed back
(:func:`reverse_table`, its own adjoint).

Masks: key padding (``kv_ids`` 1 real, 0 padding, -1 the block padding) or packed rows'
documents (``q_ids`` and ``kv_ids``: a query reads the keys of its document; padded queries
-2, padded keys -1). Masked scores take float32's lowest value, as the XLA path's do, so a
row of only masked keys (a row of padding) reads its block-padded keys uniformly where the
XLA path reads its S keys uniformly: nothing reads those rows. No attention dropout (the
caller runs the XLA path where it is asked for).

Grids: forward (H, B, I, J), J innermost (the [bl, 128] running max and sum and the
[bl, D] accumulator in VMEM; the log-sum-exp leaves as [8, P], a query per lane, as
splash's); backward (H, B, J, I), I innermost: dk_J and dv_J accumulate over I in float32
VMEM and are written once, in the operands' dtype, dq over (J, I) in a [P, D] float32
VMEM block for the row, likewise, the table gradients over (B, J, I) in [2P, D] float32
blocks resident for the head (summed over the batch shards by the caller). The tables sit
whole in VMEM, fetched once a head: ``vmem_table_bytes`` says what that costs; the caller
keeps the XLA path for tables that would not fit. ``interpret=True`` runs the same kernels
as XLA operations (CPU tests).

Cost estimates (XLA's cost analysis reads a Pallas call's bytes and FLOPs from its
``pl.CostEstimate``): the bytes are those of the blocks the grid's index maps fetch and
write, counted per fetch (a block is fetched again when its index changes between
consecutive steps, and not otherwise), and the FLOPs the kernel's matrix products (the
recomputation and the flips of the backward included).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

LANES = 128  # Lane width: the running max and sum are [rows, LANES] in VMEM.
SUBLANES = 8  # The log-sum-exp and dO . O in HBM: [SUBLANES, rows] (a row per query, lanes).
MASK_VALUE = float(np.finfo(np.float32).min)  # As the XLA path's masked logits.


def _pallas():
  """(pl, pltpu), imported when first used (Pallas' TPU modules slow every import)."""
  # pylint: disable=g-import-not-at-top
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import tpu as pltpu
  return pl, pltpu


def reverse_table(t_HxTxD):
  """[H, 2P, D] ascending <-> descending: out[t] = in[2P - 2 - t], row 2P - 1 zero (never
  read). A permutation of the first 2P - 1 rows and a zero row: its own adjoint."""
  rev = jnp.flip(t_HxTxD[:, :-1], axis=1)
  return jnp.concatenate([rev, jnp.zeros_like(t_HxTxD[:, :1])], axis=1)


def vmem_table_bytes(padded: int, head_dim: int, itemsize: int, tables: int) -> int:
  """VMEM the backward kernel's tables take (each table whole and double-buffered, both
  orders, plus the float32 gradients)."""
  return tables * 2 * padded * head_dim * (2 * 2 * itemsize + 2 * 4)


def _dot_nt(a, b):  # a [m, d] . b [n, d]^T -> [m, n], float32.
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_tn(a, b):  # a [m, n]^T . b [m, d] -> [n, d], float32.
  return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _dot(a, b, precision=None):  # a [m, n] . b [n, d] -> [m, d], float32.
  return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=precision,
                             preferred_element_type=jnp.float32)


def _row_stat(x_RxLANES):
  """[rows, LANES] (equal lanes) -> [SUBLANES, rows] (equal sublanes): a query per lane,
  the layout the statistics take in HBM (a sixteenth of [rows, LANES])."""
  return x_RxLANES.T[:SUBLANES]


def _column_stat(x_SxR):
  """[SUBLANES, rows] (equal sublanes) -> [rows, LANES] (equal lanes)."""
  return jnp.broadcast_to(x_SxR[:1], (LANES, x_SxR.shape[1])).T


def _to_lanes(x_RxLANES, n: int):
  """[rows, LANES] (equal lanes) -> [rows, n]."""
  if n <= LANES:
    return x_RxLANES[:, :n]
  return jnp.tile(x_RxLANES, (1, n // LANES))


def _skew(x_RxW, bl: int):
  """[bl, 2 bl] -> [bl, bl]: out[r, c] = x[r, c - r + bl - 1] (row r rotated left by
  bl - 1 - r, i.e. right by r + bl + 1 modulo 2 bl)."""
  _, pltpu = _pallas()
  return pltpu.roll(x_RxW, bl + 1, 1, stride=1, stride_axis=0)[:, :bl]


def _unskew_reversed(x_RxC, bl: int):
  """[bl, bl] -> [bl, 2 bl]: out[r, y] = x[r, y - r] (0 outside): row r placed r columns
  right, the inverse skew of the key-reversed block (a rotation with stride +1)."""
  _, pltpu = _pallas()
  padded = jnp.concatenate([x_RxC, jnp.zeros_like(x_RxC)], axis=1)
  return pltpu.roll(padded, 0, 1, stride=1, stride_axis=0)


def _anti_identity(bl: int, dtype):
  a = jax.lax.broadcasted_iota(jnp.int32, (bl, bl), 0)
  b = jax.lax.broadcasted_iota(jnp.int32, (bl, bl), 1)
  return (a + b == bl - 1).astype(dtype)


def _window(ref, start, width: int, bl: int):
  pl, _ = _pallas()
  return ref[pl.ds(pl.multiple_of(start, bl), width), :]


def _scores(q, k, kr_ref, qr_ref, i, j, *, bl: int, padded: int, inv_scale: float):
  """The [bl, bl] float32 logits of query block i against key block j, scaled."""
  s = _dot_nt(q, k)
  if kr_ref is not None:
    w0 = (j - i) * bl + padded - bl
    s = s + _skew(_dot_nt(q, _window(kr_ref, w0, 2 * bl, bl)), bl)
  if qr_ref is not None:
    u0 = (i - j) * bl + padded - bl
    s = s + _skew(_dot_nt(k, _window(qr_ref, u0, 2 * bl, bl)), bl).T
  return s * inv_scale


def _allowed(qid_ref, kvid_ref, bl: int):
  kv_1xC = kvid_ref[...]
  if qid_ref is None:
    return jnp.broadcast_to(kv_1xC > 0, (bl, bl))
  return _to_lanes(qid_ref[...], bl) == kv_1xC


def _split(refs, flags):
  """Names the kernel's refs from the flat list in the order of :func:`_in_specs`."""
  refs = list(refs)
  out = {}
  for name, present in flags:
    out[name] = refs.pop(0) if present else None
  return out, refs


def _forward_kernel(*refs, bl, padded, inv_scale, c2p, p2c, packed):
  pl, _ = _pallas()
  r, rest = _split(refs, (('q', 1), ('k', 1), ('v', 1), ('kr', c2p), ('qr', p2c),
                          ('qid', packed), ('kvid', 1), ('o', 1), ('lse', 1), ('m', 1),
                          ('l', 1), ('acc', 1)))
  assert not rest
  i, j = pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    r['m'][...] = jnp.full(r['m'].shape, -jnp.inf, jnp.float32)
    r['l'][...] = jnp.zeros(r['l'].shape, jnp.float32)
    r['acc'][...] = jnp.zeros(r['acc'].shape, jnp.float32)

  q, k, v = r['q'][...], r['k'][...], r['v'][...]
  s = _scores(q, k, r['kr'], r['qr'], i, j, bl=bl, padded=padded, inv_scale=inv_scale)
  s = jnp.where(_allowed(r['qid'], r['kvid'], bl), s, MASK_VALUE)
  m_prev, l_prev = r['m'][...], r['l'][...]
  m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))  # [bl, LANES]
  p = jnp.exp(s - _to_lanes(m_next, bl))
  alpha = jnp.exp(m_prev - m_next)
  r['l'][...] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
  r['m'][...] = m_next
  d = r['acc'].shape[-1]
  r['acc'][...] = r['acc'][...] * _to_lanes(alpha, d) + _dot(p.astype(v.dtype), v)

  @pl.when(j == pl.num_programs(3) - 1)
  def _done():
    l = r['l'][...]
    r['o'][...] = (r['acc'][...] / _to_lanes(l, d)).astype(r['o'].dtype)
    r['lse'][...] = _row_stat(r['m'][...] + jnp.log(l))


def _backward_kernel(*refs, bl, padded, inv_scale, c2p, p2c, packed):
  pl, _ = _pallas()
  r, rest = _split(refs, (('q', 1), ('k', 1), ('v', 1), ('do', 1), ('lse', 1), ('di', 1),
                          ('kr', c2p), ('kr_rev', c2p), ('qr', p2c), ('qr_rev', p2c),
                          ('qid', packed), ('kvid', 1), ('dq_out', 1), ('dk_out', 1),
                          ('dv_out', 1), ('dkr_rev', c2p), ('dqr_rev', p2c), ('dq', 1),
                          ('dk', 1), ('dv', 1)))
  assert not rest
  b, j, i = pl.program_id(1), pl.program_id(2), pl.program_id(3)
  last_i, last_j = pl.num_programs(3) - 1, pl.num_programs(2) - 1
  tables = [t for t in (r['dkr_rev'], r['dqr_rev']) if t is not None]

  @pl.when((b == 0) & (j == 0) & (i == 0))
  def _init_tables():
    for t in tables:
      t[...] = jnp.zeros(t.shape, t.dtype)

  @pl.when((j == 0) & (i == 0))
  def _init_dq():
    r['dq'][...] = jnp.zeros(r['dq'].shape, r['dq'].dtype)

  @pl.when(i == 0)
  def _init_dkv():
    r['dk'][...] = jnp.zeros(r['dk'].shape, r['dk'].dtype)
    r['dv'][...] = jnp.zeros(r['dv'].shape, r['dv'].dtype)

  q, k, v, do = r['q'][...], r['k'][...], r['v'][...], r['do'][...]
  dt = q.dtype
  s = _scores(q, k, r['kr'], r['qr'], i, j, bl=bl, padded=padded, inv_scale=inv_scale)
  s = jnp.where(_allowed(r['qid'], r['kvid'], bl), s, MASK_VALUE)
  p = jnp.exp(s - _to_lanes(_column_stat(r['lse'][...]), bl))
  dp = _dot_nt(do, v)
  dr32 = p * (dp - _to_lanes(_column_stat(r['di'][...]), bl)) * inv_scale  # d of the logits.
  dr = dr32.astype(dt)
  r['dv'][...] += _dot_tn(p.astype(dt), do)
  rows = pl.ds(pl.multiple_of(i * bl, bl), bl)
  dq = _dot(dr, k)
  dk = _dot_tn(dr, q)
  exact = jax.lax.Precision.HIGHEST if dt == jnp.float32 else None
  flip = _anti_identity(bl, dt)
  if c2p:  # Keys reversed: the inverse skew is a rotation with stride +1.
    g = _unskew_reversed(_dot(dr, flip, exact), bl).astype(dt)  # [bl, 2 bl]
    u0 = pl.multiple_of((i - j) * bl + padded - bl, bl)
    dq += _dot(g, _window(r['kr_rev'], u0, 2 * bl, bl))
    r['dkr_rev'][pl.ds(u0, 2 * bl), :] += _dot_tn(g, q)
  if p2c:  # dS^T with the queries reversed, against qr read ascending.
    g = _unskew_reversed(_dot(dr32.T.astype(dt), flip, exact), bl).astype(dt)
    w0 = pl.multiple_of((j - i) * bl + padded - bl, bl)
    dk += _dot(g, _window(r['qr_rev'], w0, 2 * bl, bl))
    r['dqr_rev'][pl.ds(w0, 2 * bl), :] += _dot_tn(g, k)
  r['dq'][rows, :] += dq
  r['dk'][...] += dk

  @pl.when(i == last_i)
  def _write_dkv():  # In the operands' dtype, from the float32 accumulators.
    r['dk_out'][...] = r['dk'][...].astype(r['dk_out'].dtype)
    r['dv_out'][...] = r['dv'][...].astype(r['dv_out'].dtype)

  @pl.when((j == last_j) & (i == last_i))
  def _write_dq():
    r['dq_out'][...] = r['dq'][...].astype(r['dq_out'].dtype)


def _specs(pl, names, bl, padded, d, order):
  """BlockSpecs by operand name; ``order`` 'fwd' (grid h, b, i, j) or 'bwd' (h, b, j, i)."""
  def qi(f):  # Index maps over (h, b, i, j) whatever the grid's order.
    if order == 'fwd':
      return lambda h, b, i, j: f(h, b, i, j)
    return lambda h, b, j, i: f(h, b, i, j)

  row = lambda n: pl.BlockSpec((None, None, bl, n), qi(lambda h, b, i, j: (b, h, i, 0)))
  col = lambda n: pl.BlockSpec((None, None, bl, n), qi(lambda h, b, i, j: (b, h, j, 0)))
  table = lambda: pl.BlockSpec((None, 2 * padded, d), qi(lambda h, b, i, j: (h, 0, 0)))
  stat = lambda: pl.BlockSpec((None, None, SUBLANES, bl), qi(lambda h, b, i, j: (b, h, 0, i)))
  spec = {
      'q': row(d), 'do': row(d), 'o': row(d),
      'lse': stat(), 'di': stat(),
      'k': col(d), 'v': col(d), 'dk': col(d), 'dv': col(d),
      'kr': table(), 'qr': table(), 'kr_rev': table(), 'qr_rev': table(),
      'dkr_rev': table(), 'dqr_rev': table(),
      'qid': pl.BlockSpec((None, bl, LANES), qi(lambda h, b, i, j: (b, i, 0))),
      'kvid': pl.BlockSpec((None, 1, bl), qi(lambda h, b, i, j: (b, 0, j))),
      'dq': pl.BlockSpec((None, None, padded, d), qi(lambda h, b, i, j: (b, h, 0, 0))),
  }
  return [spec[n] for n in names]


def _cost(pl, *, b, h, padded, bl, d, isz, c2p, p2c, packed, backward):
  """The blocks' bytes as the grid fetches them, and the matrix products' FLOPs."""
  n = padded // bl
  steps = b * h * n * n
  terms = int(c2p) + int(p2c)
  seq = padded * d * isz  # One row's q (or k, v, o, do) for one head.
  stats = padded * SUBLANES * 4  # One row's log-sum-exp (or dO . O) for one head.
  # The key ids ([1, bl] int32) and the query ids ([bl, LANES] int32, packed rows only):
  # forward, the keys' every step and the queries' once per (b, h, i); backward the other
  # way round.
  kv_ids, q_ids = b * h * padded * 4, (b * h * padded * LANES * 4 if packed else 0)
  block = 2 * bl * bl * d  # One [bl, bl] x d product.
  if not backward:
    # q, o, lse once per (b, h, i); k, v again for every i; tables once a head.
    read = (b * h * (seq + 2 * n * seq) + h * terms * 2 * padded * d * isz + n * kv_ids
            + q_ids)
    write = b * h * (seq + stats)
    flops = steps * block * (2 + 2 * terms)
    return pl.CostEstimate(flops=int(flops), transcendentals=int(steps * bl * bl),
                           bytes_accessed=int(read + write))
  # q, do, lse, di (and the query ids) again for every j; k, v once per (b, h, j); both
  # orders of the tables once a head; dq, dk, dv written once per row, the table
  # gradients once a head (float32).
  read = (b * h * (n * (2 * seq + 2 * stats) + 2 * seq) + h * terms * 2 * 2 * padded * d * isz
          + kv_ids + n * q_ids)
  write = b * h * 3 * seq + h * terms * 2 * padded * d * 4
  # Recomputed scores (1 + 2 per term), dP, dV, dQ, dK (4), and per term the flip (1), the
  # unskewed product against the table (2) and the table's gradient (2).
  flops = steps * block * (1 + 2 * terms + 4 + 5 * terms)
  return pl.CostEstimate(flops=int(flops), transcendentals=int(steps * bl * bl),
                         bytes_accessed=int(read + write))


def _forward_call(q, k, v, kr, qr, q_ids, kv_ids, *, bl, inv_scale, interpret):
  pl, pltpu = _pallas()
  b, h, padded, d = q.shape
  n = padded // bl
  c2p, p2c, packed = kr is not None, qr is not None, q_ids is not None
  names = ['q', 'k', 'v'] + ['kr'] * c2p + ['qr'] * p2c + ['qid'] * packed + ['kvid']
  args = [x for x in (q, k, v, kr, qr, q_ids, kv_ids) if x is not None]
  kernel = functools.partial(_forward_kernel, bl=bl, padded=padded, inv_scale=inv_scale,
                             c2p=c2p, p2c=p2c, packed=packed)
  return pl.pallas_call(
      kernel, grid=(h, b, n, n),
      in_specs=_specs(pl, names, bl, padded, d, 'fwd'),
      out_specs=_specs(pl, ['o', 'lse'], bl, padded, d, 'fwd'),
      out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, SUBLANES, padded), jnp.float32)),
      scratch_shapes=[pltpu.VMEM((bl, LANES), jnp.float32), pltpu.VMEM((bl, LANES), jnp.float32),
                      pltpu.VMEM((bl, d), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'parallel', 'parallel', 'arbitrary')),
      cost_estimate=_cost(pl, b=b, h=h, padded=padded, bl=bl, d=d, isz=q.dtype.itemsize,
                          c2p=c2p, p2c=p2c, packed=packed, backward=False),
      interpret=interpret, name='disentangled_attention_fwd',
  )(*args)


def _backward_call(q, k, v, do, lse, di, kr, qr, q_ids, kv_ids, *, bl, inv_scale, interpret):
  pl, pltpu = _pallas()
  b, h, padded, d = q.shape
  n = padded // bl
  c2p, p2c, packed = kr is not None, qr is not None, q_ids is not None
  kr_rev = reverse_table(kr) if c2p else None
  qr_rev = reverse_table(qr) if p2c else None
  names = (['q', 'k', 'v', 'do', 'lse', 'di'] + ['kr', 'kr_rev'] * c2p + ['qr', 'qr_rev'] * p2c
           + ['qid'] * packed + ['kvid'])
  args = [x for x in (q, k, v, do, lse, di, kr, kr_rev, qr, qr_rev, q_ids, kv_ids)
          if x is not None]
  out_names = ['dq', 'dk', 'dv'] + ['dkr_rev'] * c2p + ['dqr_rev'] * p2c
  table = jax.ShapeDtypeStruct((h, 2 * padded, d), jnp.float32)
  kernel = functools.partial(_backward_kernel, bl=bl, padded=padded, inv_scale=inv_scale,
                             c2p=c2p, p2c=p2c, packed=packed)
  outs = pl.pallas_call(
      kernel, grid=(h, b, n, n),
      in_specs=_specs(pl, names, bl, padded, d, 'bwd'),
      out_specs=_specs(pl, out_names, bl, padded, d, 'bwd'),
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype)] * 3 + [table] * (c2p + p2c),
      scratch_shapes=[pltpu.VMEM((padded, d), jnp.float32), pltpu.VMEM((bl, d), jnp.float32),
                      pltpu.VMEM((bl, d), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'arbitrary', 'arbitrary', 'arbitrary')),
      cost_estimate=_cost(pl, b=b, h=h, padded=padded, bl=bl, d=d, isz=q.dtype.itemsize,
                          c2p=c2p, p2c=p2c, packed=packed, backward=True),
      interpret=interpret, name='disentangled_attention_bwd',
  )(*args)
  dq, dk, dv, *rest = outs
  dkr = reverse_table(rest.pop(0)) if c2p else None
  dqr = reverse_table(rest.pop(0)) if p2c else None
  return dq, dk, dv, dkr, dqr


def _sharded(f, args, in_kinds, out_kinds, mesh_specs):
  """``f(*args)``, in a shard_map over ``mesh_specs`` (the operands by kind: 'seq'
  [B, H, ...], 'table' [H, ...], 'ids' [B, ...]; None operands and results stay out of
  it); the 'table' results are summed over the batch axes."""
  if mesh_specs is None:
    return f(*args)
  mesh, batch, head = mesh_specs
  P = jax.sharding.PartitionSpec
  spec = {'seq': P(batch, head, None, None), 'table': P(head, None, None),
          'ids': P(batch, None, None)}
  present = [i for i, x in enumerate(args) if x is not None]
  outs_present = [i for i, kind in enumerate(out_kinds) if kind is not None]

  def body(*given):
    full = [None] * len(args)
    for i, x in zip(present, given):
      full[i] = x
    outs = f(*full)
    outs = [outs[i] for i in outs_present]
    return tuple(jax.lax.psum(x, batch) if out_kinds[i] == 'table' and batch else x
                 for i, x in zip(outs_present, outs))

  outs = jax.shard_map(body, mesh=mesh, check_vma=False,
                       in_specs=tuple(spec[in_kinds[i]] for i in present),
                       out_specs=tuple(spec[out_kinds[i]] for i in outs_present))(
                           *[args[i] for i in present])
  full = [None] * len(out_kinds)
  for i, x in zip(outs_present, outs):
    full[i] = x
  return tuple(full)


def attend(q_BxHxPxD, k_BxHxPxD, v_BxHxPxD, kr_HxTxD, qr_HxTxD, q_ids_BxP, kv_ids_BxP, *,
           block: int, scale: float, interpret: bool, mesh_specs: Any = None):
  """softmax((q k^T + c2p + p2c) / scale) v [B, H, P, D] (see the module doc).

  ``kr_HxTxD`` / ``qr_HxTxD``: the ascending c2p and descending p2c tables [H, 2P, D], or
  None for a term the model does not have. ``kv_ids_BxP``: key padding (1 real, 0 padding,
  -1 block padding) when ``q_ids_BxP`` is None, else the keys' documents (and
  ``q_ids_BxP`` the queries'). ``mesh_specs``: (mesh, batch axes, head axis) to run the
  kernels in a ``shard_map`` (a Mosaic call is a custom call XLA cannot partition); the
  table gradients are summed over the batch axes there.
  """
  b, h, padded, d = q_BxHxPxD.shape
  if padded % block or block % 8:
    raise ValueError(f'disentangled kernel: length {padded} is not a multiple of the block '
                     f'{block} (itself a multiple of 8)')
  kw = dict(bl=block, inv_scale=1.0 / scale, interpret=interpret)
  q_ids = None if q_ids_BxP is None else jnp.broadcast_to(
      q_ids_BxP.astype(jnp.int32)[:, :, None], (b, padded, LANES))
  kv_ids = kv_ids_BxP.astype(jnp.int32)[:, None, :]

  def sharded(f, args, in_kinds, out_kinds):
    return _sharded(f, args, in_kinds, out_kinds, mesh_specs)

  def kinds(*pairs):
    return [kind if x is not None else None for x, kind in pairs]

  def forward(q, k, v, kr, qr, q_ids, kv_ids):
    args = (q, k, v, kr, qr, q_ids, kv_ids)
    in_kinds = ('seq', 'seq', 'seq', 'table', 'table', 'ids', 'ids')
    return sharded(lambda *a: _forward_call(*a, **kw), args, in_kinds, ('seq', 'seq'))

  # The ids are arguments, not closed over: a custom_vjp must not capture traced values (the
  # layer scan's).
  @jax.custom_vjp
  def run(q, k, v, kr, qr, q_ids, kv_ids):
    return forward(q, k, v, kr, qr, q_ids, kv_ids)[0]

  def run_fwd(q, k, v, kr, qr, q_ids, kv_ids):
    o, lse = forward(q, k, v, kr, qr, q_ids, kv_ids)
    return o, (q, k, v, kr, qr, q_ids, kv_ids, o, lse)

  def run_bwd(res, do):
    q, k, v, kr, qr, q_ids, kv_ids, o, lse = res
    di = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    di = jnp.broadcast_to(di[:, :, None, :], lse.shape)  # [B, H, SUBLANES, P]
    args = (q, k, v, do, lse, di, kr, qr, q_ids, kv_ids)
    in_kinds = ('seq',) * 6 + ('table', 'table', 'ids', 'ids')
    out_kinds = kinds((q, 'seq'), (k, 'seq'), (v, 'seq'), (kr, 'table'), (qr, 'table'))
    dq, dk, dv, dkr, dqr = sharded(lambda *a: _backward_call(*a, **kw), args, in_kinds,
                                   out_kinds)
    cast = lambda g, x: None if g is None else g.astype(x.dtype)
    return cast(dq, q), cast(dk, k), cast(dv, v), cast(dkr, kr), cast(dqr, qr), None, None

  run.defvjp(run_fwd, run_bwd)
  return run(q_BxHxPxD, k_BxHxPxD, v_BxHxPxD, kr_HxTxD, qr_HxTxD, q_ids, kv_ids)
