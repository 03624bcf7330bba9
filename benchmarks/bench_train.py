r"""Train-step throughput, FLOPs and memory: every encoder_jax kind beside its Hugging Face peer.

  python benchmarks/bench_train.py                      # small BERT (4 x 256), batch 32 x 128
  python benchmarks/bench_train.py --kind=xlnet         # one kind beside its HF peer
  python benchmarks/bench_train.py --kind=all           # every kind: the table
  python benchmarks/bench_train.py --kind=xlnet --profile   # where our step's time goes
  python benchmarks/bench_train.py --preset=base --dtype=bfloat16 --batch_size=256   # MFU (GPU/TPU)
  python benchmarks/bench_train.py --check_flops        # ours vs XLA: small@128, base@128, base@512
  python benchmarks/bench_train.py --compile_only --preset=base --seq_len=512 \
      --max_predictions=80 --dtype=bfloat16 --batch_size=64 [--remat]   # memory, no run

**Throughput** (the default). Both sides run a full pretraining step (forward, loss,
backward, gradient clipping, AdamW update) with dropout on, at the same model size, batch and
sequence length, in this one process, in alternating rounds (``--rounds`` x ``--steps``
steps each side, after ``--warmup``) so both see the same machine load; printed: tokens/s
(batch * seq_len / median step time) and the ratio. The peers (``HF_PEERS``): BERT
``BertForPreTraining``; RoBERTa ``RobertaForMaskedLM``; ALBERT ``AlbertForPreTraining``
(E = 128, shared layers, SOP); SpanBERT ``BertForMaskedLM`` (HF has no SBO: ours also trains
the SBO head); ELECTRA ``ElectraForMaskedLM`` (1/4-wide generator) + ``ElectraForPreTraining``
with shared embeddings, generator samples at the masked positions, MLM + 50 x RTD; DeBERTa
``DebertaForMaskedLM`` / ``DebertaV2ForMaskedLM`` (relative c2p + p2c; HF has no enhanced
mask decoder: ours also runs its 2 EMD layers); XLNet ``XLNetLMHeadModel`` with a
``perm_mask`` and a ``target_mapping`` of ``seq_len / 6`` targets (K = 6; bidirectional data
on ours). Ours draws the masks (XLNet: spans, permutation) on device and computes vocabulary
logits only at the ``max_predictions`` positions (our design); HF's MLM heads run at every
position, so for BERT a second row runs our head at every position too, for a like-for-like
view of the rest. Token ids are random: throughput does not depend on their values. On an
accelerator the same command prints model TFLOP/s and MFU (peak from ``--peak_tflops`` or
``metrics_log.PEAK_TFLOPS``); HF is skipped there unless ``--with_hf``.

**FLOPs: our formula against XLA's count** (printed after the throughput for the timed shape,
and for a table of shapes with ``--check_flops``, compile only). "ours" is what MFU divides
by: ``objectives.build(config).flops_per_sequence(phase)`` * batch, i.e. *model* FLOPs
(Kaplan et al. 2020; Chowdhery et al. 2022, PaLM App. B): forward + backward = 3x the
forward's matmuls, ``6L(4d^2 + 2d*d_ff) + 12L*s*d`` per token for the encoder at every
position (less the last layer's query side, ``6(2d^2 + 2d*d_ff) + 12s*d`` per row, at the
rows no loss reads: ``ModelKind.last_layer_rows``), plus the MLM head (transform d x d, tied decoder d x vocab) at the predicted
positions only. "XLA" is ``jax.jit(step).lower(...).compile().cost_analysis()['flops']``
for the whole compiled train step on one device: every HLO op, a dot as 2*M*N*K, an
elementwise op as one FLOP per element. So XLA also counts what the formula leaves out on
purpose, all of it small next to the matmuls at real widths: softmax, LayerNorm, GELU,
dropout masks and bias adds; the pooler and NSP head; the embedding gradient; the
gradient-norm clip and AdamW (~10-20 FLOPs per parameter); the loss. A ratio a little
above 1 (shrinking as d grows) confirms the formula; far from 1 it would not. Measured on
CPU: 1.024 small@128, 1.010 base@128, 1.013 base@512 (float32), 1.015 base@128 and
1.013 large@512 (bf16). With ``--remat`` XLA also counts the recomputed forward (1.23 for
base@128; at most ~4/3): MFU counts model FLOPs only, recomputation is overhead. XLA's
``HloCostAnalysis`` counts a while loop's body once, whatever its trip count, and the
layer stack is an ``nn.scan`` (a while loop), so the count is taken from the same step
traced with Flax's layer scan fully unrolled (same ops, no loop; 0.69 instead of 1.18 on
the 2-layer test model otherwise); the timed step is untouched.

**Memory** (``--compile_only``, alias ``--memory_only``): compiles our step for the given
shape on this backend, without running it or allocating the state, and prints
``compiled.memory_analysis()``: arguments (params + optimizer state + batch), outputs
(aliased to the donated state), temporaries (activations kept for the backward pass, the
gradients, workspace), and their peak = arguments + outputs - aliased + temporaries, against
the device's memory: ``bytes_limit`` of a GPU/TPU, or ``--device_memory_gib`` (default an H100
80GB, 79.6 GiB usable) times JAX's preallocated fraction (``XLA_PYTHON_CLIENT_MEM_FRACTION``,
default 0.75) on a CPU host. Run it on the GPU/TPU host to know before a run whether a batch
fits (it also counts the cuDNN fused-attention custom calls, ``__cudnn$fmha*``, in the
compiled HLO: 0 means XLA attention). On a CPU host the figures are the CPU compiler's
(different fusion and buffer assignment, no cuDNN), measured at 1.5-1.7x
what the step saves for its backward pass, which is printed too (the jaxpr's residuals by
dtype, the same on every backend) as the floor a GPU's peak sits above (plus state,
gradients and workspace).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from encoder_jax.models import modernbert as modernbert_kind  # pylint: disable=wrong-import-position

PRESETS = {
    'tiny': dict(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256),  # Tests.
    'small': dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    'base': dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    'large': dict(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
}
# BERT's recipe: 20 predictions per sequence at 128 tokens, 80 at 512 (15%, rounded).
PREDICTIONS = {128: 20, 512: 80}
# --kind: the network and objective beside BERT's (MLM + NSP) at the same size. XLNet:
# two-stream permutation LM (K = 6, so pass --max_predictions=21 at 128, 85 at 512),
# bidirectional data, no memory.
KINDS = {
    'bert': dict(model={}, objective={}, data={}),
    # DeBERTa: disentangled attention (k = 512 / 256 log buckets), EMD (n = 2), MLM with
    # whole-word masking (configs/deberta_base.py).
    'deberta': dict(model=dict(kind='deberta', attention_kind='disentangled',
                               position_biased_input=False, emd_layers=2, type_vocab_size=0,
                               layer_norm_eps=1e-7),
                    objective=dict(names=('mlm',), whole_word_masking=True),
                    data=dict(pair_kind='full_sentences')),
    'deberta_v2': dict(model=dict(kind='deberta_v2', attention_kind='disentangled',
                                  position_biased_input=False, emd_layers=2, type_vocab_size=0,
                                  position_buckets=256, share_att_key=True, norm_rel_ebd=True,
                                  layer_norm_eps=1e-7),
                       objective=dict(names=('mlm',), whole_word_masking=True),
                       data=dict(pair_kind='full_sentences')),
    'xlnet': dict(model=dict(kind='xlnet', type_vocab_size=3),
                  objective=dict(names=('plm',), max_ngram=5, partial_prediction_k=6,
                                 bidirectional_data=True),
                  data=dict(pair_kind='xlnet')),
    'roberta': dict(model=dict(kind='roberta', type_vocab_size=1, position_offset=2,
                               max_position_embeddings=514),
                    objective=dict(names=('mlm',)), data=dict(pair_kind='full_sentences')),
    # ALBERT: E = 128, one set of layer weights for every layer, MLM + SOP.
    'albert': dict(model=dict(kind='albert', embedding_size=128, share_layers='all',
                              activation='gelu_new'),
                   objective=dict(names=('mlm', 'sop')), data=dict(pair_kind='sop')),
    # SpanBERT: BERT's network, geometric whole-word spans (every piece a word here: the
    # ids are random), MLM + SBO, no NSP.
    'spanbert': dict(model={}, objective=dict(names=('mlm', 'sbo'), span_p=0.2,
                                              whole_word_masking=True),
                     data=dict(pair_kind='doc_sentences')),
    # ELECTRA: the preset is the discriminator (E = hidden), plus a 1/4-wide generator.
    'electra': dict(model=dict(kind='electra'),
                    objective=dict(names=('electra',), mask_token_rate=0.85,
                                   random_token_rate=0.0, generator_hidden_fraction=0.25),
                    data=dict(pair_kind='full_sentences')),
    # ModernBERT: the preset's shape with ModernBERT's blocks (pre-LN, GeGLU at the preset's
    # intermediate size, fused QKV, rotary 160k/10k, every third layer global and a
    # 128-token window on the others, no biases, no dropout), MLM at 30% (30% of seq_len
    # predictions unless --max_predictions).
    'modernbert': dict(model=dict(modernbert_kind.PUBLISHED, max_position_embeddings=8192),
                       objective=dict(names=('mlm',), mask_rate=0.3),
                       data=dict(pair_kind='full_sentences')),
}
FLOPS_SHAPES = 'small:128,base:128,base:512'
H100_GIB = 81559 / 1024  # nvidia-smi's total for an H100 80GB (SXM and PCIe).
GIB = 2.0 ** 30


def shape_args(args, **changes) -> argparse.Namespace:
  """``args`` with some fields changed (preset, seq_len, ...), max_predictions following
  seq_len by BERT's recipe unless given."""
  out = argparse.Namespace(**vars(args))
  for k, v in changes.items():
    setattr(out, k, v)
  if 'seq_len' in changes and 'max_predictions' not in changes:
    out.max_predictions = PREDICTIONS.get(out.seq_len, max(1, round(0.15 * out.seq_len)))
  return out


