"""DeBERTa's disentangled self-attention (He et al. 2020, section 3.1; v2/v3 options).

Each token is a content vector H and each relative distance delta(i, j) a position
vector P (a learned table of 2k rows, ``rel_embeddings``). The attention score is

  A_ij = Q^c_i . K^c_j  +  Q^c_i . K^r_delta(i,j)  +  K^c_j . Q^r_delta(i,j)
         (content->content)  (content->position, c2p)  (position->content, p2c)

scaled by 1/sqrt(d * (1 + number of position terms)) (1/sqrt(3d) with both), where
``K^r = P W_k,r`` and ``Q^r = P W_q,r`` project the relative embeddings and
``delta(i, j) = clip(i - j + k, 0, 2k - 1)``: distances are clipped at k
(``max_relative_positions``, default ``max_position_embeddings``). The v2 options:
``position_buckets`` maps i - j to log-spaced buckets beyond +-b/2 (then the table has
2b rows), ``share_att_key`` projects the relative embeddings with the content query/key
projections, ``norm_rel_ebd`` LayerNorms the table (done once per pass by the encoder).

Memory and layout: the relative terms are never an [L, L, d] tensor, and no gather with an
index per element reads the scores. The row of (i, j) depends only on i - j, so ``Q^c``
is multiplied with the projected table at the 2S distances ``S, ..., -(S - 1)`` (S keys;
their rows taken from the projected table by a static distance -> row map: a gather over
[R, heads, d] parameters, not over scores), giving [B, heads, L, 2S], and row i moves
left by S - i (``layers.rel_shift``, Transformer-XL's shift: reshapes and slices); p2c
likewise from ``K^c (Q^r)^T`` [B, heads, S, 2S] (distances -S .. S - 1), key j's row
moved by S - j, transposed. Both products come out in the activation dtype (bfloat16
in pretraining, as the c2c logits' inputs are; float32 in float32), so the shifts copy
half the bytes. The element-wise gather this replaced (``take_along_axis`` over
[B, heads, L, S] with an index per (i, j)) is what the TPU compiler cannot stream
(``docs/results/relative_attention_tpu.md``). When the queries are some rows of the
keys (the enhanced mask decoder, the last layer at the rows a loss reads:
``context['query_positions']`` [B, Q]), c2p moves each row by its position's amount
(``layers.shift_rows``) and p2c takes those rows of the full [S, S] result.
``tests/models/test_deberta.py`` checks both against the direct O(L^2 d) sum and against
the element-wise gathers (values and gradients); ``benchmarks/bench_attention.py`` prints
the compiled memory at length 512.

On a TPU (``config.model.attention_implementation`` None or 'splash', as BERT's splash
attention) the self-attention runs a Pallas kernel instead (``models/disentangled_kernel``):
the three score terms a [block, block] tile at a time, the position products skewed in
VMEM, an online softmax, never an [L, L] array in HBM, forward and backward. It takes the
projected tables expanded to the 2P distances of the padded length (``kernel_rows``: the
same static distance -> row map, so v1's clipping and v2's log buckets stay out of it) and
the key padding mask, or packed rows' ``context['document_ids']``, as ids. Queries at some
rows (the enhanced mask decoder, the last layer at the rows a loss reads) run at their
positions among all S (``queries_at_positions``: zeros at the others) and their rows of
the output are read back: S / Q times the attention's FLOPs, where the XLA path's
position-to-content term moves a [B, heads, S, 2S] product through the shift for any Q
(most of the bytes of those layers). The XLA path
above stays the reference and serves CPU and GPU, 'xla', a mask with a row per query,
attention dropout in training (the kernel has none; one log line), position tables too
large for VMEM (``KERNEL_TABLE_BYTES``; one log line) and a trace on several TPU devices
without the mesh in context. ``tests/models/test_disentangled_kernel.py`` checks the kernel (Pallas
interpret mode) against the XLA path, values and gradients.

Parameter layouts follow the two Hugging Face models so their tables are one-to-one:
kind ``deberta`` (v1, ``DebertaForMaskedLM``): a fused ``in_proj`` [embed, heads, 3, d]
without bias plus ``q_bias``/``v_bias`` (no key bias), ``pos_key`` without bias,
``pos_query`` with bias; kind ``deberta_v2`` (``DebertaV2ForMaskedLM``): ``query``/
``key``/``value`` and ``pos_key``/``pos_query`` all with biases. Both end in
``attention_output``. Reference code: microsoft/DeBERTa ``DeBERTa/deberta/
disentangled_attention.py`` and Hugging Face ``modeling_deberta.py`` /
``modeling_deberta_v2.py`` (whose numbers ``tests/interop/test_hf_parity_deberta.py`` matches).

``context`` (built once per pass by ``models.deberta.Encoder``): ``rel_embeddings`` [R, E]
(the reachable rows, normalised if ``norm_rel_ebd``); for the enhanced mask decoder and the
last layer at the rows a loss reads (``trunk.Encoder``), ``kv_states`` [B, S, E] (keys and
values come from there, queries from the input) and ``query_positions`` [B, Q] (the
queries' positions among the keys).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax.models import attention
from encoder_jax.models import layers
from encoder_jax.models import packing

V1_KINDS = ('deberta',)  # Kinds with DeBERTa v1's parameter layout (fused in_proj).
POSITION_TERMS, position_terms = layers.POSITION_TERMS, layers.position_terms


def relative_span(c) -> int:
  """Half the rows of the relative table: the buckets b (v2) or the span k."""
  if c.position_buckets > 0:
    return c.position_buckets
  return c.max_relative_positions if c.max_relative_positions >= 1 else c.max_position_embeddings


def max_relative_distance(c) -> int:
  """The k of the bucketing (``max_relative_positions``, default max_position_embeddings)."""
  return c.max_relative_positions if c.max_relative_positions >= 1 else c.max_position_embeddings


def log_bucket_position(rel: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
  """DeBERTa v2's log buckets: exact within +-bucket_size/2, log-spaced out to max_position.

  Computed in float32 like Hugging Face's ``make_log_bucket_position`` (torch's default
  dtype), so the bucket of every distance agrees with it (a test compares them).
  """
  rel = np.asarray(rel, np.int64)
  sign = np.sign(rel)
  mid = bucket_size // 2
  abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
  ratio = (abs_pos.astype(np.float32) / np.float32(mid)).astype(np.float32)
  log_pos = (np.ceil(np.log(ratio) / np.log(np.float32((max_position - 1) / mid))
                     * np.float32(mid - 1)).astype(np.float32) + np.float32(mid))
  return np.where(abs_pos <= mid, rel, (log_pos * sign).astype(np.int64))


def relative_positions(c, q_len: int, k_len: int) -> np.ndarray:
  """[q_len, k_len] int: i - j, or its log bucket (v2), as Hugging Face builds them."""
  rel = np.arange(q_len)[:, None] - np.arange(k_len)[None, :]
  if c.position_buckets > 0:
    rel = log_bucket_position(rel, c.position_buckets, max_relative_distance(c))
  return rel.astype(np.int64)


def table_rows(c, rel: np.ndarray) -> np.ndarray:
  """Row of the 2 * span table of each relative position (``i - j``, int array)."""
  if c.position_buckets > 0:
    rel = log_bucket_position(rel, c.position_buckets, max_relative_distance(c))
  span = relative_span(c)
  return np.clip(np.asarray(rel, np.int64) + span, 0, 2 * span - 1)


def relative_layout(c, length: int) -> tuple[np.ndarray, int, int]:
  """(index [L, L] int32 into rows [lo, hi) of the table, lo, hi) at sequence length L.

  The table row of (i, j) is ``clip(delta(i, j) + span, 0, 2 span - 1)``; only rows
  ``lo..hi-1`` are reachable at this length (e.g. 2L - 1 of v1's 2k when L <= k), so
  only those are projected. Static: computed with numpy when the model is traced.
  """
  rows = table_rows(c, np.arange(length)[:, None] - np.arange(length)[None, :])
  lo, hi = int(rows.min()), int(rows.max()) + 1
  return (rows - lo).astype(np.int32), lo, hi


def distance_rows(c, keys: int) -> tuple[np.ndarray, np.ndarray]:
  """int32 [2S] each: the reachable table's row (``relative_layout``'s) of the distances
  ``S - u`` (c2p's columns u) and ``u - S`` (p2c's), for S keys; u = 0 is never read
  (the windows read columns 1 .. 2S - 1)."""
  _, lo, hi = relative_layout(c, keys)
  u = np.arange(2 * keys)
  rows = lambda rel: np.clip(table_rows(c, rel) - lo, 0, hi - lo - 1).astype(np.int32)
  return rows(keys - u), rows(u - keys)


def kernel_rows(c, keys: int, padded: int) -> tuple[np.ndarray, np.ndarray]:
  """int32 [2P] each, the tables of the Pallas kernel (``disentangled_kernel``) for S keys
  padded to P: the reachable table's row (``relative_layout``'s) of the distance
  ``P - 1 - t`` (ascending in j - i: c2p's ``K^r``) and of ``t - P + 1`` (descending: p2c's
  ``Q^r``), t = 0 .. 2P - 1. Distances past the S keys meet only padding (masked); they
  take the clipped rows."""
  _, lo, hi = relative_layout(c, keys)
  t = np.arange(2 * padded)
  rows = lambda rel: np.clip(table_rows(c, rel) - lo, 0, hi - lo - 1).astype(np.int32)
  return rows(padded - 1 - t), rows(t - padded + 1)


def kernel_block(length: int) -> tuple[int, int]:
  """(padded length, block) of the kernel: splash's on a TPU (a multiple of 128, blocks of
  512, 256 or 128); off a TPU (Pallas interpret mode: tests) a multiple of 8, blocks of
  32, 16 or 8 and at least two of them past 8 tokens, so a few tokens make several."""
  if attention._backend() == 'tpu':  # pylint: disable=protected-access
    return attention.splash_block(length)
  padded = -(-length // 8) * 8
  return padded, next(b for b in (32, 16, 8) if padded % b == 0 and (b < padded or b == 8))


# VMEM the kernel's whole position tables may take (``disentangled_kernel.vmem_table_bytes``);
# longer sequences run the XLA path: 4 MiB holds both tables at 1,024 tokens in bfloat16 with
# 64-wide heads (a sixth of a v5e core's default scoped VMEM for the backward kernel).
KERNEL_TABLE_BYTES = 4 << 20


def kernel_requested(c) -> bool:
  """Whether ``config.model.attention_implementation`` resolves to splash (None or 'splash'
  on a TPU; 'splash' in Pallas interpret mode elsewhere): the relative-attention kernel's
  cue, DeBERTa's and XLNet's."""
  requested = c.attention_implementation
  return (requested in (None, 'splash')
          and attention.resolve_implementation(requested, c.jnp_dtype) == 'splash')


def kernel_can_run(c, what: str, length: int, tables: int, deterministic: bool) -> bool:
  """Whether a call the kernel was asked for can run it: no attention dropout in training,
  its ``tables`` position tables at ``length`` tokens fit VMEM (``KERNEL_TABLE_BYTES``), and
  it can be placed (``attention.splash_placeable``). One log line per reason it cannot,
  naming ``what``."""
  from encoder_jax.models import disentangled_kernel  # pylint: disable=g-import-not-at-top
  what = f'{what} (config.model.attention_implementation={c.attention_implementation!r})'
  if not deterministic and c.attention_dropout_rate > 0:
    attention.warn_fallback(
        f'{what} has no attention dropout, and config.model.attention_dropout_rate='
        f'{c.attention_dropout_rate} asks for it in training (set it to 0 to run the kernel)')
    return False
  padded, _ = kernel_block(length)
  need = disentangled_kernel.vmem_table_bytes(padded, c.head_dim,
                                              jnp.dtype(c.jnp_dtype).itemsize, tables)
  if need > KERNEL_TABLE_BYTES:
    attention.warn_fallback(f'{what}: the position tables at {length} tokens take '
                            f'{need / 2 ** 20:.1f} MiB of VMEM (over {KERNEL_TABLE_BYTES >> 20})')
    return False
  return attention.splash_placeable()


def c2p_scores(c2p_BxHxQxU, positions_BxQ=None):
  """[B, H, Q, 2S] content-to-position scores over the distances S .. -(S - 1) ->
  [B, H, Q, S]: entry (i, j) reads column S - i + j (distance i - j), i the query's
  position (``positions_BxQ``; by default 0 .. S - 1 with Q = S)."""
  keys = c2p_BxHxQxU.shape[-1] // 2
  if positions_BxQ is None:
    return layers.rel_shift(c2p_BxHxQxU, keys)
  shift_Bx1xQ = (keys - positions_BxQ.astype(jnp.int32))[:, None, :]
  return layers.shift_rows(c2p_BxHxQxU, shift_Bx1xQ, keys, keys)


def p2c_scores(p2c_BxHxSxU, positions_BxQ=None):
  """[B, H, S, 2S] position-to-content scores (key j against the distances -S .. S - 1) ->
  [B, H, Q, S]: entry (i, j) reads key j's column S + i - j (distance i - j): the shift of
  each key's row, transposed; queries at ``positions_BxQ`` take those rows of it."""
  keys = p2c_BxHxSxU.shape[-2]
  p2c_BxHxSxS = jnp.swapaxes(layers.rel_shift(p2c_BxHxSxU, keys), -1, -2)
  if positions_BxQ is None:
    return p2c_BxHxSxS
  return jnp.take_along_axis(p2c_BxHxSxS, positions_BxQ[:, None, :, None], axis=2)


