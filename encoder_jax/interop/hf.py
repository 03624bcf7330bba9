"""Hugging Face checkpoints <-> our parameters (import and export), for every model kind.

Import reads ``config.json`` plus ``model.safetensors`` (or a sharded
``model.safetensors.index.json``, or ``pytorch_model.bin``); ``model_type`` picks the
kind's table (``interop.registry.hf_spec_for_model_type``): BERT
(``BertForPreTraining``/``BertForMaskedLM``/``BertModel``), RoBERTa
(``RobertaForMaskedLM``/``RobertaModel``), ALBERT (``AlbertForPreTraining``/
``AlbertForMaskedLM``/``AlbertModel``), ELECTRA (``ElectraForPreTraining``/``ElectraModel``:
the discriminator; ``ElectraForMaskedLM``: the generator; where kinds share a
``model_type``, the first of ``architectures`` picks). Heads the checkpoint lacks keep a fresh
initialisation and are listed in the :class:`ImportReport`. Export writes what the
kind's first architecture's ``save_pretrained`` writes, so ``from_pretrained`` reports no
missing or unexpected keys. Every name and layout comes from the kind's ``HfSpec``.

Params here are the *unboxed* ``'params'`` collection of the kind's pretraining network
(a nested dict of arrays, no ``{'params': ...}`` wrapper).
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import flax.linen as nn
import jax
import numpy as np

from encoder_jax.core import extras
from encoder_jax.loading import loaded as loading
from encoder_jax.interop import registry
from encoder_jax.interop import hf_table
from encoder_jax.models import config as config_lib

Params = dict[str, Any]

SAFETENSORS = 'model.safetensors'
SAFETENSORS_INDEX = 'model.safetensors.index.json'
PYTORCH_BIN = 'pytorch_model.bin'


# ---------------------------------------------------------------------------- config


def read_hf_config(hf_dir: str) -> dict[str, Any]:
  path = os.path.join(hf_dir, 'config.json')
  if not os.path.isdir(hf_dir):
    raise FileNotFoundError(f'Hugging Face checkpoint directory {hf_dir!r} does not exist')
  if not os.path.exists(path):
    raise FileNotFoundError(f'{path} not found; expected a Hugging Face checkpoint directory '
                            f'with config.json and {SAFETENSORS} or {PYTORCH_BIN}')
  with open(path) as f:
    return json.load(f)


def config_from_hf(hf_config: Mapping[str, Any], source: str = 'config.json',
                   **overrides) -> config_lib.EncoderConfig:
  """Our EncoderConfig for an HF config; anything we would compute differently is an error."""
  spec = registry.hf_spec_for_model_type(hf_config.get('model_type'), source,
                                         tuple(hf_config.get('architectures') or ()))
  for key, expected in spec.required_hf_values.items():
    value = hf_config.get(key, expected)
    if value != expected:
      raise ValueError(f'{source}: {key}={value!r} is not supported; expected {expected!r} '
                       f'(our {spec.kind} computes exactly {key}={expected!r}).')
  missing = [hf for _, hf in spec.config_fields if hf not in hf_config]
  if missing:
    raise ValueError(f'{source}: missing fields {missing}; expected a {spec.model_type} '
                     'config.json')
  fields = {ours: hf_config[hf] for ours, hf in spec.config_fields}
  try:
    fields.update(spec.config_from_hf(hf_config))
  except ValueError as e:
    raise ValueError(f'{source}: {e}') from e
  fields.update(overrides)
  try:
    return registry.make_config(dict(fields, kind=spec.kind))
  except ValueError as e:
    raise ValueError(f'{source}: {e}') from e


def _check_exportable(spec: hf_table.HfSpec, config: config_lib.EncoderConfig) -> None:
  """Refuses a config the kind's HF architecture cannot represent: the table's own check,
  and any shared block option (pre-LN, GLU, bias-free) the architecture does not have,
  naming the nearest configuration that exports one (:func:`exporting_alternatives`)."""
  for f in config_lib.BLOCK_OPTIONS:
    value = getattr(config, f.name)
    if f.name not in spec.block_options and value != f.default:
      others = exporting_alternatives(spec.kind, f.name, value)
      nearest = (f'; the nearest configuration that exports: {" or ".join(others)}' if others
                 else '; such a checkpoint stays an encoder_jax workdir')
      raise ValueError(f'config.model.{f.name}={value!r} has no Hugging Face '
                       f'{spec.export_architecture} equivalent (expected {f.default!r})'
                       + nearest)
  spec.check_exportable(config)


def exporting_alternatives(kind: str, option: str, value) -> list[str]:
  """The kinds other than ``kind`` whose Hugging Face class computes block option
  ``option`` at ``value``, each with the options it requires and its example config."""
  out = []
  for other in registry.HF_SPECS.values():
    requires = registry.KINDS[other.kind].requires
    if (other.kind == kind or option not in other.block_options
        or requires.get(option, value) != value):
      continue
    defaults = {f.name: f.default for f in config_lib.BLOCK_OPTIONS}
    implied = [f'{k}={v!r}' for k, v in requires.items() if k in defaults and v != defaults[k]]
    where = f' ({other.example_config})' if other.example_config else ''
    out.append(f"kind={other.kind!r} with {', '.join(implied)}{where}, computed by "
               f'{other.export_architecture}')
  return out


def hf_config_from(config: config_lib.EncoderConfig, pad_token_id: int = 0) -> dict[str, Any]:
  """An HF config dict for the kind's export architecture with our config."""
  spec = registry.hf_spec(config.kind)
  _check_exportable(spec, config)
  out = {hf: getattr(config, ours) for ours, hf in spec.config_fields}
  out.update(spec.required_hf_values)
  out.update(spec.config_to_hf(config, pad_token_id))
  out.update(architectures=[spec.export_architecture], model_type=spec.model_type,
             dtype='float32')
  return out


