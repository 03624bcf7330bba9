"""Corpus sources named by ``config.data.sources``: local text/JSONL files, tfds, embedded.

Spec grammar (several specs are separated by commas)::

    KIND[:ARGUMENT][;OPTION=VALUE]...[@WEIGHT]

  embedded                            stdlib docstrings (``embedded.py``), already in sentences
  packaged:NAME                       a corpus an installed package ships (``packaged.py``)
  text:GLOB                           google-research/bert layout: one sentence (or line) per
                                      line, a blank line between documents; each file is also
                                      a document boundary. ``gs://`` globs go through gcsfs.
  jsonl:GLOB[;field=text]             one JSON object per line; its ``field`` string is one
                                      document (lines are paragraphs, split into sentences)
  tfds:NAME[:SPLIT][;data_dir=DIR][;field=text][;prepare=true]
                                      a prepared tensorflow-datasets dataset (``wikipedia/
                                      20230601.en``, ``wiki40b/en``, ``c4/en``), read in file
                                      order; ``data_dir`` defaults to config.data.tfds_data_dir.
                                      A ``gs://`` data_dir: the dataset's directory is copied
                                      to a local cache first (:func:`tfds_local_data_dir`).
                                      SPLIT defaults to ``train`` and may be a slice
                                      (``train[:1%]``). Not prepared: refused, naming
                                      ``tfds build``; ``prepare=true`` builds it now
                                      (:class:`TfdsSplit`, fine-tuning's reader too).

Files may be compressed: gzip (``.gz``), bzip2 and xz are read transparently, recognised by
their first bytes whatever the file is called; zstd, zip and other archives stop with the
format named (decompress them first). A compressed file that ends early keeps the lines
read so far and is counted under ``compressed_files_cut_short``. Text must be UTF-8 (a
UTF-8 byte-order mark is dropped); UTF-16/32 files, recognised by their byte-order mark, stop
with the encoding named.

Every kind also takes ``max_documents=N`` (stop after N documents; for quick experiments).
``@WEIGHT`` gives the mixing weight; if one spec has a weight all must (else alpha mixing).

Nothing is dropped silently: every skipped or altered line/document is counted in a
``Report`` under a reason, with a few example locations, and ends up in the manifest.
"""

from __future__ import annotations

import collections
import dataclasses
import glob as glob_lib
import hashlib
import json
import logging
import lzma
import os
import shutil
import time
import zlib
from typing import Iterator

from encoder_jax.core import extras
from encoder_jax.storage import paths as storage
from encoder_jax.data import embedded
from encoder_jax.data import packaged
from encoder_jax.data import prepare_once
from encoder_jax.data import text_files

_KINDS = ('embedded', 'text', 'jsonl', 'tfds', 'packaged')
_OPTIONS = {'embedded': {'max_documents'}, 'text': {'max_documents'},
            'packaged': {'max_documents'},
            'jsonl': {'max_documents', 'field'},
            'tfds': {'max_documents', 'field', 'data_dir', 'prepare'}}
_MAX_EXAMPLES = 5


class Report:
  """Counts of skipped/altered input by reason, with the first few locations of each."""

  def __init__(self):
    self.counts: collections.Counter = collections.Counter()
    self.examples: dict[str, list[str]] = collections.defaultdict(list)

  def add(self, reason: str, where: str = '', n: int = 1):
    self.counts[reason] += n
    if where and len(self.examples[reason]) < _MAX_EXAMPLES:
      self.examples[reason].append(where)

  def merge(self, other: 'Report'):
    for reason, n in other.counts.items():
      self.counts[reason] += n
      room = _MAX_EXAMPLES - len(self.examples[reason])
      self.examples[reason].extend(other.examples.get(reason, [])[:max(room, 0)])

  def to_json(self) -> dict:
    return {r: {'count': int(n), 'examples': list(self.examples.get(r, []))}
            for r, n in sorted(self.counts.items())}


@dataclasses.dataclass(frozen=True)
class RawDocument:
  """A document before tokenization: sentences, or paragraphs still to be split."""
  lines: tuple[str, ...]
  where: str  # File:line or dataset:index, for error messages and the manifest.


