"""Accuracy and F1 for the fine-tuning tasks (host-side, over whole eval sets), computed by
the standard libraries: scikit-learn (F1, Matthews), scipy.stats (Pearson, Spearman) and
seqeval (entity-level F1).

Sequence classification: accuracy and F1 (binary F1 of class 1 with two labels, plus
Matthews; else macro F1 over every label). Token classification: accuracy over labelled
first pieces, and entity-level micro F1 (seqeval's default, CoNLL's conlleval: exact spans,
an I- tag without its B- opens an entity) when the labels are BIO/IOB2 tags, else macro F1.
Undefined scores (a class never predicted nor present; a constant input to a correlation)
are 0.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from encoder_jax.core import extras

_WHAT = 'fine-tuning scores need scikit-learn, SciPy and seqeval'
stats = extras.lazy('scipy.stats', extra='finetune', what=_WHAT)
seqeval_metrics = extras.lazy('seqeval.metrics', extra='finetune', what=_WHAT)
sequence_labeling = extras.lazy('seqeval.metrics.sequence_labeling', extra='finetune', what=_WHAT)
sk_metrics = extras.lazy('sklearn.metrics', extra='finetune', what=_WHAT)


def macro_f1(pred: np.ndarray, gold: np.ndarray, num_labels: int) -> float:
  return float(sk_metrics.f1_score(gold, pred, labels=list(range(num_labels)),
                                   average='macro', zero_division=0))


def sequence_metrics(pred: np.ndarray, gold: np.ndarray, num_labels: int) -> dict[str, float]:
  out = {'accuracy': float(sk_metrics.accuracy_score(gold, pred)), 'examples': int(len(gold))}
  if num_labels == 2:
    out['matthews'] = matthews(pred, gold)
    out['f1'] = float(sk_metrics.f1_score(gold, pred, labels=[0, 1], pos_label=1,
                                          average='binary', zero_division=0))
  else:
    out['f1'] = macro_f1(pred, gold, num_labels)
  return out


def matthews(pred: np.ndarray, gold: np.ndarray) -> float:
  """Matthews correlation of binary predictions (CoLA's GLUE metric); 0 when undefined."""
  return float(sk_metrics.matthews_corrcoef(gold, pred))


def _constant(x: np.ndarray) -> bool:
  return len(x) < 2 or bool(np.all(x == x[0]))


def pearson(a: np.ndarray, b: np.ndarray) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return 0.0 if _constant(a) or _constant(b) else float(stats.pearsonr(a, b).statistic)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
  """Spearman's rank correlation (ties at their mean rank)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return 0.0 if _constant(a) or _constant(b) else float(stats.spearmanr(a, b).statistic)


def regression_metrics(pred: np.ndarray, gold: np.ndarray) -> dict[str, float]:
  """STS-B's GLUE metrics: Pearson and Spearman correlation, and the mean squared error."""
  return {'pearson': pearson(pred, gold), 'spearman': spearman(pred, gold),
          'mse': float(sk_metrics.mean_squared_error(gold, pred)), 'examples': int(len(gold))}


def is_bio(names: Sequence[str]) -> bool:
  return any(n.startswith(('B-', 'I-')) for n in names) and all(
      n == 'O' or n.startswith(('B-', 'I-')) for n in names)


def spans(tags: Sequence[str]) -> set[tuple[int, int, str]]:
  """(start, end, type) entity spans of one BIO sequence, as seqeval reads them (an I-
  without its B- starts one); ``end`` exclusive."""
  return {(start, end + 1, kind)
          for kind, start, end in sequence_labeling.get_entities(list(tags))}


def token_metrics(pred_NxL: np.ndarray, gold_NxL: np.ndarray, names: Sequence[str],
                  ignore: int = -1) -> dict[str, float]:
  labelled = gold_NxL != ignore
  out = {'accuracy': float((pred_NxL == gold_NxL)[labelled].mean()),
         'tokens': int(labelled.sum())}
  if is_bio(names):
    tags = lambda rows: [[names[i] for i in row[keep]] for row, keep in zip(rows, labelled)]
    out['f1'] = float(seqeval_metrics.f1_score(tags(gold_NxL), tags(pred_NxL),
                                               zero_division=0))
  else:
    out['f1'] = macro_f1(pred_NxL[labelled], gold_NxL[labelled], len(names))
  return out
