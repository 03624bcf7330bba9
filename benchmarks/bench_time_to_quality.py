r"""Time to quality: held-out MLM accuracy against training wall time and training FLOPs.

  python benchmarks/bench_time_to_quality.py --out=/tmp/ttq                # 600 steps each
  python benchmarks/bench_time_to_quality.py --out=/tmp/ttq --steps=2400 --eval_every=200
  python benchmarks/bench_time_to_quality.py --out=/tmp/ttq --runs=bert,hf_bert

Three runs on the quickstart's network (``configs/bert_small.py``:
``config_base.shrink_for_local_run``, 2 layers x 128, 2 heads, d_ff 512, vocabulary 8000,
batch 32) at one sequence length (128 tokens, 20 predictions per sequence at 15%), on the
embedded corpus, all from one prepared directory (one tokenizer):

* ``bert``: encoder_jax with BERT's recipe on that network: post-LN, MLM on full sentences
  (no NSP, so that the Hugging Face peer trains the same objective), AdamW at 1e-3 with
  5% warmup then linear decay, clipping at 1.0, weight decay 0.01, dropout 0.1.
* ``recipe``: encoder_jax with ``config_base.SMALL_BUDGET_RECIPE`` applied over the same
  network (read when the benchmark runs; a mask rate above 15% raises
  ``train.max_predictions`` to ``ceil(mask_rate * seq_len)``, so no selection is cut).
* ``hf_bert``: Hugging Face ``BertForMaskedLM`` (PyTorch, CPU, float32) of the same size,
  started from the ``bert`` run's initial params (exported with ``interop.hf``), trained on
  the **same corrupted batches** as ``bert``: the same host batches (a second data iterator
  of the same config; a checksum of every batch is compared at the end) and the same masked
  positions and replacements, drawn on the host by the objective's own ``corrupt`` with the
  key the train step derives for that step (``fold_in(fold_in(key(seed), TRAIN), step)``,
  split as ``Composite.loss_fn`` splits it;
  ``tests/benchmarks/test_bench_time_to_quality.py`` checks them against what the compiled
  train step draws). torch ``AdamW`` with the same betas,
  eps and weight decay (none on LayerNorm parameters and biases), ``clip_grad_norm_``, and
  a ``LambdaLR`` that replays the run's schedule (``optimizer.schedule``).

The runs are interleaved, ``--eval_every`` steps of each in turn, so that all three see the
same machine load. Before step 1 and every ``--eval_every`` steps (and at the end) every run
is scored on the **same held-out batches**: ``--eval_batches`` batches of the prepared
held-out split, masked once on the host at BERT's 15% (80/10/10) with a fixed key, whatever
a run's training mask rate, and read without re-masking (MLM loss and accuracy at the masked
positions, a mean over predicted tokens; a tie with the label's logit counts as correct, as
in ``objectives.base.cross_entropy``).

**Wall time** is training time only, measured the same way for every run: the train steps
of each chunk between two evaluations (encoder_jax: batch transfer, masking on device,
forward, backward, update, until the new params are ready; HF: forward, backward, clip,
AdamW step). Left out for every run: evaluation, building the host batches (the same data
iterator for all), and for HF the host-side masking (our ``corrupt``, in place of a data
collator). encoder_jax compiles its step before the clock starts; the compile time is
reported apart.

**FLOPs** are training FLOPs as MFU counts them:
``objectives.build(config).flops_per_sequence(phase) * batch_size`` per step
(``bakeoff.flops_per_step``: encoder at every position, MLM head at the predicted positions).
The HF run is put on the ``bert`` run's figure, the model FLOPs of the same work (HF's MLM
head runs at every position, so the FLOPs it executes are more).

Writes into ``--out``: ``time_to_quality.png`` (accuracy against wall time and against
FLOPs), ``time_to_quality.json`` (per run and evaluation: step, wall seconds, FLOPs,
held-out loss and accuracy) and ``time_to_quality.md`` (final accuracy, loss, wall time,
tokens/s, and the wall time and FLOPs each run needed to first reach the ``bert`` run's
final accuracy, at evaluation granularity), also printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RUNS = ('bert', 'recipe', 'hf_bert')
DESCRIPTIONS = {
    'bert': "encoder_jax, BERT's recipe (post-LN, MLM, AdamW 1e-3 linear, dropout 0.1)",
    'recipe': 'encoder_jax, config_base.SMALL_BUDGET_RECIPE',
    'hf_bert': "Hugging Face BertForMaskedLM (PyTorch), bert's init and batches",
}
# The held-out masks: BERT's 15% (80% [MASK], 10% random, 10% kept) from this key, for
# every run whatever it trains with.
HELD_OUT_MASK_SEED = 20240607
HELD_OUT_MASK_RATE = 0.15
# --tiny: the tests' network and corpus (tests/support/tiny_config.py), one short length.
TINY = dict(model=dict(vocab_size=1000, hidden_size=32, num_layers=2, num_heads=2,
                       intermediate_size=64, max_position_embeddings=32),
            sources='embedded;max_documents=300', batch_size=8, seq_len=32,
            max_predictions=5)


# ----------------------------------------------------------------------------- configs


def _network_config(args):
  """The quickstart's network and data (``shrink_for_local_run``) at one length."""
  from encoder_jax.config import schema as config_base
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  seq_len, max_predictions = 128, 20
  if args.tiny:
    c.model.update(TINY['model'])
    c.data.sources = TINY['sources']
    c.train.batch_size = TINY['batch_size']
    seq_len, max_predictions = TINY['seq_len'], TINY['max_predictions']
  c.train.update(num_steps=args.steps, seq_lens=(seq_len,), max_predictions=(max_predictions,),
                 phase_fractions=(1.0,), eval_batches=args.eval_batches, grad_accum_steps=1)
  c.optim.warmup_steps = max(1, round(0.05 * args.steps))
  c.checkpoint.async_save = False
  if args.prepared_dir:
    c.data.prepared_dir = args.prepared_dir
  return c