@dataclasses.dataclass
class Source:
  """One parsed spec. ``documents()`` streams ``RawDocument``s with bounded memory."""
  spec: str
  kind: str
  argument: str
  options: dict
  weight: float | None
  tfds_data_dir: str
  max_line_bytes: int

  @property
  def lines_are_sentences(self) -> bool:
    """True: each line is one sentence (bert layout, embedded); else lines are paragraphs."""
    if self.kind == 'packaged':
      return packaged.get(self.argument, 'config.data.sources').lines_are_sentences
    return self.kind in ('embedded', 'text')

  def fingerprint(self) -> str:
    """Extra identity for the config hash (the embedded corpus depends on Python, a
    packaged one on its package's version)."""
    if self.kind == 'packaged':
      return packaged.fingerprint(self.argument)
    return embedded.fingerprint() if self.kind == 'embedded' else ''

  def check_exists(self) -> None:
    """Raises a clear error now if the files or the tfds dataset are missing."""
    if self.kind in ('text', 'jsonl'):
      self.paths()
    elif self.kind == 'tfds':
      self._tfds_builder()
    elif self.kind == 'packaged':
      packaged.path(self.argument, f'config.data.sources: {self.spec!r}')

  def documents(self, report: Report) -> Iterator[RawDocument]:
    limit = int(self.options.get('max_documents', 0)) or None
    stream = {'embedded': self._embedded, 'text': self._text, 'jsonl': self._jsonl,
              'tfds': self._tfds_documents, 'packaged': self._packaged}[self.kind](report)
    for i, doc in enumerate(stream):
      if limit is not None and i >= limit:
        break
      yield doc

  def size_hint_bytes(self) -> int:
    """Approximate raw size, used for alpha-sampling the tokenizer's training sentences."""
    if self.kind == 'embedded':
      return sum(len(s.encode()) + 1 for d in embedded.embedded_corpus() for s in d)
    if self.kind in ('text', 'jsonl', 'packaged'):
      return sum(text_files.file_size(p) for p in self.paths())
    builder = self._tfds_builder()
    try:
      info = builder.info.splits[self._tfds_split()]
      return int(info.num_bytes) or int(info.num_examples) * 1000
    except Exception:  # pylint: disable=broad-except  (sliced splits have no byte counts)
      return 1

  # ---- files ----

  def paths(self) -> list[str]:
    pattern = self.argument
    if self.kind == 'packaged':
      return [packaged.path(pattern, f'config.data.sources: {self.spec!r}')]
    if not pattern:
      raise ValueError(f'config.data.sources: {self.spec!r} needs a file glob after '
                       f"'{self.kind}:'")
    if pattern.startswith('gs://'):
      _import_optional('gcsfs', self.spec, 'gcsfs')  # The gcs extra, or one line naming it.
      paths = storage.glob(pattern)  # gcsfs (encoder_jax.storage.paths says why).
    else:
      paths = sorted(p for p in glob_lib.glob(os.path.expanduser(pattern), recursive=True)
                     if os.path.isfile(p))
    if not paths:
      where = os.path.expanduser(pattern)
      hint = (f'; {where} is a directory: give a glob of its files, e.g. '
              f"'{self.kind}:{os.path.join(where, '*')}'" if os.path.isdir(where) else '')
      raise FileNotFoundError(
          f'config.data.sources: {self.spec!r}: no file matches {pattern!r} '
          f'(working directory {os.getcwd()!r}){hint}.')
    return paths

  def _lines(self, path: str, report: Report) -> Iterator[tuple[int, str | None]]:
    """(line number, decoded line without newline) with bounded memory; None = skipped."""
    cap = self.max_line_bytes
    with text_files.open_binary(path, f'config.data.sources: {self.spec!r}') as f:
      empty = True
      number = 0
      while True:
        try:
          raw = f.readline(cap + 1)
        except (EOFError, OSError, zlib.error, lzma.LZMAError) as e:
          report.add('compressed_files_cut_short', f'{path}: after line {number} ({e})')
          break
        if not raw:
          break
        empty = False
        number += 1
        if number == 1 and raw.startswith(b'\xef\xbb\xbf'):  # A UTF-8 byte-order mark: no text.
          raw = raw[3:]
        if len(raw) > cap and not raw.endswith(b'\n'):
          while True:  # Drain the rest of the huge line in bounded pieces.
            rest = f.readline(cap + 1)
            if not rest or rest.endswith(b'\n'):
              break
          if self.kind == 'jsonl':
            report.add('lines_too_long_skipped', f'{path}:{number}')
            yield number, None
            continue
          report.add('lines_truncated', f'{path}:{number}')
          raw = raw[:cap]
          raw = raw[:text_files.utf8_safe_end(raw)]
        try:
          yield number, raw.decode('utf-8').rstrip('\r\n')
        except UnicodeDecodeError as e:
          report.add('lines_undecodable_skipped', f'{path}:{number} ({e.reason} at byte '
                     f'{e.start})')
          yield number, None
      if empty:
        report.add('files_empty', path)

  def _text(self, report: Report) -> Iterator[RawDocument]:
    for path in self.paths():
      lines: list[str] = []
      start = 1
      for number, line in self._lines(path, report):
        if line is None:
          continue
        line = line.strip()
        if line:
          if not lines:
            start = number
          lines.append(line)
        elif lines:
          yield RawDocument(tuple(lines), f'{path}:{start}')
          lines = []
      if lines:
        yield RawDocument(tuple(lines), f'{path}:{start}')

  def _jsonl(self, report: Report) -> Iterator[RawDocument]:
    field = self.options.get('field', 'text')
    for path in self.paths():
      for number, line in self._lines(path, report):
        if line is None or not line.strip():
          continue
        where = f'{path}:{number}'
        try:
          obj = json.loads(line)
        except json.JSONDecodeError as e:
          report.add('jsonl_bad_json_skipped', f'{where} ({e.msg})')
          continue
        text = obj.get(field) if isinstance(obj, dict) else None
        if not isinstance(text, str):
          report.add('jsonl_missing_field_skipped', f'{where} (no string field {field!r})')
          continue
        yield RawDocument((text,), where)

  # ---- tfds ----

  def _tfds_name(self) -> str:
    return tfds_name_split(self.argument)[0]

  def _tfds_split(self) -> str:
    return tfds_name_split(self.argument)[1]

  def _tfds(self) -> 'TfdsSplit':
    """The spec's dataset and split, read by the one tfds reader (:class:`TfdsSplit`)."""
    if not self._tfds_name():
      raise ValueError(f'config.data.sources: {self.spec!r} needs a dataset name after '
                       "'tfds:' (e.g. 'tfds:wikipedia/20230601.en:train')")
    origin = 'the spec' if 'data_dir' in self.options else 'config.data.tfds_data_dir'
    return TfdsSplit(self._tfds_name(), self._tfds_split(),
                     self.options.get('data_dir') or self.tfds_data_dir,
                     _true(self.options.get('prepare', 'false')),
                     f'config.data.sources: {self.spec!r}', origin)

  def _tfds_builder(self):
    return self._tfds().builder()

  def _tfds_documents(self, report: Report) -> Iterator[RawDocument]:
    split = self._tfds()
    builder, field = split.builder(), self.options.get('field', 'text')
    features = getattr(builder.info.features, 'keys', lambda: [])()
    if field not in features:
      raise ValueError(f'config.data.sources: {self.spec!r}: the dataset has no feature '
                       f'{field!r}; features: {sorted(features)}. Set ;field=NAME.')
    for i, example in enumerate(split.examples(builder)):
      where = f'{split.name}:{split.split}:{i}'
      value = example[field]
      try:
        text = value.decode('utf-8') if isinstance(value, bytes) else str(value)
      except UnicodeDecodeError:
        report.add('documents_undecodable_skipped', where)
        continue
      if '_START_ARTICLE_' in text or '_START_PARAGRAPH_' in text:
        text = _wiki40b_text(text)
      yield RawDocument((text,), where)

  def _packaged(self, report: Report) -> Iterator[RawDocument]:
    del report  # Read whole, line by line, by its own reader.
    for lines, where in packaged.documents(self.argument, f'config.data.sources: {self.spec!r}'):
      yield RawDocument(lines, where)

  def _embedded(self, report: Report) -> Iterator[RawDocument]:
    del report  # The embedded corpus is clean by construction.
    for i, doc in enumerate(embedded.embedded_corpus()):
      yield RawDocument(tuple(doc), f'embedded:{i}')


