"""What a run's workdir holds, in one place; local paths or ``gs://`` alike (etils.epath).

  <workdir>/config.json          the run's config
  <workdir>/tokenizer/           the tokenizer the run trains with, pinned at its start:
      tokenizer.model | vocab.txt, unigram_counts.npy, tokenizer.json (kind, sha256, ...)
  <workdir>/checkpoints/<step>/  Orbax checkpoints (see checkpointing.py)
  <workdir>/metrics.jsonl, <workdir>/tensorboard/

Pinning the tokenizer makes a workdir self-contained: evaluation, fill-mask, embeddings
and export read the ids the checkpoint was trained on, whatever the prepared-data cache
holds now, and a resumed run whose prepared tokenizer differs stops with both files named.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile

import ml_collections
import numpy as np
from etils import epath

TOKENIZER_DIR = 'tokenizer'
TOKENIZER_INFO = 'tokenizer.json'
UNIGRAM_COUNTS = 'unigram_counts.npy'


def path(workdir: str, *parts: str) -> epath.Path:
  """A path inside ``workdir`` (absolute for local directories; URLs kept as they are)."""
  root = workdir if '://' in workdir else os.path.abspath(workdir)
  return epath.Path(root).joinpath(*parts)


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  path(workdir).mkdir(parents=True, exist_ok=True)
  path(workdir, 'config.json').write_text(config.to_json_best_effort(indent=2))


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def pin_tokenizer(workdir: str, tokenizer, unigram_counts: np.ndarray | None) -> None:
  """Copies the run's tokenizer into the workdir, or checks it against the pinned one.

  ``unigram_counts`` may be None (an imported checkpoint: counts come with prepared data).
  """
  info_path = path(workdir, TOKENIZER_DIR, TOKENIZER_INFO)
  data = epath.Path(tokenizer.path).read_bytes()
  sha = _sha256(data)
  if info_path.exists():
    pinned = json.loads(info_path.read_text())
    if pinned['sha256'] != sha:
      raise ValueError(
          f'The tokenizer this run would use ({tokenizer.path}, sha256 {sha[:12]}) differs from '
          f'the one {workdir} was trained with ({path(workdir, TOKENIZER_DIR, pinned["file"])}, '
          f'sha256 {pinned["sha256"][:12]}): the ids would not match the checkpoint. Point '
          'config.data.prepared_dir at the data prepared for this run, or use a new workdir.')
    return
  directory = path(workdir, TOKENIZER_DIR)
  directory.mkdir(parents=True, exist_ok=True)
  name = os.path.basename(tokenizer.path)
  (directory / name).write_bytes(data)
  if unigram_counts is not None:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(unigram_counts, np.int64))
    (directory / UNIGRAM_COUNTS).write_bytes(buffer.getvalue())
  info_path.write_text(json.dumps({
      'kind': tokenizer.kind, 'file': name, 'sha256': sha, 'lowercase': bool(tokenizer.lowercase),
      'vocab_size': int(tokenizer.vocab_size), 'source': str(tokenizer.path)}, indent=2))


def has_pinned_tokenizer(workdir: str) -> bool:
  return path(workdir, TOKENIZER_DIR, TOKENIZER_INFO).exists()


def load_tokenizer(workdir: str):
  """(Tokenizer, unigram counts) pinned in ``workdir``; a clear error if there is none."""
  from encoder_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  info_path = path(workdir, TOKENIZER_DIR, TOKENIZER_INFO)
  if not info_path.exists():
    raise FileNotFoundError(f'{info_path} does not exist: {workdir!r} has no pinned tokenizer '
                            '(written when training starts, or by convert hf_to_workdir)')
  info = json.loads(info_path.read_text())
  source = path(workdir, TOKENIZER_DIR, info['file'])
  data = source.read_bytes()
  if _sha256(data) != info['sha256']:
    raise ValueError(f'{source} does not match the sha256 recorded in {info_path}: the file '
                     'was changed or truncated')
  local = source
  if '://' in workdir:  # SentencePiece and tokenizers read local files only.
    local = epath.Path(tempfile.mkdtemp(prefix='tokenizer_')) / info['file']
    local.write_bytes(data)
  tok = tokenizer_lib.Tokenizer.from_file(info['kind'], str(local), info['lowercase'])
  counts_path = path(workdir, TOKENIZER_DIR, UNIGRAM_COUNTS)
  counts = np.load(io.BytesIO(counts_path.read_bytes())) if counts_path.exists() else None
  return tok, counts
