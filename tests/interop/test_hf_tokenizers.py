"""Every registered kind's Hugging Face directory, with the tokenizer files its public
checkpoints ship, imports and runs with ``AutoTokenizer``'s ids (``hf_tokenizer_dirs``).

Checked per kind against ``transformers``: the ids, segment ids and mask of single texts
and pairs (with and without truncation, padded on the tokenizer's side); mean-pooled
embeddings; fill-mask's top 5 with ``[MASK]`` and with the model's own mask token;
``workdir_to_hf`` of the imported workdir (same ids from ``AutoTokenizer``, every tensor
equal, no missing or unexpected keys). The command lines and continued pretraining run
end to end in the ``slow`` tests.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import transformers

import encoder_jax
from encoder_jax.api import pretrain
from encoder_jax import convert
from encoder_jax.loading import loaded as loading
from encoder_jax.data import builders
from encoder_jax.data import tokenizer_files
from encoder_jax.data import tokenizer_kinds
from encoder_jax.interop import tokenizer as tokenizer_io
from encoder_jax.models import registry as models

from support import hf_fixtures
from support import hf_tokenizer_dirs as dirs
from support import in_process


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

KINDS = dirs.KINDS
# (kind, what) -> mismatching rows, printed after the module (pytest -s): the id comparison.
ID_TABLE: dict[tuple[str, str], str] = {}


@pytest.fixture(scope='module', autouse=True)
def _print_id_table():
  yield
  if ID_TABLE:
    print('\nids against AutoTokenizer (kind, inputs: mismatching rows / rows):')
    for (kind, what), result in sorted(ID_TABLE.items()):
      print(f'  {kind:<11} {what:<24} {result}')


_BUILT: dict[str, tuple] = {}


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  return tmp_path_factory.mktemp('hf_tokenizer_dirs')


def built(kind: str, root) -> tuple[str, object, object]:
  """(directory, AutoTokenizer, HF model) of ``kind``, built once per test process."""
  if kind not in _BUILT:
    path = os.path.join(str(root), kind)
    auto, model = dirs.make_dir(kind, path)
    _BUILT[kind] = (path, auto, model)
  return _BUILT[kind]


def _theirs_inputs(auto, texts, pairs=None, max_len=None):
  return auto(list(texts), None if pairs is None else list(pairs), padding=True,
              truncation=max_len is not None, max_length=max_len,
              return_token_type_ids=True, return_tensors='np')


def _compare_ids(tok, auto, texts, pairs=None, max_len=None) -> int:
  ours = tok.encode_inputs(list(texts), None if pairs is None else list(pairs), max_len)
  theirs = _theirs_inputs(auto, texts, pairs, max_len)
  bad = 0
  for i in range(len(texts)):
    same = all(ours[a].shape == theirs[b].shape and (ours[a][i] == theirs[b][i]).all()
               for a, b in (('input_ids', 'input_ids'), ('input_mask', 'attention_mask'),
                            ('segment_ids', 'token_type_ids')))
    bad += not same
  return bad


@pytest.mark.parametrize('kind', KINDS)
def test_ids_equal_autotokenizer(kind, root):
  path, auto, _ = built(kind, root)
  tok = tokenizer_io.load_hf_tokenizer(path)
  assert tok.vocab_size == len(auto)
  for role in ('pad', 'unk', 'cls', 'sep', 'mask'):  # Read from the directory, not assumed.
    assert getattr(tok, f'{role}_id') == getattr(auto, f'{role}_token_id'), role
  assert tok.padding_side == auto.padding_side
  texts, (a, b) = dirs.TEXTS, zip(*dirs.PAIRS)
  cases = {'texts': (texts, None, None), 'texts, max_len 9': (texts, None, 9),
           'pairs': (a, b, None), 'pairs, max_len 13': (a, b, 13)}
  failures = {}
  for what, (x, y, max_len) in cases.items():
    bad = _compare_ids(tok, auto, x, y, max_len)
    ID_TABLE[(kind, what)] = f'{bad} / {len(x)}'
    if bad:
      failures[what] = bad
  assert not failures, failures
  # Each text alone, unpadded, equals AutoTokenizer's single encoding too.
  for text in texts:
    ids, segments = tok.frame(tok.encode(text))
    assert ids == auto(text)['input_ids'], text


@pytest.mark.parametrize('kind, pair_kind, template', [
    ('bert', 'nsp', tokenizer_files.Template.bert),
    ('xlnet', 'xlnet', tokenizer_files.Template.xlnet)])
def test_pretraining_rows_are_framed_as_the_checkpoints_tokenizer_frames_pairs(
    kind, pair_kind, template, root):
  """A pretraining builder's template (``iterators.render`` frames its rows with it) is
  the one the family's Hugging Face tokenizer records for a pair: BERT's ``[CLS] A [SEP] B
  [SEP]``, XLNet's ``A <sep> B <sep> <cls>`` with ``<cls>`` in segment 2."""
  path, _, _ = built(kind, root)
  tok = tokenizer_io.load_hf_tokenizer(path)
  assert template(tok.cls_id, tok.sep_id) == tok.template
  assert builders.REGISTRY[pair_kind].template(tok.cls_id, tok.sep_id) == tok.template


