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
or the input pipeline: the checkpoint's params tree is described by what its config's
pretraining trains (``objectives.build``), restored onto this machine's devices.
"""

from __future__ import annotations

import ml_collections

from encoder_jax.loading import loaded as loading
from encoder_jax.api import source

Loaded = loading.Loaded


def load(path: str, step: int | None = None,
         config: ml_collections.ConfigDict | None = None) -> Loaded:
  """A model from ``path``: an encoder_jax workdir (``step``: default the latest;
  ``config``: default its ``config.json``), a Hugging Face directory of a registered kind,
  or ``reference:NAME`` (``source.REFERENCES``)."""
  return source.load(source.at(path, step), config)
