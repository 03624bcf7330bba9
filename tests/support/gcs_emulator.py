"""One Cloud Storage emulator for the session (fake-gcs-server, from the test extra).

A pytest plugin (``tests/conftest.py`` registers it), so every test directory can use it.
Each pytest-xdist worker starts its own, lazily: only when a test asks for ``gcs_emulator``
(a start takes a fraction of a second), on a free port with its objects in a temporary
directory, removed at the end. The session's environment then points every storage layer at
it through ``STORAGE_EMULATOR_HOST`` alone (``encoder_jax.storage.client.configure``),
as a user rehearsing a pod run would; tests use a bucket of their own (``bucket``) so they
can share it.
"""

import os
import threading
import uuid

import pytest

from encoder_jax.storage import client as storage_client
from encoder_jax import storage_emulator

# The variables configure_environment derives from STORAGE_EMULATOR_HOST.
_DERIVED = ('TENSORSTORE_GCS_HTTP_URL', 'GOOGLE_AUTH_TOKEN_FOR_TESTING',
            'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'GOOGLE_CLOUD_PROJECT')


@pytest.fixture(scope='session')
def gcs_emulator():
  """The running emulator; the environment names it for this process and its children."""
  saved = {k: os.environ.get(k) for k in (storage_client.EMULATOR_HOST,) + _DERIVED}
  with storage_emulator.Emulator() as emulator:
    os.environ[storage_client.EMULATOR_HOST] = emulator.url
    for key in _DERIVED:
      os.environ.pop(key, None)
    storage_client.configure()
    try:
      yield emulator
    finally:
      for key, value in saved.items():
        if value is None:
          os.environ.pop(key, None)
        else:
          os.environ[key] = value


@pytest.fixture
def bucket(gcs_emulator) -> str:
  """A new, empty bucket on the emulator: ``gs://<name>``."""
  name = f'test-{uuid.uuid4().hex[:12]}'
  gcs_emulator.create_bucket(name)
  return f'gs://{name}'


class FaultyProxy:
  """An HTTP proxy in front of the emulator that answers some requests with 503 Service
  Unavailable: a transient server error, which every storage client must retry.

  Three faults, each counted per client library (the first word of its User-Agent:
  ``python-gcsfs``, ``gcloud-python``, ``tensorstore``):

    every        library -> N: every N-th request of that library fails before it is
                 forwarded; a library not named gets ``every['*']`` (default: none fails).
                 ``injected[library]`` counts them.
    lose_reply   ``(library, method, path) -> bool``: a request it picks is forwarded (the
                 write lands) and then answered 503, as when the reply is lost on the way
                 back; the retry meets a write that already happened. ``lost[library]``.
    down         while True, every request fails before it is forwarded: an outage.
                 ``refused`` counts them.
    deny         ``(library, method, path) -> bool``: a request it picks is answered 403
                 Forbidden, as a missing IAM permission is (the emulator checks none).

  ``forwarded[library]`` counts the requests that reached the emulator.
  """

  def __init__(self, target: str, every: dict[str, int] | None = None, lose_reply=None,
               deny=None):
    import collections  # pylint: disable=g-import-not-at-top
    import http.server  # pylint: disable=g-import-not-at-top
    self.target, self.every, self.lose_reply, self.deny = target, every or {}, lose_reply, deny
    self.forwarded, self.injected = collections.Counter(), collections.Counter()
    self.lost = collections.Counter()
    self.down, self.refused = False, 0
    self._lock = threading.Lock()
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = 'HTTP/1.1'

      def log_message(self, *args):
        del args

      def _handle(self):
        proxy.handle(self)

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

    self._server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self._server.daemon_threads = True
    self._server.handle_error = lambda *args: None  # A client that hung up: nothing to do.
    self.url = f'http://127.0.0.1:{self._server.server_address[1]}'
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
    self._thread.start()

  def _body(self, handler) -> bytes:
    if 'Content-Length' in handler.headers:
      return handler.rfile.read(int(handler.headers['Content-Length']))
    if handler.headers.get('Transfer-Encoding', '').lower() != 'chunked':
      return b''
    chunks = []
    while True:
      size = int(handler.rfile.readline().split(b';')[0], 16)
      chunks.append(handler.rfile.read(size))
      handler.rfile.readline()
      if not size:
        return b''.join(chunks)

  def handle(self, handler) -> None:
    import http.client  # pylint: disable=g-import-not-at-top
    body = self._body(handler)
    library = handler.headers.get('User-Agent', '-').split('/')[0]
    every = self.every.get(library, self.every.get('*', 0))
    with self._lock:
      fail = bool(every) and (self.forwarded[library] + self.injected[library] + 1) % every == 0
      self.injected[library] += fail
      self.forwarded[library] += not fail and not self.down
      self.refused += self.down
      lose = not fail and not self.down and bool(self.lose_reply) and self.lose_reply(
          library, handler.command, handler.path)
      self.lost[library] += lose
    if fail or self.down:
      _reply(handler, 503, [('Content-Type', 'application/json')], _UNAVAILABLE)
      return
    if self.deny and self.deny(library, handler.command, handler.path):
      _reply(handler, 403, [('Content-Type', 'application/json')], _FORBIDDEN)
      return
    host, port = self.target.removeprefix('http://').split(':')
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    skip = ('host', 'connection', 'transfer-encoding', 'content-length', 'expect')
    conn.request(handler.command, handler.path, body=body,
                 headers={k: v for k, v in handler.headers.items() if k.lower() not in skip})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    headers = [(k, v.replace(self.target, self.url)) for k, v in response.getheaders()
               if k.lower() not in ('connection', 'transfer-encoding', 'content-length',
                                    'date', 'server')]
    if lose:  # Landed; the client hears only that it failed.
      _reply(handler, 503, [('Content-Type', 'application/json')], _UNAVAILABLE)
      return
    _reply(handler, response.status, headers, data)

  def close(self) -> None:
    self._server.shutdown()
    self._server.server_close()


_UNAVAILABLE = b'{"error": {"code": 503, "message": "injected by the test proxy"}}'
_FORBIDDEN = (b'{"error": {"code": 403, "message": "account@emulator does not have the permission '
              b'(denied by the test proxy)"}}')


def _reply(handler, status: int, headers, data: bytes) -> None:
  handler.send_response(status)
  for key, value in headers:
    handler.send_header(key, value)
  handler.send_header('Content-Length', str(len(data)))
  handler.end_headers()
  if handler.command != 'HEAD':
    handler.wfile.write(data)


@pytest.fixture
def faulty_proxy(gcs_emulator):
  """``make(every, lose_reply, deny)``: a FaultyProxy in front of the session's emulator."""
  proxies = []

  def make(every: dict[str, int] | None = None, lose_reply=None, deny=None) -> FaultyProxy:
    proxies.append(FaultyProxy(gcs_emulator.url, every, lose_reply, deny))
    return proxies[-1]

  yield make
  for proxy in proxies:
    proxy.close()
