"""Shared helpers for the interop tests: small randomised Hugging Face BERTs and inputs."""

from __future__ import annotations

import numpy as np
import torch
import transformers


def random_hf_model(cls=transformers.BertForPreTraining, *, vocab_size=97, hidden_size=36,
                    num_layers=2, num_heads=3, intermediate_size=50, max_positions=24, seed=0,
                    randomize=True):
  """An HF model in eval mode; every parameter (biases, LayerNorms too) random if ``randomize``.

  Without ``randomize`` it keeps HF's own BERT init (std 0.02, zero biases), which trains.
  """
  config = transformers.BertConfig(
      vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
      num_attention_heads=num_heads, intermediate_size=intermediate_size,
      max_position_embeddings=max_positions, type_vocab_size=2, hidden_act='gelu',
      attn_implementation='eager')
  torch.manual_seed(seed)
  model = cls(config).eval()
  if not randomize:
    return model
  with torch.no_grad():
    for name, p in model.named_parameters():
      if 'LayerNorm.weight' in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
  return model


def padded_inputs(vocab_size: int, batch: int = 3, length: int = 11, seed: int = 0):
  """Token ids, segment ids and a mask with a different amount of padding per row."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, vocab_size, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  for b in range(1, batch):
    mask[b, length - 3 * b:] = 0
  ids = ids * mask
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
  from encoder_jax.interop import checkpoint_io  # pylint: disable=g-import-not-at-top
  c = checkpoint_io.read_run_config(workdir)
  c.data.update(sources=f'text:{corpus}', prepared_dir=prepared_dir, num_workers=1,
                held_out_fraction=0.2)
  c.train.update(num_steps=2, batch_size=8, seq_lens=(24,), max_predictions=(4,),
                 phase_fractions=(1.0,), eval_every_steps=0, log_every_steps=1, eval_batches=3)
  c.optim.update(warmup_steps=1)
  c.checkpoint.update(every_steps=1, async_save=False)
  return c
