"""Sources: the embedded corpus, text/JSONL files, the sentence splitter and bad input."""

import glob
import json
import os

import numpy as np
import pytest

from encoder_jax import data as data_lib
from encoder_jax.data import sentences
from encoder_jax.data import sources
from encoder_jax.data import text_files

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def test_embedded_corpus_is_real_deterministic_text(corpus_docs):
  assert 1500 < len(corpus_docs) < 4000
  size = sum(len(s.encode()) for d in corpus_docs for s in d)
  assert 1_000_000 < size < 3_000_000
  assert all(d and all(s.strip() for s in d) for d in corpus_docs)
  assert data_lib.embedded_corpus() == corpus_docs  # Same order every call.
  words = ' '.join(corpus_docs[0]).lower().split()
  assert sum(w in ('the', 'a', 'of', 'to', 'is') for w in words) > 0.03 * len(words)
  assert not any(s.startswith('>>>') for d in corpus_docs for s in d)


def test_embedded_corpus_cache_file_equals_the_extraction(tmp_path, monkeypatch, corpus_docs):
  from encoder_jax.data import embedded  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('ENCODER_JAX_CACHE_DIR', str(tmp_path))
  root = embedded.stdlib_dir()
  files = embedded._source_files(root)
  path = embedded._cache_path(root, files)
  assert os.path.dirname(path) == str(tmp_path)
  embedded._corpus.cache_clear()
  try:
    assert embedded.embedded_corpus() == corpus_docs and os.path.exists(path)  # Written.
    extracted = embedded._corpus()
    calls = []

    def extract(*args):  # The extraction above again, without its seconds of parsing.
      calls.append(args)
      return extracted

    monkeypatch.setattr(embedded, '_extract', extract)
    embedded._corpus.cache_clear()
    assert embedded.embedded_corpus() == corpus_docs and not calls  # Read back, not parsed.
    with open(path, 'w', encoding='utf-8') as f:
      f.write('[["truncat')  # Damaged: extracted again, and rewritten whole.
    embedded._corpus.cache_clear()
    assert embedded.embedded_corpus() == corpus_docs and calls == [(root, files)]
    with open(path, encoding='utf-8') as f:
      assert len(json.load(f)) == len(corpus_docs)
  finally:
    embedded._corpus.cache_clear()


def test_sentence_splitter():
  text = ('Dr. Smith arrived at 5 p.m. on Monday. He said "Hello!" Then he left, e.g. to '
          'the U.S. office. Version 3.11 was out? Yes.\nNew paragraph here')
  got, cuts = sentences.split_text(text, 5000)
  assert got == ['Dr. Smith arrived at 5 p.m. on Monday.', 'He said "Hello!"',
                 'Then he left, e.g. to the U.S. office.', 'Version 3.11 was out?', 'Yes.',
                 'New paragraph here']
  assert cuts == 0
  long = ' '.join(['word'] * 400)
  got, cuts = sentences.split_paragraph(long, 100)
  assert all(len(s) <= 100 for s in got) and ' '.join(got) == long and cuts == len(got) - 1
  assert sentences.split_paragraph('这是第一句。这是第二句！好', 100)[0] == [
      '这是第一句。', '这是第二句！', '好']


def test_parse_specs_and_errors(make_config):
  c = make_config()
  c.data.sources = 'text:/a/*.txt@2, jsonl:/b.jsonl;field=body@1'
  a, b = sources.parse_sources(c.data)
  assert (a.kind, a.argument, a.weight) == ('text', '/a/*.txt', 2.0)
  assert (b.kind, b.options, b.weight) == ('jsonl', {'field': 'body'}, 1.0)
  c.data.sources = 'tfds:wikipedia/20230601.en:train[:1%]'
  (t,) = sources.parse_sources(c.data)
  assert (t._tfds_name(), t._tfds_split()) == ('wikipedia/20230601.en', 'train[:1%]')
  for bad, msg in [('csv:/x', 'unknown source kind'), ('text:/x;colour=red', 'bad option'),
                   ('text:/x@heavy', 'mixing weight'), ('text:/x@1,text:/y', 'every source'),
                   ('', 'is empty')]:
    c.data.sources = bad
    with pytest.raises(ValueError, match=msg):
      sources.parse_sources(c.data)


