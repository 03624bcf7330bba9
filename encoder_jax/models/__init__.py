"""The encoder networks. Importing any module of the package imports the model registry
(``models.registry``, and through it every kind): an EncoderConfig reads its fields from it,
so ``from encoder_jax.models import bert`` alone builds a ``bert.BertConfig``."""

from encoder_jax.models import registry  # noqa: F401  pylint: disable=unused-import
