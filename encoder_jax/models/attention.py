"""Dot-product attention, and what every attention kind shares (the fused / explicit
softmax backends, key lengths for cuDNN, the Pallas splash-attention kernel for TPUs).

Attention kinds are looked up by ``config.model.attention_kind`` in
``models.attention_kinds`` (the registry). An attention kind is a Flax module
``cls(config, deterministic)`` called as
``(x_BxLxE, mask_Bx1x1xL, context) -> BxLxE``: it owns its parameters (projections,
and anything else it needs, e.g. DeBERTa's relative-position projections) and returns
the attention block's output before dropout and the residual. ``context`` is a dict the
encoder builds once per forward pass and hands to every layer (e.g. relative-position
embeddings or a second stream); plain dot-product attention reads only ``kv_states``
(keys and values from other rows than the queries), when present.

Encoder layers call a kind with ``nn.share_scope``, so its parameters sit directly in the
layer's scope (``query``, ``key``, ``value``, ``attention_output`` for dot-product), the
layout the checkpoints and the Hugging Face tables use. A new kind is a module plus a line
in ``attention_kinds``; the encoder layer never names one.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from encoder_jax.models import layers
from encoder_jax.models import packing

# config.model.attention_implementation: None = per backend (Pallas splash attention on a
# TPU, cuDNN on a CUDA GPU in bf16/fp16, XLA elsewhere), or one forced.
IMPLEMENTATIONS = (None, 'xla', 'cudnn', 'splash')
# config.model.scanned_attention: how the layer scan's layers choose their attention.
SCANNED_ATTENTION = ('by_layer', 'global', 'local')
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_warned: set[str] = set()
# Splash attention: sequences padded to a multiple of the TPU's 128 lanes (the kernel's
# smallest key block), and the largest of these blocks that divides the padded length.
_SPLASH_LANES = 128
_SPLASH_BLOCKS = (512, 256, 128)
_SPLASH_PADDING = -1  # Segment id of the block padding: no real token has it.
_BATCH_AXES, _HEAD_AXIS = ('data', 'fsdp'), 'tensor'  # As sharding.LOGICAL_RULES.


def _backend() -> str:
  """The platform the computation being traced compiles for: that of the mesh it is traced
  under (the training and evaluation steps set theirs; ``encoder_jax.tpu.aot`` compiles them
  for a TPU slice from a host without one), else JAX's default backend. A function, so a
  test can pose as a GPU host."""
  device = getattr(jax.sharding.get_abstract_mesh(), 'abstract_device', None)
  return device.platform if device is not None else jax.default_backend()


def key_lengths(mask_Bx1x1xS):
  """Keys per sequence, ``int32[B]``: the count of ones in each row of the key mask.

  Assumes right padding: each row is ones (real tokens) then zeros (padding), which is
  what the data pipeline (``data.iterators``: ``arange(L) < length``), fine-tuning
  (``finetune.data``) and ``encoder_jax.load(...).encode`` produce. For such a mask,
  masking keys at positions ``>= length`` is the same as masking by the boolean mask. A
  mask with holes or left padding is only exact with ``attention_implementation='xla'``.
  """
  return jnp.sum(mask_Bx1x1xS, axis=(1, 2, 3), dtype=jnp.int32)


def warn_fallback(reason: str) -> None:
  """One log line per reason (per process) that an attention runs XLA's softmax instead of
  the kernel ``config.model.attention_implementation`` asked for or resolved to."""
  if reason not in _warned:
    _warned.add(reason)
    logging.warning('%s; using XLA attention.', reason)


def resolve_implementation(requested: str | None, dtype) -> str:
  """'xla', 'cudnn' or 'splash' for ``config.model.attention_implementation`` here.

  None picks splash attention (:func:`splash_dot_product`) on a TPU, cuDNN on a GPU when
  the activations are bf16/fp16 (the only dtypes cuDNN's flash attention takes) and XLA
  otherwise; note that ``jax.nn.dot_product_attention``'s own default
  (``implementation=None``) is XLA on every backend, so without this choice the cuDNN
  kernel never runs. An explicit 'cudnn' that cannot run here is an error that names the
  key, not a silent fallback: whoever forces it is measuring it. An explicit 'splash' runs
  on a TPU, and on the CPU in Pallas interpret mode (the same kernel, slowly: tests); on a
  GPU it is an error. Where splash is chosen but cannot serve a call (attention dropout in
  training, queries at some rows, other attention kinds) that call runs XLA's attention
  (see :class:`DotProductAttention`).
  """
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f'config.model.attention_implementation={requested!r}; expected one of '
                     f'{list(IMPLEMENTATIONS)} (None = splash on TPUs, cuDNN on GPUs, XLA '
                     'elsewhere)')
  if requested == 'xla':
    return 'xla'
  backend, low_precision = _backend(), jnp.dtype(dtype) in _CUDNN_DTYPES
  if requested == 'splash':
    if backend == 'gpu':
      raise ValueError(
          "config.model.attention_implementation='splash' is a TPU kernel (Pallas splash "
          "attention); this process's JAX backend is 'gpu'. Use 'cudnn', 'xla', or None to "
          'choose per backend.')
    return 'splash'
  if requested == 'cudnn':
    if backend != 'gpu':
      raise ValueError(
          "config.model.attention_implementation='cudnn' needs a CUDA GPU (cuDNN fused "
          f"attention); this process's JAX backend is {backend!r}. Use 'xla', or None to "
          'choose per backend.')
    if not low_precision:
      raise ValueError(
          "config.model.attention_implementation='cudnn' needs config.model.dtype="
          f"'bfloat16' (cuDNN flash attention takes bf16/fp16, not {jnp.dtype(dtype).name}); "
          "use 'xla' or None for float32.")
    return 'cudnn'
  if backend == 'tpu':
    return 'splash'
  return 'cudnn' if backend == 'gpu' and low_precision else 'xla'


def fused(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, *,
          implementation: str | None = None, padding_as_lengths: bool | None = None):
  """``jax.nn.dot_product_attention``: cuDNN's fused flash-attention kernel, or XLA's.

  ``implementation`` is ``config.model.attention_implementation`` (see
  :func:`resolve_implementation`). cuDNN takes key padding as sequence lengths (its
  PADDING mask type); a boolean mask it would first turn into an additive bias tensor
  the kernel must read (JAX's ``combine_bias_and_mask``). So on the cuDNN path the
  padding goes in as ``key_value_seq_lengths = key_lengths(mask)`` (right padding
  assumed, see :func:`key_lengths`). Queries keep their full length, so padded positions still get
  outputs, equal to the mask path's (and Hugging Face's). The XLA path keeps the boolean
  mask, exact for any mask. ``padding_as_lengths`` overrides the choice of padding form
  (tests compare the two on XLA). A mask with a row per query (``[B, 1, L, S]``: packed
  rows' documents) always goes in as a mask.

  With None, a case JAX's cuDNN path rejects when tracing (no cuDNN, e.g. ROCm; compute
  capability < 8.0; a head dim over 128, or 256 on Hopper, or not a multiple of 8) falls
  back to XLA with a warning; with 'cudnn' it is an error naming the key. Splash (TPU)
  attention is :func:`splash_dot_product`; where it was chosen and this is called (queries
  at some rows of the keys), this is XLA's.
  """
  impl = resolve_implementation(implementation, q_BxLxHxD.dtype)
  if impl == 'splash':
    impl = 'xla'
  # A mask per query (packed rows: [B, 1, L, S]) is not key padding: it stays a mask.
  per_query = mask_Bx1x1xS.shape[-2] != 1
  as_lengths = (impl == 'cudnn' and not per_query if padding_as_lengths is None
                else padding_as_lengths)
  padding = (dict(key_value_seq_lengths=key_lengths(mask_Bx1x1xS)) if as_lengths
             else dict(mask=mask_Bx1x1xS))
  if impl == 'cudnn':
    try:
      return jax.nn.dot_product_attention(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, **padding,
                                          implementation='cudnn')
    except (NotImplementedError, RuntimeError, ValueError) as e:
      if implementation == 'cudnn':
        raise ValueError(f"config.model.attention_implementation='cudnn': cuDNN cannot run "
                         f"this attention ({e}); use 'xla', or None to fall back.") from e
      if str(e) not in _warned:
        _warned.add(str(e))
        logging.warning('cuDNN attention unavailable (%s); using XLA attention '
                        '(config.model.attention_implementation=None).', e)
      if padding_as_lengths is None:
        padding = dict(mask=mask_Bx1x1xS)
  return jax.nn.dot_product_attention(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, **padding,
                                      implementation='xla')


def explicit_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, *, dropout_rate,
                         dropout_rng):
  """The same attention with an explicit float32 softmax, and dropout on its output."""
  depth = q_BxLxHxD.shape[-1]
  logits_BxHxLxS = jnp.einsum('blhd,bshd->bhls', q_BxLxHxD, k_BxSxHxD,
                              preferred_element_type=jnp.float32)
  logits_BxHxLxS = logits_BxHxLxS / jnp.sqrt(jnp.float32(depth))
  logits_BxHxLxS = jnp.where(mask_Bx1x1xS, logits_BxHxLxS, jnp.finfo(jnp.float32).min)
  probs_BxHxLxS = jax.nn.softmax(logits_BxHxLxS, axis=-1)
  if dropout_rate > 0.0:
    probs_BxHxLxS = layers.dropout(probs_BxHxLxS, dropout_rate, dropout_rng)
  return jnp.einsum('bhls,bshd->blhd', probs_BxHxLxS.astype(v_BxSxHxD.dtype), v_BxSxHxD)


def dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, *, dropout_rate, dropout_rng,
                implementation: str | None = None):
  """Scaled dot-product attention with a key padding mask.

  Without attention dropout (evaluation, or ``attention_dropout_rate=0``) this is
  ``jax.nn.dot_product_attention`` (:func:`fused`; cuDNN on GPUs). BERT's recipe drops
  attention probabilities during training, which that API cannot do, so the training path
  with dropout spells out the same computation with an explicit softmax (a test checks
  both paths agree); a GPU run reaches the cuDNN kernel in training only with
  ``attention_dropout_rate=0``.
  """
  if dropout_rate == 0.0 or dropout_rng is None:
    return fused(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, implementation=implementation)
  return explicit_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS,
                              dropout_rate=dropout_rate, dropout_rng=dropout_rng)


def _splash_modules():
  """The Pallas splash-attention kernel and masks (imported when first used: Pallas' TPU
  modules add a third of a second to every process that imports the models)."""
  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask
  return splash_attention_kernel, splash_attention_mask


def splash_block(length: int) -> tuple[int, int]:
  """(padded length, block): ``length`` rounded up to the TPU's 128 lanes (the kernel's
  smallest key block), and the largest of 512, 256, 128 that divides it (the query and key
  blocks of the forward and backward kernels)."""
  padded = -(-length // _SPLASH_LANES) * _SPLASH_LANES
  return padded, next(b for b in _SPLASH_BLOCKS if padded % b == 0)


def _splash_kernel(heads: int, length: int, block: int, half_window: int | None):
  """The splash kernel for [heads, length, D] operands: every key (``FullMask``), or the keys
  with ``|i - j| <= half_window`` (``LocalMask((w, w))`` allows ``i - w <= j <= i + w``, both
  edges included, as :func:`band_mask`); blocks outside the band are skipped. Pallas
  interpret mode off a TPU."""
  kernel_lib, mask_lib = _splash_modules()
  shape = (length, length)
  mask = (mask_lib.FullMask(shape) if half_window is None
          else mask_lib.LocalMask(shape, (half_window, half_window), offset=0))
  blocks = kernel_lib.BlockSizes(
      block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
      block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  return kernel_lib.make_splash_mha(
      mask_lib.MultiHeadMask([mask] * heads), block_sizes=blocks, head_shards=1,
      q_seq_shards=1, interpret=_backend() != 'tpu')


def _splash_mesh_specs(b: int, h: int):
  """(mesh, batch axes, head axis) to shard the kernel over (``jax.shard_map``: a Pallas
  call is a custom call XLA cannot partition), or None to call it as it is.

  The mesh is the one the step is traced under (``jax.sharding.get_abstract_mesh()``; the
  training and evaluation steps set it): rows over its ``data`` and ``fsdp`` axes and heads
  over ``tensor``, as ``sharding.LOGICAL_RULES`` lays out activations. An axis that does not
  divide its dimension is left out (the operands replicated along it, each device computing
  the same), as ``sharding.logical_to_spec`` does. None without a mesh, on one device, or
  inside a ``shard_map`` (manual axes: the caller has already split the operands)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or mesh.manual_axes:
    return None
  sizes = dict(mesh.shape)
  batch = tuple(a for a in _BATCH_AXES if sizes.get(a, 1) > 1)
  if b % math.prod(sizes[a] for a in batch):
    batch = ()
  head = _HEAD_AXIS if sizes.get(_HEAD_AXIS, 1) > 1 and h % sizes[_HEAD_AXIS] == 0 else None
  return mesh, batch or None, head