def test_text_and_jsonl_sources_read_real_documents(tmp_path, corpus_docs, write_docs,
                                                    make_config):
  docs = corpus_docs[:5]
  write_docs(tmp_path / 'a.txt', docs[:3])
  write_docs(tmp_path / 'b.txt', docs[3:])
  with open(tmp_path / 'c.jsonl', 'w') as f:
    for d in docs:
      f.write(json.dumps({'text': ' '.join(d), 'id': 1}) + '\n')
  c = make_config()
  c.data.sources = f'text:{tmp_path}/*.txt,jsonl:{tmp_path}/c.jsonl'
  text_src, jsonl_src = sources.parse_sources(c.data)
  report = sources.Report()
  got = [list(d.lines) for d in text_src.documents(report)]
  assert got == [list(d) for d in docs] and not report.counts
  got = list(jsonl_src.documents(report))
  assert len(got) == 5 and not report.counts
  split, _ = sentences.document_sentences(got[0].lines, False, 5000)
  assert len(split) > 3 and ' '.join(split) == ' '.join(docs[0])  # Re-split, nothing lost.


def _prepare_bad(tmp_path, make_config, sp_model_path, spec, **data):
  c = make_config(str(tmp_path / 'prepared'), sources=spec, held_out_fraction=0.0, **data)
  c.tokenizer.path = sp_model_path  # Skip training: the errors are about the corpus.
  return c


def test_bad_input_is_counted_never_silent(tmp_path, corpus_docs, write_docs, make_config,
                                           sp_model_path, capsys):
  write_docs(tmp_path / 'good.txt', corpus_docs[:20])
  open(tmp_path / 'empty.txt', 'w').close()
  with open(tmp_path / 'bad.txt', 'wb') as f:
    f.write('A fine first sentence.\n'.encode())
    f.write(b'Broken \xff\xfe bytes here.\n')
    f.write(('x' * 3000 + '\n').encode())
    f.write('A last sentence.\n\n\n'.encode())
  with open(tmp_path / 'docs.jsonl', 'w') as f:
    f.write(json.dumps({'text': ' '.join(corpus_docs[30])}) + '\n')
    f.write('{not json\n')
    f.write(json.dumps({'title': 'no text field'}) + '\n')
    f.write(json.dumps({'text': '   '}) + '\n')
  spec = f'text:{tmp_path}/*.txt,jsonl:{tmp_path}/docs.jsonl'
  c = _prepare_bad(tmp_path, make_config, sp_model_path, spec, max_line_bytes=1000)
  prepared = data_lib.load_or_prepare(c)
  skipped = prepared.manifest['skipped']
  assert skipped['files_empty']['count'] == 1
  assert skipped['files_empty']['examples'] == [str(tmp_path / 'empty.txt')]
  assert skipped['lines_undecodable_skipped']['count'] == 1
  assert 'bad.txt:2' in skipped['lines_undecodable_skipped']['examples'][0]
  assert skipped['lines_truncated']['count'] == 1
  assert skipped['jsonl_bad_json_skipped']['count'] == 1
  assert skipped['jsonl_missing_field_skipped']['count'] == 1
  assert skipped['documents_empty_skipped']['count'] == 1
  assert 'skipped or altered input' in capsys.readouterr().out  # The printed summary.
  train = prepared.manifest['splits']['train']
  assert train['documents'] == 20 + 1 + 1  # good.txt, bad.txt, one JSONL document.
  tokens = prepared.split('train').num_tokens()
  assert tokens == train['tokens'] == prepared.unigram_counts.sum()


def test_missing_and_empty_inputs_are_clear_errors(tmp_path, make_config, sp_model_path):
  c = _prepare_bad(tmp_path, make_config, sp_model_path, f'text:{tmp_path}/nothing*.txt')
  with pytest.raises(FileNotFoundError, match=r'nothing\*\.txt.*no file matches'):
    data_lib.load_or_prepare(c)
  c = _prepare_bad(tmp_path, make_config, sp_model_path, f'text:{tmp_path}')
  with pytest.raises(FileNotFoundError, match=r'is a directory: give a glob of its files'):
    data_lib.load_or_prepare(c)
  open(tmp_path / 'empty.txt', 'w').close()
  with open(tmp_path / 'blank.txt', 'w') as f:
    f.write('\n\n  \n')
  c = _prepare_bad(tmp_path, make_config, sp_model_path, f'text:{tmp_path}/*.txt')
  with pytest.raises(ValueError, match='corpus is empty'):
    data_lib.load_or_prepare(c)
  assert not os.path.exists(c.data.prepared_dir)
  assert not glob.glob(c.data.prepared_dir + '.partial*')


