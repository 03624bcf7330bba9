"""A Pallas TPU kernel for relative attention (DeBERTa's c2c + c2p + p2c, XLNet's two
streams), flash-style.

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

XLNet's operands (``codes_BxPxP`` in place of the ids, a bias a key, a bias a query): the
codes are an int8 [bl, bl] block a step; the key bias a [1, bl] row added to every query's
logits, its gradient the column sums of dS (accumulated with dk); the query bias a
[SUBLANES, bl] statistic added where the code's bit 0 says, its gradient the masked row
sums of dS (accumulated with dq).

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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

LANES = 128  # Lane width: the running max and sum are [rows, LANES] in VMEM.
SUBLANES = 8  # The log-sum-exp and dO . O in HBM: [SUBLANES, rows] (a row per query, lanes).
MASK_VALUE = float(np.finfo(np.float32).min)  # As the XLA path's masked logits.
# A code a (query, key) pair (:func:`pack_codes`): read; read with the query's row bias
# added; not read.
READ, READ_WITH_ROW_BIAS, MASKED = 0, 1, 2
CODE_BITS = 2  # Four codes a byte: a block's [bl, bl] codes are [bl / 4, bl] bytes.


class Codes(NamedTuple):
  """The kernel's masks by code (:func:`pack_codes`): ``bits`` int8 [B, P / 4, P] (within
  each block of ``bl`` query rows, byte row r holds rows r + m bl / 4, m = 0..3, at bits
  2m, 2m + 1) and ``flat`` float32 [B, SUBLANES, P] (1: the query's logits read 0 and pass
  their gradient to the scores: a row of XLNet's keys all hidden, where ``score - 1e30``
  is -1e30 for each, a uniform softmax whose backward still reaches the scores)."""
  bits: Any
  flat: Any


def pack_codes(codes_BxPxP, flat_BxP, block: int) -> Codes:
  """int [B, P, P] codes (READ, READ_WITH_ROW_BIAS, MASKED) and bool [B, P] flat rows ->
  :class:`Codes` for blocks of ``block`` queries (once per pass, not per call)."""
  b, padded, _ = codes_BxPxP.shape
  if block % 4 or padded % block:
    raise ValueError(f'disentangled kernel: codes of {padded} rows in blocks of {block} '
                     '(a multiple of 4 that divides them)')
  quarters = codes_BxPxP.astype(jnp.int32).reshape(b, padded // block, 4, block // 4, padded)
  shifts = (CODE_BITS * jnp.arange(4, dtype=jnp.int32))[None, None, :, None, None]
  packed = jnp.sum(quarters << shifts, axis=2).reshape(b, padded // 4, padded)
  bits = jax.lax.bitcast_convert_type(packed.astype(jnp.uint8), jnp.int8)
  flat = jnp.broadcast_to(flat_BxP.astype(jnp.float32)[:, None, :], (b, SUBLANES, padded))
  return Codes(bits, flat)


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


def _scores(q, k, kr_ref, qr_ref, i, j, *, bl: int, padded: int, inv_scale: float,
            cb_ref=None, rb_ref=None, code=None):
  """The [bl, bl] float32 logits of query block i against key block j, scaled (the key
  block's column bias and, where ``code`` says, the query's row bias added first)."""
  s = _dot_nt(q, k)
  if cb_ref is not None:
    s = s + cb_ref[...]  # [1, bl]: a bias a key.
  if rb_ref is not None:
    s = s + jnp.where(code == READ_WITH_ROW_BIAS, _to_lanes(_column_stat(rb_ref[...]), bl),
                      0.0)
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


def _masked(s, r, bl: int, code):
  """The logits, float32's lowest where the ids or the codes mask the pair (0 in a flat
  query's row)."""
  if code is None:
    return jnp.where(_allowed(r['qid'], r['kvid'], bl), s, MASK_VALUE)
  flat = _to_lanes(_column_stat(r['flat'][...]), bl) > 0
  return jnp.where(code == MASKED, MASK_VALUE, jnp.where(flat, 0.0, s))


def _code(r):
  """The [bl, bl] int32 codes of the step's block, from its [bl / 4, bl] bytes."""
  if r['code'] is None:
    return None
  x = r['code'][...].astype(jnp.int32)  # Sign-extended: the low 8 bits are the byte's.
  mask = (1 << CODE_BITS) - 1
  return jnp.concatenate([(x >> (CODE_BITS * m)) & mask for m in range(4)], axis=0)


def _split(refs, flags):
  """Names the kernel's refs from the flat list in the order of :func:`_in_specs`."""
  refs = list(refs)
  out = {}
  for name, present in flags:
    out[name] = refs.pop(0) if present else None
  return out, refs


