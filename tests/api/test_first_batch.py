"""python -m encoder_jax.show_masks: the first batch masked as the run's first step masks it,
for every objective with token masking; Chinese rows mask whole segmented words."""

import json
import subprocess
import sys

import numpy as np
import pytest

from encoder_jax.api import first_batch

import support
from support import family


ROOT = support.ROOT

ROWS = {  # A family row, with what its masking takes as a unit.
    'bert_mlm_nsp': dict(objective=dict(whole_word_masking=True)),
    'albert_mlm_sop': {},  # n-grams of whole words
    'spanbert_mlm_sbo': {},  # spans of whole words
    'electra_rtd': {},  # the generator's input: pieces
}


@pytest.fixture(scope='module')
def prepared_root(tmp_path_factory):
  return str(tmp_path_factory.mktemp('show_masks'))


SPECIALS = ('[CLS]', '[SEP]', '[UNK]', '[PAD]', '[MASK]')  # Never masked: no unit's.


def _units(row):
  """Each unit's piece indices: a unit starts where word_start is True and runs to the
  next start or special."""
  units, current = [], []
  for i, (start, piece) in enumerate(zip(row['word_start'], row['pieces'])):
    if (start or piece in SPECIALS) and current:
      units.append(current)
      current = []
    if piece not in SPECIALS and (start or current):
      current.append(i)
  return units + ([current] if current else [])


@pytest.mark.parametrize('name', sorted(ROWS))
def test_rows_are_the_first_batch_with_its_masks(prepared_root, name):
  c = family.family_config(name, prepared_root)
  for section, fields in ROWS[name].items():
    c[section].update(fields)
  rows = first_batch.first_batch_masks(c, rows=3)
  assert len(rows) == 3
  for row in rows:
    assert set(row) == {'pieces', 'word_start', 'masked'}
    assert len(row['pieces']) == len(row['word_start']) == len(row['masked'])
    assert row['pieces'][0] == '[CLS]' and row['pieces'][-1] == '[SEP]'
    assert 0 < sum(row['masked']) <= c.train.max_predictions[0]
    assert not any(m for p, m in zip(row['pieces'], row['masked']) if p in ('[CLS]', '[SEP]'))
    if c.objective.whole_word_masking:  # A unit is masked whole or not at all.
      for unit in _units(row):
        assert len({row['masked'][i] for i in unit}) == 1, (name, unit, row)
      assert sum(row['word_start']) < len(row['pieces']) - 2  # Some words of several pieces.
    else:
      assert all(row['word_start'][1:-1])
  assert rows == first_batch.first_batch_masks(c, rows=3)  # The same key, the same masks.
  text = first_batch.row_text(rows[0], {'[CLS]', '[SEP]'})
  assert text.startswith('[CLS] ') and text.count('[') > 2


def test_an_objective_without_token_masking_is_refused(prepared_root):
  c = family.family_config('xlnet_plm_memory', prepared_root)
  with pytest.raises(ValueError, match='selects no tokens to mask'):
    first_batch.first_batch_masks(c, rows=1)


@pytest.mark.slow
def test_the_command_shows_chinese_words_masked_whole(tmp_path):
  """The command on People's Daily: printed rows and the JSON, every segmented word
  masked whole."""
  out = tmp_path / 'masks.json'
  args = [sys.executable, '-m', 'encoder_jax.show_masks',
          f'--config={ROOT}/configs/chinese_bert_small.py', '--rows=2', f'--json={out}',
          "--config.data.sources=packaged:peoples_daily;max_documents=300",
          '--config.model.vocab_size=2000', f'--config.data.prepared_dir={tmp_path}/p',
          '--config.data.num_workers=1']
  done = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  rows = json.loads(out.read_text(encoding='utf-8'))
  assert len(rows) == 2 and 'row 0:' in done.stdout and 'Wrote 2 rows' in done.stdout
  several = 0
  for row in rows:
    units = _units(row)
    for unit in units:
      assert len({row['masked'][i] for i in unit}) == 1
    several += sum(len(u) > 1 for u in units if row['masked'][u[0]])
    assert any('\u4e00' <= ch <= '\u9fff' for p in row['pieces'] for ch in p)
  assert several > 0  # Masked words of several pieces: a piece alone is not the unit.
  assert np.mean([sum(r['masked']) / len(r['masked']) for r in rows]) < 0.3
