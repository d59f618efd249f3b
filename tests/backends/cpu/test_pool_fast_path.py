"""The unpadded max_pool2d fast path agrees with the reference, NaN propagation included."""

import numpy as np
import pytest

from lucid.backends.cpu.testing import check


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("kernel, strides", [((2, 2), (2, 2)), ((3, 2), (1, 2)), ((3, 3), (2, 1))])
def test_unpadded_max_pool_matches_reference_with_nans(dtype, kernel, strides):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32 if dtype == "f32" else np.float64)
    x[0, 1, 4, 3] = np.nan
    x[1, 2, 0, 0] = np.nan
    attrs = {"kernel": kernel, "strides": strides, "padding": (0, 0, 0, 0), "dilation": (1, 1)}
    y = check("max_pool2d", [x], attrs)
    assert np.isnan(y).any()
