"""encoder_jax: pretraining BERT-family bidirectional encoders in JAX/Flax.

``encoder_jax.load(workdir_or_hf_dir)`` gives a checkpoint's config, tokenizer, params and
functions for hidden states, MLM logits and sentence embeddings (see ``encoder_jax.api``).
"""

__version__ = '0.1.0'


def load(path: str, step: int | None = None, config=None):
  """See :func:`encoder_jax.api.load` (imported on first use: ``import encoder_jax`` stays
  cheap, and the command-line tools that never load a checkpoint do not pay for JAX)."""
  from encoder_jax import api  # pylint: disable=g-import-not-at-top
  return api.load(path, step, config)
