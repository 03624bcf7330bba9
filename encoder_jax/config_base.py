"""The one schema every config starts from.

Each section maps onto one constructor (``model`` -> ``models.config.EncoderConfig`` of the
kind ``model.kind`` names in ``models.registry``, ``objective`` -> the objective registry,
``data``/``tokenizer`` -> ``encoder_jax.data``, ``optim`` -> ``optimizer.make``, ``mesh``
-> ``sharding.make_mesh``, ``checkpoint`` -> ``checkpointing.Checkpointer``), so no field is
copied by hand into another object. The ``model`` and ``objective`` sections are not
written here: they are the fields the registry entries declare (``encoder_jax.fields``;
``fields_table()`` prints them), so a new kind or objective adds its fields in its own
module. Configs in ``configs/`` call :func:`base_config` and override what they change; the
command line may only override keys that exist here (configs are locked).
"""

from __future__ import annotations

import math

import ml_collections

from encoder_jax import fields as fields_lib
from encoder_jax import objectives
from encoder_jax.data import config as data_config
from encoder_jax.models import registry as models


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0  # Seeds parameter init, data order and the per-step masks.

  # ---- model and objective: the fields the registries declare (name, default, range and
  # meaning next to the code that reads them; `fields_table()` lists them). ----
  c.model = section(models.model_fields())  # -> models.config.EncoderConfig.
  c.objective = section(objectives.objective_fields())  # -> objectives.build.

  # ---- data and tokenizer: owned by encoder_jax.data. ----
  c.data = data_config.data_config()
  c.tokenizer = data_config.tokenizer_config()

  # ---- train: steps, global batch, sequence-length phases. ----
  c.train = ml_collections.ConfigDict(dict(
      num_steps=1_000_000,  # Optimizer steps over all phases.
      batch_size=256,  # Global sequences per optimizer step (all hosts, all micro-batches).
      grad_accum_steps=1,  # Micro-batches per optimizer step (batch_size must divide).
      seq_lens=(128, 512),  # Tokens per sequence in each phase.
      max_predictions=(20, 80),  # MLM positions per sequence in each phase.
      phase_fractions=(0.9, 0.1),  # Share of num_steps spent in each phase (sums to 1).
      log_every_steps=100,
      eval_every_steps=10_000,  # 0 disables periodic held-out evaluation.
      eval_batches=20,  # Held-out batches per evaluation.
      # PRNG of the dropout keys: 'rbg' (XLA's RngBitGenerator; JAX does not promise the
      # same values on every mesh) or 'threefry' (the same on any mesh). The masks are
      # hashed from two words of each key (models/layers.random_words), so both are cheap.
      dropout_rng_impl='rbg',
      nonfinite_policy='stop',  # On NaN/inf loss: 'stop' (name the last good checkpoint) or 'skip'.
      peak_tflops_per_device=0.0,  # For MFU; 0 = look the device up in metrics.PEAK_TFLOPS.
  ))

  # ---- optim: optimizer.make. ----
  c.optim = ml_collections.ConfigDict(dict(
      name='adamw',  # 'adamw' or 'lamb'.
      learning_rate=1e-4,  # Peak, reached after warmup_steps.
      warmup_steps=10_000,  # Linear warmup from 0; then the schedule's decay.
      # After warmup: 'linear' decay to 0 at train.num_steps (BERT; warmup = half the
      # steps gives the one-cycle triangle), 'cosine' to 0, or 'wsd' (warmup-stable-decay:
      # the peak held, then linear to 0 over the last decay_fraction of the steps).
      schedule='linear',
      decay_fraction=0.2,  # 'wsd' only: share of train.num_steps spent decaying.
      b1=0.9,
      b2=0.999,
      eps=1e-6,
      weight_decay=0.01,  # Decoupled; not applied to LayerNorm parameters and biases.
      grad_clip_norm=1.0,  # Global-norm clipping; 0 disables.
  ))

  # ---- mesh: sharding.make_mesh. -1 = all remaining devices. ----
  c.mesh = ml_collections.ConfigDict(dict(
      data=-1,  # Pure data parallelism (replicated params).
      fsdp=1,  # Data parallelism with params/optimizer state sharded (ZeRO-3 style).
      tensor=1,  # Megatron-style tensor parallelism over heads / d_ff / vocab.
  ))

  # ---- checkpoint: checkpointing.Checkpointer. ----
  c.checkpoint = ml_collections.ConfigDict(dict(
      every_steps=10_000,  # Save period (plus a final save and one on SIGTERM).
      keep=3,  # Most recent checkpoints kept.
      async_save=True,  # Write in the background while training continues.
  ))
  return c


def section(declared: dict[str, fields_lib.Field]) -> ml_collections.ConfigDict:
  """A config section of declared fields at their defaults (None: a typed placeholder, so
  the command line can still set it)."""
  values = {}
  for name, f in declared.items():
    values[name] = (ml_collections.config_dict.placeholder(str) if f.default is None
                    else f.default)
  return ml_collections.ConfigDict(values)


def fields_table() -> str:
  """Every registry-declared field as Markdown: key, default, allowed values, meaning."""
  rows = ['| key | default | allowed | meaning |', '|---|---|---|---|']
  for sec, declared in (('model', models.model_fields()),
                        ('objective', objectives.objective_fields())):
    for name, f in declared.items():
      rows.append(f'| `{sec}.{name}` | `{f.default!r}` | {f.expected()} | {f.doc} |')
  return '\n'.join(rows)


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


# The small-budget recipe (configs/crammed_small.py, the bake-off's 'crammed' row): what
# pays at a CPU's budget, measured against BERT's recipe at equal training FLOPs (README,
# "Pretraining that pays"). Section -> fields, applied over a sized config by
# ``apply_recipe``.
SMALL_BUDGET_RECIPE: dict[str, dict] = dict(
    # Pre-LN with a final LayerNorm, GeGLU, no biases, no dropout (Cramming; ModernBERT),
    # rotary positions instead of a learned table (RoFormer; ModernBERT).
    model=dict(pre_norm=True, gated_ffn=True, dense_bias=False, norm_bias=False,
               rotary=True, hidden_dropout_rate=0.0, attention_dropout_rate=0.0),
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
