r"""An accelerator check that runs in one call: BERT-base throughput and MFU beside Hugging
Face, cuDNN attention against XLA's, the other kinds' MFU, and a bf16 training run killed
and resumed, with the device's particulars, in one report.

  python benchmarks/device_check.py --out=DIR              # on a GPU: under 8 minutes
  python benchmarks/device_check.py --out=DIR --dry_run    # every part at tiny shapes, CPU
  python benchmarks/device_check.py --out=DIR --dry_run --fail_part=electra_small   # (tests)

Writes ``DIR/device_check.md`` and ``DIR/device_check.json``, both rewritten after every
part, so a run cut off still leaves what it measured. Each part runs on its own: one that
fails records its error (type, message, the traceback's end) and the next one starts; one
that no longer fits in ``--budget_s`` is skipped with that reason. Each part prints its
estimate before it starts and its wall time when it ends.

Parts (``PARTS``; estimates are guesses for an H100, none measured yet):

  environment       device, driver, platform (CUDA / cuDNN), Python and package versions,
                    the attention implementation None resolves to (splash / cuDNN / XLA;
                    each run's shape names its own)
  bert_base_128     BERT-base MLM + NSP, bf16, 128 tokens x 256: tokens/s, model TFLOP/s,
                    MFU against the chip's bf16 peak (``metrics_log.PEAK_TFLOPS``), compiled and
                    process peak device memory (bench_train's step, timing and FLOPs)
  hf_bert_128       the Hugging Face peer ``BertForPreTraining`` at the same shape, in this
                    process (sdpa attention, bf16 autocast, float32 weights and AdamW, as
                    ours): tokens/s, its TFLOP/s (its head runs at every position), peak
                    memory, ours / HF (skipped, with the reason, where torch has no CUDA)
  bert_base_512     512 tokens x 64, remat only if the step does not fit without it
  hf_bert_512       its peer at 512
  train_resume      a small BERT (configs/bert_small.py, bf16) trained 200 steps on the
                    embedded corpus, three processes: uninterrupted in one workdir; in
                    another, SIGKILLed after step 110 with checkpoint 100 on disk, then the
                    same command again, which resumes from 100. Reported: the loss falling,
                    the max abs difference of every logged loss and of the final params
                    between the two workdirs (equal = 0), the steps superseded. tensorflow and
                    tensorflow_datasets are unimportable in those processes.
  attention_512     BERT-base at 512 with attention dropout 0: cuDNN fused attention
                    (``model.attention_implementation='cudnn'``) against XLA's
  electra_small     ELECTRA-Small (12 x 256, E = 128, 1/4 generator), 128 x 128: MFU
  deberta_v2_base   DeBERTa-v2-base (disentangled attention, EMD, 128K vocabulary), 512 x 32
  xlnet_base        XLNet-base (two-stream PLM, 85 targets, bidirectional data), 512 x 32
  modernbert_base   ModernBERT-base (22 x 768, GeGLU 1,152, local/global attention, 50,368
                    vocabulary), 30% masking, 1,024 tokens x 32: MFU

Timed steps reuse ``bench_train.py`` (``build``/``ours_runner``, ``_time_steps``,
``_ours_result``'s FLOPs and MFU, ``memory_of``, ``hf_runner``). On the device the process
does not preallocate GPU memory (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, unless set), so
that PyTorch has room beside JAX; the process peak is therefore what JAX's allocator held at
most so far, and the compiled peak (arguments + outputs - aliased + temporaries of the step)
is the step's own. A persistent XLA compilation cache (``JAX_COMPILATION_CACHE_DIR``, default
a directory in /tmp) serves this process and the training processes: the second and third
training runs load the first's executables, and a rerun on the same machine compiles nothing.
On a GPU the training processes also get ``--xla_gpu_deterministic_ops=true`` (dropped, with
a note, if that XLA refuses the flag), so that two runs can agree bit for bit.

``--dry_run`` runs every part on the CPU backend at tiny shapes (the 'tiny' preset, bf16,
torch on the CPU, one timed step of it; the BERT parts one program, set up once; the
training run 12 steps of a 2 x 32 model on 100 documents, killed after step 7 with
checkpoint 6): ``tests/benchmarks/test_device_check.py`` runs it. The report
gives the training command (``python -m encoder_jax.main --config=configs/bert_small.py``
and its overrides) to rerun a training run by hand. How to run the check on an accelerator
machine (the install, the wheels for one without network, the call): docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'benchmarks'))

import bench_train as bt  # pylint: disable=g-import-not-at-top,wrong-import-position

GIB = 2.0 ** 30
# Shapes of the timed parts: a GPU's, and the dry run's (CPU, tiny).
SHAPES = {
    'bert_128': dict(preset='base', seq_len=128, batch_size=256),
    'bert_512': dict(preset='base', seq_len=512, batch_size=64),
    'electra_small': dict(kind='electra', preset='small', seq_len=128, batch_size=128,
                          max_predictions=19,  # ELECTRA: int(0.155 * 128).
                          model_overrides=dict(num_layers=12, embedding_size=128)),
    'deberta_v2_base': dict(kind='deberta_v2', preset='base', seq_len=512, batch_size=32,
                            vocab_size=128_100),
    'xlnet_base': dict(kind='xlnet', preset='base', seq_len=512, batch_size=32,
                       max_predictions=85, vocab_size=32_000),
    # ModernBERT-base as published (configs/modernbert_base.py) at its pretraining length.
    'modernbert_base': dict(kind='modernbert', preset='base', seq_len=1024, batch_size=32,
                            max_predictions=308, vocab_size=50_368,  # 30% masks.
                            model_overrides=dict(num_layers=22, intermediate_size=1152)),
}
# The dry run's BERT parts are one program (XLA attention without dropout, one shape), the
# attention part's XLA side too: compiled once (the persistent cache), the same code paths.
_DRY_BERT = dict(preset='tiny', seq_len=32, batch_size=8, vocab_size=1000,
                 attention_implementation='xla', attention_dropout=0.0)
DRY_SHAPES = {
    'bert_128': _DRY_BERT,
    'bert_512': _DRY_BERT,
    'electra_small': dict(kind='electra', preset='tiny', seq_len=32, batch_size=8,
                          max_predictions=5, vocab_size=1000,
                          model_overrides=dict(embedding_size=32)),
    'deberta_v2_base': dict(kind='deberta_v2', preset='tiny', seq_len=64, batch_size=4,
                            vocab_size=1000),
    'xlnet_base': dict(kind='xlnet', preset='tiny', seq_len=64, batch_size=4,
                       max_predictions=10, vocab_size=1000),
    # A 16-token window at 64 tokens: the banded local path, not its dense fallback.
    'modernbert_base': dict(kind='modernbert', preset='tiny', seq_len=64, batch_size=4,
                            max_predictions=20, vocab_size=1000,
                            model_overrides=dict(local_attention=16)),
}
# The training part: configs/bert_small.py (2 x 128, vocabulary 8000, batch 32, 64 then 128
# tokens) in bf16, 200 steps, checkpoints at 100 and 200; killed after step 110.
TRAIN_CONFIG = 'configs/bert_small.py'
TRAIN_OVERRIDES = {'model.dtype': 'bfloat16', 'train.num_steps': 200,
                   'train.log_every_steps': 10, 'train.eval_every_steps': 100,
                   'checkpoint.every_steps': 100, 'checkpoint.keep': 2}
TRAIN_SAVE_STEP, TRAIN_KILL_STEP = 100, 110
# --dry_run: 2 x 32 on 100 documents (27K tokens: 12 steps of 8 x 64 read a quarter of them;
# preparing 300 took 2 s more of CPU, most of it training the tokenizer), 12 steps at 64
# tokens, killed after step 7.
DRY_TRAIN_OVERRIDES = dict(
    TRAIN_OVERRIDES, **{'model.vocab_size': 1000, 'model.hidden_size': 32,
                        'model.intermediate_size': 64,
                        'data.sources': 'embedded;max_documents=100', 'train.num_steps': 12,
                        'train.batch_size': 8, 'train.seq_lens': '(64,)',
                        'train.max_predictions': '(10,)', 'train.phase_fractions': '(1.0,)',
                        'train.log_every_steps': 1, 'train.eval_every_steps': 6,
                        'train.eval_batches': 2, 'optim.warmup_steps': 2,
                        'checkpoint.every_steps': 6})
DRY_SAVE_STEP, DRY_KILL_STEP = 6, 7
# What the resumed run must log exactly as the uninterrupted one (timings excepted).
COMPARED_KEYS = ('loss', 'mlm_loss', 'mlm_accuracy', 'pair_loss', 'pair_accuracy', 'grad_norm',
                 'learning_rate', 'mlm_perplexity')
# GPU flags of the training processes: XLA's scatter-adds (the embedding gradient) without
# atomics, so two runs can be compared bit for bit. Dropped if this XLA does not know it.
DETERMINISTIC_XLA_FLAG = '--xla_gpu_deterministic_ops=true'

# Python run first in a process: tensorflow and tensorflow_datasets become unimportable, as
# on a machine without them (``import`` raises ModuleNotFoundError; ``find_spec``, which
# libraries such as etils probe with, answers None).
REFUSE_TENSORFLOW = r'''
import sys


class _Refusing:
  """A ``sys.meta_path`` finder that finds nothing of tensorflow(_datasets) and hands every
  other name to the finder it wraps."""
  REFUSED = ('tensorflow', 'tensorflow_datasets')

  def __init__(self, finder):
    self._finder = finder

  def find_spec(self, name, path=None, target=None):
    if name.split('.')[0] in self.REFUSED:
      return None
    find = getattr(self._finder, 'find_spec', None)
    return find(name, path, target) if find else None

  def __getattr__(self, name):
    return getattr(self._finder, name)


sys.meta_path[:] = [_Refusing(f) for f in sys.meta_path]
for _name in [m for m in sys.modules if m.split('.')[0] in _Refusing.REFUSED]:
  del sys.modules[_name]
'''
# ``python -c LAUNCHER SAVE_STEP KILL_STEP MAIN_FLAGS...``: ``encoder_jax.main`` with
# tensorflow and tensorflow_datasets unimportable (as on a machine without them). SAVE_STEP
# > 0: once checkpoint SAVE_STEP is saved it is waited for (on disk), and the process
# SIGKILLs itself right after it logged training step KILL_STEP: a crash after the
# checkpoint, with later steps already logged that the resumed run must supersede.
LAUNCHER = REFUSE_TENSORFLOW + r'''
import os, runpy, signal
save_step, kill_step = int(sys.argv.pop(1)), int(sys.argv.pop(1))
if save_step:
  from encoder_jax.run import checkpointing
  from encoder_jax.run import metrics_log as metrics
  _save, _write = checkpointing.Checkpointer.save, metrics.MetricWriter.write

  def save(self, step, state, data_state):
    _save(self, step, state, data_state)
    if step == save_step:
      self.wait()

  def write(self, step, scalars, prefix='train'):
    _write(self, step, scalars, prefix)
    if prefix == 'train' and step >= kill_step:
      print(f'device_check: SIGKILL after step {step}', flush=True)
      os.kill(os.getpid(), signal.SIGKILL)

  checkpointing.Checkpointer.save, metrics.MetricWriter.write = save, write
sys.argv[0] = 'encoder_jax.main'
runpy.run_module('encoder_jax.main', run_name='__main__', alter_sys=True)
'''


class PartFailed(Exception):
  """A part that measured but whose check failed: reported as an error, figures kept."""

  def __init__(self, message: str, figures: dict):
    super().__init__(message)
    self.figures = figures


@dataclasses.dataclass
class Part:
  name: str
  title: str
  estimate_s: float  # On a GPU (a guess until measured there).
  dry_estimate_s: float  # --dry_run on a 2-core CPU.
  run: Callable[['Check'], dict]


class Check:
  """One run: its arguments, the results so far, the report files."""

  def __init__(self, args):
    self.args = args
    self.dry = args.dry_run
    self.shapes = DRY_SHAPES if self.dry else SHAPES
    self.started = time.time()
    self.deadline = self.started + args.budget_s
    self.results: dict[str, dict] = {}
    self.environment: dict = {}
    self.scratch = args.scratch or tempfile.mkdtemp(prefix='device_check_')
    os.makedirs(self.scratch, exist_ok=True)

  def left_s(self) -> float:
    return self.deadline - time.time()

  def bench_args(self, name: str, **changes) -> argparse.Namespace:
    """bench_train's arguments for one of ``self.shapes``, with ``changes``."""
    shape = dict(self.shapes[name], **changes)
    a = argparse.Namespace(
        preset='base', kind='bert', batch_size=32, seq_len=128, max_predictions=None,
        vocab_size=30522, dtype='bfloat16', remat=False, scan_unroll=1,
        attention_implementation='auto', attention_dropout=0.1, model_overrides=None,
        steps=2 if self.dry else 10, warmup=1 if self.dry else 3,
        peak_tflops=self.args.peak_tflops, device_memory_gib=bt.H100_GIB)
    seq_len = shape.pop('seq_len')
    a = bt.shape_args(a, seq_len=seq_len)
    for k, v in shape.items():
      setattr(a, k, v)
    return a


