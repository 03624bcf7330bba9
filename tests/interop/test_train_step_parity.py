"""One training step against transformers + torch (CPU, float32): BERT (MLM + NSP), RoBERTa
(MLM) and ELECTRA (generator + discriminator).

From the same weights (our init, every tensor perturbed so no bias is zero and no LayerNorm
is the identity, written into the HF classes by the export table, ``hf.params_to_hf``) and
the same corrupted batch (the masks, labels and, for ELECTRA, the generator's samples that
our objective drew on device, recorded from inside ``loss_fn``), with dropout off:

* the loss equals HF's own loss (``BertForPreTraining``, ``RobertaForMaskedLM``;
  ``ElectraForMaskedLM`` + ``rtd_weight`` x ``ElectraForPreTraining``: HF's reductions are
  ours, a mean over the predicted tokens and over the non-padding tokens);
* every gradient equals torch's, named through the export table (tied tensors, the MLM
  decoder and ELECTRA's embeddings shared by both networks, are one torch ``Parameter``
  here as they are one leaf in our tree, so both sides sum the same terms);
* the params after **our real training step** (``pretraining.pieces(...).train_step`` with
  ``optimizer.build``: global-norm clipping, then AdamW with the LayerNorm/bias decay mask)
  equal torch's after ``clip_grad_norm_`` + ``torch.optim.AdamW`` with two param groups
  (decay off for LayerNorm and bias parameters, by HF name, independently of our mask).

The optimizer settings make each part of the update visible in one step: lr 1e-2, a clip
norm well below the gradient norm (asserted), weight decay 0.1 and eps 1e-3, so that Adam's
first step ``g / (|g| + eps)`` depends on the gradient's scale (the clipping) and not only on
its sign. (At eps 1e-6 the comparison is ill-conditioned rather than wrong: elements whose
clipped gradient is ~eps turn float32 rounding of the gradient into differences of up to
~1e-5 in the params.) The test then checks that Adam written out by hand agrees, and that a
torch step with decay on every parameter, without clipping, without Adam's bias correction
or with eps inside the square root would fail the comparison by far (~1e-3 and more).

The corrupted batch is recorded from inside the traced step (wrappers around the
objective's ``corrupt`` / ``masking.mask_tokens`` / ``electra.replace_tokens`` whose values
``loss_fn`` returns as extra metrics) and the gradients from the optimizer state (a
pass-through ``tx`` that keeps them), so one compiled program, the training step itself,
gives everything, and the persistent compilation cache applies to it.

``pytest -s`` prints the max |difference| of every compared quantity.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers

from encoder_jax.config import schema as config_base
from encoder_jax.run import feeding
from encoder_jax import objectives
from encoder_jax.core import optimizer
from encoder_jax.core import length_phases
from encoder_jax.core import sharding
from encoder_jax.run import pretraining
from encoder_jax.interop import hf
from encoder_jax.interop import registry
from encoder_jax.objectives import base
from encoder_jax.objectives import electra as electra_lib
from encoder_jax.objectives import masking

from support import hf_fixtures


pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

VOCAB, BATCH, LENGTH, MAX_PREDICTIONS = 101, 4, 16, 5
ROW_LENGTHS = (16, 13, 10, 7)  # Real tokens per row; the rest is padding.
LR, CLIP, WEIGHT_DECAY, EPS = 1e-2, 0.5, 0.1, 1e-3

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4  # Of the tensor's max |gradient|.
PARAM_ATOL = 1e-5


@dataclasses.dataclass(frozen=True)
class Setup:
  kind: str
  names: tuple[str, ...]
  special: dict[str, int]  # Token -> id: pad, cls/bos, sep/eos, unk, mask.
  hf_classes: dict[str, type]  # hf_exports subdirectory -> HF class.
  model: dict = dataclasses.field(default_factory=dict)
  objective: dict = dataclasses.field(default_factory=dict)
  pair_kind: str = 'full_sentences'


BERT_IDS = dict(pad=0, unk=1, cls=2, sep=3, mask=4)
SETUPS = {
    'bert': Setup('bert', ('mlm', 'nsp'), BERT_IDS, {'': transformers.BertForPreTraining},
                  pair_kind='nsp'),
    'roberta': Setup('roberta', ('mlm',), dict(cls=0, pad=1, sep=2, unk=3, mask=4),
                     {'': transformers.RobertaForMaskedLM},
                     model=dict(type_vocab_size=1, position_offset=2, layer_norm_eps=1e-5,
                                max_position_embeddings=LENGTH + 2)),
    # Factorized embeddings (E = 16 < hidden 32), a generator of hidden 8 with its own
    # 16 -> 8 projection; ELECTRA's masking (85% [MASK], no random tokens).
    'electra': Setup('electra', ('electra',), BERT_IDS,
                     {'': transformers.ElectraForPreTraining,
                      electra_lib.GENERATOR_EXPORT_DIR: transformers.ElectraForMaskedLM},
                     model=dict(embedding_size=16),
                     objective=dict(mask_token_rate=0.85, random_token_rate=0.0,
                                    generator_hidden_fraction=0.25, rtd_weight=50.0)),
}

# (setup, quantity) -> max |ours - torch|.
MAX_DIFF: dict[tuple[str, str], float] = {}
_print_max_diffs = hf_fixtures.max_diff_printer(MAX_DIFF, 'float32, one training step')


def _config(setup: Setup):
  c = config_base.base_config()
  c.model.update(kind=setup.kind, vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2,
                 intermediate_size=64, max_position_embeddings=LENGTH, hidden_dropout_rate=0.0,
                 attention_dropout_rate=0.0, dtype='float32')
  c.model.update(**setup.model)
  c.objective.update(names=setup.names, mask_rate=0.3, mask_token_rate=0.8,
                     random_token_rate=0.1, random_token_distribution='uniform')
  c.objective.update(**setup.objective)
  c.data.pair_kind = setup.pair_kind
  c.train.update(num_steps=100, batch_size=BATCH, seq_lens=(LENGTH,),
                 max_predictions=(MAX_PREDICTIONS,), phase_fractions=(1.0,))
  c.optim.update(name='adamw', learning_rate=LR, warmup_steps=0, b1=0.9, b2=0.999, eps=EPS,
                 weight_decay=WEIGHT_DECAY, grad_clip_norm=CLIP)
  c.mesh.update(data=1, fsdp=1, tensor=1)
  return c


def _tables(setup: Setup) -> masking.VocabTables:
  special = np.zeros(VOCAB, bool)
  special[list(setup.special.values())] = True
  return masking.VocabTables(is_special_V=special, is_word_start_V=np.ones(VOCAB, bool),
                             unigram_counts_V=np.ones(VOCAB), mask_id=setup.special['mask'])


def _batch(setup: Setup, seed: int = 0) -> dict[str, np.ndarray]:
  """[CLS] A [SEP] B [SEP] then padding, a different length per row."""
  rng = np.random.default_rng(seed)
  ids = np.full((BATCH, LENGTH), setup.special['pad'], np.int32)
  segments = np.zeros((BATCH, LENGTH), np.int32)
  mask = np.zeros((BATCH, LENGTH), np.int32)
  for b, n in enumerate(ROW_LENGTHS):
    words = rng.integers(len(setup.special), VOCAB, n).astype(np.int32)
    a = n // 2
    words[[0, a, n - 1]] = setup.special['cls'], setup.special['sep'], setup.special['sep']
    ids[b, :n], mask[b, :n] = words, 1
    if setup.kind != 'roberta':  # One token type.
      segments[b, a + 1:n] = 1
  batch = {'input_ids': ids, 'segment_ids': segments, 'input_mask': mask}
  if 'nsp' in setup.names:
    batch['pair_labels'] = np.array([0, 1, 1, 0], np.int32)
  return batch


def _perturbed(params, seed=0):
  """Our init with every tensor perturbed: no zero bias, no identity LayerNorm."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: (np.asarray(x) + 0.1 * rng.standard_normal(x.shape)).astype(np.float32), params)