def _forward_kernel(*refs, bl, padded, inv_scale, c2p, p2c, packed, codes, cb, rb):
  pl, _ = _pallas()
  r, rest = _split(refs, (('q', 1), ('k', 1), ('v', 1), ('kr', c2p), ('qr', p2c),
                          ('qid', packed), ('kvid', not codes), ('code', codes), ('flat', codes),
                          ('cb', cb),
                          ('rb', rb), ('o', 1), ('lse', 1), ('m', 1), ('l', 1), ('acc', 1)))
  assert not rest
  i, j = pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    r['m'][...] = jnp.full(r['m'].shape, -jnp.inf, jnp.float32)
    r['l'][...] = jnp.zeros(r['l'].shape, jnp.float32)
    r['acc'][...] = jnp.zeros(r['acc'].shape, jnp.float32)

  q, k, v = r['q'][...], r['k'][...], r['v'][...]
  code = _code(r)
  s = _scores(q, k, r['kr'], r['qr'], i, j, bl=bl, padded=padded, inv_scale=inv_scale,
              cb_ref=r['cb'], rb_ref=r['rb'], code=code)
  s = _masked(s, r, bl, code)
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


def _backward_kernel(*refs, bl, padded, inv_scale, c2p, p2c, packed, codes, cb, rb):
  pl, _ = _pallas()
  r, rest = _split(refs, (('q', 1), ('k', 1), ('v', 1), ('do', 1), ('lse', 1), ('di', 1),
                          ('kr', c2p), ('kr_rev', c2p), ('qr', p2c), ('qr_rev', p2c),
                          ('qid', packed), ('kvid', not codes), ('code', codes), ('flat', codes),
                          ('cb', cb),
                          ('rb', rb), ('dq_out', 1), ('dk_out', 1), ('dv_out', 1),
                          ('dkr_rev', c2p), ('dqr_rev', p2c), ('dcb_out', cb), ('drb_out', rb),
                          ('dq', 1), ('dk', 1), ('dv', 1), ('dcb', cb), ('drb', rb)))
  assert not rest
  b, j, i = pl.program_id(1), pl.program_id(2), pl.program_id(3)
  last_i, last_j = pl.num_programs(3) - 1, pl.num_programs(2) - 1
  tables = [t for t in (r['dkr_rev'], r['dqr_rev']) if t is not None]

  @pl.when((b == 0) & (j == 0) & (i == 0))
  def _init_tables():
    for t in tables:
      t[...] = jnp.zeros(t.shape, t.dtype)

  per_row = [x for x in (r['dq'], r['drb']) if x is not None]
  per_key = [x for x in (r['dk'], r['dv'], r['dcb']) if x is not None]

  @pl.when((j == 0) & (i == 0))
  def _init_dq():
    for x in per_row:
      x[...] = jnp.zeros(x.shape, x.dtype)

  @pl.when(i == 0)
  def _init_dkv():
    for x in per_key:
      x[...] = jnp.zeros(x.shape, x.dtype)

  q, k, v, do = r['q'][...], r['k'][...], r['v'][...], r['do'][...]
  dt = q.dtype
  code = _code(r)
  s = _scores(q, k, r['kr'], r['qr'], i, j, bl=bl, padded=padded, inv_scale=inv_scale,
              cb_ref=r['cb'], rb_ref=r['rb'], code=code)
  s = _masked(s, r, bl, code)
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
  if cb:  # The gradient of a key's bias: its column of the logits' gradient.
    r['dcb'][...] += jnp.sum(dr32, axis=0, keepdims=True)
  if rb:  # Of a query's row bias: its row, where the codes add it.
    got = jnp.sum(jnp.where(code == READ_WITH_ROW_BIAS, dr32, 0.0), axis=1, keepdims=True)
    r['drb'][rows, :] += jnp.broadcast_to(got, (bl, LANES))

  @pl.when(i == last_i)
  def _write_dkv():  # In the operands' dtype, from the float32 accumulators.
    r['dk_out'][...] = r['dk'][...].astype(r['dk_out'].dtype)
    r['dv_out'][...] = r['dv'][...].astype(r['dv_out'].dtype)
    if cb:
      r['dcb_out'][...] = r['dcb'][...]

  @pl.when((j == last_j) & (i == last_i))
  def _write_dq():
    r['dq_out'][...] = r['dq'][...].astype(r['dq_out'].dtype)
    if rb:
      r['drb_out'][...] = _row_stat(r['drb'][...])


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
      'code': pl.BlockSpec((None, bl // 4, bl), qi(lambda h, b, i, j: (b, i, j))),
      'flat': pl.BlockSpec((None, SUBLANES, bl), qi(lambda h, b, i, j: (b, 0, i))),
      'cb': pl.BlockSpec((None, None, 1, bl), qi(lambda h, b, i, j: (b, h, 0, j))),
      'rb': stat(),
      'dq': pl.BlockSpec((None, None, padded, d), qi(lambda h, b, i, j: (b, h, 0, 0))),
      'drb': pl.BlockSpec((None, None, SUBLANES, padded), qi(lambda h, b, i, j: (b, h, 0, 0))),
  }
  spec['dcb'] = spec['cb']
  return [spec[n] for n in names]


def _cost(pl, *, b, h, padded, bl, d, isz, c2p, p2c, packed, codes, cb, rb, backward):
  """The blocks' bytes as the grid fetches them, and the matrix products' FLOPs."""
  n = padded // bl
  steps = b * h * n * n
  terms = int(c2p) + int(p2c)
  seq = padded * d * isz  # One row's q (or k, v, o, do) for one head.
  stats = padded * SUBLANES * 4  # One row's log-sum-exp (or dO . O) for one head.
  # The key ids ([1, bl] int32) and the query ids ([bl, LANES] int32, packed rows only):
  # forward, the keys' every step and the queries' once per (b, h, i); backward the other
  # way round. The codes: a [bl / 4, bl] int8 block every step (and the flat rows' [8, bl]
  # float32 with the queries'). The biases: a key's ([1, bl]
  # float32) with the keys, a query's ([SUBLANES, bl] float32) with the queries.
  kv_ids = 0 if codes else b * h * padded * 4
  q_ids = b * h * padded * LANES * 4 if packed else 0
  code_bytes = steps * bl * bl // 4 if codes else 0
  flat_bytes = b * h * stats if codes else 0
  key_bias, row_bias = b * h * padded * 4 * int(cb), stats * b * h * int(rb)
  block = 2 * bl * bl * d  # One [bl, bl] x d product.
  if not backward:
    # q, o, lse once per (b, h, i); k, v again for every i; tables once a head.
    read = (b * h * (seq + 2 * n * seq) + h * terms * 2 * padded * d * isz + n * kv_ids
            + q_ids + code_bytes + flat_bytes + n * key_bias + row_bias)
    write = b * h * (seq + stats)
    flops = steps * block * (2 + 2 * terms)
    return pl.CostEstimate(flops=int(flops), transcendentals=int(steps * bl * bl),
                           bytes_accessed=int(read + write))
  # q, do, lse, di (and the query ids) again for every j; k, v once per (b, h, j); both
  # orders of the tables once a head; dq, dk, dv written once per row, the table
  # gradients once a head (float32), the biases' once per row.
  read = (b * h * (n * (2 * seq + 2 * stats) + 2 * seq) + h * terms * 2 * 2 * padded * d * isz
          + kv_ids + n * q_ids + code_bytes + n * flat_bytes + key_bias + n * row_bias)
  write = b * h * 3 * seq + h * terms * 2 * padded * d * 4 + key_bias + row_bias
  # Recomputed scores (1 + 2 per term), dP, dV, dQ, dK (4), and per term the flip (1), the
  # unskewed product against the table (2) and the table's gradient (2).
  flops = steps * block * (1 + 2 * terms + 4 + 5 * terms)
  return pl.CostEstimate(flops=int(flops), transcendentals=int(steps * bl * bl),
                         bytes_accessed=int(read + write))


def _present(**operands):
  """(names, arrays) of the operands given (not None), in order."""
  names = [n for n, x in operands.items() if x is not None]
  return names, [operands[n] for n in names]


def _flags(kr, qr, q_ids, codes, cb, rb):
  return dict(c2p=kr is not None, p2c=qr is not None, packed=q_ids is not None,
              codes=codes is not None, cb=cb is not None, rb=rb is not None)


def _forward_call(q, k, v, kr, qr, q_ids, kv_ids, codes, cb, rb, *, bl, inv_scale, interpret):
  pl, pltpu = _pallas()
  b, h, padded, d = q.shape
  n = padded // bl
  flags = _flags(kr, qr, q_ids, codes, cb, rb)
  names, args = _present(q=q, k=k, v=v, kr=kr, qr=qr, qid=q_ids, kvid=kv_ids,
                         code=None if codes is None else codes.bits,
                         flat=None if codes is None else codes.flat, cb=cb, rb=rb)
  kernel = functools.partial(_forward_kernel, bl=bl, padded=padded, inv_scale=inv_scale,
                             **flags)
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
                          backward=False, **flags),
      interpret=interpret, name='disentangled_attention_fwd',
  )(*args)


