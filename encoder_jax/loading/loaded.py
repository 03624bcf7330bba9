"""Loading a checkpoint for use: a workdir's config, tokenizer and params, as ``Loaded``.

The layer below the tools (``evaluate``, ``fill_mask``, ``embed``, fine-tuning, ``convert``)
and above what it reads with (``checkpointing``, ``train_state``, ``objectives``): it never
imports the training loop, the input pipeline or a tool. A workdir's checkpoint is restored
onto *this* machine's devices, whatever wrote it; its tokenizer is the one pinned in the
workdir (:func:`tokenizer_for_workdir`). A Hugging Face directory loads through
``interop.hf_import`` (above this layer) into the same :class:`Loaded`;
``encoder_jax.load`` picks between the two.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging as std_logging
import os
import re
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from encoder_jax.run import checkpointing
from encoder_jax.config import schema as config_base
from encoder_jax.loading import inference
from encoder_jax import objectives
from encoder_jax.core import sharding
from encoder_jax.run import train_state
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.data import tokenizer as tokenizer_lib
from encoder_jax.models import config as model_config_lib

CONFIG_JSON = workdir_lib.CONFIG_JSON
IMPORT_REPORT = workdir_lib.IMPORT_REPORT  # For people: what the import initialised or ignored.
IMPORT_REPORT_JSON = workdir_lib.IMPORT_REPORT_JSON  # For tools (read back by load_workdir).
# How sentence-transformers uses the model (max_seq_length, pooling, normalize), read from
# an imported directory's sentence_bert_config.json / modules.json / 1_Pooling/config.json:
# encoder_jax.embed's defaults.
SENTENCE_SETTINGS = 'sentence_transformers.json'
IMPORTED_STEP = 0  # The step of the checkpoint import_hf_to_workdir writes.


@dataclasses.dataclass
class ImportReport:
  """What an import did besides copying tensors."""
  source: str
  architectures: tuple[str, ...]
  initialised_groups: list[str] = dataclasses.field(default_factory=list)  # Fresh init.
  ignored_keys: list[str] = dataclasses.field(default_factory=list)  # HF tensors not used.

  def summary(self) -> str:
    lines = [f'Imported {self.source} (architectures={list(self.architectures)}).']
    if self.initialised_groups:
      lines.append('Not in the checkpoint, freshly initialised: '
                   + ', '.join(self.initialised_groups) + '.')
    else:
      lines.append('Every parameter was found in the checkpoint.')
    if self.ignored_keys:
      lines.append(f'Ignored {len(self.ignored_keys)} checkpoint tensors: '
                   + ', '.join(self.ignored_keys[:10])
                   + (' ...' if len(self.ignored_keys) > 10 else ''))
    return '\n'.join(lines)


def _as_batch(ids, mask=None, segments=None):
  """int32 [B, L] arrays from a row or rows of ids; mask defaults to all ones."""
  ids = np.asarray(ids, np.int32)
  if ids.ndim == 1:
    ids = ids[None]
  mask = np.ones_like(ids) if mask is None else np.asarray(mask, np.int32).reshape(ids.shape)
  segments = (np.zeros_like(ids) if segments is None
              else np.asarray(segments, np.int32).reshape(ids.shape))
  return ids, mask, segments


@dataclasses.dataclass
class Loaded:
  """A checkpoint ready for use: config, tokenizer, params and what to compute with them.

  ``params`` is the whole pretraining params tree (every network of the objective);
  ``network`` / ``encoder_params`` are the network downstream uses take (the encoder for
  BERT, RoBERTa, ALBERT; ELECTRA's discriminator) and its params.
  """
  model_config: model_config_lib.EncoderConfig  # The downstream network's config.
  params: Any  # Unboxed 'params' of what pretraining trains (objectives.build(config).init).
  tokenizer: Any  # encoder_jax.data.tokenizer.Tokenizer
  source: str  # Human-readable: where the weights came from.
  step: int | None = None  # Checkpoint step (None for an HF directory).
  run_config: ml_collections.ConfigDict | None = None  # The workdir's config (or one made).
  mesh: jax.sharding.Mesh | None = None  # Where ``params`` live.
  report: ImportReport | None = None  # HF directory or imported workdir: heads initialised.
  trainable: Any = None  # What run_config's pretraining trains (objectives.build).
  # sentence-transformers' settings of the model (see ``read_sentence_settings``), or None.
  sentence_settings: dict | None = None
  _warned_untrained_mlm: bool = dataclasses.field(default=False, repr=False, compare=False)

  @property
  def config(self) -> ml_collections.ConfigDict | None:
    return self.run_config

  @property
  def kind(self) -> str:
    return self.model_config.kind

  @property
  def network(self):
    return self.trainable.downstream(self.params)[0]

  @property
  def encoder_params(self):
    return self.trainable.downstream(self.params)[1]

  def hidden_states(self, input_ids, input_mask=None, segment_ids=None, *,
                    all_layers: bool = False) -> np.ndarray | tuple[np.ndarray, ...]:
    """Final hidden states float32 [B, L, H] (or the embedding output and every layer's)."""
    ids, mask, seg = _as_batch(input_ids, input_mask, segment_ids)
    out = _encoder_apply(self.encoder_params, ids, seg, mask, network=self.network,
                         collect_hidden=all_layers)
    if all_layers:
      return tuple(np.asarray(x, np.float32) for x in out['all_hidden_states'])
    return np.asarray(out['sequence_output'], np.float32)

  def pooled(self, input_ids, input_mask=None, segment_ids=None) -> np.ndarray:
    """The tanh pooler's output on the first token [B, H] (kinds with a pooler)."""
    if not self.network.kind.pooler:
      raise ValueError(f'model kind {self.kind!r} has no pooler; use embed(..., pooling=...) '
                       'or hidden_states')
    ids, mask, seg = _as_batch(input_ids, input_mask, segment_ids)
    out = _encoder_apply(self.encoder_params, ids, seg, mask, network=self.network,
                         collect_hidden=False)
    return np.asarray(out['pooled_output'], np.float32)

  def mlm_logits(self, input_ids, input_mask=None, segment_ids=None, positions=None
                 ) -> np.ndarray:
    """float32 [B, P, vocab] MLM logits at ``positions`` [B, P] (default: every position)."""
    ids, mask, seg = _as_batch(input_ids, input_mask, segment_ids)
    if positions is None:
      positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
    positions = np.asarray(positions, np.int32).reshape(ids.shape[0], -1)
    network, params = self.trainable.masked_lm(self.params)
    return np.asarray(_mlm_apply(params, ids, seg, mask, positions, network=network))

  def encode(self, texts: list[str], pairs: list[str] | None = None,
             max_len: int | None = None) -> dict[str, np.ndarray]:
    """The model inputs of ``texts`` (and second texts ``pairs``) as ``AutoTokenizer`` gives
    them (the tokenizer's specials, longest-first truncation at ``max_len``, padding on its
    side): int32 ``input_ids``, ``segment_ids``, ``input_mask`` [N, L], the keyword
    arguments of :meth:`hidden_states`, :meth:`mlm_logits` and :meth:`pooled`."""
    inputs = self.tokenizer.encode_inputs(list(texts), None if pairs is None else list(pairs),
                                          min(max_len or self.max_length, self.max_length))
    inputs.pop('truncated')
    return inputs

  def embed(self, texts: list[str], *, pooling: str | None = None, normalize: bool = True,
            max_len: int | None = None, batch_size: int = 32) -> np.ndarray:
    """float32 [N, H] sentence embeddings, one row per text (see ``encoder_jax.embed``).

    ``pooling`` and ``max_len`` default to the model's: ``default_pooling``, ``default_max_len``.
    """
    return inference.embed_sentences(self.encoder_params, self.model_config, self.tokenizer,
                                 list(texts), pooling=pooling or self.default_pooling,
                                 normalize=normalize, batch_size=batch_size,
                                 max_len=max_len or self.default_max_len)

  def fill_mask(self, text: str, top_k: int = 5, warn: bool = True
                ) -> list[list[tuple[str, float]]]:
    """For each mask in ``text`` in order: [(piece, probability)] best first.

    Logs a warning (once, unless ``warn=False``) when the MLM head is the random one an
    import initialised (``untrained_heads``).
    """
    if warn and 'mlm_head' in self.untrained_heads and not self._warned_untrained_mlm:
      self._warned_untrained_mlm = True
      logging.warning('%s', self.untrained_mlm_warning())
    network, params = self.trainable.masked_lm(self.params)
    return inference.fill_mask(params, network.config, self.tokenizer, text, top_k)

  @property
  def max_length(self) -> int:
    """The longest input the model takes (tokens, specials included)."""
    return self.model_config.max_length

  @property
  def default_max_len(self) -> int:
    """Tokens per embedded sentence by default: sentence-transformers' ``max_seq_length``
    when the model came with one (as sentence-transformers truncates), else ``max_length``."""
    wanted = (self.sentence_settings or {}).get('max_seq_length')
    return min(int(wanted), self.max_length) if wanted else self.max_length

  @property
  def default_pooling(self) -> str:
    """'mean' or 'cls': sentence-transformers' pooling when it is one of these, else 'mean'."""
    pooling = (self.sentence_settings or {}).get('pooling')
    return pooling if pooling in inference.POOLINGS else 'mean'

  @property
  def untrained_heads(self) -> list[str]:
    """Parameter groups still as the import initialised them (random), e.g. ['mlm_head'].

    An HF directory's missing heads; for a workdir, those of its import while the loaded
    checkpoint is the imported step (continued pretraining trains them).
    """
    if self.report is None or self.step not in (None, IMPORTED_STEP):
      return []
    return list(self.report.initialised_groups)

  def untrained_mlm_warning(self) -> str:
    where = (f'{self.source}: imported from {self.report.source}, whose' if self.step is not None
             else f'{self.source}: its')
    return (f'{where} checkpoint ({", ".join(self.report.architectures) or "no architectures"}) '
            'has no MLM head; the head was freshly initialised at import, so these predictions '
            'are random. Use a checkpoint with an MLM head (e.g. *ForMaskedLM / '
            '*ForPreTraining) or pretrain the imported workdir first.')


@functools.partial(jax.jit, static_argnames=('network', 'collect_hidden'))
def _encoder_apply(params, ids, segments, mask, *, network, collect_hidden):
  return network.encoder.apply({'params': params}, ids, segments, mask,
                               collect_hidden=collect_hidden)


@functools.partial(jax.jit, static_argnames=('network',))
def _mlm_apply(params, ids, segments, mask, positions, *, network):
  return network.pretraining.apply({'params': params}, ids, segments, mask,
                                   positions)['mlm_logits']


# --------------------------------------------------------------------------- configs


def _merge(schema: ml_collections.ConfigDict, values: dict, where: str) -> None:
  for key, value in values.items():
    if key not in schema:
      raise ValueError(f'{where}: unknown key {key!r}; expected one of {sorted(schema.keys())}')
    if isinstance(schema[key], ml_collections.ConfigDict):
      _merge(schema[key], value, f'{where}.{key}')
    elif isinstance(schema[key], tuple) and isinstance(value, list):
      schema[key] = tuple(value)
    else:
      schema[key] = value


def read_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run wrote to ``<workdir>/config.json``, on top of the current schema."""
  path = workdir_lib.path(workdir, CONFIG_JSON)
  if not workdir_lib.path(workdir).is_dir():
    raise FileNotFoundError(f'workdir {workdir!r} does not exist')
  if not path.exists():
    raise FileNotFoundError(f'{path} not found: not a workdir written by encoder_jax.main or '
                            'encoder_jax.convert (pass --config explicitly)')
  values = json.loads(path.read_text())
  config = config_base.base_config()
  _merge(config, values, str(path))
  return config


def write_run_config(config: ml_collections.ConfigDict, workdir: str) -> str:
  workdir_lib.write_config(workdir, config)
  return str(workdir_lib.path(workdir, CONFIG_JSON))


# ------------------------------------------------------------------------- tokenizer


def no_pinned_tokenizer_message(workdir: str) -> str:
  info = workdir_lib.path(workdir, workdir_lib.TOKENIZER_DIR, workdir_lib.TOKENIZER_INFO)
  return (f'{workdir} has no pinned tokenizer ({info} does not exist: its checkpoints were '
          'copied without their tokenizer/?) and its config has no tokenizer.path, so the '
          'ids its checkpoints were trained on are unknown. Pin the tokenizer the run trained '
          'with (the tokenizer.model, vocab.txt or tokenizer.json in the prepared-data '
          'directory it used): '
          f'python -m encoder_jax.convert pin_tokenizer --workdir={workdir} '
          '--tokenizer=PREPARED_DIR/tokenizer.model')


def tokenizer_for_workdir(workdir: str, config: ml_collections.ConfigDict):
  """The tokenizer a workdir's checkpoints were trained with.

  The pinned one (``<workdir>/tokenizer/``); for a workdir without one (checkpoints copied
  without their ``tokenizer/``),
  ``config.tokenizer.path`` if set (with a warning: it cannot be checked); else a clear
  error. A corpus is never prepared here.
  """
  if workdir_lib.has_pinned_tokenizer(workdir):
    tok = workdir_lib.load_tokenizer(workdir)[0]
  elif config.tokenizer.path:
    t = config.tokenizer
    if not os.path.exists(t.path):
      raise FileNotFoundError(f'{workdir} has no pinned tokenizer and config.tokenizer.path='
                              f'{t.path!r} does not exist')
    logging.warning('%s has no pinned tokenizer: using config.tokenizer.path=%s, '
                    'which cannot be checked against the one the run trained with.', workdir,
                    t.path)
    tok = tokenizer_lib.Tokenizer.from_file(t.kind, t.path, bool(t.lowercase))
  else:
    raise FileNotFoundError(no_pinned_tokenizer_message(workdir))
  if not tok.fits(int(config.model.vocab_size)):
    raise ValueError(f'The tokenizer of {workdir} ({tok.path}) has {tok.vocab_size} pieces but '
                     f'config.model.vocab_size={config.model.vocab_size}: the checkpoint was '
                     'not trained with it')
  return tok


# ------------------------------------------------------------------------- restoring


def local_mesh(config: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  """``config.mesh`` over the devices here, or pure data parallelism if it does not fit.

  A checkpoint written on a TPU pod with fsdp=64 must still load on one CPU.
  """
  devices = jax.devices()
  try:
    return sharding.make_mesh(config.mesh, devices)
  except ValueError as e:
    logging.warning('config.mesh does not fit the %d local devices (%s); using data=%d.',
                    len(devices), e, len(devices))
    return sharding.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1)),
                              devices)


# The abstract params of the last few (config, mesh) pairs: a workdir loaded again in this
# process (loaded, then exported or evaluated; one checkpoint after another) does not trace
# its trainable's init again. Shapes, dtypes and shardings only: nothing large is kept.
_ABSTRACT: collections.OrderedDict = collections.OrderedDict()
_ABSTRACT_KEPT = 8


def abstract_params(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh):
  """ShapeDtypeStructs (with shardings on ``mesh``) of the params the config describes."""
  key = (config.to_json_best_effort(sort_keys=True), mesh)
  if key not in _ABSTRACT:
    _ABSTRACT[key] = train_state.abstract_params(config, mesh)
    while len(_ABSTRACT) > _ABSTRACT_KEPT:
      _ABSTRACT.popitem(last=False)
  _ABSTRACT.move_to_end(key)
  return _ABSTRACT[key]


def _checkpoint_shapes(workdir: str, step: int) -> dict[str, tuple[int, ...]] | None:
  """'/'-joined param path -> shape, from the checkpoint's metadata (None if unreadable)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  directory = checkpointing.checkpoint_dir(workdir)
  manager = ocp.CheckpointManager(directory, item_names=('params',),
                                  item_handlers={'params': ocp.StandardCheckpointHandler()})
  try:
    tree = manager.item_metadata(step)['params']
    tree = getattr(tree, 'tree', tree)
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, 'shape'))[0]
    return {_keystr(p): tuple(m.shape) for p, m in flat}
  except Exception as e:  # pylint: disable=broad-except
    logging.info('Could not read the metadata of step %d in %s (%s); relying on the restore '
                 'checks.', step, directory, e)
    return None
  finally:
    manager.close()