def _import_optional(module: str, spec: str, package: str):
  """``module`` (TensorFlow or tensorflow-datasets), imported only when a source needs it:
  the package imports and trains on local files and the embedded corpus without either."""
  if spec.startswith('tfds'):
    return extras.require(module, extra='tfds', what=f'config.data.sources: {spec!r} is a tfds: '
                          f'source, which needs {package}')
  return extras.require(module, extra='gcs', what=f'config.data.sources: {spec!r} is a gs:// '
                        f'path, read through {package}')


def text_lines(path: str, what: str) -> Iterator[str]:
  """The lines of a file read whole (fine-tuning's TSV, JSONL and SQuAD JSON), each with
  its line end, opened as pretraining's sources open theirs: local or ``gs://``, plain or
  gzip/bzip2/xz, UTF-8 (a byte-order mark dropped). A missing file or a line that is not
  UTF-8 is an error naming ``what`` (the setting that named the file) and the place."""
  if path.startswith('gs://'):
    extras.require('gcsfs', extra='gcs', what=f'{what} is a gs:// path, read through gcsfs')
    found = storage.exists(path)
  else:
    found = os.path.isfile(path)
  if not found:
    raise FileNotFoundError(f'{what}: {path} does not exist')
  with text_files.open_binary(path, what) as f:
    number = 0
    while True:
      raw = f.readline()
      if not raw:
        return
      number += 1
      if number == 1 and raw.startswith(b'\xef\xbb\xbf'):
        raw = raw[3:]
      try:
        yield raw.decode('utf-8')
      except UnicodeDecodeError as e:
        raise ValueError(f'{what}: {path}:{number} is not UTF-8 ({e.reason} at byte '
                         f'{e.start})') from None