def _backward_call(q, k, v, do, lse, di, kr, qr, q_ids, kv_ids, codes, cb, rb, *, bl,
                   inv_scale, interpret):
  pl, pltpu = _pallas()
  b, h, padded, d = q.shape
  n = padded // bl
  flags = _flags(kr, qr, q_ids, codes, cb, rb)
  c2p, p2c = flags['c2p'], flags['p2c']
  kr_rev = reverse_table(kr) if c2p else None
  qr_rev = reverse_table(qr) if p2c else None
  names, args = _present(q=q, k=k, v=v, do=do, lse=lse, di=di, kr=kr, kr_rev=kr_rev, qr=qr,
                         qr_rev=qr_rev, qid=q_ids, kvid=kv_ids,
                         code=None if codes is None else codes.bits,
                         flat=None if codes is None else codes.flat, cb=cb, rb=rb)
  out_names = (['dq', 'dk', 'dv'] + ['dkr_rev'] * c2p + ['dqr_rev'] * p2c
               + ['dcb'] * flags['cb'] + ['drb'] * flags['rb'])
  table = jax.ShapeDtypeStruct((h, 2 * padded, d), jnp.float32)
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)] * 3 + [table] * (c2p + p2c)
  out_shape += [jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (cb, rb) if x is not None]
  scratch = [pltpu.VMEM((padded, d), jnp.float32), pltpu.VMEM((bl, d), jnp.float32),
             pltpu.VMEM((bl, d), jnp.float32)]
  scratch += [pltpu.VMEM((1, bl), jnp.float32)] * flags['cb']
  scratch += [pltpu.VMEM((padded, LANES), jnp.float32)] * flags['rb']
  kernel = functools.partial(_backward_kernel, bl=bl, padded=padded, inv_scale=inv_scale,
                             **flags)
  outs = pl.pallas_call(
      kernel, grid=(h, b, n, n),
      in_specs=_specs(pl, names, bl, padded, d, 'bwd'),
      out_specs=_specs(pl, out_names, bl, padded, d, 'bwd'),
      out_shape=out_shape,
      scratch_shapes=scratch,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'arbitrary', 'arbitrary', 'arbitrary')),
      cost_estimate=_cost(pl, b=b, h=h, padded=padded, bl=bl, d=d, isz=q.dtype.itemsize,
                          backward=True, **flags),
      interpret=interpret, name='disentangled_attention_bwd',
  )(*args)
  dq, dk, dv, *rest = outs
  dkr = reverse_table(rest.pop(0)) if c2p else None
  dqr = reverse_table(rest.pop(0)) if p2c else None
  dcb = rest.pop(0) if flags['cb'] else None
  drb = rest.pop(0) if flags['rb'] else None
  return dq, dk, dv, dkr, dqr, dcb, drb


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


