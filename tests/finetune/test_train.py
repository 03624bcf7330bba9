"""Fine-tuning heads, data (TSV / JSONL / a locally built tfds dataset) and metrics."""

from __future__ import annotations

import json
import os

import jax
import ml_collections
import numpy as np
import pytest

from encoder_jax.core import optimizer
from encoder_jax.run import train_state
from encoder_jax.finetune import config as finetune_config
from encoder_jax.finetune import data as data_lib
from encoder_jax.finetune import scores as metrics
from encoder_jax.finetune import train
from encoder_jax.finetune.tasks import sequence_classification
from encoder_jax.finetune.tasks import token_classification

import support
from support import hf_fixtures


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

TASK_FILES = {'sequence_classification': sequence_classification,
              'token_classification': token_classification}
GOOD = ['the film was good.', 'a great movie!', 'good film and a great city.',
        'it was great.', 'the movie is good, the mat is good.', 'great, great, great.']
BAD = ['the film was bad.', 'a terrible movie!', 'bad film and a terrible city.',
       'it was terrible.', 'the movie is bad, the mat is bad.', 'terrible, bad, terrible.']


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('hf'))
  vocab_size = hf_fixtures.write_vocab(os.path.join(path, 'vocab.txt'))
  hf_fixtures.random_hf_model(vocab_size=vocab_size, hidden_size=32, num_layers=2, num_heads=4,
                              intermediate_size=48, max_positions=64,
                              randomize=False).save_pretrained(path)
  return path


def _config(hf_dir, task, train_spec, eval_spec, **data):
  c = finetune_config.base_config()
  c.task = task
  c.init.hf_dir = hf_dir
  c.data.update(train=train_spec, eval=eval_spec, max_len=32, **data)
  c.optim.update(learning_rate=3e-3, epochs=8, batch_size=8, eval_batch_size=16,
                 warmup_fraction=0.1)
  c.dropout_rate = 0.0
  return c


def test_sentence_classification_from_tsv_learns(hf_dir, tmp_path):
  path = tmp_path / 'sst.tsv'
  rows = [(s, 'positive') for s in GOOD] + [(s, 'negative') for s in BAD]
  path.write_text('sentence\tlabel\n' + ''.join(f'{s}\t{l}\n' for s, l in rows * 3))
  config = _config(hf_dir, 'sequence_classification', f'tsv:{path}', f'tsv:{path}')
  result = train.finetune(config, str(tmp_path / 'run'))
  assert result['labels'] == ['negative', 'positive']
  assert result['eval_accuracy'] >= 0.9 and result['eval_f1'] >= 0.9, result
  history = [json.loads(l) for l in open(tmp_path / 'run' / 'metrics.jsonl')]
  train_rows = [h for h in history if h['split'] == 'train']
  # Train rows as pretraining's.
  assert len(train_rows) == 8 and train_rows[-1]['loss'] < train_rows[0]['loss']
  assert [h['step'] for h in history if h['split'] == 'eval'] == [5 * e for e in range(1, 9)]
  assert os.path.isdir(tmp_path / 'run' / 'params')


def test_packed_fine_tuning_learns_and_scores_every_example(hf_dir, tmp_path):
  """``data.packing``: several whole examples a row, fewer steps than one example a row,
  and every eval example scored (the rows' slots mapped back to the examples, in order)."""
  path = tmp_path / 'sst.tsv'
  rows = [(s, 'positive') for s in GOOD] + [(s, 'negative') for s in BAD]
  path.write_text('sentence\tlabel\n' + ''.join(f'{s}\t{l}\n' for s, l in rows * 3))
  config = _config(hf_dir, 'sequence_classification', f'tsv:{path}', f'tsv:{path}',
                   packing=True)
  config.pooling, config.eval_every_epoch, config.optim.epochs = 'mean', False, 20
  result = train.finetune(config)
  assert result['eval_accuracy'] >= 0.9, result
  assert result['step'] < 20 * 36 // 8  # Fewer rows than the 36 examples, each epoch.
  for bad, match in ((dict(pooling='cls'), "pooling='mean'"),
                     (dict(task='token_classification'), 'a task of')):
    c = _config(hf_dir, 'sequence_classification', f'tsv:{path}', '', packing=True)
    c.pooling = 'mean'
    c.update(bad)
    with pytest.raises(ValueError, match=match):
      train.finetune(c)