# ------------------------------------------------------------------------------ ours


def _record_draws(objective, monkeypatch) -> None:
  """Makes the training step return what the objective drew on device, as metrics
  ``drawn/<name>``: the corrupted batch (and for ELECTRA the generator's samples and the
  discriminator's input), recorded while the step is traced."""
  seen = {}
  if isinstance(objective, base.Composite):
    mlm = next(o for o in objective.objectives if o.name == 'mlm')
    corrupt = mlm.corrupt

    def recording_corrupt(batch, rng, phase):
      out = corrupt(batch, rng, phase)
      seen.update({k: out[k] for k in ('masked_input_ids', 'masked_positions',
                                        'masked_labels', 'masked_weights')})
      return out
    monkeypatch.setattr(mlm, 'corrupt', recording_corrupt)
  else:
    mask_tokens, replace_tokens = masking.mask_tokens, electra_lib.replace_tokens

    def recording_mask_tokens(*args, **kwargs):
      out = mask_tokens(*args, **kwargs)
      seen.update(out)
      return out

    def recording_replace_tokens(ids, positions, weights, sampled):
      fake, replaced = replace_tokens(ids, positions, weights, sampled)
      seen.update(sampled=sampled, fake_input_ids=fake, replaced=replaced)
      return fake, replaced
    monkeypatch.setattr(masking, 'mask_tokens', recording_mask_tokens)
    monkeypatch.setattr(electra_lib, 'replace_tokens', recording_replace_tokens)
  loss_fn = objective.loss_fn

  def recording_loss_fn(params, batch, rng, phase, train):
    seen.clear()
    loss, metrics = loss_fn(params, batch, rng, phase, train)
    assert seen, 'the objective drew nothing through the recorded functions'
    return loss, {**metrics, **{f'drawn/{k}': v for k, v in seen.items()}}
  monkeypatch.setattr(objective, 'loss_fn', recording_loss_fn)