def _keystr(path) -> str:
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', k))) for k in path)


def check_shapes(config: ml_collections.ConfigDict, workdir: str, step: int, abstract) -> None:
  """A config of another model shape than the checkpoint's is a clear error, before restoring."""
  saved = _checkpoint_shapes(workdir, step)
  if saved is None:
    return
  wanted = {_keystr(p): tuple(a.shape)
            for p, a in jax.tree_util.tree_flatten_with_path(abstract)[0]}
  problems = [f'{k}: checkpoint {saved.get(k)}, config {v}' for k, v in wanted.items()
              if saved.get(k) != v]
  problems += [f'{k}: in the checkpoint, not in the config' for k in saved if k not in wanted]
  if problems:
    m = config.model
    raise checkpointing.CheckpointError(
        f'The config does not match checkpoint step {step} in {workdir}: '
        + '; '.join(problems[:6]) + (' ...' if len(problems) > 6 else '')
        + f'. The config says kind={m.kind}, vocab_size={m.vocab_size}, hidden_size='
        f'{m.hidden_size}, num_layers={m.num_layers}, num_heads={m.num_heads}, '
        f'intermediate_size={m.intermediate_size}, max_position_embeddings='
        f'{m.max_position_embeddings}, objective.names={tuple(config.objective.names)}.')


