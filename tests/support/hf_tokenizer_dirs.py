"""Hugging Face directories laid out as each family's public checkpoints ship them.

For every registered kind: a small tokenizer trained here on real text (the embedded
corpus: the Python standard library's docstrings, plus a few real sentences in other
languages), saved with ``save_pretrained`` beside the slow-tokenizer file the family's
public checkpoints carry, and a random-weight model of an odd shape whose vocabulary is
the tokenizer's.

| kind | files (as the public checkpoints) | tokenizer |
|---|---|---|
| bert, electra | vocab.txt + tokenizer.json | WordPiece, [PAD]=0 [UNK] [CLS] [SEP] [MASK] |
| roberta | vocab.json + merges.txt + tokenizer.json | byte-level BPE, <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4 |
| albert | spiece.model + tokenizer.json | SentencePiece Unigram, <pad>=0 <unk>=1 [CLS] [SEP] [MASK] |
| deberta | vocab.json + merges.txt + tokenizer.json | GPT-2 byte-level BPE, [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, [MASK] last |
| deberta_v2 | spm.model + tokenizer.json | SentencePiece, [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, [MASK] added last; 7 more embedding rows than pieces, as v3 |
| xlnet | spiece.model + tokenizer.json | SentencePiece, <unk>=0 <s> </s> <cls>=3 <sep>=4 <pad>=5 <mask>=6 |
| modernbert | tokenizer.json (+ tokenizer_config.json, special_tokens_map.json) | OLMo-style byte-level BPE (PreTrainedTokenizerFast), [UNK] [CLS] [SEP] [PAD] [MASK] (lstrip) appended last, [CLS] A [SEP]; 3 more embedding rows than pieces |
"""

from __future__ import annotations

import json
import os
import shutil

import sentencepiece as spm
import tokenizers
import torch
import transformers

from support import hf_fixtures


KINDS = ('bert', 'electra', 'roberta', 'albert', 'deberta', 'deberta_v2', 'xlnet', 'modernbert')
# Embedding rows past the tokenizer's pieces (DeBERTa v3: 128,100 for 128,001; ModernBERT:
# 50,368 for 50,285).
EXTRA_ROWS = {'deberta_v2': 7, 'modernbert': 3}
VOCAB = 400

# Real sentences in other scripts, so accents and non-Latin text reach the vocabularies.
WORLD = (
    'Le café de la gare est fermé le dimanche, mais la boulangerie reste ouverte.',
    'Die Straße über den Fluss wurde nach dem Hochwasser für eine Woche gesperrt.',
    'El niño leyó el periódico de la mañana antes de ir a la escuela.',
    'São Paulo é a maior cidade do Brasil e fica no sudeste do país.',
    'Москва является столицей России и крупнейшим городом страны.',
    '北京是中华人民共和国的首都，也是全国的政治和文化中心。',
    '東京は日本の首都であり、世界最大級の都市圏を形成している。',
    'Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.',
)

# Varied real text: accents, unicode, long words, repeated whitespace, empty lines, pairs.
TEXTS = (
    'Return the number of items in a container.',
    'Naïve café owners in Zürich serve crème brûlée at the Ærø festival.',
    '  Leading and   repeated   whitespace\tand\ttabs  ',
    '',
    'Antidisestablishmentarianism and pneumonoultramicroscopicsilicovolcanoconiosis are long.',
    '北京是中国的首都。東京は日本の首都です。',
    'Москва — столица России.',
    'Symbols: ½ × ² ™ © and an emoji 🙂 end here.',
    'First line\nsecond line\n\nafter an empty line',
    "``Quoted'' text, with double backticks and 'single' quotes.",
    'CamelCaseIdentifiers like HTTPServer and getattr() appear in docstrings.',
    'The year 1999 had 365 days; 3.14159 is pi.',
)
PAIRS = tuple(zip(TEXTS[:6], TEXTS[6:]))


def training_text(num_documents: int = 150) -> list[str]:
  from encoder_jax.data import embedded  # pylint: disable=g-import-not-at-top
  docs = embedded.embedded_corpus()[:num_documents]
  return [s for doc in docs for s in doc] + list(WORLD) * 5


def _sentencepiece(prefix: str, **kwargs) -> str:
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(training_text()), model_prefix=prefix, vocab_size=VOCAB,
      character_coverage=1.0, minloglevel=2, **kwargs)
  return prefix + '.model'


