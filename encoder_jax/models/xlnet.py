"""XLNet (Yang et al. 2019): two-stream self-attention over Transformer-XL relative positions.

Faithful to the original code (zihangdai/xlnet ``modeling.py``) and equal to Hugging Face's
``XLNetLMHeadModel`` with ``attn_type='bi'`` (``tests/interop/test_hf_parity_xlnet.py``):

* **Embeddings**: the word embedding only (no absolute positions, no segment table), dropout.
* **Relative positions** (Transformer-XL): sinusoids of the distances ``klen .. -qlen + 1``
  (``pos_seq``), projected per layer by ``r``; the score of query ``i`` and key ``j`` reads
  the row of distance ``(mlen + i) - j`` through the "relative shift" (a reshape, no
  gather); ``r_w_bias``/``r_r_bias`` are the content/position biases (untied per layer).
  ``clamp_len`` clips distances. With ``bi_data`` (bi-directional data, the original's and
  Hugging Face's) the second half of the batch reads the negated distances. The projection
  of the encodings runs once per batch (per direction), not per row as in the original, so
  the dropout on the encodings is drawn once per batch and shared by its rows.
* **Layout**: the scores run head-major ([heads, batch, query, key]). The position scores
  are one product per head and direction over all of that direction's rows (the batch's
  half), not a product per row against a per-row copy of the encodings, and their gradient
  is written out (:func:`position_scores`): in the original layout XLA:CPU ran them as
  small per-(row, head) products, and the shift's gradient was padded once per consumer.
* **Relative segments**: ``seg_embed`` [2, heads, head_dim] holds one vector for "same
  segment" and one for "different segment" (``r_s_bias`` its bias); memory counts as
  segment 0. XLNet's layout ``A [SEP] B [SEP] [CLS]`` gives [CLS] its own segment 2.
* **Two streams**: the content stream ``h`` (the token embedding; every position sees
  itself) and the query stream ``g`` (starts from ``mask_emb``; sees the content of the
  positions its permutation mask allows, never its own content). Both use the same layer
  weights; keys and values always come from the content stream (and the memory). The query
  stream runs only when a ``target_mapping`` [B, P, L] (one-hot rows, zero rows for
  padding) picks the P targets, and attends from those P rows only (their rows of the
  masks and segments, each its window of relative distances): what Hugging Face computes
  by spreading the queries to all L positions and gathering them back, at P / L of the
  attention cost.
* **Blocks**: post-LN as ``XLNetLayer``: attention -> output projection ``o`` -> dropout ->
  residual -> LayerNorm; feed-forward -> activation -> dropout -> dense -> dropout ->
  residual -> LayerNorm.
* **The last layer's content stream** is computed by Hugging Face and the original, and
  read by nothing in pretraining (the loss reads the query stream; the memory caches each
  layer's input). The permutation objective passes ``content_output=False``: layers
  1..N-1 run as a scan over the stacked parameters (sliced), and layer N on its own
  without its content stream, forward and backward; its keys and values, which the query
  stream reads, are still computed (apart, not under a ``lax.cond`` in every layer: the
  conditional costs more than it saves; ``benchmarks/bench_train.py --kind=xlnet``).
* **LM head** (``XLNetLMHeadModel.lm_loss``): tied to the word embedding, with a bias.
* **Memory** (``mem_len`` > 0): each layer's input content states are cached (the last
  ``mem_len`` of memory + current, ``stop_gradient``) and prepended to that layer's keys
  and values next time. Unlike Hugging Face, the memory carries a validity mask
  (``mem_mask``), so a zero memory with an all-zero mask means "no memory yet" at a fixed
  shape (the training state holds it from step 0) and padding cached from a short row is
  never attended to; with an all-ones mask it is Hugging Face's memory.

On a TPU (``config.model.attention_implementation`` None or 'splash') both streams' attention
runs the Pallas kernel of DeBERTa's attention (``models/disentangled_kernel``: a
[block, block] tile of scores at a time, never an [L, L] array in HBM), without memory and
without attention dropout in training (else XLA's, one log line): the content term as its
content term plus a bias a key, the position term as its content-to-position term against
the encodings of the 2P distances, the segment term as a bias a query where the segments
differ, the masks as a code a (query, key) pair (:func:`kernel_codes`); the query stream
at its targets' positions among the L. With ``bi_data`` the batch's second half, read at
negated distances, is the same network on its rows reversed: the encoder reverses them on
the way in and out and the kernel reads one table (the encodings' dropout is then one draw
for both halves). ``tests/models/test_xlnet.py`` checks it against the XLA path, values and
every gradient.

The attention is not an ``attention_kinds.REGISTRY`` kind: a registered kind maps one stream to
one stream (``(x, mask, context) -> x``), and two-stream attention needs the key/value and
position projections of the content stream shared by both streams in one call (computing
them per stream would add a third of the layer's projection FLOPs), so the layer owns it.

Fine-tuning, embeddings and ``encoder_jax.load(...).hidden_states`` use the content stream
alone (``encode``/``XLNetModel``); the query stream is a pretraining device.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoder_jax.models import attention
from encoder_jax.models import config as config_lib
from encoder_jax.models import disentangled_attention
from encoder_jax.models import layers

# Scores of masked keys: ``score - 1e30 * mask`` as the original and Hugging Face (a fully
# masked row then stays a uniform distribution, as there).
_MASK_PENALTY = 1e30


def relative_positions(qlen: int, klen: int, clamp_len: int = -1) -> jax.Array:
  """float32 [klen + qlen]: the distances ``klen, klen - 1, ..., -qlen + 1`` (``attn_type='bi'``).

  After the relative shift, query ``i`` and key ``j`` read entry ``qlen - i + j``, the
  distance ``klen - qlen + i - j`` = (query's absolute index) - (key's), memory included.
  """
  pos_R = jnp.arange(klen, -qlen, -1, dtype=jnp.float32)
  if clamp_len > 0:
    pos_R = jnp.clip(pos_R, -clamp_len, clamp_len)
  return pos_R


def sinusoid(pos_R: jax.Array, d_model: int) -> jax.Array:
  """Transformer-XL's encoding [..., d_model]: ``[sin(p * f), cos(p * f)]``, f = 1e4^(-2k/d)."""
  freq_D = jnp.arange(0, d_model, 2, dtype=jnp.float32)
  inv_freq_D = 1.0 / jnp.power(jnp.float32(10000.0), freq_D / d_model)
  x = pos_R[..., None] * inv_freq_D
  return jnp.concatenate([jnp.sin(x), jnp.cos(x)], axis=-1)


