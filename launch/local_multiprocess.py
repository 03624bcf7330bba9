#!/usr/bin/env python3
r"""Runs N copies of a command on this machine as one JAX multi-process run.

  python launch/local_multiprocess.py --num_processes=2 --cpu_devices_per_process=4 -- \
      python -m encoder_jax.main --config=configs/bert_small.py --workdir=/tmp/bert_small_2p

Process i gets JAX_COORDINATOR_ADDRESS (localhost and a free port), JAX_NUM_PROCESSES and
JAX_PROCESS_ID=i, which ``encoder_jax.run.distributed`` reads; ``--cpu_devices_per_process=K``
also gives each process K simulated CPU devices (JAX_PLATFORMS=cpu and XLA's
``--xla_force_host_platform_device_count``), so a laptop runs what a pod runs. Every output
line is prefixed with ``[p<i>]``. If one process fails or is killed, the others are
killed too (they would wait forever in the next collective) and the launcher exits with
that process's status (128 + signal for a signal); rerunning the same command resumes from
the last checkpoint. SIGTERM / SIGINT to the launcher are forwarded to every process (a
preemption: they agree on a step, save a checkpoint and exit). Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
  """A TCP port that was free a moment ago (the coordinator binds it right after)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def child_env(base: dict, index: int, count: int, address: str,
              cpu_devices: int | None) -> dict:
  env = dict(base, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=str(count),
             JAX_PROCESS_ID=str(index), PYTHONUNBUFFERED='1')
  if cpu_devices:
    flags = re.sub(r'--xla_force_host_platform_device_count=\S+', '',
                   env.get('XLA_FLAGS', '')).split()
    env['XLA_FLAGS'] = ' '.join(flags + [f'--xla_force_host_platform_device_count={cpu_devices}'])
    env['JAX_PLATFORMS'] = 'cpu'
  return env


def _pump(stream, prefix: str, out, lock: threading.Lock):
  for line in iter(stream.readline, b''):
    with lock:
      out.write(prefix + line.decode('utf-8', 'replace'))
      out.flush()
  stream.close()


def _status(returncode: int) -> int:
  return 128 - returncode if returncode < 0 else returncode


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      usage='%(prog)s --num_processes=N [--cpu_devices_per_process=K] -- COMMAND ...')
  parser.add_argument('--num_processes', type=int, required=True,
                      help='How many copies of COMMAND to run (JAX processes).')
  parser.add_argument('--cpu_devices_per_process', type=int, default=None,
                      help='Simulated CPU devices per process (CPU backend); default: the '
                      'machine\'s own devices.')
  parser.add_argument('--port', type=int, default=0,
                      help='Coordinator port on localhost; default: a free one.')
  parser.add_argument('command', nargs=argparse.REMAINDER,
                      help='The command, after --, e.g. python -m encoder_jax.main ...')
  args = parser.parse_args(argv)
  command = args.command[1:] if args.command[:1] == ['--'] else args.command
  if not command:
    parser.error('give the command to run after --, e.g. -- python -m encoder_jax.main ...')
  if args.num_processes < 1:
    parser.error(f'--num_processes must be >= 1; got {args.num_processes}')
  if args.cpu_devices_per_process is not None and args.cpu_devices_per_process < 1:
    parser.error(f'--cpu_devices_per_process must be >= 1; got {args.cpu_devices_per_process}')

  address = f'localhost:{args.port or free_port()}'
  out, lock = sys.stdout, threading.Lock()
  procs, pumps = [], []
  for i in range(args.num_processes):
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=child_env(os.environ, i, args.num_processes, address,
                      args.cpu_devices_per_process))
    procs.append(proc)
    with lock:
      out.write(f'[launcher] process {i} of {args.num_processes}: pid {proc.pid}, '
                f'coordinator {address}\n')
      out.flush()
    pump = threading.Thread(target=_pump, args=(proc.stdout, f'[p{i}] ', out, lock),
                            daemon=True)
    pump.start()
    pumps.append(pump)

  def forward(signum, frame):
    del frame
    for p in procs:
      if p.poll() is None:
        p.send_signal(signum)

  signal.signal(signal.SIGTERM, forward)
  signal.signal(signal.SIGINT, forward)

  status = 0
  while [p.poll() for p in procs].count(None):  # Polls every process (no short-circuit).
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (None, 0)]
    if failed:
      i, code = failed[0]
      status = _status(code)
      with lock:
        out.write(f'[launcher] process {i} exited with status {status}; killing the others, '
                  'which cannot continue without it.\n')
        out.flush()
      for p in procs:
        if p.poll() is None:
          p.kill()
      break
    time.sleep(0.2)
  for p in procs:
    p.wait()
  for pump in pumps:
    pump.join()
  if not status:
    status = next((_status(p.returncode) for p in procs if p.returncode), 0)
  return status


if __name__ == '__main__':
  sys.exit(main())
