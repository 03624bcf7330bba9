"""How a model kind's parameters map onto a Hugging Face checkpoint: one :class:`HfSpec`
per kind (``hf_bert.py``, ``hf_roberta.py``, ``hf_albert.py``), read by both import and
export (``interop.hf``), so a name or a layout can only be wrong in one place.

Layout differences handled by the transforms:

* HF ``nn.Linear`` stores ``weight`` as [out, in]; our ``Dense`` kernels are [in, out].
* HF splits q/k/v as ``out = heads * head_dim``; ours keep a head axis
  (q/k/v kernels [embed, heads, head_dim], the attention output kernel
  [heads, head_dim, embed]) so tensor parallelism can shard heads.
* HF has one tensor per layer (``bert.encoder.layer.{i}.``); ours are stacked by
  ``nn.scan`` with a leading 'layers' axis (an entry whose HF key has ``{i}``).
* Tied tensors (the MLM decoder *is* the word embedding) are written by neither side.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from encoder_jax.models import config as config_lib

Array = np.ndarray
Config = config_lib.EncoderConfig


@dataclasses.dataclass(frozen=True)
class Transform:
  """Maps one HF tensor to ours and back (``to_hf(to_ours(x)) == x``)."""
  to_ours: Callable[[Array, Config], Array]
  to_hf: Callable[[Array, Config], Array]

# (our EncoderConfig field, HF config field) of the shape, the same in every BERT-like HF
# config; a table's CONFIG_FIELDS starts with them.
SHAPE_FIELDS: tuple[tuple[str, str], ...] = (
    ('vocab_size', 'vocab_size'),
    ('hidden_size', 'hidden_size'),
    ('num_layers', 'num_hidden_layers'),
    ('num_heads', 'num_attention_heads'),
    ('intermediate_size', 'intermediate_size'),
)

IDENTITY = Transform(lambda x, c: x, lambda x, c: x)
# nn.Linear weight [out, in] <-> Dense kernel [in, out].
LINEAR = Transform(lambda x, c: x.T, lambda x, c: x.T)
# query/key/value weight [heads*head_dim, embed] <-> kernel [embed, heads, head_dim].
QKV_KERNEL = Transform(
    lambda x, c: x.T.reshape(c.hidden_size, c.num_heads, c.head_dim),
    lambda x, c: x.reshape(c.hidden_size, c.num_heads * c.head_dim).T)
# query/key/value bias [heads*head_dim] <-> [heads, head_dim].
QKV_BIAS = Transform(lambda x, c: x.reshape(c.num_heads, c.head_dim),
                     lambda x, c: x.reshape(c.num_heads * c.head_dim))
# attention.output.dense weight [embed, heads*head_dim] <-> kernel [heads, head_dim, embed].
ATTENTION_OUT_KERNEL = Transform(
    lambda x, c: x.T.reshape(c.num_heads, c.head_dim, c.hidden_size),
    lambda x, c: x.reshape(c.num_heads * c.head_dim, c.hidden_size).T)

@dataclasses.dataclass(frozen=True)
class Entry:
  """One tensor of ours and its HF key.

  ``hf=None``: a tensor the HF architecture has no place for (e.g. DeBERTa's pooler and
  pair head beside ``DebertaForMaskedLM``); its group is freshly initialised on import and
  left out of the export, so a group's entries are either all ``hf=None`` or none are.
  ``when``: the entry exists only for configs it accepts (e.g. a LayerNorm an option adds).
  ``first_layer``: a per-layer tensor HF has from this layer on only (ModernBERT's layer 0
  has no attention LayerNorm, ``config.model.first_attention_norm=False``); our stacked
  slots before it are unused by the network, filled with ``unused_value`` on import and
  left out of the export.
  """
  ours: str  # '/'-separated path in our 'params' collection.
  hf: str | None  # HF state-dict key; '{i}' marks a per-layer tensor (stacked on our axis 0).
  transform: Transform
  group: str
  when: Callable[[Config], bool] | None = None
  first_layer: Callable[[Config], int] | None = None
  unused_value: float = 1.0  # A LayerNorm scale's init.

  @property
  def per_layer(self) -> bool:
    return self.hf is not None and '{i}' in self.hf

  def applies(self, config: Config) -> bool:
    return self.when is None or bool(self.when(config))

  def layers(self, config: Config) -> range:
    """The layers HF has this per-layer tensor for."""
    return range(self.first_layer(config) if self.first_layer else 0, config.num_layers)




@dataclasses.dataclass(frozen=True)
class HfSpec:
  """Everything about one kind's Hugging Face checkpoints.

  ``groups[0]`` is the trunk every checkpoint must have; the other groups are heads a
  checkpoint may lack (then freshly initialised, and reported). ``base_prefix`` is the
  prefix a task model puts before the trunk's keys (``bert.``) and a bare base model
  leaves out; ``layer_prefix`` the per-layer key prefix (to refuse extra layers).
  """
  kind: str
  model_type: str
  architectures: tuple[str, ...]  # Importable; the first is what export writes.
  params: tuple[Entry, ...]
  groups: tuple[str, ...]
  config_fields: tuple[tuple[str, str], ...]  # (our EncoderConfig field, HF field).
  required_hf_values: Mapping[str, Any]  # HF fields our network computes exactly this for.
  base_prefix: str
  base_parts: tuple[str, ...]  # First key parts of the trunk in a bare base model.
  layer_prefix: str
  tied: Mapping[str, str] = dataclasses.field(default_factory=dict)  # Alias -> source key.
  buffers: tuple[str, ...] = ()  # HF buffers (never imported).
  # Our config fields that are not a plain copy of an HF field: (hf_config) -> {field: v}.
  config_from_hf: Callable[[Mapping[str, Any]], dict[str, Any]] = lambda hf: {}
  # Extra HF config.json fields on export: (our config, pad id) -> {field: value}.
  config_to_hf: Callable[[Config, int], dict[str, Any]] = lambda c, pad: {}
  # Raised for configs the HF architecture cannot represent (e.g. partial sharing).
  check_exportable: Callable[[Config], None] = lambda c: None
  # The shared block options (models.config.BLOCK_OPTIONS: pre-LN, GLU, bias-free) the HF
  # architecture represents; a config with any other away from its default is refused.
  block_options: tuple[str, ...] = ()
  # Key spellings of older checkpoints -> ours, applied after the prefix is added.
  key_renames: tuple[tuple[str, str], ...] = ()
  # Rewrites of the state dict around the table, for a tensor of one side that is two of the
  # other's (ModernBERT's token table with our shared offset folded in): on import, the
  # (normalised) HF state -> the keys the table reads; on export, the table's -> HF's.
  state_from_hf: Callable[[dict, Config], dict] = lambda state, c: state
  state_to_hf: Callable[[dict, Config], dict] = lambda state, c: state
  # A config file whose network this table exports (named when another kind's export
  # refuses a block option this one represents).
  example_config: str = ''

  @property
  def export_architecture(self) -> str:
    return self.architectures[0]

  def entries(self, config: Config) -> tuple[Entry, ...]:
    """The entries that exist for ``config`` (see ``Entry.when``)."""
    return tuple(e for e in self.params if e.applies(config))


def hf_keys(entry: Entry, config: Config) -> list[str]:
  if entry.hf is None:
    return []
  if entry.per_layer:
    return [entry.hf.format(i=i) for i in entry.layers(config)]
  return [entry.hf]