def queries_at_positions(q_BxQxHxD, positions_BxQ, keys: int):
  """[B, S, H, D]: each query slot's vector at its position among the S keys, zeros at the
  other positions (the kernel's queries are consecutive rows). Where slots share a position,
  the first slot's vector is placed and the later ones read its output: exact where they
  hold the same vector (the rows of one state: [CLS] and the padding slots that point at
  it, the enhanced mask decoder's first layer; the masked positions are distinct)."""
  b = q_BxQxHxD.shape[0]
  pos_BxQ = positions_BxQ.astype(jnp.int32)
  same_BxQxQ = pos_BxQ[:, :, None] == pos_BxQ[:, None, :]
  earlier_BxQ = jnp.any(jnp.tril(same_BxQxQ, k=-1), axis=-1)  # An earlier slot is there.
  target_BxQ = jnp.where(earlier_BxQ, keys, pos_BxQ)  # Out of range: dropped.
  zeros = jnp.zeros((b, keys) + q_BxQxHxD.shape[2:], q_BxQxHxD.dtype)
  return zeros.at[jnp.arange(b)[:, None], target_BxQ].set(q_BxQxHxD, mode='drop')


class FusedQKV(nn.Module):
  """DeBERTa v1's ``in_proj``: one bias-free kernel [embed, heads, 3, d] (q, k, v per head,
  HF's row order); queries and keys/values may come from different states (EMD)."""
  config: Any

  @nn.compact
  def __call__(self, q_BxLxE, kv_BxSxE):
    c, dt = self.config, self.config.jnp_dtype
    e, h, d = c.hidden_size, c.num_heads, c.head_dim
    kernel_ExHx3xD = layers.param(self, 'kernel', layers.truncated_normal(c.initializer_range),
                                  (e, h, 3, d), ('embed', 'heads', None, 'kv')).astype(dt)
    proj = lambda x, i: layers.project(x.astype(dt), kernel_ExHx3xD[:, :, i], 1)
    return proj(q_BxLxE, 0), proj(kv_BxSxE, 1), proj(kv_BxSxE, 2)


