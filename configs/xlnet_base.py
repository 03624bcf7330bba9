r"""XLNet-base pretraining in the paper's BERT-comparable setting (Yang et al. 2019, Sec. 3.4).

BERT-base's size (12 layers, hidden 768, 12 heads, d_ff 3072) and recipe (batch 256, 1M
steps, Adam with weight decay 0.01, peak lr 1e-4 after 10K warmup steps, linear decay,
dropout 0.1), trained with XLNet's objective: permutation language modelling with
two-stream attention over Transformer-XL relative positions and relative segments
(``model.kind='xlnet'``, ``objective.names=('plm',)``); partial prediction K = 6 (85 of
512 tokens predicted, spans of up to 5 tokens); inputs ``A [SEP] B [SEP] [CLS]`` at length
512 (``data.pair_kind='xlnet'``), with the bidirectional data pipeline (half of each batch
is the backward stream). A 32,000-piece cased SentencePiece vocabulary, as XLNet's.

Memory: the paper caches 384 states per layer over consecutive segments of one text
stream (``reuse_len`` 256). This pipeline shuffles examples, so a cached memory would hold
another example's text: ``model.mem_len`` is 0 here. Set it (e.g. 384) to carry the memory
anyway; it is then part of the training state and its checkpoints.

  python -m encoder_jax.main --config=configs/xlnet_base.py --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/xlnet_base.py:runlocal=True --workdir=/tmp/x
"""

from encoder_jax.config import schema as config_base

SEQ_LEN = 512
PARTIAL_PREDICTION_K = 6


def xlnet(c, seq_len: int = SEQ_LEN):
  """XLNet's network, objective and data layout on top of a base config."""
  c.model.update(kind='xlnet', vocab_size=32000, max_position_embeddings=seq_len,
                 type_vocab_size=3,  # Segments A, B, [CLS] (only same/different is read).
                 layer_norm_eps=1e-12, activation='gelu', mem_len=0, clamp_len=-1,
                 dtype='bfloat16')  # Activations; params and optimizer state stay float32.
  c.tokenizer.update(kind='sentencepiece', lowercase=False)  # XLNet's vocabulary is cased.
  c.objective.update(names=('plm',), partial_prediction_k=PARTIAL_PREDICTION_K, max_ngram=5,
                     bidirectional_data=True)
  c.data.update(sources='tfds:wikipedia/20230601.en:train', pair_kind='xlnet',
                short_seq_prob=0.0)  # XLNet's rows are always full length.
  c.train.update(seq_lens=(seq_len,), max_predictions=(round(seq_len / PARTIAL_PREDICTION_K),),
                 phase_fractions=(1.0,))


def shrink(c):
  """runlocal: the same recipe at the size ``config_base.shrink_for_local_run`` gives."""
  config_base.shrink_for_local_run(c)
  seq_len = 128
  c.model.update(max_position_embeddings=seq_len)
  c.train.update(seq_lens=(seq_len,), max_predictions=(round(seq_len / PARTIAL_PREDICTION_K),),
                 phase_fractions=(1.0,))


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = config_base.base_config()
  xlnet(c)
  c.train.update(num_steps=1_000_000, batch_size=256)
  c.optim.update(name='adamw', learning_rate=1e-4, warmup_steps=10_000, b1=0.9, b2=0.999,
                 eps=1e-6, weight_decay=0.01, grad_clip_norm=1.0)
  if args.runlocal:
    shrink(c)
  return c
