r"""Sentence-BERT: fine-tune an encoder into a sentence embedder, exported for
sentence-transformers and as an encoder_jax workdir.

  python -m encoder_jax.finetune.sbert --workdir=PRETRAIN_DIR --out=/tmp/sbert \
      --train=tfds:multi_nli:train --objective=classification \
      --eval=tfds:glue/stsb:validation
  python -m encoder_jax.finetune.sbert --hf_dir=HF_DIR --out=/tmp/sbert --objective=contrastive \
      --train=jsonl:pairs.jsonl --fields=anchor,positive,negative --eval=tsv:sts-dev.tsv

Reimers & Gurevych (2019): one encoder embeds each sentence on its own (a siamese network:
the two sides share every weight), pooled over its tokens (``mean`` by default; ``cls``
and ``max`` as options), and is trained with

- ``classification`` over labelled pairs (NLI: entailment / neutral / contradiction): a
  softmax classifier on ``(u, v, |u - v|)``, dropped after training; or
- ``contrastive``: in-batch negatives (sentence-transformers'
  MultipleNegativesRankingLoss): each anchor's positive against every other positive of the
  batch (and every hard negative, for triples), cross-entropy over ``scale`` x cosine.

The evaluation is STS-B's: Spearman (and Pearson) correlation between the cosine of the
two embeddings and the gold similarity. Each objective is a registered fine-tuning task
(``sbert_classification``, ``sbert_contrastive``: ``finetune.tasks.sentence_embedding``),
trained by ``finetune.train.finetune`` on the training engine (mesh, dtype, Orbax
checkpoints with resume). At the end
``--out`` holds ``sentence_transformers/`` (a directory ``SentenceTransformer(dir)`` loads:
the encoder as its kind's Hugging Face model, the tokenizer, ``modules.json``, the pooling
config, normalisation) and ``workdir/``, an encoder_jax workdir imported from it, whose
pooling and normalisation are the defaults of ``encoder_jax.embed`` and
``encoder_jax.load(...).embed``.

Data: tfds (``glue/stsb``, ``snli``, ``multi_nli``; SNLI's examples without a gold label,
label -1, are skipped and counted) or JSONL/TSV with the fields named by ``--fields``.
"""

from __future__ import annotations

import os

import ml_collections

from encoder_jax.core import fields as fields_lib
from encoder_jax.loading import loaded as loading
from encoder_jax.finetune import config as finetune_config
from encoder_jax.finetune import train as finetune_train
from encoder_jax.finetune.tasks import sentence_embedding
from encoder_jax.interop import hf_import
from encoder_jax.interop import sentence_transformers_dir


def sbert_config(init: dict, train_spec: str, eval_spec: str = '', epochs: int = 1,
                 batch_size: int = 16, learning_rate: float = 2e-5, seed: int = 0,
                 tfds_data_dir: str = '', objective: str = 'classification',
                 pooling: str = 'mean', fields: tuple[str, ...] = ('premise', 'hypothesis'),
                 label_field: str = 'label', max_len: int = 128, **settings
                 ) -> ml_collections.ConfigDict:
  """The fine-tuning config of the task ``sbert_<objective>``: the training rows' text
  ``fields`` (two, pairs; or three, triples) and ``label_field`` (classification), the
  ``pooling``; ``settings`` set its ``task_settings`` (``sentence_embedding.FIELDS``: the
  STS evaluation fields, ``normalize``, ``scale``). Every value is checked with the rest of
  the config (``finetune.config.validate``) before the encoder is loaded."""
  c = finetune_config.base_config()
  c.task = f'sbert_{objective}'
  c.pooling = pooling
  c.seed = seed
  c.init.update(init)
  c.data.update(train=train_spec, eval=eval_spec, tfds_data_dir=tfds_data_dir,
                text_fields=tuple(fields), label_field=label_field or 'label', max_len=max_len)
  c.optim.update(learning_rate=learning_rate, epochs=epochs, batch_size=batch_size,
                 eval_batch_size=32, warmup_fraction=0.1)
  c.task_settings.update(settings)
  return c


def finetune(config: ml_collections.ConfigDict, out: str, log=print) -> dict:
  """Trains the registered task ``config.task`` (``sbert_<objective>``) into
  ``<out>/finetune``, then exports the encoder for sentence-transformers and as an
  encoder_jax workdir."""
  config = config.copy_and_resolve_references()
  workdir = os.path.join(out, 'finetune')
  finetune_config.validate(config)  # Before the encoder is loaded.
  pretrained = finetune_train.load_pretrained(config)
  result = finetune_train.finetune(config, workdir, log, pretrained)
  if result.get('preempted'):
    return result
  max_len = min(int(config.data.max_len), pretrained.max_length)
  params = finetune_train.read_final_params(workdir)
  export = os.path.join(out, 'sentence_transformers')
  normalize = bool(config.task_settings.normalize)
  export_sentence_transformers(pretrained, params, export, config.pooling, normalize, max_len)
  encoder_workdir = os.path.join(out, 'workdir')
  if not os.path.isdir(os.path.join(encoder_workdir, 'checkpoints')):
    hf_import.import_hf_to_workdir(export, encoder_workdir)
  log(f'Sentence-BERT: exported {export} (SentenceTransformer) and {encoder_workdir} '
      '(encoder_jax.load / embed)')
  result.update(export=export, workdir=encoder_workdir)
  return result


def export_sentence_transformers(pretrained: loading.Loaded, params: dict, out: str,
                                 pooling: str, normalize: bool, max_len: int) -> None:
  """The fine-tuned encoder (its parts replace the pretrained ones in the kind's export
  architecture) + tokenizer + sentence-transformers' module files."""
  network, full = pretrained.trainable.downstream(loading.to_host(pretrained.params))
  full = dict(full)
  for part, value in params.items():
    if part in full:
      full[part] = value
  sentence_transformers_dir.write(out, network.config, full, pretrained.tokenizer,
                                  pretrained.max_length, pooling=pooling, normalize=normalize,
                                  max_seq_length=max_len)


def main(argv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  del argv
  f = flags.FLAGS
  c = sbert_config(dict(workdir=f.workdir or '', hf_dir=f.hf_dir or ''), f.train, f.eval,
                   f.epochs, f.batch_size, f.learning_rate, f.seed, f.tfds_data_dir,
                   f.objective, f.pooling, tuple(x.strip() for x in f.fields.split(',')),
                   f.label_field, f.max_len,
                   **fields_lib.flag_values(sentence_embedding.FIELDS))
  result = finetune(c, f.out)
  print('final: ' + ', '.join(f'{k}={v}' for k, v in result.items()))


if __name__ == '__main__':
  from absl import flags  # pylint: disable=g-import-not-at-top
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.define_finetune_flags('Output: finetune/, sentence_transformers/, workdir/.',
                            epochs=1, batch_size=16, learning_rate=2e-5, max_len=128)
  flags.DEFINE_string('train', 'tfds:multi_nli:train', 'Training pairs / triples.')
  flags.DEFINE_string('eval', '', "STS data: 'tfds:glue/stsb:validation', 'tsv:PATH'...")
  flags.DEFINE_enum('objective', 'classification', list(sentence_embedding.OBJECTIVES),
                    'The training loss.')
  flags.DEFINE_enum('pooling', 'mean', list(sentence_embedding.POOLINGS), 'Token pooling.')
  flags.DEFINE_string('fields', 'premise,hypothesis', 'Text fields of a training row.')
  flags.DEFINE_string('label_field', 'label', 'Classification label field.')
  fields_lib.define_flags(sentence_embedding.FIELDS)  # --normalize, --scale, --eval_*...
  cli.run(main)