def bert_config(args):
  """BERT's recipe on the network, MLM only on full sentences (the HF peer's objective)."""
  c = _network_config(args)
  c.model.update(pre_norm=False, hidden_dropout_rate=0.1, attention_dropout_rate=0.1)
  c.objective.update(names=('mlm',), mask_rate=0.15)
  c.data.pair_kind = 'full_sentences'
  c.optim.update(name='adamw', learning_rate=1e-3, schedule='linear', grad_clip_norm=1.0,
                 weight_decay=0.01)
  return c


def recipe_config(args):
  """``config_base.SMALL_BUDGET_RECIPE`` (as it is now) over the same network."""
  from encoder_jax.config import schema as config_base
  c = _network_config(args)
  config_base.apply_recipe(c, config_base.SMALL_BUDGET_RECIPE)
  rate, (seq_len,) = float(c.objective.mask_rate), tuple(c.train.seq_lens)
  if rate > HELD_OUT_MASK_RATE:  # masking.selection_budget caps the selection at P.
    c.train.max_predictions = tuple(max(p, math.ceil(rate * seq_len))
                                    for p in c.train.max_predictions)
  return c


CONFIGS = {'bert': bert_config, 'recipe': recipe_config}


def prepared_for(configs: dict):
  """One prepared directory for every config (the first's), refusing a recipe that would
  change the prepared content (another tokenizer or vocabulary)."""
  from encoder_jax import data as data_lib
  from encoder_jax.data import preparation
  first = next(iter(configs.values()))
  fields = preparation.content_fields(first)
  directory = preparation.prepared_directory(first, fields)
  for name, c in configs.items():
    theirs = preparation.content_fields(c)
    if theirs != fields:
      diff = {k: (fields.get(k), theirs.get(k)) for k in set(fields) | set(theirs)
              if fields.get(k) != theirs.get(k)}
      raise ValueError(f'run {name!r} changes the prepared data {diff}: this benchmark '
                       'compares every run on one prepared directory (one tokenizer)')
    c.data.prepared_dir = directory
  return data_lib.load_or_prepare(first)


# ----------------------------------------------------------------------------- batches


def _composite(objective):
  from encoder_jax.objectives import base
  if not isinstance(objective, base.Composite):
    raise ValueError(f'{objective.name}: only objectives composed on one network '
                     '(objectives.base.Composite) are supported here')
  return objective