def _grad_keeping(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """``tx`` whose state also holds the gradients it was last given (before clipping), so
  the training step's new state has them."""
  def init(params):
    return tx.init(params), jax.tree.map(jnp.zeros_like, params)

  def update(grads, state, params=None):
    updates, inner = tx.update(grads, state[0], params)
    return updates, (inner, grads)
  return optax.GradientTransformation(init, update)


def _ours(setup, monkeypatch):
  """One real training step (``pretraining.pieces``, ``optimizer.build``) from perturbed
  initial params: the params before and after, the step's metrics, and what the step drew
  and differentiated (one compiled program, the step itself)."""
  c = _config(setup)
  objective = objectives.build(c, _tables(setup))
  _record_draws(objective, monkeypatch)
  tx = _grad_keeping(optimizer.build(optimizer.of_pretraining(c.optim), int(c.train.num_steps)))
  phase = length_phases.phases(c.train)[0]
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  params = _perturbed(jax.jit(lambda key: nn.unbox(objective.init(key)))(jax.random.key(1)))
  batch = _batch(setup)
  pieces = pretraining.pieces(c, mesh, objective, tx)
  state = pieces.create_state(params=params)
  step = pieces.train_step(phase)
  new_state, metrics = jax.device_get(
      step(state, feeding.to_global(batch, sharding.batch_sharding(mesh))))
  drawn = {k.split('/', 1)[1]: metrics.pop(k) for k in list(metrics) if k.startswith('drawn/')}
  return dict(config=c, objective=objective, params=params, batch=batch, metrics=metrics,
              grads=new_state.opt_state[1], corruption=drawn, new_params=new_state.params)


def _exported(objective, tree) -> dict[str, dict[str, np.ndarray]]:
  """hf_exports subdirectory -> HF state dict of ``tree`` (params, or gradients: the
  export's transforms are transposes and reshapes, so they map gradients too)."""
  return {sub: hf.params_to_hf(jax.tree.map(np.asarray, p), network.config)
          for sub, (network, p) in objective.hf_exports(tree).items()}


# ----------------------------------------------------------------------------- torch


def _torch_models(setup, ours):
  """The HF models of every exported network, loaded with our initial params; ELECTRA's
  shared embeddings made one Parameter in both (as they are one leaf in our tree)."""
  objective = ours['objective']
  pad = setup.special['pad']
  models = {}
  state = _exported(objective, ours['params'])
  for sub, (network, _) in objective.hf_exports(ours['params']).items():
    cls = setup.hf_classes[sub]
    hf_config = hf.hf_config_from(network.config, pad_token_id=pad)
    assert hf_config['architectures'] == [cls.__name__]
    assert hf_config['hidden_dropout_prob'] == hf_config['attention_probs_dropout_prob'] == 0
    config = cls.config_class(**hf_config, attn_implementation='eager')
    model = cls(config)
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(v) for k, v in state[sub].items()}, strict=False)
    spec = registry.hf_spec(network.config.kind)
    assert not unexpected and set(missing) <= set(spec.tied) | set(spec.buffers), (missing,
                                                                                     unexpected)
    models[sub] = model.train()  # Dropout is off: train mode is eval mode here.
  if setup.kind == 'electra':
    disc, gen = models[''], models[electra_lib.GENERATOR_EXPORT_DIR]
    for name in ('word_embeddings', 'position_embeddings', 'token_type_embeddings',
                 'LayerNorm'):
      shared, own = getattr(disc.electra.embeddings, name), getattr(gen.electra.embeddings, name)
      for p in ('weight', 'bias') if name == 'LayerNorm' else ('weight',):
        np.testing.assert_array_equal(getattr(own, p).detach(), getattr(shared, p).detach())
        setattr(own, p, getattr(shared, p))
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
  for sub, model in models.items():  # The MLM decoders are tied to the word embedding.
    if sub or setup.kind != 'electra':
      assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
  return models