# ---------------------------------------------------------------------------------------
# The parts.


def _error(e: BaseException) -> dict:
  tb = ''.join(traceback.format_exception(type(e), e, e.__traceback__))
  return dict(type=type(e).__name__, message=str(e)[:2000], traceback=tb[-3000:])


def _attempt(fn, *args, **kwargs) -> dict:
  """``fn(...)``'s figures, or ``{'error': ...}``: a sub-measurement that may fail alone."""
  try:
    return fn(*args, **kwargs)
  except Exception as e:  # pylint: disable=broad-except
    gc.collect()
    return dict(error=_error(e))


def _process_peak_gib() -> float | None:
  import jax
  stats = jax.devices()[0].memory_stats()
  return stats['peak_bytes_in_use'] / GIB if stats and 'peak_bytes_in_use' in stats else None


_ATTENTION_NAMES = dict(splash='splash', cudnn='cuDNN', xla='XLA')


def attention_resolved(requested: str, dtype: str, dropout: float = 0.0,
                       kind: str = 'bert') -> str:
  """What ``model.attention_implementation`` (``requested``; 'auto' = None) runs here:
  splash (TPU), cuDNN (GPU, bf16) or XLA (``models.attention.resolve_implementation``); the
  training step's attention is XLA's where attention dropout is on, and DeBERTa's and XLNet's
  attentions are always XLA's."""
  from encoder_jax.models import attention  # pylint: disable=g-import-not-at-top
  try:
    impl = attention.resolve_implementation(None if requested == 'auto' else requested, dtype)
  except ValueError as e:
    return f'error ({e})'
  name = _ATTENTION_NAMES[impl]
  if impl != 'xla' and kind.startswith(('deberta', 'xlnet')):
    return f'XLA ({kind} has its own attention; {name} for dot-product kinds)'
  if impl != 'xla' and dropout > 0:
    return f'XLA in training (attention dropout {dropout}; {name} otherwise)'
  return name