def test_sentence_pairs_from_jsonl(hf_dir, tmp_path):
  """Pairs get segment ids 0/1; label = whether both sentences have the same sentiment."""
  rows = []
  for i, a in enumerate(GOOD + BAD):
    for j, b in enumerate(GOOD + BAD):
      if (i + j) % 3 == 0:
        rows.append({'s1': a, 's2': b, 'label': int((a in GOOD) == (b in GOOD))})
  path = tmp_path / 'pairs.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  config = _config(hf_dir, 'sequence_classification', f'jsonl:{path}', f'jsonl:{path}',
                   text_fields=('s1', 's2'))
  examples, names = TASK_FILES[config.task].read_split(config.data.train, config.data)
  assert names == ['0', '1'] and examples.texts[0] == (rows[0]['s1'], rows[0]['s2'])
  loaded = train.load_pretrained(config)
  arrays, _ = TASK_FILES[config.task].encode(examples, loaded.tokenizer, 32)
  tok = loaded.tokenizer
  row, seg = arrays['input_ids'][0], arrays['segment_ids'][0]
  seps = np.flatnonzero(row == tok.sep_id)
  assert row[0] == tok.cls_id and len(seps) == 2
  assert (seg[:seps[0] + 1] == 0).all() and (seg[seps[0] + 1:seps[1] + 1] == 1).all()
  assert (seg[seps[1] + 1:] == 0).all()


NER = [
    ('john travels to paris', 'B-PER O O B-LOC'),
    ('john works at google in london', 'B-PER O O B-ORG O B-LOC'),
    ('paris is the capital of france', 'B-LOC O O O O B-LOC'),
    ('google is in london', 'B-ORG O O B-LOC'),
    ('the cat sat on the mat', 'O O O O O O'),
    ('john was in france', 'B-PER O O B-LOC'),
]


def test_token_classification_labels_first_pieces_and_learns(hf_dir, tmp_path):
  path = tmp_path / 'ner.jsonl'
  path.write_text(''.join(json.dumps({'tokens': s.split(), 'tags': t.split()}) + '\n'
                          for s, t in NER * 4))
  config = _config(hf_dir, 'token_classification', f'jsonl:{path}', f'jsonl:{path}')
  examples, names = TASK_FILES[config.task].read_split(config.data.train, config.data)
  assert names == ['B-LOC', 'B-ORG', 'B-PER', 'O']
  tok = train.load_pretrained(config).tokenizer
  # 'travels' is not in the vocab: several pieces, only the first one labelled.
  arrays, _ = TASK_FILES[config.task].encode(examples, tok, 32)
  pieces = [tok.encode(w) for w in NER[0][0].split()]
  assert len(pieces[1]) > 1
  labels = arrays['labels'][0]
  expected = [-1] + [x for p, tag in zip(pieces, examples.tags[0])
                     for x in [tag] + [-1] * (len(p) - 1)] + [-1]
  np.testing.assert_array_equal(labels[:len(expected)], expected)
  assert (labels[len(expected):] == -1).all()
  result = train.finetune(config)
  assert result['eval_accuracy'] >= 0.9 and result['eval_f1'] >= 0.8, result
  assert result['eval_truncated_examples'] == 0 and result['eval_dropped_words'] == 0
  assert result['train_truncated_examples'] == 0


def test_truncation_is_counted_not_silent(hf_dir):
  config = _config(hf_dir, 'token_classification', '', '')
  tok = train.load_pretrained(config).tokenizer
  examples = data_lib.Examples(words=[s.split() for s, _ in NER],
                               tags=[[0] * len(s.split()) for s, _ in NER])
  arrays, cut = token_classification.encode(examples, tok, 8)
  pieces = [[len(tok.encode(w)) for w in s.split()] for s, _ in NER]
  kept = []
  for p in pieces:  # Words that fit in 8 tokens with [CLS]/[SEP].
    n, used = 0, 1
    while n < len(p) and used + p[n] <= 7:
      used, n = used + p[n], n + 1
    kept.append(n)
  assert cut.words == sum(map(len, pieces))
  assert cut.dropped_words == sum(len(p) - k for p, k in zip(pieces, kept)) > 0
  assert cut.truncated_examples == sum(k < len(p) for p, k in zip(pieces, kept))
  assert cut.longest == max(sum(p) + 2 for p in pieces)
  assert (arrays['labels'] >= 0).sum() == sum(kept)  # One label per kept word.
  assert 'dropped with their labels' in cut.summary('eval')
  assert cut.metrics() == {'truncated_examples': cut.truncated_examples,
                           'dropped_words': cut.dropped_words}

  long = 'the film was good and the movie was great'
  pairs = data_lib.Examples(texts=[(long, 'bad'), ('good', 'bad')], labels=[0, 1])
  _, cut = sequence_classification.encode(pairs, tok, 8)
  a, b = len(tok.encode(long)), len(tok.encode('bad'))
  assert cut.truncated_examples == 1 and cut.dropped_tokens == a + b + 3 - 8
  assert 'tokens cut' in cut.summary('train')
  single = data_lib.Examples(texts=[(long,)], labels=[0])
  _, cut = sequence_classification.encode(single, tok, 8)
  assert cut.dropped_tokens == a + 2 - 8 and cut.longest == a + 2


