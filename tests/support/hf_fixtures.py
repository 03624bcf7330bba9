"""Shared helpers for the interop tests: small randomised Hugging Face models of each kind
(BERT, RoBERTa, ALBERT) and padded inputs."""

from __future__ import annotations

import numpy as np
import torch
import transformers


# HF model classes by our kind: (pretraining/export architecture, MaskedLM, bare base).
HF_CLASSES = {
    'bert': (transformers.BertForPreTraining, transformers.BertForMaskedLM,
             transformers.BertModel),
    'roberta': (transformers.RobertaForMaskedLM, transformers.RobertaForMaskedLM,
                transformers.RobertaModel),
    'albert': (transformers.AlbertForPreTraining, transformers.AlbertForMaskedLM,
               transformers.AlbertModel),
    'modernbert': (transformers.ModernBertForMaskedLM, transformers.ModernBertForMaskedLM,
                   transformers.ModernBertModel),
}
# The id each kind pads with (RoBERTa's position ids start after it).
PAD_IDS = {'bert': 0, 'roberta': 1, 'albert': 0, 'modernbert': 2}
# ModernBERT away from its defaults: a 4-token window (2 either side), every second layer
# global (the default is every third), RoPE bases 1,000 / 77 (160,000 / 10,000).
MODERNBERT_OPTIONS = dict(local_attention=4, global_attn_every_n_layers=2,
                          global_rope_theta=1000.0, local_rope_theta=77.0)