def build(args, devices=None):
  """Config, mesh, pretraining setup, phase and jitted train step of one shape."""
  import numpy as np

  from encoder_jax import objectives
  from encoder_jax.config import schema as config_base
  from encoder_jax.core import length_phases
  from encoder_jax.core import sharding
  from encoder_jax.run import pretraining
  from encoder_jax.objectives import masking

  c = config_base.base_config()
  c.model.update(vocab_size=args.vocab_size, dtype=args.dtype, remat=args.remat,
                 scan_unroll=getattr(args, 'scan_unroll', c.model.scan_unroll),
                 attention_dropout_rate=args.attention_dropout,
                 **PRESETS[args.preset])
  if args.attention_implementation != 'auto':
    c.model.attention_implementation = args.attention_implementation
  for section, fields in KINDS[args.kind].items():
    c[section].update(fields)
  # A size no preset has (ELECTRA-Small: 12 x 256, E = 128), after the kind's fields.
  c.model.update(getattr(args, 'model_overrides', None) or {})
  c.train.update(batch_size=args.batch_size, seq_lens=(args.seq_len,),
                 max_predictions=(args.max_predictions,), phase_fractions=(1.0,),
                 num_steps=1000)
  c.optim.warmup_steps = 10
  mesh = sharding.make_mesh(c.mesh, devices)
  phase = length_phases.phases(c.train)[0]
  v = args.vocab_size
  special = np.zeros(v, bool)
  special[:5] = True
  tables = masking.VocabTables(special, np.ones(v, bool), np.ones(v), mask_id=4)
  objective = objectives.build(c, tables)
  pieces = pretraining.pieces(c, mesh, objective)
  return argparse.Namespace(config=c, mesh=mesh, objective=objective, phase=phase, tx=pieces.tx,
                            pieces=pieces, step_fn=pieces.train_step(phase))


