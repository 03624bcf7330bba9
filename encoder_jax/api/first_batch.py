"""The first batch of a run as its first step masks it (``python -m encoder_jax.show_masks``).

:func:`first_batch_masks` builds the first global batch of the first length phase exactly as
training does (the data prepared first if needed, the model ``config.init`` names adopted)
and masks it with the run's key for its first step (with gradient accumulation, each
micro-batch with its own, as the train step does), through the objective's own
``corruption`` (what its ``loss_fn`` runs). Every objective with token masking works: MLM
(pieces, whole words, ALBERT's n-grams, SpanBERT's spans) and ELECTRA's generator input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from encoder_jax import data as data_lib
from encoder_jax.core import length_phases
from encoder_jax import objectives
from encoder_jax.api import pretrain
from encoder_jax.run import pretraining
from encoder_jax.run import train_state
from encoder_jax.config import validation
from encoder_jax.objectives import masking


def first_batch_masks(config, rows: int | None = None) -> list[dict]:
  """The first ``rows`` rows of the first batch with their masks (see the module
  docstring), as dicts of ``pieces``, ``word_start`` and ``masked`` (lists)."""
  config = pretrain.adopted(config)
  validation.validate(config)
  prepared = data_lib.load_or_prepare(config)
  batch = next(data_lib.make_train_iterator(config, prepared))
  phase = length_phases.phase_at(length_phases.phases(config.train), 0)
  tables = pretraining.vocab_tables(config, prepared)
  objective = objectives.build(config, tables)
  accum = int(config.train.grad_accum_steps)
  step_key = jax.random.fold_in(jax.random.fold_in(jax.random.key(int(config.seed)),
                                                   train_state.TRAIN), 0)
  recipe = getattr(objective, 'recipe', None) or next(
      (o.recipe for o in getattr(objective, 'objectives', ()) if hasattr(o, 'recipe')), None)
  if recipe is None:
    raise ValueError(f'config.objective.names={tuple(config.objective.names)!r} selects no '
                     'tokens to mask (show_masks shows MLM, span, n-gram and ELECTRA masks)')
  corrupt = jax.jit(lambda b, key: objective.corruption(b, key, phase))
  b = len(batch['input_ids'])
  masked = np.zeros(batch['input_ids'].shape, bool)
  starts = np.zeros(batch['input_ids'].shape, bool)
  for i in range(accum):  # Micro-batch i: rows i, i + A, ... and key fold_in(step key, i).
    own = {k: jnp.asarray(v[i::accum]) for k, v in batch.items()}
    key = step_key if accum == 1 else jax.random.fold_in(step_key, i)
    out = corrupt(own, key)
    positions, weights = np.asarray(out['masked_positions']), np.asarray(out['masked_weights'])
    rows_i = np.arange(i, b, accum)
    for r, pos, w in zip(rows_i, positions, weights):
      masked[r, pos[w > 0]] = True
    maskable, _ = masking.selection_budget(own['input_ids'], own['input_mask'], tables,
                                           recipe.mask_rate, phase.max_predictions)
    unit = masking.unit_starts(own['input_ids'], tables, recipe.whole_word_masking,
                               own.get('word_starts'))
    starts[rows_i] = np.asarray(masking._words(maskable, unit)[0])  # pylint: disable=protected-access
  tok = prepared.tokenizer
  out_rows = []
  for r in range(b if rows is None else min(rows, b)):
    real = np.flatnonzero(batch['input_mask'][r] > 0)
    ids = batch['input_ids'][r][real]
    out_rows.append(dict(pieces=[tok.id_to_piece(i) for i in ids],
                         word_start=starts[r][real].tolist(), masked=masked[r][real].tolist()))
  return out_rows


def row_text(row: dict, specials=frozenset()) -> str:
  """A row as text: units (words) separated by spaces, selected pieces in ``[...]``;
  ``specials``: pieces shown apart ([CLS], [SEP])."""
  out = []
  n = len(row['pieces'])
  for i, piece in enumerate(row['pieces']):
    shown = piece
    for mark in ('\u2581', '\u0120', '##'):
      if shown.startswith(mark) and len(shown) > len(mark):
        shown = shown[len(mark):]
    if i and (row['word_start'][i] or piece in specials or row['pieces'][i - 1] in specials):
      out.append(' ')
    if row['masked'][i] and (i == 0 or not row['masked'][i - 1]):
      out.append('[')
    out.append(shown)
    if row['masked'][i] and (i == n - 1 or not row['masked'][i + 1]):
      out.append(']')
  return ''.join(out)
