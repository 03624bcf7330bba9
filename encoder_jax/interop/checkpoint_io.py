"""Kept for the ``config.py`` that ``convert hf_to_workdir`` wrote into workdirs before
loading moved to ``encoder_jax.loading.loaded``: those files call ``read_run_config`` from here."""

from encoder_jax.loading.loaded import read_run_config  # pylint: disable=unused-import
