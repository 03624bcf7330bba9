"""Optimizer: BERT's schedule and which parameters get weight decay."""

import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax import config_base
from encoder_jax import optimizer


def test_warmup_then_linear_decay_to_zero():
  c = config_base.base_config()
  lr = optimizer.learning_rate_schedule(c.optim, 1_000_000)
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
    optimizer.make(c)