# ------------------------------------------------------------------------ state dict


def _to_numpy_f32(x) -> np.ndarray:
  if hasattr(x, 'detach'):  # torch.Tensor (any dtype, bf16 included).
    return x.detach().float().cpu().numpy()
  return np.asarray(x, dtype=np.float32)


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  out = {}
  try:
    with safe_open(path, framework='numpy') as f:
      for k in f.keys():
        out[k] = _to_numpy_f32(f.get_tensor(k))
  except (TypeError, ValueError):  # bfloat16 has no numpy dtype: read through flax/jax.
    with safe_open(path, framework='flax') as f:
      for k in f.keys():
        out[k] = _to_numpy_f32(f.get_tensor(k))
  return out


def read_state_dict(hf_dir: str) -> dict[str, np.ndarray]:
  """The checkpoint's tensors (float32 numpy), whichever of the HF file layouts it uses."""
  if os.path.exists(os.path.join(hf_dir, SAFETENSORS)):
    return _read_safetensors(os.path.join(hf_dir, SAFETENSORS))
  index = os.path.join(hf_dir, SAFETENSORS_INDEX)
  if os.path.exists(index):
    with open(index) as f:
      shards = sorted(set(json.load(f)['weight_map'].values()))
    out = {}
    for shard in shards:
      out.update(_read_safetensors(os.path.join(hf_dir, shard)))
    return out
  if os.path.exists(os.path.join(hf_dir, PYTORCH_BIN)):
    torch = extras.require('torch', extra='peers', what=f'{hf_dir}/{PYTORCH_BIN} needs torch to '
                           f'read (or convert the checkpoint to {SAFETENSORS})')
    state = torch.load(os.path.join(hf_dir, PYTORCH_BIN), map_location='cpu', weights_only=True)
    return {k: _to_numpy_f32(v) for k, v in state.items()}
  raise FileNotFoundError(f'{hf_dir}: no {SAFETENSORS}, {SAFETENSORS_INDEX} or {PYTORCH_BIN}; '
                          'expected the weights of a Hugging Face BERT checkpoint')