def _bytelevel_bpe(out_dir: str, special_tokens: list[str]) -> None:
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(training_text(), vocab_size=VOCAB, min_frequency=2,
                          special_tokens=special_tokens, show_progress=False)
  bpe.save_model(out_dir)


def _wordpiece(out_dir: str) -> None:
  wp = tokenizers.BertWordPieceTokenizer(lowercase=True)
  wp.train_from_iterator(training_text(), vocab_size=VOCAB, show_progress=False,
                         special_tokens=['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'])
  wp.save_model(out_dir)


def _modernbert_tokenizer() -> transformers.PreTrainedTokenizerFast:
  """ModernBERT's layout (its tokenizer.json is OLMo's byte-level BPE): BPE trained with
  OLMo's two specials first, then BERT's specials added after the merges' vocabulary, the
  mask token stripping the space before it, [CLS] $A [SEP] ($B [SEP])."""
  from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers  # pylint: disable=g-import-not-at-top,g-multiple-import
  bpe = tokenizers.Tokenizer(models.BPE())
  bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  bpe.decoder = decoders.ByteLevel()
  bpe.train_from_iterator(training_text(), trainers.BpeTrainer(
      vocab_size=VOCAB, min_frequency=2, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      special_tokens=['|||IP_ADDRESS|||', '<|padding|>']))
  bpe.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t in ('[UNK]', '[CLS]', '[SEP]', '[PAD]')]
                         + [AddedToken('[MASK]', special=True, normalized=False, lstrip=True)])
  cls, sep = bpe.token_to_id('[CLS]'), bpe.token_to_id('[SEP]')
  bpe.post_processor = processors.TemplateProcessing(
      single='[CLS]:0 $A:0 [SEP]:0', pair='[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1',
      special_tokens=[('[CLS]', cls), ('[SEP]', sep)])
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=bpe, unk_token='[UNK]', cls_token='[CLS]', sep_token='[SEP]',
      pad_token='[PAD]', mask_token='[MASK]', model_input_names=['input_ids', 'attention_mask'])


def save_tokenizer(kind: str, out_dir: str) -> transformers.PreTrainedTokenizerBase:
  """Trains ``kind``'s tokenizer and saves it into ``out_dir`` with the slow files its
  public checkpoints ship; the tokenizer as ``AutoTokenizer`` loads it back."""
  os.makedirs(out_dir, exist_ok=True)
  work = out_dir + '.train'
  os.makedirs(work, exist_ok=True)
  slow = []
  if kind in ('bert', 'electra'):
    _wordpiece(work)
    cls = transformers.BertTokenizer if kind == 'bert' else transformers.ElectraTokenizer
    tok = cls.from_pretrained(work)
    slow = ['vocab.txt']
  elif kind == 'roberta':  # tokenizers' byte-level BPE: special tokens first (<mask> = 4).
    _bytelevel_bpe(work, ['<s>', '<pad>', '</s>', '<unk>', '<mask>'])
    tok = transformers.RobertaTokenizer.from_pretrained(work)
    slow = ['vocab.json', 'merges.txt']
  elif kind == 'deberta':  # GPT-2's BPE with BERT's special tokens, [MASK] the last id.
    _bytelevel_bpe(work, ['[PAD]', '[CLS]', '[SEP]', '[UNK]'])
    path = os.path.join(work, 'vocab.json')
    with open(path, encoding='utf-8') as f:
      vocab = json.load(f)
    vocab['[MASK]'] = len(vocab)
    with open(path, 'w', encoding='utf-8') as f:
      json.dump(vocab, f, ensure_ascii=False)
    tok = transformers.DebertaTokenizer.from_pretrained(work)
    slow = ['vocab.json', 'merges.txt']
  elif kind == 'albert':  # ALBERT's ids: <pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4.
    model = _sentencepiece(os.path.join(work, 'sp'), pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                           control_symbols=['[CLS]', '[SEP]'], user_defined_symbols=['[MASK]'])
    shutil.copyfile(model, os.path.join(work, 'spiece.model'))
    tok = transformers.AlbertTokenizer.from_pretrained(work)
    slow = ['spiece.model']
  elif kind == 'deberta_v2':  # DeBERTa v3's ids: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3; [MASK] added.
    model = _sentencepiece(os.path.join(work, 'sp'), pad_id=0, bos_id=1, eos_id=2, unk_id=3,
                           pad_piece='[PAD]', bos_piece='[CLS]', eos_piece='[SEP]',
                           unk_piece='[UNK]')
    shutil.copyfile(model, os.path.join(work, 'spm.model'))
    tok = transformers.DebertaV2Tokenizer.from_pretrained(work)
    slow = ['spm.model']
  elif kind == 'xlnet':  # XLNet's ids: <unk>=0 <s>=1 </s>=2 <cls>=3 <sep>=4 <pad>=5 <mask>=6.
    model = _sentencepiece(os.path.join(work, 'sp'), unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                           control_symbols=['<cls>', '<sep>', '<pad>', '<mask>', '<eod>',
                                            '<eop>'])
    shutil.copyfile(model, os.path.join(work, 'spiece.model'))
    tok = transformers.XLNetTokenizer.from_pretrained(work)
    slow = ['spiece.model']
  elif kind == 'modernbert':  # Only the fast tokenizer's files, as ModernBERT ships.
    tok = _modernbert_tokenizer()
  else:
    raise ValueError(f'kind {kind!r}; expected one of {KINDS}')
  tok.save_pretrained(out_dir)
  for name in slow:  # The slow file the public checkpoints carry beside tokenizer.json.
    if not os.path.exists(os.path.join(out_dir, name)):
      shutil.copyfile(os.path.join(work, name), os.path.join(out_dir, name))
  shutil.rmtree(work)
  return transformers.AutoTokenizer.from_pretrained(out_dir)