def _wiki40b_text(text: str) -> str:
  """wiki40b markup -> paragraphs: drops titles and section headings, keeps paragraphs."""
  out = []
  lines = text.split('\n')
  for i, line in enumerate(lines):
    if i > 0 and lines[i - 1] == '_START_PARAGRAPH_':
      out.extend(line.split('_NEWLINE_'))
  return '\n'.join(out)


def split_spec(spec: str, kinds, where: str, expected: str = '',
               shown: str | None = None) -> tuple[str, str]:
  """``'KIND:ARGUMENT'`` -> (kind, argument): the one parser of a source spec's kind, for
  pretraining's ``config.data.sources`` and fine-tuning's data splits alike. A kind not in
  ``kinds`` is an error naming ``where``, the spec (``shown``, default ``spec``) and what
  was ``expected`` (default: the kinds)."""
  kind, _, argument = spec.partition(':')
  kind = kind.strip()
  if kind not in kinds:
    raise ValueError(f'{where}: {shown or repr(spec)}: unknown source kind {kind!r}; expected '
                     + (expected or f'one of {list(kinds)}'))
  return kind, argument.strip()


def tfds_local_data_dir(data_dir: str, name: str, what: str = '') -> str:
  """A local tfds data_dir holding a copy of dataset ``name``'s directory (every version
  there: ``NAME[/CONFIG]/VERSION/``) under the ``gs://`` ``data_dir``.

  TensorFlow's own Cloud Storage file system, which tfds would use, cannot be pointed at
  another endpoint; this copy goes through ``storage`` (google-cloud-storage), as every
  other ``gs://`` read does. Only the process that prepares the data reads its sources, so
  a pod copies the dataset once (with a ``gs://`` prepared_dir) or once per host. The copy
  is kept in ``prepare_once.cache_root()``/tfds, shared by the processes of a host (under a
  local lock), and replaced when the bucket's objects change (their generations).
  """
  url = f'{data_dir.rstrip("/")}/{name.strip("/")}'
  objects = storage.generations(url)
  if not objects:
    raise FileNotFoundError(f'{what or data_dir}: {url} does not exist (no objects under '
                            'it); copy the prepared dataset there, see docs/configs_and_data.md.')
  root = os.path.join(prepare_once.cache_root(), 'tfds',
                      hashlib.sha256(data_dir.rstrip('/').encode()).hexdigest()[:16])
  local = os.path.join(root, name.strip('/'))
  listing = os.path.join(root, f'{name.strip("/").replace("/", "__")}.objects.json')
  wanted = json.dumps(objects, sort_keys=True)
  if os.path.exists(listing):
    with open(listing, encoding='utf-8') as f:
      if f.read() != wanted:  # Written again on the bucket since it was copied.
        os.remove(listing)
        shutil.rmtree(local, ignore_errors=True)

  def download():
    start = time.monotonic()
    shutil.rmtree(local, ignore_errors=True)  # What a killed copy left.
    size = storage.download_tree(url, local, last='')
    with open(listing + '.tmp', 'w', encoding='utf-8') as f:
      f.write(wanted)
    os.replace(listing + '.tmp', listing)
    logging.info('Copied %s to %s: %.1f MB in %.1f s.', url, local, size / 1e6,
                 time.monotonic() - start)

  prepare_once.prepare_once(local, listing, download)
  return root


