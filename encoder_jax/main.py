r"""Pretrains a BERT-family encoder.

  python -m encoder_jax.main --config=configs/bert_small.py --workdir=/tmp/bert_small
  python -m encoder_jax.main --config=configs/bert_base.py --workdir=gs://bucket/run \
      --config.train.batch_size=512

Configs are locked: overriding a key that does not exist (a typo) is an error. Starting
on a workdir that holds checkpoints resumes from the newest restorable one.
``--config.init.workdir=W`` (with ``--config.init.step``) or ``--config.init.hf_dir=D`` starts
a new run from that model's weights, network and tokenizer (continued pretraining,
``encoder_jax.api.pretrain``). Every process of
a multi-host run runs the same command; how it joins the others (TPU VM, SLURM, or explicit
--coordinator_address / --num_processes / --process_id) is ``encoder_jax.run.distributed``'s
business, see launch/README.md.
"""

from __future__ import annotations

import jax
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from encoder_jax.run import distributed
from encoder_jax.api import pretrain

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and metrics.')
flags.mark_flags_as_required(['config', 'workdir'])

_COORDINATOR_ADDRESS = flags.DEFINE_string(
    'coordinator_address', None, 'Multi-process runs on a cluster that is not SLURM or a TPU '
    'VM: host:port of process 0 (or JAX_COORDINATOR_ADDRESS). See launch/README.md.')
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', None, 'With --coordinator_address: the number of processes (or '
    'JAX_NUM_PROCESSES); 1 forces a single process.')
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', None, 'With --coordinator_address: this process, 0 .. num_processes - 1 (or '
    'JAX_PROCESS_ID).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  started = distributed.initialize(_COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value,
                                   _PROCESS_ID.value)
  where = (f'{started.description}: {jax.local_device_count()} local / {jax.device_count()} '
           f'global {jax.devices()[0].device_kind} devices')
  if started.how == 'single':
    logging.info('%s', where)
  else:  # Every process says how it joined: the first thing to read when a launch hangs.
    print(where, flush=True)
  pretrain.run(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main)
