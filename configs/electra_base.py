r"""ELECTRA-Base pretraining, the paper's recipe (Clark et al. 2020, Appendix A, Table 6).

Discriminator: BERT-base's shapes (12 layers, hidden 768, 12 heads, d_ff 3072, embedding
size 768: no projection); generator: the same depth at 1/3 of the hidden size (256, 4
heads, d_ff 1024, with its own 768 -> 256 projection of the shared embeddings). Recipe as
``electra_small.py`` (15% masked, 85% [MASK], samples from the generator, loss = MLM_gen
+ 50 * RTD) with batch 256 for 766K steps at 512 tokens, AdamW lr 2e-4, 10K warmup steps.

  python -m encoder_jax.main --config=configs/electra_base.py --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/electra_base.py:runlocal=True --workdir=/tmp/e
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = config_base.base_config()
  c.model.update(kind='electra', vocab_size=30522, hidden_size=768, num_layers=12,
                 num_heads=12, intermediate_size=3072, embedding_size=768,
                 dtype='bfloat16')  # bf16 activations; params and optimizer state float32.
  c.tokenizer.update(kind='sentencepiece', lowercase=True)
  c.objective.update(names=('electra',), mask_rate=0.15, mask_token_rate=0.85,
                     random_token_rate=0.0, generator_layers_fraction=1.0, rtd_weight=50.0)
  c.data.update(sources='tfds:wikipedia/20230601.en:train', pair_kind='full_sentences')
  c.objective.generator_hidden_fraction = 1 / 3
  c.train.update(
      num_steps=766_000,
      batch_size=256,
      seq_lens=(512,),
      max_predictions=(79,),  # ELECTRA: int((0.15 + 0.005) * 512) = 79.
      phase_fractions=(1.0,),
  )
  c.optim.update(name='adamw', learning_rate=2e-4, warmup_steps=10_000, b1=0.9, b2=0.999,
                 eps=1e-6, weight_decay=0.01, grad_clip_norm=1.0)
  if args.runlocal:
    config_base.shrink_for_local_run(c)
    # Keep ELECTRA-Base's structure at the small size: no embedding projection in the
    # discriminator (E = hidden), a 1/3-wide generator with its own projection.
    c.model.update(hidden_size=96, num_heads=2, intermediate_size=384, embedding_size=96)
    c.train.update(seq_lens=(128,), max_predictions=(19,), phase_fractions=(1.0,))
  return c
