"""The Hugging Face files of each tokenizer kind: what ``export_<kind>(tok, out_dir,
max_length)`` writes so that ``AutoTokenizer.from_pretrained(out_dir)`` reads a tokenizer
with our ids; each returns what it wrote. ``tokenizer_kinds`` names each kind's exporter and
``interop.tokenizer.export_hf_tokenizer`` dispatches through it.
"""

from __future__ import annotations

import json
import os
import shutil

from encoder_jax.data import tokenizer_files

VOCAB_TXT = 'vocab.txt'
SENTENCEPIECE_MODEL = 'tokenizer.model'
TOKENIZER_JSON = 'tokenizer.json'
TOKENIZER_CONFIG = 'tokenizer_config.json'
VOCAB_JSON = 'vocab.json'
MERGES_TXT = 'merges.txt'
SPECIAL_TOKENS_MAP = 'special_tokens_map.json'
# The special tokens of tokenizer_config.json, with their BERT pieces.
SPECIAL_TOKENS = {'unk_token': '[UNK]', 'sep_token': '[SEP]', 'pad_token': '[PAD]',
                  'cls_token': '[CLS]', 'mask_token': '[MASK]'}


def sentencepiece_to_hf(tok):
  """A ``tokenizers.Tokenizer`` that tokenizes as the SentencePiece ``tok`` does, BERT-style.

  Pieces and scores (Unigram) or merges (BPE), SentencePiece's own normalisation table, the
  '▁' word-boundary convention, the five special pieces, and ``[CLS] $A [SEP] $B [SEP]``.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, normalizers, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top,g-multiple-import
  proto = sentencepiece_model_pb2.ModelProto()
  with open(tok.path, 'rb') as f:
    proto.ParseFromString(f.read())
  if proto.trainer_spec.byte_fallback:
    raise ValueError(f'{tok.path}: byte_fallback SentencePiece models are not exported')
  vocab = [(p.piece, p.score) for p in proto.pieces]
  model_type = proto.trainer_spec.model_type
  if model_type == 1:  # UNIGRAM
    model = models.Unigram(vocab, unk_id=tok.unk_id, byte_fallback=False)
  elif model_type == 2:  # BPE: every split of a piece into two pieces, best piece first.
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}
    merges = []
    for piece, score in vocab:
      local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
               if piece[:k] in ids and piece[k:] in ids]
      merges += sorted(local, key=lambda m: (ids[m[0]], ids[m[1]]))
    merges.sort(key=lambda m: m[2], reverse=True)
    model = models.BPE({p: i for p, i in ids.items()}, [(a, b) for a, b, _ in merges],
                       unk_token=tok.id_to_piece(tok.unk_id), fuse_unk=True,
                       byte_fallback=False)
  else:
    raise ValueError(f'{tok.path}: SentencePiece model type {model_type}; only unigram (1) '
                     'and bpe (2) are exported')
  hf = tokenizers.Tokenizer(model)
  steps = [normalizers.Strip(left=False, right=True),
           normalizers.Replace(tokenizers.Regex(' {2,}'), '\u2581')]
  if proto.normalizer_spec.precompiled_charsmap:
    steps.insert(0, normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
  hf.normalizer = normalizers.Sequence(steps)
  prepend = 'always' if proto.normalizer_spec.add_dummy_prefix else 'never'
  hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement='\u2581', prepend_scheme=prepend)
  hf.decoder = decoders.Metaspace(replacement='\u2581', prepend_scheme=prepend)
  hf.add_special_tokens([tokenizers.AddedToken(tok.id_to_piece(i), normalized=False,
                                               special=True)
                         for i in (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id,
                                   tok.mask_id)])
  cls, sep = tok.id_to_piece(tok.cls_id), tok.id_to_piece(tok.sep_id)
  hf.post_processor = processors.TemplateProcessing(
      single=f'{cls}:0 $A:0 {sep}:0', pair=f'{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1',
      special_tokens=[(cls, tok.cls_id), (sep, tok.sep_id)])
  return hf


def bytelevel_bpe_to_hf(tok):
  """RoBERTa's ``tokenizers.Tokenizer`` for the byte-level BPE ``tok``: its ids, its merges,
  RoBERTa's post-processor (whatever post-processor the pinned file has)."""
  with open(tok.path, encoding='utf-8') as f:
    merges = tokenizer_files.bpe_merges(json.load(f))
  vocab = {tok.id_to_piece(i): i for i in range(tok.vocab_size)}
  return tokenizer_files.build_bytelevel_bpe(vocab, merges)


def _write_bytelevel_bpe(tok, out_dir: str) -> None:
  """tokenizer.json (fast) and vocab.json + merges.txt (GPT-2's slow files) of ``tok``."""
  hf = bytelevel_bpe_to_hf(tok)
  hf.save(os.path.join(out_dir, TOKENIZER_JSON))
  vocab = {tok.id_to_piece(i): i for i in range(tok.vocab_size)}
  with open(os.path.join(out_dir, VOCAB_JSON), 'w', encoding='utf-8') as f:
    json.dump(vocab, f, ensure_ascii=False)
  merges = json.loads(hf.to_str())['model']['merges']
  with open(os.path.join(out_dir, MERGES_TXT), 'w', encoding='utf-8') as f:
    f.write('#version: 0.2\n')
    f.writelines((m if isinstance(m, str) else ' '.join(m)) + '\n' for m in merges)