@pytest.mark.parametrize('kind', KINDS)
def test_finetuning_inputs_equal_autotokenizer(kind, root):
  """Fine-tuning's arrays (pairs and single texts, padded to max_len on the tokenizer's
  side) are AutoTokenizer's with padding='max_length'; a tagged word's label sits on its
  first piece wherever the frame puts the words."""
  from encoder_jax.finetune import data as finetune_data  # pylint: disable=g-import-not-at-top
  from encoder_jax.finetune.tasks import token_classification  # pylint: disable=g-import-not-at-top
  path, auto, _ = built(kind, root)
  tok = tokenizer_io.load_hf_tokenizer(path)
  pairs = [(a, b) for a, b in dirs.PAIRS] + [(t,) for t in dirs.TEXTS[:3]]
  examples = finetune_data.Examples(texts=pairs, labels=[0] * len(pairs))
  ours, report = finetune_data.encode_texts(examples, tok, 16)
  for i, texts in enumerate(pairs):
    theirs = auto(*texts, padding='max_length', truncation=True, max_length=16,
                  return_token_type_ids=True)
    assert ours['input_ids'][i].tolist() == theirs['input_ids'], texts
    assert ours['input_mask'][i].tolist() == theirs['attention_mask'], texts
    assert ours['segment_ids'][i].tolist() == theirs['token_type_ids'], texts
  assert report.truncated_examples > 0
  words = ['Naïve', 'café', 'owners', 'in', 'Zürich']
  tagged = finetune_data.Examples(words=[words], tags=[[1, 2, 3, 4, 5]])
  arrays, _ = token_classification.encode(tagged, tok, 40)
  pieces = tok.encode_batch(words)
  first = np.cumsum([0] + [len(p) for p in pieces])[:-1]
  row, _ = tok.frame([t for p in pieces for t in p])
  offset = (40 - len(row) if tok.padding_side == 'left' else 0) + row.index(pieces[0][0])
  labels = arrays['labels'][0]
  assert labels[offset + first].tolist() == [1, 2, 3, 4, 5]
  assert (labels >= 0).sum() == 5


def _hf_mlm_logits(model, inputs, positions):
  """Hugging Face's logits [P, V] at ``positions`` of the one row in ``inputs``. XLNet
  predicts them as its documentation shows: targets (``target_mapping``) hidden from every
  query (``perm_mask``), the query stream's logits."""
  with torch.no_grad():
    if isinstance(model, transformers.XLNetLMHeadModel):
      length = inputs['input_ids'].shape[1]
      target_mapping = torch.zeros(1, len(positions), length)
      target_mapping[0, range(len(positions)), positions] = 1.0
      perm_mask = target_mapping.amax(1, keepdim=True).expand(1, length, length)
      return model(**inputs, perm_mask=perm_mask, target_mapping=target_mapping).logits[0]
    out = model(**inputs)
  logits = out.prediction_logits if hasattr(out, 'prediction_logits') else out.logits
  return logits[0, positions]


def _hf_mean_pooled(model, auto, texts):
  inputs = {k: torch.tensor(v) for k, v in _theirs_inputs(auto, texts).items()}
  with torch.no_grad():
    hidden = model.base_model(**inputs).last_hidden_state.numpy()
  mask = inputs['attention_mask'].numpy()[..., None].astype(np.float32)
  return (hidden * mask).sum(1) / mask.sum(1)


@pytest.fixture(scope='module')
def loaded_dirs():
  return {}


def _loaded(kind, root, cache):
  """``encoder_jax.load`` of the kind's directory (once per test process)."""
  if kind not in cache:
    cache[kind] = encoder_jax.load(built(kind, root)[0])
  return cache[kind]


