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
    out['matthews'] = matthews(pred, gold)
    out['f1'] = _f1(((pred == 1) & (gold == 1)).sum(), ((pred == 1) & (gold == 0)).sum(),
                    ((pred == 0) & (gold == 1)).sum())
  else:
    out['f1'] = macro_f1(pred, gold, num_labels)
  return out


def matthews(pred: np.ndarray, gold: np.ndarray) -> float:
  """Matthews correlation of binary predictions (CoLA's GLUE metric); 0 when undefined."""
  tp = float(((pred == 1) & (gold == 1)).sum())
  tn = float(((pred == 0) & (gold == 0)).sum())
  fp = float(((pred == 1) & (gold == 0)).sum())
  fn = float(((pred == 0) & (gold == 1)).sum())
  denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  return 0.0 if denom == 0 else float((tp * tn - fp * fn) / denom)


def _ranks(x: np.ndarray) -> np.ndarray:
  """Ranks from 1, ties given their mean rank (as Spearman's definition needs)."""
  order = np.argsort(x, kind='mergesort')
  ranks = np.empty(len(x), np.float64)
  sorted_x = x[order]
  i = 0
  while i < len(x):
    j = i
    while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
      j += 1
    ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
    i = j + 1
  return ranks


def pearson(a: np.ndarray, b: np.ndarray) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  a, b = a - a.mean(), b - b.mean()
  denom = np.sqrt((a * a).sum() * (b * b).sum())
  return 0.0 if denom == 0 else float((a * b).sum() / denom)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
  return pearson(_ranks(np.asarray(a, np.float64)), _ranks(np.asarray(b, np.float64)))


def regression_metrics(pred: np.ndarray, gold: np.ndarray) -> dict[str, float]:
  """STS-B's GLUE metrics: Pearson and Spearman correlation, and the mean squared error."""
  return {'pearson': pearson(pred, gold), 'spearman': spearman(pred, gold),
          'mse': float(np.mean((np.asarray(pred) - np.asarray(gold)) ** 2)),
          'examples': int(len(gold))}


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
