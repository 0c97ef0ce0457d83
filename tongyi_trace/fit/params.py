"""The versioned policy file `kvtrace.policy/1`: what `kvtrace fit` writes and the simulator and the
vLLM plugin read. Standard library only, so it imports inside the vLLM engine's environment."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tongyi_trace.errors import InputError

POLICY_SCHEMA = "kvtrace.policy/1"
_CATEGORY_KEYS = ("reuse_prob", "rate_per_s", "mean_reuse_s", "life_s", "num_samples", "ks", "fallback")


@dataclass(frozen=True)
class CategoryParams:
    """F_w(d) = reuse_prob * (1 - exp(-rate_per_s * d)) and the lifespan regulator life_s of one category."""

    reuse_prob: float
    rate_per_s: float
    mean_reuse_s: float
    life_s: float
    num_samples: int = 0
    ks: float = float("nan")
    fallback: bool = False


@dataclass(frozen=True)
class PolicyParams:
    """A whole policy file: per-category parameters plus the pooled `default`."""

    categories: dict[str, CategoryParams]
    default: CategoryParams
    trace: dict[str, Any] = field(default_factory=dict)
    window: dict[str, Any] = field(default_factory=dict)
    turn_buckets: list[int] = field(default_factory=lambda: [1, 2, 3])
    extra: dict[str, Any] = field(default_factory=dict)

    def for_category(self, name: str | None) -> CategoryParams:
        """Parameters of category NAME, or `default` when unknown or missing."""
        if name is None:
            return self.default
        return self.categories.get(name, self.default)

    def to_json(self) -> dict[str, Any]:
        """The JSON document of schema kvtrace.policy/1."""
        doc: dict[str, Any] = {
            "schema": POLICY_SCHEMA,
            "trace": self.trace,
            "window": self.window,
            "turn_buckets": list(self.turn_buckets),
            "categories": {k: _cat_json(v) for k, v in self.categories.items()},
            "default": _cat_json(self.default),
        }
        doc.update(self.extra)
        return doc


def _cat_json(c: CategoryParams) -> dict[str, Any]:
    d = asdict(c)
    # NaN (no KS) and inf (mean_reuse_s of a category never reused) are written as null: strict JSON
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _parse_category(path: Path, where: str, raw: Any) -> CategoryParams:
    if not isinstance(raw, dict):
        raise InputError(f"{path}: field '{where}' must be an object; regenerate it with 'kvtrace fit'")
    for key in ("reuse_prob", "rate_per_s", "life_s"):
        if key not in raw:
            raise InputError(f"{path}: field '{where}.{key}' is missing; regenerate it with 'kvtrace fit'")
        v = raw[key]
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            raise InputError(f"{path}: field '{where}.{key}' must be a finite number, got {v!r}")
        if v < 0:
            raise InputError(f"{path}: field '{where}.{key}' is negative ({v}); it must be >= 0")
    if raw["reuse_prob"] > 1:
        raise InputError(f"{path}: field '{where}.reuse_prob' is {raw['reuse_prob']} > 1; "
                         "it is a probability")
    rate = float(raw["rate_per_s"])
    ks = raw.get("ks")
    return CategoryParams(
        reuse_prob=float(raw["reuse_prob"]),
        rate_per_s=rate,
        mean_reuse_s=float(raw.get("mean_reuse_s") or (1.0 / rate if rate > 0 else math.inf)),
        life_s=float(raw["life_s"]),
        num_samples=int(raw.get("num_samples") or 0),
        ks=float("nan") if ks is None else float(ks),
        fallback=bool(raw.get("fallback", False)),
    )


def parse_policy(doc: Any, path: Path) -> PolicyParams:
    """Validate a decoded policy document; raise InputError naming the file and field on any problem."""
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a kvtrace policy file (top level is not an object)")
    if doc.get("schema") != POLICY_SCHEMA:
        raise InputError(f"{path}: field 'schema' is {doc.get('schema')!r}, this kvtrace reads "
                         f"{POLICY_SCHEMA!r}; regenerate it with 'kvtrace fit'")
    for key in ("categories", "default"):
        if key not in doc:
            raise InputError(f"{path}: field '{key}' is missing; regenerate it with 'kvtrace fit'")
    cats = doc["categories"]
    if not isinstance(cats, dict):
        raise InputError(f"{path}: field 'categories' must be an object of category -> parameters")
    known = {"schema", "trace", "window", "turn_buckets", "categories", "default"}
    return PolicyParams(
        categories={str(k): _parse_category(path, f"categories.{k}", v) for k, v in cats.items()},
        default=_parse_category(path, "default", doc["default"]),
        trace=dict(doc.get("trace") or {}),
        window=dict(doc.get("window") or {}),
        turn_buckets=[int(b) for b in doc.get("turn_buckets") or [1, 2, 3]],
        extra={k: v for k, v in doc.items() if k not in known},
    )


def load_policy(path: str | Path) -> PolicyParams:
    """Read and validate a kvtrace.policy/1 file."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise InputError(f"{p}: cannot read the policy file ({e.strerror}); check the path") from e
    except json.JSONDecodeError as e:
        raise InputError(f"{p}:{e.lineno}: invalid JSON ({e.msg}); regenerate it with 'kvtrace fit'") from e
    return parse_policy(doc, p)


def save_policy(params: PolicyParams, path: str | Path) -> None:
    """Write PARAMS as a kvtrace.policy/1 JSON file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(params.to_json(), indent=2) + "\n")