def _shape_text(a) -> str:
  extra = ''.join(f', {k}={v}' for k, v in (a.model_overrides or {}).items())
  resolved = attention_resolved(a.attention_implementation, a.dtype, a.attention_dropout,
                                a.kind)
  return (f'{a.kind}-{a.preset}{extra}, vocab {a.vocab_size}, {a.batch_size} x {a.seq_len}, '
          f'{a.max_predictions} predictions/seq, {a.dtype}{", remat" * a.remat}, attention '
          f'{a.attention_implementation} -> {resolved} (dropout {a.attention_dropout}), '
          f'scan_unroll {a.scan_unroll}')


# --dry_run: the last step set up (its arguments, the runner and its info). The dry run's BERT
# parts are one program (DRY_SHAPES): bert_base_512 and attention_512's XLA side time the
# step bert_base_128 set up instead of tracing and lowering it again (about 6 s of CPU).
# A GPU run never keeps a step: its parts' shapes differ, and each frees its memory.
_DRY_KEPT: list = []


def ours(a, keep: bool = False) -> dict:
  """Our full train step at one shape (``bench_train.ours_runner``), timed and measured.
  ``keep`` (the dry run): the step is kept, and one set up at the same arguments is reused."""
  t = time.perf_counter()
  key = repr(sorted((k, v) for k, v in vars(a).items() if k not in ('steps', 'warmup')))
  reused = bool(keep and _DRY_KEPT and _DRY_KEPT[0][0] == key)
  if reused:
    run, info = _DRY_KEPT[0][1:]
  else:
    _DRY_KEPT.clear()
    run, info = bt.ours_runner(a)
    if keep:
      _DRY_KEPT.append((key, run, info))
  setup_s = time.perf_counter() - t
  dt = bt._time_steps(run, a.steps, a.warmup)  # pylint: disable=protected-access
  r = bt._ours_result(a, dt, info)  # pylint: disable=protected-access
  m = bt.memory_of(info['compiled'], a)
  flops = info['flops']
  del run, info
  gc.collect()
  f = dict(shape=_shape_text(a), batch=f'{a.batch_size} x {a.seq_len}',
           tokens_per_s=r['tokens_per_s'], step_ms=dt * 1e3,
           model_tflop_per_step=flops / 1e12, tflops_per_device=r['tflops_per_device'],
           mfu=r.get('mfu'), device=r['device'],
           setup_and_compile_s=setup_s, timed_steps=a.steps, warmup_steps=a.warmup,
           compiled_peak_gib=m['peak'] / GIB, memory_budget_gib=m['budget'] / GIB,
           memory_budget=m['budget_what'], process_peak_gib=_process_peak_gib(),
           cudnn_attention_calls=m['cudnn_attention_calls'], remat=a.remat)
  if reused:
    f['setup'] = 'the step an earlier part set up at the same shape (dry run)'
  return f


