"""Loading a model for use (evaluate, fill-mask, embed, fine-tune), and HF -> workdir import.

A model comes either from a pretraining workdir (``config.json`` + Orbax checkpoints,
restored onto *this* machine's devices, whatever wrote them) or straight from a Hugging
Face directory of any registered kind. Either way it is a :class:`Loaded`: the config,
tokenizer and params, with functions for hidden states, MLM logits and pooled sentence
embeddings (``encoder_jax.load`` is the documented entry point). Nothing here imports the
training loop. :func:`import_hf_to_workdir` turns an HF directory into a workdir: a step-0
checkpoint that ``encoder_jax.main`` continues pretraining from.
"""

from __future__ import annotations

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

from encoder_jax import checkpointing
from encoder_jax import config_base
from encoder_jax import objectives
from encoder_jax import sharding
from encoder_jax import train_state
from encoder_jax import workdir as workdir_lib
from encoder_jax.interop import hf
from encoder_jax.interop import tokenizer as tokenizer_io
from encoder_jax.models import config as model_config_lib

CONFIG_JSON = 'config.json'
IMPORT_REPORT = 'import_report.txt'  # For people: what the import initialised or ignored.
IMPORT_REPORT_JSON = 'import_report.json'  # The same for tools (read back by load_workdir).
# How sentence-transformers uses the model (max_seq_length, pooling, normalize), read from
# an imported directory's sentence_bert_config.json / modules.json / 1_Pooling/config.json:
# encoder_jax.embed's defaults.
SENTENCE_SETTINGS = 'sentence_transformers.json'
IMPORTED_STEP = 0  # The step of the checkpoint import_hf_to_workdir writes.


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
  params: Any  # Unboxed 'params' of the pretraining setup (objectives.build(config).init).
  tokenizer: Any  # encoder_jax.data.tokenizer.Tokenizer
  source: str  # Human-readable: where the weights came from.
  step: int | None = None  # Checkpoint step (None for an HF directory).
  run_config: ml_collections.ConfigDict | None = None  # The workdir's config (or one made).
  mesh: jax.sharding.Mesh | None = None  # Where ``params`` live.
  report: hf.ImportReport | None = None  # HF directory or imported workdir: heads initialised.
  setup: Any = None  # objectives.base.Pretraining of run_config.
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
    return self.setup.downstream(self.params)[0]

  @property
  def encoder_params(self):
    return self.setup.downstream(self.params)[1]

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
    network, params = self.setup.masked_lm(self.params)
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
    from encoder_jax import embed  # pylint: disable=g-import-not-at-top
    return embed.embed_sentences(self.encoder_params, self.model_config, self.tokenizer,
                                 list(texts), pooling=pooling or self.default_pooling,
                                 normalize=normalize, batch_size=batch_size,
                                 max_len=max_len or self.default_max_len)

  def fill_mask(self, text: str, top_k: int = 5, warn: bool = True
                ) -> list[list[tuple[str, float]]]:
    """For each mask in ``text`` in order: [(piece, probability)] best first.

    Logs a warning (once, unless ``warn=False``) when the MLM head is the random one an
    import initialised (``untrained_heads``).
    """
    from encoder_jax import fill_mask  # pylint: disable=g-import-not-at-top
    if warn and 'mlm_head' in self.untrained_heads and not self._warned_untrained_mlm:
      self._warned_untrained_mlm = True
      logging.warning('%s', self.untrained_mlm_warning())
    network, params = self.setup.masked_lm(self.params)
    return fill_mask.fill_mask(params, network.config, self.tokenizer, text, top_k)

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
    from encoder_jax import embed  # pylint: disable=g-import-not-at-top
    pooling = (self.sentence_settings or {}).get('pooling')
    return pooling if pooling in embed.POOLINGS else 'mean'

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


def abstract_params(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh):
  """ShapeDtypeStructs (with shardings on ``mesh``) of the params the config describes."""
  return train_state.abstract_params(config, mesh)


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
    target.addFilter(_not_orbax_chatter)
  try:
    check_shapes(config, workdir, step, abstract)
    params, step = checkpointing.restore_params(workdir, abstract, step)
  finally:
    for target in targets:
      target.removeFilter(_not_orbax_chatter)
  return params, step, mesh


