"""The one schema every config starts from, declared field by field.

Each section maps onto one constructor (``model`` -> ``models.config.EncoderConfig`` of the
kind ``model.kind`` names in ``models.registry``, ``objective`` -> the objective registry,
``data``/``tokenizer`` -> ``encoder_jax.data``, ``optim`` -> ``optimizer.build``, ``mesh``
-> ``sharding.make_mesh``, ``checkpoint`` -> ``checkpointing.Checkpointer``), so no field is
copied by hand into another object. Every value is a declared :class:`fields.Field` (name,
default, allowed range, meaning): ``model`` and ``objective`` are the fields their registry
entries declare next to their code, ``data`` and ``tokenizer`` are ``data.config``'s, and
the engine's sections are declared here. :func:`schema` gathers them, :func:`base_config`
is that schema at its defaults, ``validation`` checks every range from it and
:func:`fields_table` prints it. Configs in ``configs/`` call :func:`base_config` and override
what they change; the command line may only override keys that exist here (configs are
locked).
"""

from __future__ import annotations

import math

import ml_collections

from encoder_jax.core import fields as fields_lib
from encoder_jax import objectives
from encoder_jax.core import optimizer
from encoder_jax.data import config as data_config
from encoder_jax.models import registry as models

F = fields_lib.Field

TOP: dict[str, fields_lib.Field] = fields_lib.section(
    F('seed', 0, fields_lib.integer(),
      'Seeds parameter init, data order and the per-step masks.'),
)

TRAIN: dict[str, fields_lib.Field] = fields_lib.section(
    F('num_steps', 1_000_000, fields_lib.integer(1), 'Optimizer steps over all phases.'),
    F('batch_size', 256, fields_lib.integer(1),
      'Global sequences per optimizer step (all hosts, all micro-batches).'),
    F('grad_accum_steps', 1, fields_lib.integer(1),
      'Micro-batches per optimizer step (batch_size must be a multiple).'),
    F('seq_lens', (128, 512), fields_lib.sequence_of(fields_lib.integer(8)),
      'Tokens per sequence in each sequence-length phase.'),
    F('max_predictions', (20, 80), fields_lib.sequence_of(fields_lib.integer(1)),
      "MLM positions per sequence in each phase (each <= its phase's seq_len)."),
    F('phase_fractions', (0.9, 0.1), fields_lib.sequence_of(fields_lib.number(0, 1)),
      'Share of num_steps spent in each phase (summing to 1).'),
    F('log_every_steps', 100, fields_lib.integer(1), 'Steps between logged training metrics.'),
    F('eval_every_steps', 10_000, fields_lib.integer(0),
      'Steps between held-out evaluations; 0 disables periodic evaluation.'),
    F('eval_batches', 20, fields_lib.integer(0), 'Held-out batches per evaluation.'),
    F('dropout_rng_impl', 'rbg', fields_lib.one_of('rbg', 'threefry'),
      "PRNG of the dropout keys: 'rbg' (XLA's RngBitGenerator; JAX does not promise the same "
      "values on every mesh) or 'threefry' (the same on any mesh). The masks are hashed from "
      'two words of each key (models/layers.random_words), so both are cheap.'),
    F('nonfinite_policy', 'stop', fields_lib.one_of('stop', 'skip'),
      "On a NaN/inf loss: 'stop' (name the last good checkpoint) or 'skip' the update."),
    F('peak_tflops_per_device', 0.0, fields_lib.number(0),
      'TFLOP/s of one device, for MFU; 0 = look the device up in metrics_log.PEAK_TFLOPS.'),
    F('compilation_cache_dir', 'auto', fields_lib.string(),
      "JAX's persistent compilation cache, so a restart reuses the compiled steps: 'auto' = "
      'the one the environment names (JAX_COMPILATION_CACHE_DIR), else '
      "<workdir>/compilation_cache; a directory (local or gs://) = that one; '' = none."),
    F('profile_steps', 0, fields_lib.integer(0),
      'Steps traced with jax.profiler into <workdir>/profile (process 0), from '
      'profile_first_step; 0 = no trace.'),
    F('profile_first_step', 10, fields_lib.integer(1),
      "With profile_steps: the first traced step (metrics.jsonl's numbering); one later when "
      "the process has not run its phase's step yet, so no compile is traced."),
)