def test_optimizer_is_pretrainings_schedule_and_decay_mask():
  c = finetune_config.base_config()
  c.optim.update(learning_rate=0.1, warmup_fraction=0.0, weight_decay=0.5, grad_clip_norm=0.0)
  ones = lambda: np.ones((2, 2), np.float32)
  params = {'embeddings': {'layer_norm': {'scale': ones(), 'bias': ones()}},
            'encoder': {'layers': {'attention_layer_norm': {'scale': ones(), 'bias': ones()},
                                   'intermediate': {'kernel': ones(), 'bias': ones()}}},
            'classifier': {'kernel': ones(), 'bias': ones()}}
  spec = train.spec(c, total_steps=10, steps_per_epoch=5)
  tx = optimizer.build(spec.optim, spec.num_steps)
  zeros = jax.tree.map(np.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  moved = {jax.tree_util.keystr(p): bool(np.abs(np.asarray(u)).max() > 0)
           for p, u in jax.tree_util.tree_flatten_with_path(updates)[0]}
  assert moved == {k: k.endswith("['kernel']") for k in moved}, moved  # Decay: kernels only.
  c.optim.warmup_fraction = 0.3  # Of all the steps, in steps: the one warmup rule.
  assert train.spec(c, total_steps=10, steps_per_epoch=5).optim.warmup_steps == 3
  c.optim.warmup_fraction = 1.5
  with pytest.raises(ValueError, match='optim.warmup_fraction'):
    finetune_config.validate(c)


@pytest.mark.slow  # ~25 s on a loaded 2-core CPU: an import into a workdir, then a compile.
def test_from_a_pretraining_workdir(tmp_path, capsys):
  _, workdir, _ = hf_fixtures.make_workdir(str(tmp_path), hidden_size=16, num_layers=1,
                                           num_heads=2, intermediate_size=20, max_positions=40)
  path = tmp_path / 'sst.tsv'
  path.write_text('sentence\tlabel\n' + ''.join(f'{s}\t1\n' for s in GOOD)
                  + ''.join(f'{s}\t0\n' for s in BAD))
  config = _config('', 'sequence_classification', f'tsv:{path}', f'tsv:{path}')
  config.init.update(hf_dir='', workdir=workdir)
  config.optim.epochs = 1
  result = train.finetune(config)
  assert result['step'] == 2 and result['labels'] == ['0', '1']
  # The header names what came from the checkpoint and what starts fresh.
  out = capsys.readouterr().out
  assert '  taken from the source: embeddings, encoder, pooler\n' in out, out
  assert "  freshly initialised: classifier (the task's head)\n" in out, out
  assert '  in the source, not used: ' in out, out


def test_every_part_the_checkpoint_has_is_taken_and_the_rest_named():
  """A RoBERTa-like trunk without a pooler: the pooler is named as fresh, never silently
  (the one rule of every start from pretrained parts: ``train_state.start_params``)."""
  from encoder_jax.finetune import heads  # pylint: disable=g-import-not-at-top
  from encoder_jax.models import config as config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.EncoderConfig(kind='roberta', vocab_size=40, hidden_size=8, num_layers=1,
                                    num_heads=2, intermediate_size=12,
                                    max_position_embeddings=20, position_offset=2,
                                    type_vocab_size=1, layer_norm_eps=1e-5)
  model = heads.Classifier(config, 2, 0.0)
  ids = jax.numpy.zeros((1, 8), jax.numpy.int32)

  class Setup:
    init = staticmethod(lambda r: model.init(r, ids, ids, ids)['params'])

  full, _ = train_state.start_params(Setup, jax.random.PRNGKey(0), {}, {})
  pretrained = {k: v for k, v in full.items() if k != 'pooler'}
  pretrained['mlm_head'] = {'bias': np.zeros(40, np.float32)}
  head = {part: "the task's head" for part in heads.HEAD_PARTS}
  params, parts = train_state.start_params(Setup, jax.random.PRNGKey(1), pretrained, head)
  assert parts == {'taken': ['embeddings', 'encoder'],
                   'initialised': {'classifier': "the task's head",
                                   'pooler': 'not in the source'},
                   'unused': ['mlm_head']}
  for part in ('embeddings', 'encoder'):  # The very arrays of the checkpoint.
    jax.tree.map(np.testing.assert_array_equal, params[part], pretrained[part])


@pytest.mark.slow  # ~30 s: importing tensorflow and building the dataset dominate.
def test_tfds_dataset_built_locally(hf_dir, tmp_path):
  tfds = pytest.importorskip('tensorflow_datasets')

  class TinySentiment(tfds.core.GeneratorBasedBuilder):  # pylint: disable=unused-variable
    """A two-split sentiment dataset generated in the test (no network)."""
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          'sentence': tfds.features.Text(),
          'label': tfds.features.ClassLabel(names=['negative', 'positive'])}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {'train': self._generate_examples(3), 'validation': self._generate_examples(1)}

    def _generate_examples(self, repeat):
      rows = [(s, 'positive') for s in GOOD] + [(s, 'negative') for s in BAD]
      for i, (s, label) in enumerate(rows * repeat):
        yield i, {'sentence': s, 'label': label}

  data_dir = str(tmp_path / 'tfds')
  config = _config(hf_dir, 'sequence_classification', 'tfds:tiny_sentiment:train',
                   'tfds:tiny_sentiment:validation', tfds_data_dir=data_dir)
  # Not prepared: refused, naming the command that prepares it (pretraining's rule too).
  with pytest.raises(FileNotFoundError, match=f'tfds build tiny_sentiment --data_dir={data_dir}'):
    train.finetune(config)
  # ;prepare=true builds it now (tfds generates this one locally, no network).
  config.data.train = 'tfds:tiny_sentiment:train;prepare=true'
  result = train.finetune(config)
  assert result['labels'] == ['negative', 'positive']  # From the ClassLabel feature.
  assert result['eval_examples'] == 12 and result['eval_accuracy'] >= 0.9, result