def _tflops(x: float) -> str:
  return f'{x:.1f}' if x >= 1 else f'{x:.2g}'


def _ours_summary(f: dict) -> str:
  mfu = f'MFU {f["mfu"]:.1%}' if f.get('mfu') is not None else 'MFU n/a (no bf16 peak known)'
  peak = f'{f["compiled_peak_gib"]:.2f} GiB compiled peak'
  if f.get('process_peak_gib') is not None:
    peak += f', process peak {f["process_peak_gib"]:.2f} GiB'
  return (f'{f["tokens_per_s"]:,.0f} tokens/s, {_tflops(f["tflops_per_device"])} TFLOP/s, {mfu}, '
          f'{peak}' + (', remat' if f.get('remat') else '') + f' [{f["batch"]}]')


def _oom(e: BaseException) -> bool:
  text = f'{type(e).__name__} {e}'.lower()
  return 'resource_exhausted' in text or 'out of memory' in text or 'oom' in text.split()


def part_environment(check: Check) -> dict:
  import importlib.metadata

  import jax
  env = dict(python=sys.version.split()[0], platform=platform.platform(),
             cpu_count=os.cpu_count(), jax_backend=jax.default_backend(),
             devices=f'{jax.device_count()} x {jax.devices()[0].device_kind}',
             platform_version=getattr(jax.devices()[0].client, 'platform_version', None),
             xla_flags=os.environ.get('XLA_FLAGS', ''),
             xla_python_client_preallocate=os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'),
             scratch=check.scratch)
  from encoder_jax.run import metrics_log as metrics
  env['peak_bf16_tflops_per_device'] = metrics.peak_tflops_per_device(check.args.peak_tflops)
  stats = jax.devices()[0].memory_stats()
  if stats and stats.get('bytes_limit'):
    env['device_memory_limit_gib'] = stats['bytes_limit'] / GIB
  packages = {}
  for name in ('jax', 'jaxlib', 'jax-cuda13-plugin', 'jax-cuda12-plugin', 'flax', 'optax',
               'orbax-checkpoint', 'numpy', 'ml-collections', 'tensorboardX', 'absl-py',
               'etils', 'sentencepiece', 'tokenizers', 'safetensors', 'torch', 'transformers',
               'tensorflow', 'tensorflow-cpu', 'tensorflow-datasets'):
    try:
      packages[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      packages[name] = None
  env['packages'] = packages
  try:
    smi = subprocess.run(['nvidia-smi', '--query-gpu=name,driver_version,memory.total',
                          '--format=csv,noheader'], capture_output=True, text=True, timeout=30,
                         check=False)
    env['nvidia_smi'] = (smi.stdout or smi.stderr).strip()
  except (OSError, subprocess.TimeoutExpired) as e:
    env['nvidia_smi'] = f'not available ({type(e).__name__}: {e})'
  try:
    import torch  # pylint: disable=g-import-not-at-top
    env['torch_cuda'] = dict(available=torch.cuda.is_available(), cuda=torch.version.cuda,
                             cudnn=torch.backends.cudnn.version() if torch.cuda.is_available()
                             else None)
  except Exception as e:  # pylint: disable=broad-except
    env['torch_cuda'] = f'torch does not import: {type(e).__name__}: {e}'
  # model.attention_implementation=None (the runs' 'auto'), per activation dtype.
  env['attention_auto'] = {dt: attention_resolved('auto', dt) for dt in ('bfloat16', 'float32')}
  check.environment = env
  driver = env['nvidia_smi'] if 'not available' not in env['nvidia_smi'] else 'no nvidia-smi'
  env['summary'] = (f'{env["devices"]} ({env["jax_backend"]}), {driver}, jax '
                    f'{packages["jax"]}, peak {env["peak_bf16_tflops_per_device"]:g} TFLOP/s, '
                    f'attention auto = {env["attention_auto"]["bfloat16"]} in bf16')
  return env


def part_bert_128(check: Check) -> dict:
  f = ours(check.bench_args('bert_128'), keep=check.dry)
  f['summary'] = _ours_summary(f)
  return f


def part_bert_512(check: Check) -> dict:
  a = check.bench_args('bert_512')
  first = None
  try:
    f = ours(a, keep=check.dry)
  except Exception as e:  # pylint: disable=broad-except
    if not _oom(e):
      raise
    first = _error(e)
  if first is not None:  # Out of the handler: the failed attempt's buffers are freed.
    gc.collect()
    f = ours(bt.shape_args(a, remat=True))
    f['remat_reason'] = f'without remat: {first["type"]}: {first["message"][:300]}'
  f['summary'] = _ours_summary(f)
  return f


def _hf(check: Check, shape: str, ours_part: str) -> dict:
  from encoder_jax.core import extras
  torch = extras.require('torch', extra='peers', what="the Hugging Face side of the check")
  a = check.bench_args(shape)
  if check.dry:
    device = 'cpu'
    # One timed step, no warmup: a bf16-autocast step of the tiny model takes most of a
    # second of CPU (float32 weights and AdamW, autocast on the CPU), and a dry run's
    # figures are not measurements.
    a.steps, a.warmup = 1, 0
  elif torch.cuda.is_available():
    device = 'cuda'
  else:
    return dict(skipped=f'torch {torch.__version__} has no CUDA here (torch.version.cuda = '
                        f'{torch.version.cuda}): no GPU peer to time',
                summary='skipped: torch has no CUDA')
  # Our bf16 step's peer: autocast in bf16, float32 weights and AdamW, the same batch.
  autocast, note = torch.bfloat16, None
  if device == 'cuda':
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
  try:
    r = bt.bench_hf(a, device, autocast)
  except RuntimeError as e:
    if device != 'cpu':
      raise
    autocast, note = None, f'bf16 autocast failed on the CPU ({e}); float32'
    r = bt.bench_hf(a, device, autocast)
  f = dict(shape=f'{a.preset}, vocab {a.vocab_size}, {a.batch_size} x {a.seq_len}, attention '
                 f'sdpa (dropout {a.attention_dropout})',
           peer=r['peer'], torch=r['torch'], transformers=r['transformers'],
           device=r['device'], autocast=r['autocast'], tokens_per_s=r['tokens_per_s'],
           step_ms=r['step_s'] * 1e3, timed_steps=a.steps, warmup_steps=a.warmup)
  if note:
    f['note'] = note
  if device == 'cuda':
    f['peak_memory_gib'] = torch.cuda.max_memory_allocated() / GIB
    torch.cuda.empty_cache()
  # Its model FLOPs: ours with the vocabulary head at every position, as HF computes it.
  full = bt.build(bt.shape_args(a, max_predictions=a.seq_len))
  flops = full.objective.flops_per_sequence(full.phase) * a.batch_size
  del full
  from encoder_jax.run import metrics_log as metrics
  f['model_tflop_per_step'] = flops / 1e12
  f['tflops'] = flops / r['step_s'] / 1e12
  peak = metrics.peak_tflops_per_device(check.args.peak_tflops)
  f['mfu'] = f['tflops'] / peak if peak and device == 'cuda' else None
  mine = check.results.get(ours_part, {})
  if mine.get('status') == 'ok':
    f['ours_tokens_per_s'] = mine['figures']['tokens_per_s']
    f['ratio_ours_over_hf'] = f['ours_tokens_per_s'] / f['tokens_per_s']
  gc.collect()
  ratio = (f'ours / HF {f["ratio_ours_over_hf"]:.2f}x' if 'ratio_ours_over_hf' in f
           else f'no ratio ({ours_part} did not run)')
  f['summary'] = (f'{f["tokens_per_s"]:,.0f} tokens/s, {_tflops(f["tflops"])} TFLOP/s (head at '
                  f'every position)' + (f', MFU {f["mfu"]:.1%}' if f['mfu'] else '') +
                  (f', peak {f["peak_memory_gib"]:.2f} GiB' if 'peak_memory_gib' in f else '')
                  + f', {ratio} [{a.batch_size} x {a.seq_len}, {f["device"]}, autocast '
                  f'{f["autocast"]}]')
  return f


def part_hf_128(check: Check) -> dict:
  return _hf(check, 'bert_128', 'bert_base_128')


def part_hf_512(check: Check) -> dict:
  return _hf(check, 'bert_512', 'bert_base_512')


def part_attention_512(check: Check) -> dict:
  import jax
  base = check.results.get('bert_base_512', {}).get('figures', {})
  a = check.bench_args('bert_512', attention_dropout=0.0, remat=bool(base.get('remat')))
  f = dict(note='attention dropout 0 on both sides (cuDNN has none)')
  f['xla'] = _attempt(ours, bt.shape_args(a, attention_implementation='xla'),
                      keep=check.dry)
  if jax.default_backend() != 'gpu':
    f['cudnn'] = dict(skipped=f'cuDNN fused attention needs a CUDA GPU; backend '
                              f'{jax.default_backend()}')
  else:
    f['cudnn'] = _attempt(ours, bt.shape_args(a, attention_implementation='cudnn'))
  x, c = f['xla'], f['cudnn']
  if c.get('cudnn_attention_calls') == 0:
    c['warning'] = "'cudnn' requested, but the compiled step has no cuDNN fused-attention call"
  if 'tokens_per_s' in x and 'tokens_per_s' in c:
    f['speedup_cudnn_over_xla'] = c['tokens_per_s'] / x['tokens_per_s']
  if 'error' in x and ('error' in c or 'skipped' in c):
    raise RuntimeError(f'both sides failed or did not run: xla {x["error"]["type"]}: '
                       f'{x["error"]["message"][:300]}')
  side = lambda s: (f'{s["tokens_per_s"]:,.0f} tokens/s' + (
      f' (MFU {s["mfu"]:.1%}, {s["compiled_peak_gib"]:.2f} GiB, {s["cudnn_attention_calls"]} '
      f'cuDNN calls)' if s.get('mfu') is not None else
      f' ({s["cudnn_attention_calls"]} cuDNN calls)')) if 'tokens_per_s' in s else (
          'skipped' if 'skipped' in s else f'error {s["error"]["type"]}')
  f['summary'] = (f'XLA {side(x)}; cuDNN {side(c)}' + (
      f'; cuDNN / XLA {f["speedup_cudnn_over_xla"]:.2f}x' if 'speedup_cudnn_over_xla' in f
      else '') + f' [{a.batch_size} x {a.seq_len}]')
  return f


def _kind_part(shape: str):
  def run(check: Check) -> dict:
    a = check.bench_args(shape)
    a.steps, a.warmup = (2, 1) if check.dry else (5, 2)  # One short timing.
    f = ours(a)
    f['summary'] = _ours_summary(f)
    return f
  return run


# ---- the training run, killed and resumed ----


def _read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]