def train_corruption(config, objective, phase):
  """A jitted ``(host batch, step) -> corrupted batch`` (numpy): what the train step of
  ``steps.Pieces.train_step`` draws at that step (its key ``fold_in(fold_in(key(seed),
  TRAIN), step)``, split as ``Composite.loss_fn`` splits it, each objective's own
  ``corrupt``)."""
  import jax
  import numpy as np
  from encoder_jax.run import train_state
  if int(config.train.grad_accum_steps) != 1:
    raise ValueError('train.grad_accum_steps must be 1 (micro-batches fold in their index)')
  subs = _composite(objective).objectives
  base_key = jax.random.fold_in(jax.random.key(config.seed), train_state.TRAIN)

  @jax.jit
  def corrupt(batch, step):
    rngs = jax.random.split(jax.random.fold_in(base_key, step), len(subs) + 1)
    for o, key in zip(subs, rngs[1:]):
      batch = o.corrupt(batch, key, phase)
    return batch

  return lambda batch, step: jax.tree.map(np.asarray, corrupt(batch, np.int32(step)))


def held_out_batches(config, prepared, tables, phase) -> list[dict]:
  """``train.eval_batches`` held-out batches of ``config``, masked once at 15% (BERT's
  80/10/10, uniform replacements) from a fixed key: the same for every run."""
  import jax
  import numpy as np
  from encoder_jax import data as data_lib
  from encoder_jax.objectives import masking
  from encoder_jax.objectives import mlm
  masker = mlm.MaskedLM(masking.MaskingRecipe(
      mask_rate=HELD_OUT_MASK_RATE, mask_token_rate=0.8, random_token_rate=0.1,
      random_token_distribution='uniform'), tables)
  corrupt = jax.jit(lambda batch, key: masker.corrupt(batch, key, phase))
  key = jax.random.key(HELD_OUT_MASK_SEED)
  batch_size = int(config.train.batch_size)
  out = []
  for i, batch in enumerate(data_lib.make_eval_iterator(config, prepared, phase.seq_len,
                                                        rows=(0, batch_size))):
    if batch['input_ids'].shape[0] != batch_size:
      break
    out.append(jax.tree.map(np.asarray, corrupt(batch, jax.random.fold_in(key, i))))
  if not out:
    raise ValueError(f'the held-out split of {prepared.directory} gave no full batch')
  return out


def batch_digest(batch) -> str:
  h = hashlib.sha1()
  for k in sorted(batch):
    h.update(k.encode())
    h.update(batch[k].tobytes())
  return h.hexdigest()[:16]


def _premasked_scorer(objective):
  """The run's network with an MLM objective that reads a batch's masks as given."""
  from encoder_jax.objectives import base
  from encoder_jax.objectives import mlm

  class Premasked(mlm.MaskedLM):
    def corrupt(self, batch, rng, phase):
      del rng, phase
      return batch

  return base.Composite([Premasked(None, None)], _composite(objective).network)


# ----------------------------------------------------------------------------- runs


