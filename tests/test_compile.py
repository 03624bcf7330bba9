"""Compiling for a TPU slice on this CPU host (``encoder_jax.tpu.aot``, ``python -m
encoder_jax.compile``): libtpu's compiler sees the run's own train and eval steps of a tiny
config on the smallest multi-chip v5e slice, and on two such slices; the figures it prints
are the compiled program's (HBM within the compiler's limit, the gradient all-reduce with at
least the parameters' bytes, XLA's FLOPs beside the formula); an oversized batch is the one
line ``does not fit`` (exit 1); a slice libtpu refuses is one ``error:`` line. A stack of
local and global layers (ModernBERT) counts each layer as its own kind, not as the
conditional that selects it. The HLO collective counter is checked on a hand-written
module (loops count their trip count).

The compiles are most of this file's CPU (several seconds each, which go with the
program's ops far more than with its sizes), so the tiny config runs without hidden
dropout (its random bits took about a sixth of a train step's compile, and no figure
checked here depends on them), and a program compiled again in this module (the same lowered text) is the one
compiled before (``compiled_once``).
"""

from __future__ import annotations

import importlib.util
import logging

import jax
import pytest

from encoder_jax.tpu import aot
from encoder_jax.tpu import fitting
from encoder_jax.tpu import flop_count
from encoder_jax.tpu import programs
from encoder_jax.tpu import summary
from encoder_jax.core import chips
from encoder_jax.tpu import hlo
from encoder_jax.models import modernbert

import support
from support import in_process


REPO = support.ROOT
TINY = support.TINY_CONFIG
SLICE = 'v5e:2x2'  # The smallest v5e slice libtpu lays out here (its host bounds are 2x2).

pytestmark = [
    pytest.mark.any_device_count,
    pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                       reason="libtpu (pip install 'encoder_jax[tpu]') is not installed"),
    # One worker under -n: the module's fixtures and compiled programs are computed once.
    pytest.mark.xdist_group('compile'),
]


def _tiny(**train):
  """The tiny config's second phase alone, without hidden dropout (its attention dropout
  keeps the train step's attention XLA's, and the eval step's the splash kernel)."""
  spec = importlib.util.spec_from_file_location('tiny_config', TINY)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.train.update(seq_lens=(64,), max_predictions=(10,), phase_fractions=(1.0,), **train)
  c.model.hidden_dropout_rate = 0.0
  return c


@pytest.fixture(scope='module', autouse=True)
def compiled_once():
  """Within this module, a program already compiled for the slice (the same lowered text:
  its ops, shapes, shardings and mesh) is not compiled again: ``one_slice``'s train step
  is also the whole unrolled stack of the FLOP test and --fit's first try. Failures are not
  kept (a refusal is compiled each time)."""
  real, done = programs.tpu_compile, {}

  def tpu_compile(lowered):
    key = lowered.as_text()
    if key not in done:
      done[key] = real(lowered)
    return done[key]

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(programs, 'tpu_compile', tpu_compile)
    yield done


@pytest.fixture(scope='module')
def one_slice():
  """The tiny config's phase on one v5e:2x2 slice: train, eval and the unrolled program.
  Its layers are unrolled (``model.scan_unroll=0``): its train step is the whole unrolled
  stack whose FLOPs the count at 2 and 3 layers extends to (``compiled_once``)."""
  devices = programs.topology_devices(SLICE)
  config = _tiny()
  config.model.update(num_layers=4, scan_unroll=0)  # FLOPs: 2 and 3 layers, extended to 4.
  target = programs.build(config, devices)
  return target, aot.compile_phase(target, target.phases[0])


def test_a_tiny_config_compiles_for_a_v5e_slice_with_its_figures(one_slice):
  target, r = one_slice
  assert len(target.devices) == 4 and target.devices[0].platform == 'tpu'
  assert chips.by_device_kind(target.devices[0].device_kind).name == 'v5e'
  assert dict(target.mesh.shape) == {'data': 4, 'fsdp': 1, 'tensor': 1}
  assert r.fits and r.train.fits and r.eval.fits
  # The compiler's own limit, a little under the 16 GB datasheet figure.
  assert 15 * programs.GIB < r.train.hbm_limit < 16 * programs.GIB
  assert 0 < r.train.temporaries < r.train.total < r.train.hbm_limit
  params = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(
      jax.eval_shape(target.objective.init, jax.random.key(0))))
  # State = params + two AdamW moments, replicated over data: 3x the params on every chip.
  assert r.train.state == pytest.approx(3 * params, rel=0.01)
  # Data parallelism: the gradients (at least the parameters' bytes) are all-reduced.
  count, reduced = r.train.collectives['all-reduce']
  assert count >= 1 and reduced >= params
  assert 'all-reduce' not in r.eval.collectives or r.eval.collectives['all-reduce'][1] < params
  # XLA's count (layers unrolled) is above the formula's model FLOPs: at this width, by the
  # softmax, LayerNorm, loss and optimizer work the formula leaves out.
  assert 1.0 < r.flops_ratio < 1.5, r.flops_ratio
  roof = r.roofline()
  assert roof['step_s'] == max(roof['compute_s'], roof['memory_s']) > 0
  assert roof['tokens_per_s'] == pytest.approx(8 * 64 / roof['step_s'])
  assert 0 < roof['mfu'] < 1