def _check_operands(padded: int, block: int, kv_ids_BxP, codes, row_bias_BxHxP) -> None:
  if padded % block or block % 8:
    raise ValueError(f'disentangled kernel: length {padded} is not a multiple of the block '
                     f'{block} (itself a multiple of 8)')
  if (codes is None) == (kv_ids_BxP is None):
    raise ValueError('disentangled kernel: pass the key ids or the codes, one of them')
  if row_bias_BxHxP is not None and codes is None:
    raise ValueError('disentangled kernel: a row bias is added where the codes say')
  if codes is not None and codes.bits.shape[1] * 4 != padded:
    raise ValueError(f'disentangled kernel: codes of {codes.bits.shape[1] * 4} rows for a '
                     f'length of {padded}')


def attend(q_BxHxPxD, k_BxHxPxD, v_BxHxPxD, kr_HxTxD, qr_HxTxD, q_ids_BxP, kv_ids_BxP, *,
           block: int, scale: float, interpret: bool, mesh_specs: Any = None,
           codes: Codes | None = None, key_bias_BxHxP=None, row_bias_BxHxP=None):
  """softmax((q k^T + c2p + p2c [+ biases]) / scale) v [B, H, P, D] (see the module doc).

  ``kr_HxTxD`` / ``qr_HxTxD``: the ascending c2p and descending p2c tables [H, 2P, D], or
  None for a term the model does not have. ``kv_ids_BxP``: key padding (1 real, 0 padding,
  -1 block padding) when ``q_ids_BxP`` is None, else the keys' documents (and
  ``q_ids_BxP`` the queries'). Or, in their place (both None), ``codes``
  (:func:`pack_codes`, for this ``block``): a code a (query, key) pair, READ,
  READ_WITH_ROW_BIAS (the query's ``row_bias_BxHxP`` added to that logit: XLNet's segment
  term) or MASKED, and the flat queries (logits 0, gradients to the scores). A query whose
  keys are all masked reads all P alike.
  ``key_bias_BxHxP``: a bias a key, on
  every query's logit (float32; XLNet's content bias ``r_w_bias . k_j``, its queries
  carrying ``r_r_bias``). The biases come before the scale, and have gradients.
  ``mesh_specs``: (mesh, batch axes, head axis) to run the kernels in a ``shard_map`` (a
  Mosaic call is a custom call XLA cannot partition); the table gradients are summed over
  the batch axes there.
  """
  b, h, padded, d = q_BxHxPxD.shape
  _check_operands(padded, block, kv_ids_BxP, codes, row_bias_BxHxP)
  kw = dict(bl=block, inv_scale=1.0 / scale, interpret=interpret)
  q_ids = None if q_ids_BxP is None else jnp.broadcast_to(
      q_ids_BxP.astype(jnp.int32)[:, :, None], (b, padded, LANES))
  kv_ids = None if kv_ids_BxP is None else kv_ids_BxP.astype(jnp.int32)[:, None, :]

  def sharded(f, args, in_kinds, out_kinds):
    return _sharded(f, args, in_kinds, out_kinds, mesh_specs)

  def kinds(*pairs):
    return [kind if x is not None else None for x, kind in pairs]

  def blocked(cb, rb):  # The biases as the kernel reads them: [B, H, 1, P], [B, H, 8, P].
    cb = None if cb is None else cb.astype(jnp.float32)[:, :, None, :]
    rb = None if rb is None else jnp.broadcast_to(
        rb.astype(jnp.float32)[:, :, None, :], (b, h, SUBLANES, padded))
    return cb, rb

  in_kinds = ('seq', 'seq', 'seq', 'table', 'table', 'ids', 'ids', 'ids', 'seq', 'seq')

  def forward(q, k, v, kr, qr, q_ids, kv_ids, codes, cb, rb):
    args = (q, k, v, kr, qr, q_ids, kv_ids, codes, *blocked(cb, rb))
    return sharded(lambda *a: _forward_call(*a, **kw), args, in_kinds, ('seq', 'seq'))

  # The ids are arguments, not closed over: a custom_vjp must not capture traced values (the
  # layer scan's).
  @jax.custom_vjp
  def run(q, k, v, kr, qr, q_ids, kv_ids, codes, cb, rb):
    return forward(q, k, v, kr, qr, q_ids, kv_ids, codes, cb, rb)[0]

  def run_fwd(q, k, v, kr, qr, q_ids, kv_ids, codes, cb, rb):
    o, lse = forward(q, k, v, kr, qr, q_ids, kv_ids, codes, cb, rb)
    return o, (q, k, v, kr, qr, q_ids, kv_ids, codes, cb, rb, o, lse)

  def run_bwd(res, do):
    q, k, v, kr, qr, q_ids, kv_ids, codes, cb, rb, o, lse = res
    di = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    di = jnp.broadcast_to(di[:, :, None, :], lse.shape)  # [B, H, SUBLANES, P]
    args = (q, k, v, do, lse, di, kr, qr, q_ids, kv_ids, codes, *blocked(cb, rb))
    bwd_kinds = ('seq',) * 6 + in_kinds[3:]
    out_kinds = kinds((q, 'seq'), (k, 'seq'), (v, 'seq'), (kr, 'table'), (qr, 'table'),
                      (cb, 'seq'), (rb, 'seq'))
    dq, dk, dv, dkr, dqr, dcb, drb = sharded(lambda *a: _backward_call(*a, **kw), args,
                                             bwd_kinds, out_kinds)
    cast = lambda g, x: None if g is None else g.astype(x.dtype)
    dcb = None if dcb is None else dcb[:, :, 0]
    drb = None if drb is None else drb[:, :, 0]
    return (cast(dq, q), cast(dk, k), cast(dv, v), cast(dkr, kr), cast(dqr, qr), None, None,
            None, cast(dcb, cb), cast(drb, rb))

  run.defvjp(run_fwd, run_bwd)
  return run(q_BxHxPxD, k_BxHxPxD, v_BxHxPxD, kr_HxTxD, qr_HxTxD, q_ids, kv_ids, codes,
             key_bias_BxHxP, row_bias_BxHxP)
