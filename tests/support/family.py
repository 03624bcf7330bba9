"""The family of pretraining setups: one row per model kind x objective, each a tiny config
on the embedded corpus, and each row's run, trained once per test process.

``tests/test_family.py`` trains every row on 8 simulated devices and checks exact resume and
that the loss falls; the end-to-end tests of a kind or objective (evaluation, export,
loading) read the same run's workdir instead of training one of their own: a row's run is
trained by whichever test asks first, in its process. The tests that share a run carry one
``xdist_group`` mark (:func:`group`) so that ``-n`` keeps them in one worker (with
``--dist=loadgroup``, set in setup.cfg; tests/conftest.py makes the marks group under pytest 9).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os

import ml_collections


from encoder_jax.api import pretrain  # pylint: disable=wrong-import-position
from encoder_jax.models import modernbert  # pylint: disable=wrong-import-position

from support import tiny_config

# name -> config overrides (section -> fields) on top of tests/support/tiny_config.py.
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
    # Two streams, bidirectional data, memory carried (across micro-batches too) and resumed.
    'xlnet_plm_memory': dict(
        model=dict(kind='xlnet', type_vocab_size=3, mem_len=8),
        objective=dict(names=('plm',), max_ngram=5, partial_prediction_k=6,
                       bidirectional_data=True),
        data=dict(pair_kind='xlnet'),
        train=dict(grad_accum_steps=2)),  # Micro-batches of 4 rows over data x fsdp = 4.
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

# A row's run: 12 steps at a high rate (every row's loss falls by 4-35% in them), logged
# every 2, checkpoints at steps 6 and 12, one evaluation at the end.
NUM_STEPS, SAVE_EVERY = 12, 6


def family_config(name: str, prepared_root: str) -> ml_collections.ConfigDict:
  c = tiny_config.get_config()
  c.train.update(num_steps=NUM_STEPS, seq_lens=(32,), max_predictions=(5,),
                 phase_fractions=(1.0,), log_every_steps=2, eval_every_steps=NUM_STEPS,
                 eval_batches=1)
  c.optim.update(learning_rate=1e-2, warmup_steps=2)
  c.checkpoint.update(every_steps=SAVE_EVERY, keep=3, async_save=False)
  c.mesh.update(data=2, fsdp=2, tensor=2)
  for section, fields in FAMILY[name].items():
    c[section].update(fields)
  # One prepared directory per distinct corpus/tokenizer/builder (shared across rows).
  key = f'{c.tokenizer.kind}-{c.model.vocab_size}'
  c.data.prepared_dir = os.path.join(prepared_root, key)
  return c


@dataclasses.dataclass(frozen=True)
class Run:
  """A row's finished run: its config, workdir, the run's result and its console output.
  Read-only for its users: a test that changes a workdir copies it first."""
  name: str
  config: ml_collections.ConfigDict
  workdir: str
  result: dict
  console: str
  programs: tuple  # The keys of the jitted steps it ran (engine._PROGRAMS).

  def logged(self, key: str) -> list[float]:
    """``key``'s value at each logged training step (every 2 steps: 6 values)."""
    from encoder_jax.run import metrics_log  # pylint: disable=g-import-not-at-top
    return [r[key] for r in metrics_log.read_metrics(self.workdir) if r['split'] == 'train']


_RUNS: dict[tuple[str, str], Run] = {}


def trained(name: str, root: str) -> Run:
  """Row ``name``'s run under ``root`` (its prepared data and workdir), trained by the first
  caller in this process and then served from memory, each caller with a config of its own
  (a test that changes its copy changes no other test's: a resumed run's steps are reused
  only for the very same config)."""
  key = (name, root)
  if key not in _RUNS:
    from encoder_jax.run import engine  # pylint: disable=g-import-not-at-top
    c = family_config(name, os.path.join(root, 'prepared'))
    workdir = os.path.join(root, 'runs', name)
    console = io.StringIO()
    before = set(engine._PROGRAMS)  # pylint: disable=protected-access
    with contextlib.redirect_stdout(console):
      result = pretrain.run(c, workdir).metrics
    programs = tuple(k for k in engine._PROGRAMS  # pylint: disable=protected-access
                     if k not in before)
    assert programs, f'{name}: its run traced no step of its own'
    _RUNS[key] = Run(name, c, workdir, result, console.getvalue(), programs)
  run = _RUNS[key]
  return dataclasses.replace(run, config=run.config.copy_and_resolve_references())


def group(name: str) -> str:
  """The ``xdist_group`` of the tests that read row ``name``'s run."""
  return f'family-{name}'