def _by_step(workdir: str, split: str) -> dict[int, dict]:
  return {int(r['step']): r for r in _read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
          if r.get('split') == split}


def _max_diff(a: dict[int, dict], b: dict[int, dict]) -> dict[str, float]:
  out = {}
  for step in sorted(set(a) & set(b)):
    for k in COMPARED_KEYS:
      if k in a[step] and k in b[step]:
        out[k] = max(out.get(k, 0.0), abs(float(a[step][k]) - float(b[step][k])))
  return out


def _child_env(check: Check, deterministic: bool) -> dict:
  env = dict(os.environ)
  env['PYTHONPATH'] = ROOT + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
  # One compilation cache for the three runs: the second and third load the first's
  # executables (the same programs bit for bit).
  env['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  env['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '-1'
  env['PYTHONUNBUFFERED'] = '1'
  if deterministic:
    env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') + ' ' + DETERMINISTIC_XLA_FLAG).strip()
  return env


def _train_process(check: Check, name: str, workdir: str, flags, save_step: int,
                   kill_step: int, env: dict) -> dict:
  cmd = [sys.executable, '-c', LAUNCHER, str(save_step), str(kill_step), *flags,
         f'--workdir={workdir}']
  log = os.path.join(check.scratch, f'{name}.log')
  t = time.perf_counter()
  try:
    with open(log, 'w', encoding='utf-8') as out:
      proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                            timeout=max(check.left_s(), 30), check=False)
    rc = proc.returncode
  except subprocess.TimeoutExpired:
    rc = 'timeout'
  with open(log, encoding='utf-8', errors='replace') as f:
    output = f.read()
  return dict(returncode=rc, wall_s=time.perf_counter() - t, log=log, output=output)