def tfds_name_split(argument: str, default_split: str | None = 'train') -> tuple[str, str]:
  """The ``NAME:SPLIT`` of a ``tfds:`` spec -> (name, split); a missing split is
  ``default_split`` (None: required, an error here, as is a missing name)."""
  name, _, split = argument.partition(':')
  split = split or default_split
  if default_split is None and not (name and split):
    raise ValueError(f"tfds:{argument}: expected 'tfds:NAME:SPLIT', e.g. 'tfds:glue/sst2:train'")
  return name, split


def _true(value: str, what: str = '') -> bool:
  """A spec option's true/false value."""
  if value.strip().lower() not in ('true', 'false', '1', '0'):
    raise ValueError(f'{what}: expected true or false, got {value!r}')
  return value.strip().lower() in ('true', '1')


def tfds_module(what: str):
  """tensorflow-datasets, or a one-line error naming the extra that brings it."""
  return extras.require('tensorflow_datasets', extra='tfds',
                        what=f'{what} is a tfds: source, which needs tensorflow-datasets')


@dataclasses.dataclass(frozen=True)
class TfdsSplit:
  """A split of a tensorflow-datasets dataset: the one tfds reader, for pretraining's
  ``config.data.sources`` and fine-tuning's splits alike.

  One rule for a dataset that is not prepared in its data_dir: it is refused, naming the
  command that prepares it (``tfds build``), unless the spec asks for it to be built now
  (``;prepare=true``: ``download_and_prepare``, for a dataset tfds can build on this
  machine, e.g. one generated from local files). One rule for a ``gs://`` data_dir: the
  dataset's directory is copied to a local cache through ``storage``
  (:func:`tfds_local_data_dir`), which reaches the Cloud Storage emulator too.
  """
  name: str
  split: str
  data_dir: str = ''  # '' = tfds's default (~/tensorflow_datasets).
  prepare: bool = False  # Build it now when it is not prepared (not on gs://).
  what: str = ''  # The setting that named it, the start of every error message.
  origin: str = ''  # Where data_dir was set, for the messages.

  def _where(self) -> str:
    if not self.data_dir:
      return 'the default data_dir'
    return f'data_dir {self.data_dir!r}' + (f' (from {self.origin})' if self.origin else '')

  def builder(self):
    """The dataset's builder, prepared (see the class docstring for the rules)."""
    tfds = tfds_module(self.what)
    data_dir, where = self.data_dir or None, self._where()
    if data_dir and data_dir.startswith('gs://'):
      if self.prepare:
        raise ValueError(f'{self.what}: prepare=true builds a dataset in a local data_dir; '
                         f'{where} is a bucket: build it locally and copy it there, see '
                         'docs/configs_and_data.md.')
      data_dir = tfds_local_data_dir(data_dir, self.name, f'{self.what}: {where}')
    elif data_dir and not self.prepare:
      tf = extras.require('tensorflow', extra='tfds',
                          what=f'{self.what} is a tfds: source, which needs tensorflow')
      if not tf.io.gfile.isdir(data_dir):
        raise FileNotFoundError(f'{self.what}: {where} does not exist. {self._hint()}')
    try:
      builder = tfds.builder(self.name, data_dir=data_dir)
    except Exception as e:  # pylint: disable=broad-except  (tfds raises several kinds)
      raise FileNotFoundError(f'{self.what}: tensorflow-datasets cannot find dataset '
                              f'{self.name!r} in {where}: {e}') from e
    if not builder.is_prepared():
      if not self.prepare:
        raise FileNotFoundError(f'{self.what}: dataset {self.name!r} is not prepared in '
                                f'{where} (looked in {builder.data_dir!r}). {self._hint()}')
      builder.download_and_prepare()
    return builder

  def _hint(self) -> str:
    """The command that prepares the dataset, for the errors."""
    target = f' --data_dir={self.data_dir}' if self.data_dir else ''
    return (f'Prepare it first: tfds build {self.name}{target} (a dataset defined in your '
            'own module: add --imports=MODULE), or add ;prepare=true to the spec to build '
            'it now; see docs/configs_and_data.md.')

  def examples(self, builder=None) -> Iterator[dict]:
    """The split's examples as dicts of numpy values, in file order (``builder``: this
    split's :meth:`builder`, when the caller has it already)."""
    try:
      ds = (builder or self.builder()).as_dataset(split=self.split, shuffle_files=False)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f'{self.what}: cannot read split {self.split!r}: {e}') from e
    return ds.as_numpy_iterator()

  def label_names(self, keys, builder=None) -> dict[str, list[str]]:
    """The class names the dataset declares for the features ``keys`` (those that have)."""
    features, names = (builder or self.builder()).info.features, {}
    for key in keys:
      feature = features[key] if key in features else None
      feature = getattr(feature, 'feature', feature)  # Sequence(ClassLabel) -> ClassLabel.
      if hasattr(feature, 'names'):
        names[key] = list(feature.names)
    return names