def test_the_flop_count_extended_by_layers_equals_the_whole_unrolled_stack(one_slice):
  target, r = one_slice
  assert flop_count.layer_period(target.config) == 1
  flops, accessed = flop_count._unrolled(target, target.phases[0], 4)  # All four layers compiled.
  # The same program per layer; the compiler's fusion choices differ by a few ops.
  assert r.xla_flops == pytest.approx(flops, rel=1e-3)
  assert r.xla_bytes == pytest.approx(accessed, rel=1e-2)


def test_the_whole_stack_count_is_the_unrolled_stacks_own(one_slice):
  """``--whole_stack``: the figures are the 4-layer unrolled program's, not extended from 2
  and 3 layers, and the report says which."""
  target, r = one_slice
  whole = aot.compile_phase(target, target.phases[0], with_eval=False, whole_stack=True)
  flops, accessed = flop_count._unrolled(target, target.phases[0], 4)
  assert (whole.xla_flops, whole.xla_bytes) == (flops, accessed)
  assert whole.whole_stack and not r.whole_stack
  assert 'the whole stack unrolled' in '\n'.join(summary.report_lines(whole))
  assert 'extrapolated from 2 and 3' in '\n'.join(summary.report_lines(r))
  assert summary.as_json(whole)['whole_stack'] is True


@pytest.fixture(scope='module')
def local_layers():
  """A tiny ModernBERT stack for the same slice: 4 layers, every other one global (the
  scan's layers 0 and 2 global, 1 local; the last, 3, local), a 16-token window at 128
  tokens, XLA attention (counted); with the unrolled programs' counts memoized."""
  devices = programs.topology_devices(SLICE)
  config = _tiny()
  config.model.update(modernbert.PUBLISHED)
  config.model.update(num_layers=4, local_attention=16, global_attn_every_n_layers=2,
                      max_position_embeddings=128, attention_implementation='xla')
  config.objective.names = ('mlm',)
  config.data.pair_kind = 'full_sentences'
  config.train.seq_lens = (128,)
  target = programs.build(config, devices)
  counts = {}
  real = flop_count._unrolled

  def unrolled(s, phase, num_layers, attention=None, scanned=None):
    key = (num_layers, attention, scanned)  # One target and phase here.
    if key not in counts:
      counts[key] = real(s, phase, num_layers, attention, scanned)
    return counts[key]

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(flop_count, '_unrolled', unrolled)
    flops, _ = flop_count.unrolled_cost(target, target.phases[0], kernels=False)
    costs = flop_count.layer_costs(
        target, lambda n, kind: unrolled(target, target.phases[0], n, None, kind))
  return target, flops, costs, counts


@pytest.mark.slow  # TPU compiles of a ModernBERT stack: one per layer kind and depth.
def test_local_layers_are_counted_as_local_not_as_the_conditional(local_layers):
  """XLA counts a conditional as its costliest branch: the run's scan (local or global by
  ``lax.cond`` on the layer index) counts every layer as global. The count takes each kind
  from a scan of that kind alone, so the local layers save what the formula says, and the
  step's FLOPs are within the margin of the all-global tiny model (softmax, LayerNorm,
  loss and optimizer work the formula leaves out)."""
  target, flops, costs, counts = local_layers
  phase, c = target.phases[0], target.config
  assert flop_count.layer_kinds(c) == (2, 1) and flop_count.has_local_layers(c)
  # The cause: the run's own program (the conditional) counts its local scanned layer
  # (layer 1 of 0-2) as a global one.
  conditional, _ = flop_count._unrolled(target, phase, 4)
  assert conditional == pytest.approx(costs.total(3, 0)[0], rel=0.01)
  # A global layer costs more than a local one by the formula's attention difference:
  # 12 d (s - keys) FLOPs a token, keys = 17 in the window (XLA's bands compute 24).
  per_chip = int(c.train.batch_size) // len(target.devices)
  saved = 12 * c.model.hidden_size * (128 - 17) * 128 * per_chip
  assert costs.global_layer[0] - costs.local_layer[0] == pytest.approx(saved, rel=0.05)
  assert flops == pytest.approx(costs.total(2, 1)[0])
  formula = target.objective.flops_per_sequence(phase) * int(c.train.batch_size)
  ratio = flops * len(target.devices) / formula
  assert 1.0 < ratio < 1.2, ratio  # 1.30 when the local layer is counted as global.


