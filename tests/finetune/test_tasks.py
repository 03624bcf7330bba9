"""Every registered fine-tuning task trains, resumes exactly and evaluates, on tiny data.

One test over ``finetune.tasks.REGISTRY``: a task registered without data here fails it.
Each run is two epochs of two steps (16 examples, batches of 8); the second run is stopped in
its second epoch (the SIGTERM path: checkpoint, exit) and rerun, and must end with the very
params and scores of the run never stopped (dropout on: the resumed steps must redraw the same
keys).
"""

from __future__ import annotations

import glob
import json
import os
import re

import jax
import numpy as np
import pytest

from encoder_jax.run import engine
from encoder_jax.finetune import config as finetune_config
from encoder_jax.finetune import tasks
from encoder_jax.finetune import train

import support
from support import hf_fixtures


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

GOOD = ['the film was good.', 'a great movie!', 'it was great.', 'good, good, good.']
BAD = ['the film was bad.', 'a terrible movie!', 'it was terrible.', 'bad, bad, bad.']
CONTEXT = 'john lives in paris and works at google in london since the war.'
QUESTIONS = [('q1', 'where does john live?', 'paris'), ('q2', 'who lives in paris?', 'john'),
             ('q3', 'where does john work?', 'google'), ('q4', 'since when?', 'the war'),
             ('q5', 'which city has google?', 'london'), ('q6', 'who works?', 'john'),
             ('q7', 'what is in london?', 'google'), ('q8', 'what city?', 'paris')]


def _jsonl(path, rows) -> str:
  """Twice the rows: 16 examples, two batches of 8 (one row per simulated device)."""
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows * 2))
  return f'jsonl:{path}'


def _sentiment(tmp, c):
  rows = [{'sentence': s, 'label': 'positive'} for s in GOOD]
  rows += [{'sentence': s, 'label': 'negative'} for s in BAD]
  c.data.train = c.data.eval = _jsonl(tmp / 'sst.jsonl', rows)


def _similarity(tmp, c):
  rows = [{'sentence1': a, 'sentence2': b, 'label': float(i % 5)}
          for i, (a, b) in enumerate(zip(GOOD + BAD, BAD + GOOD))]
  c.data.train = c.data.eval = _jsonl(tmp / 'sts.jsonl', rows)
  c.data.text_fields = ('sentence1', 'sentence2')


def _tagging(tmp, c):
  rows = [{'tokens': s.split(), 'tags': t.split()} for s, t in [
      ('john lives in paris', 'B-PER O O B-LOC'), ('google is in london', 'B-ORG O O B-LOC'),
      ('the film was good', 'O O O O'), ('john works at google', 'B-PER O O B-ORG')] * 2]
  c.data.train = c.data.eval = _jsonl(tmp / 'ner.jsonl', rows)


def _squad(tmp, c):
  doc = {'data': [{'paragraphs': [{'context': CONTEXT, 'qas': [
      {'id': f'{i}{k}', 'question': q,
       'answers': [{'text': a, 'answer_start': CONTEXT.index(a)}]}
      for k in range(2) for i, q, a in QUESTIONS]}]}]}
  (tmp / 'squad.json').write_text(json.dumps(doc))
  c.data.train = c.data.eval = f'json:{tmp / "squad.json"}'
  c.task_settings.update(doc_stride=8, max_query_length=8)


def _nli(tmp, c, labelled=True):
  pairs = list(zip(GOOD + BAD, GOOD[1:] + BAD[:1] + BAD[1:] + GOOD[:1]))
  rows = [{'premise': a, 'hypothesis': b, 'label': ['same', 'other'][i % 2]}
          for i, (a, b) in enumerate(pairs)]
  c.data.train = _jsonl(tmp / 'nli.jsonl', rows if labelled else [
      {'premise': r['premise'], 'hypothesis': r['hypothesis']} for r in rows])
  c.data.text_fields = ('premise', 'hypothesis')
  sts = [{'sentence1': a, 'sentence2': b, 'label': float(i)} for i, (a, b) in enumerate(pairs)]
  c.data.eval = _jsonl(tmp / 'sts.jsonl', sts)
  c.pooling = 'mean'