def _tail(output: str, n: int = 3000) -> str:
  return output[-n:]


def _three_runs(check: Check, f: dict, flags: list[str], whole: str, killed: str,
                save_step: int, kill_step: int) -> None:
  """Uninterrupted, SIGKILLed after ``kill_step``, then the same command again (resumed);
  their wall times and outcomes go into ``f``."""
  import jax

  deterministic = jax.default_backend() == 'gpu'
  # 1. Uninterrupted (it prepares the data and fills the compilation cache).
  env = _child_env(check, deterministic)
  run = _train_process(check, 'uninterrupted', whole, flags, 0, 0, env)
  if run['returncode'] != 0 and deterministic and 'xla_gpu_deterministic_ops' in run['output']:
    f['note'] = (f'{DETERMINISTIC_XLA_FLAG} refused by this XLA; the runs use atomics: '
                 'differences may be rounding')
    deterministic = False
    env = _child_env(check, deterministic)
    run = _train_process(check, 'uninterrupted', whole, flags, 0, 0, env)
  f['xla_flags'] = env.get('XLA_FLAGS', '')
  f['uninterrupted_s'] = run['wall_s']
  if run['returncode'] != 0:
    raise RuntimeError(f'the uninterrupted run failed ({run["returncode"]}):\n'
                       f'{_tail(run["output"])}')
  # 2. Killed: SIGKILL after step kill_step, checkpoint save_step on disk.
  run = _train_process(check, 'killed', killed, flags, save_step, kill_step, env)
  f['killed_s'] = run['wall_s']
  f['killed_returncode'] = run['returncode']
  if run['returncode'] != -signal.SIGKILL:
    raise RuntimeError(f'the run to be killed ended with {run["returncode"]}, not SIGKILL:\n'
                       f'{_tail(run["output"])}')
  f['checkpoints_after_kill'] = sorted(
      int(d) for d in os.listdir(os.path.join(killed, 'checkpoints')) if d.isdigit())
  # 3. The same command again: it resumes.
  run = _train_process(check, 'resumed', killed, flags, 0, 0, env)
  f['resumed_s'] = run['wall_s']
  if run['returncode'] != 0:
    raise RuntimeError(f'the resumed run failed ({run["returncode"]}):\n{_tail(run["output"])}')
  f['resumed_from_step'] = (save_step if f'resuming from checkpoint step {save_step}'
                            in run['output'] else None)


def _compare_logs(f: dict, whole: str, killed: str, save_step: int) -> list[int]:
  """The two runs' logged losses and evaluations into ``f``; the logged steps."""
  a, b = _by_step(whole, 'train'), _by_step(killed, 'train')
  f['logged_steps'] = len(a)
  f['same_logged_steps'] = sorted(a) == sorted(b)
  steps = sorted(a)
  f['loss_first'], f['loss_last'] = a[steps[0]]['loss'], a[steps[-1]]['loss']
  f['first_step'], f['last_step'] = steps[0], steps[-1]
  k = max(1, min(3, len(steps) // 2))  # The first and last few logged losses, averaged.
  mean = lambda ss: sum(float(a[s]['loss']) for s in ss) / len(ss)
  f['loss_first_mean'], f['loss_last_mean'] = mean(steps[:k]), mean(steps[-k:])
  f['loss_falling'] = f['loss_last_mean'] < f['loss_first_mean']
  ea, eb = _by_step(whole, 'eval'), _by_step(killed, 'eval')
  f['eval_mlm_loss'] = {s: r.get('mlm_loss') for s, r in sorted(ea.items())}
  f['train_max_abs_diff'] = _max_diff(a, b)
  f['eval_max_abs_diff'] = _max_diff(ea, eb)
  after = {s: r for s, r in b.items() if s > save_step}
  f['loss_max_abs_diff_after_resume'] = max(
      (abs(float(r['loss']) - float(a[s]['loss'])) for s, r in after.items() if s in a),
      default=None)
  f['superseded_lines'] = len(_read_jsonl(os.path.join(killed, 'metrics_superseded.jsonl')))
  return steps


def _params_max_abs_diff(whole: str, killed: str) -> float:
  import jax
  import numpy as np

  import encoder_jax
  pa, pb = encoder_jax.load(whole).params, encoder_jax.load(killed).params
  diffs = jax.tree.leaves(jax.tree.map(
      lambda x, y: float(np.max(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32))))
      if np.size(x) else 0.0, pa, pb))
  return max(diffs)


def _resume_summary(f: dict, steps: list[int], save_step: int, kill_step: int) -> str:
  after_diff = f['loss_max_abs_diff_after_resume']
  return (
      f'{f["num_steps"]} steps, loss {f["loss_first"]:.3f} (step {steps[0]}) -> '
      f'{f["loss_last"]:.3f} (step {steps[-1]}); SIGKILLed after step {kill_step} '
      f'(checkpoint {save_step} on disk), resumed from {f["resumed_from_step"]}: max |loss '
      f'diff| after resume {"n/a" if after_diff is None else f"{after_diff:.3g}"}, params '
      f'{f["params_max_abs_diff"]:.3g} '
      f'({"equal" if f["losses_equal"] and f["params_equal"] else "NOT equal"}); runs '
      f'{f["uninterrupted_s"]:.0f} / {f["killed_s"]:.0f} / {f["resumed_s"]:.0f} s')