def normalise_keys(state: Mapping[str, np.ndarray], spec: hf_table.HfSpec
                   ) -> dict[str, np.ndarray]:
  """HF key spellings -> the ones in the kind's table.

  A bare base model (``BertModel``) saves without the ``bert.`` prefix; old (TF-converted)
  checkpoints name LayerNorm parameters ``gamma``/``beta``; a tied alias present in the
  file stands in for its source when the source is missing.
  """
  out = {}
  for key, value in state.items():
    if not key.startswith(spec.base_prefix) and key.split('.')[0] in spec.base_parts:
      key = spec.base_prefix + key
    for old, new in spec.key_renames:
      key = key.replace(old, new)
    out[key] = value
  for alias, source in spec.tied.items():
    if source not in out and alias in out and not source.startswith(spec.base_prefix):
      out[source] = out[alias]
  return out


# ---------------------------------------------------------------------------- params


def _get(tree: Params, path: str):
  for part in path.split('/'):
    tree = tree[part]
  return tree


def _set(tree: Params, path: str, value) -> None:
  *parents, leaf = path.split('/')
  for part in parents:
    tree = tree.setdefault(part, {})
  tree[leaf] = value


_hf_keys = hf_table.hf_keys


def _init_fn(config: config_lib.EncoderConfig):
  net = registry.network(config)
  return lambda rng: nn.unbox(net.init(rng))


def init_params(config: config_lib.EncoderConfig, seed: int = 0) -> Params:
  """Freshly initialised (unboxed) params of the kind's pretraining network, as numpy."""
  return jax.tree.map(np.asarray, jax.jit(_init_fn(config))(jax.random.PRNGKey(seed)))


def abstract_params(config: config_lib.EncoderConfig) -> Params:
  """The shapes of :func:`init_params` (nothing is computed)."""
  return jax.eval_shape(_init_fn(config), jax.random.PRNGKey(0))


def params_from_hf(state: Mapping[str, np.ndarray], config: config_lib.EncoderConfig,
                   seed: int = 0,
                   source: str = 'checkpoint',
                   architectures: tuple[str, ...] = ()) -> tuple[Params, loading.ImportReport]:
  """Our params from an (already normalised) HF state dict.

  Heads the checkpoint does not have get a fresh initialisation from ``seed``.
  """
  spec = registry.hf_spec(config.kind)
  _check_exportable(spec, config)  # A layout the table cannot represent cannot be imported.
  try:
    state = dict(spec.state_from_hf(dict(state), config))
  except ValueError as e:
    raise ValueError(f'{source}: {e}') from e
  report = loading.ImportReport(source, architectures)
  used = set(spec.buffers) & set(state)
  by_group: dict[str, list[hf_table.Entry]] = {g: [] for g in spec.groups}
  for entry in spec.entries(config):
    by_group[entry.group].append(entry)
  by_group = {g: entries for g, entries in by_group.items() if entries}
  fresh = abstract_params(config)
  for group, entries in by_group.items():
    keys = [k for e in entries for k in _hf_keys(e, config)]
    if group != spec.groups[0] and not any(k in state for k in keys):
      report.initialised_groups.append(group)
  # Only a checkpoint without some head pays for running the initialisers.
  params = init_params(config, seed) if report.initialised_groups else jax.tree.map(
      lambda x: None, fresh)
  for group, entries in by_group.items():
    if group in report.initialised_groups:
      continue
    keys = [k for e in entries for k in _hf_keys(e, config)]
    absent = [k for k in keys if k not in state]
    if absent:
      raise ValueError(f'{source}: the {group!r} parameters are incomplete; missing '
                       f'{absent[:5]}{" ..." if len(absent) > 5 else ""}; '
                       f'expected a {spec.model_type} checkpoint with '
                       f'num_hidden_layers={config.num_layers}')
    for entry in entries:
      expected_shape = _get(fresh, entry.ours).shape
      per_key = []
      for key in _hf_keys(entry, config):
        try:
          per_key.append(entry.transform.to_ours(state[key], config))
        except ValueError as e:
          raise ValueError(f'{source}: tensor {key} has shape {state[key].shape}, which does '
                           f'not fit {entry.ours} {expected_shape} for {config}') from e
        used.add(key)
      if entry.per_layer and len(per_key) < config.num_layers:  # Unused first slots.
        unused = np.full(expected_shape[1:], entry.unused_value, np.float32)
        per_key = [unused] * (config.num_layers - len(per_key)) + per_key
      value = np.stack(per_key) if entry.per_layer else per_key[0]
      if value.shape != expected_shape:
        raise ValueError(f'{source}: {entry.hf} gives {entry.ours} shape {value.shape}; '
                         f'expected {expected_shape} from config.json')
      _set(params, entry.ours, value.astype(np.float32))
  for tied, target in spec.tied.items():
    if tied in state:
      used.add(tied)
      if not np.array_equal(state[tied], state.get(target, state[tied])):
        raise ValueError(f'{source}: {tied} differs from {target}; untied MLM decoders are not '
                         'supported (our decoder is the word embedding and its bias)')
  report.ignored_keys = sorted(set(state) - used)
  # Layer tensors of layers beyond num_hidden_layers would be silently ignored: refuse.
  extra_layers = [k for k in report.ignored_keys
                  if k.startswith(f'{spec.layer_prefix}{config.num_layers}.')]
  if extra_layers:
    raise ValueError(f'{source}: has tensors for layer {config.num_layers} ({extra_layers[0]}) '
                     f'but config.json says num_hidden_layers={config.num_layers}')
  return params, report