class JaxRun:
  """One encoder_jax run driven here: its pieces' train step on the data iterator."""

  def __init__(self, name: str, config, prepared, device):
    import jax
    from encoder_jax import bakeoff
    from encoder_jax import data as data_lib
    from encoder_jax import objectives
    from encoder_jax.core import length_phases
    from encoder_jax.core import sharding
    from encoder_jax.run import pretraining
    from encoder_jax.config import validation
    validation.validate(config)
    self.name, self.config = name, config
    self.mesh = sharding.make_mesh(config.mesh, [device])
    (self.phase,) = length_phases.phases(config.train)
    self.batch_size = int(config.train.batch_size)
    self.tables = pretraining.vocab_tables(config, prepared)
    self.objective = _composite(objectives.build(config, self.tables))
    self.pieces = pretraining.pieces(config, self.mesh, self.objective)  # The batch checked too.
    self.schedule_fn = self.pieces.schedule
    self.state = self.pieces.create_state()
    self.iterator = data_lib.make_train_iterator(config, prepared, rows=(0, self.batch_size))
    self.batch_sharding = sharding.batch_sharding(self.mesh)
    self.flops_per_step = bakeoff.flops_per_step(config)
    self.step, self.wall_s, self.compile_s = 0, 0.0, 0.0
    self.digests: list[str] = []
    self.train_losses: list[float] = []
    self._compiled = None
    self._scorer = _premasked_scorer(self.objective)
    self._eval_step = jax.jit(lambda p, b, i: self._scorer.loss_fn(
        p, b, jax.random.key(0), self.phase, False)[1])
    self._jax, self._train = jax, pretraining

  def initial_network_params(self):
    """(EncoderConfig, numpy params) of the network before any step."""
    import numpy as np
    network, params = self.objective.downstream(self.state.params)
    return network.config, self._jax.tree.map(np.asarray, self._jax.device_get(params))

  def _global(self, batch):
    from encoder_jax.run import feeding
    return feeding.to_global(batch, self.batch_sharding, self.batch_size)

  def _compile(self, batch) -> None:
    """Compiles the train step ahead of its first timed call (timed apart)."""
    jax = self._jax
    step_fn = self.pieces.train_step(self.phase)
    spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=self.batch_sharding)
            for k, v in batch.items()}
    t = time.perf_counter()
    self._compiled = step_fn.lower(self.state, spec).compile()
    self.compile_s = time.perf_counter() - t

  def train(self, steps: int) -> None:
    jax = self._jax
    batches = [next(self.iterator) for _ in range(steps)]  # Host data: not timed.
    self.digests += [batch_digest(b) for b in batches]
    if self._compiled is None:
      self._compile(batches[0])
    losses = []
    t = time.perf_counter()
    for batch in batches:
      self.state, m = self._compiled(self.state, self._global(batch))
      losses.append(m['loss'])
    jax.block_until_ready(self.state)
    self.wall_s += time.perf_counter() - t
    self.train_losses += [float(x) for x in jax.device_get(losses)]
    self.step += steps

  def score(self, batches) -> dict[str, float]:
    params = self.objective.downstream(self.state.params)[1]
    m = self._train.evaluate(self._eval_step, params, batches, self.mesh, self._scorer,
                             self.batch_size)
    return dict(loss=m['mlm_loss'], accuracy=m['mlm_accuracy'],
                predictions=int(m['mlm_predictions']))

  def training_batch_loss(self, batch, step: int, corrupted) -> dict[str, float]:
    """The train step's own objective (its masks drawn from the step's key, no dropout)
    beside the same params scoring ``corrupted`` as given: equal iff the host drew the
    step's masks."""
    from encoder_jax.run import train_state
    jax = self._jax
    rng = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.config.seed),
                                                train_state.TRAIN), step)
    own = jax.jit(lambda p, b, r: self.objective.loss_fn(p, b, r, self.phase, False)[1])
    params = self.objective.downstream(self.state.params)[1]
    return dict(train_step_masks=float(own(self.state.params, self._global(batch),
                                           rng)['mlm_loss']),
                host_masks=float(self._eval_step(params, self._global(corrupted),
                                                 0)['mlm_loss']))


