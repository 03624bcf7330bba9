"""``encoder_jax.load``: one call from a workdir or a Hugging Face directory to a usable model.

    import encoder_jax
    m = encoder_jax.load('/tmp/bert_small')          # a workdir (latest checkpoint)
    m = encoder_jax.load('/tmp/bert_small', step=200)
    m = encoder_jax.load('hf/roberta-base')           # config.json + weights + tokenizer
    x = m.encode(['The cat sat on the mat.'])        # input_ids, segment_ids, input_mask
    h = m.hidden_states(**x)                         # float32 [B, L, H]
    logits = m.mlm_logits(**x)                       # float32 [B, L, vocab]
    e = m.embed(['a sentence', 'another'])           # float32 [N, H], mean-pooled, L2-normed
    m.fill_mask('The capital of France is [MASK].')  # [[(piece, p), ...]]
    m.config, m.tokenizer, m.params, m.kind, m.step

The result is ``loading.Loaded``. Loading never imports the training loop
or the input pipeline: the checkpoint's params tree is described by the pretraining
setup of its config (``objectives.build``), restored onto this machine's devices.
"""

from __future__ import annotations

import json
import os

import ml_collections

from encoder_jax import workdir as workdir_lib
from encoder_jax import loading
from encoder_jax.interop import hf_import

Loaded = loading.Loaded


def _is_hf_dir(path: str) -> bool:
  config = os.path.join(path, 'config.json')
  if '://' in path or not os.path.isfile(config):
    return False
  try:
    with open(config, encoding='utf-8') as f:
      return 'model_type' in json.load(f)
  except (OSError, ValueError):
    return False


def load(path: str, step: int | None = None,
         config: ml_collections.ConfigDict | None = None) -> Loaded:
  """A model from ``path``: an encoder_jax workdir (``step``: default the latest;
  ``config``: default its ``config.json``) or a Hugging Face directory of a registered kind
  (any registered kind)."""
  if _is_hf_dir(path):
    if step is not None or config is not None:
      raise ValueError(f'{path} is a Hugging Face directory: it has no steps or run config; '
                       'pass neither step nor config')
    return hf_import.load_hf_dir(path)
  if not workdir_lib.path(path).is_dir():
    raise FileNotFoundError(f'{path!r} does not exist; expected an encoder_jax workdir or a '
                            'Hugging Face directory (config.json with model_type)')
  return loading.load_workdir(path, config, step)
