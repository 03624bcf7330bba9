"""A model as a sentence-transformers directory: ``SentenceTransformer(dir).encode(texts)``
gives what ``encoder_jax.load(...).embed(texts)`` gives.

The directory is the kind's Hugging Face export (``hf.save_hf``: ``config.json`` +
``model.safetensors``, and the tokenizer files ``AutoTokenizer`` reads) as the
``Transformer`` module at its top, then ``1_Pooling/config.json`` (mean, [CLS] or max
pooling over the final hidden states of the real tokens, specials included, as
``inference.pool``), ``2_Normalize`` (L2 normalisation) when the embeddings are normalised,
``modules.json`` listing them, ``sentence_bert_config.json`` (``max_seq_length``: inputs are
cut there, as ``embed`` cuts them) and ``config_sentence_transformers.json`` (cosine
similarity). Importing such a directory (``hf_import``) keeps these settings as the
workdir's embedding defaults.
"""

from __future__ import annotations

import json
import os

from encoder_jax.loading import loaded as loading
from encoder_jax.interop import hf
from encoder_jax.interop import tokenizer as tokenizer_io
from encoder_jax.models import config as config_lib

POOLINGS = ('mean', 'cls', 'max')
TRANSFORMER = 'sentence_transformers.models.Transformer'
POOLING = 'sentence_transformers.models.Pooling'
NORMALIZE = 'sentence_transformers.models.Normalize'


def module_files(hidden_size: int, pooling: str, normalize: bool,
                 max_seq_length: int) -> dict[str, object]:
  """sentence-transformers' own files (relative path -> JSON) beside the model's."""
  if pooling not in POOLINGS:
    raise ValueError(f'pooling={pooling!r}; expected one of {POOLINGS}')
  modules = [{'idx': 0, 'name': '0', 'path': '', 'type': TRANSFORMER},
             {'idx': 1, 'name': '1', 'path': '1_Pooling', 'type': POOLING}]
  if normalize:
    modules.append({'idx': 2, 'name': '2', 'path': '2_Normalize', 'type': NORMALIZE})
  return {
      'modules.json': modules,
      'sentence_bert_config.json': {'max_seq_length': int(max_seq_length),
                                    'do_lower_case': False},
      os.path.join('1_Pooling', 'config.json'): {
          'word_embedding_dimension': int(hidden_size),
          'pooling_mode_cls_token': pooling == 'cls',
          'pooling_mode_mean_tokens': pooling == 'mean',
          'pooling_mode_max_tokens': pooling == 'max',
          'pooling_mode_mean_sqrt_len_tokens': False},
      'config_sentence_transformers.json': {'similarity_fn_name': 'cosine'},
  }


def write(out: str, config: config_lib.EncoderConfig, params, tok, max_length: int, *,
          pooling: str = 'mean', normalize: bool = True,
          max_seq_length: int | None = None) -> str:
  """Writes the sentence-transformers directory ``out`` of the kind's downstream network
  (``config``, ``params``) and tokenizer ``tok`` (``max_length``: the model's position
  limit; ``max_seq_length``: where inputs are cut, default ``max_length``). Returns a
  description of what was written."""
  max_seq_length = min(int(max_seq_length or max_length), int(max_length))
  files = module_files(config.hidden_size, pooling, normalize, max_seq_length)
  hf.save_hf(out, config, params, pad_token_id=tok.pad_id)  # Refuses what HF cannot compute.
  written = tokenizer_io.export_hf_tokenizer(tok, out, max_length)
  os.makedirs(os.path.join(out, '1_Pooling'), exist_ok=True)
  if normalize:
    os.makedirs(os.path.join(out, '2_Normalize'), exist_ok=True)
  for name, value in files.items():
    with open(os.path.join(out, name), 'w', encoding='utf-8') as f:
      json.dump(value, f, indent=2)
  return (f'{pooling} pooling, {"L2-normalised" if normalize else "not normalised"}, '
          f'max_seq_length {max_seq_length}; {written}')


def write_loaded(loaded: loading.Loaded, out: str, *, pooling: str | None = None,
                 normalize: bool | None = None, max_seq_length: int | None = None) -> str:
  """:func:`write` for a loaded model, with ``embed``'s defaults: the pooling, cut and
  normalisation it came with (a sentence-transformers import), else mean pooling at its
  position limit, L2-normalised (what the span contrastive objective trains)."""
  network, params = loaded.trainable.downstream(loading.to_host(loaded.params))
  settings = loaded.sentence_settings or {}
  if normalize is None:
    normalize = bool(settings.get('normalize', True)) if settings else True
  return write(out, network.config, params, loaded.tokenizer, loaded.max_length,
               pooling=pooling or loaded.default_pooling, normalize=normalize,
               max_seq_length=max_seq_length or loaded.default_max_len)