def test_huge_line_memory_is_bounded(tmp_path):
  """A 20 MB line without newline is read in max_line_bytes pieces, not at once."""
  path = tmp_path / 'huge.txt'
  with open(path, 'wb') as f:
    f.write(b'Short line.\n')
    f.write(b'ab ' * 7_000_000)
    f.write('\nTail line with \u00e9.\n'.encode())
  src = sources.Source(spec='text:x', kind='text', argument=str(path), options={},
                       weight=None, tfds_data_dir='', max_line_bytes=1001)
  report = sources.Report()
  (doc,) = list(src.documents(report))
  assert doc.lines[0] == 'Short line.' and doc.lines[2] == 'Tail line with \u00e9.'
  assert len(doc.lines[1]) <= 1001 and report.counts['lines_truncated'] == 1
  assert text_files.utf8_safe_end('é'.encode()[:1]) == 0
  assert np.all([text_files.utf8_safe_end(b'abc') == 3])


def test_compressed_text_and_jsonl_read_like_plain_files(tmp_path, corpus_docs, write_docs,
                                                         make_config):
  """gzip (by content, whatever the name), bzip2 and xz; other formats are named."""
  import bz2
  import gzip
  import lzma
  docs = corpus_docs[:6]
  plain = write_docs(tmp_path / 'plain.txt', docs)
  data = open(plain, 'rb').read()
  (tmp_path / 'a.txt.gz').write_bytes(gzip.compress(data))
  (tmp_path / 'b.txt').write_bytes(gzip.compress(data))  # No .gz suffix: found by content.
  (tmp_path / 'c.txt.bz2').write_bytes(bz2.compress(data))
  (tmp_path / 'd.txt.xz').write_bytes(lzma.compress(data))
  jsonl = ''.join(json.dumps({'text': ' '.join(d)}) + '\n' for d in docs).encode()
  (tmp_path / 'e.jsonl.gz').write_bytes(gzip.compress(jsonl))
  c = make_config()
  expected = [list(d) for d in docs]
  for name in ('a.txt.gz', 'b.txt', 'c.txt.bz2', 'd.txt.xz'):
    c.data.sources = f'text:{tmp_path}/{name}'
    (src,) = sources.parse_sources(c.data)
    report = sources.Report()
    assert [list(d.lines) for d in src.documents(report)] == expected, name
    assert not report.counts, name
  c.data.sources = f'jsonl:{tmp_path}/e.jsonl.gz'
  (src,) = sources.parse_sources(c.data)
  report = sources.Report()
  assert [d.lines for d in src.documents(report)] == [(' '.join(d),) for d in docs]
  assert not report.counts
  # The gzip trailer gives the text size for tokenizer-sample weighting.
  assert text_files.file_size(str(tmp_path / 'a.txt.gz')) == len(data)

  # Cut short (a copy interrupted): the lines before the cut are kept, and it is counted.
  (tmp_path / 'cut.txt.gz').write_bytes(gzip.compress(data)[:len(gzip.compress(data)) // 2])
  c.data.sources = f'text:{tmp_path}/cut.txt.gz'
  (src,) = sources.parse_sources(c.data)
  report = sources.Report()
  got = [line for d in src.documents(report) for line in d.lines]
  assert 0 < len(got) < sum(len(d) for d in docs) and got[0] == docs[0][0]
  assert report.counts['compressed_files_cut_short'] == 1
  assert 'cut.txt.gz: after line' in report.examples['compressed_files_cut_short'][0]

  # Formats that are not read are named, with the spec and the file.
  (tmp_path / 'f.txt.zst').write_bytes(b'\x28\xb5\x2f\xfd' + b'\x00' * 20)
  c.data.sources = f'text:{tmp_path}/f.txt.zst'
  (src,) = sources.parse_sources(c.data)
  with pytest.raises(ValueError, match=r"config.data.sources: 'text:.*f.txt.zst': .*f.txt.zst "
                                       r'is a zstd file; expected text'):
    list(src.documents(sources.Report()))


def test_utf16_is_named_and_a_utf8_byte_order_mark_is_dropped(tmp_path, corpus_docs, write_docs,
                                                              make_config):
  """UTF-16 would read as UTF-8 with a NUL in every other byte: one garbled document."""
  plain = write_docs(tmp_path / 'plain.txt', corpus_docs[:3])
  text = open(plain, encoding='utf-8').read()
  (tmp_path / 'utf16.txt').write_bytes(text.encode('utf-16'))
  (tmp_path / 'bom.txt').write_bytes(text.encode('utf-8-sig'))
  c = make_config()
  c.data.sources = f'text:{tmp_path}/utf16.txt'
  (src,) = sources.parse_sources(c.data)
  with pytest.raises(ValueError, match=r'utf16.txt is UTF-16LE text .*expected UTF-8'):
    list(src.documents(sources.Report()))
  c.data.sources = f'text:{tmp_path}/bom.txt'
  (src,) = sources.parse_sources(c.data)
  assert [list(d.lines) for d in src.documents(sources.Report())] == [
      list(d) for d in corpus_docs[:3]]