def test_two_slices_put_the_data_axis_across_them():
  devices = programs.topology_devices(SLICE, slices=2)
  assert sorted({d.slice_index for d in devices}) == [0, 1]
  config = _tiny()
  config.mesh.update(data=-1, dcn_data=2)
  config.model.num_layers = 1  # The layout and the gradients' all-reduce: any depth.
  target = programs.build(config, devices)
  assert dict(target.mesh.shape) == {'data': 8, 'fsdp': 1, 'tensor': 1}
  # Neighbours along the data axis inside a slice share it; the last half is slice 1.
  layout = target.mesh.devices.reshape(-1)
  assert {d.slice_index for d in layout[:4]} == {0} and {d.slice_index for d in layout[4:]} == {1}
  r = aot.compile_phase(target, target.phases[0], with_eval=False, with_flops=False)
  assert r.train.fits and r.train.collectives['all-reduce'][0] >= 1


def test_an_oversized_model_is_a_one_line_verdict():
  """A 40M-row position embedding: its params and AdamW moments alone (14 GiB a chip) leave
  no room; the compiler's refusal is the verdict, with its figures, and the advice. (Rows
  of positions, not of the vocabulary: the masking's vocabulary tables would make the
  program's constants as large, and its compile twice as long. One layer: the compiler
  refuses the embedding at any depth, and a shallower program sooner.)"""
  config = _tiny()
  config.model.update(max_position_embeddings=40_000_000, num_layers=1)
  big = programs.build(config, programs.topology_devices(SLICE))
  r = aot.compile_phase(big, big.phases[0], with_eval=False, with_flops=False)
  assert not r.fits and r.train.refusal and r.train.total > r.train.hbm_limit
  lines = summary.report_lines(r)
  verdicts = [line for line in lines if 'train step:' in line]
  assert len(verdicts) == 1 and 'does not fit' in verdicts[0], lines
  assert 'exceeds available HBM' in verdicts[0], verdicts[0]
  assert '--fit' in lines[-1]


# ml_collections loads the config file with importlib's deprecated load_module().
@pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')
def test_a_slice_libtpu_refuses_is_one_error_line(capsys):
  """``python -m encoder_jax.compile`` on the tiny config (in this process)."""
  proc = in_process.command(capsys, 'compile', f'--config={TINY}', '--topology=v5e:3x3')
  errors = [line for line in proc.stderr.splitlines() if line.startswith('error: ')]
  assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
  assert "--topology='v5e:3x3'" in errors[0] and 'libtpu refuses' in errors[0]
  assert 'Traceback' not in proc.stderr


def test_fit_finds_the_smallest_accumulation_that_fits(one_slice, monkeypatch, caplog):
  """With the compiler's limit lowered just under the whole batch's program, --fit's
  search lands on two micro-batches (the batch of 8 over 4 chips allows 1 or 2)."""
  target, whole = one_slice
  config = target.config
  assert fitting.accumulation_choices(config, target.mesh) == [1, 2]
  monkeypatch.setitem(programs._HBM_LIMITS, target.devices[0].device_kind, whole.train.total - 1)
  caplog.set_level(logging.DEBUG, logger='jax._src.compilation_cache')
  found = fitting.fit(config, target.devices, 0, remats=(False,))
  # No TPU program is written to the persistent compilation cache (the suite's, every
  # program kept): this host could not read it back (each read an error warning).
  written = [r.getMessage() for r in caplog.records if r.getMessage().startswith('Writing')]
  assert not written, written
  assert [(a, ok) for a, _, ok, _ in found.tried] == [(1, False), (2, True)], found.tried
  assert found.best[:2] == (2, False) and found.best[2] < whole.train.total


HLO = """HloModule m

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %all-reduce.1 = f32[8]{0} all-reduce(%x), replica_groups={}, to_apply=%add
  %ag = (f32[4]{0}, f32[16]{0}) all-gather-start(%x), dimensions={0}
  ROOT %t = (s32[], f32[8]) tuple(%i, %all-reduce.1)
}

%cond (p: (s32[], f32[8])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[8], /*index=1*/b: f32[8]) -> f32[8] {
  %w = (s32[], f32[8]) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"12"}}
  %all-reduce.2 = bf16[1024]{0} all-reduce(%y), replica_groups={}, to_apply=%add
  ROOT %r = f32[8]{0} get-tuple-element(%w), index=1
}
"""


def test_collectives_count_a_loop_body_by_its_trip_count():
  found = hlo.collectives(HLO)
  assert found['all-reduce'] == [13.0, 12 * 32 + 2048]
  assert found['all-gather'] == [12.0, 12 * (16 + 64) / 2]


def test_the_chip_table_answers_by_topology_and_by_device_kind():
  from encoder_jax.run import metrics_log  # pylint: disable=g-import-not-at-top
  assert chips.by_name('v5e:2x4').hbm_gbytes_per_s == 819.0
  assert chips.by_device_kind('TPU v5 lite').name == 'v5e'
  assert chips.by_device_kind('TPU v5').name == 'v5p'  # Not taken for a v5e ('TPU v5 lite').
  assert chips.by_device_kind('NVIDIA H100 80GB HBM3') is None
  assert metrics_log.PEAK_TFLOPS['TPU v6 lite'] == chips.by_name('v6e').peak_bf16_tflops
  with pytest.raises(ValueError, match="'v7x'.*known: \\['v4', 'v5e', 'v5p', 'v6e'\\]"):
    chips.by_name('v7x:2x2')
