r"""RoBERTa-base pretraining, the paper's recipe (Liu et al. 2019, Table 9 / Appendix C).

BERT-base's network with RoBERTa's conventions: byte-level BPE (50,265 pieces, <s> <pad>
</s> <unk> ... <mask>), position ids after the padding id (514 rows = 512 + 2), one token
type, LayerNorm eps 1e-5; 125M parameters (= Hugging Face ``RobertaForMaskedLM``).
Recipe: MLM only (no NSP), FULL-SENTENCES inputs (contiguous sentences packed up to 512
tokens, crossing document boundaries with an extra separator), dynamic masking (a new
mask every step, on device), batch 8K sequences (32 accumulated micro-batches of 256),
500K steps, Adam(beta2 0.98, eps 1e-6), peak lr 6e-4 after 24K warmup steps, linear
decay, weight decay 0.01, dropout 0.1, no gradient clipping.

Data: the paper's 160 GB (BookCorpus, CC-News, OpenWebText, Stories) is not in
tensorflow-datasets; English Wikipedia is the default here. Add the rest as sources, e.g.
``--config.data.sources='tfds:wikipedia/20230601.en:train,jsonl:/data/owt/*.jsonl'``.

  python -m encoder_jax.main --config=configs/roberta_base.py --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/roberta_base.py:runlocal=True --workdir=/tmp/r
"""

from encoder_jax.config import schema as config_base

PAD_ID = 1  # RoBERTa's <pad>; positions are numbered from PAD_ID + 1.
POSITION_OFFSET = PAD_ID + 1


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = config_base.base_config()
  c.model.update(
      kind='roberta',
      vocab_size=50265,
      max_position_embeddings=512 + POSITION_OFFSET,
      position_offset=POSITION_OFFSET,
      type_vocab_size=1,  # No segment signal: FULL-SENTENCES has no A/B pairs.
      layer_norm_eps=1e-5,
      dtype='bfloat16',  # Activations; params and optimizer state stay float32.
  )
  c.tokenizer.kind = 'bytelevel_bpe'  # Trained on the corpus: config.model.vocab_size pieces.
  c.objective.names = ('mlm',)  # No NSP.
  c.data.update(sources='tfds:wikipedia/20230601.en:train', pair_kind='full_sentences')
  c.train.update(
      num_steps=500_000,
      batch_size=8192,
      grad_accum_steps=32,  # 256 sequences per micro-batch; lower it on a larger slice.
      seq_lens=(512,),  # Always full length (no short first phase, unlike BERT).
      max_predictions=(80,),  # 15% of 510 maskable tokens is 77; 80 keeps tiles aligned.
      phase_fractions=(1.0,),
  )
  c.optim.update(name='adamw', learning_rate=6e-4, warmup_steps=24_000, b1=0.9, b2=0.98,
                 eps=1e-6, weight_decay=0.01, grad_clip_norm=0.0)
  if args.runlocal:
    config_base.shrink_for_local_run(c)
    # Keep RoBERTa's conventions at the small size: the byte-level BPE tokenizer (the
    # embedded corpus supports ~15K pieces; shrink_for_local_run's 8,000 fit), positions
    # after the pad id, one full-length phase and gradient accumulation.
    seq_len = 128
    c.model.update(max_position_embeddings=seq_len + POSITION_OFFSET)
    c.train.update(seq_lens=(seq_len,), max_predictions=(20,), phase_fractions=(1.0,),
                   grad_accum_steps=2)
  return c