OPTIM: dict[str, fields_lib.Field] = fields_lib.section(
    F('name', 'adamw', fields_lib.one_of('adamw', 'lamb'), "'adamw' or 'lamb'."),
    F('learning_rate', 1e-4, fields_lib.number(0, lo_open=True),
      'Peak, reached after warmup_steps.'),
    F('warmup_steps', 10_000, fields_lib.integer(0),
      "Steps of linear warmup from 0 (<= train.num_steps); then the schedule's decay."),
    F('schedule', 'linear', fields_lib.one_of(*optimizer.SCHEDULES),
      "After warmup: 'linear' decay to 0 at train.num_steps (BERT; warmup = half the steps "
      "gives the one-cycle triangle), 'cosine' to 0, or 'wsd' (warmup-stable-decay: the "
      'peak held, then linear to 0 over the last decay_fraction of the steps).'),
    F('decay_fraction', 0.2, fields_lib.number(0, 1, lo_open=True),
      "'wsd' only: share of train.num_steps spent decaying."),
    F('b1', 0.9, fields_lib.number(0, 1, hi_open=True), 'First-moment decay.'),
    F('b2', 0.999, fields_lib.number(0, 1, hi_open=True), 'Second-moment decay.'),
    F('eps', 1e-6, fields_lib.number(0, lo_open=True), 'Added to the update denominator.'),
    F('weight_decay', 0.01, fields_lib.number(0),
      'Decoupled; not applied to LayerNorm parameters and biases.'),
    F('grad_clip_norm', 1.0, fields_lib.number(0), 'Global-norm clipping; 0 disables.'),
)

# -1 = all remaining devices, or slices (at most one axis of each group: validation's cross
# rules). data/fsdp/tensor are sizes within a slice (ICI); dcn_* across the slices of a
# multislice job (the data-centre network); each mesh axis is their product
# (sharding.device_layout).
_AXIS = fields_lib.integer(1, also=(-1,))
MESH: dict[str, fields_lib.Field] = fields_lib.section(
    F('data', -1, _AXIS, 'Devices of pure data parallelism (replicated params) within a slice; '
      '-1 = the rest.'),
    F('fsdp', 1, _AXIS, 'Devices of data parallelism with params/optimizer state sharded '
      '(ZeRO-3 style) within a slice.'),
    F('tensor', 1, _AXIS, 'Devices of Megatron-style tensor parallelism (heads, d_ff, vocab) '
      'within a slice.'),
    F('dcn_data', -1, _AXIS, 'Slices of a multislice job along the data axis; -1 = the slices '
      'the other dcn_ sizes leave (1 on one slice).'),
    F('dcn_fsdp', 1, _AXIS, 'Slices along the fsdp axis (its all-gathers then cross the '
      'data-centre network).'),
    F('dcn_tensor', 1, _AXIS, 'Slices along the tensor axis (rarely worth the slow network).'),
)

CHECKPOINT: dict[str, fields_lib.Field] = fields_lib.section(
    F('every_steps', 10_000, fields_lib.integer(1),
      'Save period in steps (plus a final save and one on SIGTERM).'),
    F('keep', 3, fields_lib.integer(1), 'Most recent checkpoints kept.'),
    F('async_save', True, fields_lib.boolean(),
      'Write in the background while training continues.'),
)

# Continued pretraining: the model a new run starts from (fine-tuning's ``init`` names). The
# run takes the source's weights, network (config.model) and tokenizer, and keeps its own
# corpus, objectives, schedule and a fresh optimizer (train_state.adopt, start_params).
INIT: dict[str, fields_lib.Field] = fields_lib.section(
    F('workdir', '', fields_lib.string(),
      'Start from this encoder_jax workdir (its config.json, pinned tokenizer, checkpoint); '
      "'' = from scratch."),
    F('step', -1, fields_lib.integer(0, also=(-1,)),
      'With init.workdir: its checkpoint step; -1 = the latest.'),
    F('hf_dir', '', fields_lib.string(),
      'Or start from a Hugging Face directory (config.json, weights, tokenizer); at most one '
      'of the two.'),
)


def schema() -> dict[str, dict[str, fields_lib.Field]]:
  """Every section of a pretraining config ('' = the top level) and its declared fields."""
  return {'': TOP, 'model': models.model_fields(), 'objective': objectives.objective_fields(),
          'data': data_config.DATA, 'tokenizer': data_config.TOKENIZER, 'train': TRAIN,
          'optim': OPTIM, 'mesh': MESH, 'checkpoint': CHECKPOINT, 'init': INIT}


def base_config() -> ml_collections.ConfigDict:
  """The schema at its defaults (BERT-base pretraining)."""
  return fields_lib.defaults(schema())


def fields_table() -> str:
  """Every field of the schema as Markdown: key, default, allowed values, meaning."""
  return fields_lib.table(schema())


