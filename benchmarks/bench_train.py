r"""Train-step throughput: encoder_jax BERT beside Hugging Face BertForPreTraining (PyTorch).

Both run a full pretraining step (forward, MLM + NSP loss, backward, AdamW update) with
dropout on, at the same model size, batch and sequence length, in this one process, and
the script prints tokens/s (batch * seq_len / step time, median of the timed steps) and
the ratio. Ours draws the 15% masks on device and computes vocabulary logits only at the
``max_predictions`` positions (our design); a second row runs our MLM head at every
position, as Hugging Face does, for a like-for-like view of the rest.

  python benchmarks/bench_train.py                      # small BERT (4 x 256), batch 32 x 128
  python benchmarks/bench_train.py --preset=base --batch_size=8
  python benchmarks/bench_train.py --preset=base --seq_len=512 --max_predictions=80 --steps=5

Token ids are drawn at random: throughput does not depend on their values. On an
accelerator the same command reports model TFLOP/s and MFU for our step (HF is skipped
unless --with_hf).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

PRESETS = {
    'small': dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    'base': dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    'large': dict(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
}


def _time_steps(run_step, steps: int, warmup: int) -> float:
  for _ in range(warmup):
    run_step()
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    run_step()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def bench_ours(args, max_predictions: int) -> dict:
  import jax
  import numpy as np

  from encoder_jax import config_base, objectives, optimizer, schedule, sharding, train
  from encoder_jax import feeding, metrics
  from encoder_jax.objectives import masking

  c = config_base.base_config()
  c.model.update(vocab_size=args.vocab_size, dtype=args.dtype, remat=args.remat,
                 **PRESETS[args.preset])
  c.train.update(batch_size=args.batch_size, seq_lens=(args.seq_len,),
                 max_predictions=(max_predictions,), phase_fractions=(1.0,), num_steps=1000)
  c.optim.warmup_steps = 10
  mesh = sharding.make_mesh(c.mesh)
  phase = schedule.phases(c.train)[0]
  v = args.vocab_size
  special = np.zeros(v, bool)
  special[:5] = True
  tables = masking.VocabTables(special, np.ones(v, bool), np.ones(v), mask_id=4)
  tx = optimizer.make(c)
  objective = objectives.build(c, tables)
  _, shards = train.state_shardings(c, mesh, objective, tx)
  state = train.create_train_state(c, mesh)
  step_fn = train.make_train_step(c, objective, tx, optimizer.learning_rate_schedule(
      c.optim, 1000), mesh, shards, phase)
  rng = np.random.RandomState(0)
  b, l = args.batch_size, args.seq_len
  host = dict(input_ids=rng.randint(5, v, (b, l)).astype(np.int32),
              segment_ids=(np.arange(l)[None] >= l // 2).repeat(b, 0).astype(np.int32),
              input_mask=np.ones((b, l), np.int32),
              pair_labels=rng.randint(0, 2, b).astype(np.int32))
  host['input_ids'][:, 0] = 2
  batch = feeding.to_global(host, sharding.batch_sharding(mesh))
  box = [state]

  def run():
    box[0], m = step_fn(box[0], batch)
    jax.block_until_ready(m['loss'])

  dt = _time_steps(run, args.steps, args.warmup)
  out = dict(step_s=dt, tokens_per_s=b * l / dt)
  flops = objective.flops_per_sequence(schedule.phases(c.train)[0]) * b
  out['tflops_per_device'] = flops / dt / 1e12 / jax.device_count()
  peak = metrics.peak_tflops_per_device(args.peak_tflops)
  if peak:
    out['mfu'] = out['tflops_per_device'] / peak
  out['device'] = f'{jax.device_count()} x {jax.devices()[0].device_kind}'
  return out


def bench_hf(args) -> dict:
  import torch
  import transformers

  torch.manual_seed(0)
  torch.set_num_threads(os.cpu_count() or 1)
  p = PRESETS[args.preset]
  cfg = transformers.BertConfig(vocab_size=args.vocab_size, hidden_size=p['hidden_size'],
                                num_hidden_layers=p['num_layers'],
                                num_attention_heads=p['num_heads'],
                                intermediate_size=p['intermediate_size'],
                                attn_implementation='sdpa')
  model = transformers.BertForPreTraining(cfg).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
                          weight_decay=0.01)
  b, l = args.batch_size, args.seq_len
  g = torch.Generator().manual_seed(0)
  ids = torch.randint(5, args.vocab_size, (b, l), generator=g)
  labels = torch.full((b, l), -100)
  pos = torch.rand(b, l, generator=g).argsort(1)[:, :args.max_predictions]
  labels.scatter_(1, pos, ids.gather(1, pos))
  inputs = dict(input_ids=ids, token_type_ids=(torch.arange(l)[None] >= l // 2).long().repeat(
      b, 1), attention_mask=torch.ones(b, l, dtype=torch.long), labels=labels,
                next_sentence_label=torch.randint(0, 2, (b,), generator=g))

  def run():
    opt.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  dt = _time_steps(run, args.steps, args.warmup)
  return dict(step_s=dt, tokens_per_s=b * l / dt, torch=torch.__version__,
              transformers=transformers.__version__)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--preset', choices=sorted(PRESETS), default='small')
  ap.add_argument('--batch_size', type=int, default=32)
  ap.add_argument('--seq_len', type=int, default=128)
  ap.add_argument('--max_predictions', type=int, default=20)
  ap.add_argument('--vocab_size', type=int, default=30522)
  ap.add_argument('--dtype', default='float32')
  ap.add_argument('--remat', action='store_true')
  ap.add_argument('--steps', type=int, default=10)
  ap.add_argument('--warmup', type=int, default=2)
  ap.add_argument('--peak_tflops', type=float, default=0.0)
  ap.add_argument('--with_hf', action='store_true', help='Also run HF on an accelerator host.')
  args = ap.parse_args()

  import jax
  on_cpu = jax.default_backend() == 'cpu'
  print(f'BERT-{args.preset} {PRESETS[args.preset]}, vocab {args.vocab_size}, batch '
        f'{args.batch_size} x {args.seq_len}, {args.max_predictions} predictions/seq, '
        f'{args.dtype}, {os.cpu_count()} CPU cores, JAX backend {jax.default_backend()}')
  ours = bench_ours(args, args.max_predictions)
  print(f'encoder_jax (head at predicted positions): {ours["tokens_per_s"]:10.0f} tokens/s  '
        f'step {ours["step_s"]*1e3:8.1f} ms  {ours["tflops_per_device"]:.3f} TFLOP/s/device'
        + (f'  MFU {ours["mfu"]:.1%}' if 'mfu' in ours else '') + f'  [{ours["device"]}]')
  if on_cpu or args.with_hf:
    full = bench_ours(args, args.seq_len)
    print(f'encoder_jax (head at all positions):       {full["tokens_per_s"]:10.0f} tokens/s  '
          f'step {full["step_s"]*1e3:8.1f} ms')
    hf = bench_hf(args)
    print(f'HF BertForPreTraining (PyTorch, sdpa):     {hf["tokens_per_s"]:10.0f} tokens/s  '
          f'step {hf["step_s"]*1e3:8.1f} ms  [torch {hf["torch"]}, transformers '
          f'{hf["transformers"]}]')
    print(f'ratio ours / HF: {ours["tokens_per_s"] / hf["tokens_per_s"]:.2f}x '
          f'(all-position head: {full["tokens_per_s"] / hf["tokens_per_s"]:.2f}x)')


if __name__ == '__main__':
  main()
