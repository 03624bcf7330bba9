"""Model kinds by ``config.model.kind``: one line per kind, one file per kind.

Everything outside ``models/`` builds networks through :func:`network` (or :func:`get`),
never by importing a concrete model module, so a new kind is a file plus a line here
(plus its Hugging Face table in ``interop.registry``). ``config.model`` is
:func:`model_fields`: every field of ``EncoderConfig`` (declared, typed, in
``models/config.py``), in its order: ``kind`` (:data:`KIND`, whose range is checked here,
where the kinds are known), the fields every kind reads (``config.FIELDS``) and each kind's
own (``ModelKind.fields``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from encoder_jax.core import fields as fields_lib
from encoder_jax.models import albert
from encoder_jax.models import bert
from encoder_jax.models import config as config_lib
from encoder_jax.models import deberta
from encoder_jax.models import electra
from encoder_jax.models import modernbert
from encoder_jax.models import roberta
from encoder_jax.models import xlnet

EncoderConfig = config_lib.EncoderConfig
ModelKind = config_lib.ModelKind

KINDS: dict[str, ModelKind] = {
    'bert': bert.KIND,
    'roberta': roberta.KIND,
    'albert': albert.KIND,
    'deberta': deberta.KIND,
    'deberta_v2': deberta.KIND_V2,
    'electra': electra.KIND,
    'electra_generator': electra.GENERATOR_KIND,
    'xlnet': xlnet.KIND,
    'modernbert': modernbert.KIND,
}


KIND = dataclasses.replace(config_lib.KIND_FIELD,
                           spec=fields_lib.names(lambda: KINDS, 'a model kind'))

_MODEL_FIELDS = fields_lib.merge(
    [(KIND,), config_lib.FIELDS, *(k.fields for k in KINDS.values())], 'model')


def model_fields() -> dict[str, fields_lib.Field]:
  """Every ``config.model`` field: ``kind``, the shared ones, then each kind's own."""
  return dict(_MODEL_FIELDS)


def get(kind: str) -> ModelKind:
  if kind not in KINDS:
    raise ValueError(f'config.model.kind={kind!r} is not a known model kind; valid: '
                     f'{sorted(KINDS)}')
  return KINDS[kind]


@dataclasses.dataclass(frozen=True)
class Network:
  """A model kind bound to its config: the modules, init and FLOPs of one network."""
  kind: ModelKind
  config: EncoderConfig

  @property
  def pretraining(self) -> nn.Module:
    return self.kind.pretraining(self.config)

  @property
  def encoder(self) -> nn.Module:
    return self.kind.encoder(self.config)

  def init(self, rng: jax.Array) -> Any:
    """Boxed (logically partitioned) params of the pretraining network."""
    return self.pretraining.init({'params': rng}, **self.kind.init_inputs())['params']

  def flops_per_token(self, seq_len: int) -> float:
    return self.kind.flops_per_token(self.config, seq_len)

  def pretraining_flops(self, seq_len: int, predictions: int, gathered: int = 0) -> float:
    """``ModelKind.pretraining_flops``: one sequence through the pretraining network's
    encoder, the last layer at the rows its losses read."""
    return self.kind.pretraining_flops(self.config, seq_len, predictions, gathered)


def make_config(model_config: ml_collections.ConfigDict | dict | EncoderConfig) -> EncoderConfig:
  """The validated EncoderConfig of ``config.model`` (kind-specific checks included)."""
  c = (model_config if isinstance(model_config, EncoderConfig)
       else EncoderConfig.from_config(model_config))
  problem = KIND.problem('model', c.kind)
  if problem:
    raise ValueError(problem)
  kind = get(c.kind)
  check_block_options(c, kind.block_options, f'config.model.kind={c.kind!r}')
  wrong = {k: getattr(c, k) for k, v in kind.requires.items() if getattr(c, k) != v}
  if wrong:
    raise ValueError(
        f'config.model.kind={c.kind!r} is defined by '
        + ', '.join(f'{k}={kind.requires[k]!r}' for k in wrong) + '; got '
        + ', '.join(f'{k}={v!r}' for k, v in wrong.items()) + f' ({kind.description})')
  kind.check(c)
  return c


def check_block_options(c: EncoderConfig, supported, owner: str) -> None:
  """Refuses a shared block option (``config.BLOCK_OPTIONS``) that ``owner`` does not
  implement but ``c`` sets away from its default: it would be silently ignored."""
  for f in config_lib.BLOCK_OPTIONS:
    value = getattr(c, f.name)
    if f.name not in supported and value != f.default:
      raise ValueError(
          f'config.model.{f.name}={value!r}: {owner} does not implement this option '
          f'(expected the default {f.default!r}); its block options: '
          f'{sorted(supported) or "none"}')


def network(model_config) -> Network:
  c = make_config(model_config)
  return Network(get(c.kind), c)
