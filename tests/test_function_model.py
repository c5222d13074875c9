"""FunctionModel's argument checks (audit tester3, finding 8)."""

import pytest
import torch

from csdgen.models import FunctionModel


def _fn(prefix):
    return torch.zeros(prefix.shape[0], 8)


@pytest.mark.parametrize("grid", [(-2, -3), (2, 3.0), "23", (6,), (1, 2, 3), (0, 0), (2, 2), (True, 6), 6])
def test_function_model_refuses_a_grid_that_is_not_two_integers_at_least_1_whose_product_is_n(grid):
    """(-2, -3) was accepted (product 6) and repeat-vertical then ran with row length -3; (2, 3.0) failed
    8 frames deep in drafting's gather; "23" was a TypeError (can't multiply sequence by non-int)."""
    with pytest.raises(ValueError, match=r"^grid=.*: allowed None \(one row, \(1, 6\)\) or \(rows, cols\), two integers "
                                         r">= 1 whose product is num_image_tokens=6$"):
        FunctionModel(_fn, 6, 8, grid=grid)


def test_function_model_takes_a_grid_as_a_tuple_of_python_ints():
    import numpy as np

    assert FunctionModel(_fn, 6, 8).grid == (1, 6)
    grid = FunctionModel(_fn, 6, 8, grid=[np.int64(2), 3]).grid
    assert grid == (2, 3) and all(type(v) is int for v in grid)