def part_train_resume(check: Check) -> dict:
  overrides = DRY_TRAIN_OVERRIDES if check.dry else TRAIN_OVERRIDES
  flags = [f'--config={TRAIN_CONFIG}'] + [f'--config.{k}={v}' for k, v in overrides.items()]
  save_step, kill_step = (DRY_SAVE_STEP, DRY_KILL_STEP) if check.dry else (
      TRAIN_SAVE_STEP, TRAIN_KILL_STEP)
  root = os.path.join(check.scratch, 'train')
  shutil.rmtree(root, ignore_errors=True)
  flags.append(f'--config.data.prepared_dir={os.path.join(root, "prepared")}')
  whole, killed = os.path.join(root, 'uninterrupted'), os.path.join(root, 'killed')
  f = dict(command=shlex.join(['python', '-m', 'encoder_jax.main', *flags,
                              '--workdir=WORKDIR']),
           num_steps=overrides['train.num_steps'], save_step=save_step,
           kill_after_step=kill_step)
  _three_runs(check, f, flags, whole, killed, save_step, kill_step)
  steps = _compare_logs(f, whole, killed, save_step)
  f['params_max_abs_diff'] = _params_max_abs_diff(whole, killed)
  f['losses_equal'] = (f['same_logged_steps'] and f['loss_max_abs_diff_after_resume'] == 0.0
                       and all(v == 0.0 for v in f['train_max_abs_diff'].values()))
  f['params_equal'] = f['params_max_abs_diff'] == 0.0
  f['ok'] = bool(f['losses_equal'] and f['params_equal'] and f['loss_falling']
                 and f['resumed_from_step'] == save_step)
  f['summary'] = _resume_summary(f, steps, save_step, kill_step)
  if not f['ok']:
    raise PartFailed('the resumed run is not the uninterrupted one, or the loss did not fall '
                     'or the run did not resume from its checkpoint: see the figures', f)
  return f

PARTS = (
    Part('environment', 'device, driver, platform and package versions', 10, 3,
         part_environment),
    Part('bert_base_128', 'BERT-base MLM + NSP, bf16, 128 tokens x 256', 45, 15, part_bert_128),
    Part('hf_bert_128', 'Hugging Face BertForPreTraining at 128 x 256 (sdpa, bf16 autocast)',
         30, 8, part_hf_128),
    Part('bert_base_512', 'BERT-base MLM + NSP, bf16, 512 tokens x 64 (remat if needed)', 45, 3,
         part_bert_512),
    Part('hf_bert_512', 'Hugging Face BertForPreTraining at 512 x 64', 20, 2, part_hf_512),
    Part('train_resume', 'small BERT (configs/bert_small.py) in bf16 on the embedded corpus: '
         'uninterrupted, and SIGKILLed after a checkpoint then resumed', 120, 40,
         part_train_resume),
    Part('attention_512', 'BERT-base at 512 x 64, attention dropout 0: cuDNN fused attention '
         "against XLA's", 80, 3, part_attention_512),
    Part('electra_small', 'ELECTRA-Small (12 x 256, E = 128, 1/4 generator), 128 x 128', 35, 12,
         _kind_part('electra_small')),
    Part('deberta_v2_base', 'DeBERTa-v2-base (disentangled attention, EMD, 128K vocab), 512 x '
         '32', 50, 13, _kind_part('deberta_v2_base')),
    Part('xlnet_base', 'XLNet-base (two-stream PLM, 85 targets, bidirectional data), 512 x 32',
         50, 15, _kind_part('xlnet_base')),
    Part('modernbert_base', 'ModernBERT-base (22 x 768, GeGLU 1,152, every third layer global, '
         '128-token windows), 1,024 x 32', 60, 12, _kind_part('modernbert_base')),
)


# ---------------------------------------------------------------------------------------
# The report.


def _run_part(check: Check, part: Part) -> dict:
  estimate = part.dry_estimate_s if check.dry else part.estimate_s
  print(f'== {part.name}: {part.title} (estimate {estimate:.0f} s, {check.left_s():.0f} s '
        'left)', flush=True)
  t = time.perf_counter()
  entry = dict(title=part.title, estimate_s=estimate)
  if check.left_s() < 0.5 * estimate:
    entry.update(status='skipped', reason=f'{check.left_s():.0f} s left of the '
                 f'{check.args.budget_s:.0f} s budget; estimated at {estimate:.0f} s')
  else:
    try:
      if part.name == check.args.fail_part:
        raise RuntimeError(f'injected failure (--fail_part={part.name})')
      figures = part.run(check)
      if 'skipped' in figures and len(figures) <= 2:
        entry.update(status='skipped', reason=figures['skipped'])
      else:
        entry.update(status='ok', figures=figures)
    except PartFailed as e:
      entry.update(status='error', error=_error(e), figures=e.figures)
    except Exception as e:  # pylint: disable=broad-except
      entry.update(status='error', error=_error(e))
      gc.collect()
  entry['wall_s'] = time.perf_counter() - t
  what = (entry.get('figures', {}).get('summary') or entry.get('reason')
          or (f'{entry["error"]["type"]}: {entry["error"]["message"][:200]}'
              if 'error' in entry else ''))
  print(f'== {part.name}: {entry["status"]} in {entry["wall_s"]:.1f} s (estimate '
        f'{estimate:.0f} s): {what}', flush=True)
  return entry


def _fmt(v) -> str:
  if isinstance(v, float):
    return f'{v:,.4g}' if abs(v) < 1e4 else f'{v:,.0f}'
  if isinstance(v, dict):
    return '{' + ', '.join(f'{k}: {_fmt(x)}' for k, x in v.items()) + '}'
  return str(v)


