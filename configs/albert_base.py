r"""ALBERT-base pretraining, the paper's recipe (Lan et al. 2019, section 4.1; ALBERT v2).

12 layers, hidden 768, 12 heads; factorized embedding (vocabulary 30,000 -> E=128 ->
768), one set of layer parameters shared by all 12 layers, the tanh GELU of the released
models, no dropout (v2); 11.8M parameters (= Hugging Face ``AlbertForPreTraining``).
Recipe: MLM + SOP (sentence-order prediction: two consecutive segments, swapped half the
time), n-gram masking of whole words (n <= 3, p(n) ∝ 1/n), sequences of 512 tokens
(shorter with probability 0.1), batch 4096, LAMB at lr 0.00176 with 3,125 warmup steps,
125K steps; a SentencePiece unigram vocabulary, lowercased.

Masked positions: 20 per sequence, as the ALBERT code's ``max_predictions_per_seq``
(which caps the 15% rate at 512 tokens); set ``train.max_predictions=(80,)`` for a full 15%.
Data: English Wikipedia from tensorflow-datasets (BookCorpus is no longer distributed).

  python -m encoder_jax.main --config=configs/albert_base.py --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/albert_base.py:runlocal=True --workdir=/tmp/a
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = config_base.base_config()
  c.model.update(
      kind='albert',
      vocab_size=30000,
      embedding_size=128,
      share_layers='all',
      activation='gelu_new',
      hidden_dropout_rate=0.0,
      attention_dropout_rate=0.0,
      dtype='bfloat16',  # Activations; params and optimizer state stay float32.
  )
  c.tokenizer.update(kind='sentencepiece', model_type='unigram', lowercase=True)
  c.objective.update(names=('mlm', 'sop'), whole_word_masking=True, max_ngram=3)
  c.data.update(sources='tfds:wikipedia/20230601.en:train', pair_kind='sop',
                short_seq_prob=0.1)
  c.train.update(
      num_steps=125_000,
      batch_size=4096,
      grad_accum_steps=16,  # 256 sequences per micro-batch; lower it on a larger slice.
      seq_lens=(512,),
      max_predictions=(20,),
      phase_fractions=(1.0,),
  )
  c.optim.update(name='lamb', learning_rate=0.00176, warmup_steps=3125, b1=0.9, b2=0.999,
                 eps=1e-6, weight_decay=0.01, grad_clip_norm=1.0)
  if args.runlocal:
    config_base.shrink_for_local_run(c)
    # Keep ALBERT's structure at the small size: E < hidden, all layers shared, no
    # dropout, one phase, accumulation (of 2 micro-batches of 16, not 16 of 2).
    c.model.update(embedding_size=32, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    c.train.update(seq_lens=(128,), max_predictions=(20,), phase_fractions=(1.0,),
                   grad_accum_steps=2)
  return c