def params_to_hf(params: Params, config: config_lib.EncoderConfig) -> dict[str, np.ndarray]:
  """The HF state dict of the kind's export architecture (tied keys left out, as
  ``save_pretrained`` does)."""
  spec = registry.hf_spec(config.kind)
  _check_exportable(spec, config)
  out = {}
  for entry in spec.entries(config):
    if entry.hf is None:  # No place in the HF architecture (see hf_table.Entry).
      continue
    value = np.asarray(_get(params, entry.ours), dtype=np.float32)
    if entry.per_layer:
      if value.shape[0] != config.num_layers:
        raise ValueError(f'{entry.ours} has {value.shape[0]} layers; config.model.num_layers='
                         f'{config.num_layers}')
      for i in entry.layers(config):
        out[entry.hf.format(i=i)] = entry.transform.to_hf(value[i], config)
    else:
      out[entry.hf] = entry.transform.to_hf(value, config)
  out = spec.state_to_hf(out, config)
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


# ------------------------------------------------------------------------ directories


def load_hf(hf_dir: str, seed: int = 0, **config_overrides
            ) -> tuple[config_lib.EncoderConfig, Params, loading.ImportReport]:
  """Reads an HF checkpoint directory of any known kind: (our config, params, what was done)."""
  hf_config = read_hf_config(hf_dir)
  source = os.path.join(hf_dir, 'config.json')
  config = config_from_hf(hf_config, source, **config_overrides)
  state = normalise_keys(read_state_dict(hf_dir), registry.hf_spec(config.kind))
  return (config, *params_from_hf(state, config, seed, source=hf_dir,
                                  architectures=tuple(hf_config.get('architectures') or ())))


def save_hf(out_dir: str, config: config_lib.EncoderConfig, params: Params,
            pad_token_id: int = 0) -> None:
  """Writes ``config.json`` + ``model.safetensors`` for the kind's export architecture
  (``BertForPreTraining``, ``RobertaForMaskedLM``, ``AlbertForPreTraining``)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  # Both are built (and checked, e.g. RoBERTa's pad id) before anything is written, so a
  # refused export leaves no weights without a config.json behind.
  hf_config = hf_config_from(config, pad_token_id)
  state = params_to_hf(jax.tree.map(np.asarray, jax.device_get(params)), config)
  os.makedirs(out_dir, exist_ok=True)
  save_file(state, os.path.join(out_dir, SAFETENSORS), metadata={'format': 'pt'})
  with open(os.path.join(out_dir, 'config.json'), 'w') as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