def tfds_split(spec: str, data_dir: str = '', what: str = '') -> TfdsSplit:
  """A fine-tuning split's ``tfds:NAME:SPLIT[;data_dir=DIR][;prepare=true]`` (the split is
  required); ``data_dir`` where the spec sets none (config.data.tfds_data_dir)."""
  what = what or f'config.data: {spec!r}'
  head, *items = spec.split(';')
  options = parse_options(items, ('data_dir', 'prepare'), what)
  name, split = tfds_name_split(head.partition(':')[2], None)
  origin = 'the spec' if 'data_dir' in options else 'config.data.tfds_data_dir'
  return TfdsSplit(name, split, options.get('data_dir') or data_dir,
                   _true(options.get('prepare', 'false'), f'{what}: prepare'), what, origin)


def parse_options(items, valid, what: str) -> dict[str, str]:
  """A spec's ``;KEY=VALUE`` options (the items after its first ``;``); a key not in
  ``valid`` or an item without ``=`` is an error naming ``what`` and the valid keys."""
  options = {}
  for item in items:
    key, sep, value = item.partition('=')
    if not sep or key.strip() not in valid:
      raise ValueError(f'{what}: bad option {item!r}; valid: {sorted(valid)} as key=value')
    options[key.strip()] = value.strip()
  return options


def parse_sources(data_config) -> list[Source]:
  """Parses ``config.data.sources`` (see the module docstring); errors name the spec."""
  specs = [s.strip() for s in str(data_config.sources).split(',') if s.strip()]
  if not specs:
    raise ValueError("config.data.sources is empty; e.g. 'embedded' or 'text:/corpus/*.txt'")
  out = []
  for spec in specs:
    body, weight = spec, None
    if '@' in spec:
      body, _, w = spec.rpartition('@')
      try:
        weight = float(w)
      except ValueError:
        raise ValueError(f'config.data.sources: {spec!r}: the text after the last @ must be a '
                         f'mixing weight (a number); got {w!r}') from None
      if weight <= 0:
        raise ValueError(f'config.data.sources: {spec!r}: the weight must be > 0')
    head, *option_items = body.split(';')
    kind, argument = split_spec(head, _KINDS, 'config.data.sources', shown=repr(spec))
    options = parse_options(option_items, _OPTIONS[kind],
                            f'config.data.sources: {spec!r} ({kind!r})')
    if 'max_documents' in options and not options['max_documents'].isdigit():
      raise ValueError(f'config.data.sources: {spec!r}: max_documents must be an integer')
    if 'prepare' in options:
      _true(options['prepare'], f'config.data.sources: {spec!r}: prepare')
    if kind == 'embedded' and argument:
      raise ValueError(f"config.data.sources: {spec!r}: 'embedded' takes no argument")
    if kind == 'packaged':
      packaged.get(argument.strip(), f'config.data.sources: {spec!r}')
    out.append(Source(spec=spec, kind=kind, argument=argument.strip(), options=options,
                      weight=weight, tfds_data_dir=str(data_config.tfds_data_dir),
                      max_line_bytes=int(data_config.max_line_bytes)))
  weighted = [s.weight is not None for s in out]
  if any(weighted) and not all(weighted):
    raise ValueError('config.data.sources: either every source has an @weight or none has '
                     f'(then config.data.mixing_alpha is used); got {specs}')
  return out
