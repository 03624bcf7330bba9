r"""Real (non-padding) tokens per second with and without packed rows: pretraining on the
embedded corpus, and a fine-tuning run on BBC News (not a timed test).

  python benchmarks/bench_packing.py [--kind=bert|roberta|modernbert] [--steps=20]
      [--batch_size=32] [--seq_len=128] [--prepared_dir=/tmp/bench_packing]

**Pretraining**: the local-run model (``config_base.shrink_for_local_run``: 2 x 128, vocab
8000) trained with MLM on the embedded corpus, one full train step (forward, loss,
backward, AdamW) per batch of ``batch_size x seq_len``, for three inputs from the same
documents: ``doc_sentences`` (one document piece per row, padded: the like-for-like input
without packing, nothing attends across documents), ``full_sentences`` (RoBERTa: sentences
packed across documents, which then attend to each other) and ``packed_documents`` (unpadded
rows: documents back to back, each attending to itself, positions restarting; this is
ModernBERT's unpadding as far as a fixed [B, L] batch goes). **Fine-tuning**: sequence
classification (5 classes, mean pooling) of BBC News articles from their headline and first
sentence (real, short texts of varied length; ``finetune.probe_data.bbc_news``), at ``max_len
= seq_len``, padded rows against packed rows (``finetune.data.pack``), same batch shape.

Every variant runs the same compiled shape, so the step time is nearly the same and the
real tokens per second follow the share of real tokens in a batch (the packed rows'
document mask costs a little more than the key padding mask). Variants alternate over
``--rounds`` rounds of ``--steps`` steps after a warmup, on pre-drawn batches (the input
pipeline is not timed); printed: real tokens per batch, the median step time, real tokens/s
and the ratio to the unpacked input.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
import optax  # pylint: disable=wrong-import-position

from encoder_jax.config import schema as config_base  # pylint: disable=wrong-import-position
from encoder_jax import data as data_lib  # pylint: disable=wrong-import-position
from encoder_jax import objectives  # pylint: disable=wrong-import-position
from encoder_jax.core import length_phases  # pylint: disable=wrong-import-position
from encoder_jax.core import sharding  # pylint: disable=wrong-import-position
from encoder_jax.run import pretraining  # pylint: disable=wrong-import-position
from encoder_jax.finetune import data as finetune_data  # pylint: disable=wrong-import-position
from encoder_jax.finetune import heads  # pylint: disable=wrong-import-position
from encoder_jax.finetune import probe_data  # pylint: disable=wrong-import-position
from encoder_jax.finetune import task as task_lib  # pylint: disable=wrong-import-position
from encoder_jax.finetune import tasks  # pylint: disable=wrong-import-position
from encoder_jax.models import registry  # pylint: disable=wrong-import-position

KINDS = {
    'bert': {},
    'roberta': dict(kind='roberta', position_offset=2, type_vocab_size=1),
    'modernbert': dict(registry.get('modernbert').requires, kind='modernbert',
                       rope_theta=160_000.0, local_rope_theta=10_000.0, local_attention=64,
                       global_attn_every_n_layers=2, dense_bias=False, norm_bias=False),
}
PRETRAINING_INPUTS = ('doc_sentences', 'full_sentences', 'packed_documents')


def _config(args, pair_kind: str):
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  c.model.update(KINDS[args.kind])
  if args.kind == 'roberta':
    c.model.max_position_embeddings = args.seq_len + 2
  c.objective.names = ('mlm',)
  c.data.update(pair_kind=pair_kind, prepared_dir=args.prepared_dir)
  c.train.update(batch_size=args.batch_size, seq_lens=(args.seq_len,),
                 max_predictions=(config_base.predictions_for(0.15, (args.seq_len,))[0],),
                 phase_fractions=(1.0,), num_steps=1000)
  c.optim.warmup_steps = 10
  return c


def _timed(step, state, batches, steps: int):
  """Median seconds per step over ``steps`` steps (the state is carried on)."""
  times = []
  for i in range(steps):
    t = time.perf_counter()
    state, m = step(state, batches[i % len(batches)])
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t)
  return state, statistics.median(times)


def _race(variants, args) -> dict:
  """variants: name -> (step, state, batches). Alternating rounds; name -> median s/step."""
  states = {}
  for name, (step, state, batches) in variants.items():
    states[name], _ = _timed(step, state, batches, 2)  # Compile and warm up.
  times = {name: [] for name in variants}
  for _ in range(args.rounds):
    for name, (step, _, batches) in variants.items():
      states[name], t = _timed(step, states[name], batches, args.steps)
      times[name].append(t)
  return {name: statistics.median(t) for name, t in times.items()}


def _report(title, variants, real_tokens, seconds, baseline: str) -> None:
  print(f'\n{title}')
  print(f'  {"input":<18}{"real tokens/batch":>18}{"s/step":>10}{"real tokens/s":>15}'
        f'{"vs " + baseline:>18}')
  base = real_tokens[baseline] / seconds[baseline]
  for name in variants:
    rate = real_tokens[name] / seconds[name]
    print(f'  {name:<18}{real_tokens[name]:>18.0f}{seconds[name]:>10.4f}{rate:>15,.0f}'
          f'{rate / base:>17.2f}x')


def pretraining_inputs(args, mesh) -> None:
  variants, real = {}, {}
  prepared = None
  for pair_kind in PRETRAINING_INPUTS:
    c = _config(args, pair_kind)
    prepared = prepared or data_lib.load_or_prepare(c)
    it = data_lib.make_train_iterator(c, prepared)
    host = [next(it) for _ in range(args.steps)]
    real[pair_kind] = float(np.mean([b['input_mask'].sum() for b in host]))
    pieces = pretraining.pieces(c, mesh, objectives.build(c, pretraining.vocab_tables(c, prepared)))
    step = pieces.train_step(length_phases.phases(c.train)[0])
    batch_sharding = sharding.batch_sharding(mesh)
    batches = [{k: jax.device_put(v, batch_sharding) for k, v in b.items()} for b in host]
    state = pieces.create_state()
    variants[pair_kind] = (step, state, batches)
  seconds = _race(variants, args)
  _report(f'Pretraining: {args.kind} 2 x 128 (local run), MLM, {args.batch_size} x '
          f'{args.seq_len}, embedded corpus', variants, real, seconds, 'doc_sentences')
  return prepared


def _headline_and_lede(text: str) -> str:
  """BBC News articles open with their headline, then the first sentence."""
  m = re.search(r'[.!?](\s|$)', text)
  return text[:m.end()].strip() if m else text


def finetuning(args, prepared) -> None:
  splits = probe_data.bbc_news()
  rows = splits['train']
  classes = sorted({r['label'] for r in rows})
  examples = finetune_data.Examples(
      texts=[(_headline_and_lede(r['text']),) for r in rows],
      labels=[classes.index(r['label']) for r in rows])
  arrays, _ = tasks.sequence_classification.encode(examples, prepared.tokenizer, args.seq_len)
  c = _config(args, 'packed_documents')
  net = registry.network(c.model)
  model = heads.Classifier(net.config, len(classes), 0.1, pooling='mean')
  task = task_lib.Task(model, net, args.seq_len, task_lib.classification_loss, task_lib.argmax)
  tx = optax.adamw(2e-5)
  order = finetune_data.epoch_order(len(examples), 0, 0)
  inputs = {'padded': [b for b in finetune_data.batches(arrays, args.batch_size, None, order)],
            'packed': [b for b in finetune_data.batches(finetune_data.pack(arrays, order),
                                                        args.batch_size, None)]}
  real = {name: float(np.mean([b['input_mask'].sum() for b in bs[:-1]]))
          for name, bs in inputs.items()}

  @jax.jit
  def step(state, batch):
    params, opt_state, rng = state
    rng, key = jax.random.split(rng)
    (loss, m), grads = jax.value_and_grad(task.loss_fn, has_aux=True)(params, batch, key, None,
                                                                      True)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, rng), dict(m, loss=loss)

  params = task.init(jax.random.key(0))
  variants = {}
  for name, bs in inputs.items():
    state = (params, tx.init(params), jax.random.key(1))
    variants[name] = (step, state, [jax.device_put(b) for b in bs[:-1]])
  seconds = _race(variants, args)
  lengths = arrays['input_mask'].sum(1)
  print(f'  ({len(examples)} train examples: {lengths.mean():.1f} tokens on average, '
        f'{lengths.min()}..{lengths.max()}; one epoch is {len(inputs["padded"])} padded '
        f'batches or {len(inputs["packed"])} packed ones)')
  _report(f'Fine-tuning: {args.kind} 2 x 128, BBC News headline + first sentence, '
          f'{len(classes)} classes, mean pooling, {args.batch_size} x {args.seq_len}',
          variants, real, seconds, 'padded')


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--kind', default='bert', choices=sorted(KINDS))
  p.add_argument('--batch_size', type=int, default=32)
  p.add_argument('--seq_len', type=int, default=128)
  p.add_argument('--steps', type=int, default=10, help='Timed steps per round and variant.')
  p.add_argument('--rounds', type=int, default=3)
  p.add_argument('--prepared_dir', default='/tmp/bench_packing_prepared')
  p.add_argument('--skip_finetuning', action='store_true')
  args = p.parse_args(argv)
  mesh = sharding.make_mesh(config_base.base_config().mesh, jax.devices()[:1])
  print(f'{jax.devices()[0].platform} x 1, {os.cpu_count()} CPU cores')
  prepared = pretraining_inputs(args, mesh)
  if not args.skip_finetuning:
    finetuning(args, prepared)


if __name__ == '__main__':
  main()
