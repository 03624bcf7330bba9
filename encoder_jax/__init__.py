"""encoder_jax: pretraining BERT-family bidirectional encoders in JAX/Flax."""

__version__ = '0.1.0'