# Each task's tiny data and the metric its scorer must report.
TASK_DATA = {
    'sequence_classification': (_sentiment, 'accuracy'),
    'sequence_regression': (_similarity, 'pearson'),
    'token_classification': (_tagging, 'f1'),
    'question_answering': (_squad, 'exact'),
    'sbert_classification': (_nli, 'spearman'),
    'sbert_contrastive': (lambda tmp, c: _nli(tmp, c, labelled=False), 'spearman'),
}


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('hf'))
  vocab_size = hf_fixtures.write_vocab(os.path.join(path, 'vocab.txt'))
  hf_fixtures.random_hf_model(vocab_size=vocab_size, hidden_size=16, num_layers=1, num_heads=2,
                              intermediate_size=24, max_positions=40).save_pretrained(path)
  return path


@pytest.mark.slow  # A fine-tuning run per task, resumed.
@pytest.mark.parametrize('name', sorted(tasks.REGISTRY))
def test_every_task_trains_resumes_and_evaluates(name, hf_dir, tmp_path, monkeypatch, capsys):
  assert name in TASK_DATA, f'task {name!r} is registered but has no data in this test'
  write, metric = TASK_DATA[name]
  c = finetune_config.base_config()
  c.task, c.init.hf_dir, c.dropout_rate = name, hf_dir, 0.1
  c.data.max_len = 32
  c.optim.update(learning_rate=1e-3, epochs=2, batch_size=8, eval_batch_size=8)
  write(tmp_path, c)
  pretrained = train.load_pretrained(c)  # Once for the three runs: the same encoder.
  whole = train.finetune(c, str(tmp_path / 'whole'), pretrained=pretrained)
  programs = dict(engine._PROGRAMS)  # pylint: disable=protected-access
  real_at = engine.Preempted.at
  monkeypatch.setattr(engine.Preempted, 'at', lambda self, step: step == 3 or real_at(self, step))
  stopped = train.finetune(c, str(tmp_path / 'split'), pretrained=pretrained)
  assert stopped['preempted'] and (stopped['epoch'], stopped['step']) == (2, 3), stopped
  monkeypatch.setattr(engine.Preempted, 'at', real_at)
  resumed = train.finetune(c, str(tmp_path / 'split'), pretrained=pretrained)
  assert 'resuming from checkpoint step 3' in capsys.readouterr().out
  # The same task and config again in this process: its traced steps (train, predict) are
  # the first run's.
  assert {k[0] for k in programs} >= {'train', 'predict'}
  assert dict(engine._PROGRAMS) == programs  # pylint: disable=protected-access
  jax.tree.map(np.testing.assert_array_equal, train.read_final_params(str(tmp_path / 'whole')),
               train.read_final_params(str(tmp_path / 'split')))
  assert np.isfinite(whole[f'eval_{metric}']) and whole['step'] == resumed['step']
  assert resumed[f'eval_{metric}'] == whole[f'eval_{metric}'], (whole, resumed)


def test_an_unknown_task_names_the_registered_ones():
  with pytest.raises(ValueError, match=r"config.task='nope'.*sequence_classification"):
    tasks.get('nope')
  c = finetune_config.base_config()
  c.task = 'nope'
  with pytest.raises(ValueError, match=r"config.task='nope': expected a fine-tuning task"):
    train.finetune(c)


def test_no_task_name_branches_outside_the_registry():
  """What differs per task is declared by its entry: no code outside ``finetune/tasks``
  compares a task's or an objective's name."""
  root = os.path.join(support.ROOT, 'encoder_jax')
  compares = re.compile(r"""\b\w*(task|objective)\w*\s*(==|!=)\s*['"]""")
  names = re.compile(r"""(==|!=)\s*['"](%s)['"]""" % '|'.join(tasks.REGISTRY))
  offenders = []
  for path in glob.glob(os.path.join(root, '**', '*.py'), recursive=True):
    if os.path.join('finetune', 'tasks') in path:
      continue
    for i, line in enumerate(open(path, encoding='utf-8'), start=1):
      if compares.search(line) or names.search(line):
        offenders.append(f'{os.path.relpath(path, root)}:{i}: {line.strip()}')
  assert not offenders, '\n'.join(offenders)
