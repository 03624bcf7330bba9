"""Optimizer: BERT's schedule and which parameters get weight decay."""

import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.config import schema as config_base
from encoder_jax.core import optimizer

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


def test_warmup_then_linear_decay_to_zero():
  c = config_base.base_config()
  lr = optimizer.schedule(optimizer.of_pretraining(c.optim), 1_000_000)
  assert float(lr(0)) == 0.0
  np.testing.assert_allclose(float(lr(5_000)), 0.5e-4, rtol=1e-5)
  np.testing.assert_allclose(float(lr(10_000)), 1e-4, rtol=1e-5)
  np.testing.assert_allclose(float(lr(505_000)), 0.5e-4, rtol=1e-4)
  assert float(lr(1_000_000)) == 0.0


def test_no_decay_on_layer_norm_and_biases():
  params = {'encoder': {'layers': {'output': {'kernel': jnp.ones(2), 'bias': jnp.ones(2)},
                                   'output_layer_norm': {'scale': jnp.ones(2)}}},
            'mlm_head': {'output_bias': jnp.ones(2)}}
  mask = optimizer.decay_mask(params)
  assert mask['encoder']['layers']['output'] == {'kernel': True, 'bias': False}
  assert mask['encoder']['layers']['output_layer_norm']['scale'] is False
  assert mask['mlm_head']['output_bias'] is False


def test_unknown_optimizer_is_named():
  c = config_base.base_config()
  c.optim.name = 'sgdw'
  with pytest.raises(ValueError, match='config.optim.name=.sgdw.'):
    optimizer.build(optimizer.of_pretraining(c.optim), c.train.num_steps)


def _schedule(**optim):
  c = config_base.base_config()
  c.optim.update(learning_rate=1.0, warmup_steps=10, **optim)
  return optimizer.schedule(optimizer.of_pretraining(c.optim), 110)


def test_warmup_stable_decay_holds_the_peak_then_decays_over_the_last_fraction():
  lr = _schedule(schedule='wsd', decay_fraction=0.2)  # 110 steps: decay over the last 22.
  np.testing.assert_allclose([float(lr(s)) for s in (0, 5, 10, 50, 88)], [0, 0.5, 1, 1, 1],
                             atol=1e-6)
  np.testing.assert_allclose([float(lr(s)) for s in (99, 110)], [0.5, 0.0], atol=1e-6)


def test_cosine_and_one_cycle_schedules():
  cos = _schedule(schedule='cosine')
  np.testing.assert_allclose([float(cos(s)) for s in (10, 60, 110)], [1.0, 0.5, 0.0], atol=1e-6)
  c = config_base.base_config()  # One-cycle: linear, the peak half-way.
  c.optim.update(learning_rate=1.0, warmup_steps=50)
  tri = optimizer.schedule(optimizer.of_pretraining(c.optim), 100)
  np.testing.assert_allclose([float(tri(s)) for s in (25, 50, 75)], [0.5, 1.0, 0.5], atol=1e-6)


def test_unknown_schedule_is_named():
  with pytest.raises(ValueError, match="config.optim.schedule='cosin'"):
    _schedule(schedule='cosin')


def test_fine_tunings_optim_section_builds_through_its_spec():
  """Fine-tuning's optim (warmup as a share of the steps, AdamW's betas and epsilon as
  fields) makes an ``optimizer.Optim`` (``finetune.train.spec``: warmup_fraction of the
  steps, in steps) for the same builder: warmup, then linear decay."""
  from encoder_jax.finetune import config as finetune_config  # pylint: disable=g-import-not-at-top
  from encoder_jax.finetune import train as finetune_train  # pylint: disable=g-import-not-at-top
  c = finetune_config.base_config()
  c.optim.update(learning_rate=1.0, warmup_fraction=0.25)
  o = finetune_train.spec(c, total_steps=100, steps_per_epoch=50).optim
  assert (o.b1, o.b2, o.eps, o.warmup_steps, o.schedule) == (0.9, 0.999, 1e-6, 25, 'linear')
  lr = optimizer.schedule(o, 100)
  assert float(lr(0)) == 0.0 and float(lr(25)) == 1.0 and float(lr(100)) == 0.0
  c.optim.warmup_fraction = 1.5
  with pytest.raises(ValueError, match='config.optim.warmup_fraction=1.5'):
    finetune_config.validate(c)