def restore_params(config: ml_collections.ConfigDict, workdir: str, step: int | None = None,
                   mesh: jax.sharding.Mesh | None = None):
  """(params, step, mesh): a checkpoint's params, sharded over this machine's devices."""
  step = checkpointing.resolve_step(workdir, step)
  mesh = mesh or local_mesh(config)
  abstract = abstract_params(config, mesh)
  targets = (logging.get_absl_logger(), std_logging.getLogger())
  for target in targets:  # Orbax notes that the optimizer state was left out, on purpose.
    target.addFilter(not_orbax_chatter)
  try:
    check_shapes(config, workdir, step, abstract)
    params, step = checkpointing.restore_params(workdir, abstract, step)
  finally:
    for target in targets:
      target.removeFilter(not_orbax_chatter)
  return params, step, mesh


def load_workdir(workdir: str, config: ml_collections.ConfigDict | None = None,
                 step: int | None = None, mesh=None, with_tokenizer: bool = True) -> Loaded:
  """A workdir's checkpoint and the tokenizer pinned in it (see ``tokenizer.for_workdir``)."""
  config = config if config is not None else read_run_config(workdir)
  # Cheap checks first: the checkpoint, then the tokenizer.
  step = checkpointing.resolve_step(workdir, step)
  tok = tokenizer_for_workdir(workdir, config) if with_tokenizer else None
  params, step, mesh = restore_params(config, workdir, step, mesh)
  trainable = objectives.build(config)
  return Loaded(trainable.downstream(params)[0].config, params, tok, f'{workdir} step {step}', step,
                config, mesh, trainable=trainable, report=read_import_report(workdir),
                sentence_settings=read_workdir_sentence_settings(workdir))