# Transformer-XL's shift (shared with DeBERTa's attention).
rel_shift = layers.rel_shift


def _unshift(d_AxLxK: jax.Array, r: int) -> jax.Array:
  """The adjoint of :func:`rel_shift`: [..., L, klen] -> [..., L, r], zeros where no key."""
  *lead, l, klen = d_AxLxK.shape
  keep = [(0, 0)] * len(lead)
  x_AxRxL = jnp.pad(d_AxLxK, keep + [(0, 0), (0, r - 1 - klen)]).reshape(*lead, r - 1, l)
  return jnp.pad(x_AxRxL, keep + [(1, 0), (0, 0)]).reshape(*lead, l, r)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def position_scores(q_NxXxBxLxD: jax.Array, kr_XxRxNxD: jax.Array, klen: int) -> jax.Array:
  """[N, X, B, L, klen] in q's dtype: ``rel_shift(q . kr)``, each query against its distances.

  ``q`` head-major, its rows grouped by direction (X = 1, or 2 with ``bi_data``: the
  batch's halves); ``kr`` the projected encodings of each direction. One product per head
  and direction over all its rows. The gradient is written out: the shift's adjoint is
  materialised once for both products, and the encodings' gradient contracts over the
  rows with the queries transposed (the small operand) rather than the [rows, R] scores.
  Both products read the float32 cotangent rounded to ``q``'s dtype (under bfloat16, as a
  bfloat16 ``Dense`` layer's backward and ``layers.tied_logits`` do; autodiff kept it in
  float32).
  """
  return rel_shift(jnp.einsum('nxbld,xrnd->nxblr', q_NxXxBxLxD, kr_XxRxNxD,
                              preferred_element_type=q_NxXxBxLxD.dtype), klen)


def _position_scores_fwd(q_NxXxBxLxD, kr_XxRxNxD, klen):
  return position_scores(q_NxXxBxLxD, kr_XxRxNxD, klen), (q_NxXxBxLxD, kr_XxRxNxD)


def _position_scores_bwd(klen, residuals, g_NxXxBxLxK):
  q_NxXxBxLxD, kr_XxRxNxD = residuals
  n, x, b, l, d = q_NxXxBxLxD.shape
  r = kr_XxRxNxD.shape[1]
  dt, f32 = q_NxXxBxLxD.dtype, jnp.float32
  # One [N, X, B * L, R] array (M = B * L rows) that both products read, not a pad per
  # consumer.
  g_NxXxMxR = jax.lax.optimization_barrier(
      _unshift(g_NxXxBxLxK, r).reshape(n, x, b * l, r).astype(dt))
  dq_NxXxMxD = jnp.einsum('nxmr,xrnd->nxmd', g_NxXxMxR, kr_XxRxNxD, preferred_element_type=f32)
  q_NxXxDxM = q_NxXxBxLxD.reshape(n, x, b * l, d).transpose(0, 1, 3, 2)
  dkr_NxXxDxR = jnp.einsum('nxdm,nxmr->nxdr', q_NxXxDxM, g_NxXxMxR, preferred_element_type=f32)
  return (dq_NxXxMxD.reshape(q_NxXxBxLxD.shape).astype(dt),
          dkr_NxXxDxR.transpose(1, 3, 0, 2).astype(kr_XxRxNxD.dtype))


position_scores.defvjp(_position_scores_fwd, _position_scores_bwd)


class Embeddings(nn.Module):
  """Word embeddings and dropout; XLNet has no absolute position or segment table."""
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, input_ids_BxL, deterministic: bool):
    c = self.config
    word = layers.Embed(c.vocab_size, c.hidden_size, ('vocab', 'embed'), c.initializer_range,
                        c.jnp_dtype, name='word_embeddings')
    x_BxLxE = layers.Dropout(c.hidden_dropout_rate)(word(input_ids_BxL),
                                                    deterministic=deterministic)
    return x_BxLxE, word


