"""Tokenizer kinds by ``config.tokenizer.kind``: one entry per kind, declared once.

An entry says everything that differs between kinds: the file it keeps in a prepared
directory (and how a file is recognised as its), how that file is trained (or why it must
be given), read (``tokenizer_files``), where the specials go around texts, how masks are
matched, and how it is exported to Hugging Face files (``tokenizer_export``). Preparation,
``data.tokenizer.Tokenizer`` and ``interop.tokenizer`` dispatch through :func:`get`; a new
kind is its reader and exporter plus an entry here.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from encoder_jax.data import tokenizer_export
from encoder_jax.data import tokenizer_files
from encoder_jax.data import tokenizer_training

Template = tokenizer_files.Template


@dataclasses.dataclass(frozen=True)
class TokenizerKind:
  """One tokenizer kind.

  Attributes:
    name: its ``config.tokenizer.kind``.
    file: its file's name in a prepared directory.
    recognizes: whether a file path (by its name, or a cheap look inside) is this kind's;
      the kinds' answers exclude each other.
    read: ``(path, lowercase) -> tokenizer_files.Contents``, checking the file.
    export_hf: ``(tokenizer, out_dir, max_length) -> what it wrote``: Hugging Face files.
    train: ``(config, sources, path)``: trains the file on the corpus; None: the file must
      be given (``config.tokenizer.path``), ``given_file`` says what it is.
    role_pieces: the pieces that can play each role (``tokenizer_files.ROLES`` order), for
      a fixed-layout kind; None where the file records its roles.
    template: ``(cls_id, sep_id) -> Template``, the specials around one or two texts (the
      HF post-processor); None where the file records it.
    larger_table_ok: whether a model may have more embedding rows than pieces (an imported
      checkpoint's table, e.g. DeBERTa v3's 128,100 rows for 128,001 pieces).
    masks_in_backend: whether a mask literal becomes the mask piece and is matched by the
      tokenizer itself (as Hugging Face does), rather than split around.
    space_to_mask: whether the space before a mask belongs to it (RoBERTa's ``<mask>``
      has ``lstrip``).
  """
  name: str
  file: str
  recognizes: Callable[[str], bool]
  read: Callable[[str, bool], tokenizer_files.Contents]
  export_hf: Callable[..., str]
  train: Callable[..., None] | None = None
  given_file: str = ''
  role_pieces: tuple[tuple[str, ...], ...] | None = None
  template: Callable[[int, int], Template] | None = None
  larger_table_ok: bool = False
  masks_in_backend: bool = False
  space_to_mask: bool = False


_OTHER_SUFFIXES = ('.model', '.json')

KINDS: dict[str, TokenizerKind] = {k.name: k for k in (
    TokenizerKind(
        name='sentencepiece', file='tokenizer.model',
        recognizes=lambda path: path.endswith('.model'),
        read=tokenizer_files.read_sentencepiece,
        export_hf=tokenizer_export.export_sentencepiece,
        train=tokenizer_training.train_sentencepiece,
        role_pieces=tokenizer_files.BERT_ROLES, template=Template.bert),
    TokenizerKind(
        name='wordpiece', file='vocab.txt',
        recognizes=lambda path: not path.endswith(_OTHER_SUFFIXES),
        read=tokenizer_files.read_wordpiece,
        export_hf=tokenizer_export.export_wordpiece,
        given_file='a vocab.txt (WordPiece vocabularies are not trained here)',
        role_pieces=tokenizer_files.BERT_ROLES, template=Template.bert),
    TokenizerKind(
        name='bytelevel_bpe', file='tokenizer.json',
        recognizes=lambda path: (path.endswith('.json')
                                 and not tokenizer_files.is_hf_file(path)),
        read=tokenizer_files.read_bytelevel_bpe,
        export_hf=tokenizer_export.export_bytelevel_bpe,
        train=tokenizer_training.train_bytelevel_bpe,
        role_pieces=tokenizer_files.ROBERTA_ROLES, template=Template.roberta,
        space_to_mask=True),
    TokenizerKind(
        name=tokenizer_files.HF_KIND, file=tokenizer_files.HF_FILE,
        recognizes=lambda path: path.endswith('.json') and tokenizer_files.is_hf_file(path),
        read=tokenizer_files.read_hf,
        export_hf=tokenizer_export.export_hf,
        given_file=('an hf_tokenizer.json (convert hf_to_workdir writes one; Hugging Face '
                    'tokenizers are imported, not trained here)'),
        larger_table_ok=True, masks_in_backend=True),
)}


def get(name: str, context: str = '') -> TokenizerKind:
  """The kind ``name``; else one error listing the kinds (``context``: where it was named,
  e.g. `` for 'x.model'``)."""
  if name not in KINDS:
    raise ValueError(f'tokenizer kind {name!r}{context}; expected one of {list(KINDS)}')
  return KINDS[name]


def kind_of_file(path: str) -> str:
  """The kind whose file ``path`` is: 'sentencepiece' for a ``*.model``; for a ``*.json``,
  'hf' (an hf_tokenizer.json bundle) or 'bytelevel_bpe' (a tokenizer.json); else
  'wordpiece' (a ``vocab.txt``)."""
  return next(k.name for k in KINDS.values() if k.recognizes(path))