def hf_model(kind: str, vocab_size: int, seed: int = 0, tok=None):
  """A random-weight model of ``kind`` with an MLM head, of an odd shape (3 heads of 12);
  ``tok`` (ModernBERT) gives the special ids of its config."""
  common = dict(vocab_size=vocab_size, num_hidden_layers=2, num_attention_heads=3,
                intermediate_size=50, attn_implementation='eager')
  bert_like = dict(common, hidden_size=36, max_position_embeddings=128)
  if kind == 'bert':
    model = transformers.BertForPreTraining(transformers.BertConfig(**bert_like))
  elif kind == 'electra':  # The generator: ELECTRA's masked LM.
    model = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        **bert_like, embedding_size=20))
  elif kind == 'roberta':
    model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
        **dict(bert_like, max_position_embeddings=130), type_vocab_size=1, layer_norm_eps=1e-5,
        pad_token_id=1, bos_token_id=0, eos_token_id=2))
  elif kind == 'albert':
    model = transformers.AlbertForPreTraining(transformers.AlbertConfig(
        **bert_like, embedding_size=19, hidden_act='gelu_new', pad_token_id=0))
  elif kind == 'deberta':
    model = transformers.DebertaForMaskedLM(transformers.DebertaConfig(
        **bert_like, relative_attention=True, pos_att_type='c2p|p2c', max_relative_positions=-1,
        position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7, pad_token_id=0))
  elif kind == 'deberta_v2':
    model = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(
        **bert_like, relative_attention=True, pos_att_type='p2c|c2p', position_buckets=8,
        share_att_key=True, norm_rel_ebd='layer_norm', position_biased_input=False,
        type_vocab_size=0, layer_norm_eps=1e-7, pad_token_id=0))
  elif kind == 'xlnet':
    model = transformers.XLNetLMHeadModel(transformers.XLNetConfig(
        vocab_size=vocab_size, d_model=36, n_layer=2, n_head=3, d_inner=50, ff_activation='gelu',
        attn_type='bi', mem_len=None, pad_token_id=5))
  elif kind == 'modernbert':  # Layers: global, local, local (a 6-token window).
    model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        **dict(bert_like, num_hidden_layers=3), local_attention=6, global_attn_every_n_layers=3,
        global_rope_theta=2000.0, local_rope_theta=300.0, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id, cls_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id, sep_token_id=tok.sep_token_id))
  else:
    raise ValueError(f'kind {kind!r}; expected one of {KINDS}')
  torch.manual_seed(seed)
  return hf_fixtures.randomize_(model.eval())


def make_dir(kind: str, out_dir: str):
  """(AutoTokenizer, HF model) of ``kind`` saved into ``out_dir``."""
  tok = save_tokenizer(kind, out_dir)
  model = hf_model(kind, len(tok) + EXTRA_ROWS.get(kind, 0), tok=tok)
  model.save_pretrained(out_dir)
  return tok, model
