"""``layers.project``: a dense layer's product with its kernel gradient written out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.models import layers

pytestmark = pytest.mark.any_device_count  # tests/support/device_workers.py


# (x shape, kernel shape, n_in, in_first): one input axis into (heads, kv) as Q/K/V do,
# (heads, kv) into one as an output projection with an [*in, *out] or an [*out, *in]
# kernel (XLNet's ``o``), rows without a sequence axis into two axes through an
# [*out, *in] kernel, and no rows.
CASES = [((3, 5, 8), (8, 4, 6), 1, True), ((3, 5, 4, 6), (4, 6, 8), 2, True),
         ((3, 5, 4, 6), (8, 4, 6), 2, False), ((7, 8), (4, 6, 8), 1, False),
         ((0, 5, 8), (8, 5), 1, True)]


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('x_shape,k_shape,n_in,in_first', CASES)
def test_project_equals_autodiff_of_the_plain_product(x_shape, k_shape, n_in, in_first, dtype):
  dt = jnp.dtype(dtype)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=x_shape), dt)
  kernel = jnp.asarray(rng.normal(size=k_shape), dt)
  k_in = tuple(range(n_in)) if in_first else tuple(range(len(k_shape) - n_in, len(k_shape)))
  dims = ((tuple(range(len(x_shape) - n_in, len(x_shape))), k_in), ((), ()))
  plain = lambda x, kernel: jax.lax.dot_general(x, kernel, dims)
  ours = lambda x, kernel: (layers.project(x, kernel, n_in) if in_first  # The default.
                            else layers.project(x, kernel, n_in, in_first=False))
  y, vjp = jax.vjp(ours, x, kernel)
  y_ref, vjp_ref = jax.vjp(plain, x, kernel)
  g = jnp.asarray(rng.normal(size=y_ref.shape), dt)
  tol = 1e-5 if dtype == 'float32' else 3e-2
  for name, a, b in (('y', y, y_ref), *zip(('dx', 'dkernel'), vjp(g), vjp_ref(g))):
    assert a.shape == b.shape and a.dtype == b.dtype, name
    np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=tol, atol=tol * 4,
                               err_msg=name)