class HfRun:
  """Hugging Face ``BertForMaskedLM`` (PyTorch, CPU, float32) on ``bert``'s batches."""

  def __init__(self, bert: JaxRun, prepared, threads: int):
    import numpy as np
    from encoder_jax import data as data_lib
    from encoder_jax.core import extras
    from encoder_jax.interop import hf
    from encoder_jax.interop import registry
    what = 'the hf_bert run trains Hugging Face BertForMaskedLM'
    torch = extras.require('torch', extra='peers', what=what)
    transformers = extras.require('transformers', extra='peers', what=what)
    self.name = 'hf_bert'
    self.torch = torch
    torch.manual_seed(0)  # Dropout.
    torch.set_num_threads(threads)
    config = bert.config
    encoder_config, params = bert.initial_network_params()
    hf_config = hf.hf_config_from(encoder_config, pad_token_id=prepared.tokenizer.pad_id)
    self.model = transformers.BertForMaskedLM(transformers.BertConfig(
        **hf_config, attn_implementation='sdpa'))
    state = hf.params_to_hf(params, encoder_config)
    missing, _ = self.model.load_state_dict(
        {k: torch.tensor(v) for k, v in state.items()}, strict=False)
    spec = registry.hf_spec(encoder_config.kind)
    if set(missing) - set(spec.tied) - set(spec.buffers):  # Pooler/NSP: not in this class.
      raise ValueError(f'BertForMaskedLM params not set from the export: {missing}')
    assert self.model.get_output_embeddings().weight is self.model.get_input_embeddings().weight
    o = config.optim
    named = list(self.model.named_parameters())
    no_decay = lambda n: 'bias' in n or 'LayerNorm' in n
    self.params = [p for _, p in named]
    self.opt = torch.optim.AdamW(
        [dict(params=[p for n, p in named if not no_decay(n)], weight_decay=o.weight_decay),
         dict(params=[p for n, p in named if no_decay(n)], weight_decay=0.0)],
        lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
    steps = int(config.train.num_steps)
    table = np.asarray(bert._jax.vmap(bert.schedule_fn)(np.arange(steps + 1)), np.float64)
    peak = float(o.learning_rate)
    self.sched = torch.optim.lr_scheduler.LambdaLR(
        self.opt, lambda s: table[min(s, steps)] / peak)
    self.clip = float(o.grad_clip_norm)
    self.iterator = data_lib.make_train_iterator(config, prepared, rows=(0, bert.batch_size))
    self.corrupt = train_corruption(config, bert.objective, bert.phase)
    self.flops_per_step = bert.flops_per_step  # The same model FLOPs (see the docstring).
    self.step, self.wall_s, self.compile_s = 0, 0.0, 0.0
    self.digests: list[str] = []
    self.train_losses: list[float] = []

  def inputs(self, corrupted, labels: bool = True) -> dict:
    """HF's inputs of a corrupted batch; labels at the masked positions, -100 elsewhere."""
    import numpy as np
    t = lambda x: self.torch.from_numpy(np.asarray(x, np.int64))
    out = dict(input_ids=t(corrupted['masked_input_ids']),
               token_type_ids=t(corrupted['segment_ids']),
               attention_mask=t(corrupted['input_mask']))
    if labels:
      lab = np.full(corrupted['input_ids'].shape, -100, np.int64)
      rows, slots = np.nonzero(corrupted['masked_weights'])
      lab[rows, corrupted['masked_positions'][rows, slots]] = corrupted['masked_labels'][
          rows, slots]
      out['labels'] = t(lab)
    return out

  def train(self, steps: int) -> None:
    torch = self.torch
    batches = [next(self.iterator) for _ in range(steps)]  # Host data and masks: not timed.
    self.digests += [batch_digest(b) for b in batches]
    inputs = [self.inputs(self.corrupt(b, self.step + i)) for i, b in enumerate(batches)]
    self.model.train()
    losses = []
    t = time.perf_counter()
    for x in inputs:
      self.opt.zero_grad(set_to_none=True)
      loss = self.model(**x).loss
      loss.backward()
      if self.clip:
        torch.nn.utils.clip_grad_norm_(self.params, self.clip)
      self.opt.step()
      self.sched.step()
      losses.append(loss.detach())
    self.wall_s += time.perf_counter() - t
    self.train_losses += [float(x) for x in losses]
    self.step += steps

  def loss_of(self, corrupted) -> tuple[float, float, float]:
    """(summed loss, summed correct, predictions) at the masked positions, no dropout."""
    torch = self.torch
    self.model.eval()
    with torch.no_grad():
      logits = self.model(**self.inputs(corrupted, labels=False)).logits
      pos = torch.from_numpy(corrupted['masked_positions'].astype('int64'))
      logits = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1])).float()
      labels = torch.from_numpy(corrupted['masked_labels'].astype('int64'))
      w = torch.from_numpy(corrupted['masked_weights'].astype('float32'))
      label = logits.gather(-1, labels[..., None])[..., 0]
      nll = torch.logsumexp(logits, -1) - label
      correct = (label >= logits.max(-1).values).float()
    return float((nll * w).sum()), float((correct * w).sum()), float(w.sum())

  def score(self, batches) -> dict[str, float]:
    totals = [sum(x) for x in zip(*(self.loss_of(b) for b in batches))]
    return dict(loss=totals[0] / totals[2], accuracy=totals[1] / totals[2],
                predictions=int(totals[2]))


# ----------------------------------------------------------------------------- reports


def reach(evals: list[dict], target: float, predictions: int):
  """The first evaluation at or above ``target`` accuracy, or None. Accuracies are shares
  of the same ``predictions`` held-out tokens: half a token of slack absorbs the rounding
  of two ways of averaging (ours per batch then weighted, HF's over all tokens)."""
  return next((e for e in evals if e['accuracy'] >= target - 0.5 / predictions), None)