def markdown(report: dict) -> str:
  env = report.get('environment') or {}
  lines = ['# Device check', '',
           f'`{report["command"]}`', '',
           f'Started {report["started"]}; {"DRY RUN (CPU, tiny shapes); " * report["dry_run"]}'
           f'wall time {report["wall_s"]:.1f} s of the {report["budget_s"]:.0f} s budget'
           + ('' if report['finished'] else ' (cut off: not finished)') + '.', '']
  if env:
    lines += [f'Device: {env.get("devices")} (JAX backend {env.get("jax_backend")}, '
              f'{env.get("platform_version")}); nvidia-smi: {env.get("nvidia_smi")}; '
              f'jax {env.get("packages", {}).get("jax")}, flax '
              f'{env.get("packages", {}).get("flax")}, torch '
              f'{env.get("packages", {}).get("torch")}; bf16 peak '
              f'{env.get("peak_bf16_tflops_per_device")} TFLOP/s per device; attention '
              f'implementation auto (None) resolves to {_fmt(env.get("attention_auto"))}.', '']
  lines += ['| part | status | wall s | estimate s | result |', '|---|---|---|---|---|']
  for name, e in report['parts'].items():
    what = (e.get('figures', {}).get('summary') or e.get('reason') or
            (f'**{e["error"]["type"]}**: {e["error"]["message"][:300]}' if 'error' in e else ''))
    what = what.replace('|', '\\|').replace('\n', ' ')
    lines.append(f'| {name} | {e["status"]} | {e["wall_s"]:.1f} | {e["estimate_s"]:.0f} | '
                 f'{what} |')
  for name, e in report['parts'].items():
    lines += ['', f'## {name}: {e["title"]}', '',
              f'{e["status"]}, {e["wall_s"]:.1f} s (estimate {e["estimate_s"]:.0f} s)']
    if 'reason' in e:
      lines += ['', e['reason']]
    if 'figures' in e:
      lines.append('')
      for k, v in e['figures'].items():
        if k == 'summary':
          continue
        if isinstance(v, dict) and 'error' in v:
          lines.append(f'- {k}: **{v["error"]["type"]}**: {v["error"]["message"][:500]}')
          lines += ['', '```', v['error']['traceback'].rstrip(), '```', '']
        elif isinstance(v, dict) and k in ('xla', 'cudnn'):
          lines.append(f'- {k}:')
          lines += [f'  - {kk}: {_fmt(vv)}' for kk, vv in v.items()]
        else:
          lines.append(f'- {k}: {_fmt(v)}')
    if 'error' in e:
      lines += ['', f'**{e["error"]["type"]}**: {e["error"]["message"]}', '', '```',
                e['error']['traceback'].rstrip(), '```']
  return '\n'.join(lines) + '\n'


def write_report(check: Check, finished: bool) -> dict:
  report = dict(command=' '.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
                started=datetime.datetime.fromtimestamp(check.started).isoformat(
                    timespec='seconds'),
                dry_run=check.dry, budget_s=check.args.budget_s,
                wall_s=time.time() - check.started, finished=finished,
                environment=check.environment, parts=check.results)
  os.makedirs(check.args.out, exist_ok=True)
  for name, text in (('device_check.json', json.dumps(report, indent=1, default=str)),
                     ('device_check.md', markdown(report))):
    tmp = os.path.join(check.args.out, name + '.tmp')
    with open(tmp, 'w', encoding='utf-8') as f:
      f.write(text)
    os.replace(tmp, os.path.join(check.args.out, name))
  return report


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--out', required=True, help='Where device_check.md and .json go.')
  ap.add_argument('--dry_run', action='store_true',
                  help='Every part at tiny shapes on the CPU backend (a rehearsal).')
  ap.add_argument('--budget_s', type=float, default=None,
                  help='Wall-time budget; a part that no longer fits is skipped (default 480 '
                  's, 8 minutes; 900 for --dry_run).')
  ap.add_argument('--parts', default='',
                  help='Comma-separated part names to run (default all): ' +
                  ', '.join(p.name for p in PARTS))
  ap.add_argument('--fail_part', default='', help='For tests: this part raises at its start.')
  ap.add_argument('--peak_tflops', type=float, default=0.0,
                  help='bf16 peak TFLOP/s per device for MFU (default metrics.PEAK_TFLOPS).')
  ap.add_argument('--scratch', default='',
                  help='Workdirs, logs and caches of the training part (default a new '
                  'temporary directory, kept).')
  args = ap.parse_args(argv)
  if args.budget_s is None:
    args.budget_s = 900.0 if args.dry_run else 480.0
  names = [p.name for p in PARTS]
  wanted = [n for n in args.parts.split(',') if n] or names
  unknown = sorted(set(wanted + [args.fail_part]) - set(names) - {''})
  if unknown:
    ap.error(f'unknown part(s) {unknown}; parts: {names}')
  if args.dry_run:
    os.environ['JAX_PLATFORMS'] = 'cpu'
  else:  # JAX takes what it needs, not 75% up front: PyTorch runs beside it.
    os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  # A persistent compilation cache (this process and the training part's): a program
  # compiled twice (the three training runs, a rerun of the check on the same machine)
  # is compiled once; setup_and_compile_s then says so.
  os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(
      tempfile.gettempdir(), f'device_check_xla_cache_{os.getuid()}'))
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  check = Check(args)
  print(f'device_check: {len(wanted)} parts, budget {args.budget_s:.0f} s, scratch '
        f'{check.scratch}', flush=True)
  write_report(check, finished=False)
  for part in PARTS:
    if part.name in wanted:
      check.results[part.name] = _run_part(check, part)
      write_report(check, finished=False)
  report = write_report(check, finished=True)
  failed = [n for n, e in report['parts'].items() if e['status'] == 'error']
  print(f'device_check: {report["wall_s"]:.1f} s; report in '
        f'{os.path.join(args.out, "device_check.md")}'
        + (f'; errors in {", ".join(failed)}' if failed else ''), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
