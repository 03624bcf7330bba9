r"""Pretrains a BERT-family encoder.

  python -m encoder_jax.main --config=configs/bert_small.py --workdir=/tmp/bert_small
  python -m encoder_jax.main --config=configs/bert_base.py --workdir=gs://bucket/run \
      --config.train.batch_size=512

Configs are locked: overriding a key that does not exist (a typo) is an error. Starting
on a workdir that holds checkpoints resumes from the newest restorable one.
"""

from __future__ import annotations

import os

import jax
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from encoder_jax import train

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and metrics.')
flags.mark_flags_as_required(['config', 'workdir'])

# Environment variables that mean "one of several processes": TPU pod slices, SLURM,
# or an explicit coordinator (see launch/).
_MULTIHOST_ENV = ('JAX_COORDINATOR_ADDRESS', 'TPU_WORKER_HOSTNAMES', 'MEGASCALE_COORDINATOR_ADDRESS')


def _is_multihost() -> bool:
  if any(',' in os.environ.get(v, '') or (v != 'TPU_WORKER_HOSTNAMES' and os.environ.get(v))
         for v in _MULTIHOST_ENV):
    return True
  return int(os.environ.get('SLURM_NTASKS', '1')) > 1


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _is_multihost():
    jax.distributed.initialize()
  logging.info('JAX process %d/%d, %d local / %d global devices (%s)', jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(),
               jax.devices()[0].device_kind)
  train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  app.run(main)