def splash_placeable() -> bool:
  """Whether :func:`splash_dot_product` can run in the computation being traced.

  On a TPU the kernel is a Mosaic custom call, which XLA cannot partition: under a jit over
  several devices it must sit in a ``shard_map``, which needs the mesh in context
  (``jax.sharding.get_abstract_mesh()``; the train step, ``steps.Pieces.train_step``, and
  ``pretraining.make_eval_step`` trace their step under theirs). Without one, a process of
  one device calls the kernel directly, and a process of several cannot (the jit may span
  them all), so False: that call runs XLA's attention (one log line; e.g. the parameter
  initialisation, prediction outside the training steps). In Pallas interpret mode (off a
  TPU) the kernel is ordinary XLA operations, which XLA partitions itself: always True.
  """
  if _backend() != 'tpu' or not jax.sharding.get_abstract_mesh().empty:
    return True
  if jax.device_count() == 1:
    return True
  warn_fallback(f'Splash attention traced without a mesh in context on {jax.device_count()} '
                'TPU devices (a Mosaic kernel must be placed by shard_map over the mesh; the '
                'training and evaluation steps set it, this call did not)')
  return False


def splash_dot_product(q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, segment_ids_BxL,
                       half_window: int | None = None):
  """Scaled dot-product attention by the Pallas splash-attention kernel (TPU flash
  attention; ``jax.experimental.pallas.ops.tpu.splash_attention``).

  Bidirectional: query i reads every key j of its segment (``segment_ids_BxL[i] ==
  segment_ids_BxL[j]``), or those with ``|i - j| <= half_window`` (a local layer's sliding
  window, :func:`local_dot_product`'s band). Segments are the packed rows' document ids
  (``models.packing``: padding is document 0, so it attends to padding as there), or the key
  padding mask as 1 (real) and 0 (padding): a real query then reads exactly the real keys, as
  with the boolean mask, for any mask (holes, left padding); padded queries read the padding
  only, so their outputs differ from XLA's (which lets them read the real keys). Nothing
  reads those outputs (the losses and pooling mask them). Every query reads at least itself,
  so no softmax row is empty.

  Queries and keys must be the same rows (self-attention over one sequence); the callers
  run XLA's attention for queries at some rows. The length is padded to a multiple of 128
  (:func:`splash_block`) with a segment id of its own, and cut off again. Splash does not
  scale the logits: the queries are scaled by 1/sqrt(D) first (in float32, then the
  activations' dtype). Under a mesh the kernel runs in a ``jax.shard_map`` (rows over
  ``data``/``fsdp``, heads over ``tensor``, :func:`_splash_mesh_specs`), and is vmapped over
  the rows it holds.
  """
  b, length, h, d = q_BxLxHxD.shape
  padded, block = splash_block(length)
  pad = padded - length
  q_BxLxHxD = (q_BxLxHxD.astype(jnp.float32) / jnp.sqrt(jnp.float32(d))).astype(q_BxLxHxD.dtype)
  heads_first = lambda x_BxLxHxD: jnp.pad(
      x_BxLxHxD, ((0, 0), (0, pad), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
  q_BxHxPxD, k_BxHxPxD, v_BxHxPxD = map(heads_first, (q_BxLxHxD, k_BxLxHxD, v_BxLxHxD))
  segment_ids_BxP = jnp.pad(jnp.broadcast_to(segment_ids_BxL, (b, length)).astype(jnp.int32),
                            ((0, 0), (0, pad)), constant_values=_SPLASH_PADDING)

  def attend(q_BxHxPxD, k_BxHxPxD, v_BxHxPxD, segment_ids_BxP):
    kernel = _splash_kernel(q_BxHxPxD.shape[1], padded, block, half_window)
    segment_ids = _splash_modules()[0].SegmentIds
    one = lambda q, k, v, ids: kernel(q, k, v, segment_ids=segment_ids(ids, ids))
    return jax.vmap(one)(q_BxHxPxD, k_BxHxPxD, v_BxHxPxD, segment_ids_BxP)

  specs = _splash_mesh_specs(b, h)
  if specs is not None:
    mesh, batch, head = specs
    rows = jax.sharding.PartitionSpec(batch, head, None, None)
    attend = jax.shard_map(attend, mesh=mesh, check_vma=False, out_specs=rows,
                           in_specs=(rows, rows, rows, jax.sharding.PartitionSpec(batch, None)))
  a_BxHxPxD = attend(q_BxHxPxD, k_BxHxPxD, v_BxHxPxD, segment_ids_BxP)
  return a_BxHxPxD.transpose(0, 2, 1, 3)[:, :length]


def band_mask(q_positions_BxL, k_positions_BxS, half_window: int):
  """bool [B, 1, L, S]: key within ``half_window`` positions of the query (either side)."""
  distance_BxLxS = q_positions_BxL[:, :, None] - k_positions_BxS[:, None, :]
  return (jnp.abs(distance_BxLxS) <= half_window)[:, None]


def local_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, half_window: int, *,
                      dropout_rate: float = 0.0, dropout_rng=None, query_positions_BxL=None,
                      documents_BxS=None):
  """Sliding-window attention: query i reads the keys j with ``|i - j| <= half_window``
  (and the key padding mask), the rest of the sequence masked out.

  Computed band by band (:func:`banded_dot_product`): memory and work linear in the
  length, ``L * 3 * half_window`` scores a head instead of ``L^2``. Queries at some rows of
  the keys' sequence (``query_positions_BxL``: the last layer at the rows a loss reads),
  and sequences that are no longer than the three blocks a band spans, take the masked
  dense path (:func:`explicit_dot_product` with the band in the mask): the same values.
  Packed rows: ``documents_BxS`` (the keys' document ids) keeps the band inside each
  document (the banded path), and ``mask`` is then their [B, 1, L, S] mask (the dense one).
  """
  length = k_BxSxHxD.shape[1]
  if query_positions_BxL is None and length > 3 * max(half_window, 1):
    return banded_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xS, half_window,
                              dropout_rate=dropout_rate, dropout_rng=dropout_rng,
                              documents_BxL=documents_BxS)
  b = q_BxLxHxD.shape[0]
  if query_positions_BxL is None:
    query_positions_BxL = jnp.broadcast_to(jnp.arange(q_BxLxHxD.shape[1]), (b, length))
  band_Bx1xLxS = band_mask(query_positions_BxL, jnp.broadcast_to(jnp.arange(length), (b, length)),
                           half_window)
  return explicit_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD,
                              jnp.logical_and(mask_Bx1x1xS.astype(bool), band_Bx1xLxS),
                              dropout_rate=dropout_rate, dropout_rng=dropout_rng)


