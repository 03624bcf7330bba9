"""Byte-level BPE (RoBERTa) tokenizers and Hugging Face: export, import, pinning in a workdir."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import tokenizers
import transformers

from encoder_jax.config import schema as config_base
from encoder_jax.loading import loaded as loading
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.data import sources as sources_lib
from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.data import tokenizer_training
from encoder_jax.interop import tokenizer as tokenizer_io

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

VOCAB = 600
TEXTS = [
    'The quick brown fox jumps over the lazy dog.',
    "Don't panic:  it's only 3.14% of the data, naïve café résumé!",
    '東京は日本の首都です。北京是中国的首都。',
    'Emoji 🎉👍🏽 and a family 👨\u200d👩\u200d👧.',
    'Two lines,\nthe second\tindented.',
    ' leading space',
]


def _config():
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  c.model.vocab_size = VOCAB
  c.data.sources = 'embedded;max_documents=150'
  c.tokenizer.update(kind='bytelevel_bpe', path='', train_sentences=20_000)
  return c


@pytest.fixture(scope='module')
def tok(tmp_path_factory):
  """Our byte-level BPE, trained on 150 embedded documents (as preparation trains it)."""
  c = _config()
  path = str(tmp_path_factory.mktemp('bpe') / 'tokenizer.json')
  tokenizer_training.train_bytelevel_bpe(c, sources_lib.parse_sources(c.data), path)
  return tokenizer_lib.Tokenizer.from_file('bytelevel_bpe', path)


def _same_ids(ours, theirs_ids):
  for text in TEXTS:
    assert theirs_ids(text) == ours.encode(text), text


def test_export_gives_robertas_fast_tokenizer_with_our_ids(tok, tmp_path):
  out = str(tmp_path / 'hf')
  written = tokenizer_io.export_hf_tokenizer(tok, out, max_length=512)
  assert 'vocab.json' in written and 'merges.txt' in written
  assert sorted(os.listdir(out)) == ['merges.txt', 'special_tokens_map.json', 'tokenizer.json',
                                     'tokenizer_config.json', 'vocab.json']
  hf = transformers.AutoTokenizer.from_pretrained(out)
  assert hf.is_fast and 'Roberta' in type(hf).__name__
  assert (hf.cls_token_id, hf.pad_token_id, hf.sep_token_id, hf.unk_token_id,
          hf.mask_token_id) == (0, 1, 2, 3, VOCAB - 1) == (tok.cls_id, tok.pad_id, tok.sep_id,
                                                           tok.unk_id, tok.mask_id)
  assert len(hf) == VOCAB and hf.model_max_length == 512
  for text in TEXTS:
    ids = tok.encode(text)
    assert hf(text, add_special_tokens=False)['input_ids'] == ids, text
    assert hf(text)['input_ids'] == [tok.cls_id, *ids, tok.sep_id], text  # <s> A </s>
    assert hf.decode(ids) == text
  a, b = tok.encode(TEXTS[0]), tok.encode(TEXTS[1])
  assert hf(TEXTS[0], TEXTS[1])['input_ids'] == [0, *a, 2, 2, *b, 2]  # RoBERTa's pairs.
  # GPT-2's slow files alone (no tokenizer.json) give the same tokenizer.
  os.remove(os.path.join(out, 'tokenizer.json'))
  slow_files = transformers.AutoTokenizer.from_pretrained(out)
  _same_ids(tok, lambda t: slow_files(t, add_special_tokens=False)['input_ids'])
  assert slow_files(TEXTS[0])['input_ids'] == [0, *a, 2]


def test_import_of_a_directory_written_by_roberta_tokenizer_fast(tok, tmp_path):
  files = tmp_path / 'files'  # GPT-2/RoBERTa's vocab.json + merges.txt of our tokenizer.
  files.mkdir()
  tokenizers.Tokenizer.from_file(tok.path).model.save(str(files))
  roberta = transformers.RobertaTokenizerFast.from_pretrained(str(files))
  hf_dir = str(tmp_path / 'roberta')
  roberta.save_pretrained(hf_dir)
  assert roberta.mask_token_id == VOCAB - 1
  assert tokenizer_io.kind_of_file(os.path.join(hf_dir, 'tokenizer.json')) == 'bytelevel_bpe'

  imported = tokenizer_io.import_hf_tokenizer(hf_dir, str(tmp_path / 'workdir'))
  assert imported.kind == 'bytelevel_bpe' and imported.vocab_size == VOCAB
  assert imported.path == str(tmp_path / 'workdir' / 'tokenizer.json')
  assert (imported.cls_id, imported.pad_id, imported.sep_id, imported.mask_id) == (0, 1, 2, 599)
  _same_ids(tok, imported.encode)
  _same_ids(tok, lambda t: roberta(t, add_special_tokens=False)['input_ids'])
  in_place = tokenizer_io.load_hf_tokenizer(hf_dir)
  assert in_place.path == os.path.join(hf_dir, 'tokenizer.json')
  _same_ids(tok, in_place.encode)

  # Only vocab.json + merges.txt: built into our tokenizer.json, the very file we trained.
  from_files = tokenizer_io.import_hf_tokenizer(str(files), str(tmp_path / 'w2'))
  assert from_files.sha256() == tok.sha256()
  assert tokenizer_io.load_hf_tokenizer(str(files)).sha256() == tok.sha256()


def test_import_of_other_bpe_vocabularies_is_an_error(tok, tmp_path):
  gpt2 = tmp_path / 'gpt2'  # GPT-2's layout: no <s>/<pad>/<unk>/<mask> pieces.
  gpt2.mkdir()
  tokenizers.Tokenizer.from_file(tok.path).model.save(str(gpt2))
  vocab = json.loads((gpt2 / 'vocab.json').read_text(encoding='utf-8'))
  vocab = {p: i - 4 for p, i in vocab.items() if p not in tokenizer_lib.ROBERTA_PIECES}
  (gpt2 / 'vocab.json').write_text(json.dumps(vocab), encoding='utf-8')
  # Not RoBERTa's layout, and nothing says which tokenizer class reads the files.
  with pytest.raises(ValueError, match=r'gpt2: vocab\.json without a tokenizer\.json, and no '
                                       r'tokenizer_config\.json or config\.json'):
    tokenizer_io.import_hf_tokenizer(str(gpt2), str(tmp_path / 'out'))
  assert not os.listdir(tmp_path / 'out')  # Nothing half-imported is left.
  os.remove(gpt2 / 'merges.txt')
  with pytest.raises(FileNotFoundError, match=r'gpt2: vocab\.json without merges\.txt'):
    tokenizer_io.import_hf_tokenizer(str(gpt2), str(tmp_path / 'out'))


def test_pinned_in_a_workdir_and_loaded_back(tok, tmp_path):
  workdir = str(tmp_path / 'workdir')
  workdir_lib.pin_tokenizer(workdir, tok, None)
  info = json.loads(workdir_lib.path(workdir, 'tokenizer', 'tokenizer.json').read_text())
  assert info['kind'] == 'bytelevel_bpe' and info['sha256'] == tok.sha256()
  assert info['file'] != 'tokenizer.json'  # The tokenizer's own tokenizer.json is not the info.
  workdir_lib.pin_tokenizer(workdir, tok, None)  # Pinning the same one again is a no-op.
  loaded, counts = workdir_lib.load_tokenizer(workdir)
  assert counts is None and loaded.kind == 'bytelevel_bpe' and loaded.sha256() == tok.sha256()
  _same_ids(tok, loaded.encode)
  config = _config()
  assert loading.tokenizer_for_workdir(workdir, config).sha256() == tok.sha256()
  # An older workdir without a pinned tokenizer: config.tokenizer.path is used.
  shutil.rmtree(os.path.join(workdir, 'tokenizer'))
  config.tokenizer.path = tok.path
  _same_ids(tok, loading.tokenizer_for_workdir(workdir, config).encode)