def _relative_attention(c, p, q_BxLxNxD, k_BxKxNxD, v_BxKxNxD, kr_XxRxNxD,
                        segment_differs_BxLxK, masked_BxLxK, rows_BxL=None, dropout_key=None):
  """Relative attention: content + position + segment scores, masked softmax, values.

  ``p``: the layer's biases and segment vectors (``r_w_bias``, ``r_r_bias``, ``r_s_bias``,
  ``seg_embed``). ``kr``: the projected encodings of each direction (X = 2: the batch's
  second half reads the second). Scores and softmax in float32, head-major. The queries
  are every position in order, or (``rows_BxL`` given: [B, P] positions) the rows of those
  positions only, whose position scores are read from each row's own window of distances.
  ``dropout_key``: attention dropout on the probabilities (None: none).
  """
  dt = c.jnp_dtype
  f32 = jnp.float32
  head_major = lambda x_BxTxNxD: x_BxTxNxD.transpose(2, 0, 1, 3)
  q_NxBxLxD, k_NxBxKxD, v_NxBxKxD = (head_major(x) for x in (q_BxLxNxD, k_BxKxNxD, v_BxKxNxD))
  n, b, l, d = q_NxBxLxD.shape
  klen = k_NxBxKxD.shape[2]
  directions = kr_XxRxNxD.shape[0]
  bias = lambda name: p[name].astype(dt)[:, None, None]
  ac = jnp.einsum('nbld,nbkd->nblk', q_NxBxLxD + bias('r_w_bias'), k_NxBxKxD,
                  preferred_element_type=f32)
  q_r_NxXxBxLxD = (q_NxBxLxD + bias('r_r_bias')).reshape(n, directions, b // directions, l, d)
  if rows_BxL is None:
    bd = position_scores(q_r_NxXxBxLxD, kr_XxRxNxD, klen).reshape(n, b, l, klen)
  else:  # Query at position i reads distances from entry (qlen - i) on (as rel_shift).
    bd = jnp.einsum('nxbld,xrnd->nxblr', q_r_NxXxBxLxD, kr_XxRxNxD,
                    preferred_element_type=dt).reshape(n, b, l, -1)
    qlen = bd.shape[-1] - klen
    bd = layers.shift_rows(bd, (qlen - rows_BxL)[None], klen, qlen)
  ef_NxBxLx2 = jnp.einsum('nbld,snd->nbls', q_NxBxLxD + bias('r_s_bias'),
                          p['seg_embed'].astype(dt), preferred_element_type=f32)
  ef = jnp.where(segment_differs_BxLxK[None], ef_NxBxLx2[..., 1:2], ef_NxBxLx2[..., 0:1])
  score = (ac + bd + ef) * (1.0 / c.head_dim ** 0.5)
  score = score - _MASK_PENALTY * masked_BxLxK[None].astype(f32)
  prob = jax.nn.softmax(score, axis=-1)
  if dropout_key is not None:
    prob = layers.dropout(prob, c.attention_dropout_rate, dropout_key)
  out_NxBxLxD = jnp.einsum('nblk,nbkd->nbld', prob.astype(dt), v_NxBxKxD)
  return out_NxBxLxD.transpose(1, 2, 0, 3)


def _kernel_attention(c, p, q, k_BxNxLxD, v_BxNxLxD, kr_1xTxNxD, codes, place_BxQxL=None,
                      read_BxQxL=None):
  """:func:`_relative_attention` by the Pallas kernel (``models/disentangled_kernel``),
  without memory or attention dropout, head-major: the content term ``(q + r_w_bias) . k``
  as the kernel's ``(q + r_r_bias) . k`` plus a bias a key, ``(r_w_bias - r_r_bias) . k``;
  the position term as its c2p against ``kr_1xTxNxD`` (the projected encodings of the 2P
  distances ``P - 1 .. -P``: :func:`kernel_distances`); the segment term as a bias a query,
  ``(q + r_s_bias) . (seg_embed[1] - seg_embed[0])``, added where the codes say the
  segments differ (the "same" vector's share is a bias a query, which the softmax drops);
  the masks in ``codes`` (:func:`kernel_codes`). ``q``: the content stream's [B, N, L, D]
  (the result likewise), or the query stream's [B, Q, N, D], run at their positions among
  the L (zeros elsewhere) and read back, both by one-hot products over the target mapping:
  ``place_BxQxL`` puts each position's first slot there, ``read_BxQxL`` (the mapping) gives
  every slot its position's row (the result [B, Q, N, D]; 0 for an empty slot)."""
  from encoder_jax.models import disentangled_kernel  # pylint: disable=g-import-not-at-top
  dt, f32 = c.jnp_dtype, jnp.float32
  b, n, l, d = k_BxNxLxD.shape
  padded, block = disentangled_attention.kernel_block(l)
  q_BxNxLxD = q
  if place_BxQxL is not None:
    q_BxNxLxD = jnp.einsum('bql,bqnd->bnld', place_BxQxL.astype(dt), q)
  bias = lambda name: p[name].astype(dt)[:, None, :]  # [N, 1, D]
  seg_2xNxD = p['seg_embed'].astype(dt)
  key_bias_BxNxL = jnp.einsum('bnld,nd->bnl', k_BxNxLxD, bias('r_w_bias')[:, 0]
                              - bias('r_r_bias')[:, 0], preferred_element_type=f32)
  row_bias_BxNxL = jnp.einsum('bnld,nd->bnl', q_BxNxLxD + bias('r_s_bias'),
                              seg_2xNxD[1] - seg_2xNxD[0], preferred_element_type=f32)
  pad = lambda x: jnp.pad(x, [(0, 0), (0, 0), (0, padded - l)] + [(0, 0)] * (x.ndim - 3))
  out_BxNxPxD = disentangled_kernel.attend(
      pad(q_BxNxLxD + bias('r_r_bias')), pad(k_BxNxLxD), pad(v_BxNxLxD),
      kr_1xTxNxD[0].transpose(1, 0, 2), None, None, None, block=block, scale=d ** 0.5,
      interpret=attention._backend() != 'tpu',  # pylint: disable=protected-access
      mesh_specs=attention._splash_mesh_specs(b, n),  # pylint: disable=protected-access
      codes=codes, key_bias_BxHxP=pad(key_bias_BxNxL), row_bias_BxHxP=pad(row_bias_BxNxL))
  out_BxNxLxD = out_BxNxPxD[:, :, :l]
  if place_BxQxL is None:
    return out_BxNxLxD
  return jnp.einsum('bql,bnld->bqnd', read_BxQxL.astype(dt), out_BxNxLxD)


def kernel_distances(length: int, clamp_len: int = -1) -> jax.Array:
  """float32 [2P]: the distances ``P - 1, ..., -P`` of the kernel's ascending table (row t
  at distance ``P - 1 - t``; P the kernel's padded length), clipped as
  :func:`relative_positions`'s."""
  padded, _ = disentangled_attention.kernel_block(length)
  pos_T = jnp.arange(padded - 1, -padded - 1, -1, dtype=jnp.float32)
  return jnp.clip(pos_T, -clamp_len, clamp_len) if clamp_len > 0 else pos_T


def kernel_codes(masked_BxLxL, segment_differs_BxLxL):
  """The kernel's masks (``disentangled_kernel.pack_codes``): a code a (query, key), padded
  to P with MASKED. A query whose L keys are all masked is flat, reading them all:
  ``score - 1e30`` makes each -1e30, a uniform softmax whose gradient still reaches the
  scores."""
  from encoder_jax.models import disentangled_kernel as dk  # pylint: disable=g-import-not-at-top
  l = masked_BxLxL.shape[-1]
  padded, block = disentangled_attention.kernel_block(l)
  flat_BxL = jnp.all(masked_BxLxL, axis=-1)
  codes = jnp.where(masked_BxLxL & ~flat_BxL[:, :, None], dk.MASKED,
                    jnp.where(segment_differs_BxLxL, dk.READ_WITH_ROW_BIAS, dk.READ))
  pad = padded - l
  codes = jnp.pad(codes, ((0, 0), (0, pad), (0, pad)), constant_values=dk.MASKED)
  return dk.pack_codes(codes, jnp.pad(flat_BxL, ((0, 0), (0, pad))), block)


def use_kernel(c: config_lib.EncoderConfig, length: int, memory: int,
               deterministic: bool) -> bool:
  """Whether a pass runs the two streams' attention by the Pallas kernel: the
  implementation resolves to splash (None or 'splash' on a TPU, 'splash' in Pallas
  interpret mode elsewhere), no memory, no attention dropout in training, the table fits
  VMEM and the kernel can be placed. One log line per reason it cannot."""
  if not disentangled_attention.kernel_requested(c):
    return False
  what = "XLNet's two-stream attention kernel"
  if memory:
    attention.warn_fallback(f'{what} (config.model.attention_implementation='
                            f'{c.attention_implementation!r}) has no memory, and '
                            f'config.model.mem_len={c.mem_len} asks for it')
    return False
  return disentangled_attention.kernel_can_run(c, what, length, 1, deterministic)


def _masks(input_mask_BxL, segment_ids_BxL, perm_mask_BxLxL, m: int, mem_mask_BxM):
  """(query stream's masked [B, L, K], content stream's masked, segments differ), K = m + L
  keys (``m`` of memory first)."""
  b, l = input_mask_BxL.shape
  klen = m + l
  # Keys a query may not read: padding, what the permutation hides, memory not yet filled.
  key_masked_BxK = input_mask_BxL == 0
  if m:
    mem_valid_BxM = jnp.ones((b, m), bool) if mem_mask_BxM is None else mem_mask_BxM > 0
    key_masked_BxK = jnp.concatenate([~mem_valid_BxM, key_masked_BxK], axis=1)
  query_masked_BxLxK = jnp.broadcast_to(key_masked_BxK[:, None, :], (b, l, klen))
  if perm_mask_BxLxL is not None:
    perm_BxLxK = jnp.pad(perm_mask_BxLxL > 0, ((0, 0), (0, 0), (m, 0)))
    query_masked_BxLxK = query_masked_BxLxK | perm_BxLxK
  # The content stream always sees its own position (Hugging Face's ``non_tgt_mask``).
  own_LxK = jnp.arange(klen)[None, :] == (jnp.arange(l) + m)[:, None]
  # Segments: 1 = different (memory counts as segment 0).
  cat_ids_BxK = jnp.pad(segment_ids_BxL, ((0, 0), (m, 0)))
  segment_differs_BxLxK = segment_ids_BxL[:, :, None] != cat_ids_BxK[:, None, :]
  return query_masked_BxLxK, query_masked_BxLxK & ~own_LxK, segment_differs_BxLxK


def _backward_half_reversed(b: int):
  """``flip(x, axes)``: x with the batch's second half (rows b / 2 ..) reversed along
  ``axes``, the first half as it is (None stays None)."""
  backward_B = jnp.arange(b) >= b // 2
  return lambda x, axes: None if x is None else jnp.where(
      backward_B.reshape((b,) + (1,) * (x.ndim - 1)), jnp.flip(x, axes), x)


def _kernel_context(content_masked_BxLxL, query_masked_BxLxL, segment_differs_BxLxL,
                    target_mapping_BxPxL):
  """The kernel's per-pass operands: each stream's codes and, with targets, the one-hot
  placement of the query stream (a position's first slot places its query there; zero
  rows are empty slots) and the mapping that reads its rows back."""
  out = dict(content_codes=kernel_codes(content_masked_BxLxL, segment_differs_BxLxL))
  if target_mapping_BxPxL is not None:
    first_BxPxL = jnp.cumsum(target_mapping_BxPxL, axis=1) <= 1
    out.update(query_codes=kernel_codes(query_masked_BxLxL, segment_differs_BxLxL),
               place_BxPxL=target_mapping_BxPxL * first_BxPxL,
               target_mapping_BxPxL=target_mapping_BxPxL)
  return out


def _attention_of(c, p, context, cat_BxKxE, wq_wk_wv, kr_XxRxNxD):
  """(attend, content query, content rows, target rows) of a layer: ``attend(q, rows, keys)``
  the kernel's (head-major projections, a stream's codes: ``context['kernel']``) or XLA's,
  over the keys and values of ``cat_BxKxE``."""
  dt = c.jnp_dtype
  wq, wk, wv = (w.astype(dt) for w in wq_wk_wv)
  kernel = context.get('kernel')
  if kernel is not None:
    heads = lambda x_BxTxE, w: jnp.einsum('bte,end->bntd', x_BxTxE.astype(dt), w)
    k_BxNxKxD, v_BxNxKxD = heads(cat_BxKxE, wk), heads(cat_BxKxE, wv)
    attend = lambda q, rows_of, ks: _kernel_attention(
        c, p, q, k_BxNxKxD, v_BxNxKxD, kr_XxRxNxD, *rows_of)
    return (attend, lambda h: heads(h, wq), (kernel['content_codes'],),
            (kernel.get('query_codes'), kernel.get('place_BxPxL'),
             kernel.get('target_mapping_BxPxL')))
  project = lambda x, w: layers.project(x.astype(dt), w, 1)
  k_BxKxNxD, v_BxKxNxD = project(cat_BxKxE, wk), project(cat_BxKxE, wv)
  attend = lambda q, rows_of, ks: _relative_attention(
      c, p, q, k_BxKxNxD, v_BxKxNxD, kr_XxRxNxD, *rows_of, dropout_key=ks[0])
  return (attend, lambda h: project(h, wq),
          (context['segment_differs_BxLxK'], context['content_masked_BxLxK']),
          (context.get('target_segment_differs_BxPxK'), context.get('target_masked_BxPxK'),
           context.get('target_rows_BxP')))


class Layer(nn.Module):
  """One XLNet block on both streams (the ``nn.scan`` body).

  Carry ``(h, g)`` (``g`` None: content stream only); per-layer inputs: the memory
  [B, M, E] (or None) and ``content_needed`` (None: compute the content stream; the
  Python value False: skip it);
  broadcast: ``context`` (positions, segments, masks, target mapping). Emits the layer's
  new memory and, with ``collect_hidden``, its outputs.

  The block's arithmetic is plain functions of its parameters (``layers.ParamGroup`` for
  the norms and the feed-forward, the same tree as ``layers.Dense``/``LayerNorm``). In
  pretraining the last layer's content output is read by nothing (the loss reads the
  query stream; the memory caches layer inputs): ``Encoder`` applies that layer on its own
  with ``content_needed=False``, forward and backward.
  """
  config: config_lib.EncoderConfig
  deterministic: bool
  collect_hidden: bool = False

  @nn.compact
  def __call__(self, carry, mem_BxMxE, content_needed, context: dict[str, Any]):
    c, dt = self.config, self.config.jnp_dtype
    e, n, d, f = c.hidden_size, c.num_heads, c.head_dim, c.intermediate_size
    init = nn.initializers.normal(c.initializer_range)
    proj = lambda name: layers.param(self, name, init, (e, n, d), ('embed', 'heads', 'kv'))
    wq, wk, wv, wo, wr = (proj(name) for name in ('q', 'k', 'v', 'o', 'r'))
    p = {name: layers.param(self, name, init, (n, d), ('heads', 'kv'))
         for name in ('r_w_bias', 'r_r_bias', 'r_s_bias')}
    p['seg_embed'] = layers.param(self, 'seg_embed', init, (2, n, d), (None, 'heads', 'kv'))
    group = lambda name, specs: layers.ParamGroup(specs, name=name)()
    attention_norm = group('attention_layer_norm', layers.layer_norm_params(e))
    intermediate = group('intermediate', layers.dense_params(
        (e,), (f,), ('embed',), ('mlp',), c.initializer_range))
    output = group('output', layers.dense_params(
        (f,), (e,), ('mlp',), ('embed',), c.initializer_range))
    output_norm = group('output_layer_norm', layers.layer_norm_params(e))
    project = lambda x, w: layers.project(x.astype(dt), w.astype(dt), 1)
    train = not self.deterministic

    rates = (c.attention_dropout_rate,) + (c.hidden_dropout_rate,) * 3

    def keys():  # Dropout keys of one stream: attention, its output, FFN inner and output.
      return tuple(self.make_rng('dropout') if train and r > 0 else None for r in rates)

    def drop(x, key):
      return x if key is None else layers.dropout(x, c.hidden_dropout_rate, key)

    def block(x_BxTxE, a_BxTxNxD, ks, heads_first=False):
      """Output projection, residual, LN; feed-forward. ``heads_first``: ``a`` is
      [B, N, T, D] (the kernel's content stream)."""
      if heads_first:
        out_BxTxE = jnp.einsum('bntd,end->bte', a_BxTxNxD, wo.astype(dt))
      else:
        out_BxTxE = layers.project(a_BxTxNxD, wo.astype(dt), 2, in_first=False)
      x_BxTxE = layers.layer_norm(drop(out_BxTxE, ks[1]) + x_BxTxE, attention_norm['scale'],
                                  attention_norm['bias'], c.layer_norm_eps, dt)
      y = layers.dense(x_BxTxE, intermediate['kernel'], intermediate['bias'], 1, dt)
      y = layers.dense(drop(config_lib.ACTIVATIONS[c.activation](y), ks[2]), output['kernel'],
                       output['bias'], 1, dt)
      return layers.layer_norm(drop(y, ks[3]) + x_BxTxE, output_norm['scale'],
                               output_norm['bias'], c.layer_norm_eps, dt)

    h_BxLxE, g_BxPxE = carry
    new_mem = None
    if mem_BxMxE is not None:  # Transformer-XL: this layer's input, after the old memory.
      cat_BxKxE = jnp.concatenate([mem_BxMxE.astype(dt), h_BxLxE], axis=1)
      new_mem = jax.lax.stop_gradient(cat_BxKxE[:, -mem_BxMxE.shape[1]:])
    else:
      cat_BxKxE = h_BxLxE
    kr_XxRxNxD = project(context['pos_emb_XxRxE'], wr)  # Once per direction, not per row.
    kernel = context.get('kernel')
    attend, content_query, content_rows, target_rows = _attention_of(
        c, p, context, cat_BxKxE, (wq, wk, wv), kr_XxRxNxD)

    def content(h, ks):
      a_h = attend(content_query(h), content_rows, ks)
      return block(h, a_h, ks, heads_first=kernel is not None)

    h_keys = keys()
    # content_needed False: nothing reads this layer's content output (the last layer in
    # pretraining, applied on its own); the input passes through (shapes stay).
    h_out = h_BxLxE if content_needed is False else content(h_BxLxE, h_keys)
    g_out = None
    if g_BxPxE is not None:  # Only the P target rows attend (their masks and segments).
      g_keys = keys()
      a_g = attend(project(g_BxPxE, wq), target_rows, g_keys)
      a_g = a_g * context['target_valid_BxP'][:, :, None, None].astype(a_g.dtype)
      g_out = block(g_BxPxE, a_g, g_keys)
    hidden = (h_out, g_out) if self.collect_hidden else None
    return (h_out, g_out), (new_mem, hidden)


class Encoder(nn.Module):
  """Masks, relative positions and segments once per pass; then the scanned layers."""
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, h_BxLxE, segment_ids_BxL, input_mask_BxL, *, deterministic: bool,
               g_BxPxE=None, perm_mask_BxLxL=None, target_mapping_BxPxL=None,
               mems_NxBxMxE=None, mem_mask_BxM=None, bi_data: bool = False,
               collect_hidden: bool = False, content_output: bool = True):
    c = self.config
    b, l = input_mask_BxL.shape
    if bi_data and b % 2:
      raise ValueError(f'XLNet with bi_data reads the second half of the batch backward; '
                       f'got a batch of {b} rows (expected an even number)')
    m = 0 if mems_NxBxMxE is None else mems_NxBxMxE.shape[2]
    klen = m + l
    kernel = use_kernel(c, l, m, deterministic)
    flip = None
    if kernel and bi_data:
      # The kernel reads one table. A row read backward (negated distances) is the same
      # network on the row reversed, read forward: the batch's second half is reversed in
      # here (tokens, segments, masks, target positions) and its outputs back on the way out.
      flip = _backward_half_reversed(b)
      h_BxLxE, segment_ids_BxL, input_mask_BxL = (
          flip(x, 1) for x in (h_BxLxE, segment_ids_BxL, input_mask_BxL))
      perm_mask_BxLxL = flip(perm_mask_BxLxL, (1, 2))
      target_mapping_BxPxL = flip(target_mapping_BxPxL, 2)
      bi_data = False
    query_masked_BxLxK, content_masked_BxLxK, segment_differs_BxLxK = _masks(
        input_mask_BxL, segment_ids_BxL, perm_mask_BxLxL, m, mem_mask_BxM)
    pos_R = relative_positions(l, klen, c.clamp_len)
    if kernel:
      pos_emb_XxRxE = sinusoid(kernel_distances(l, c.clamp_len), c.hidden_size)[None]
    elif not bi_data:
      pos_emb_XxRxE = sinusoid(pos_R, c.hidden_size)[None]
    else:  # The first half reads +distance, the second -distance (the original's bi_data).
      pos_emb_XxRxE = sinusoid(jnp.stack([pos_R, -pos_R]), c.hidden_size)
    pos_emb_XxRxE = layers.Dropout(c.hidden_dropout_rate)(
        pos_emb_XxRxE.astype(c.jnp_dtype), deterministic=deterministic)
    context = dict(pos_emb_XxRxE=pos_emb_XxRxE, segment_differs_BxLxK=segment_differs_BxLxK,
                   content_masked_BxLxK=content_masked_BxLxK)
    if kernel:
      context['kernel'] = _kernel_context(content_masked_BxLxK, query_masked_BxLxK,
                                          segment_differs_BxLxK, target_mapping_BxPxL)
      context['target_valid_BxP'] = (None if target_mapping_BxPxL is None
                                     else target_mapping_BxPxL.sum(-1) > 0)
    elif target_mapping_BxPxL is not None:
      # The query stream attends from its P targets only: each slot's position (a one-hot
      # row of target_mapping; a zero row is an empty slot, whose attention output is 0 as
      # when its query is spread over no position), and that row of the masks and segments.
      rows_BxP = jnp.argmax(target_mapping_BxPxL, axis=-1).astype(jnp.int32)
      row_of = lambda x_BxLxK: jnp.take_along_axis(x_BxLxK, rows_BxP[:, :, None], axis=1)
      context.update(target_rows_BxP=rows_BxP,
                     target_valid_BxP=target_mapping_BxPxL.sum(-1) > 0,
                     target_masked_BxPxK=row_of(query_masked_BxLxK),
                     target_segment_differs_BxPxK=row_of(segment_differs_BxLxK))
    # Without content_output (pretraining: the loss reads the query stream), the last
    # layer's content stream is skipped: the last layer's output is read by nothing else.
    # (When initialising, every layer runs in full: that creates the parameters.)
    skip_last = not content_output and g_BxPxE is not None and not collect_hidden
    if skip_last and not self.is_initializing():
      h_BxLxE, g_BxPxE, new_mems_NxBxMxE, hidden = self._skipping_last_content(
          h_BxLxE, g_BxPxE, mems_NxBxMxE, context, deterministic)
      return (h_BxLxE if flip is None else flip(h_BxLxE, 1)), g_BxPxE, new_mems_NxBxMxE, hidden
    body = nn.remat(Layer, prevent_cse=False) if c.remat else Layer
    stack = nn.scan(body, variable_axes={'params': 0},
                    split_rngs={'params': True, 'dropout': True},
                    in_axes=(0, 0, nn.broadcast), length=c.num_layers,
                    unroll=c.layers_per_iteration,
                    metadata_params={nn.PARTITION_NAME: 'layers'})
    (h_BxLxE, g_BxPxE), (new_mems_NxBxMxE, hidden) = stack(
        c, deterministic, collect_hidden, name='layers')((h_BxLxE, g_BxPxE), mems_NxBxMxE,
                                                         None, context)
    if flip is not None:  # The reversed rows' content states, back in order.
      h_BxLxE = flip(h_BxLxE, 1)
      if hidden is not None:
        per_layer = jax.vmap(lambda x: flip(x, 1))
        hidden = (per_layer(hidden[0]),) + tuple(hidden[1:])
    return h_BxLxE, g_BxPxE, new_mems_NxBxMxE, hidden

  def _skipping_last_content(self, h_BxLxE, g_BxPxE, mems_NxBxMxE, context, deterministic):
    """Layers 1..N-1 (a scan over the stacked parameters, sliced), then layer N with its
    content stream left out statically (its keys and values, which the query stream
    reads, still computed). Parameters and their layout are the scan's."""
    c = self.config
    n = c.num_layers
    params = nn.meta.unbox(self.variables['params']['layers'])
    layer = Layer(c, deterministic, parent=None)
    keys = (None if deterministic or not c.has_dropout
            else jax.random.split(self.make_rng('dropout'), n))

    def apply(p, carry, mem, needed, key):
      return layer.apply({'params': p}, carry, mem, needed, context,
                         rngs=None if key is None else {'dropout': key})

    def body(carry, xs):
      p, mem, key = xs
      carry, (new_mem, _) = apply(p, carry, mem, None, key)
      return carry, new_mem

    if c.remat:
      body = jax.checkpoint(body, prevent_cse=False)
    carry, new_mems = (h_BxLxE, g_BxPxE), None
    pick = lambda tree, s: None if tree is None else jax.tree.map(lambda x: x[s], tree)
    if n > 1:
      carry, new_mems = layers.layer_scan(
          body, carry, (pick(params, slice(0, -1)), pick(mems_NxBxMxE, slice(0, -1)),
                        pick(keys, slice(0, -1))),
          n - 1, min(c.layers_per_iteration, n - 1))
    (h_BxLxE, g_BxPxE), (new_mem, _) = apply(pick(params, -1), carry, pick(mems_NxBxMxE, -1),
                                             False, pick(keys, -1))
    if mems_NxBxMxE is not None:
      new_mems = (new_mem[None] if new_mems is None
                  else jnp.concatenate([new_mems, new_mem[None]], axis=0))
    return h_BxLxE, g_BxPxE, new_mems, None


