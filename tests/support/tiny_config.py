r"""A 2-layer, 32-wide BERT on 300 embedded documents, for the training tests.

  python -m encoder_jax.main --config=tests/support/tiny_config.py:prepared_dir=/tmp/p --workdir=/tmp/w

Two length phases (32 then 64 tokens); ``one_phase`` (``...:prepared_dir=/tmp/p,one_phase``)
trains all 12 steps at 32 tokens: half the programs to compile, for the tests whose point is
not the phases.
"""

from encoder_jax.config import schema as config_base


def get_config(arg=None):
  args = config_base.parse_arg(arg, prepared_dir='', one_phase=False)
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  c.model.update(vocab_size=1000, hidden_size=32, num_layers=2, num_heads=2,
                 intermediate_size=64, max_position_embeddings=64)
  c.data.update(sources='embedded;max_documents=300', prepared_dir=args.prepared_dir)
  c.train.update(num_steps=12, batch_size=8, seq_lens=(32, 64), max_predictions=(5, 10),
                 phase_fractions=(0.5, 0.5), log_every_steps=1, eval_every_steps=6,
                 eval_batches=2)
  if args.one_phase:
    c.train.update(seq_lens=(32,), max_predictions=(5,), phase_fractions=(1.0,))
  c.optim.warmup_steps = 2
  c.checkpoint.update(every_steps=4, keep=5)
  return c


def one_phase(prepared_dir: str) -> str:
  """``get_config``'s argument (``--config=tests/support/tiny_config.py:ARG``) for one length phase
  on the data prepared in ``prepared_dir``."""
  return f'prepared_dir={prepared_dir},one_phase'
