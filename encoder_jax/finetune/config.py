"""The fine-tuning config schema; ``configs/finetune_*.py`` start from :func:`base_config`.

Each section maps onto one piece: ``init`` -> the pretrained weights
(``encoder_jax.loading``), ``data`` -> ``finetune.data``, ``optim`` -> the optimizer
in ``finetune.train``, ``task`` -> ``finetune.heads.make``; ``mesh``, ``dtype``,
``nonfinite_policy`` and ``checkpoint_keep`` -> the training engine (as in pretraining).
"""

from __future__ import annotations

import ml_collections

from encoder_jax.finetune import tasks


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # An entry of finetune.tasks.REGISTRY: 'sequence_classification', 'sequence_regression'
  # (a score per text or pair, STS-B), 'token_classification' (tagging, e.g. NER),
  # 'question_answering' (SQuAD), 'sbert_classification', 'sbert_contrastive'.
  c.task = tasks.TASK.default
  # The fields the tasks declare (finetune.tasks.FIELDS), e.g. question answering's window
  # stride; each task reads its own.
  c.task_settings = ml_collections.ConfigDict({k: f.default for k, f in tasks.FIELDS.items()})
  c.seed = 0  # Head init, dropout and shuffling.

  # ---- init: the pretrained encoder; exactly one of workdir / hf_dir. ----
  c.init = ml_collections.ConfigDict(dict(
      workdir='',  # A pretraining (or encoder_jax.convert) workdir; its config.json is used.
      step=-1,  # Checkpoint step in workdir; -1 = the latest.
      hf_dir='',  # Or a Hugging Face BERT directory (config.json + weights + vocab.txt).
      # The source's network and tokenizer, but every parameter freshly initialised: the
      # from-scratch baseline that says what pretraining bought.
      from_scratch=False,
  ))

  # ---- data: source specs 'tfds:NAME:SPLIT', 'tsv:PATH' (header row), 'jsonl:PATH'. ----
  c.data = ml_collections.ConfigDict(dict(
      train='',
      eval='',
      more_evals='',  # 'NAME=SPEC,...': more splits scored after the last epoch (metrics NAME_*).
      tfds_data_dir='',  # data_dir for 'tfds:' specs ('' = the tfds default).
      text_fields=('sentence',),  # Sequence task: 1 field, or 2 for sentence pairs.
      label_field='label',  # Sequence task: int or string label (regression: a number).
      tokens_field='tokens',  # Token task: list of words (or a whitespace-separated string).
      tags_field='tags',  # Token task: one label per word (ints or strings).
      labels=(),  # Label names, index = class id; () = from tfds, or the sorted train labels.
      max_len=128,  # Tokens per example including [CLS]/[SEP]; longer inputs are truncated.
      # Sequence classification: whole examples packed back to back into rows of max_len
      # (each attends to itself only, pooled by the mean of its tokens: pooling='mean'; kinds
      # with packed rows); optim.batch_size and eval_batch_size then count rows.
      packing=False,
  ))

  # ---- optim: AdamW, linear warmup then linear decay to 0 (BERT fine-tuning). ----
  c.optim = ml_collections.ConfigDict(dict(
      learning_rate=2e-5,  # Peak.
      warmup_fraction=0.1,  # Share of all steps spent warming up from 0.
      weight_decay=0.01,  # Not applied to biases and LayerNorm parameters.
      grad_clip_norm=1.0,  # 0 disables.
      b1=0.9,  # AdamW's moment decay rates and epsilon (BERT fine-tuning's).
      b2=0.999,
      eps=1e-6,
      epochs=3,
      batch_size=32,  # Examples per step (rows with data.packing).
      eval_batch_size=64,
  ))
  c.dropout_rate = 0.1  # Head dropout.
  # The encoder's hidden and attention dropout while fine-tuning; -1 = its config's rates
  # (a checkpoint pretrained without dropout, as the small-budget recipe, then has none).
  c.encoder_dropout = -1.0
  c.eval_every_epoch = True  # False: evaluate only after the last epoch.
  # Sequence tasks: 'cls' (the [CLS] state through the kind's pooler, as BERT fine-tunes) or
  # 'mean' (the mean of the real tokens' final states: for encoders whose pretraining never
  # trained [CLS], e.g. MLM-only, ELECTRA, XLNet's PLM).
  c.pooling = 'cls'

  # ---- the training engine's settings (as in pretraining) ----
  c.dtype = ''  # Activations: '' = the checkpoint's model.dtype, 'float32' or 'bfloat16'.
  c.nonfinite_policy = 'stop'  # On a NaN/inf loss: 'stop' or 'skip' the update.
  c.checkpoint_keep = 1  # Checkpoints kept in <workdir>/checkpoints (one per epoch end).
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # As pretraining's.
  return c
