"""The one table between our BERT parameters and Hugging Face ``BertForPreTraining``'s.

Import and export both read :data:`PARAMS` (and :data:`CONFIG_FIELDS`), so a name or
a layout can only be wrong in one place. Layout differences handled by the transforms:

* HF ``nn.Linear`` stores ``weight`` as [out, in]; our ``Dense`` kernels are [in, out].
* HF splits q/k/v as ``out = heads * head_dim``; ours keep a head axis
  (q/k/v kernels [embed, heads, head_dim], the attention output kernel
  [heads, head_dim, embed]) so tensor parallelism can shard heads.
* HF has one tensor per layer (``bert.encoder.layer.{i}.``); ours are stacked by
  ``nn.scan`` with a leading 'layers' axis.
* The MLM decoder is tied: HF's ``cls.predictions.decoder.weight`` *is* the word
  embedding and ``cls.predictions.decoder.bias`` *is* ``cls.predictions.bias``
  (``save_pretrained`` writes neither; neither do we).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from encoder_jax.models import bert

Array = np.ndarray


@dataclasses.dataclass(frozen=True)
class Transform:
  """Maps one HF tensor to ours and back (``to_hf(to_ours(x)) == x``)."""
  to_ours: Callable[[Array, bert.BertConfig], Array]
  to_hf: Callable[[Array, bert.BertConfig], Array]


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

# Parameter groups. 'encoder' must be present in every checkpoint we import; the
# others are heads that a BertModel / BertForMaskedLM checkpoint may lack (then they
# keep their fresh initialisation, and the import report says so).
ENCODER, POOLER, MLM_HEAD, PAIR_HEAD = 'encoder', 'pooler', 'mlm_head', 'pair_head'
GROUPS = (ENCODER, POOLER, MLM_HEAD, PAIR_HEAD)


@dataclasses.dataclass(frozen=True)
class Entry:
  ours: str  # '/'-separated path in our 'params' collection.
  hf: str  # HF state-dict key; '{i}' marks a per-layer tensor (stacked on our axis 0).
  transform: Transform
  group: str

  @property
  def per_layer(self) -> bool:
    return '{i}' in self.hf


def _layer(ours: str, hf: str, transform: Transform) -> Entry:
  return Entry('encoder/layers/' + ours, 'bert.encoder.layer.{i}.' + hf, transform, ENCODER)


PARAMS: tuple[Entry, ...] = (
    Entry('embeddings/word_embeddings/embedding', 'bert.embeddings.word_embeddings.weight',
          IDENTITY, ENCODER),
    Entry('embeddings/position_embeddings/embedding',
          'bert.embeddings.position_embeddings.weight', IDENTITY, ENCODER),
    Entry('embeddings/token_type_embeddings/embedding',
          'bert.embeddings.token_type_embeddings.weight', IDENTITY, ENCODER),
    Entry('embeddings/layer_norm/scale', 'bert.embeddings.LayerNorm.weight', IDENTITY, ENCODER),
    Entry('embeddings/layer_norm/bias', 'bert.embeddings.LayerNorm.bias', IDENTITY, ENCODER),
    _layer('query/kernel', 'attention.self.query.weight', QKV_KERNEL),
    _layer('query/bias', 'attention.self.query.bias', QKV_BIAS),
    _layer('key/kernel', 'attention.self.key.weight', QKV_KERNEL),
    _layer('key/bias', 'attention.self.key.bias', QKV_BIAS),
    _layer('value/kernel', 'attention.self.value.weight', QKV_KERNEL),
    _layer('value/bias', 'attention.self.value.bias', QKV_BIAS),
    _layer('attention_output/kernel', 'attention.output.dense.weight', ATTENTION_OUT_KERNEL),
    _layer('attention_output/bias', 'attention.output.dense.bias', IDENTITY),
    _layer('attention_layer_norm/scale', 'attention.output.LayerNorm.weight', IDENTITY),
    _layer('attention_layer_norm/bias', 'attention.output.LayerNorm.bias', IDENTITY),
    _layer('intermediate/kernel', 'intermediate.dense.weight', LINEAR),
    _layer('intermediate/bias', 'intermediate.dense.bias', IDENTITY),
    _layer('output/kernel', 'output.dense.weight', LINEAR),
    _layer('output/bias', 'output.dense.bias', IDENTITY),
    _layer('output_layer_norm/scale', 'output.LayerNorm.weight', IDENTITY),
    _layer('output_layer_norm/bias', 'output.LayerNorm.bias', IDENTITY),
    Entry('pooler/kernel', 'bert.pooler.dense.weight', LINEAR, POOLER),
    Entry('pooler/bias', 'bert.pooler.dense.bias', IDENTITY, POOLER),
    Entry('mlm_head/transform/kernel', 'cls.predictions.transform.dense.weight', LINEAR,
          MLM_HEAD),
    Entry('mlm_head/transform/bias', 'cls.predictions.transform.dense.bias', IDENTITY, MLM_HEAD),
    Entry('mlm_head/layer_norm/scale', 'cls.predictions.transform.LayerNorm.weight', IDENTITY,
          MLM_HEAD),
    Entry('mlm_head/layer_norm/bias', 'cls.predictions.transform.LayerNorm.bias', IDENTITY,
          MLM_HEAD),
    Entry('mlm_head/output_bias', 'cls.predictions.bias', IDENTITY, MLM_HEAD),
    Entry('pair_head/kernel', 'cls.seq_relationship.weight', LINEAR, PAIR_HEAD),
    Entry('pair_head/bias', 'cls.seq_relationship.bias', IDENTITY, PAIR_HEAD),
)

# HF keys that are aliases of a tensor in PARAMS (tied, or buffers): never imported.
TIED = {
    'cls.predictions.decoder.weight': 'bert.embeddings.word_embeddings.weight',
    'cls.predictions.decoder.bias': 'cls.predictions.bias',
}
BUFFERS = ('bert.embeddings.position_ids',)

# (our BertConfig field, HF BertConfig field). Other fields of ours (attention_kind,
# dtype, remat) have no HF counterpart and keep their defaults on import.
CONFIG_FIELDS: tuple[tuple[str, str], ...] = (
    ('vocab_size', 'vocab_size'),
    ('hidden_size', 'hidden_size'),
    ('num_layers', 'num_hidden_layers'),
    ('num_heads', 'num_attention_heads'),
    ('intermediate_size', 'intermediate_size'),
    ('max_position_embeddings', 'max_position_embeddings'),
    ('type_vocab_size', 'type_vocab_size'),
    ('hidden_dropout_rate', 'hidden_dropout_prob'),
    ('attention_dropout_rate', 'attention_probs_dropout_prob'),
    ('layer_norm_eps', 'layer_norm_eps'),
    ('initializer_range', 'initializer_range'),
)
# HF fields whose value must be exactly this for our architecture to compute the same thing
# (a missing field takes HF's default, which is this value).
REQUIRED_HF_VALUES = {'hidden_act': 'gelu', 'position_embedding_type': 'absolute'}
