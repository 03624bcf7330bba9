r"""Shows what masking selects in the first batch of a run, as the run would draw it.

  python -m encoder_jax.show_masks --config=configs/chinese_bert_small.py --rows=4
  python -m encoder_jax.show_masks --config=configs/bert_small.py \
      --config.objective.whole_word_masking=True --rows=2 --json=/tmp/masks.json

Builds the first global batch of the first length phase exactly as training does (the data
prepared first if needed, the model ``config.init`` names adopted), masks it with the
run's key for its first step (and, with gradient accumulation, each micro-batch with its
own, as the train step does), and prints each row as text: words as masking sees them
separated by spaces, the selected pieces in ``[...]``. ``--json`` writes one object per
row: ``pieces`` (the tokenizer's piece strings of the row's real positions, specials
included), ``word_start`` (whether masking takes the position as the start of a unit:
a word, or with piece masking every piece) and ``masked`` (whether it was selected).
Every objective with token masking works: MLM (pieces, whole words, ALBERT's n-grams,
SpanBERT's spans) and ELECTRA's generator input.
"""

from __future__ import annotations

import json

from absl import app
from absl import flags
from ml_collections import config_flags

from encoder_jax.api import first_batch

_CONFIG = config_flags.DEFINE_config_file('config', lock_config=True)
_ROWS = flags.DEFINE_integer('rows', 4, 'Rows of the first batch to show.')
_JSON = flags.DEFINE_string('json', '', 'Also write the rows as JSON to this file.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _ROWS.value < 1:
    raise ValueError(f'--rows={_ROWS.value}: expected at least 1')
  rows, specials = first_batch.first_batch_masks(_CONFIG.value, _ROWS.value), set()
  for row in rows:
    specials.update(p for p in row['pieces'] if p.startswith(('[', '<')) and p.endswith(
        (']', '>')) and len(p) > 2)
  for r, row in enumerate(rows):
    print(f"row {r}: {sum(row['masked'])} of {len(row['pieces'])} pieces masked, "
          f"{sum(row['word_start'])} units")
    print('  ' + first_batch.row_text(row, specials))
  if _JSON.value:
    with open(_JSON.value, 'w', encoding='utf-8') as f:
      json.dump(rows, f, ensure_ascii=False, indent=1)
    print(f'Wrote {len(rows)} rows to {_JSON.value}')


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main)
