r"""DeBERTa-base pretraining (He et al. 2020, Appendix A.2, Table 8; v2 options via an argument).

12 layers, hidden 768, 12 heads; disentangled attention (c2c + c2p + p2c, scale 1/sqrt(3d))
over relative distances clipped at k = 512, no absolute positions in the input; the enhanced
mask decoder (the last layer applied twice with the absolute positions added, n = 2, shared
weights) feeds the MLM head; GPT-2's byte-level BPE vocabulary (50,265 pieces), no segment
embeddings; LayerNorm eps 1e-7. Recipe: MLM with whole-word masking (15%), batch 2K, 1M steps,
Adam lr 2e-4, 10K warmup steps, linear decay, weight decay 0.01, dropout 0.1, clipping 1.0,
sequences of 512 tokens. SOP is an option: ``:sop=True`` (adds the pair head's loss, with
two segment types and sentence-order pairs).

``version=2`` gives the v2/v3 architecture: log-bucketed relative positions (256 buckets,
distances up to 512), position projections shared with the content keys/queries, LayerNorm-ed
relative embeddings, terms p2c|c2p, a 128K SentencePiece vocabulary (``deberta_v2`` kind;
the v2 convolution layer is not implemented).

Data: the paper's 78 GB (Wikipedia, BookCorpus, OpenWebText, Stories) is not in
tensorflow-datasets; English Wikipedia is the default here (add sources with
``--config.data.sources``).

  python -m encoder_jax.main --config=configs/deberta_base.py --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/deberta_base.py:version=2 --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/deberta_base.py:runlocal=True --workdir=/tmp/d
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False, version=1, sop=False)
  if args.version not in (1, 2):
    raise ValueError(f'configs/deberta_base.py: version={args.version}; expected 1 or 2')
  c = config_base.base_config()
  c.model.update(
      kind='deberta',
      attention_kind='disentangled',
      vocab_size=50265,
      max_position_embeddings=512,
      max_relative_positions=-1,  # k = max_position_embeddings = 512.
      position_biased_input=False,  # Absolute positions only in the EMD.
      emd_layers=2,
      type_vocab_size=0,
      layer_norm_eps=1e-7,
      pos_att_type='c2p|p2c',
      dtype='bfloat16',  # Activations; params and optimizer state stay float32.
  )
  c.tokenizer.kind = 'bytelevel_bpe'
  if args.version == 2:
    c.model.update(kind='deberta_v2', vocab_size=128100, position_buckets=256,
                   share_att_key=True, norm_rel_ebd=True)
    c.tokenizer.update(kind='sentencepiece', model_type='unigram', lowercase=False)
  c.objective.update(names=('mlm',), whole_word_masking=True)
  c.data.update(sources='tfds:wikipedia/20230601.en:train', pair_kind='full_sentences')
  if args.sop:
    c.model.type_vocab_size = 2
    c.objective.names = ('mlm', 'sop')
    c.data.pair_kind = 'sop'
  c.train.update(
      num_steps=1_000_000,
      batch_size=2048,
      grad_accum_steps=8,  # 256 sequences per micro-batch; lower it on a larger slice.
      seq_lens=(512,),
      max_predictions=(80,),  # 15% of 512.
      phase_fractions=(1.0,),
  )
  c.optim.update(name='adamw', learning_rate=2e-4, warmup_steps=10_000, b1=0.9, b2=0.999,
                 eps=1e-6, weight_decay=0.01, grad_clip_norm=1.0)
  if args.runlocal:
    config_base.shrink_for_local_run(c)
    # Keep DeBERTa's structure at the small size: relative span = the 128 positions (v1) or
    # 32 buckets (v2), EMD on, one full-length phase.
    c.model.update(max_position_embeddings=128)
    if args.version == 2:
      c.model.position_buckets = 32
    c.train.update(seq_lens=(128,), max_predictions=(20,), phase_fractions=(1.0,))
  return c