def _si(x: float) -> str:
  return f'{x:.3g}' if x < 1e3 else f'{x:.3e}'.replace('e+', 'e')


def table(results: dict) -> str:
  s, target = results['settings'], results['target']
  lines = [
      f'Time to quality: {s["network"]}, batch {s["batch_size"]} x {s["seq_len"]}, '
      f'{s["steps"]} steps per run, held-out MLM on {s["held_out_batches"]} batches '
      f'({s["held_out_predictions"]} masked tokens, 15%, one fixed draw for every run); '
      f'{s["machine"]}.',
      '',
      f'| run | final held-out MLM accuracy | loss | training wall s | tokens/s | '
      f'time to {target["accuracy"]:.2%} | FLOPs to {target["accuracy"]:.2%} |',
      '|---|---|---|---|---|---|---|',
  ]
  for name, r in results['runs'].items():
    last = r['evals'][-1]
    hit = reach(r['evals'], target['accuracy'], s['held_out_predictions'])
    lines.append(
        f'| {name} | {last["accuracy"]:.2%} | {last["loss"]:.3f} | {last["wall_s"]:.1f} | '
        f'{r["tokens_per_s"]:,.0f} | '
        + (f'{hit["wall_s"]:.1f} s (step {hit["step"]}) | {_si(hit["flops"])} |' if hit
           else 'not reached | not reached |'))
  lines += [
      '',
      f'Target: the `{target["run"]}` run\'s final held-out accuracy, {target["accuracy"]:.2%}; '
      'a run reaches it at the first evaluation (every '
      f'{s["eval_every"]} steps) at or above it. Wall time: training steps only (evaluation, '
      'host batches and HF\'s host-side masking excluded; encoder_jax compiles before the '
      'clock: ' + ', '.join(f'{n} {r["compile_s"]:.1f} s' for n, r in results['runs'].items()
                           if r['compile_s']) + '). FLOPs: model FLOPs as MFU counts them; '
      'hf_bert is put on bert\'s figure (the same network and work; HF\'s MLM head runs at '
      'every position, so it executes more).',
  ]
  checks = results.get('checks', {})
  if checks:
    lines.append('Checks: ' + '; '.join(f'{k} = {v}' for k, v in checks.items()) + '.')
  return '\n'.join(lines)


def plot(results: dict, path: str) -> None:
  from encoder_jax.core import extras  # pylint: disable=g-import-not-at-top
  Figure = extras.require(  # pylint: disable=invalid-name
      'matplotlib.figure', extra='plot', what='time_to_quality.png is drawn with matplotlib'
  ).Figure
  fig = Figure(figsize=(12, 4.6), layout='constrained')
  axes = fig.subplots(1, 2, sharey=True)
  target = results['target']
  for i, (name, r) in enumerate(results['runs'].items()):
    ys = [100 * e['accuracy'] for e in r['evals']]
    for ax, key in zip(axes, ('wall_s', 'flops')):
      ax.plot([e[key] for e in r['evals']], ys, marker='o', markersize=4, color=f'C{i}',
              linestyle='--' if name == 'hf_bert' else '-',  # bert's FLOPs: not hidden.
              label=f'{name}: {DESCRIPTIONS[name]}')
  for ax, xlabel in zip(axes, ('training wall time (s; evaluation excluded)',
                               'training FLOPs (model FLOPs as MFU counts them; '
                               'hf_bert: bert\'s)')):
    ax.axhline(100 * target['accuracy'], color='gray', linestyle=':', linewidth=1,
               label=f'{target["run"]} final ({target["accuracy"]:.1%})')
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('held-out MLM accuracy (%)')
  axes[0].legend(fontsize=8, loc='lower right')
  s = results['settings']
  fig.suptitle(f'Time to quality: {s["network"]}, batch {s["batch_size"]} x {s["seq_len"]}, '
               f'{s["steps"]} steps; {s["machine"]}', fontsize=9)
  fig.savefig(path, dpi=120)


