"""Mesh construction, logical -> mesh rules, and sharded state creation on 8 CPU devices."""

import jax
import ml_collections
import pytest
from jax.sharding import PartitionSpec as P

from encoder_jax.config import schema as config_base
from encoder_jax.core import sharding
from encoder_jax.run import pretraining


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
  multi-process runs of tests/run/test_distributed.py feed through it)."""
  assert sharding.process_rows(_mesh(data=2, fsdp=2, tensor=2), 16) == (0, 16)
  assert sharding.process_rows(_mesh(data=1, fsdp=1, tensor=8), 4) == (0, 4)


def test_state_is_born_sharded():
  c = config_base.base_config()
  config_base.shrink_for_local_run(c)
  c.model.vocab_size = 512
  mesh = _mesh(data=2, fsdp=2, tensor=2)
  pieces = pretraining.pieces(c, mesh)
  state = pieces.create_state()
  kernel = state.params['encoder']['layers']['intermediate']['kernel']  # layers, embed, mlp
  assert kernel.sharding.spec == P(None, 'fsdp', 'tensor')
  # Each device holds a quarter of it: nothing is fully materialised on one device.
  assert kernel.addressable_shards[0].data.size == kernel.size // 4
  mu = state.opt_state[1][0].mu['encoder']['layers']['intermediate']['kernel']
  assert mu.sharding.spec == P(None, 'fsdp', 'tensor')
  text = sharding.describe(pieces.boxed.params, mesh)
  assert 'encoder/layers/intermediate/kernel' in text and "'fsdp', 'tensor'" in text


class _FakeDevice:
  """A device as ``sharding.device_layout`` sees it: an id, a platform, a slice."""

  def __init__(self, id_: int, slice_index: int):
    self.id, self.slice_index = id_, slice_index
    self.platform, self.device_kind, self.process_index = 'cpu', 'cpu', slice_index

  def __repr__(self) -> str:
    return f'd{self.id}@s{self.slice_index}'


def test_multislice_puts_the_dcn_axes_between_slices_whatever_the_enumeration_order():
  # Two slices of four, enumerated interleaved: a reshape in that order would mix them.
  devices = [_FakeDevice(i, i % 2) for i in range(8)]
  layout = sharding.device_layout([1, 4, 1], [-1, 1, 1], devices)  # dcn_data = the slices.
  assert layout.shape == (2, 4, 1)
  assert [{d.slice_index for d in row.flat} for row in layout] == [{0}, {1}]
  layout = sharding.device_layout([2, 1, 2], [1, 2, 1], devices)  # fsdp across slices.
  assert layout.shape == (2, 2, 2)
  assert [{d.slice_index for d in layout[:, j].flat} for j in range(2)] == [{0}, {1}]
  assert sorted(d.id for d in layout.flat) == list(range(8))


@pytest.mark.parametrize('ici,dcn,match', [
    ([-1, 1, 1], [3, 1, 1], r'needs 3 slices; 2 are available'),
    ([-1, 1, 1], [-1, -1, 1], r'at most one may be -1 \(= the remaining slices\)'),
    ([3, 1, 1], [-1, 1, 1], r'needs 3 devices per slice; 4 are available'),
])
def test_bad_multislice_sizes_are_reported(ici, dcn, match):
  with pytest.raises(ValueError, match=match):
    sharding.device_layout(ici, dcn, [_FakeDevice(i, i // 4) for i in range(8)])


def test_one_slice_keeps_the_mesh_as_before_and_its_dcn_fields_default_to_one_slice():
  c = config_base.base_config().mesh
  assert (c.dcn_data, c.dcn_fsdp, c.dcn_tensor) == (-1, 1, 1)
  c.update(data=2, fsdp=2, tensor=2)
  mesh = sharding.make_mesh(c)
  assert dict(mesh.shape) == {'data': 2, 'fsdp': 2, 'tensor': 2}
  assert list(mesh.devices.flat) == jax.devices()  # CPU: the enumeration order, as before.
  with pytest.raises(ValueError, match=r'needs 2 slices; 1 are available'):
    sharding.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, dcn_data=2)))
