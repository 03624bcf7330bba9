"""Accuracy and F1 for the fine-tuning tasks (host-side numpy, over whole eval sets).

Sequence classification: accuracy and F1 (binary F1 of class 1 with two labels, else
macro F1). Token classification: accuracy over labelled first pieces, and entity-level
micro F1 (CoNLL: exact spans) when the labels are BIO/IOB2 tags, else macro F1.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _f1(tp: float, fp: float, fn: float) -> float:
  return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def macro_f1(pred: np.ndarray, gold: np.ndarray, num_labels: int) -> float:
  return float(np.mean([_f1(((pred == c) & (gold == c)).sum(), ((pred == c) & (gold != c)).sum(),
                            ((pred != c) & (gold == c)).sum()) for c in range(num_labels)]))


def sequence_metrics(pred: np.ndarray, gold: np.ndarray, num_labels: int) -> dict[str, float]:
  out = {'accuracy': float((pred == gold).mean()), 'examples': int(len(gold))}
  if num_labels == 2:
    out['f1'] = _f1(((pred == 1) & (gold == 1)).sum(), ((pred == 1) & (gold == 0)).sum(),
                    ((pred == 0) & (gold == 1)).sum())
  else:
    out['f1'] = macro_f1(pred, gold, num_labels)
  return out


def is_bio(names: Sequence[str]) -> bool:
  return any(n.startswith(('B-', 'I-')) for n in names) and all(
      n == 'O' or n.startswith(('B-', 'I-')) for n in names)


def spans(tags: Sequence[str]) -> set[tuple[int, int, str]]:
  """(start, end, type) entity spans of one BIO sequence (an I- without B- starts one)."""
  out, start, kind = set(), None, None
  for i, t in enumerate(list(tags) + ['O']):
    inside = t.startswith('I-') and kind == t[2:]
    if start is not None and not inside:
      out.add((start, i, kind))
      start, kind = None, None
    if t.startswith('B-') or (t.startswith('I-') and not inside):
      start, kind = i, t[2:]
  return out


def token_metrics(pred_NxL: np.ndarray, gold_NxL: np.ndarray, names: Sequence[str],
                  ignore: int = -1) -> dict[str, float]:
  labelled = gold_NxL != ignore
  out = {'accuracy': float((pred_NxL == gold_NxL)[labelled].mean()),
         'tokens': int(labelled.sum())}
  if is_bio(names):
    tp = fp = fn = 0
    for p_row, g_row, keep in zip(pred_NxL, gold_NxL, labelled):
      p = spans([names[i] for i in p_row[keep]])
      g = spans([names[i] for i in g_row[keep]])
      tp, fp, fn = tp + len(p & g), fp + len(p - g), fn + len(g - p)
    out['f1'] = _f1(tp, fp, fn)
  else:
    out['f1'] = macro_f1(pred_NxL[labelled], gold_NxL[labelled], len(names))
  return out
