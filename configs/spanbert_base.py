r"""SpanBERT-base pretraining, the paper's recipe (Joshi et al. 2020, §3 and Appendix A).

BERT-base's network (12 layers, hidden 768, 12 heads), cased. Recipe: span masking — span
lengths in whole words from a geometric distribution (p = 0.2, truncated at 10: mean 3.8
words), spans drawn until 15% of the tokens are selected, the 80/10/10 replacement decided
per span — plus the span boundary objective (each span token predicted from the states
just outside the span and its position in it; loss = MLM + SBO); single contiguous
segments of up to 512 tokens and no NSP; batch 256 for 2.4M steps at 512 tokens; AdamW
(eps 1e-8, weight decay 0.01), peak lr 1e-4 after 10K warmup steps, linear decay, gradient
clipping at 1.0 — as SpanBERT's published pretraining command
(facebookresearch/SpanBERT, pretraining/README.md).

Vocabulary: 28,996 cased pieces (BERT-cased's size), a SentencePiece model trained on the
corpus (SpanBERT reuses BERT-cased's WordPiece vocab.txt: point ``tokenizer.kind=
'wordpiece'``, ``tokenizer.path`` at it and ``tokenizer.lowercase=False`` to do the same).
The pretraining network is BERT's (``BertForPreTraining`` on export; its unused pooler and
pair head stay at their initialisation); the SBO head is a pretraining-only part of the
params tree (``sbo_head``) that export leaves out. Data: English Wikipedia from
tensorflow-datasets (BookCorpus is no longer distributed).

  python -m encoder_jax.main --config=configs/spanbert_base.py --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/spanbert_base.py:runlocal=True --workdir=/tmp/s
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = config_base.base_config()
  c.model.update(vocab_size=28996, dtype='bfloat16')  # bf16 activations; f32 params.
  c.tokenizer.update(kind='sentencepiece', lowercase=False)  # Cased.
  c.objective.update(names=('mlm', 'sbo'), mask_rate=0.15, mask_token_rate=0.8,
                     random_token_rate=0.1, whole_word_masking=True, span_p=0.2,
                     max_span_length=10)
  # One contiguous segment of up to 512 tokens from one document; no pairs, no NSP.
  c.data.update(sources='tfds:wikipedia/20230601.en:train', pair_kind='doc_sentences')
  c.train.update(
      num_steps=2_400_000,
      batch_size=256,
      seq_lens=(512,),
      max_predictions=(80,),  # 15% of 510 maskable tokens is 77.
      phase_fractions=(1.0,),
  )
  c.optim.update(name='adamw', learning_rate=1e-4, warmup_steps=10_000, b1=0.9, b2=0.999,
                 eps=1e-8, weight_decay=0.01, grad_clip_norm=1.0)
  if args.runlocal:
    config_base.shrink_for_local_run(c)
    # Keep SpanBERT's structure at the small size: one full-length phase of single segments.
    c.train.update(seq_lens=(128,), max_predictions=(20,), phase_fractions=(1.0,))
  return c
