"""Reading a corpus file's bytes: local or ``gs://``, plain or gzip/bzip2/xz (recognised by
their first bytes whatever the file is called), with clear errors for archives and for text
in another Unicode encoding than UTF-8. ``sources`` reads every text file through it.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os

from encoder_jax.storage import paths as storage


# Compressed formats by their first bytes: read transparently, or named in the error.
_DECOMPRESSORS = (
    (lambda h: h[:2] == b'\x1f\x8b', lambda f: gzip.GzipFile(fileobj=f, mode='rb')),
    # bzip2: the magic, then the first block's header.
    (lambda h: h[:3] == b'BZh' and h[4:10] == b'1AY&SY', lambda f: bz2.BZ2File(f, 'rb')),
    (lambda h: h[:6] == b'\xfd7zXZ\x00', lambda f: lzma.LZMAFile(f, 'rb')),
)
_UNSUPPORTED = {b'\x28\xb5\x2f\xfd': 'zstd', b'PK\x03\x04': 'zip', b'7z\xbc\xaf\x27\x1c': '7z',
                b'\x04\x22\x4d\x18': 'lz4'}
# Text in another Unicode encoding, by its byte-order mark (UTF-32 before UTF-16: a prefix).
_OTHER_ENCODINGS = ((b'\xff\xfe\x00\x00', 'UTF-32LE'), (b'\x00\x00\xfe\xff', 'UTF-32BE'),
                    (b'\xff\xfe', 'UTF-16LE'), (b'\xfe\xff', 'UTF-16BE'))


class _Decompressed:
  """A decompressing reader that also closes the file under it (GzipFile(fileobj) does not)."""

  def __init__(self, reader, raw):
    self._reader, self._raw = reader, raw

  def readline(self, size: int = -1) -> bytes:
    return self._reader.readline(size)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    try:
      self._reader.close()
    finally:
      self._raw.close()


def open_raw(path: str):
  if path.startswith('gs://'):
    return storage.open_read(path)
  return open(path, 'rb')


def open_binary(path: str, what: str = ''):
  """A binary reader of ``path``'s text, decompressed if it is gzip, bzip2 or xz; errors
  start with ``what`` (the setting that named the file)."""
  raw = open_raw(path)
  try:
    head = raw.read(10)
    raw.seek(0)
  except Exception:
    raw.close()
    raise
  for matches, opener in _DECOMPRESSORS:
    if matches(head):
      return _Decompressed(opener(raw), raw)
  for magic, name in _UNSUPPORTED.items():
    if head.startswith(magic):
      raw.close()
      raise ValueError(f'{what}: {path} is a {name} file; expected text '
                       'or JSONL, plain or gzip/bzip2/xz-compressed. Decompress it first.')
  for bom, name in _OTHER_ENCODINGS:
    if head.startswith(bom):  # Would read as UTF-8 with a NUL in every other byte.
      raw.close()
      raise ValueError(f'{what}: {path} is {name} text (it starts with '
                       f'its byte-order mark); expected UTF-8. Convert it first, e.g. iconv -f '
                       f'{name} -t UTF-8.')
  return raw


def file_size(path: str) -> int:
  """Bytes of text: a local gzip file's is in its last 4 bytes (mod 4 GiB); else the size."""
  if path.startswith('gs://'):
    return storage.size(path)
  size = os.path.getsize(path)
  if size >= 18:
    with open(path, 'rb') as f:
      if f.read(2) == b'\x1f\x8b':
        f.seek(-4, os.SEEK_END)
        text = int.from_bytes(f.read(4), 'little')
        return text if text >= size else size * 4  # Wrapped past 4 GiB: a rough guess.
  return size


def utf8_safe_end(raw: bytes) -> int:
  """Length of ``raw`` without a trailing, cut-off multi-byte UTF-8 character."""
  end = len(raw)
  i = end - 1
  while i >= 0 and end - i <= 4 and (raw[i] & 0xC0) == 0x80:
    i -= 1
  if i >= 0 and raw[i] >= 0xC0:
    need = 2 if raw[i] < 0xE0 else 3 if raw[i] < 0xF0 else 4
    if end - i < need:
      return i
  return end
