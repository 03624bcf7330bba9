"""What a pretraining objective is, and how simple ones combine on one encoder pass.

The training loop sees a :class:`Pretraining` (what it trains, ``trainable.Trainable``,
plus what evaluation and exports read): it owns the networks (one, or several in one
params tree, e.g. ELECTRA's generator and discriminator), their initialisation, the
whole ``loss_fn(params, batch, rng, phase, train)`` (forward passes included), the
metrics and how to aggregate and report them, and the FLOPs of a training step (MFU).
It also says which network and params serve downstream use (features, fine-tuning,
fill-mask), so loading a checkpoint never needs to know the objective's internals.

Simple objectives (:class:`Objective`: MLM, NSP, SOP, SpanBERT's SBO) only corrupt the
batch and read the network's outputs; :class:`Composite` runs every one's corruption, the
network **once**, and sums the losses, so MLM + NSP is composition, not a branch in the
training loop. An objective may own a small head of its own (SBO's feed-forward network):
its parameters sit in the same tree under the objective's ``head_key``, beside the
network's, which keeps the network's layout (and its checkpoints and exports) unchanged.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax.core import length_phases
from encoder_jax.core import trainable
from encoder_jax.models import registry as models

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]

DROPOUT_RNG_IMPLS = trainable.DROPOUT_RNG_IMPLS


def cross_entropy(logits_NxC: jax.Array, labels_N: jax.Array, weights_N: jax.Array):
  """Weighted mean negative log-likelihood and accuracy (weights 0 = ignored).

  A prediction is correct when the label's logit is the largest (a tie counts as correct):
  the row maximum the log-softmax takes anyway, not an argmax over the classes (a variadic
  reduction, slow on CPU at vocabulary width). Differentiable in the logits only: labels
  and weights are data (masks), and the accuracy has no gradient.
  """
  return _cross_entropy(logits_NxC.astype(jnp.float32), labels_N, weights_N)


def _cross_entropy_parts(logits_NxC, labels_N, weights_N):
  max_N = logits_NxC.max(axis=-1)
  lse_N = max_N + jnp.log(jnp.exp(logits_NxC - max_N[..., None]).sum(axis=-1))
  label_N = jnp.take_along_axis(logits_NxC, labels_N[..., None], axis=-1)[..., 0]
  correct_N = (label_N >= max_N).astype(jnp.float32)
  denom = jnp.maximum(weights_N.sum(), 1.0)
  loss = ((lse_N - label_N) * weights_N).sum() / denom
  return (loss, (correct_N * weights_N).sum() / denom), (lse_N, weights_N / denom)


@jax.custom_vjp
def _cross_entropy(logits_NxC, labels_N, weights_N):
  return _cross_entropy_parts(logits_NxC, labels_N, weights_N)[0]


def _cross_entropy_fwd(logits_NxC, labels_N, weights_N):
  out, (lse_N, scale_N) = _cross_entropy_parts(logits_NxC, labels_N, weights_N)
  return out, (logits_NxC, labels_N, lse_N, scale_N)


def _cross_entropy_bwd(residuals, g):
  """d loss / d logits = (softmax - one_hot(label)) * weight / denominator, in one pass
  over the logits instead of autodiff's scatter into a zero array and separate passes
  (with ``layers.tied_logits``: ``benchmarks/bench_ops.py``)."""
  logits_NxC, labels_N, lse_N, scale_N = residuals
  g_N = (g[0] * scale_N)[..., None]
  classes_C = jax.lax.broadcasted_iota(jnp.int32, logits_NxC.shape, logits_NxC.ndim - 1)
  one_hot = (classes_C == labels_N.astype(jnp.int32)[..., None]).astype(jnp.float32)
  d_logits = (jnp.exp(logits_NxC - lse_N[..., None]) - one_hot) * g_N
  return d_logits, None, None


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def packed_inputs(network: models.Network, batch: Batch) -> dict[str, jax.Array]:
  """``document_ids_BxL`` for ``network`` when ``batch`` has packed rows (several documents
  per row, ``data.pair_kind='packed_documents'``), else nothing. A kind without
  ``packed_rows`` would mix the documents: refused (validation names it first)."""
  if 'document_ids' not in batch:
    return {}
  if not network.kind.packed_rows:
    raise ValueError(f'config.model.kind={network.kind.name!r} cannot read packed rows '
                     "(data.pair_kind='packed_documents'): its attention does not keep the "
                     'documents of a row apart')
  return {'document_ids_BxL': batch['document_ids']}


class Pretraining(trainable.Trainable):
  """The contract between an objective and the training loop, evaluation and loading: what
  the engine trains (``trainable.Trainable``), and what evaluation, exports and fill-mask
  read of a pretraining setup."""
  name: str = ''

  def loss_fn(self, params, batch: Batch, rng: jax.Array, phase: length_phases.Phase,
              train: bool) -> tuple[jax.Array, Metrics]:
    raise NotImplementedError

  def corruption(self, batch: Batch, rng: jax.Array, phase: length_phases.Phase) -> Batch:
    """The batch as ``loss_fn`` corrupts it with ``rng`` before the forward pass: with token
    masking, ``masked_positions`` / ``masked_weights`` [B, P] say which were selected
    (``python -m encoder_jax.show_masks`` reads it)."""
    raise ValueError(f'{type(self).__name__} selects no tokens to mask')

  def flops_per_sequence(self, phase: length_phases.Phase) -> float:
    """Training FLOPs (forward + backward) of one sequence at this phase, every network."""
    raise NotImplementedError

  def downstream(self, params) -> tuple[models.Network, Any]:
    """The network (and its params subtree) for features, fine-tuning and fill-mask."""
    raise NotImplementedError

  def masked_lm(self, params) -> tuple[models.Network, Any]:
    """The network (and params) whose MLM head fill-mask uses (ELECTRA: the generator)."""
    return self.downstream(params)

  # Subdirectories of an exported Hugging Face directory that hold more of this setup's
  # networks (``hf_exports``' keys besides ''); an import reads them back (``exported``).
  hf_export_dirs: tuple[str, ...] = ()

  def from_downstream(self, params, rng: jax.Array, exported: dict | None = None,
                      where: str = '') -> tuple[Any, list[str]]:
    """The whole (unboxed) params tree around imported downstream params (a Hugging Face
    import), and the names of the parts freshly initialised from ``rng`` because a
    checkpoint of the downstream network cannot hold them (an objective's own head,
    ELECTRA's generator). ``exported``: subdirectory -> (EncoderConfig, params) of what the
    import found in ``hf_export_dirs`` beside it (``where``: the directory, for messages)."""
    del rng, exported, where
    return params, []

  def hf_exports(self, params) -> dict[str, tuple[models.Network, Any]]:
    """What ``convert workdir_to_hf`` writes: subdirectory ('' = the top) -> (network,
    params). The downstream network alone by default; ELECTRA adds its generator."""
    return {'': self.downstream(params)}

  def report_lines(self, metrics: dict[str, float]) -> list[str]:
    """Human-readable lines for evaluation results."""
    return []


class Objective:
  """A composable head objective (``objectives.REGISTRY``): corrupts, then reads outputs."""
  name: str = ''
  metric_weights: dict[str, str] = {}
  console_metrics: tuple[tuple[str, str, str], ...] = ()  # As Pretraining.console_metrics.
  # Top-level key of this objective's own parameters in the params tree (None: it has
  # none). Composite initialises them with ``init_head`` and then calls
  # ``loss(outputs, batch, params)`` with the whole tree (the head under ``head_key``, the
  # network's parameters beside it, e.g. a tied word embedding).
  head_key: str | None = None
  # Whether ``corrupt`` selects ``masked_positions`` (phase.max_predictions per sequence).
  masks_tokens: bool = False

  def check(self, network: models.Network) -> None:
    """Raises if the network lacks an output this objective reads."""

  def init_head(self, rng: jax.Array, network: models.Network) -> Any:
    """Boxed params of this objective's head (called only when ``head_key`` is set)."""
    raise NotImplementedError

  def corrupt(self, batch: Batch, rng: jax.Array, phase: length_phases.Phase) -> Batch:
    del rng, phase
    return batch

  def gather_positions(self, batch: Batch, length: int) -> jax.Array | None:
    """Rows [B, G] of the encoder's output this objective's loss reads (besides the MLM
    head's ``masked_positions`` and the pooler's [CLS]), or None. ``Composite`` asks the
    network for them, and ``loss`` finds the states in ``outputs['gathered'][name]``
    [B, G, H]: the network's last layer then runs at the rows the losses read only."""
    del batch, length
    return None

  def gathered_rows(self, phase: length_phases.Phase) -> int:
    """How many rows ``gather_positions`` returns per sequence (for the FLOPs count)."""
    del phase
    return 0

  def loss(self, outputs: dict[str, Any], batch: Batch) -> tuple[jax.Array, Metrics]:
    raise NotImplementedError

  def head_flops_per_sequence(self, network: models.Network, phase: length_phases.Phase) -> float:
    """Training FLOPs of this objective's head for one sequence (0 if it has none)."""
    return 0.0

  def summarize(self, metrics: dict[str, float]) -> dict[str, float]:
    return {}

  def report_lines(self, metrics: dict[str, float]) -> list[str]:
    return []


class Composite(Pretraining):
  """One network, a list of simple objectives, one forward pass per step."""

  def __init__(self, objectives: list[Objective], network: models.Network,
               dropout_rng_impl: str = 'threefry'):
    super().__init__(dropout_rng_impl)
    self.objectives = objectives
    self.network = network
    self.name = '+'.join(o.name for o in objectives)
    for o in objectives:
      o.check(network)
    self.head_keys = tuple(o.head_key for o in objectives if o.head_key)
    if len(set(self.head_keys)) != len(self.head_keys):
      raise ValueError(f'config.objective.names={[o.name for o in objectives]}: two objectives '
                       f'own parameters under the same key ({self.head_keys})')

  def init(self, rng):
    params = self.network.init(rng)
    if not self.head_keys:
      return params
    params = dict(params)
    heads = [o for o in self.objectives if o.head_key]
    for i, o in enumerate(heads):  # Own keys: the network's init is the same as without heads.
      if o.head_key in params:
        raise ValueError(f'objective {o.name!r} keeps its head under {o.head_key!r}, which the '
                         f'{self.network.config.kind} network already uses')
      params[o.head_key] = o.init_head(jax.random.fold_in(rng, i + 1), self.network)
    return params

  def from_downstream(self, params, rng, exported=None, where=''):
    if not self.head_keys:
      return params, []
    heads = [o for o in self.objectives if o.head_key]
    params = dict(params)
    for i, o in enumerate(heads):  # The same keys as init uses: the same fresh values.
      params[o.head_key] = jax.tree.map(np.asarray, nn.unbox(
          o.init_head(jax.random.fold_in(rng, i + 1), self.network)))
    return params, list(self.head_keys)

  def network_params(self, params):
    """The network's own subtree (the objectives' heads left out)."""
    if not self.head_keys:
      return params
    return {k: v for k, v in params.items() if k not in self.head_keys}

  def corruption(self, batch, rng, phase):
    rngs = jax.random.split(rng, len(self.objectives) + 1)
    for objective, key in zip(self.objectives, rngs[1:]):
      batch = objective.corrupt(batch, key, phase)
    return batch

  def loss_fn(self, params, batch, rng, phase, train):
    batch = self.corruption(batch, rng, phase)
    rngs = jax.random.split(rng, len(self.objectives) + 1)
    positions = batch.get('masked_positions')
    if positions is None:  # No token-level objective: run the MLM head on one position only.
      positions = jnp.zeros((batch['input_ids'].shape[0], 1), jnp.int32)
    length = batch['input_ids'].shape[1]
    gathers = [(o.name, o.gather_positions(batch, length)) for o in self.objectives]
    gathers = [(name, g_BxG) for name, g_BxG in gathers if g_BxG is not None]
    gather_BxG = jnp.concatenate([g for _, g in gathers], axis=1) if gathers else None
    # A kind without last_layer_rows (XLNet) takes no gather positions: read them from its
    # sequence output.
    rows_kind = self.network.kind.last_layer_rows is not None
    extra = {'gather_positions_BxG': gather_BxG} if gathers and rows_kind else {}
    outputs = self.network.pretraining.apply(
        {'params': self.network_params(params)},
        batch.get('masked_input_ids', batch['input_ids']),
        batch['segment_ids'], batch['input_mask'], positions, deterministic=not train,
        rngs={'dropout': self.dropout_key(rngs[0])} if train else None, **extra,
        **packed_inputs(self.network, batch))
    if gathers and not rows_kind:
      outputs['gathered_output'] = jnp.take_along_axis(outputs['sequence_output'],
                                                       gather_BxG[..., None], axis=1)
    if gathers:  # Each objective's slice of the gathered rows.
      outputs['gathered'], start = {}, 0
      for name, g_BxG in gathers:
        outputs['gathered'][name] = outputs['gathered_output'][:, start:start + g_BxG.shape[1]]
        start += g_BxG.shape[1]
    total, metrics = jnp.float32(0.0), {}
    for objective in self.objectives:
      if objective.head_key:
        loss, m = objective.loss(outputs, batch, params)
      else:
        loss, m = objective.loss(outputs, batch)
      total = total + loss
      metrics.update(m)
    metrics['loss'] = total
    return total, metrics

  def flops_per_sequence(self, phase):
    predictions = phase.max_predictions if any(o.masks_tokens for o in self.objectives) else 1
    encoder = self.network.pretraining_flops(
        phase.seq_len, predictions, sum(o.gathered_rows(phase) for o in self.objectives))
    return float(encoder + sum(o.head_flops_per_sequence(self.network, phase)
                               for o in self.objectives))

  def downstream(self, params):
    return self.network, self.network_params(params)

  @property
  def metric_weights(self) -> dict[str, str]:  # pylint: disable=invalid-overridden-method
    return {k: v for o in self.objectives for k, v in o.metric_weights.items()}

  @property
  def console_metrics(self):  # pylint: disable=invalid-overridden-method
    return tuple(m for o in self.objectives for m in o.console_metrics)

  def summarize(self, metrics):
    return {k: v for o in self.objectives for k, v in o.summarize(metrics).items()}

  def report_lines(self, metrics):
    return [line for o in self.objectives for line in o.report_lines(metrics)]