def _collected(first, per_layer):
  """(input, layer 1 output, ..., layer N output), as Hugging Face's ``hidden_states``."""
  return (first, *per_layer)


def encode(c: config_lib.EncoderConfig, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
           deterministic: bool, pool: bool = True, collect_hidden: bool = False
           ) -> dict[str, Any]:
  """The content stream (fine-tuning, features): 'embeddings', 'encoder' [, 'pooler'].

  ``pool`` adds a dense + tanh on the state of each row's last real token: XLNet's
  ``<cls>``, which ends its rows (``A <sep> B <sep> <cls>``, padded on the left, as Hugging
  Face's sequence summary reads it). It is not part of the pretrained network (XLNet has no
  pooler), so it starts fresh, as RoBERTa's.
  """
  h_BxLxE, word = Embeddings(c, name='embeddings')(input_ids_BxL, deterministic)
  x_BxLxE, _, _, hidden = Encoder(c, name='encoder')(
      h_BxLxE, segment_ids_BxL, input_mask_BxL, deterministic=deterministic,
      collect_hidden=collect_hidden)
  out = {'sequence_output': layers.Dropout(c.hidden_dropout_rate)(x_BxLxE,
                                                              deterministic=deterministic),
         'word_embed': word}
  if pool:
    out['pooled_output'] = jnp.tanh(layers.Dense(
        (c.hidden_size,), (c.hidden_size,), ('embed',), ('embed',), c.initializer_range,
        c.jnp_dtype, name='pooler')(last_real(x_BxLxE, input_mask_BxL)))
  if collect_hidden:
    out['all_hidden_states'] = _collected(h_BxLxE, hidden[0])
  return out


