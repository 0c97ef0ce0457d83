"""Number formatting for the report's tables and prose (one place, so every section reads alike)."""

from __future__ import annotations

import math

NA = "n/a"


def _value(x: float | None) -> float | None:
    """X as a float, or None when missing or NaN."""
    if x is None:
        return None
    v = float(x)
    return None if math.isnan(v) else v


def pct(x: float | None, digits: int = 1) -> str:
    """A ratio in [0, 1] as a percentage: 0.3664 -> '36.6%'."""
    v = _value(x)
    return NA if v is None else f"{100.0 * v:.{digits}f}%"


def ratio(x: float | None, digits: int = 4) -> str:
    """A ratio with DIGITS decimals: 0.36641 -> '0.3664'."""
    v = _value(x)
    return NA if v is None else f"{v:.{digits}f}"


def count(n: float | None) -> str:
    """An integer count with thousands separators: 6290000 -> '6,290,000'."""
    v = _value(n)
    return NA if v is None else f"{round(v):,}"


def num(x: float | None, digits: int = 3) -> str:
    """A float with DIGITS significant digits."""
    v = _value(x)
    return NA if v is None else f"{v:.{digits}g}"


def quantity(x: float | None) -> str:
    """A measured quantity as people read it, about 3 significant digits, no exponent, thousands separated:
    8.183 -> '8.18', 32.71 -> '32.7', 10412.3 -> '10,412', 0.0123 -> '0.012'."""
    v = _value(x)
    if v is None:
        return NA
    a = abs(v)
    if a >= 100 or a == 0:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.2g}" if a >= 1e-4 else f"{v:.1e}"


def multiple(x: float | None) -> str:
    """A multiple of a capacity: 4.21 -> '4.21x'; below 0.01 as a percentage: 9.37e-05 -> '0.0094%'."""
    v = _value(x)
    if v is None:
        return NA
    return f"{v:.3g}x" if abs(v) >= 0.01 else f"{100 * v:.2g}%"


def seconds(s: float | None) -> str:
    """A duration in seconds, human scaled: 0.31 -> '0.31 s', 612 -> '612 s (10.2 min)'."""
    v = _value(s)
    if v is None:
        return NA
    if v < 10:
        return f"{v:.3g} s"
    if v < 120:
        return f"{v:.0f} s"
    if v < 7200:
        return f"{v:,.0f} s ({v / 60:.1f} min)"
    return f"{v:,.0f} s ({v / 3600:.1f} h)"


def milliseconds(x: float | None) -> str:
    """Milliseconds, human scaled: 0.52 -> '0.52 ms', 31.06 -> '31.1 ms', 2625.5 -> '2,626 ms'."""
    v = _value(x)
    if v is None:
        return NA
    return f"{v:.3g} ms" if abs(v) < 100 else f"{v:,.0f} ms"


def size_bytes(n: float | None) -> str:
    """Bytes in binary units: 917504 -> '896 KiB'."""
    v = _value(n)
    if v is None:
        return NA
    if abs(v) < 1024:
        return f"{v:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        v /= 1024
        if abs(v) < 1024 or unit == "TiB":
            break
    return f"{v:.3g} {unit}"
