"""The one schema every config starts from.

Each section maps onto one constructor (``model`` -> ``models.config.EncoderConfig`` of the
kind ``model.kind`` names in ``models.registry``,
``objective`` -> the objective registry, ``data``/``tokenizer`` -> ``encoder_jax.data``,
``optim`` -> ``optimizer.make``, ``mesh`` -> ``sharding.make_mesh``, ``checkpoint`` ->
``checkpointing.Checkpointer``), so no field is copied by hand into another object.
Configs in ``configs/`` call :func:`base_config` and override what they change; the
command line may only override keys that exist here (configs are locked).
"""

from __future__ import annotations

import ml_collections

from encoder_jax.data import config as data_config


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0  # Seeds parameter init, data order and the per-step masks.

  # ---- model: fields of models.config.EncoderConfig (BERT-base defaults). ----
  c.model = ml_collections.ConfigDict(dict(
      kind='bert',  # Name in models.registry.KINDS: 'bert', 'roberta', 'albert', 'electra', ...
      vocab_size=30522,  # Also the size of the tokenizer trained by prepare; checked at start-up.
      hidden_size=768,  # d_model.
      num_layers=12,
      num_heads=12,
      intermediate_size=3072,  # d_ff of the feed-forward block.
      max_position_embeddings=512,  # Learned absolute positions.
      type_vocab_size=2,  # Segment (A/B) embeddings.
      hidden_dropout_rate=0.1,
      attention_dropout_rate=0.1,
      layer_norm_eps=1e-12,
      initializer_range=0.02,  # Std of the truncated-normal init.
      attention_kind='dot_product',  # Name in models.attention_kinds.REGISTRY.
      dtype='float32',  # Activation dtype: 'float32' or 'bfloat16' (params stay float32).
      remat=False,  # Rematerialise each layer in the backward pass (saves activation memory).
      activation='gelu',  # Feed-forward/MLM-head activation: 'gelu' (erf), 'gelu_new' (tanh).
      embedding_size=0,  # Token embedding width E; 0 = hidden_size (ALBERT: 128, projected).
      share_layers='none',  # Cross-layer sharing: 'none', 'all' (ALBERT), 'attention', 'ffn'.
      position_offset=0,  # First position id (RoBERTa: padding id + 1 = 2).
      # jax.nn.dot_product_attention backend: 'xla', 'cudnn' (fused flash attention; bf16,
      # right-padded masks given as key lengths), or None: cuDNN on GPUs in bf16, else XLA.
      # Training with attention_dropout_rate > 0 always runs the explicit XLA softmax.
      attention_implementation=ml_collections.config_dict.placeholder(str),
      # XLNet: Transformer-XL memory of mem_len cached states per layer, carried across steps
      # in the training state (0 = none); relative distances clipped to +-clamp_len (-1 = no).
      mem_len=0,
      clamp_len=-1,
      # DeBERTa only (kinds 'deberta', 'deberta_v2'; attention_kind='disentangled'):
      position_biased_input=True,  # Absolute positions in the input (DeBERTa: False, EMD).
      max_relative_positions=-1,  # Relative span k (distances clipped at k); < 1 = max_position_embeddings.
      position_buckets=0,  # deberta_v2: log buckets of relative positions (v2/v3: 256); 0 = off.
      share_att_key=False,  # deberta_v2: position keys/queries use the content projections.
      norm_rel_ebd=False,  # deberta_v2: LayerNorm on the relative-position embeddings.
      pos_att_type='c2p|p2c',  # Disentangled terms beside c2c: 'c2p|p2c', 'c2p', 'p2c' or ''.
      emd_layers=0,  # Enhanced mask decoder: layers sharing the last layer's weights (2); 0 = off.
  ))

  # ---- objective: names in objectives.REGISTRY, summed; masking recipe. ----
  c.objective = ml_collections.ConfigDict(dict(
      # Losses to add up; 'nsp'/'sop' need matching data.pair_kind; 'sbo' (SpanBERT's span
      # boundary objective) needs 'mlm'; 'electra' (generator + discriminator) stands alone.
      names=('mlm', 'nsp'),
      mask_rate=0.15,  # Fraction of maskable tokens per sequence selected for prediction.
      mask_token_rate=0.8,  # Of the selected: replaced by [MASK].
      random_token_rate=0.1,  # Of the selected: replaced by a random token (rest unchanged).
      random_token_distribution='uniform',  # 'uniform' over the vocabulary or 'unigram' counts.
      whole_word_masking=False,  # Select whole words (all their pieces) instead of pieces.
      max_ngram=1,  # ALBERT n-gram masking: spans of 1..max_ngram words, p(n) ~ 1/n; 1 = off.
      # SpanBERT span masking: span lengths (words) ~ Geometric(span_p) truncated at
      # max_span_length, 80/10/10 decided per span; 0 = off (SpanBERT: 0.2 and 10).
      span_p=0.0,
      max_span_length=10,
      # ELECTRA ('electra' objective, model.kind='electra'): the generator's hidden size and
      # depth as fractions of the discriminator's (small/large: 1/4, base: 1/3; layers 1.0),
      # and the weight of the replaced-token-detection loss (loss = MLM_gen + rtd_weight * RTD).
      generator_hidden_fraction=0.25,
      generator_layers_fraction=1.0,
      rtd_weight=50.0,
      # XLNet ('plm'): about 1/K of each sequence is predicted, spans of 1..max_ngram tokens
      # each in a context of K x its length (XLNet: K=6, max_ngram=5); bidirectional_data
      # makes the second half of each batch the backward stream (the paper's bi_data).
      partial_prediction_k=6,
      bidirectional_data=False,
  ))

  # ---- data and tokenizer: owned by encoder_jax.data. ----
  c.data = data_config.data_config()
  c.tokenizer = data_config.tokenizer_config()

  # ---- train: steps, global batch, sequence-length phases. ----
  c.train = ml_collections.ConfigDict(dict(
      num_steps=1_000_000,  # Optimizer steps over all phases.
      batch_size=256,  # Global sequences per optimizer step (all hosts, all micro-batches).
      grad_accum_steps=1,  # Micro-batches per optimizer step (batch_size must divide).
      seq_lens=(128, 512),  # Tokens per sequence in each phase.
      max_predictions=(20, 80),  # MLM positions per sequence in each phase.
      phase_fractions=(0.9, 0.1),  # Share of num_steps spent in each phase (sums to 1).
      log_every_steps=100,
      eval_every_steps=10_000,  # 0 disables periodic held-out evaluation.
      eval_batches=20,  # Held-out batches per evaluation.
      # PRNG for dropout masks: 'rbg' (fast; bits may depend on the mesh) or 'threefry'
      # (identical bits on any mesh; several times slower in the layer scan on CPU).
      dropout_rng_impl='rbg',
      nonfinite_policy='stop',  # On NaN/inf loss: 'stop' (name the last good checkpoint) or 'skip'.
      peak_tflops_per_device=0.0,  # For MFU; 0 = look the device up in metrics.PEAK_TFLOPS.
  ))

  # ---- optim: optimizer.make. ----
  c.optim = ml_collections.ConfigDict(dict(
      name='adamw',  # 'adamw' or 'lamb'.
      learning_rate=1e-4,  # Peak, reached after warmup_steps.
      warmup_steps=10_000,  # Linear warmup from 0; then linear decay to 0 at train.num_steps.
      b1=0.9,
      b2=0.999,
      eps=1e-6,
      weight_decay=0.01,  # Decoupled; not applied to LayerNorm parameters and biases.
      grad_clip_norm=1.0,  # Global-norm clipping; 0 disables.
  ))

  # ---- mesh: sharding.make_mesh. -1 = all remaining devices. ----
  c.mesh = ml_collections.ConfigDict(dict(
      data=-1,  # Pure data parallelism (replicated params).
      fsdp=1,  # Data parallelism with params/optimizer state sharded (ZeRO-3 style).
      tensor=1,  # Megatron-style tensor parallelism over heads / d_ff / vocab.
  ))

  # ---- checkpoint: checkpointing.Checkpointer. ----
  c.checkpoint = ml_collections.ConfigDict(dict(
      every_steps=10_000,  # Save period (plus a final save and one on SIGTERM).
      keep=3,  # Most recent checkpoints kept.
      async_save=True,  # Write in the background while training continues.
  ))
  return c