def last_real(x_BxLxE, input_mask_BxL):
  """[B, E]: each row's state at its last non-padding position (either padding side)."""
  length = input_mask_BxL.shape[1]
  last_B = length - 1 - jnp.argmax(input_mask_BxL[:, ::-1] > 0, axis=1)
  return jnp.take_along_axis(x_BxLxE, last_B[:, None, None], axis=1)[:, 0]


def masked_positions_targets(masked_positions_BxP, length: int):
  """(perm_mask [B, L, L], target_mapping [B, P, L]) that predict ``masked_positions``.

  Every listed position is a target hidden from every query (as if all were last in the
  factorization order, after the rest): fill-mask and the generic ``mlm_logits``.
  """
  tm_BxPxL = jax.nn.one_hot(masked_positions_BxP, length, dtype=jnp.float32)
  hidden_BxL = tm_BxPxL.max(axis=1)
  perm_BxLxL = jnp.broadcast_to(hidden_BxL[:, None, :], (hidden_BxL.shape[0], length, length))
  return perm_BxLxL, tm_BxPxL


class XLNetModel(nn.Module):
  """The content stream alone (``XLNetModel`` without targets): features, embeddings."""
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, *,
               deterministic: bool = True, collect_hidden: bool = False) -> dict[str, Any]:
    out = encode(self.config, input_ids_BxL, segment_ids_BxL, input_mask_BxL,
                 deterministic=deterministic, pool=False, collect_hidden=collect_hidden)
    del out['word_embed']
    return out