def test_files_are_read_as_pretraining_reads_its_sources(tmp_path):
  """TSV and JSONL splits go through the sources' opener: gzip, a byte-order mark; a
  missing file, a line that is not JSON and a zstd file are errors naming the place."""
  import gzip  # pylint: disable=g-import-not-at-top
  d = ml_collections.ConfigDict(dict(tfds_data_dir=''))
  tsv = tmp_path / 'rows.tsv.gz'
  with gzip.open(tsv, 'wt', encoding='utf-8') as f:
    f.write('\ufeffsentence\tlabel\nthe film was good.\tpositive\n')
  assert data_lib.read_rows(f'tsv:{tsv}', d, ['label'])[0] == [
      {'sentence': 'the film was good.', 'label': 'positive'}]
  jsonl = tmp_path / 'rows.jsonl'
  jsonl.write_text('{"sentence": "a", "label": 1}\n\n{"sentence": "b", "label": 0}\n')
  assert [r['sentence'] for r in data_lib.read_rows(f'jsonl:{jsonl}', d, [])[0]] == ['a', 'b']
  jsonl.write_text('{"sentence": "a", "label": 1}\nnot json\n')
  with pytest.raises(ValueError, match=r'rows.jsonl:2 is not JSON'):
    data_lib.read_rows(f'jsonl:{jsonl}', d, [])
  with pytest.raises(FileNotFoundError, match=r"config.data: 'jsonl:.*nope.jsonl does not"):
    data_lib.read_rows(f'jsonl:{tmp_path}/nope.jsonl', d, [])
  zstd = tmp_path / 'rows.zst'
  zstd.write_bytes(b'\x28\xb5\x2f\xfd' + b'\0' * 16)
  with pytest.raises(ValueError, match='is a zstd file'):
    data_lib.read_rows(f'tsv:{zstd}', d, [])


def test_metrics():
  names = ['O', 'B-PER', 'I-PER', 'B-LOC']
  gold = np.array([[0, 1, 2, 0, 3, -1]])
  pred = np.array([[0, 1, 0, 0, 3, 2]])  # PER span cut short; LOC right.
  m = metrics.token_metrics(pred, gold, names)
  assert m['tokens'] == 5 and m['accuracy'] == pytest.approx(0.8)
  assert m['f1'] == pytest.approx(0.5)  # tp=1 (LOC), fp=1, fn=1.
  assert metrics.spans(['B-PER', 'I-PER', 'O', 'I-LOC']) == {(0, 2, 'PER'), (3, 4, 'LOC')}
  s = metrics.sequence_metrics(np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0]), 2)
  assert s['accuracy'] == 0.75 and s['f1'] == pytest.approx(2 / 3)


