"""The small-budget recipe's models leave the project: a run with the span contrastive
objective exports as a sentence-transformers directory that embeds as ``embed`` does, and
a network no Hugging Face class computes is refused with the configuration that exports."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import transformers

import encoder_jax
from encoder_jax.api import pretrain
from encoder_jax.config import schema as config_base
from encoder_jax import convert
from encoder_jax.interop import hf
from encoder_jax.interop import registry

import support
from support import hf_fixtures
from support import tiny_config


ROOT = support.ROOT

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py

# Lengths from 3 to 40 tokens: padded batches, one row cut at max_seq_length.
TEXTS = [
    'The quick brown fox jumps over the lazy dog.',
    'Python',
    'Return the number of items in a container; raise TypeError for an object without a '
    'length, and ValueError when the length is negative or larger than the maximum size of '
    'a sequence on this platform, which is sys.maxsize.',
    "Don't panic: naïve café résumé!",
]
# Odd widths (3 heads of 10: RoPE needs an even head size).
SHAPE = dict(hidden_size=30, num_heads=3, intermediate_size=38, max_position_embeddings=40)


@pytest.fixture(scope='module')
def contrastive_run(prepared_dir, tmp_path_factory):
  """A workdir of configs/crammed_small.py:contrastive=True's recipe at a tiny odd size,
  trained 2 steps on 300 embedded documents (the tiny config's prepared data)."""
  root = tmp_path_factory.mktemp('recipe_export')
  config = tiny_config.get_config(f'prepared_dir={prepared_dir}')
  config_base.apply_recipe(config, config_base.with_objective(config_base.SMALL_BUDGET_RECIPE,
                                                              'contrastive'))
  config.model.update(SHAPE)
  config.train.update(num_steps=2, seq_lens=(32,), max_predictions=(10,), phase_fractions=(1.0,),
                      eval_every_steps=0, eval_batches=0)
  config.optim.warmup_steps = 1
  config.checkpoint.update(every_steps=2, async_save=False)
  workdir = str(root / 'workdir')
  pretrain.run(config, workdir)
  return workdir


@pytest.mark.slow
def test_sentence_transformers_export_embeds_as_embed_does(contrastive_run, tmp_path):
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / 'st')
  message = convert.workdir_to_sentence_transformers(contrastive_run, out)
  assert 'mean pooling, L2-normalised, max_seq_length 40' in message, message
  assert 'Note:' not in message  # The run trained the contrastive objective.
  with open(os.path.join(out, 'modules.json')) as f:
    assert [m['type'].rsplit('.', 1)[-1] for m in json.load(f)] == [
        'Transformer', 'Pooling', 'Normalize']
  with open(os.path.join(out, 'config.json')) as f:
    assert json.load(f)['architectures'] == ['ModernBertForMaskedLM']
  with open(os.path.join(out, '1_Pooling', 'config.json')) as f:
    assert json.load(f)['pooling_mode_mean_tokens'] is True
  ours = encoder_jax.load(contrastive_run).embed(TEXTS)
  st = SentenceTransformer(out, device='cpu')
  assert st.max_seq_length == 40
  theirs = st.encode(TEXTS, batch_size=4, convert_to_numpy=True)
  assert ours.shape == theirs.shape == (len(TEXTS), SHAPE['hidden_size'])
  diff = float(np.abs(ours - theirs).max())
  print(f'max |embed - SentenceTransformer.encode|: {diff:.2e}')
  assert diff < 1e-5
  np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, atol=1e-6)
  # The directory is also a model encoder_jax loads, with its sentence-transformers settings.
  back = encoder_jax.load(out)
  assert back.default_pooling == 'mean' and back.default_max_len == 40
  np.testing.assert_allclose(back.embed(TEXTS), ours, atol=1e-6)


@pytest.mark.slow
def test_export_of_an_mlm_only_run_says_what_was_not_trained(contrastive_run, tmp_path):
  config = encoder_jax.load(contrastive_run).config
  config.objective.names = ('mlm',)
  message = convert.workdir_to_sentence_transformers(contrastive_run, str(tmp_path / 'st'),
                                                     config)
  assert "Note: the run trained ['mlm'], not the contrastive objective" in message, message


def test_refusal_names_the_option_and_the_configuration_that_exports(tmp_path):
  """The recipe's options on the bert kind (its network before it became a modernbert
  configuration) have no BertForPreTraining; the refusal names configs/crammed_small.py,
  whose network at the same size exports."""
  shape = dict(vocab_size=61, num_layers=1, **SHAPE)
  options = {k: v for k, v in config_base.SMALL_BUDGET_RECIPE['model'].items()
             if k in ('pre_norm', 'gated_ffn', 'rotary', 'dense_bias', 'norm_bias')}
  bert = registry.make_config(dict(shape, kind='bert', **options))
  expected = (r"config.model.pre_norm=True has no Hugging Face BertForPreTraining equivalent "
              r"\(expected False\); the nearest configuration that exports: kind='modernbert' "
              r'with pre_norm=True, gated_ffn=True, rotary=True, .*'
              r'\(configs/crammed_small.py\), computed by ModernBertForMaskedLM')
  with pytest.raises(ValueError, match=expected):
    hf.save_hf(str(tmp_path / 'bert'), bert, hf.init_params(bert))
  assert not (tmp_path / 'bert').exists()
  recipe = registry.make_config(dict(config_base.SMALL_BUDGET_RECIPE['model'], **shape))
  hf.save_hf(str(tmp_path / 'recipe'), recipe, hf.init_params(recipe))
  assert hf.load_hf(str(tmp_path / 'recipe'))[0] == recipe


def test_an_untied_decoder_other_than_the_table_less_a_shared_row_is_refused(tmp_path):
  config = hf_fixtures.hf_config('modernbert', vocab_size=61, hidden_size=30, num_layers=1,
                                 num_heads=3, intermediate_size=38)
  config.tie_word_embeddings = False
  model = hf_fixtures.randomize_(transformers.ModernBertForMaskedLM(config), seed=0)
  model.save_pretrained(tmp_path)
  with pytest.raises(ValueError, match='not the token table less one row shared by every token'):
    hf.load_hf(str(tmp_path))