# ----------------------------------------------------- import report, sentence settings


def read_import_report(workdir: str) -> ImportReport | None:
  """The ImportReport ``import_hf_to_workdir`` left in ``workdir`` (None: not an import).

  ``import_report.json`` when present; a workdir imported before it existed has only the
  text, whose 'freshly initialised:' line is read back.
  """
  as_json = workdir_lib.path(workdir, IMPORT_REPORT_JSON)
  if as_json.exists():
    raw = json.loads(as_json.read_text())
    return ImportReport(source=raw.get('source', ''),
                           architectures=tuple(raw.get('architectures', ())),
                           initialised_groups=list(raw.get('initialised_groups', [])),
                           ignored_keys=list(raw.get('ignored_keys', [])))
  as_text = workdir_lib.path(workdir, IMPORT_REPORT)
  if not as_text.exists():
    return None
  text = as_text.read_text()
  source = re.search(r'^Imported (.*?) \(architectures=\[(.*?)\]\)', text, re.M)
  fresh = re.search(r'freshly initialised: (.*?)\.?$', text, re.M)
  return ImportReport(
      source=source[1] if source else '?',
      architectures=tuple(a.strip().strip("'") for a in source[2].split(',')
                          if a.strip()) if source else (),
      initialised_groups=[g.strip() for g in fresh[1].split(',')] if fresh else [])


def read_json_or_warn(path: str, what: str):
  """The JSON in ``path``; None (with a warning naming the file and ``what``) if unreadable."""
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    logging.warning('%s: cannot read %s (%s); ignoring it.', path, what, e)
    return None


def read_workdir_sentence_settings(workdir: str) -> dict | None:
  """The settings an import kept in ``<workdir>/sentence_transformers.json`` (None: none)."""
  path = workdir_lib.path(workdir, SENTENCE_SETTINGS)
  if not path.exists():
    return None
  return read_json_or_warn(str(path), 'the sentence-transformers settings kept at import')


def not_orbax_chatter(record) -> bool:
  """False for Orbax's records below ERROR (restore notes such as 'Item opt_state was found
  in the checkpoint, but could not be restored': the tools restore params on purpose)."""
  return record.levelno >= std_logging.ERROR or f'{os.sep}orbax{os.sep}' not in record.pathname


def to_host(params) -> Any:
  return jax.tree.map(np.asarray, jax.device_get(params))