def _labels_BxL(corruption):
  """MLM labels at the predicted positions, -100 elsewhere (HF's ignore index)."""
  labels = np.full((BATCH, LENGTH), -100, np.int64)
  for b, p in zip(*np.nonzero(corruption['masked_weights'])):
    labels[b, corruption['masked_positions'][b, p]] = corruption['masked_labels'][b, p]
  assert (labels != -100).sum() == corruption['masked_weights'].sum()  # Distinct positions.
  return torch.from_numpy(labels)


def _torch_loss(setup, models, batch, corruption, rtd_weight):
  """HF's own losses on the corrupted batch: (total, components)."""
  t = lambda x: torch.from_numpy(np.asarray(x).astype(np.int64))
  mask, segments = t(batch['input_mask']), t(batch['segment_ids'])
  labels = _labels_BxL(corruption)
  if setup.kind == 'bert':
    out = models[''](input_ids=t(corruption['masked_input_ids']), token_type_ids=segments,
                     attention_mask=mask, labels=labels,
                     next_sentence_label=t(batch['pair_labels']))
    return out.loss, {}
  if setup.kind == 'roberta':
    out = models[''](input_ids=t(corruption['masked_input_ids']), attention_mask=mask,
                     labels=labels)
    return out.loss, {}
  generator = models[electra_lib.GENERATOR_EXPORT_DIR](
      input_ids=t(corruption['masked_input_ids']), token_type_ids=segments,
      attention_mask=mask, labels=labels)
  # The discriminator reads the original sequence with our generator's samples in it.
  fake = np.asarray(batch['input_ids']).copy()
  for b, p in zip(*np.nonzero(corruption['masked_weights'])):
    fake[b, corruption['masked_positions'][b, p]] = corruption['sampled'][b, p]
  np.testing.assert_array_equal(fake, corruption['fake_input_ids'])
  replaced = torch.from_numpy((fake != batch['input_ids']).astype(np.int64))
  discriminator = models[''](input_ids=t(fake), token_type_ids=segments, attention_mask=mask,
                             labels=replaced)
  total = generator.loss + rtd_weight * discriminator.loss
  return total, {'generator_mlm_loss': generator.loss, 'rtd_loss': discriminator.loss}