class DisentangledAttention(nn.Module):
  """c2c + c2p + p2c multi-head attention over relative positions (see the module doc)."""
  config: Any  # models.config.EncoderConfig
  deterministic: bool

  def _use_kernel(self, q_len: int, s_len: int, mask_Bx1x1xS, context) -> bool:
    """Whether this call runs the Pallas kernel (see the module doc): the implementation
    resolves to splash, the mask is key padding or packed rows' documents, no attention
    dropout in training, the tables fit VMEM, and the kernel can be placed
    (``attention.splash_placeable``). One log line per reason it cannot."""
    c = self.config
    if not kernel_requested(c):
      return False
    if ((context.get('query_positions') is None and q_len != s_len)
        or (context.get('document_ids') is None and mask_Bx1x1xS.shape[-2] != 1)):
      return False  # A mask with a row per query.
    return kernel_can_run(c, "DeBERTa's disentangled attention kernel", s_len,
                          len(position_terms(c)), self.deterministic)

  def _kernel(self, q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, kr_RxHxD, qr_RxHxD, mask_Bx1x1xS,
              documents_BxS, scale: float, positions_BxQ=None):
    """The Pallas kernel's attention [B, L, H, D] (``disentangled_kernel.attend``); queries
    at ``positions_BxQ`` run at their positions among the keys (:func:`queries_at_positions`)
    and their rows of the output are read back."""
    from encoder_jax.models import disentangled_kernel  # pylint: disable=g-import-not-at-top
    if positions_BxQ is not None:
      q_BxLxHxD = queries_at_positions(q_BxLxHxD, positions_BxQ, k_BxSxHxD.shape[1])
    b, length, h, _ = q_BxLxHxD.shape
    padded, block = kernel_block(length)
    pad = padded - length
    asc_T, desc_T = kernel_rows(self.config, length, padded)
    heads_first = lambda x_BxLxHxD: jnp.pad(
        x_BxLxHxD, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
    table = lambda t_RxHxD, rows_T: None if t_RxHxD is None else jnp.take(
        t_RxHxD, rows_T, axis=0).transpose(1, 0, 2)
    if documents_BxS is not None:
      q_ids_BxP = jnp.pad(documents_BxS, ((0, 0), (0, pad)), constant_values=-2)
      kv_ids_BxP = jnp.pad(documents_BxS, ((0, 0), (0, pad)), constant_values=-1)
    else:
      q_ids_BxP = None
      real_BxS = jnp.broadcast_to(mask_Bx1x1xS[:, 0, 0, :] != 0, (b, length)).astype(jnp.int32)
      kv_ids_BxP = jnp.pad(real_BxS, ((0, 0), (0, pad)), constant_values=-1)
    a_BxHxPxD = disentangled_kernel.attend(
        heads_first(q_BxLxHxD), heads_first(k_BxSxHxD), heads_first(v_BxSxHxD),
        table(kr_RxHxD, asc_T), table(qr_RxHxD, desc_T), q_ids_BxP, kv_ids_BxP, block=block,
        scale=scale, interpret=attention._backend() != 'tpu',  # pylint: disable=protected-access
        mesh_specs=attention._splash_mesh_specs(b, h))  # pylint: disable=protected-access
    a_BxLxHxD = a_BxHxPxD.transpose(0, 2, 1, 3)[:, :length]
    if positions_BxQ is None:
      return a_BxLxHxD
    return jnp.take_along_axis(a_BxLxHxD, positions_BxQ[:, :, None, None].astype(jnp.int32),
                               axis=1)

  @nn.compact
  def __call__(self, x_BxLxE, mask_Bx1x1xS, context: dict[str, Any]):
    c, dt = self.config, self.config.jnp_dtype
    h, d, e = c.num_heads, c.head_dim, c.hidden_size
    v1 = c.kind in V1_KINDS
    kv_BxSxE = context.get('kv_states', x_BxLxE)
    positions_BxQ = context.get('query_positions')
    documents_BxS = context.get('document_ids')  # Packed rows: the keys' documents.
    use_kernel = self._use_kernel(x_BxLxE.shape[1], kv_BxSxE.shape[1], mask_Bx1x1xS, context)

    def dense(name, bias=True):
      return layers.Dense((e,), (h, d), ('embed',), ('heads', 'kv'), c.initializer_range, dt,
                          use_bias=bias, name=name)

    if v1:
      q_BxLxHxD, k_BxSxHxD, v_BxSxHxD = FusedQKV(c, name='in_proj')(x_BxLxE, kv_BxSxE)
      zeros, axes = nn.initializers.zeros, ('heads', 'kv')
      q_BxLxHxD = q_BxLxHxD + layers.param(self, 'q_bias', zeros, (h, d), axes).astype(dt)
      v_BxSxHxD = v_BxSxHxD + layers.param(self, 'v_bias', zeros, (h, d), axes).astype(dt)
      query = key = None
    else:
      query, key = dense('query'), dense('key')
      q_BxLxHxD, k_BxSxHxD, v_BxSxHxD = query(x_BxLxE), key(kv_BxSxE), dense('value')(kv_BxSxE)

    terms = position_terms(c)
    scale = float(np.sqrt(d * (1 + len(terms))))
    s_len = k_BxSxHxD.shape[1]
    if positions_BxQ is None and q_BxLxHxD.shape[1] != s_len:
      raise ValueError(f'DeBERTa attention: {q_BxLxHxD.shape[1]} queries over {s_len} keys '
                       "need context['query_positions'] (the queries' key positions)")
    kr_RxHxD = qr_RxHxD = None
    if terms:
      rel_RxE = layers.Dropout(c.hidden_dropout_rate, name='rel_dropout')(
          context['rel_embeddings'], deterministic=self.deterministic)
      if 'c2p' in terms:
        pos_key = key if c.share_att_key else dense('pos_key', bias=not v1)
        kr_RxHxD = pos_key(rel_RxE)
      if 'p2c' in terms:
        pos_query = query if c.share_att_key else dense('pos_query')
        qr_RxHxD = pos_query(rel_RxE)
    if use_kernel:
      a_BxLxHxD = self._kernel(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, kr_RxHxD, qr_RxHxD,
                               mask_Bx1x1xS, documents_BxS, scale, positions_BxQ)
    else:
      if documents_BxS is not None:
        mask_Bx1x1xS = packing.same_document(packing.at_rows(documents_BxS, positions_BxQ),
                                             documents_BxS)  # [B, 1, L, S]
      a_BxLxHxD = self._xla(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, kr_RxHxD, qr_RxHxD, mask_Bx1x1xS,
                            positions_BxQ, scale)
    return layers.Dense((h, d), (e,), ('heads', 'kv'), ('embed',), c.initializer_range, dt,
                        name='attention_output')(a_BxLxHxD)

  def _xla(self, q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, kr_RxHxD, qr_RxHxD, mask_Bx1x1xS,
           positions_BxQ, scale: float):
    """The XLA path [B, L, H, D]: the products at the 2S distances, shifted (module doc)."""
    c, dt = self.config, self.config.jnp_dtype
    s_len = k_BxSxHxD.shape[1]
    logits_BxHxLxS = jnp.einsum('blhd,bshd->bhls', q_BxLxHxD, k_BxSxHxD,
                                preferred_element_type=jnp.float32) / scale
    c2p_rows_U, p2c_rows_U = distance_rows(c, s_len)
    if kr_RxHxD is not None:
      kr_UxHxD = jnp.take(kr_RxHxD, c2p_rows_U, axis=0)
      c2p_BxHxLxU = jnp.einsum('blhd,uhd->bhlu', q_BxLxHxD, kr_UxHxD, preferred_element_type=dt)
      logits_BxHxLxS += c2p_scores(c2p_BxHxLxU, positions_BxQ) / scale
    if qr_RxHxD is not None:
      qr_UxHxD = jnp.take(qr_RxHxD, p2c_rows_U, axis=0)
      p2c_BxHxSxU = jnp.einsum('bshd,uhd->bhsu', k_BxSxHxD, qr_UxHxD, preferred_element_type=dt)
      logits_BxHxLxS += p2c_scores(p2c_BxHxSxU, positions_BxQ) / scale
    logits_BxHxLxS = jnp.where(mask_Bx1x1xS, logits_BxHxLxS, jnp.finfo(jnp.float32).min)
    probs_BxHxLxS = jax.nn.softmax(logits_BxHxLxS, axis=-1)
    probs_BxHxLxS = layers.Dropout(c.attention_dropout_rate, name='probs_dropout')(
        probs_BxHxLxS, deterministic=self.deterministic)
    return jnp.einsum('bhls,bshd->blhd', probs_BxHxLxS.astype(dt), v_BxSxHxD)