def test_bad_config_is_a_clear_error(tmp_path):
  config = finetune_config.base_config()
  with pytest.raises(ValueError, match='exactly one of config.init.workdir'):
    train.load_pretrained(config)
  with pytest.raises(ValueError, match="unknown source kind .csv.; expected .tfds:NAME:SPLIT"):
    sequence_classification.read_split('csv:/x', config.data)
  path = tmp_path / 'x.tsv'
  path.write_text('text\tlabel\nhello\t1\n')
  with pytest.raises(KeyError, match="no field 'sentence'"):
    sequence_classification.read_split(f'tsv:{path}', config.data)


@pytest.mark.parametrize('name', ['finetune_sst2', 'finetune_mrpc', 'finetune_ner'])
@pytest.mark.parametrize('arg', [None, 'runlocal=True'])
def test_configs_build(name, arg):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(name,
                                                os.path.join(support.ROOT, 'configs', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(arg)
  assert c.task in ('sequence_classification', 'token_classification')
  assert set(c.keys()) == set(finetune_config.base_config().keys())
  assert c.data.train.startswith('tfds:')


def test_packed_examples_give_each_example_its_own_logits_and_loss():
  """``data.pack``: short examples back to back in rows, each read as if alone, pooled by
  the mean of its own tokens; the task's loss equals the padded rows' (only padding goes)."""
  from encoder_jax.finetune import heads  # pylint: disable=g-import-not-at-top
  from encoder_jax.finetune import task as task_lib  # pylint: disable=g-import-not-at-top
  from encoder_jax.models import registry  # pylint: disable=g-import-not-at-top
  net = registry.network(dict(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                              intermediate_size=32, max_position_embeddings=24,
                              hidden_dropout_rate=0.0, attention_dropout_rate=0.0))
  rng = np.random.default_rng(0)
  lengths = [5, 9, 3, 12, 7, 4]
  ids = np.zeros((6, 24), np.int32)
  for i, n in enumerate(lengths):
    ids[i, :n] = np.concatenate([[2], rng.integers(5, 50, n - 2), [3]])
  arrays = dict(input_ids=ids, segment_ids=np.zeros_like(ids), input_mask=(ids > 0) * 1,
                labels=np.array([0, 1, 2, 1, 0, 2], np.int32))
  packed = data_lib.pack(arrays, order=np.array([3, 0, 1, 5, 2, 4]))
  assert packed['input_ids'].shape == (2, 24) and packed['labels'].shape == (2, 8)
  assert packed['input_mask'].sum() == sum(lengths)
  model = heads.Classifier(net.config, 3, 0.0, pooling='mean')
  task = task_lib.Task(model, net, 24, task_lib.classification_loss, task_lib.argmax)
  params = task.init(jax.random.key(0))
  alone = np.asarray(task.logits(params, arrays))
  together = np.asarray(task.logits(params, packed))
  assert together.shape == (2, 8, 3)
  for r, members in enumerate([[3, 0], [1, 5, 2, 4]]):
    np.testing.assert_allclose(together[r, :len(members)], alone[members], atol=1e-5)
  weights = lambda a: dict(a, weights=np.ones(len(a['input_ids']), np.float32))
  loss_alone, _ = task.loss_fn(params, weights(arrays), None, None, False)
  loss_packed, m = task.loss_fn(params, weights(packed), None, None, False)
  np.testing.assert_allclose(loss_packed, loss_alone, rtol=1e-5)
  assert m['examples'] == 6
  with pytest.raises(ValueError, match="pooling='mean'"):
    heads.Classifier(net.config, 3, 0.0).apply(
        {'params': params}, packed['input_ids'], packed['segment_ids'], packed['input_mask'],
        document_ids_BxL=packed['document_ids'])


@pytest.mark.slow  # Two fine-tuning runs.
def test_nonfinite_loss_is_the_engines_policy(hf_dir, tmp_path):
  """'stop': the engine's flusher raises before the first save (no checkpoint holds a
  non-finite step) and names fine-tuning's key; 'skip': the run ends, updates dropped."""
  path = tmp_path / 'sst.tsv'
  rows = [(s, 'positive') for s in GOOD] + [(s, 'negative') for s in BAD]
  path.write_text('sentence\tlabel\n' + ''.join(f'{s}\t{l}\n' for s, l in rows * 2))
  config = _config(hf_dir, 'sequence_classification', f'tsv:{path}', '')
  config.optim.update(learning_rate=1e30, grad_clip_norm=0.0, epochs=1)
  with pytest.raises(FloatingPointError, match="No checkpoint was saved yet.*"
                     "config.nonfinite_policy='skip'"):
    train.finetune(config, str(tmp_path / 'run'))
  assert not os.listdir(tmp_path / 'run' / 'checkpoints')
  config.nonfinite_policy = 'skip'
  assert train.finetune(config)['step'] == 3