def host_batch(args):
  import numpy as np
  rng = np.random.RandomState(0)
  b, l, v = args.batch_size, args.seq_len, args.vocab_size
  host = dict(input_ids=rng.randint(5, v, (b, l)).astype(np.int32),
              segment_ids=(np.arange(l)[None] >= l // 2).repeat(b, 0).astype(np.int32),
              input_mask=np.ones((b, l), np.int32),
              pair_labels=rng.randint(0, 2, b).astype(np.int32))
  host['input_ids'][:, 0] = 2
  return host


def lower_step(args, devices=None):
  """(built, lowered step): traced from shapes only, nothing allocated or run."""
  import jax

  from encoder_jax.core import sharding

  built = build(args, devices)
  state = built.pieces.abstract_state()
  batch_sharding = sharding.batch_sharding(built.mesh)
  batch = {k: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharding)
           for k, x in host_batch(args).items()}
  return built, built.step_fn.lower(state, batch)


def compile_step(args, devices=None):
  """(built, compiled step): lowered from shapes only, nothing allocated or run."""
  built, lowered = lower_step(args, devices)
  return built, lowered.compile()


class _UnrolledLax:
  """``jax.lax`` as Flax's scan sees it, with every scan fully unrolled."""

  def __getattr__(self, name):
    import jax
    return getattr(jax.lax, name)

  @staticmethod
  def scan(f, init, xs=None, length=None, reverse=False, unroll=1, **kw):
    import jax
    del unroll
    return jax.lax.scan(f, init, xs, length=length, reverse=reverse, unroll=True, **kw)


@contextlib.contextmanager
def layers_unrolled():
  """Traces ``nn.scan`` and ``layers.layer_scan`` (the layer stacks) unrolled: XLA's cost
  analysis counts a loop's body once, not once per iteration. Other ``lax.scan`` calls
  are left alone."""
  import flax.core.axes_scan
  from encoder_jax.models import layers
  unrolled = lambda body, init, xs, length, unroll: _UnrolledLax.scan(body, init, xs, length)
  with mock.patch.object(flax.core.axes_scan, 'lax', _UnrolledLax()), \
       mock.patch.object(layers, 'layer_scan', unrolled):
    yield


def xla_flops(args, compiled: bool = True) -> dict:
  """Our model FLOPs per step beside XLA's count for the compiled step, on one device.
  ``compiled=False`` counts the lowered (unoptimised) step instead, without compiling it:
  the same count to within 2% on the CPU at the tests' shapes, for a fraction of the time
  (the tests' check of the formula)."""
  import jax

  with layers_unrolled():
    built, step = (compile_step if compiled else lower_step)(args, jax.devices()[:1])
  cost = step.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  ours = built.objective.flops_per_sequence(built.phase) * args.batch_size
  return dict(ours=ours, xla=float(cost['flops']), ratio=float(cost['flops']) / ours)


def _flops_line(args, f) -> str:
  return (f'  {args.kind.upper()}-{args.preset:5s} batch {args.batch_size:3d} x '
          f'{args.seq_len:3d}, '
          f'{args.max_predictions:2d} pred/seq, {args.dtype:8s}{" remat" * args.remat}: '
          f'ours {f["ours"] / 1e12:9.4f} TFLOP/step   XLA {f["xla"] / 1e12:9.4f}   '
          f'XLA/ours {f["ratio"]:.3f}')


def memory(args) -> dict:
  """``memory_analysis()`` of the compiled step (all devices of the mesh) and the budget."""
  return memory_of(compile_step(args)[1], args)