def parse_arg(arg: str | None, **defaults):
  """Parses a big_vision-style config argument: ``'runlocal=True,variant=x'``.

  Only keys named in ``defaults`` are accepted; values are cast to the default's type.
  """
  out = dict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, sep, value = item.partition('=')
    key = key.strip()
    if key not in defaults:
      raise ValueError(f'Unknown config argument {key!r}; valid: {sorted(defaults)}')
    default = defaults[key]
    if isinstance(default, bool):
      if not sep:
        value = 'true'
      if value.lower() not in ('true', 'false', '1', '0'):
        raise ValueError(f'Config argument {key!r} expects true/false, got {value!r}')
      out[key] = value.lower() in ('true', '1')
    else:
      out[key] = type(default)(value) if default is not None else value
  return ml_collections.ConfigDict(out)


def shrink_for_local_run(c: ml_collections.ConfigDict) -> None:
  """``runlocal``: the same recipe, small enough for a 2-core CPU in a few minutes."""
  # The embedded corpus (~1.6 MB) supports a vocabulary of at most ~9k pieces.
  c.model.update(vocab_size=8000, hidden_size=128, num_layers=2, num_heads=2,
                 intermediate_size=512, max_position_embeddings=128, dtype='float32')
  c.data.sources = 'embedded'
  c.train.update(num_steps=300, batch_size=32, seq_lens=(64, 128), max_predictions=(10, 20),
                 phase_fractions=(0.9, 0.1), log_every_steps=20, eval_every_steps=100,
                 eval_batches=4)
  c.optim.update(learning_rate=1e-3, warmup_steps=30)
  c.checkpoint.update(every_steps=100, keep=2)
