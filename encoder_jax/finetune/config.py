"""The fine-tuning config schema, declared field by field; ``configs/finetune_*.py`` start
from :func:`base_config`.

Every value is a :class:`encoder_jax.core.fields.Field` (name, default, allowed range, meaning),
checked by the same code as pretraining's (``validation.validate_sections``): ``init`` ->
the pretrained weights (``encoder_jax.loading.loaded``), ``data`` -> the task's reader, ``optim``
-> ``optimizer.build`` (pretraining's builder; the moment and epsilon fields are the very
declarations of pretraining's ``optim``), ``task`` -> an entry of ``finetune.tasks``, whose
own fields make ``task_settings``; ``mesh``, ``dtype``, ``nonfinite_policy`` and
``compilation_cache_dir`` (pretraining's declarations) and ``checkpoint_keep`` -> the
training engine.
"""

from __future__ import annotations

import ml_collections

from encoder_jax.config import schema as config_base
from encoder_jax.core import fields as fields_lib
from encoder_jax.config import validation
from encoder_jax.finetune import tasks

F = fields_lib.Field
_TEXT = fields_lib.string(non_empty=True)


def _dropout_or_default() -> fields_lib.Check:
  check, _ = fields_lib.number(0, 1, hi_open=True)
  return (lambda v: v == -1 or check(v)), "-1 (the checkpoint's rates) or a number in [0, 1)"


def _names() -> fields_lib.Check:
  return ((lambda v: isinstance(v, tuple) and all(isinstance(x, (str, int)) for x in v)),
          'a tuple of label names (empty: from tfds, or the sorted train labels)')


TOP: dict[str, fields_lib.Field] = fields_lib.section(
    tasks.TASK,
    F('seed', 0, fields_lib.integer(), 'Head init, dropout and shuffling.'),
    F('dropout_rate', 0.1, fields_lib.number(0, 1, hi_open=True), 'Head dropout.'),
    F('encoder_dropout', -1.0, _dropout_or_default(),
      "The encoder's hidden and attention dropout while fine-tuning; -1 = its config's rates "
      '(a checkpoint pretrained without dropout, as the small-budget recipe, then has none).'),
    F('eval_every_epoch', True, fields_lib.boolean(),
      'Score the eval split at every epoch end; False: after the last epoch only.'),
    F('pooling', 'cls', fields_lib.one_of('cls', 'mean', 'max'),
      "A sequence task's pooling (each task declares those it reads): 'cls' (the [CLS] state "
      "through the kind's pooler, as BERT fine-tunes), 'mean' (the real tokens' final "
      "states: for encoders whose pretraining never trained [CLS]), 'max' (Sentence-BERT)."),
    F('dtype', '', fields_lib.one_of('', 'float32', 'bfloat16'),
      "Activations: '' = the checkpoint's model.dtype, 'float32' or 'bfloat16'."),
    config_base.TRAIN['nonfinite_policy'],
    config_base.TRAIN['compilation_cache_dir'],
    F('checkpoint_keep', 1, fields_lib.integer(1),
      'Checkpoints kept in <workdir>/checkpoints (one per epoch end).'),
)

INIT: dict[str, fields_lib.Field] = fields_lib.section(
    F('workdir', '', fields_lib.string(),
      'A pretraining (or encoder_jax.convert) workdir; its config.json is used.'),
    F('step', -1, fields_lib.integer(0, also=(-1,)),
      'Checkpoint step in workdir; -1 = the latest.'),
    F('hf_dir', '', fields_lib.string(),
      'Or a Hugging Face directory (config.json + weights + vocab); exactly one of the two.'),
    F('from_scratch', False, fields_lib.boolean(),
      "The source's network and tokenizer, every parameter freshly initialised: the "
      'from-scratch baseline that says what pretraining bought.'),
)