def load_workdir(workdir: str, config: ml_collections.ConfigDict | None = None,
                 step: int | None = None, mesh=None, with_tokenizer: bool = True) -> Loaded:
  """A workdir's checkpoint and the tokenizer pinned in it (see ``tokenizer.for_workdir``)."""
  config = config if config is not None else read_run_config(workdir)
  step = checkpointing.resolve_step(workdir, step)  # Cheap checks first: the checkpoint, then the tokenizer.
  tok = tokenizer_io.for_workdir(workdir, config) if with_tokenizer else None
  params, step, mesh = restore_params(config, workdir, step, mesh)
  setup = objectives.build(config)
  return Loaded(setup.downstream(params)[0].config, params, tok, f'{workdir} step {step}', step,
                config, mesh, setup=setup, report=read_import_report(workdir),
                sentence_settings=read_workdir_sentence_settings(workdir))


def load_hf_dir(hf_dir: str, seed: int = 0) -> Loaded:
  model_config, params, report = hf.load_hf(hf_dir, seed)
  logging.info('%s', report.summary())
  tok = tokenizer_io.load_hf_tokenizer(hf_dir)
  if not tok.fits(model_config.vocab_size):
    raise ValueError(f'{hf_dir}: the tokenizer ({tok.path}) has {tok.vocab_size} pieces but '
                     f'config.json says vocab_size={model_config.vocab_size}')
  config = run_config_for(model_config, tok)
  setup = objectives.build(config)
  params = _around_downstream(setup, params, report, seed, hf_dir)
  return Loaded(model_config, params, tok, hf_dir, run_config=config, report=report,
                setup=setup,
                sentence_settings=read_sentence_settings(hf_dir))


# ------------------------------------------------------- import report, sentence settings


def read_import_report(workdir: str) -> hf.ImportReport | None:
  """The ImportReport ``import_hf_to_workdir`` left in ``workdir`` (None: not an import).

  ``import_report.json`` when present; a workdir imported before it existed has only the
  text, whose 'freshly initialised:' line is read back.
  """
  as_json = workdir_lib.path(workdir, IMPORT_REPORT_JSON)
  if as_json.exists():
    raw = json.loads(as_json.read_text())
    return hf.ImportReport(source=raw.get('source', ''),
                           architectures=tuple(raw.get('architectures', ())),
                           initialised_groups=list(raw.get('initialised_groups', [])),
                           ignored_keys=list(raw.get('ignored_keys', [])))
  as_text = workdir_lib.path(workdir, IMPORT_REPORT)
  if not as_text.exists():
    return None
  text = as_text.read_text()
  source = re.search(r'^Imported (.*?) \(architectures=\[(.*?)\]\)', text, re.M)
  fresh = re.search(r'freshly initialised: (.*?)\.?$', text, re.M)
  return hf.ImportReport(
      source=source[1] if source else '?',
      architectures=tuple(a.strip().strip("'") for a in source[2].split(',')
                          if a.strip()) if source else (),
      initialised_groups=[g.strip() for g in fresh[1].split(',')] if fresh else [])


def _read_json(path: str, what: str):
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    logging.warning('%s: cannot read %s (%s); ignoring it.', path, what, e)
    return None


def _pooling_mode(pooling_config: dict) -> str | None:
  """sentence-transformers' Pooling config -> its mode: 'mean', 'cls', 'max', ... ('+'-joined
  when several are concatenated). New files say ``pooling_mode``; older ones one bool each."""
  mode = pooling_config.get('pooling_mode')
  if mode:
    return '+'.join(mode) if isinstance(mode, (list, tuple)) else str(mode)
  legacy = {'pooling_mode_cls_token': 'cls', 'pooling_mode_max_tokens': 'max',
            'pooling_mode_mean_tokens': 'mean',
            'pooling_mode_mean_sqrt_len_tokens': 'mean_sqrt_len_tokens',
            'pooling_mode_weightedmean_tokens': 'weightedmean',
            'pooling_mode_lasttoken': 'lasttoken'}
  modes = [name for key, name in legacy.items() if pooling_config.get(key)]
  return '+'.join(modes) if modes else None