def banded_dot_product(q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, mask_Bx1x1xL, half_window: int, *,
                       dropout_rate: float = 0.0, dropout_rng=None, documents_BxL=None):
  """:func:`local_dot_product` in blocks of ``C = half_window`` rows: block n of the
  queries attends to key blocks n - 1, n, n + 1 ([C, 3C] scores, which hold every key of
  its rows' bands), the band and the padding masked inside them. The sequence is padded to
  a multiple of C (padded keys masked, padded queries dropped). Softmax in float32.
  ``documents_BxL`` (packed rows): a key must be in the query's document instead of
  real (``models.packing``; the padding mask is then not read)."""
  b, length, h, d = q_BxLxHxD.shape
  c = max(half_window, 1)
  n = -(-length // c)
  pad = n * c - length
  q_BxNxCxHxD = jnp.pad(q_BxLxHxD, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, n, c, h, d)

  def windows(x, fill):  # [B, L, ...] -> [B, N, 3C, ...]: blocks n-1, n, n+1 of each block n.
    widths = ((0, 0), (c, pad + c)) + ((0, 0),) * (x.ndim - 2)
    blocks = jnp.pad(x, widths, constant_values=fill).reshape(b, n + 2, c, *x.shape[2:])
    return jnp.concatenate([blocks[:, :-2], blocks[:, 1:-1], blocks[:, 2:]], axis=2)

  k_BxNx3CxHxD, v_BxNx3CxHxD = windows(k_BxLxHxD, 0), windows(v_BxLxHxD, 0)
  # Query row i of a block sits at c + i among its 3C keys' positions.
  distance_Cx3C = jnp.arange(3 * c)[None, :] - (c + jnp.arange(c))[:, None]
  band_Cx3C = jnp.abs(distance_Cx3C) <= half_window
  if documents_BxL is None:
    key_mask_BxNx3C = windows(mask_Bx1x1xL[:, 0, 0, :].astype(bool), False)
    allowed_BxNx1xCx3C = band_Cx3C[None, None, None] & key_mask_BxNx3C[:, :, None, None, :]
  else:  # Same document (padded keys -1 and padded queries -2 match nothing).
    k_documents_BxNx3C = windows(documents_BxL, -1)
    q_documents_BxNxC = jnp.pad(documents_BxL, ((0, 0), (0, pad)),
                                constant_values=-2).reshape(b, n, c)
    same_BxNxCx3C = q_documents_BxNxC[..., :, None] == k_documents_BxNx3C[..., None, :]
    allowed_BxNx1xCx3C = band_Cx3C[None, None, None] & same_BxNxCx3C[:, :, None]
  logits_BxNxHxCx3C = jnp.einsum('bnqhd,bnkhd->bnhqk', q_BxNxCxHxD, k_BxNx3CxHxD,
                                 preferred_element_type=jnp.float32)
  logits_BxNxHxCx3C = logits_BxNxHxCx3C / jnp.sqrt(jnp.float32(d))
  logits_BxNxHxCx3C = jnp.where(allowed_BxNx1xCx3C, logits_BxNxHxCx3C,
                                jnp.finfo(jnp.float32).min)
  probs_BxNxHxCx3C = jax.nn.softmax(logits_BxNxHxCx3C, axis=-1)
  if dropout_rate > 0.0 and dropout_rng is not None:
    probs_BxNxHxCx3C = layers.dropout(probs_BxNxHxCx3C, dropout_rate, dropout_rng)
  a_BxNxCxHxD = jnp.einsum('bnhqk,bnkhd->bnqhd', probs_BxNxHxCx3C.astype(v_BxLxHxD.dtype),
                           v_BxNx3CxHxD)
  return a_BxNxCxHxD.reshape(b, n * c, h, d)[:, :length]


def per_layer(c, layer, core: Callable[..., Any], *operands):
  """``core(local, *operands)`` for layer ``layer`` of the stack: ``local`` (a Python bool,
  so each variant is traced with its own static window and RoPE base) is whether the
  layer attends within the sliding window (``config.model.local_attention`` on the layers
  ``global_attn_every_n_layers`` does not make global).

  ``layer`` is a Python int where the caller knows it (a loop over layers, the last layer
  at some rows), or the traced index of the layer scan: there both variants are compiled
  once and ``jax.lax.cond`` runs the layer's (one scan body for alternating layers, the
  stacked parameters unchanged), unless ``c.scanned_attention`` names one kind for every
  scanned layer (a cost count's program: no conditional).
  """
  if not c.has_local_layers:
    return core(False, *operands)
  if layer is None:
    raise ValueError('config.model.local_attention: the attention was called without its '
                     "layer index (context['layer']), so it cannot tell local from global")
  if isinstance(layer, int):
    return core(not c.layer_is_global(layer), *operands)
  if c.scanned_attention != 'by_layer':
    return core(c.scanned_attention == 'local', *operands)
  return jax.lax.cond(c.layer_is_global(layer), functools.partial(core, False),
                      functools.partial(core, True), *operands)


def rotate(x_BxLxHxD, positions_BxL, theta: float):
  """Rotary position embedding (RoPE; Su et al. 2021) in the rotate-half layout of Hugging
  Face's RoFormer-derived models (ModernBERT, Llama): dimension i pairs with i + D/2, each
  pair turned by the angle ``position * theta^(-2i/D)``; computed in float32."""
  d = x_BxLxHxD.shape[-1]
  if d % 2:
    raise ValueError(f'Rotary positions need an even head size; got {d} '
                     '(config.model.hidden_size / num_heads)')
  inverse_D2 = theta ** -(jnp.arange(0, d, 2, dtype=jnp.float32) / d)
  angle_BxLx1xD2 = positions_BxL.astype(jnp.float32)[..., None, None] * inverse_D2
  cos, sin = jnp.cos(angle_BxLx1xD2), jnp.sin(angle_BxLx1xD2)
  x = x_BxLxHxD.astype(jnp.float32)
  x1, x2 = x[..., :d // 2], x[..., d // 2:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x_BxLxHxD.dtype)


class DotProductAttention(nn.Module):
  """Multi-head self-attention: q/k/v projections with a head axis, output projection.

  ``config.fused_qkv``: one projection ``qkv`` [embed, 3, heads, kv] instead of three.
  ``config.rotary``: queries and keys turned by their positions (:func:`rotate`); the
  queries' positions are ``context['query_positions']`` [B, L] when the queries are some
  rows of the keys' sequence (the last layer at the predicted rows), else 0..L-1.
  ``config.local_attention``: the layers that are not global attend within the sliding
  window (:func:`local_dot_product`) with their own RoPE base (``local_rope_theta``); which
  layer this is comes from ``context['layer']`` (:func:`per_layer`).
  Packed rows (``context['document_ids']`` and ``['positions']`` of the keys, from
  ``models.packing.context``): attention within each document only (the window on top),
  and RoPE at the positions within the document.

  ``config.attention_implementation`` resolving to 'splash' (None on a TPU): every
  attention of the layers, global and local, packed or padded, is
  :func:`splash_dot_product` (segment ids: the documents, or the padding mask as 1/0; the
  window as its local mask), except where the kernel cannot serve, which runs XLA's
  attention instead: queries at some rows of the keys (``query_positions``, ``kv_states``
  of another length: the last layer at the predicted rows, a few queries, cheap), a mask
  with a row per query given by the caller, attention dropout in training (splash has
  none; one log line says so), and a trace on several TPU devices without the mesh in
  context (:func:`splash_placeable`; one log line).
  """
  packed_rows = True  # Reads the packed rows' context (see ModelKind.packed_rows).
  config: Any  # models.config.EncoderConfig
  deterministic: bool

  def _project(self, x_BxLxE, kv_BxSxE):
    """(q, k, v) [B, *, H, D]: keys and values from ``kv_BxSxE`` (x itself, or all rows
    when the queries are some of them)."""
    c, dt = self.config, self.config.jnp_dtype
    h, d, e = c.num_heads, c.head_dim, c.hidden_size
    if not c.fused_qkv:
      qkv = lambda n: layers.Dense((e,), (h, d), ('embed',), ('heads', 'kv'),
                                   c.initializer_range, dt, use_bias=c.dense_bias, name=n)
      return qkv('query')(x_BxLxE), qkv('key')(kv_BxSxE), qkv('value')(kv_BxSxE)
    specs = (('kernel', layers.truncated_normal(c.initializer_range), (e, 3, h, d),
              ('embed', None, 'heads', 'kv')),)
    if c.dense_bias:
      specs += (('bias', nn.initializers.zeros, (3, h, d), (None, 'heads', 'kv')),)
    p = layers.ParamGroup(specs, name='qkv')()
    bias = p.get('bias')
    if kv_BxSxE is x_BxLxE:
      qkv_BxLx3xHxD = layers.dense(x_BxLxE, p['kernel'], bias, 1, dt)
      return tuple(qkv_BxLx3xHxD[:, :, i] for i in range(3))
    q_BxLxHxD = layers.dense(x_BxLxE, p['kernel'][:, 0], None if bias is None else bias[0], 1, dt)
    kv_BxSx2xHxD = layers.dense(kv_BxSxE, p['kernel'][:, 1:],
                                None if bias is None else bias[1:], 1, dt)
    return q_BxLxHxD, kv_BxSx2xHxD[:, :, 0], kv_BxSx2xHxD[:, :, 1]

  @nn.compact
  def __call__(self, x_BxLxE, mask_Bx1x1xL, context: dict[str, Any] | None = None):
    # Keys and values from context['kv_states'] [B, S, E] when given (queries at a subset
    # of the rows, e.g. the last layer at the predicted positions), else from x.
    context = context or {}
    kv_BxSxE = context.get('kv_states', x_BxLxE)
    c, dt = self.config, self.config.jnp_dtype
    h, d, e = c.num_heads, c.head_dim, c.hidden_size
    q_BxLxHxD, k_BxSxHxD, v_BxSxHxD = self._project(x_BxLxE, kv_BxSxE)
    b, s = x_BxLxE.shape[0], kv_BxSxE.shape[1]
    q_positions = context.get('query_positions')
    use_dropout = not self.deterministic and c.attention_dropout_rate > 0
    if use_dropout and c.attention_implementation == 'cudnn':
      raise ValueError(
          "config.model.attention_implementation='cudnn' has no attention dropout, and "
          f'config.model.attention_dropout_rate={c.attention_dropout_rate} asks for it in '
          "training: set attention_dropout_rate=0, or attention_implementation None/'xla' "
          '(dropout then runs the explicit softmax).')
    rate = c.attention_dropout_rate if use_dropout else 0.0
    dropout_rng = self.make_rng('dropout') if use_dropout else None

    documents_BxS = context.get('document_ids')  # Packed rows: the keys' documents.
    splash = (c.attention_implementation in (None, 'splash')
              and resolve_implementation(c.attention_implementation, dt) == 'splash'
              and q_positions is None and q_BxLxHxD.shape[1] == s
              and (documents_BxS is not None or mask_Bx1x1xL.shape[-2] == 1))
    if splash and use_dropout:
      splash = False
      warn_fallback(f'Splash attention (config.model.attention_implementation='
                    f'{c.attention_implementation!r}) has no attention dropout, and '
                    f'config.model.attention_dropout_rate={c.attention_dropout_rate} asks for '
                    'it in training (set it to 0 to run the kernel)')
    splash = splash and splash_placeable()
    if splash:  # Segment ids: the documents, or the padding mask as 1 (real) / 0 (padding).
      segments_BxS = (documents_BxS if documents_BxS is not None else jnp.broadcast_to(
          mask_Bx1x1xL[:, 0, 0, :] != 0, (b, s)).astype(jnp.int32))
    if documents_BxS is not None:
      mask_Bx1x1xL = packing.same_document(packing.at_rows(documents_BxS, q_positions),
                                           documents_BxS)  # [B, 1, L, S]

    def core(local, q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xL, q_positions, rng):
      if c.rotary:
        theta = c.local_theta if local else c.rope_theta
        k_rope_BxS = context.get('positions', jnp.broadcast_to(jnp.arange(s), (b, s)))
        q_rope_BxL = packing.at_rows(k_rope_BxS, q_positions)  # Queries: at their rows.
        q_BxLxHxD = rotate(q_BxLxHxD, q_rope_BxL, theta)
        k_BxSxHxD = rotate(k_BxSxHxD, k_rope_BxS, theta)
      if splash:
        return splash_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, segments_BxS,
                                  c.half_window if local else None)
      if local:
        return local_dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xL, c.half_window,
                                 dropout_rate=rate, dropout_rng=rng,
                                 query_positions_BxL=q_positions, documents_BxS=documents_BxS)
      return dot_product(q_BxLxHxD, k_BxSxHxD, v_BxSxHxD, mask_Bx1x1xL, dropout_rate=rate,
                         dropout_rng=rng, implementation=c.attention_implementation)

    a_BxLxHxD = per_layer(c, context.get('layer'), core, q_BxLxHxD, k_BxSxHxD, v_BxSxHxD,
                          mask_Bx1x1xL, q_positions, dropout_rng)
    return layers.Dense((h, d), (e,), ('heads', 'kv'), ('embed',), c.initializer_range, dt,
                        use_bias=c.dense_bias, name='attention_output')(a_BxLxHxD)
