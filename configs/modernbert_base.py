r"""ModernBERT-base pretraining (Warner et al. 2024): the paper's shape and recipe.

22 layers, hidden 768, 12 heads, GeGLU intermediate 1,152 (Wi: 768 -> 2 x 1,152), no biases,
pre-LN with a final LayerNorm (the first layer's attention without one), fused QKV, rotary
positions (global base 160,000, local 10,000), every third layer global and a 128-token
sliding window (64 either side) on the others; ~150M parameters with the 50,368-row
vocabulary (= Hugging Face ``ModernBertForMaskedLM``; ``convert workdir_to_hf`` exports it).

Recipe: MLM only at 30% masking (max_predictions follow the rate at each length), no
dropout, no NSP, sentences packed across documents (full_sentences); warmup-stable-decay
(``optim.schedule='wsd'``); 1,024 tokens, then context extension to 8,192 as a second
phase. In tokens, as the paper: 1.7T at 1,024 then 300B at 8,192 (its 250B extension plus
the 50B decay), at a batch of 4,608 sequences (4.7M tokens at 1,024): 360K + 8K steps.
Warmup 3B tokens (~640 steps); the decay runs through the extension's last 50B tokens
(~1.3K steps, linear here, 1 - sqrt in the paper). Peak lr 8e-4, weight decay 1e-5.

Differences from the paper, and why:
* AdamW, not StableAdamW. StableAdamW is AdamW with Adafactor-style update clipping per
  parameter tensor; encoder_jax's optimizers are AdamW and LAMB, and global-norm gradient
  clipping (``optim.grad_clip_norm``) guards the same early-training spikes. Kept so the
  recipe runs with the optimizer every other config uses.
* One global RoPE base, 160,000, for both phases: the paper trains the first phase at
  10,000 and raises it for the extension; ``model`` fields are fixed for a run (a run
  restarted from the phase-1 checkpoint with ``--config.model.rope_theta=160000.0`` does
  what the paper did).
* The batch is one size for both phases (``train.batch_size`` is in sequences): the
  paper's batch-size warmup (768 -> 4,608 over 50B tokens) is left out, and the extension
  runs 8x the tokens per step (``grad_accum_steps`` keeps each micro-batch at 256
  sequences; raise it if 256 x 8,192 does not fit).
* Data: English Wikipedia (tensorflow-datasets) stands in for the paper's 2T-token mixture;
  tokenizer: a byte-level BPE trained on it (ModernBERT's is OLMo's, 50,280 + specials).

  python -m encoder_jax.main --config=configs/modernbert_base.py --workdir=$WORKDIR
  python -m encoder_jax.main --config=configs/modernbert_base.py:runlocal=True --workdir=/tmp/m
"""

from encoder_jax.config import schema as config_base
from encoder_jax.models import modernbert

# ModernBERT's network (its released settings of the trunk's block options) and recipe.
RECIPE = dict(
    model=modernbert.PUBLISHED,
    objective=dict(names=('mlm',), mask_rate=0.3),
    data=dict(pair_kind='full_sentences'),
    optim=dict(name='adamw', learning_rate=8e-4, schedule='wsd', b1=0.9, b2=0.98, eps=1e-6,
               weight_decay=1e-5, grad_clip_norm=1.0),
)


def get_config(arg=None):
  args = config_base.parse_arg(arg, runlocal=False)
  c = config_base.base_config()
  c.model.update(vocab_size=50368, hidden_size=768, num_layers=22, num_heads=12,
                 intermediate_size=1152, max_position_embeddings=8192, dtype='bfloat16')
  c.tokenizer.kind = 'bytelevel_bpe'
  c.data.sources = 'tfds:wikipedia/20230601.en:train'
  c.train.update(num_steps=368_000, batch_size=4608, grad_accum_steps=18,
                 seq_lens=(1024, 8192), phase_fractions=(0.978, 0.022))
  c.optim.update(warmup_steps=640, decay_fraction=0.0036)
  if args.runlocal:
    config_base.shrink_for_local_run(c)
    c.train.grad_accum_steps = 1
  config_base.apply_recipe(c, RECIPE)  # Also max_predictions: 30% of each phase's length.
  if args.runlocal:
    # Two layers, global then local, with a 32-token window (so the local layer is local at
    # the local run's 64 and 128 tokens); the small-budget recipe's peak rate and decay.
    c.model.local_attention = 32
    c.optim.update(learning_rate=2e-3, warmup_steps=30, decay_fraction=0.2)
  return c