def hf_config(kind: str = 'bert', *, vocab_size=97, hidden_size=36, num_layers=2, num_heads=3,
              intermediate_size=50, max_positions=24, embedding_size=None):
  """The HF config of a small ``kind`` model, with each kind's own conventions.

  ``max_positions`` is the longest sequence the model takes: RoBERTa's table gets the two
  extra rows its position numbering (from pad id + 1) needs, one token type and eps 1e-5;
  ALBERT gets a factorized embedding (``embedding_size`` != hidden, so the projection is
  exercised), the tanh GELU of its released models and one shared layer group.
  """
  common = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                num_attention_heads=num_heads, intermediate_size=intermediate_size,
                attn_implementation='eager')
  if kind == 'bert':
    return transformers.BertConfig(**common, max_position_embeddings=max_positions,
                                   type_vocab_size=2, hidden_act='gelu')
  if kind == 'roberta':
    return transformers.RobertaConfig(
        **common, max_position_embeddings=max_positions + PAD_IDS['roberta'] + 1,
        type_vocab_size=1, layer_norm_eps=1e-5, hidden_act='gelu',
        pad_token_id=PAD_IDS['roberta'], bos_token_id=0, eos_token_id=2)
  if kind == 'albert':
    return transformers.AlbertConfig(
        **common, embedding_size=embedding_size or max(2, hidden_size // 2 + 1),
        max_position_embeddings=max_positions, type_vocab_size=2, hidden_act='gelu_new',
        num_hidden_groups=1, inner_group_num=1, pad_token_id=PAD_IDS['albert'])
  if kind == 'modernbert':
    pad = PAD_IDS['modernbert']
    return transformers.ModernBertConfig(
        **common, max_position_embeddings=max_positions, **MODERNBERT_OPTIONS,
        pad_token_id=pad, bos_token_id=pad + 1, cls_token_id=pad + 1, eos_token_id=pad + 2,
        sep_token_id=pad + 2)
  raise ValueError(f'kind={kind!r}; expected one of {sorted(HF_CLASSES)}')


def randomize_(model, seed: int | None = None):
  """Every parameter random (biases and LayerNorms too), so no term of the computation
  hides behind a zero or a one; returns ``model``. ``seed=None`` continues torch's stream."""
  if seed is not None:
    torch.manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if 'LayerNorm.weight' in name or name.endswith('norm.weight'):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
  return model


def random_hf_model(cls=transformers.BertForPreTraining, *, vocab_size=97, hidden_size=36,
                    num_layers=2, num_heads=3, intermediate_size=50, max_positions=24, seed=0,
                    randomize=True, embedding_size=None):
  """An HF model of ``cls`` (any class in HF_CLASSES: its kind is the class's model_type)
  in eval mode; every parameter random if ``randomize``.

  Without ``randomize`` it keeps HF's own init (std 0.02, zero biases), which trains.
  """
  config = hf_config(cls.config_class.model_type, vocab_size=vocab_size,
                     hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                     intermediate_size=intermediate_size, max_positions=max_positions,
                     embedding_size=embedding_size)
  torch.manual_seed(seed)
  model = cls(config).eval()
  return randomize_(model) if randomize else model


def padded_inputs(vocab_size: int, batch: int = 3, length: int = 11, seed: int = 0,
                  pad_id: int = 0):
  """Token ids, segment ids and a mask with a different amount of padding per row.

  Padding positions hold ``pad_id`` (RoBERTa numbers positions from the ids, so padding
  must be its pad id 1 there); real tokens never do (ids above ``pad_id``).
  """
  rng = np.random.default_rng(seed)
  ids = rng.integers(pad_id + 1, vocab_size, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  for b in range(1, batch):
    mask[b, max(1, length - 3 * b):] = 0
  ids = np.where(mask > 0, ids, pad_id).astype(np.int32)
  segments = np.zeros_like(ids)
  segments[:, length // 2:] = 1
  segments *= mask
  return ids, segments, mask


WORDS = ('the', 'cat', 'dog', 'sat', 'on', 'mat', 'is', 'was', 'and', 'of', 'to', 'in',
         'it', 'good', 'bad', 'movie', 'film', 'great', 'terrible', 'paris', 'france',
         'london', 'city', 'capital', 'john', 'lives', 'works', 'at', 'google', 'not')


def write_vocab(path: str) -> int:
  """A small uncased WordPiece vocab.txt that covers any lowercase ASCII text; its size."""
  letters = [chr(c) for c in range(ord('a'), ord('z') + 1)] + list('0123456789')
  pieces = (['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + list('.,!?\'-') + letters
            + ['##' + c for c in letters] + list(WORDS))
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(p + '\n' for p in pieces)
  return len(pieces)


def write_corpus(path: str, num_documents: int = 60, seed: int = 0) -> str:
  """Text-source corpus over WORDS: one sentence per line, a blank line between documents."""
  rng = np.random.default_rng(seed)
  words = [w for w in WORDS if w != 'not']
  with open(path, 'w', encoding='utf-8') as f:
    for _ in range(num_documents):
      for _ in range(int(rng.integers(3, 7))):
        n = int(rng.integers(4, 10))
        f.write(' '.join(rng.choice(words, n)).capitalize() + '.\n')
      f.write('\n')
  return path


def make_workdir(root: str, **shape):
  """(hf_dir, workdir, HF model): a random BertForPreTraining imported into a workdir."""
  import os  # pylint: disable=g-import-not-at-top
  from encoder_jax import convert  # pylint: disable=g-import-not-at-top
  hf_dir, workdir = os.path.join(root, 'hf'), os.path.join(root, 'workdir')
  os.makedirs(hf_dir)
  vocab_size = write_vocab(os.path.join(hf_dir, 'vocab.txt'))
  model = random_hf_model(vocab_size=vocab_size, **shape)
  model.save_pretrained(hf_dir)
  convert.hf_to_workdir(hf_dir, workdir)
  return hf_dir, workdir, model


def tiny_run_config(workdir: str, corpus: str, prepared_dir: str):
  """The workdir's config, shrunk to a few small steps on ``corpus``."""
  from encoder_jax.loading import loaded as loading  # pylint: disable=g-import-not-at-top
  c = loading.read_run_config(workdir)
  c.data.update(sources=f'text:{corpus}', prepared_dir=prepared_dir, num_workers=1,
                held_out_fraction=0.2)
  c.train.update(num_steps=2, batch_size=8, seq_lens=(24,), max_predictions=(4,),
                 phase_fractions=(1.0,), eval_every_steps=0, log_every_steps=1, eval_batches=3)
  c.optim.update(warmup_steps=1)
  c.checkpoint.update(every_steps=1, async_save=False)
  return c


def max_diff_printer(table: dict, what: str = 'float32, non-padding positions'):
  """An autouse module fixture that prints ``table`` ((case, ...) -> max |ours - theirs|)
  after the module's tests (shown with ``pytest -s``): the parity figures to report."""
  import pytest  # pylint: disable=g-import-not-at-top

  @pytest.fixture(scope='module', autouse=True)
  def print_max_diffs():
    yield
    if table:
      print(f'\nmax |ours - transformers| ({what}):')
      for key, diff in sorted(table.items()):
        print('  ' + ' '.join(f'{k:<14}' for k in key) + f' {diff:.3g}')
  return print_max_diffs