def read_sentence_settings(hf_dir: str) -> dict | None:
  """How sentence-transformers runs the model in ``hf_dir``; None if it is not one of theirs.

  From ``sentence_bert_config.json`` (``max_seq_length``: inputs are truncated there, e.g.
  256 for all-MiniLM-L6-v2 whose positions go to 512; ``do_lower_case``), ``modules.json``
  (a Normalize module) and the Pooling module's ``config.json`` (mean / cls / ...), as
  sentence_transformers' Transformer and Pooling modules read them. A file that cannot be
  read is named in a warning and ignored.
  """
  st_config = os.path.join(hf_dir, 'sentence_bert_config.json')
  modules_json = os.path.join(hf_dir, 'modules.json')
  if not os.path.exists(st_config) and not os.path.exists(modules_json):
    return None
  settings = dict(max_seq_length=None, do_lower_case=False, pooling=None, normalize=False,
                  files=[])
  if os.path.exists(st_config):
    raw = _read_json(st_config, 'the sentence-transformers settings')
    if isinstance(raw, dict):
      settings['files'].append('sentence_bert_config.json')
      if raw.get('max_seq_length'):
        settings['max_seq_length'] = int(raw['max_seq_length'])
      settings['do_lower_case'] = bool(raw.get('do_lower_case', False))
  modules = _read_json(modules_json, 'the sentence-transformers modules') if os.path.exists(
      modules_json) else None
  if isinstance(modules, list):
    settings['files'].append('modules.json')
    for module in modules:
      kind = str(module.get('type', ''))
      if kind.endswith('.Normalize'):
        settings['normalize'] = True
      elif kind.endswith('.Pooling'):
        where = os.path.join(module.get('path', ''), 'config.json')
        pooling = _read_json(os.path.join(hf_dir, where), 'the sentence-transformers pooling')
        if isinstance(pooling, dict):
          settings['files'].append(where)
          settings['pooling'] = _pooling_mode(pooling) or 'mean'
  return settings if settings['files'] else None


def read_workdir_sentence_settings(workdir: str) -> dict | None:
  """The settings an import kept in ``<workdir>/sentence_transformers.json`` (None: none)."""
  path = workdir_lib.path(workdir, SENTENCE_SETTINGS)
  if not path.exists():
    return None
  return _read_json(str(path), 'the sentence-transformers settings kept at import')


def describe_sentence_settings(settings: dict) -> str:
  return (f"sentence-transformers settings ({', '.join(settings['files'])}): max_seq_length="
          f"{settings['max_seq_length']}, pooling={settings['pooling']}, normalize="
          f"{settings['normalize']}, do_lower_case={settings['do_lower_case']}")


# ---------------------------------------------------------------------------- import


# The objectives an imported checkpoint of each kind continues pretraining with, by default.
DEFAULT_OBJECTIVES = {'bert': (('mlm', 'nsp'), 'nsp'), 'albert': (('mlm', 'sop'), 'sop'),
                      'roberta': (('mlm',), 'full_sentences'),
                      'deberta': (('mlm',), 'full_sentences'),
                      'deberta_v2': (('mlm',), 'full_sentences'),
                      'electra': (('electra',), 'full_sentences'),
                      'electra_generator': (('mlm',), 'full_sentences'),
                      'xlnet': (('plm',), 'xlnet')}


