"""Every registered model kind x objective trains on 8 simulated devices and resumes exactly.

One row per pretraining setup in :data:`FAMILY` (a new kind or objective adds a row): a
tiny config on the embedded corpus runs 4 steps on a (data=2, fsdp=2, tensor=2) mesh with
checkpoints at steps 2 and 4; then the step-4 checkpoint is removed and the same command
resumes from step 2, and must end with the same params, bit for bit.
"""

import os
import shutil
import sys

import jax
import ml_collections
import numpy as np
import pytest

from encoder_jax import engine
from encoder_jax import checkpointing
from encoder_jax import config_base
from encoder_jax import objectives
from encoder_jax import train
from encoder_jax import train_state
from encoder_jax import validation
from encoder_jax.models import modernbert
from encoder_jax.models import registry as models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests'))
import tiny_config  # pylint: disable=wrong-import-position

# name -> config overrides (section -> fields) on top of tests/tiny_config.py.
FAMILY = {
    'bert_mlm_nsp': {},
    # (Whole-word masking: the ALBERT, SpanBERT and DeBERTa rows.)
    'roberta_mlm': dict(
        model=dict(kind='roberta', position_offset=2, type_vocab_size=1, layer_norm_eps=1e-5,
                   max_position_embeddings=66),
        objective=dict(names=('mlm',)), data=dict(pair_kind='full_sentences'),
        tokenizer=dict(kind='bytelevel_bpe')),
    'albert_mlm_sop': dict(
        model=dict(kind='albert', embedding_size=16, share_layers='all', activation='gelu_new'),
        objective=dict(names=('mlm', 'sop'), max_ngram=3, whole_word_masking=True),
        data=dict(pair_kind='sop')),
    'spanbert_mlm_sbo': dict(
        objective=dict(names=('mlm', 'sbo'), span_p=0.2, max_span_length=10,
                       whole_word_masking=True),
        data=dict(pair_kind='doc_sentences')),
    'deberta_mlm_wwm_emd': dict(  # v1: distances clipped at k=8 < 32, EMD, no segments.
        model=dict(kind='deberta', attention_kind='disentangled', position_biased_input=False,
                   max_relative_positions=8, emd_layers=2, type_vocab_size=0,
                   layer_norm_eps=1e-7),
        objective=dict(names=('mlm',), whole_word_masking=True),
        data=dict(pair_kind='full_sentences')),
    'deberta_v2_mlm_sop': dict(  # v2/v3 options, EMD, and the SOP option.
        model=dict(kind='deberta_v2', attention_kind='disentangled', position_biased_input=False,
                   position_buckets=8, share_att_key=True, norm_rel_ebd=True, emd_layers=2,
                   pos_att_type='c2p|p2c', layer_norm_eps=1e-7),
        objective=dict(names=('mlm', 'sop'), whole_word_masking=True),
        data=dict(pair_kind='sop')),
    'electra_rtd': dict(  # Generator: hidden 8 (1/4), its own 16 -> 8 embedding projection.
        model=dict(kind='electra', embedding_size=16),
        objective=dict(names=('electra',), mask_token_rate=0.85, random_token_rate=0.0,
                       generator_hidden_fraction=0.25),
        data=dict(pair_kind='full_sentences')),
    'xlnet_plm_memory': dict(  # Two streams, bidirectional data, memory carried and resumed.
        model=dict(kind='xlnet', type_vocab_size=3, mem_len=8),
        objective=dict(names=('plm',), max_ngram=5, partial_prediction_k=6,
                       bidirectional_data=True),
        data=dict(pair_kind='xlnet')),
    # The small-budget options (pre-LN, GeGLU, rotary, no biases) and the span contrastive
    # loss over the whole sharded batch.
    'bert_crammed_mlm_contrastive': dict(
        model=dict(pre_norm=True, gated_ffn=True, dense_bias=False, norm_bias=False,
                   rotary=True, hidden_dropout_rate=0.0, attention_dropout_rate=0.0),
        objective=dict(names=('mlm', 'contrastive'), mask_rate=0.3),
        data=dict(pair_kind='full_sentences'),
        optim=dict(schedule='wsd', decay_fraction=0.5)),
    # ModernBERT: layers global, local (an 8-token window at 32 tokens: band by band),
    # fused QKV, rotary 160k/10k, the first layer's attention norm skipped, MLM at 30%.
    'modernbert_mlm': dict(
        model=dict(modernbert.PUBLISHED, local_attention=8),
        objective=dict(names=('mlm',), mask_rate=0.3), data=dict(pair_kind='full_sentences'),
        optim=dict(schedule='wsd', decay_fraction=0.5)),
    # Unpadded batches: documents packed back to back, attention and RoPE positions per
    # document (ModernBERT's local window on top), eval on packed held-out rows.
    'modernbert_mlm_packed': dict(
        model=dict(modernbert.PUBLISHED, local_attention=8),
        objective=dict(names=('mlm',), mask_rate=0.3), data=dict(pair_kind='packed_documents')),
    'electra_generator_mlm': dict(
        model=dict(kind='electra_generator', embedding_size=16),
        objective=dict(names=('mlm',)), data=dict(pair_kind='full_sentences')),
}