def parse_arg(arg: str | None, **defaults):
  """Parses a big_vision-style config argument: ``'runlocal=True,variant=x'``.

  Only keys named in ``defaults`` are accepted; values are cast to the default's type.
  """
  out = dict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, sep, value = item.partition('=')
    key = key.strip()
    if key not in defaults:
      raise ValueError(f'Unknown config argument {key!r}; valid: {sorted(defaults)}')
    default = defaults[key]
    if isinstance(default, bool):
      if not sep:
        value = 'true'
      if value.lower() not in ('true', 'false', '1', '0'):
        raise ValueError(f'Config argument {key!r} expects true/false, got {value!r}')
      out[key] = value.lower() in ('true', '1')
    else:
      out[key] = type(default)(value) if default is not None else value
  return ml_collections.ConfigDict(out)


def shrink_for_local_run(c: ml_collections.ConfigDict) -> None:
  """``runlocal``: the same recipe, small enough for a 2-core CPU in a few minutes."""
  # The embedded corpus (~1.6 MB) supports a vocabulary of at most ~9k pieces.
  c.model.update(vocab_size=8000, hidden_size=128, num_layers=2, num_heads=2,
                 intermediate_size=512, max_position_embeddings=128, dtype='float32')
  c.data.sources = 'embedded'
  c.train.update(num_steps=300, batch_size=32, seq_lens=(64, 128), max_predictions=(10, 20),
                 phase_fractions=(0.9, 0.1), log_every_steps=20, eval_every_steps=100,
                 eval_batches=4)
  c.optim.update(learning_rate=1e-3, warmup_steps=30)
  c.checkpoint.update(every_steps=100, keep=2)


# The small-budget recipe (configs/crammed_small.py, the bake-off's 'modernbert' row): what
# pays at a CPU's budget, measured against BERT's recipe at equal training FLOPs
# (docs/results/recipe_ablation.md). Section -> fields, applied over a sized config by
# ``apply_recipe``. Its network is a ModernBERT (kind='modernbert', so it exports to
# Hugging Face's ModernBertForMaskedLM) with every layer global.
SMALL_BUDGET_RECIPE: dict[str, dict] = dict(
    # Pre-LN with a final LayerNorm, GeGLU, fused QKV, no biases, no dropout (Cramming;
    # ModernBERT), rotary positions instead of a learned table (RoFormer; ModernBERT); every
    # layer global (no sliding window) at RoPE's usual base, 10,000. No segments, but one
    # learned row added to every token's embedding (type_vocab_size=1, a shared offset:
    # without it the quickstart ends 4-5 points of held-out MLM accuracy lower).
    model=dict(models.get('modernbert').requires, kind='modernbert', type_vocab_size=1,
               global_attn_every_n_layers=1, local_attention=0, rope_theta=10_000.0,
               local_rope_theta=0.0, dense_bias=False, norm_bias=False,
               hidden_dropout_rate=0.0, attention_dropout_rate=0.0),
    # MLM only on full sentences (no NSP), 30% masked (Wettig et al. 2023; ModernBERT).
    objective=dict(names=('mlm',), mask_rate=0.3),
    data=dict(pair_kind='full_sentences'),
    # Pre-LN trains at a higher peak; warmup-stable-decay.
    optim=dict(learning_rate=2e-3, schedule='wsd', decay_fraction=0.2),
)


def with_objective(recipe: dict[str, dict], name: str) -> dict[str, dict]:
  """``recipe`` (which sets ``objective.names``) with the objective ``name`` added."""
  names = tuple(recipe.get('objective', {}).get('names', ()))
  if not names or name in names:
    raise ValueError(f'with_objective({name!r}): expected a recipe whose objective.names '
                     f'are set and lack {name!r}; got {names}')
  out = {section: dict(fields) for section, fields in recipe.items()}
  out['objective']['names'] = names + (name,)
  return out


def apply_recipe(c: ml_collections.ConfigDict, recipe: dict[str, dict]) -> None:
  """Sets a recipe's fields (section -> fields) on ``c``. A recipe that sets the masking
  rate and not ``train.max_predictions`` gets the predictions the rate needs at each phase's
  length (:func:`predictions_for`), so no selection is cut off."""
  for section, fields in recipe.items():
    c[section].update(fields)
  if 'mask_rate' in recipe.get('objective', {}) and 'max_predictions' not in recipe.get(
      'train', {}):
    c.train.max_predictions = predictions_for(c.objective.mask_rate, c.train.seq_lens)


def predictions_for(mask_rate: float, seq_lens) -> tuple[int, ...]:
  """``config.train.max_predictions`` for a masking rate: ``ceil(rate * length)`` at each
  length (BERT's 15%: 20 at 128, 77 at 512)."""
  return tuple(max(1, math.ceil(float(mask_rate) * int(n))) for n in seq_lens)