@pytest.mark.parametrize('kind', KINDS)
def test_embeddings_and_fill_mask_equal_transformers(kind, root, loaded_dirs):
  _, auto, model = built(kind, root)
  loaded = _loaded(kind, root, loaded_dirs)
  entry = models.get(loaded.kind)  # The kind's import defaults: XLNet continues with PLM.
  assert tuple(loaded.config.objective.names) == entry.import_objectives
  ours = loaded.embed(list(dirs.TEXTS), pooling='mean', normalize=False)
  theirs = _hf_mean_pooled(model, auto, dirs.TEXTS)
  np.testing.assert_allclose(ours, theirs, atol=1e-4)
  own = auto.mask_token
  for text in ('Return the [MASK] of items in a container.',
               f'The year 1999 had 365 {own}; {own} is pi.'):
    got = loaded.fill_mask(text, top_k=5, warn=False)
    hf_text = text.replace('[MASK]', own)
    inputs = {k: torch.tensor(v) for k, v in _theirs_inputs(auto, [hf_text]).items()}
    positions = np.flatnonzero(inputs['input_ids'][0].numpy() == auto.mask_token_id)
    logits = _hf_mlm_logits(model, inputs, positions)
    probs, top = torch.softmax(logits, -1).topk(5)
    assert len(got) == len(positions) > 0
    for row, p_row, i_row in zip(got, probs.numpy(), top.numpy()):
      expected = [auto.convert_ids_to_tokens(i) if i < len(auto) else f'<unused:{i}>'
                  for i in i_row.tolist()]
      assert [piece for piece, _ in row] == expected, text
      np.testing.assert_allclose([p for _, p in row], p_row, atol=1e-5)


@pytest.mark.parametrize('kind', KINDS)
def test_workdir_to_hf_round_trip(kind, root, tmp_path):
  path, auto, model = built(kind, root)
  workdir, out = str(tmp_path / 'workdir'), str(tmp_path / 'out')
  convert.hf_to_workdir(path, workdir)
  config = loading.read_run_config(workdir)
  assert config.tokenizer.kind == ('wordpiece' if kind in ('bert', 'electra') else 'hf')
  convert.workdir_to_hf(workdir, out)
  exported = transformers.AutoTokenizer.from_pretrained(out)
  texts, (a, b) = dirs.TEXTS, zip(*dirs.PAIRS)
  for x, y in ((texts, None), (a, b)):
    ours, theirs = _theirs_inputs(exported, x, y), _theirs_inputs(auto, x, y)
    for key in ('input_ids', 'token_type_ids', 'attention_mask'):
      np.testing.assert_array_equal(ours[key], theirs[key])
  back, info = type(model).from_pretrained(out, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'], info
  theirs_state = model.state_dict()
  for name, tensor in back.state_dict().items():
    np.testing.assert_array_equal(tensor.numpy(), theirs_state[name].numpy(), err_msg=name)


def test_unusable_tokenizers_are_refused_with_the_file_named(root, tmp_path):
  path, _, _ = built('xlnet', root)
  empty = tmp_path / 'empty'
  empty.mkdir()
  (empty / 'tokenizer_config.json').write_text('{"tokenizer_class": "XLNetTokenizer"}')
  with pytest.raises(FileNotFoundError, match=r'empty: no tokenizer files; expected a '
                                              r'tokenizer\.json, a SentencePiece model'):
    tokenizer_io.load_hf_tokenizer(str(empty))
  # A mask token the vocabulary does not have.
  broken = tmp_path / 'broken'
  broken.mkdir()
  for name in ('tokenizer.json', 'spiece.model'):
    (broken / name).write_bytes(open(os.path.join(path, name), 'rb').read())
  with open(os.path.join(path, 'tokenizer_config.json'), encoding='utf-8') as f:
    cfg = json.load(f)
  (broken / 'tokenizer_config.json').write_text(json.dumps(dict(cfg, mask_token='<MASK>')))
  with pytest.raises(ValueError, match=r"broken: the mask token '<MASK>' named in "
                                       r'tokenizer_config\.json'):
    tokenizer_io.load_hf_tokenizer(str(broken))
  # No mask token named at all (and none in special_tokens_map.json).
  del cfg['mask_token']
  (broken / 'tokenizer_config.json').write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r'broken: no mask token: neither tokenizer_config\.json '
                                       r'nor special_tokens_map\.json names a mask_token'):
    tokenizer_io.load_hf_tokenizer(str(broken))
  # A spm.model alone, without the tokenizer.json or a config naming its class.
  bare = tmp_path / 'bare'
  bare.mkdir()
  (bare / 'spm.model').write_bytes(open(os.path.join(path, 'spiece.model'), 'rb').read())
  with pytest.raises(ValueError, match=r'bare: spm\.model without a tokenizer\.json, and no '
                                       r'tokenizer_config\.json or config\.json'):
    tokenizer_io.load_hf_tokenizer(str(bare))


def test_a_bert_tokenizer_with_other_settings_is_read_as_autotokenizer_does(root, tmp_path):
  """Lowercasing without stripping accents (strip_accents=False) is not BERT's default: the
  directory is read through its tokenizer.json (the hf kind), with AutoTokenizer's ids."""
  path, _, _ = built('bert', root)
  other = tmp_path / 'bert_keep_accents'
  transformers.BertTokenizer.from_pretrained(path, strip_accents=False).save_pretrained(other)
  for name in ('vocab.txt',):
    if not (other / name).exists():
      (other / name).write_bytes(open(os.path.join(path, name), 'rb').read())
  auto = transformers.AutoTokenizer.from_pretrained(str(other))
  tok = tokenizer_io.load_hf_tokenizer(str(other))
  assert tok.kind == 'hf'
  assert _compare_ids(tok, auto, dirs.TEXTS) == 0
  assert tokenizer_io.load_hf_tokenizer(path).kind == 'wordpiece'  # BERT's defaults.