def _unique_params(models) -> dict[tuple[str, str], torch.nn.Parameter]:
  """(subdirectory, HF name) -> Parameter over every model, each Parameter once (the
  first name it has: ELECTRA's shared embeddings are the discriminator's)."""
  out, seen = {}, set()
  for sub, model in models.items():
    for name, p in model.named_parameters(remove_duplicate=False):
      if id(p) not in seen:
        seen.add(id(p))
        out[sub, name] = p
  return out


def _no_decay(name: str) -> bool:
  return 'bias' in name or 'LayerNorm' in name or 'layer_norm' in name


def _torch_step(models, *, clip=CLIP, decay_all=False, by_hand=None):
  """Clips and takes one AdamW step on the gradients in the models; returns the pre-clip
  global norm. ``torch.optim.AdamW``, or with ``by_hand`` (options of :func:`_adamw`)
  Adam written out. ``decay_all``, ``clip=0`` and the ``by_hand`` options other than the
  defaults are the mistakes the comparison must catch."""
  named = _unique_params(models)
  norm = torch.nn.utils.clip_grad_norm_(list(named.values()), clip) if clip else None
  decay = [p for (_, n), p in named.items() if decay_all or not _no_decay(n)]
  rest = [p for (_, n), p in named.items() if not decay_all and _no_decay(n)]
  groups = [g for g in ({'params': decay, 'weight_decay': WEIGHT_DECAY},
                        {'params': rest, 'weight_decay': 0.0}) if g['params']]
  if by_hand is None:
    torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=EPS).step()
  else:
    _adamw(groups, **by_hand)
  return norm


def _adamw(groups, bias_correction=True, eps_in_sqrt=False):
  """The first AdamW step written out: m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected,
  p <- p (1 - lr wd) - lr m / (sqrt(v) + eps) (or / sqrt(v + eps))."""
  b1, b2 = 0.9, 0.999
  with torch.no_grad():
    for group in groups:
      for p in group['params']:
        m, v = (1 - b1) * p.grad, (1 - b2) * p.grad ** 2
        if bias_correction:
          m, v = m / (1 - b1), v / (1 - b2)
        denominator = (v + EPS).sqrt() if eps_in_sqrt else v.sqrt() + EPS
        p.mul_(1 - LR * group['weight_decay']).sub_(LR * m / denominator)


def _torch_state(models) -> dict[str, dict[str, np.ndarray]]:
  return {sub: {k: p.detach().numpy().copy() for k, p in m.named_parameters()}
          for sub, m in models.items()}


def _torch_grads(models) -> dict[str, dict[str, np.ndarray]]:
  return {sub: {k: p.grad.detach().numpy().copy() for k, p in m.named_parameters()}
          for sub, m in models.items()}


# ------------------------------------------------------------------------------ test


def _max_param_diff(ours_new, theirs) -> float:
  return max(float(np.abs(v - theirs[sub][k]).max())
             for sub, tensors in ours_new.items() for k, v in tensors.items())


