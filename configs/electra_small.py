r"""ELECTRA-Small pretraining, the paper's recipe (Clark et al. 2020, Appendix A, Table 6).

Discriminator: 12 layers, hidden 256, 4 heads, d_ff 1024, embedding size 128 (projected
to 256); generator: the same depth at 1/4 of the hidden size (64, one head, d_ff 256),
sharing the token, position and segment embeddings (and their LayerNorm) with the
discriminator. Recipe: 15% of the tokens masked (85% [MASK], 15% unchanged, no random
tokens), replacements sampled from the generator, replaced-token detection over every
token; loss = MLM_gen + 50 * RTD; batch 128 for 1M steps at 128 tokens; AdamW lr 5e-4,
10K warmup steps, linear decay, weight decay 0.01, eps 1e-6; dropout 0.1; an uncased
vocabulary of 30,522 pieces (BERT's size; here a SentencePiece model trained on the
corpus), as google-research/electra's ``configure_pretraining.py``.
Data: English Wikipedia from tensorflow-datasets (the paper used Wikipedia + BooksCorpus;
ELECTRA-Small++ and Large also OpenWebText).

Fine-tuning, features and export use the discriminator (``ElectraForPreTraining``; the
generator goes to ``OUT/generator`` as ``ElectraForMaskedLM``).

  python -m encoder_jax.main --config=configs/electra_small.py --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/electra_small.py:runlocal=True --workdir=/tmp/e
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = config_base.base_config()
  c.model.update(kind='electra', vocab_size=30522, hidden_size=256, num_layers=12,
                 num_heads=4, intermediate_size=1024, embedding_size=128,
                 dtype='bfloat16')  # bf16 activations; params and optimizer state float32.
  c.tokenizer.update(kind='sentencepiece', lowercase=True)
  c.objective.update(names=('electra',), mask_rate=0.15, mask_token_rate=0.85,
                     random_token_rate=0.0, generator_layers_fraction=1.0, rtd_weight=50.0)
  c.data.update(sources='tfds:wikipedia/20230601.en:train', pair_kind='full_sentences')
  c.objective.generator_hidden_fraction = 0.25
  c.train.update(
      num_steps=1_000_000,
      batch_size=128,
      seq_lens=(128,),
      max_predictions=(19,),  # ELECTRA: int((0.15 + 0.005) * 128) = 19.
      phase_fractions=(1.0,),
  )
  c.optim.update(name='adamw', learning_rate=5e-4, warmup_steps=10_000, b1=0.9, b2=0.999,
                 eps=1e-6, weight_decay=0.01, grad_clip_norm=1.0)
  if args.runlocal:
    config_base.shrink_for_local_run(c)
    # Keep ELECTRA's structure at the small size: E < hidden (64 -> 128), a generator of
    # 1/4 the width (32, with its own 64 -> 32 projection), one phase of 128 tokens.
    c.model.update(embedding_size=64)
    c.train.update(seq_lens=(128,), max_predictions=(19,), phase_fractions=(1.0,))
  return c