def test_slow_files_alone_are_converted_as_autotokenizer_does(root, tmp_path):
  """A directory with only spiece.model (+ its tokenizer_config.json): converted by
  transformers, the ids equal AutoTokenizer's on the same directory."""
  path, _, _ = built('albert', root)
  slow = tmp_path / 'slow'
  slow.mkdir()
  for name in ('spiece.model', 'tokenizer_config.json'):
    (slow / name).write_bytes(open(os.path.join(path, name), 'rb').read())
  auto = transformers.AutoTokenizer.from_pretrained(str(slow))
  tok = tokenizer_io.load_hf_tokenizer(str(slow))
  assert tok.kind == 'hf'
  assert _compare_ids(tok, auto, dirs.TEXTS) == 0


@pytest.mark.slow  # Two command lines per kind (in this process: in_process.command).
@pytest.mark.parametrize('kind', ['xlnet', 'deberta_v2'])
def test_command_lines_on_the_directories(kind, root, tmp_path, capsys):
  path, auto, model = built(kind, root)

  def _run(module, *flags):
    out = in_process.command(capsys, module.removeprefix('encoder_jax.'), *flags)
    assert out.returncode == 0, out.stderr[-3000:]
    return out

  sentences = tmp_path / 'sentences.txt'
  sentences.write_text('\n'.join(t.replace('\n', ' ') for t in dirs.TEXTS) + '\n',
                       encoding='utf-8')
  _run('encoder_jax.embed', f'--hf_dir={path}', f'--input={sentences}',
       f'--output={tmp_path / "e.npy"}', '--pooling=mean', '--normalize=false')
  theirs = _hf_mean_pooled(model, auto, [t.replace('\n', ' ') for t in dirs.TEXTS])
  np.testing.assert_allclose(np.load(tmp_path / 'e.npy'), theirs, atol=1e-4)
  out = _run('encoder_jax.fill_mask', f'--hf_dir={path}',
             '--text=Return the [MASK] of items in a container.', '--top_k=5')
  inputs = {k: torch.tensor(v) for k, v in _theirs_inputs(
      auto, [f'Return the {auto.mask_token} of items in a container.']).items()}
  position = int(np.flatnonzero(inputs['input_ids'][0].numpy() == auto.mask_token_id)[0])
  top = _hf_mlm_logits(model, inputs, [position])[0].topk(5).indices.tolist()
  line = next(l for l in out.stdout.splitlines() if '[MASK] #1:' in l)
  expected = [auto.convert_ids_to_tokens(i) if i < len(auto) else f'<unused:{i}>' for i in top]
  assert line.split()[2::2] == expected, line
  # The convert round trip of these directories: test_workdir_to_hf_round_trip (in process,
  # every kind); the convert command line itself: tests/storage/test_end_to_end.py.


@pytest.mark.slow  # ~30 s each: prepares a corpus with the imported tokenizer and trains.
@pytest.mark.parametrize('kind', ['xlnet', 'deberta_v2'])
def test_pretraining_continues_from_the_import(kind, root, tmp_path):
  path, _, _ = built(kind, root)
  workdir = str(tmp_path / 'workdir')
  convert.hf_to_workdir(path, workdir)
  corpus = tmp_path / 'corpus.txt'
  docs = dirs.training_text(60)
  corpus.write_text('\n'.join(s if (i + 1) % 5 else s + '\n' for i, s in enumerate(docs)),
                    encoding='utf-8')
  config = hf_fixtures.tiny_run_config(workdir, str(corpus), str(tmp_path / 'prepared'))
  config.train.update(num_steps=12, log_every_steps=1, batch_size=8, seq_lens=(32,),
                      max_predictions=(6,))
  config.optim.update(learning_rate=3e-3, warmup_steps=1)
  config.checkpoint.update(every_steps=100)
  pretrain.run(config, workdir)
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    losses = [r['loss'] for r in map(json.loads, f) if 'loss' in r and r.get('step', 0) > 0]
  print(f"{kind} continued pretraining losses: {np.round(losses, 3).tolist()}")
  assert len(losses) >= 10 and np.isfinite(losses).all()
  assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses


def test_every_fixed_layout_kind_imports_hf_directories():
  """Import tries each fixed-layout kind of the registry (the hf kind takes the rest)."""
  fixed = [name for name, kind in tokenizer_kinds.KINDS.items() if kind.role_pieces]
  assert sorted(tokenizer_io._IMPORTS) == sorted(fixed)  # pylint: disable=protected-access