DATA: dict[str, fields_lib.Field] = fields_lib.section(
    F('train', '', fields_lib.string(),
      "Source spec: 'tfds:NAME:SPLIT', 'tsv:PATH' (header row), 'jsonl:PATH' (SQuAD: "
      "'json:PATH')."),
    F('eval', '', fields_lib.string(), 'The scored split (a source spec); empty: none.'),
    F('more_evals', '', fields_lib.string(),
      "'NAME=SPEC,...': more splits scored after the last epoch (metrics NAME_*)."),
    F('tfds_data_dir', '', fields_lib.string(), "data_dir of 'tfds:' specs ('' = the default)."),
    F('text_fields', ('sentence',), fields_lib.sequence_of(_TEXT),
      'Text fields of a row: 1, or 2 for pairs (Sentence-BERT: 2, or 3 for triples).'),
    F('label_field', 'label', _TEXT,
      'Sequence task: int or string label (regression: a number).'),
    F('tokens_field', 'tokens', _TEXT,
      'Token task: list of words (or a whitespace-separated string).'),
    F('tags_field', 'tags', _TEXT, 'Token task: one label per word (ints or strings).'),
    F('labels', (), _names(), 'Label names, index = class id.'),
    F('max_len', 128, fields_lib.integer(4),
      'Tokens per example including [CLS]/[SEP]; longer inputs are truncated (counted).'),
    F('packing', False, fields_lib.boolean(),
      "Whole examples packed back to back into rows of max_len (each attends to itself only, "
      "pooled by the mean of its tokens: pooling='mean'; kinds with packed rows); "
      'optim.batch_size and eval_batch_size then count rows.'),
)

OPTIM: dict[str, fields_lib.Field] = fields_lib.section(
    F('learning_rate', 2e-5, fields_lib.number(0, lo_open=True), 'Peak, after warmup.'),
    F('warmup_fraction', 0.1, fields_lib.number(0, 1),
      'Share of all steps spent warming up from 0; then linear decay to 0.'),
    config_base.OPTIM['weight_decay'],
    config_base.OPTIM['grad_clip_norm'],
    config_base.OPTIM['b1'],
    config_base.OPTIM['b2'],
    config_base.OPTIM['eps'],
    F('epochs', 3, fields_lib.integer(1), 'Passes over the training split.'),
    F('batch_size', 32, fields_lib.integer(1), 'Examples per step (rows with data.packing).'),
    F('eval_batch_size', 64, fields_lib.integer(1), 'Examples per evaluation batch.'),
)


def schema() -> dict[str, dict[str, fields_lib.Field]]:
  """Every section of a fine-tuning config ('' = the top level) and its declared fields."""
  return {'': TOP, 'init': INIT, 'data': DATA, 'optim': OPTIM, 'task_settings': tasks.FIELDS,
          'mesh': config_base.MESH}


def base_config() -> ml_collections.ConfigDict:
  """The schema at its defaults (BERT's sequence-classification fine-tuning)."""
  return fields_lib.defaults(schema())


def fields_table() -> str:
  """Every field of the fine-tuning schema as Markdown."""
  return fields_lib.table(schema())


# ---- rules over several keys: each returns a message, or None when satisfied ----


def _task(c) -> str | None:
  """The task's own check over the fields it reads together."""
  return tasks.get(c.task).check(c)


def _pooling(c) -> str | None:
  entry = tasks.get(c.task)
  if entry.poolings and c.pooling not in entry.poolings:
    return (f'config.pooling={c.pooling!r}: expected one of {entry.poolings} (the poolings '
            f'task {c.task} reads)')
  return None


def _packing(c) -> str | None:
  if c.data.get('packing', False) and (not tasks.get(c.task).packing or c.pooling != 'mean'):
    return ('config.data.packing=True packs whole examples, pooled per example: expected '
            "pooling='mean' and a task of "
            f'{sorted(k for k, e in tasks.REGISTRY.items() if e.packing)}; got task='
            f'{c.task!r}, pooling={c.pooling!r}')
  return None


RULES = (_task, _pooling, _packing)


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ``validation.ConfigError`` listing every out-of-range value; before any work."""
  validation.validate_sections(config, schema(), RULES)
