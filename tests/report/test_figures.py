"""Figure helpers and number formatting: golden values checked by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tongyi_trace.report import fmt
from tongyi_trace.report.figures import downsample


def test_downsample_keeps_short_curves_whole() -> None:
    x, y = downsample([1, 2, 3], [0.1, 0.5, 1.0], max_points=3)
    assert x.tolist() == [1, 2, 3] and y.tolist() == [0.1, 0.5, 1.0]


def test_downsample_golden() -> None:
    # 11 points down to 6: indices round(linspace(0, 10, 6)) = 0, 2, 4, 6, 8, 10.
    x, y = downsample(np.arange(11), np.arange(11) * 10, max_points=6)
    assert x.tolist() == [0, 2, 4, 6, 8, 10]
    assert y.tolist() == [0, 20, 40, 60, 80, 100]


@given(st.lists(st.floats(0, 1e6), min_size=2, max_size=3000), st.integers(2, 500))
def test_downsample_keeps_ends_order_and_bound(values: list[float], max_points: int) -> None:
    xs = np.sort(np.asarray(values))
    ys = np.linspace(0, 1, len(xs))
    x, y = downsample(xs, ys, max_points=max_points)
    assert len(x) == len(y) <= max(max_points, 2)
    assert x[0] == xs[0] and x[-1] == xs[-1] and y[-1] == 1.0
    assert np.all(np.diff(y) > 0)


def test_downsample_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="2 x values and 3 y values"):
        downsample([1, 2], [1, 2, 3])


@pytest.mark.parametrize(("func", "value", "expected"), [
    (fmt.pct, 0.3664, "36.6%"),
    (fmt.pct, None, "n/a"),
    (fmt.ratio, 0.366412, "0.3664"),
    (fmt.ratio, float("nan"), "n/a"),
    (fmt.count, 6_290_000, "6,290,000"),
    (fmt.num, 1234.5, "1.23e+03"),
    (fmt.seconds, 0.31, "0.31 s"),
    (fmt.seconds, 45.2, "45 s"),
    (fmt.seconds, 612, "612 s (10.2 min)"),
    (fmt.seconds, 7200, "7,200 s (2.0 h)"),
    (fmt.size_bytes, 512, "512 B"),
    (fmt.size_bytes, 917_504, "896 KiB"),
    (fmt.size_bytes, 16 * 57_344, "896 KiB"),
    (fmt.size_bytes, 3 * 1024**3, "3 GiB"),
])
def test_formatting_golden(func: object, value: float | None, expected: str) -> None:
    assert callable(func)
    assert func(value) == expected
