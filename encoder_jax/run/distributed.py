"""Starts JAX's multi-process runtime from the environment of the launcher that started us.

``main`` calls :func:`initialize` before anything touches a device. Bare
``jax.distributed.initialize()`` is not enough: outside a cluster JAX recognises it fails
with "Number of processes must be defined", and under SLURM it gives each process one GPU
even when the launcher runs one process per node. So the launcher is decided here, in order:

1. explicit: ``--coordinator_address / --num_processes / --process_id``, or the variables
   ``JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID`` (a flag wins over its
   variable); any cluster, and ``launch/local_multiprocess.py``. All three are required;
   ``JAX_NUM_PROCESSES=1`` alone forces a single process (e.g. inside a SLURM allocation).
2. SLURM: an ``srun`` step with ``SLURM_NTASKS`` > 1. One task per node sees all the node's
   devices; several tasks per node get one device each (``SLURM_LOCALID``).
3. TPU: a Cloud TPU VM (TPU chips on the PCI bus) or a GKE / multislice TPU job; JAX reads
   the workers from the TPU metadata (a single-host VM becomes a 1-process run).
4. otherwise a single process: nothing to start.

Nothing here touches a device before ``jax.distributed.initialize``, which must come first.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Mapping

ENV_ADDRESS = 'JAX_COORDINATOR_ADDRESS'
ENV_NUM_PROCESSES = 'JAX_NUM_PROCESSES'
ENV_PROCESS_ID = 'JAX_PROCESS_ID'
_GOOGLE_PCI_VENDOR = '0x1ae0'  # TPU chips; the same test JAX uses to detect a TPU VM.


@dataclasses.dataclass(frozen=True)
class Plan:
  """How this process joins the run: ``how`` in (single, explicit, slurm, tpu)."""
  how: str
  kwargs: dict  # For jax.distributed.initialize.
  description: str


def _int(value: str | int | None, flag: str, env: str, minimum: int) -> int | None:
  if value is None or value == '':
    return None
  try:
    number = int(value)
  except (TypeError, ValueError):
    number = None
  if number is None or number < minimum:
    raise ValueError(f'--{flag} / {env} must be an integer >= {minimum}; got {value!r}')
  return number


def _explicit(address, num_processes, process_id, environ) -> Plan | None:
  address = address or environ.get(ENV_ADDRESS) or None
  n = _int(num_processes if num_processes is not None else environ.get(ENV_NUM_PROCESSES),
           'num_processes', ENV_NUM_PROCESSES, 1)
  i = _int(process_id if process_id is not None else environ.get(ENV_PROCESS_ID),
           'process_id', ENV_PROCESS_ID, 0)
  if address is None and n is None and i is None:
    return None
  if n == 1 and address is None and i in (None, 0):
    return Plan('single', {}, 'one process (--num_processes / JAX_NUM_PROCESSES = 1)')
  missing = [f'--{flag} or {env}' for value, flag, env in (
      (address, 'coordinator_address', ENV_ADDRESS), (n, 'num_processes', ENV_NUM_PROCESSES),
      (i, 'process_id', ENV_PROCESS_ID)) if value is None]
  if missing:
    raise ValueError(
        'An explicit multi-process launch needs the coordinator address, the number of '
        'processes and this process id; missing ' + ', '.join(missing) + '. Set all three '
        '(see launch/README.md), or none of them on SLURM / TPU VMs, which are detected.')
  host, sep, port = address.rpartition(':')
  if not sep or not host or not port.isdigit():
    raise ValueError(f'--coordinator_address / {ENV_ADDRESS} must be host:port (the address '
                     f'of process 0 and a free port); got {address!r}')
  if i >= n:
    raise ValueError(f'--process_id / {ENV_PROCESS_ID} = {i} is out of range for '
                     f'--num_processes / {ENV_NUM_PROCESSES} = {n}; expected 0 .. {n - 1}')
  # 'deactivate': what we were given is the whole truth; JAX must not override it from a
  # cluster it also recognises (e.g. restrict the devices when started inside SLURM).
  return Plan('explicit', dict(coordinator_address=address, num_processes=n, process_id=i,
                               cluster_detection_method='deactivate'),
              f'process {i} of {n}, coordinator {address} (explicit)')


def _slurm_first_host(node_list: str) -> str:
  """The first hostname of a SLURM node list: 'a[001-004,9],b' -> 'a001'."""
  head = node_list.split(',', 1)[0]
  if '[' not in head:
    return head
  prefix, rest = node_list.split('[', 1)
  return prefix + rest.split(',', 1)[0].split('-', 1)[0].rstrip(']')


def _slurm(environ) -> Plan | None:
  ntasks = int(environ.get('SLURM_NTASKS', '1') or 1)
  if ntasks <= 1 or 'SLURM_JOB_ID' not in environ:
    return None
  node_list = environ.get('SLURM_STEP_NODELIST') or ''
  if not node_list or 'SLURM_PROCID' not in environ:
    raise ValueError(
        f'SLURM_NTASKS={ntasks} but this is not an srun step (no SLURM_STEP_NODELIST / '
        'SLURM_PROCID): start main with srun (launch/slurm_gpu.sbatch does), or set '
        'JAX_NUM_PROCESSES=1 for a single process.')
  process_id = int(environ['SLURM_PROCID'])
  nodes = int(environ.get('SLURM_STEP_NUM_NODES') or environ.get('SLURM_NNODES') or 0)
  # JAX's own SLURM port: the same on every task, derived from the job id.
  port = environ.get('JAX_COORDINATOR_PORT') or str(
      int(environ['SLURM_JOB_ID']) % 2**12 + (65535 - 2**12 + 1))
  kwargs = dict(coordinator_address=f'{_slurm_first_host(node_list)}:{port}',
                num_processes=ntasks, process_id=process_id,
                cluster_detection_method='deactivate')
  if nodes == ntasks:
    layout = 'one per node, all local devices'
  else:
    layout = 'several per node, one device each (SLURM_LOCALID)'
    if 'JAX_LOCAL_DEVICE_IDS' not in environ:
      kwargs['local_device_ids'] = [int(environ.get('SLURM_LOCALID', 0))]
  return Plan('slurm', kwargs, f'process {process_id} of {ntasks} (SLURM, {layout})')


def _on_tpu_vm() -> bool:
  for vendor in glob.glob('/sys/bus/pci/devices/*/vendor'):
    try:
      with open(vendor) as f:
        if f.read().strip() == _GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return False


def _tpu(environ) -> Plan | None:
  gke = any(',' in environ.get(v, '') for v in ('TPU_WORKER_HOSTNAMES', 'TPU_PROCESS_ADDRESSES'))
  if gke or environ.get('MEGASCALE_COORDINATOR_ADDRESS') or _on_tpu_vm():
    return Plan('tpu', {}, 'TPU VM / pod slice (workers from the TPU metadata)')
  return None


def plan(coordinator_address: str | None = None, num_processes: int | None = None,
         process_id: int | None = None,
         environ: Mapping[str, str] | None = None) -> Plan:
  """Decides how to start (see the module docstring); starts nothing."""
  environ = os.environ if environ is None else environ
  return (_explicit(coordinator_address, num_processes, process_id, environ)
          or _slurm(environ) or _tpu(environ)
          or Plan('single', {}, 'one process (no launcher detected)'))


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> Plan:
  """Joins the multi-process run this process belongs to, if any; returns the plan."""
  chosen = plan(coordinator_address, num_processes, process_id)
  if chosen.how == 'single':
    return chosen
  import jax  # pylint: disable=g-import-not-at-top
  if 'JAX_CPU_COLLECTIVES_IMPLEMENTATION' not in os.environ:
    # Cross-process collectives of the CPU backend (several CPU processes, e.g. the local
    # launcher); gloo is JAX's default today, set explicitly so it cannot silently be none.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  try:
    jax.distributed.initialize(**chosen.kwargs)
  except (ValueError, RuntimeError) as e:
    raise RuntimeError(
        f'Starting the multi-process run as {chosen.description} failed: {e}. On a TPU VM, '
        'install .[tpu]; to run a single process instead, set JAX_NUM_PROCESSES=1.') from e
  return chosen