def run_config_for(model_config: model_config_lib.EncoderConfig, tok,
                   base: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
  """``base`` (default: the schema defaults) with the imported model and tokenizer file."""
  config = ml_collections.ConfigDict(base.to_dict()) if base is not None else (
      config_base.base_config())
  config.model.update(dataclasses.asdict(model_config))
  if base is None and model_config.kind in DEFAULT_OBJECTIVES:
    names, pair_kind = DEFAULT_OBJECTIVES[model_config.kind]
    config.objective.names, config.data.pair_kind = names, pair_kind
  config.tokenizer.update(kind=tok.kind, path=os.path.abspath(tok.path),
                          lowercase=bool(tok.lowercase))
  longest, limit = max(config.train.seq_lens), model_config.max_length
  if base is None and longest > limit:  # Default recipe, short model: shorten the phases.
    config.train.seq_lens = tuple(min(s, limit) for s in config.train.seq_lens)
    config.train.max_predictions = tuple(
        min(p, s) for p, s in zip(config.train.max_predictions, config.train.seq_lens))
  elif longest > limit:
    raise ValueError(f'config.train.seq_lens has {longest} > the {limit} positions of the '
                     'imported model')
  return config


def _around_downstream(setup, params, report: hf.ImportReport, seed: int, hf_dir: str):
  """The setup's whole params tree around imported downstream params; the parts made
  fresh (an SBO head, ELECTRA's generator) are added to the report."""
  params, fresh = setup.from_downstream(params, jax.random.PRNGKey(seed), hf_dir)
  report.initialised_groups.extend(g for g in fresh if g not in report.initialised_groups)
  return params


def import_hf_to_workdir(hf_dir: str, workdir: str,
                         base: ml_collections.ConfigDict | None = None) -> hf.ImportReport:
  """HF directory -> ``workdir``: config.json, the tokenizer (pinned), a step-0 checkpoint.

  The tokenizer file (``vocab.txt``, or the ``tokenizer.model`` of an encoder_jax
  SentencePiece export) is copied into the workdir, named by ``config.tokenizer.path``
  for continued pretraining, and pinned in ``<workdir>/tokenizer/``.
  """
  ckpt_dir = checkpointing.checkpoint_dir(workdir)
  if os.path.isdir(ckpt_dir) and any(d.isdigit() for d in os.listdir(ckpt_dir)):
    raise FileExistsError(f'{ckpt_dir} already holds checkpoints; import into an empty workdir')
  seed = int(base.seed) if base is not None else 0
  model_config, params, report = hf.load_hf(hf_dir, seed)
  tok = tokenizer_io.import_hf_tokenizer(hf_dir, workdir)
  if not tok.fits(model_config.vocab_size):
    raise ValueError(f'{hf_dir}: the tokenizer has {tok.vocab_size} pieces but config.json '
                     f'says vocab_size={model_config.vocab_size}; the input pipeline needs '
                     'them equal')
  config = run_config_for(model_config, tok, base)
  params = _around_downstream(objectives.build(config), params, report, seed, hf_dir)
  workdir_lib.pin_tokenizer(workdir, tok, None)
  mesh = local_mesh(config)
  state = train_state.create_train_state(config, mesh, params=params)
  checkpointer = checkpointing.Checkpointer(workdir, config.checkpoint)
  try:
    checkpointer.save(IMPORTED_STEP, state, {})  # Empty data state: the stream starts anew.
    checkpointer.wait()
  finally:
    checkpointer.close()
  write_run_config(config, workdir)
  lines = [report.summary()]
  settings = read_sentence_settings(hf_dir)
  if settings is not None:
    with open(os.path.join(workdir, SENTENCE_SETTINGS), 'w', encoding='utf-8') as f:
      json.dump(dict(settings, source=os.path.abspath(hf_dir)), f, indent=2)
    lines.append(f'{describe_sentence_settings(settings)}; kept in {SENTENCE_SETTINGS}, the '
                 'defaults of encoder_jax.embed.')
  with open(os.path.join(workdir, IMPORT_REPORT), 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  with open(os.path.join(workdir, IMPORT_REPORT_JSON), 'w', encoding='utf-8') as f:
    json.dump(dict(dataclasses.asdict(report), step=IMPORTED_STEP), f, indent=2)
  return report


# ---------------------------------------------------------------------- CLI plumbing


def define_source_flags() -> None:
  """--config/--workdir/--step or --hf_dir: where a CLI's model comes from."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file(
      'config', None, 'Run config (default: <workdir>/config.json).', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Pretraining workdir holding checkpoints/.')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
  flags.DEFINE_string('hf_dir', None, 'A Hugging Face directory (BERT, RoBERTa, ALBERT) '
                      'instead of a workdir.')


def load_from_flags(f, with_tokenizer: bool = True) -> Loaded:
  if bool(f.hf_dir) == bool(f.workdir):
    raise ValueError('Pass exactly one of --workdir (with optional --config/--step) or '
                     '--hf_dir')
  if f.hf_dir:
    return load_hf_dir(f.hf_dir)
  return load_workdir(f.workdir, f.config, f.step, with_tokenizer=with_tokenizer)


def _not_orbax_chatter(record) -> bool:
  """False for Orbax's records below ERROR (restore notes such as 'Item opt_state was found
  in the checkpoint, but could not be restored': the tools restore params on purpose)."""
  return record.levelno >= std_logging.ERROR or f'{os.sep}orbax{os.sep}' not in record.pathname


def quiet_logging() -> None:
  """For the CLIs' main: warnings and errors only (unless --verbosity is given), no Orbax notes.

  What the user sees is the result and real problems, not library chatter.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  if 'verbosity' not in flags.FLAGS or not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  for target in (logging.get_absl_handler(), logging.get_absl_logger(), std_logging.getLogger()):
    if _not_orbax_chatter not in target.filters:
      target.addFilter(_not_orbax_chatter)


def to_host(params) -> Any:
  return jax.tree.map(np.asarray, jax.device_get(params))