def memory_of(compiled, args) -> dict:
  """``memory(args)`` of a step already compiled (``ours_runner``'s ``info['compiled']``)."""
  import jax

  m = compiled.memory_analysis()
  out = dict(arguments=m.argument_size_in_bytes, outputs=m.output_size_in_bytes,
             aliased=m.alias_size_in_bytes, temporaries=m.temp_size_in_bytes,
             code=m.generated_code_size_in_bytes)
  out['peak'] = out['arguments'] + out['outputs'] - out['aliased'] + out['temporaries']
  # cuDNN's fused attention appears as custom calls '__cudnn$fmha...' (forward, backward).
  out['cudnn_attention_calls'] = compiled.as_text().count('__cudnn$fmha')
  device = jax.devices()[0]
  stats = device.memory_stats() if device.platform != 'cpu' else None
  if stats and stats.get('bytes_limit'):
    out['budget'], out['budget_what'] = stats['bytes_limit'], f'{device.device_kind} limit'
  else:
    fraction = float(os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION', 0.75))
    out['budget'] = args.device_memory_gib * GIB * fraction
    out['budget_what'] = (f'{args.device_memory_gib:.1f} GiB x {fraction:.2f} '
                          '(XLA_PYTHON_CLIENT_MEM_FRACTION)')
  out['devices'] = f'{jax.device_count()} x {device.device_kind}'
  return out


def saved_for_backward(args) -> dict:
  """Bytes the autodiff saves between forward and backward (the jaxpr's residuals, by
  dtype), traced from shapes on one device before any compiler sees them: the same on
  every backend, so on a CPU host a check of the compiled figure. Residuals that are the
  step's own inputs (params, batch) are left out. Uses JAX's private ``saved_residuals``
  (what ``jax.ad_checkpoint.print_saved_residuals`` prints); {} if it is gone."""
  import collections

  import jax
  import numpy as np

  try:
    from jax._src.ad_checkpoint import saved_residuals  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {}
  built = build(args, jax.devices()[:1])
  params = built.pieces.abstract_state().params
  batch = {k: jax.ShapeDtypeStruct(x.shape, x.dtype) for k, x in host_batch(args).items()}
  loss = lambda p, b: built.objective.loss_fn(p, b, jax.random.key(0), built.phase, True)[0]
  by_dtype = collections.Counter()
  for aval, source in saved_residuals(loss, params, batch):
    if 'from the argument' not in source:
      by_dtype[str(aval.dtype)] += int(np.prod(aval.shape)) * aval.dtype.itemsize
  return dict(by_dtype)


def _memory_line(args, m) -> str:
  g = lambda k: f'{m[k] / GIB:6.2f}'
  verdict = 'fits' if m['peak'] <= m['budget'] else 'DOES NOT FIT'
  return (f'  {args.kind.upper()}-{args.preset:5s} batch {args.batch_size:3d} x '
          f'{args.seq_len:3d} '
          f'{args.dtype}{" remat" * args.remat}: peak {g("peak")} GiB per device = arguments '
          f'{g("arguments")} + outputs {g("outputs")} - aliased {g("aliased")} + temporaries '
          f'{g("temporaries")}  -> {verdict} in {m["budget"] / GIB:.1f} GiB '
          f'({m["budget_what"]}) [{m["devices"]}]')


def _time_steps(run_step, steps: int, warmup: int) -> float:
  for _ in range(warmup):
    run_step()
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    run_step()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def ours_runner(args):
  """(run one train step, info): our full step on a fixed random batch."""
  import jax

  from encoder_jax.run import feeding
  from encoder_jax.core import sharding

  built = build(args)
  state = built.pieces.create_state()
  batch = feeding.to_global(host_batch(args), sharding.batch_sharding(built.mesh))
  # Compiled ahead, once: the same executable the jitted call would build, and its
  # memory_analysis() / HLO for the caller (info['compiled']) without a second compile.
  compiled = built.step_fn.lower(state, batch).compile()
  box = [state]

  def run():
    box[0], m = compiled(box[0], batch)
    jax.block_until_ready(m['loss'])

  return run, dict(flops=built.objective.flops_per_sequence(built.phase) * args.batch_size,
                   compiled=compiled)


def _ours_result(args, dt: float, info: dict) -> dict:
  import jax

  from encoder_jax.run import metrics_log as metrics
  b, l = args.batch_size, args.seq_len
  out = dict(step_s=dt, tokens_per_s=b * l / dt)
  out['tflops_per_device'] = info['flops'] / dt / 1e12 / jax.device_count()
  peak = metrics.peak_tflops_per_device(args.peak_tflops)
  if peak:
    out['mfu'] = out['tflops_per_device'] / peak
  out['device'] = f'{jax.device_count()} x {jax.devices()[0].device_kind}'
  return out


def bench_ours(args) -> dict:
  run, info = ours_runner(args)
  return _ours_result(args, _time_steps(run, args.steps, args.warmup), info)


# The Hugging Face (PyTorch) model each --kind is compared with, at the same size.
HF_PEERS = {
    'bert': 'BertForPreTraining (MLM + NSP)',
    'roberta': 'RobertaForMaskedLM',
    'albert': 'AlbertForPreTraining (MLM + SOP)',
    'spanbert': "BertForMaskedLM (SpanBERT's MLM; HF has no SBO)",
    'electra': 'ElectraForMaskedLM + ElectraForPreTraining (shared embeddings, 50 x RTD)',
    'deberta': 'DebertaForMaskedLM (no EMD)',
    'deberta_v2': 'DebertaV2ForMaskedLM (no EMD)',
    'xlnet': 'XLNetLMHeadModel (perm_mask, target_mapping)',
    'modernbert': 'ModernBertForMaskedLM (sparse_prediction, sdpa)',
}


def _hf_batch(args, torch, dev):
  """The random pretraining batch of the HF peer (fixed seed), on ``dev``: token ids, the
  masked positions, their labels, the masked ids, segments, attention mask, pair labels."""
  b, l, k = args.batch_size, args.seq_len, args.max_predictions
  g = torch.Generator().manual_seed(0)
  ids = torch.randint(5, args.vocab_size, (b, l), generator=g)
  pos = torch.rand(b, l, generator=g).argsort(1)[:, :k]
  labels = torch.full((b, l), -100)
  labels.scatter_(1, pos, ids.gather(1, pos))
  masked = ids.clone()
  masked.scatter_(1, pos, 4)
  segments = (torch.arange(l)[None] >= l // 2).long().repeat(b, 1)
  attention = torch.ones(b, l, dtype=torch.long)
  pair = torch.randint(0, 2, (b,), generator=g)
  return argparse.Namespace(**{name: t.to(dev) for name, t in dict(
      ids=ids, pos=pos, labels=labels, masked=masked, segments=segments, attention=attention,
      pair=pair).items()})


def _hf_bert_family(kind: str, tr, common: dict, t) -> tuple[list, dict]:
  """(models, inputs) of the BERT-like peers: BERT, SpanBERT, RoBERTa, ALBERT, DeBERTa."""
  mlm = dict(input_ids=t.masked, attention_mask=t.attention, labels=t.labels)
  if kind == 'bert':
    return [tr.BertForPreTraining(tr.BertConfig(**common, attn_implementation='sdpa'))], dict(
        input_ids=t.masked, token_type_ids=t.segments, attention_mask=t.attention,
        labels=t.labels, next_sentence_label=t.pair)
  if kind == 'spanbert':
    return [tr.BertForMaskedLM(tr.BertConfig(**common, attn_implementation='sdpa'))], mlm
  if kind == 'roberta':
    return [tr.RobertaForMaskedLM(tr.RobertaConfig(
        **common, max_position_embeddings=max(514, t.ids.shape[1] + 2), type_vocab_size=1,
        pad_token_id=1, attn_implementation='sdpa'))], mlm
  if kind == 'albert':
    return [tr.AlbertForPreTraining(tr.AlbertConfig(
        **common, embedding_size=128, hidden_act='gelu_new', num_hidden_groups=1,
        inner_group_num=1))], dict(input_ids=t.masked, token_type_ids=t.segments,
                                   attention_mask=t.attention, labels=t.labels,
                                   sentence_order_label=t.pair)
  cfg = dict(common, relative_attention=True, position_biased_input=False,
             max_relative_positions=-1, type_vocab_size=0, layer_norm_eps=1e-7,
             pos_att_type=['c2p', 'p2c'])
  if kind == 'deberta':
    return [tr.DebertaForMaskedLM(tr.DebertaConfig(**cfg))], mlm
  return [tr.DebertaV2ForMaskedLM(tr.DebertaV2Config(
      **cfg, position_buckets=256, share_att_key=True, norm_rel_ebd='layer_norm'))], mlm


def _hf_electra(args, tr, common: dict) -> list:
  """Discriminator and generator (a quarter as wide) sharing their embeddings."""
  d = common['hidden_size']
  gen_d = d // 4
  disc = tr.ElectraForPreTraining(tr.ElectraConfig(**common, embedding_size=d))
  gen = tr.ElectraForMaskedLM(tr.ElectraConfig(
      **dict(common, hidden_size=gen_d, num_attention_heads=max(1, gen_d // 64),
             intermediate_size=4 * gen_d), embedding_size=d))
  gen.electra.embeddings = disc.electra.embeddings  # Shared token/position/type tables.
  gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
  return [disc, gen]


def _hf_xlnet(args, tr, torch, dev, common: dict, t) -> tuple[list, dict]:
  """XLNet's LM head, the masked positions predicted through perm_mask/target_mapping."""
  b, l, k = args.batch_size, args.seq_len, args.max_predictions
  models = [tr.XLNetLMHeadModel(tr.XLNetConfig(
      vocab_size=args.vocab_size, d_model=common['hidden_size'],
      n_layer=common['num_hidden_layers'], n_head=common['num_attention_heads'],
      d_inner=common['intermediate_size'], ff_activation='gelu', attn_type='bi', bi_data=True,
      mem_len=None, dropout=0.1))]
  perm = torch.zeros(b, l, l, device=dev)
  perm.scatter_(2, t.pos[:, None, :].expand(b, l, k), 1.0)  # Targets hidden from every query.
  mapping = torch.zeros(b, k, l, device=dev)
  mapping.scatter_(2, t.pos[:, :, None], 1.0)
  return models, dict(input_ids=t.ids, token_type_ids=t.segments, attention_mask=t.attention,
                      perm_mask=perm, target_mapping=mapping, labels=t.ids.gather(1, t.pos))


def _hf_modernbert(args, tr, common: dict) -> list:
  """ModernBERT at the kind's settings; its loss reads the masked rows only (sparse)."""
  mb = dict(KINDS['modernbert']['model'], **(getattr(args, 'model_overrides', None) or {}))
  return [tr.ModernBertForMaskedLM(tr.ModernBertConfig(
      vocab_size=args.vocab_size, hidden_size=common['hidden_size'],
      num_hidden_layers=common['num_hidden_layers'],
      num_attention_heads=common['num_attention_heads'],
      intermediate_size=common['intermediate_size'], hidden_activation='gelu',
      max_position_embeddings=mb['max_position_embeddings'], norm_eps=mb['layer_norm_eps'],
      local_attention=mb['local_attention'],
      global_attn_every_n_layers=mb['global_attn_every_n_layers'],
      global_rope_theta=mb['rope_theta'], local_rope_theta=mb['local_rope_theta'],
      attention_dropout=0.0, embedding_dropout=0.0, mlp_dropout=0.0, sparse_prediction=True,
      pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3,
      attn_implementation='sdpa'))]


def _hf_models(args, tr, torch, dev, t) -> tuple[list, dict]:
  """(models, inputs) of ``args.kind``'s peer (``HF_PEERS``) at the preset's size."""
  p = PRESETS[args.preset]
  common = dict(vocab_size=args.vocab_size, hidden_size=p['hidden_size'],
                num_hidden_layers=p['num_layers'], num_attention_heads=p['num_heads'],
                intermediate_size=p['intermediate_size'],
                attention_probs_dropout_prob=args.attention_dropout)
  kind = args.kind
  if kind in ('bert', 'spanbert', 'roberta', 'albert', 'deberta', 'deberta_v2'):
    return _hf_bert_family(kind, tr, common, t)
  if kind == 'electra':
    return _hf_electra(args, tr, common), {}
  if kind == 'xlnet':
    return _hf_xlnet(args, tr, torch, dev, common, t)
  if kind == 'modernbert':
    return _hf_modernbert(args, tr, common), dict(
        input_ids=t.masked, attention_mask=t.attention, labels=t.labels)
  raise ValueError(f'no Hugging Face peer for --kind={kind}')


def hf_runner(args, device: str | None = None, autocast_dtype=None):
  """(run one train step, info): the kind's Hugging Face peer (``HF_PEERS``): forward at the
  same size and batch, loss, backward, gradient clipping and AdamW, dropout on.

  ``device``: where the model and batch live (default the CPU; 'cuda' for a GPU, where a
  step ends with a synchronize so that it is timed whole); ``autocast_dtype``: the forward
  and loss under ``torch.autocast`` in that dtype (e.g. ``torch.bfloat16``; parameters and
  AdamW stay float32, as our bf16 step's), default none (float32)."""
  from encoder_jax.core import extras
  what = f'the Hugging Face peer of --kind={args.kind} ({HF_PEERS.get(args.kind)})'
  torch = extras.require('torch', extra='peers', what=what)
  tr = extras.require('transformers', extra='peers', what=what)

  dev = torch.device(device or 'cpu')
  torch.manual_seed(0)
  torch.set_num_threads(os.cpu_count() or 1)
  t = _hf_batch(args, torch, dev)
  models, inputs = _hf_models(args, tr, torch, dev, t)
  for m in models:
    m.to(dev)
    m.train()
  params = list({id(q): q for m in models for q in m.parameters()}.values())
  opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)

  def loss_fn():
    if args.kind != 'electra':
      return models[0](**inputs).loss
    disc, gen = models
    out = gen(input_ids=t.masked, attention_mask=t.attention, labels=t.labels)
    with torch.no_grad():
      sampled = torch.distributions.Categorical(logits=out.logits.gather(
          1, t.pos[:, :, None].expand(-1, -1, out.logits.shape[-1]))).sample()
    replaced = t.ids.clone()
    replaced.scatter_(1, t.pos, sampled)
    disc_loss = disc(input_ids=replaced, attention_mask=t.attention,
                     labels=(replaced != t.ids).long()).loss
    return out.loss + 50.0 * disc_loss

  def run():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
      loss = loss_fn()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    if dev.type == 'cuda':
      torch.cuda.synchronize(dev)

  return run, dict(torch=torch.__version__, transformers=tr.__version__, peer=HF_PEERS[args.kind],
                   device=str(dev), autocast=str(autocast_dtype).replace('torch.', '')
                   if autocast_dtype is not None else None)


def bench_hf(args, device: str | None = None, autocast_dtype=None) -> dict:
  run, info = hf_runner(args, device, autocast_dtype)
  dt = _time_steps(run, args.steps, args.warmup)
  return dict(info, step_s=dt, tokens_per_s=args.batch_size * args.seq_len / dt)


def side_by_side(args) -> dict:
  """Ours and the kind's HF peer in alternating rounds (``--rounds`` x ``--steps`` steps
  each, after ``--warmup``), so both see the same machine load; medians of every step."""
  ours_run, ours_info = ours_runner(args)
  hf_run, hf_info = hf_runner(args)
  for _ in range(args.warmup):
    ours_run()
    hf_run()
  times = {'ours': [], 'hf': []}
  for _ in range(args.rounds):
    for name, run in (('ours', ours_run), ('hf', hf_run)):
      for _ in range(args.steps):
        t = time.perf_counter()
        run()
        times[name].append(time.perf_counter() - t)
  ours = _ours_result(args, statistics.median(times['ours']), ours_info)
  dt = statistics.median(times['hf'])
  hf = dict(hf_info, step_s=dt, tokens_per_s=args.batch_size * args.seq_len / dt)
  return dict(ours=ours, hf=hf, ratio=ours['tokens_per_s'] / hf['tokens_per_s'])


# Op categories of --profile, first match wins: (name, test on (HLO op name, its metadata)).
PROFILE_CATEGORIES = (
    ('matmuls', lambda name, meta: 'ynn' in name or name.startswith(('dot', 'onednn'))),
    ('dropout bits', lambda name, meta: any(w in meta for w in (
        'rng_bit_generator', 'threefry', '_bernoulli', 'random_bits'))),
    ('dropout apply', lambda name, meta: 'Dropout' in meta),
    ('layer-scan stacking', lambda name, meta: 'dynamic-update-slice' in name),
    ('zero-init broadcasts', lambda name, meta: name.startswith('wrapped_broadcast')),
    ('copies / transposes', lambda name, meta: 'copy' in name or 'transpose' in name),
    ('other elementwise', lambda name, meta: True),
)


def profile(args, top: int = 12) -> None:
  """Where our step's time goes: ``jax.profiler`` over 3 steps (XLA:CPU per-op trace
  events), each op's time summed and put in a category by its HLO name and metadata."""
  import collections
  import glob
  import gzip
  import json
  import re
  import tempfile

  import jax
  run, _ = ours_runner(args)
  run()
  run()
  directory = tempfile.mkdtemp(prefix='bench_train_profile_')
  with jax.profiler.trace(directory, create_perfetto_trace=True):
    for _ in range(3):
      run()
  hlo = compile_step(args)[1].as_text()  # The same program, for each op's metadata.
  meta = {m.group(1): m.group(2) for m in re.finditer(
      r'^\s*%(\S+) = .*?op_name="([^"]*)"', hlo, re.M)}
  (path,) = glob.glob(os.path.join(directory, '**', '*.trace.json.gz'), recursive=True)
  with gzip.open(path) as f:
    events = json.load(f)
  events = events['traceEvents'] if isinstance(events, dict) else events
  by_category, by_op = collections.Counter(), collections.Counter()
  for e in events:
    name = e.get('name', '')
    if e.get('ph') != 'X' or 'dur' not in e or name.startswith(('$', 'Thunk', 'call')):
      continue
    ms = e['dur'] / 3 / 1e3
    category = next(c for c, test in PROFILE_CATEGORIES if test(name, meta.get(name, '')))
    by_category[category] += ms
    where = re.sub(r'/while/body/closed_call|jit\(step_fn\)/', '', meta.get(name, name))
    by_op[(category, where if len(where) <= 90 else '...' + where[-87:])] += ms  # The op end.
  total = sum(by_category.values())
  print(f'Per-op time of one step, summed over threads (jax.profiler, {args.kind}): '
        f'{total:.0f} ms')
  for category, ms in by_category.most_common():
    print(f'  {category:22s} {ms:8.1f} ms  {ms / total:5.1%}')
  print(f'The {top} largest ops:')
  for (category, where), ms in by_op.most_common(top):
    print(f'  {ms:8.1f} ms  {category:20s} {where}')


def kind_args(args, kind: str) -> argparse.Namespace:
  """``args`` for one kind of ``--kind=all``: XLNet predicts ``seq_len / K`` (K = 6) targets."""
  changes = dict(kind=kind)
  if kind == 'xlnet' and not args.max_predictions_given:
    changes['max_predictions'] = args.seq_len // 6
  if kind == 'modernbert' and not args.max_predictions_given:  # 30% masking.
    changes['max_predictions'] = math.ceil(0.3 * args.seq_len)
  return shape_args(args, **changes)


def _describe(args) -> str:
  import jax
  return (f'{args.kind.upper()}-{args.preset} {PRESETS[args.preset]}, vocab {args.vocab_size}, '
          'batch '
          f'{args.batch_size} x {args.seq_len}, {args.max_predictions} predictions/seq, '
          f'{args.dtype}{", remat" * args.remat}, scan_unroll {getattr(args, "scan_unroll", 1)}, '
          f'attention {args.attention_implementation} '
          f'(dropout {args.attention_dropout}), {os.cpu_count()} CPU cores, JAX backend '
          f'{jax.default_backend()}')


def parse_args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--preset', choices=sorted(PRESETS), default='small')
  ap.add_argument('--kind', choices=sorted(KINDS) + ['all'], default='bert',
                  help='Model kind + objective beside its Hugging Face peer (HF_PEERS); all: '
                  'every kind, one table.')
  ap.add_argument('--batch_size', type=int, default=32)
  ap.add_argument('--seq_len', type=int, default=128)
  ap.add_argument('--max_predictions', type=int, default=None,
                  help='Predicted positions per sequence (default: 15%% of seq_len, 20 at '
                  '128; XLNet seq_len / 6 under --kind=all).')
  ap.add_argument('--vocab_size', type=int, default=30522)
  ap.add_argument('--dtype', default='float32')
  ap.add_argument('--remat', action='store_true')
  ap.add_argument('--scan_unroll', type=int, default=0,
                  help='config.model.scan_unroll: 0 (default here) unrolls the layer scan, the '
                  'fastest step (13-15%% on CPU); 1 is the configs\' default loop.')
  ap.add_argument('--attention_implementation', choices=('auto', 'xla', 'cudnn', 'splash'),
                  default='auto', help='config.model.attention_implementation (auto = None).')
  ap.add_argument('--attention_dropout', type=float, default=0.1,
                  help="BERT's 0.1 keeps training on the explicit softmax; 0 allows cuDNN.")
  ap.add_argument('--steps', type=int, default=10, help='Timed steps per side and round.')
  ap.add_argument('--rounds', type=int, default=3,
                  help='Alternating rounds of ours then HF (the same machine load for both).')
  ap.add_argument('--warmup', type=int, default=2)
  ap.add_argument('--peak_tflops', type=float, default=0.0)
  ap.add_argument('--with_hf', action='store_true', help='Also run HF on an accelerator host.')
  ap.add_argument('--check_flops', action='store_true',
                  help='Only print ours vs XLA FLOPs for --flops_shapes (compile only).')
  ap.add_argument('--flops_shapes', default=FLOPS_SHAPES,
                  help='preset:seq_len[:max_predictions],... for --check_flops.')
  ap.add_argument('--skip_flops_check', action='store_true',
                  help='Do not compile the unrolled step to check FLOPs after timing.')
  ap.add_argument('--profile', action='store_true',
                  help='Where our step goes: per-op time by category (XLA:CPU trace).')
  ap.add_argument('--compile_only', '--memory_only', dest='compile_only', action='store_true',
                  help='Compile the step, print its memory against the device; run nothing.')
  ap.add_argument('--device_memory_gib', type=float, default=H100_GIB,
                  help='Device memory the CPU-host estimate compares with (H100 80GB).')
  args = ap.parse_args(argv)
  args.max_predictions_given = args.max_predictions is not None
  if args.profile:  # Per-op trace events; read when JAX starts its CPU backend.
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                               ' --xla_cpu_enable_xprof_traceme=true').strip()
  if args.max_predictions is None:
    args.max_predictions = PREDICTIONS.get(args.seq_len, max(1, round(0.15 * args.seq_len)))
  if args.kind == 'all' and (args.check_flops or args.compile_only):
    ap.error('--kind=all runs the throughput table only')
  return args


def main(argv=None):
  args = parse_args(argv)
  if args.kind == 'all':
    table(args)
    return
  args = kind_args(args, args.kind)
  if args.profile:
    print(_describe(args))
    profile(args)
    return
  if args.check_flops:
    check_flops(args)
    return
  print(_describe(args))
  if args.compile_only:
    compile_only(args)
    return
  throughput(args)


def check_flops(args) -> None:
  """``--check_flops``: ours against XLA's FLOPs at every ``--flops_shapes`` shape."""
  import jax
  print(f'Model FLOPs per train step (ours: MFU formula; XLA: cost_analysis of the compiled '
        f'step, layers unrolled, 1 device), JAX backend {jax.default_backend()}:')
  for spec in args.flops_shapes.split(','):
    preset, seq_len, *pred = spec.split(':')
    changes = dict(preset=preset, seq_len=int(seq_len))
    if pred:
      changes['max_predictions'] = int(pred[0])
    shape = shape_args(args, **changes)
    print(_flops_line(shape, xla_flops(shape)), flush=True)


def compile_only(args) -> None:
  """``--compile_only``: the compiled step's memory, its attention and its residuals."""
  print('Compiled train step memory (memory_analysis), nothing run:')
  m = memory(args)
  print(_memory_line(args, m))
  print(f'  attention: {m["cudnn_attention_calls"]} cuDNN fused-attention custom calls in the '
        'compiled HLO' + ('' if m['cudnn_attention_calls'] else ' (XLA attention)'))
  saved = saved_for_backward(args)
  if saved:
    print(f'  saved for the backward pass (jaxpr residuals, any backend): '
          f'{sum(saved.values()) / GIB:.2f} GiB (' + ', '.join(
              f'{k} {v / GIB:.2f}' for k, v in sorted(saved.items(), key=lambda kv: -kv[1])
              if v >= GIB / 100) + ')')


def throughput(args) -> None:
  """Ours (beside HF on a CPU or with ``--with_hf``), then the FLOPs check."""
  import jax
  on_cpu = jax.default_backend() == 'cpu'
  if on_cpu or args.with_hf:
    r = side_by_side(args)
    ours, hf = r['ours'], r['hf']
  else:
    ours, hf = bench_ours(args), None
  print(f'encoder_jax (head at predicted positions): {ours["tokens_per_s"]:10.0f} tokens/s  '
        f'step {ours["step_s"]*1e3:8.1f} ms  {ours["tflops_per_device"]:.3f} TFLOP/s/device'
        + (f'  MFU {ours["mfu"]:.1%}' if 'mfu' in ours else '') + f'  [{ours["device"]}]',
        flush=True)
  if hf is not None:
    print(f'HF {hf["peer"]} (PyTorch): {hf["tokens_per_s"]:10.0f} tokens/s  '
          f'step {hf["step_s"]*1e3:8.1f} ms  [torch {hf["torch"]}, transformers '
          f'{hf["transformers"]}]')
    print(f'ratio ours / HF: {r["ratio"]:.2f}x (alternating rounds: {args.rounds} x '
          f'{args.steps} steps each, medians)', flush=True)
  if hf is not None and args.kind == 'bert':
    full = bench_ours(shape_args(args, max_predictions=args.seq_len))
    print(f'encoder_jax (head at all positions, as HF): {full["tokens_per_s"]:10.0f} tokens/s'
          f'  step {full["step_s"]*1e3:8.1f} ms  ({full["tokens_per_s"] / hf["tokens_per_s"]:.2f}x'
          ' HF)', flush=True)
  if not args.skip_flops_check:
    print('FLOPs check (XLA cost analysis of the compiled step vs the MFU formula):')
    print(_flops_line(args, xla_flops(args)))


def table(args) -> None:
  """``--kind=all``: every kind beside its HF peer, one Markdown table."""
  print(_describe(args).replace(args.kind.upper() + '-', ''), flush=True)
  rows = []
  for kind in KINDS:
    a = kind_args(args, kind)
    r = side_by_side(a)
    rows.append((kind, a, r))
    print(f'  {kind:10s} ours {r["ours"]["tokens_per_s"]:8.0f} tokens/s  HF '
          f'{r["hf"]["tokens_per_s"]:8.0f} tokens/s  {r["ratio"]:.2f}x', flush=True)
  print('\n| kind | predictions / seq | encoder_jax tokens/s | Hugging Face peer | HF tokens/s | '
        'ratio |\n|---|---|---|---|---|---|')
  for kind, a, r in rows:
    print(f'| {kind} | {a.max_predictions} | {r["ours"]["tokens_per_s"]:,.0f} | '
          f'{r["hf"]["peer"]} | {r["hf"]["tokens_per_s"]:,.0f} | {r["ratio"]:.2f}x |')
  worst = min(rows, key=lambda row: row[2]['ratio'])
  print(f'\nslowest against its peer: {worst[0]} at {worst[2]["ratio"]:.2f}x')


if __name__ == '__main__':
  main()
