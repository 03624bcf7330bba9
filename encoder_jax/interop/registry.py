"""What ``config.model.kind`` selects outside the network: its Hugging Face table.

The networks themselves are in ``models.registry`` (one file per kind under ``models/``);
this maps each kind, and each Hugging Face ``model_type``, to its parameter table
(``interop/hf_<kind>.py``). A new kind is its model file, its table file and a line in
each registry.
"""

from __future__ import annotations

from encoder_jax.interop import hf_albert
from encoder_jax.interop import hf_bert
from encoder_jax.interop import hf_deberta
from encoder_jax.interop import hf_electra
from encoder_jax.interop import hf_modernbert
from encoder_jax.interop import hf_roberta
from encoder_jax.interop import hf_table
from encoder_jax.interop import hf_xlnet
from encoder_jax.models import registry as models_registry

KINDS = models_registry.KINDS
network = models_registry.network
make_config = models_registry.make_config

HF_SPECS: dict[str, hf_table.HfSpec] = {
    'bert': hf_bert.SPEC,
    'roberta': hf_roberta.SPEC,
    'albert': hf_albert.SPEC,
    'electra': hf_electra.DISCRIMINATOR,
    'electra_generator': hf_electra.GENERATOR,
    'deberta': hf_deberta.SPEC_V1,
    'deberta_v2': hf_deberta.SPEC_V2,
    'xlnet': hf_xlnet.SPEC,
    'modernbert': hf_modernbert.SPEC,
}


def hf_spec(kind: str) -> hf_table.HfSpec:
  models_registry.get(kind)
  if kind not in HF_SPECS:
    raise ValueError(f'config.model.kind={kind!r} has no Hugging Face table; kinds with one: '
                     f'{sorted(HF_SPECS)}')
  return HF_SPECS[kind]


def hf_spec_for_model_type(model_type: str | None, source: str = 'config.json',
                           architectures: tuple[str, ...] = ()) -> hf_table.HfSpec:
  """The table of ``model_type``; where several kinds share it (ELECTRA's discriminator and
  generator), the one whose architectures include the checkpoint's first architecture."""
  specs = [spec for spec in HF_SPECS.values() if spec.model_type == model_type]
  for spec in specs:
    if architectures and architectures[0] in spec.architectures:
      return spec
  if specs:
    return specs[0]
  raise ValueError(f'{source}: model_type={model_type!r} cannot be imported; expected one of '
                   f'{sorted({s.model_type for s in HF_SPECS.values()})}')