def family_config(name: str, prepared_root: str):
  c = tiny_config.get_config()
  for section, fields in FAMILY[name].items():
    c[section].update(fields)
  # One prepared directory per distinct corpus/tokenizer/builder (shared across rows).
  key = f'{c.tokenizer.kind}-{c.model.vocab_size}'
  c.data.prepared_dir = os.path.join(prepared_root, key)
  c.train.update(num_steps=4, seq_lens=(32,), max_predictions=(5,), phase_fractions=(1.0,),
                 log_every_steps=2, eval_every_steps=4, eval_batches=1)
  c.checkpoint.update(every_steps=2, keep=3, async_save=False)
  c.mesh.update(data=2, fsdp=2, tensor=2)
  return c


def test_every_kind_is_registered_in_the_family_table():
  kinds = {FAMILY[n].get('model', {}).get('kind', 'bert') for n in FAMILY}
  assert kinds == set(models.KINDS), set(models.KINDS) - kinds


def test_every_objective_is_trained_by_a_family_row():
  names = {n for row in FAMILY.values()
           for n in row.get('objective', {}).get('names', ('mlm', 'nsp'))}
  assert names == set(objectives.REGISTRY), set(objectives.REGISTRY) - names


ENTRIES = ([('model', k) for k in sorted(models.KINDS)]
           + [('objective', n) for n in sorted(objectives.REGISTRY)])


@pytest.mark.parametrize('section,name', ENTRIES, ids=[f'{s}-{n}' for s, n in ENTRIES])
def test_every_registry_entry_declares_sound_fields(section, name):
  """Each entry's fields are in the schema at their documented, in-range defaults, and a
  value of the wrong kind is refused by validation naming the key and its range."""
  entry = models.get(name) if section == 'model' else objectives.REGISTRY[name]
  assert entry.description, f'{section} {name!r} has no description'
  schema = config_base.base_config()[section]
  row = next(n for n in sorted(FAMILY) if (
      FAMILY[n].get('model', {}).get('kind', 'bert') == name if section == 'model' else
      name in FAMILY[n].get('objective', {}).get('names', ('mlm', 'nsp'))))
  for f in entry.fields:
    assert f.doc and f.ok(f.default), f
    assert f.name in schema and schema[f.name] == f.default, f.name
    c = ml_collections.ConfigDict(family_config(row, '/unused').to_dict(), type_safe=False)
    c[section][f.name] = '<wrong>'
    found = validation.problems(c)
    assert found and found[0].startswith(f"config.{section}.{f.name}='<wrong>': expected "
                                         f'{f.expected()}'), found
  # The family row itself is valid, and its setup shows console metrics of its own.
  c = family_config(row, '/unused')
  validation.validate(c)
  assert objectives.build(c).console_metrics


@pytest.fixture(scope='module')
def prepared_root(tmp_path_factory):
  return str(tmp_path_factory.mktemp('family_prepared'))


@pytest.mark.parametrize('kind', sorted(models.KINDS))
def test_import_defaults_of_every_kind_build(kind, tmp_path):
  """What a checkpoint of the kind imported from Hugging Face continues pretraining with
  (its registry entry's import_objectives / import_pair_kind) is a valid setup."""
  name = next(n for n in sorted(FAMILY) if FAMILY[n].get('model', {}).get('kind', 'bert') == kind)
  c = family_config(name, str(tmp_path))
  entry = models.get(kind)
  c.objective.names, c.data.pair_kind = entry.import_objectives, entry.import_pair_kind
  validation.validate(c)
  assert objectives.build(c).downstream.__self__ is not None


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(FAMILY))
def test_trains_on_8_devices_and_resumes_exactly(name, prepared_root, tmp_path, capsys):
  assert jax.device_count() == 8
  c = family_config(name, prepared_root)
  workdir = str(tmp_path / 'run')
  first = train.train_and_evaluate(c, workdir)
  assert np.isfinite(first['loss'])
  # The progress lines show what the setup declares (each objective names its metrics).
  progress = [l for l in capsys.readouterr().out.splitlines()
              if l.startswith(('train step', 'eval  step'))]
  shown = objectives.build(c).console_metrics
  assert progress and shown, (progress, shown)
  for _, short, _ in shown:
    assert any(f'  {short} ' in l for l in progress), (short, progress)
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 2, 2), ('data', 'fsdp', 'tensor'))
  setup = objectives.build(c)
  abstract = train_state.abstract_params(c, mesh, setup)
  final, step = checkpointing.restore_params(workdir, abstract, 4)
  assert step == 4
  # Drop the last checkpoint: the rerun resumes from step 2 and must retrace steps 3-4.
  shutil.rmtree(os.path.join(checkpointing.checkpoint_dir(workdir), '4'))
  programs = dict(engine._PROGRAMS)  # pylint: disable=protected-access
  train.train_and_evaluate(c, workdir)
  # The same config again in this process: its traced and compiled steps are reused.
  assert dict(engine._PROGRAMS) == programs  # pylint: disable=protected-access
  again, _ = checkpointing.restore_params(workdir, abstract, 4)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(final), jax.device_get(again))
