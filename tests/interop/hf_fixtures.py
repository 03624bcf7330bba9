"""Shared helpers for the interop tests: small randomised Hugging Face BERTs and inputs."""

from __future__ import annotations

import numpy as np
import torch
import transformers


def random_hf_model(cls=transformers.BertForPreTraining, *, vocab_size=97, hidden_size=36,
                    num_layers=2, num_heads=3, intermediate_size=50, max_positions=24, seed=0):
  """An HF model whose every parameter (biases and LayerNorms too) is random, in eval mode."""
  config = transformers.BertConfig(
      vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
      num_attention_heads=num_heads, intermediate_size=intermediate_size,
      max_position_embeddings=max_positions, type_vocab_size=2, hidden_act='gelu',
      attn_implementation='eager')
  torch.manual_seed(seed)
  model = cls(config).eval()
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
