"""A Hugging Face directory as a usable model (:func:`load_hf_dir`) or as a workdir
(:func:`import_hf_to_workdir`): the run config an import implies, the downstream network's
params inside the kind's whole pretraining params tree, the tokenizer, the report.

Above ``encoder_jax.loading.loaded`` (it returns a ``loading.Loaded``), below the tools.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile

from etils import epath
import jax
import ml_collections
from absl import logging

from encoder_jax.run import checkpointing
from encoder_jax.config import schema as config_base
from encoder_jax.loading import loaded as loading
from encoder_jax import objectives
from encoder_jax.storage import paths as storage
from encoder_jax.run import train_state
from encoder_jax.run import workdir as workdir_lib
from encoder_jax.interop import hf
from encoder_jax.interop import tokenizer as tokenizer_io
from encoder_jax.models import config as model_config_lib
from encoder_jax.models import registry as models


def load_hf_dir(hf_dir: str, seed: int = 0) -> loading.Loaded:
  model_config, params, report = hf.load_hf(hf_dir, seed)
  logging.info('%s', report.summary())
  tok = tokenizer_io.load_hf_tokenizer(hf_dir)
  if not tok.fits(model_config.vocab_size):
    raise ValueError(f'{hf_dir}: the tokenizer ({tok.path}) has {tok.vocab_size} pieces but '
                     f'config.json says vocab_size={model_config.vocab_size}')
  config = run_config_for(model_config, tok)
  trainable = objectives.build(config)
  params = _around_downstream(trainable, params, report, seed, hf_dir)
  return loading.Loaded(model_config, params, tok, hf_dir, run_config=config, report=report,
                        trainable=trainable, sentence_settings=read_sentence_settings(hf_dir))


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
    raw = loading.read_json_or_warn(st_config, 'the sentence-transformers settings')
    if isinstance(raw, dict):
      settings['files'].append('sentence_bert_config.json')
      if raw.get('max_seq_length'):
        settings['max_seq_length'] = int(raw['max_seq_length'])
      settings['do_lower_case'] = bool(raw.get('do_lower_case', False))
  modules = (loading.read_json_or_warn(modules_json, 'the sentence-transformers modules')
             if os.path.exists(modules_json) else None)
  if isinstance(modules, list):
    settings['files'].append('modules.json')
    for module in modules:
      kind = str(module.get('type', ''))
      if kind.endswith('.Normalize'):
        settings['normalize'] = True
      elif kind.endswith('.Pooling'):
        where = os.path.join(module.get('path', ''), 'config.json')
        pooling = loading.read_json_or_warn(os.path.join(hf_dir, where),
                                            'the sentence-transformers pooling')
        if isinstance(pooling, dict):
          settings['files'].append(where)
          settings['pooling'] = _pooling_mode(pooling) or 'mean'
  return settings if settings['files'] else None


def describe_sentence_settings(settings: dict) -> str:
  return (f"sentence-transformers settings ({', '.join(settings['files'])}): max_seq_length="
          f"{settings['max_seq_length']}, pooling={settings['pooling']}, normalize="
          f"{settings['normalize']}, do_lower_case={settings['do_lower_case']}")


def run_config_for(model_config: model_config_lib.EncoderConfig, tok,
                   base: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
  """``base`` (default: the schema defaults) with the imported model and tokenizer file."""
  config = ml_collections.ConfigDict(base.to_dict()) if base is not None else (
      config_base.base_config())
  config.model.update(model_config.to_dict())
  if base is None:  # The kind's own defaults (models.registry).
    kind = models.get(model_config.kind)
    config.objective.names, config.data.pair_kind = kind.import_objectives, kind.import_pair_kind
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


def _around_downstream(trainable, params, report: loading.ImportReport, seed: int, hf_dir: str):
  """The trainable's whole params tree around imported downstream params; the parts made
  fresh (an SBO head, ELECTRA's generator) are added to the report."""
  exported = {}
  for sub in trainable.hf_export_dirs:  # More of its networks, exported beside it.
    if os.path.exists(os.path.join(hf_dir, sub, 'config.json')):
      config, sub_params, _ = hf.load_hf(os.path.join(hf_dir, sub))
      exported[sub] = (config, sub_params)
  params, fresh = trainable.from_downstream(params, jax.random.PRNGKey(seed), exported, hf_dir)
  report.initialised_groups.extend(g for g in fresh if g not in report.initialised_groups)
  return params


def import_hf_to_workdir(hf_dir: str, workdir: str,
                         base: ml_collections.ConfigDict | None = None) -> loading.ImportReport:
  """HF directory -> ``workdir``: config.json, the tokenizer (pinned), a step-0 checkpoint.

  The tokenizer file (``vocab.txt``, an encoder_jax ``tokenizer.model``, a RoBERTa-layout
  ``tokenizer.json``, or the ``hf_tokenizer.json`` of any other Hugging Face tokenizer; see
  ``interop.tokenizer``) is written into the workdir, named by ``config.tokenizer.path``
  for continued pretraining, and pinned in ``<workdir>/tokenizer/``; a ``gs://`` workdir's
  config names the pinned copy on the bucket. A ``gs://`` ``hf_dir`` is copied to a
  temporary local directory first (the Hugging Face readers read local files).
  """
  ckpt_dir = epath.Path(checkpointing.checkpoint_dir(workdir))
  if ckpt_dir.is_dir() and any(d.name.isdigit() for d in ckpt_dir.iterdir()):
    raise FileExistsError(f'{ckpt_dir} already holds checkpoints; import into an empty workdir')
  with storage.local_copy(hf_dir) as local:
    return _import(local, hf_dir, workdir, base)


def _import(hf_dir: str, source: str, workdir: str,
            base: ml_collections.ConfigDict | None) -> loading.ImportReport:
  """:func:`import_hf_to_workdir` from the local directory ``hf_dir``, a copy of ``source``."""
  seed = int(base.seed) if base is not None else 0
  model_config, params, report = hf.load_hf(hf_dir, seed)
  # The tokenizer libraries write and read local files: a bucket's copy is the pinned one.
  tok = tokenizer_io.import_hf_tokenizer(
      hf_dir, tempfile.mkdtemp(prefix='hf_tokenizer_') if '://' in workdir else workdir)
  if not tok.fits(model_config.vocab_size):
    raise ValueError(f'{source}: the tokenizer has {tok.vocab_size} pieces but config.json '
                     f'says vocab_size={model_config.vocab_size}; the input pipeline needs '
                     'them equal')
  config = run_config_for(model_config, tok, base)
  params = _around_downstream(objectives.build(config), params, report, seed, hf_dir)
  workdir_lib.pin_tokenizer(workdir, tok, None)
  if '://' in workdir:  # The temporary file goes away; the pinned copy stays.
    pinned = json.loads(workdir_lib.path(workdir, workdir_lib.TOKENIZER_DIR,
                                         workdir_lib.TOKENIZER_INFO).read_text())['file']
    config.tokenizer.path = str(workdir_lib.path(workdir, workdir_lib.TOKENIZER_DIR, pinned))
  # The run's own pieces (its optimizer state too: a run resumes from this checkpoint),
  # imported here: loading a model (which reads this module) never imports the loop.
  from encoder_jax.run import pretraining  # pylint: disable=g-import-not-at-top
  mesh = loading.local_mesh(config)
  state = pretraining.pieces(config, mesh).create_state(train_state.init_rng(config.seed),
                                                        params)
  checkpointer = checkpointing.Checkpointer(workdir, config.checkpoint)
  try:
    checkpointer.save(loading.IMPORTED_STEP, state, {})  # Empty data state: the stream starts anew.
    checkpointer.wait()
  finally:
    checkpointer.close()
  loading.write_run_config(config, workdir)
  lines = [report.summary()]
  settings = read_sentence_settings(hf_dir)
  if settings is not None:
    workdir_lib.path(workdir, loading.SENTENCE_SETTINGS).write_text(
        json.dumps(dict(settings, source=source if '://' in source else os.path.abspath(
            source)), indent=2))
    lines.append(f'{describe_sentence_settings(settings)}; kept in '
                 f'{loading.SENTENCE_SETTINGS}, the defaults of encoder_jax.embed.')
  workdir_lib.path(workdir, loading.IMPORT_REPORT).write_text('\n'.join(lines) + '\n')
  workdir_lib.path(workdir, loading.IMPORT_REPORT_JSON).write_text(
      json.dumps(dict(dataclasses.asdict(report), step=loading.IMPORTED_STEP), indent=2))
  return report