class XLNetLMHeadModel(nn.Module):
  """Both streams and the tied LM head: permutation language modelling.

  Called with the ``ModelKind`` contract ``(ids, segments, mask, masked_positions)``, it
  predicts ``masked_positions`` with the query stream, each hidden from every query
  (:func:`masked_positions_targets`); without them, and without ``target_mapping``, the
  logits come from the content stream at every position (as Hugging Face). The
  permutation objective passes ``perm_mask`` [B, L, L] (1: query i may not read key j) and
  ``target_mapping`` [B, P, L] itself, and ``mems`` [B, N, M, E] with ``mem_mask`` [B, M]
  when ``mem_len`` > 0; ``bi_data`` (a Python bool: static under ``jax.jit``) makes the
  batch's second half read negated distances (the batch must then be even; the halves
  should span whole batch shards, else XLA replicates the position scores).

  ``content_output=False`` (the permutation objective) leaves out ``sequence_output`` when
  the query stream runs, and with it the last layer's content stream.

  Returns ``sequence_output`` (content stream), ``query_output`` (query stream, if run),
  ``mlm_logits`` float32 [B, P, V], ``new_mems``/``new_mem_mask`` (when ``mems`` is given),
  ``all_hidden_states`` / ``all_query_states`` (when ``collect_hidden``).
  """
  config: config_lib.EncoderConfig

  @nn.compact
  def __call__(self, input_ids_BxL, segment_ids_BxL, input_mask_BxL, masked_positions_BxP=None,
               *, perm_mask=None, target_mapping=None, mems=None, mem_mask=None,
               bi_data: bool = False, deterministic: bool = True, collect_hidden: bool = False,
               content_output: bool = True) -> dict[str, Any]:
    c = self.config
    b, l = input_ids_BxL.shape
    if target_mapping is None and masked_positions_BxP is not None:
      hidden_perm, target_mapping = masked_positions_targets(masked_positions_BxP, l)
      perm_mask = hidden_perm if perm_mask is None else perm_mask
    h_BxLxE, word = Embeddings(c, name='embeddings')(input_ids_BxL, deterministic)
    mask_emb_E = layers.param(self, 'mask_emb', nn.initializers.normal(c.initializer_range),
                              (c.hidden_size,), ('embed',))
    g_BxPxE = None
    if target_mapping is not None:
      g_BxPxE = jnp.broadcast_to(mask_emb_E.astype(c.jnp_dtype),
                                 (b, target_mapping.shape[1], c.hidden_size))
      g_BxPxE = layers.Dropout(c.hidden_dropout_rate)(g_BxPxE, deterministic=deterministic)
    mems_NxBxMxE = None if mems is None else jnp.swapaxes(mems, 0, 1)
    x_BxLxE, y_BxPxE, new_NxBxMxE, hidden = Encoder(c, name='encoder')(
        h_BxLxE, segment_ids_BxL, input_mask_BxL, deterministic=deterministic, g_BxPxE=g_BxPxE,
        perm_mask_BxLxL=perm_mask, target_mapping_BxPxL=target_mapping,
        mems_NxBxMxE=mems_NxBxMxE, mem_mask_BxM=mem_mask, bi_data=bi_data,
        collect_hidden=collect_hidden, content_output=content_output)
    final_dropout = layers.Dropout(c.hidden_dropout_rate)
    out, head_in = {}, None
    if content_output or y_BxPxE is None:
      out['sequence_output'] = head_in = final_dropout(x_BxLxE, deterministic=deterministic)
    if y_BxPxE is not None:
      out['query_output'] = head_in = final_dropout(y_BxPxE, deterministic=deterministic)
    bias_V = layers.param(self, 'lm_bias', nn.initializers.zeros, (c.vocab_size,), ('vocab',))
    out['mlm_logits'] = word.attend(head_in, bias_V)
    if mems is not None:
      m = mems.shape[2]
      out['new_mems'] = jnp.swapaxes(new_NxBxMxE, 0, 1)
      valid_BxM = jnp.ones(mems.shape[:1] + (m,), jnp.int32) if mem_mask is None else mem_mask
      out['new_mem_mask'] = jnp.concatenate(
          [valid_BxM.astype(jnp.int32), input_mask_BxL.astype(jnp.int32)], axis=1)[:, -m:]
    if collect_hidden:
      out['all_hidden_states'] = _collected(h_BxLxE, hidden[0])
      if y_BxPxE is not None:
        out['all_query_states'] = _collected(g_BxPxE, hidden[1])
    return out