def _special_tokens(tok) -> dict[str, str]:
  """tokenizer_config.json's special tokens (``unk_token``...): ``tok``'s pieces."""
  return {k: tok.id_to_piece(getattr(tok, k.replace('_token', '_id'))) for k in SPECIAL_TOKENS}


def _write_config(out_dir: str, cfg: dict, specials: dict, max_length: int,
                  input_names=('input_ids', 'token_type_ids', 'attention_mask')) -> None:
  """tokenizer_config.json: ``cfg``, the special tokens, the length and the input names."""
  cfg.update(specials, model_max_length=int(max_length), model_input_names=list(input_names))
  with open(os.path.join(out_dir, TOKENIZER_CONFIG), 'w', encoding='utf-8') as f:
    json.dump(cfg, f, indent=2)


def export_sentencepiece(tok, out_dir: str, max_length: int) -> str:
  """The raw ``tokenizer.model`` and a fast ``tokenizer.json`` (``sentencepiece_to_hf``)."""
  shutil.copyfile(tok.path, os.path.join(out_dir, SENTENCEPIECE_MODEL))
  sentencepiece_to_hf(tok).save(os.path.join(out_dir, TOKENIZER_JSON))
  _write_config(out_dir, {'tokenizer_class': 'PreTrainedTokenizerFast'}, _special_tokens(tok),
                max_length)
  return (f'{TOKENIZER_JSON} + {TOKENIZER_CONFIG} (fast tokenizer) + '
          f'{SENTENCEPIECE_MODEL} (SentencePiece)')


def export_wordpiece(tok, out_dir: str, max_length: int) -> str:
  """BERT's ``vocab.txt`` and ``BertTokenizer`` settings."""
  shutil.copyfile(tok.path, os.path.join(out_dir, VOCAB_TXT))
  cfg = {'tokenizer_class': 'BertTokenizer', 'do_lower_case': bool(tok.lowercase)}
  _write_config(out_dir, cfg, _special_tokens(tok), max_length)
  return f'{VOCAB_TXT} + {TOKENIZER_CONFIG} (WordPiece)'


def export_bytelevel_bpe(tok, out_dir: str, max_length: int) -> str:
  """RoBERTa's files: tokenizer.json, vocab.json + merges.txt, special_tokens_map.json."""
  _write_bytelevel_bpe(tok, out_dir)
  specials = _special_tokens(tok)
  specials.update(bos_token=specials['cls_token'], eos_token=specials['sep_token'])
  with open(os.path.join(out_dir, SPECIAL_TOKENS_MAP), 'w', encoding='utf-8') as f:
    json.dump(specials, f, indent=2)
  cfg = {'tokenizer_class': 'RobertaTokenizer', 'add_prefix_space': False,
         'trim_offsets': True, 'errors': 'replace'}
  # RoBERTa: one segment, no type ids.
  _write_config(out_dir, cfg, specials, max_length, ('input_ids', 'attention_mask'))
  return (f'{TOKENIZER_JSON} + {VOCAB_JSON} + {MERGES_TXT} + {TOKENIZER_CONFIG} + '
          f'{SPECIAL_TOKENS_MAP} (byte-level BPE, RoBERTa)')


def export_hf(tok, out_dir: str, max_length: int) -> str:
  """The imported checkpoint's own files, back: its tokenizer.json, special_tokens_map.json
  and tokenizer_config.json (roles and padding side filled in where it named none)."""
  with open(tok.path, encoding='utf-8') as f:
    bundle = json.load(f)
  with open(os.path.join(out_dir, TOKENIZER_JSON), 'w', encoding='utf-8') as f:
    json.dump(bundle['tokenizer'], f, ensure_ascii=False, indent=2)
  if bundle.get('special_tokens_map'):
    with open(os.path.join(out_dir, SPECIAL_TOKENS_MAP), 'w', encoding='utf-8') as f:
      json.dump(bundle['special_tokens_map'], f, ensure_ascii=False, indent=2)
  cfg = dict(bundle.get('tokenizer_config') or {})
  cfg.setdefault('tokenizer_class', 'PreTrainedTokenizerFast')
  cfg.setdefault('padding_side', tok.padding_side)
  for role in tokenizer_files.ROLES:
    cfg.setdefault(f'{role}_token', bundle['role_pieces'][role])
  cfg['model_max_length'] = int(max_length)
  with open(os.path.join(out_dir, TOKENIZER_CONFIG), 'w', encoding='utf-8') as f:
    json.dump(cfg, f, ensure_ascii=False, indent=2)
  return (f'{TOKENIZER_JSON} + {TOKENIZER_CONFIG} (the imported '
          f'{cfg["tokenizer_class"]}, {bundle["tokenizer"]["model"]["type"]})')
