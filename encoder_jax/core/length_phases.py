"""Sequence-length phases (BERT: 90% of steps at 128 tokens, the last 10% at 512).

The training loop, the objective (max_predictions) and the data iterator (seq_len) all
ask this module which phase a step is in, so they cannot disagree.
"""

from __future__ import annotations

import dataclasses

import ml_collections


@dataclasses.dataclass(frozen=True)
class Phase:
  index: int
  start_step: int  # First step of the phase (inclusive).
  end_step: int  # One past the last step.
  seq_len: int
  max_predictions: int


def phases(train_config: ml_collections.ConfigDict) -> tuple[Phase, ...]:
  """Splits ``train.num_steps`` into the configured phases (validated)."""
  seq_lens = tuple(train_config.seq_lens)
  preds = tuple(train_config.max_predictions)
  fracs = tuple(train_config.phase_fractions)
  if not (len(seq_lens) == len(preds) == len(fracs)) or not seq_lens:
    raise ValueError(
        'config.train.seq_lens, max_predictions and phase_fractions must be non-empty and '
        f'of equal length; got {seq_lens}, {preds}, {fracs}')
  if abs(sum(fracs) - 1.0) > 1e-6 or any(f < 0 for f in fracs):
    raise ValueError(f'config.train.phase_fractions must be >= 0 and sum to 1; got {fracs}')
  for s, p in zip(seq_lens, preds):
    if s < 8 or p < 1 or p > s:
      raise ValueError(
          f'config.train: each seq_len must be >= 8 and 1 <= max_predictions <= seq_len; '
          f'got seq_len={s}, max_predictions={p}')
  n = int(train_config.num_steps)
  out, start = [], 0
  for i, (s, p, f) in enumerate(zip(seq_lens, preds, fracs)):
    end = n if i == len(fracs) - 1 else min(n, start + int(round(f * n)))
    out.append(Phase(i, start, end, int(s), int(p)))
    start = end
  return tuple(out)


def phase_at(all_phases: tuple[Phase, ...], step: int) -> Phase:
  """The phase that contains ``step`` (steps past the end stay in the last phase)."""
  for ph in all_phases:
    if step < ph.end_step:
      return ph
  return all_phases[-1]