def flops_per_token(c: config_lib.EncoderConfig, seq_len: int) -> float:
  """Training FLOPs (3x forward) of the content stream per token, memory included.

  Per layer and token, forward: q/o projections ``2 * 2d^2``; k/v over ``L + M`` keys
  ``2 * 2d^2 (L + M) / L``; scores ``ac`` and values ``2 * 2d (L + M)``, ``bd`` over the
  ``2L + M`` distances ``2d (2L + M)``; feed-forward ``4 d d_ff``. The position projection
  ``r`` runs once per batch (not per row) and the segment term is O(L) per token: left out.
  The query stream and the LM head are the objective's (``objectives/plm.py``).
  """
  d, f, n_layers, m, l = c.hidden_size, c.intermediate_size, c.num_layers, c.mem_len, seq_len
  forward = (4 * d * d + 4 * d * d * (l + m) / l + 4 * d * (l + m) + 2 * d * (2 * l + m)
             + 4 * d * f)
  return float(3 * n_layers * forward)


# XLNet's own config.model fields, declared with the others on EncoderConfig.
FIELDS = config_lib.kind_fields(config_lib.XLNET)


def _check(c: config_lib.EncoderConfig) -> None:
  if c.attention_kind != 'dot_product':
    raise ValueError(f'config.model.kind=xlnet has its own two-stream relative attention '
                     f'(models/xlnet.py); config.model.attention_kind={c.attention_kind!r} '
                     "must stay 'dot_product' (unused)")
  if c.share_layers != 'none' or c.embedding_size not in (0, c.hidden_size):
    raise ValueError('config.model.kind=xlnet has no factorized embedding or layer sharing '
                     f'(embedding_size={c.embedding_size}, share_layers={c.share_layers!r})')
  if c.position_offset:
    raise ValueError(f'config.model.kind=xlnet has no absolute positions; got '
                     f'position_offset={c.position_offset} (expected 0)')


KIND = config_lib.ModelKind(
    name='xlnet', pretraining=XLNetLMHeadModel, encoder=XLNetModel, encode=encode,
    pooler=False, pair_head=False, check=_check, flops_per_token=flops_per_token, fields=FIELDS,
    description='XLNet: two-stream relative attention (Transformer-XL), permutation LM head',
    import_objectives=('plm',), import_pair_kind='xlnet')