# ----------------------------------------------------------------------------- main


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--out', required=True, help='Directory for the PNG, JSON and Markdown.')
  ap.add_argument('--steps', type=int, default=600, help='Training steps of every run.')
  ap.add_argument('--eval_every', type=int, default=100)
  ap.add_argument('--eval_batches', type=int, default=8)
  ap.add_argument('--runs', default=','.join(RUNS), help=f'Comma-separated of {RUNS}.')
  ap.add_argument('--tiny', action='store_true',
                  help='The tests\' network (2 x 32, vocabulary 1000, batch 8 x 32, 300 '
                  'documents): seconds, not a measurement.')
  ap.add_argument('--prepared_dir', default='',
                  help='Where the prepared data lives (default data/prepared/<config hash>).')
  ap.add_argument('--torch_threads', type=int, default=os.cpu_count() or 1,
                  help='torch.set_num_threads for the HF run (default: every core, as JAX '
                  'uses; on a loaded machine fewer threads avoid OpenMP oversubscription).')
  args = ap.parse_args(argv)
  args.runs = [r for r in args.runs.split(',') if r]
  bad = [r for r in args.runs if r not in RUNS]
  if bad or not args.runs:
    ap.error(f'--runs: unknown {bad}; choose from {RUNS}')
  if args.steps < 1 or args.eval_every < 1 or args.eval_batches < 1:
    ap.error('--steps, --eval_every and --eval_batches must be >= 1')
  return args


def eval_steps(steps: int, every: int) -> list[int]:
  return sorted(set(range(0, steps, every)) | {steps})


def build_runs(args) -> tuple[dict, dict, object, object, list]:
  """The runs of ``args.runs`` (hf_bert needs bert's, built even when not asked for), the
  JAX runs, the first of them, the prepared data and the held-out batches."""
  import jax

  names = args.runs
  configs = {n: CONFIGS[n](args) for n in ('bert', 'recipe')
             if n in names or (n == 'bert' and 'hf_bert' in names)}
  prepared = prepared_for(configs)
  device = jax.devices()[0]
  jax_runs = {n: JaxRun(n, c, prepared, device) for n, c in configs.items()}
  runs = {n: jax_runs[n] for n in names if n in jax_runs}
  if 'hf_bert' in names:
    runs['hf_bert'] = HfRun(jax_runs['bert'], prepared, args.torch_threads)
  first = jax_runs['bert'] if 'bert' in jax_runs else next(iter(jax_runs.values()))
  held_out = held_out_batches(configs['bert'] if 'bert' in configs else first.config,
                              prepared, first.tables, first.phase)
  return runs, jax_runs, first, prepared, held_out


def first_batch_checks(jax_runs: dict, runs: dict, prepared) -> dict:
  """Step 1's batch, before any update: our masks and HF's weights."""
  from encoder_jax import data as data_lib

  checks = {}
  if 'hf_bert' in runs:
    bert, hf_run = jax_runs['bert'], runs['hf_bert']
    batch = next(data_lib.make_train_iterator(bert.config, prepared, rows=(0, bert.batch_size)))
    corrupted = hf_run.corrupt(batch, 0)
    losses = bert.training_batch_loss(batch, 0, corrupted)
    hf_loss = hf_run.loss_of(corrupted)
    checks['step-1 batch: |train-step masks - host masks| loss'] = (
        f'{abs(losses["train_step_masks"] - losses["host_masks"]):.2e}')
    checks['step-1 batch: |encoder_jax - HF| loss at init (no dropout)'] = (
        f'{abs(losses["host_masks"] - hf_loss[0] / hf_loss[2]):.2e}')
  return checks


def evaluate_all(runs: dict, held_out: list, evals: dict):
  """Scores every run on the held-out batches (appended to ``evals``); the last predictions."""
  for n, r in runs.items():
    m = r.score(held_out)
    evals[n].append(dict(step=r.step, wall_s=r.wall_s, flops=r.step * r.flops_per_step,
                         loss=m['loss'], accuracy=m['accuracy']))
    print(f'  step {r.step:5d}  {n:8s} wall {r.wall_s:8.1f} s  held-out MLM loss '
          f'{m["loss"]:.4f}  accuracy {m["accuracy"]:.2%}', flush=True)
  return m['predictions']


