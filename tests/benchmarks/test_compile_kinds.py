"""``benchmarks/compile_kinds.py``'s table from the compile command's JSON (no compile here):
ratios to BERT, the count each row comes from, a failed kind's row, and every registered kind
with a row."""

from __future__ import annotations

import support


def _result(tokens_per_s: float, hbm: float, whole: bool) -> dict:
  return dict(phases=[dict(seq_len=512, whole_stack=whole,
                           train=dict(total_bytes=hbm, fits=True, compile_s=1.0),
                           roofline=dict(compute_s=0.01, memory_s=0.04,
                                         tokens_per_s=tokens_per_s))])


def test_the_table_gives_each_kind_beside_bert():
  kinds = support.benchmark('compile_kinds')
  text = kinds.table({'bert': _result(400_000, 4 * 2 ** 30, True),
                      'xlnet': _result(250_000, 5 * 2 ** 30, True),
                      'deberta': _result(200_000, 6 * 2 ** 30, False),
                      'albert': dict(error='error: refused')})
  rows = {line.split(' | ')[0].strip('| '): line for line in text.splitlines()[2:]}
  assert '| 1.60x slower | 1.25x | whole stack |' in rows['xlnet']
  assert '| 2.00x slower | 1.50x | from 2 and 3 layers |' in rows['deberta']
  assert 'error: error: refused' in rows['albert']
  kinds._check_registry()  # Every registered kind has a base config or is a part.
  assert kinds.WHOLE_STACK == '--whole_stack'