@pytest.mark.parametrize('name', sorted(SETUPS))
def test_one_training_step_matches_transformers_and_torch_adamw(name, monkeypatch):
  setup = SETUPS[name]
  ours = _ours(setup, monkeypatch)
  corruption, batch, metrics = ours['corruption'], ours['batch'], ours['metrics']
  assert corruption['masked_weights'].sum() >= BATCH * 2  # Several predictions per row.
  if setup.kind == 'electra':
    assert corruption['replaced'][batch['input_mask'] > 0].sum() > 0
  models = _torch_models(setup, ours)
  rtd_weight = float(ours['config'].objective.rtd_weight)
  loss, parts = _torch_loss(setup, models, batch, corruption, rtd_weight)

  # The loss (and ELECTRA's two parts), as our training step computed it.
  for key, theirs in [('loss', loss), *parts.items()]:
    theirs = float(theirs.detach())
    diff = MAX_DIFF[name, key] = abs(float(metrics[key]) - theirs)
    assert diff <= LOSS_RTOL * abs(theirs), (key, float(metrics[key]), theirs)

  # Every gradient, by HF name, and every torch parameter is compared. A tensor's tolerance
  # is relative to its largest gradient, floored at 1e-3 of the largest of all: the key
  # biases' gradients are 0 in exact arithmetic (softmax ignores a shift of every score
  # of a query) and rounding noise (~1e-9) on both sides.
  loss.backward()
  theirs = _torch_grads(models)
  ours_grads = _exported(ours['objective'], ours['grads'])
  largest = max(float(np.abs(t).max()) for tensors in theirs.values() for t in tensors.values())
  compared, worst, worst_abs = set(), 0.0, 0.0
  for sub, tensors in ours_grads.items():
    assert set(tensors) <= set(theirs[sub])
    for key, g in tensors.items():
      t = theirs[sub][key]
      diff = float(np.abs(g - t).max())
      rel = diff / max(float(np.abs(t).max()), 1e-3 * largest)
      assert rel <= GRAD_RTOL, (sub, key, diff, float(np.abs(t).max()))
      worst, worst_abs = max(worst, rel), max(worst_abs, diff)
      compared.add(id(models[sub].get_parameter(key)))
  assert compared == {id(p) for p in _unique_params(models).values()}
  MAX_DIFF[name, 'grad (rel)'], MAX_DIFF[name, 'grad (abs)'] = worst, worst_abs

  # One step: global-norm clipping (which does clip here) and AdamW with the decay mask,
  # against our training step's params.
  named = _unique_params(models)
  before = {k: (p.detach().clone(), p.grad.detach().clone()) for k, p in named.items()}
  norm = float(_torch_step(models))
  assert norm > 4 * CLIP
  diff = MAX_DIFF[name, 'grad norm'] = abs(float(metrics['grad_norm']) - norm)
  assert diff <= 1e-5 * norm, (float(metrics['grad_norm']), norm)
  assert float(metrics['learning_rate']) == np.float32(LR)  # warmup 0: the peak at step 0.
  ours_new = _exported(ours['objective'], ours['new_params'])
  diff = MAX_DIFF[name, 'params after step'] = _max_param_diff(ours_new, _torch_state(models))
  assert diff <= PARAM_ATOL
  moved = _max_param_diff(ours_new, _exported(ours['objective'], ours['params']))
  assert moved > 100 * PARAM_ATOL  # lr 1e-2: the step moved the params.

  # Adam written out agrees (eps outside the square root, as optax and torch put it), and
  # the comparison would catch a wrong decay mask, no clipping, no bias correction or eps
  # inside the square root.
  cases = [('by hand', dict(by_hand={}), True), ('decay all', dict(decay_all=True), False),
           ('no clipping', dict(clip=0.0), False),
           ('no bias correction', dict(by_hand=dict(bias_correction=False)), False),
           ('eps in sqrt', dict(by_hand=dict(eps_in_sqrt=True)), False)]
  for label, options, same in cases:
    with torch.no_grad():
      for k, p in named.items():
        p.copy_(before[k][0])
        p.grad = before[k][1].clone()
    _torch_step(models, **options)
    diff = MAX_DIFF[name, f'params, {label}'] = _max_param_diff(ours_new, _torch_state(models))
    assert (diff <= PARAM_ATOL) if same else (diff > 10 * PARAM_ATOL), (label, diff)
