r"""Fine-tuning a tagger (NER, CoNLL-2003 style BIO tags, label on each word's first piece).

Default data: tfds conll2003 ('tokens', 'ner'). Local files work too: JSONL lines such as
{"tokens": ["John", "lives", "in", "Paris"], "tags": ["B-PER", "O", "O", "B-LOC"]}.

  python -m encoder_jax.finetune.main --config=configs/finetune_ner.py \
      --config.init.workdir=PRETRAIN_DIR --workdir=/tmp/ner
  python -m encoder_jax.finetune.main --config=configs/finetune_ner.py:local=True \
      --config.init.hf_dir=HF_BERT_DIR --config.data.train=jsonl:train.jsonl \
      --config.data.eval=jsonl:dev.jsonl --workdir=/tmp/ner
"""

from encoder_jax.config import schema as config_base
from encoder_jax.finetune import config as finetune_config


def get_config(arg=None):
  args = config_base.parse_arg(arg, local=False, runlocal=False)
  c = finetune_config.base_config()
  c.task = 'token_classification'
  if args.local:  # JSONL/TSV with 'tokens' and 'tags' (string BIO tags).
    c.data.update(train='', eval='', tokens_field='tokens', tags_field='tags')
  else:
    c.data.update(train='tfds:conll2003:train', eval='tfds:conll2003:dev', tokens_field='tokens',
                  tags_field='ner')
  c.data.max_len = 128
  c.optim.update(learning_rate=5e-5, epochs=3, batch_size=32)
  if args.runlocal:
    c.data.max_len = 64
    c.optim.update(epochs=1, batch_size=16)
  return c
