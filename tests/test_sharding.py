"""Mesh construction, logical -> mesh rules, and sharded state creation on 8 CPU devices."""

import jax
import ml_collections
import pytest
from jax.sharding import PartitionSpec as P

from encoder_jax import config_base
from encoder_jax import sharding
from encoder_jax import train


def _mesh(data=-1, fsdp=1, tensor=1):
  return sharding.make_mesh(ml_collections.ConfigDict(dict(data=data, fsdp=fsdp, tensor=tensor)))


def test_eight_simulated_devices():
  assert jax.device_count() == 8


def test_minus_one_takes_the_remaining_devices():
  assert dict(_mesh(fsdp=2, tensor=2).shape) == {'data': 2, 'fsdp': 2, 'tensor': 2}
  assert dict(_mesh().shape) == {'data': 8, 'fsdp': 1, 'tensor': 1}


@pytest.mark.parametrize('sizes,match', [
    (dict(data=3, fsdp=1, tensor=1), 'needs 3 devices; 8 are available'),
    (dict(data=-1, fsdp=-1, tensor=1), 'at most one may be -1'),
    (dict(data=-1, fsdp=3, tensor=1), 'not divisible'),
])
def test_bad_mesh_sizes_are_reported(sizes, match):
  with pytest.raises(ValueError, match=match):
    _mesh(**sizes)


def test_rules_first_match_and_divisibility():
  mesh = _mesh(data=2, fsdp=2, tensor=2)
  assert sharding.logical_to_spec(('embed', 'mlp'), (8, 16), mesh) == P('fsdp', 'tensor')
  assert sharding.logical_to_spec(('layers', 'embed', 'heads', 'kv'), (2, 8, 4, 4), mesh) == P(
      None, 'fsdp', 'tensor', None)
  # 30522 is not divisible by tensor=2? It is; 30521 is not: replicate that dimension.
  assert sharding.logical_to_spec(('vocab', 'embed'), (30521, 8), mesh) == P(None, 'fsdp')
  assert sharding.logical_to_spec(('batch', 'length'), (8, 5), mesh) == P(('data', 'fsdp'), None)
  with pytest.raises(ValueError, match="'rows' has no rule"):
    sharding.logical_to_spec(('rows',), (4,), mesh)


def test_batch_that_does_not_divide_the_mesh_is_an_error():
  mesh = _mesh(data=4, fsdp=2, tensor=1)
  with pytest.raises(ValueError, match='batch_size=12 is not divisible.*data\\*fsdp=8'):
    sharding.check_batch(12, mesh)


def test_one_process_feeds_every_row_of_the_batch():
  """``process_rows``: the global rows this process's devices hold (all of them here; the
  multi-process runs of tests/test_multihost.py feed through it)."""
  assert sharding.process_rows(_mesh(data=2, fsdp=2, tensor=2), 16) == (0, 16)
  assert sharding.process_rows(_mesh(data=1, fsdp=1, tensor=8), 4) == (0, 4)


def test_state_is_born_sharded():
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  c.model.vocab_size = 512
  mesh = _mesh(data=2, fsdp=2, tensor=2)
  state = train.create_train_state(c, mesh)
  kernel = state.params['encoder']['layers']['intermediate']['kernel']  # layers, embed, mlp
  assert kernel.sharding.spec == P(None, 'fsdp', 'tensor')
  # Each device holds a quarter of it: nothing is fully materialised on one device.
  assert kernel.addressable_shards[0].data.size == kernel.size // 4
  mu = state.opt_state[1][0].mu['encoder']['layers']['intermediate']['kernel']
  assert mu.sharding.spec == P(None, 'fsdp', 'tensor')
  boxed, _ = train.state_shardings(c, mesh)
  text = sharding.describe(boxed.params, mesh)
  assert 'encoder/layers/intermediate/kernel' in text and "'fsdp', 'tensor'" in text
