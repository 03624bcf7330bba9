r"""XLNet-large pretraining, the paper's recipe (Yang et al. 2019, Sec. 3.1 and Table 7).

24 layers, hidden 1024, 16 heads (64 each), d_ff 4096, dropout 0.1; sequence length 512,
batch 8192 (32 accumulated micro-batches of 256), 500K steps, Adam with weight decay 0.01
(eps 1e-6), peak lr 4e-4 after 40K warmup steps, linear decay; permutation LM with
two-stream attention, partial prediction K = 6 (85 targets per sequence, spans of up to
5 tokens), inputs ``A [SEP] B [SEP] [CLS]``, bidirectional data; a 32,000-piece cased
SentencePiece vocabulary. The XLNet settings are those of ``configs/xlnet_base.py`` (see
there why the Transformer-XL memory, 384 in the paper, is off: ``model.mem_len=384``
turns it on).

Data: the paper's 126 GB (BooksCorpus, Wikipedia, Giga5, ClueWeb, Common Crawl) is not in
tensorflow-datasets; English Wikipedia is the default here; add sources as in
``configs/roberta_base.py``.

  python -m encoder_jax.main --config=configs/xlnet_large.py --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/xlnet_large.py:runlocal=True --workdir=/tmp/x
"""

from encoder_jax.config import schema as config_base

SEQ_LEN = 512
PARTIAL_PREDICTION_K = 6


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = config_base.base_config()
  c.model.update(kind='xlnet', vocab_size=32000, hidden_size=1024, num_layers=24, num_heads=16,
                 intermediate_size=4096, max_position_embeddings=SEQ_LEN,
                 type_vocab_size=3,  # Segments A, B, [CLS] (only same/different is read).
                 layer_norm_eps=1e-12, activation='gelu', mem_len=0, clamp_len=-1,
                 dtype='bfloat16')  # Activations; params and optimizer state stay float32.
  c.tokenizer.update(kind='sentencepiece', lowercase=False)  # XLNet's vocabulary is cased.
  c.objective.update(names=('plm',), partial_prediction_k=PARTIAL_PREDICTION_K, max_ngram=5,
                     bidirectional_data=True)
  c.data.update(sources='tfds:wikipedia/20230601.en:train', pair_kind='xlnet',
                short_seq_prob=0.0)  # XLNet's rows are always full length.
  c.train.update(num_steps=500_000, batch_size=8192,
                 grad_accum_steps=32,  # 256 sequences per micro-batch; lower on larger slices.
                 seq_lens=(SEQ_LEN,), max_predictions=(round(SEQ_LEN / PARTIAL_PREDICTION_K),),
                 phase_fractions=(1.0,))
  c.optim.update(name='adamw', learning_rate=4e-4, warmup_steps=40_000, b1=0.9, b2=0.999,
                 eps=1e-6, weight_decay=0.01, grad_clip_norm=1.0)
  if args.runlocal:
    config_base.shrink_for_local_run(c)
    seq_len = 128
    c.model.update(max_position_embeddings=seq_len)
    c.train.update(seq_lens=(seq_len,), max_predictions=(round(seq_len / PARTIAL_PREDICTION_K),),
                   phase_fractions=(1.0,),
                   grad_accum_steps=2)  # Keeps the accumulation path in the small run.
  return c