def train_interleaved(args, runs: dict, held_out: list) -> tuple[dict, object]:
  """Every run, ``--eval_every`` steps in turn, scored before step 1 and after each chunk."""
  evals = {n: [] for n in runs}
  predictions = evaluate_all(runs, held_out, evals)
  points = eval_steps(args.steps, args.eval_every)
  for start, end in zip(points, points[1:]):
    for r in runs.values():  # Interleaved: every run sees the same machine load.
      r.train(end - start)
    evaluate_all(runs, held_out, evals)
  return evals, predictions


def final_checks(runs: dict, evals: dict, checks: dict) -> None:
  if 'hf_bert' in runs and 'bert' in runs:
    checks['same host batches (bert, hf_bert)'] = runs['bert'].digests == runs['hf_bert'].digests
  if 'hf_bert' in runs:
    step0 = {n: evals[n][0]['loss'] for n in ('bert', 'hf_bert') if n in evals}
    if len(step0) == 2:
      checks['|bert - hf_bert| held-out loss at step 0'] = (
          f'{abs(step0["bert"] - step0["hf_bert"]):.2e}')


def results_of(args, runs: dict, first, prepared, held_out: list, evals: dict, predictions,
               checks: dict) -> dict:
  """What time_to_quality.json holds: the settings, the target, the checks and every run."""
  import jax
  import numpy as np

  target_run = 'bert' if 'bert' in runs else args.runs[0]
  c0 = first.config
  results = dict(
      settings=dict(
          network=(f'{c0.model.num_layers} layers x {c0.model.hidden_size}, '
                   f'{c0.model.num_heads} heads, d_ff {c0.model.intermediate_size}, vocabulary '
                   f'{c0.model.vocab_size}'),
          batch_size=first.batch_size, seq_len=first.phase.seq_len, steps=args.steps,
          eval_every=args.eval_every, held_out_batches=len(held_out),
          held_out_predictions=predictions, prepared_dir=str(prepared.directory),
          machine=f'{os.cpu_count()} CPU cores ({platform.machine()}), JAX '
                  f'{jax.default_backend()} {jax.__version__}' + (
                      f', torch {runs["hf_bert"].torch.__version__} '
                      f'({args.torch_threads} threads)' if 'hf_bert' in runs else '')),
      target=dict(run=target_run, accuracy=evals[target_run][-1]['accuracy']),
      checks=checks,
      runs={n: dict(
          description=DESCRIPTIONS[n],
          flops_per_step=r.flops_per_step, compile_s=r.compile_s,
          tokens_per_s=r.step * first.batch_size * first.phase.seq_len / max(r.wall_s, 1e-9),
          max_predictions=(int(r.phase.max_predictions) if hasattr(r, 'phase')
                           else int(first.phase.max_predictions)),
          train_loss_last=float(np.mean(r.train_losses[-max(1, args.eval_every // 5):])),
          evals=evals[n]) for n, r in runs.items()},
  )
  if 'recipe' in runs:
    from encoder_jax.config import schema as config_base
    results['settings']['small_budget_recipe'] = {
        s: {k: list(v) if isinstance(v, tuple) else v for k, v in f.items()}
        for s, f in config_base.SMALL_BUDGET_RECIPE.items()}
  return results


def write(out: str, results: dict) -> None:
  with open(os.path.join(out, 'time_to_quality.json'), 'w') as f:
    json.dump(results, f, indent=2)
  text = table(results)
  with open(os.path.join(out, 'time_to_quality.md'), 'w') as f:
    f.write(text + '\n')
  plot(results, os.path.join(out, 'time_to_quality.png'))
  print(text)
  print(f'wrote {os.path.join(out, "time_to_quality.png")}, .json, .md')


def main(argv=None) -> dict:
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  runs, jax_runs, first, prepared, held_out = build_runs(args)
  checks = first_batch_checks(jax_runs, runs, prepared)
  print(f'time to quality: runs {", ".join(runs)}; {args.steps} steps, evaluation every '
        f'{args.eval_every} on {len(held_out)} held-out batches; data {prepared.directory}',
        flush=True)
  evals, predictions = train_interleaved(args, runs, held_out)
  final_checks(runs, evals, checks)
  results = results_of(args, runs, first, prepared, held_out, evals, predictions, checks)
  write(args.out, results)
  return results

if __name__ == '__main__':
  main()
