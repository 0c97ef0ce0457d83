"""The versioned policy file `kvtrace.policy/2`: what `kvtrace fit` writes and the simulator and the
vLLM plugin read (version-1 files still load). Standard library only, so it imports inside the vLLM
engine's environment. The whole schema is validated here, in one place, with one-line errors.

    schema        "kvtrace.policy/2"
    trace         where the fit came from (source, sha256, format, block_size)
    window        the train window
    turn_buckets  the turn buckets of the category names (sorted positive integers)
    context       null, or {gap_splits_s, pace_split_s, pace_min_gaps}: the category names carry context
                  classes (`text-3+|g1|pf`: tongyi_trace.trace.categories.context_categories), and whoever
                  runs the policy tags each request the same way
    km_grid_s     the time grid of every km_cdf table (tongyi_trace.policy.wa_priority.km_grid_s())
    categories    name -> {reuse_prob, rate_per_s, mean_reuse_s, life_s, num_samples, ks, fallback,
                           km_cdf: [F at km_grid_s]}: the exponential model F(d) = p (1 - e^(-rate d)),
                  the Kaplan-Meier CDF and the lifespan regulator of one category
    default       the same for the pool of all categories (unknown categories use it)
    choices       per capacity, the setting chosen by `kvtrace fit --capacity` (see PolicyChoice)
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tongyi_trace.atomic import atomic_write_text, finite
from tongyi_trace.errors import InputError
from tongyi_trace.policy.names import PLUGIN_POLICIES
from tongyi_trace.policy.wa_priority import KM_NUM, exp_cdf, km_grid_s
from tongyi_trace.schemas import POLICY_SCHEMA, POLICY_SCHEMA_V1


@dataclass(frozen=True)
class CategoryParams:
    """F_w(d) = reuse_prob * (1 - exp(-rate_per_s * d)), its Kaplan-Meier counterpart km_cdf (F at
    km_grid_s(); None = derive it from the exponential model) and the lifespan regulator life_s."""

    reuse_prob: float
    rate_per_s: float
    mean_reuse_s: float
    life_s: float
    num_samples: int = 0
    ks: float = float("nan")
    fallback: bool = False
    km_cdf: tuple[float, ...] | None = None

    def km_cdf_table(self) -> list[float]:
        """F at km_grid_s(): the fitted Kaplan-Meier table, or the exponential model's values."""
        if self.km_cdf is not None:
            return list(self.km_cdf)
        return [exp_cdf(self.reuse_prob, self.rate_per_s, t) for t in km_grid_s()]


@dataclass(frozen=True)
class PolicyChoice:
    """What to run at one capacity: the policy (wa or a baseline), its parameters, and the hit ratios
    measured when it was chosen (train window) and checked (test window), with LRU's beside them."""

    capacity: str  # as the user wrote it
    capacity_blocks: int
    policy: str
    params: dict[str, Any]
    train: dict[str, Any] = field(default_factory=dict)  # hit_ratio, lru_hit_ratio, gain_vs_lru, ...
    test: dict[str, Any] = field(default_factory=dict)


def setting_label(policy: str, params: dict[str, Any]) -> str:
    """A setting in one line: 'wa model=km conditional=True life_s=12.5', or 'lru' (leaf_only, always on for
    a WA choice, left out)."""
    shown = {k: v for k, v in params.items() if k != "leaf_only"}
    return " ".join([policy, *(f"{k}={f'{v:.4g}' if isinstance(v, float) else v}" for k, v in shown.items())])


CHOICE_COLUMNS = ["capacity", "blocks", "run", "hit ratio", "LRU", "vs LRU", "vs best baseline", "why"]
TEST_CHOICE_COLUMNS = ["test hit ratio", "test vs LRU"]


def choice_table(choices: list[PolicyChoice]) -> tuple[list[str], list[list[str]]]:
    """What to run per capacity as text (`kvtrace fit` and the report): columns, then per choice its
    capacity, blocks, setting, hit ratio, LRU's, gains in points over LRU (with its interval when the file
    has one) and the best baseline where it was chosen, why it runs there, and on the test window when
    there was one."""
    def num(x: Any) -> str:
        return "-" if x is None else f"{x:.4f}"

    def points(x: Any, interval: Any = None) -> str:
        if isinstance(interval, dict) and interval.get("lo") is not None and interval.get("hi") is not None:
            return f"{interval['point']:+.2f} +- {(interval['hi'] - interval['lo']) / 2:.2f}"
        return "-" if x is None else f"{100 * x:+.2f}"

    has_test = any(ch.test for ch in choices)
    rows = []
    for ch in choices:
        tr, te = ch.train, ch.test
        row = [ch.capacity, f"{ch.capacity_blocks:,}", setting_label(ch.policy, ch.params), num(tr.get("hit_ratio")),
               num(tr.get("lru_hit_ratio")), points(tr.get("gain_vs_lru"), tr.get("gain_vs_lru_pp")),
               f"{points(tr.get('gain_vs_best_baseline'))} ({tr.get('best_baseline', '-')})",
               str(tr.get("reason", "-"))]
        rows.append(row + ([num(te.get("hit_ratio")), points(te.get("gain_vs_lru"), te.get("gain_vs_lru_pp"))]
                           if has_test else []))
    return CHOICE_COLUMNS + (TEST_CHOICE_COLUMNS if has_test else []), rows


@dataclass(frozen=True)
class RequestContext:
    """Context classes in the category names (tongyi_trace.trace.categories.context_categories): the gap of a
    follow-up turn to its parent against gap_splits_s (empty: none), and the user's pace (the geometric mean
    of their earlier follow-up gaps) against pace_split_s (None: none), known after pace_min_gaps turns."""

    gap_splits_s: tuple[float, ...] = ()
    pace_split_s: float | None = None
    pace_min_gaps: int = 2


@dataclass(frozen=True)
class PolicyParams:
    """A whole policy file: per-category parameters, the pooled `default`, and per-capacity choices."""

    categories: dict[str, CategoryParams]
    default: CategoryParams
    trace: dict[str, Any] = field(default_factory=dict)
    window: dict[str, Any] = field(default_factory=dict)
    turn_buckets: list[int] = field(default_factory=lambda: [1, 2, 3])
    choices: list[PolicyChoice] = field(default_factory=list)
    schema: str = POLICY_SCHEMA
    context: RequestContext | None = None

    def for_category(self, name: str | None) -> CategoryParams:
        """Parameters of category NAME; else, for a name with context classes this file was not fitted
        with (`text-2|g1|pf` to a file fitted without context), those of its base category; else `default`."""
        if name is None:
            return self.default
        if name in self.categories:
            return self.categories[name]
        return self.categories.get(name.split("|", 1)[0], self.default)

    @property
    def block_size(self) -> int:
        """Tokens per block of the trace the file was fitted on (the unit of choices' capacity_blocks)."""
        bs = self.trace.get("block_size")
        return int(bs) if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0 else 16

    def choice_for(self, capacity_tokens: int) -> PolicyChoice | None:
        """The choice whose capacity is nearest CAPACITY_TOKENS (by ratio), or None when there is none."""
        if not self.choices:
            return None
        c = max(capacity_tokens, 1)
        return min(self.choices, key=lambda ch: (abs(math.log(max(ch.capacity_blocks * self.block_size, 1) / c)),
                                                 ch.capacity_blocks))

    def to_json(self) -> dict[str, Any]:
        """The JSON document of schema kvtrace.policy/2."""
        return {
            "schema": POLICY_SCHEMA,
            "trace": self.trace,
            "window": self.window,
            "turn_buckets": list(self.turn_buckets),
            "context": asdict(self.context) if self.context else None,
            "km_grid_s": km_grid_s(),
            "categories": {k: _cat_json(v) for k, v in self.categories.items()},
            "default": _cat_json(self.default),
            "choices": self.choices_json(),
        }

    def choices_json(self) -> list[dict[str, Any]]:
        """The per-capacity choices as the file holds them (also `kvtrace fit --json`'s `choices`)."""
        return [finite(asdict(c)) for c in self.choices]


def _cat_json(c: CategoryParams) -> dict[str, Any]:
    d = asdict(c)
    d["km_cdf"] = c.km_cdf_table()
    return finite(d)


def _number(path: Path, where: str, raw: dict[str, Any], key: str, *, lo: float = 0.0,
            hi: float = math.inf, required: bool = True, default: float = 0.0) -> float:
    if key not in raw or raw[key] is None:
        if required:
            raise InputError(f"{path}: field '{where}.{key}' is missing; regenerate it with 'kvtrace fit'")
        return default
    v = raw[key]
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        raise InputError(f"{path}: field '{where}.{key}' must be a finite number, got {v!r}; "
                         "regenerate it with 'kvtrace fit'")
    if not lo <= v <= hi:
        raise InputError(f"{path}: field '{where}.{key}' is {v}, outside [{lo:g}, {hi:g}]; "
                         "regenerate it with 'kvtrace fit'")
    return float(v)


def _parse_category(path: Path, where: str, raw: Any) -> CategoryParams:
    if not isinstance(raw, dict):
        raise InputError(f"{path}: field '{where}' must be an object; regenerate it with 'kvtrace fit'")
    p = _number(path, where, raw, "reuse_prob", hi=1.0)
    rate = _number(path, where, raw, "rate_per_s")
    life = _number(path, where, raw, "life_s")
    mean = raw.get("mean_reuse_s")
    mean_s = (1.0 / rate if rate > 0 else math.inf) if mean is None else _number(path, where, raw, "mean_reuse_s")
    num = _number(path, where, raw, "num_samples", required=False, hi=2.0**62)
    ks = _number(path, where, raw, "ks", required=False, hi=1.0, default=math.nan)
    fallback = raw.get("fallback", False)
    if not isinstance(fallback, bool):
        raise InputError(f"{path}: field '{where}.fallback' must be true or false, got {fallback!r}")
    km = raw.get("km_cdf")
    table: tuple[float, ...] | None = None
    if km is not None:
        if not isinstance(km, list) or len(km) != KM_NUM:
            raise InputError(f"{path}: field '{where}.km_cdf' must be a list of {KM_NUM} numbers; "
                             "regenerate it with 'kvtrace fit'")
        vals = [_number(path, f"{where}.km_cdf", {str(i): v}, str(i), hi=1.0) for i, v in enumerate(km)]
        if any(b < a for a, b in itertools.pairwise(vals)):
            raise InputError(f"{path}: field '{where}.km_cdf' must not decrease (it is a CDF)")
        table = tuple(vals)
    return CategoryParams(reuse_prob=p, rate_per_s=rate, mean_reuse_s=mean_s, life_s=life,
                          num_samples=int(num), ks=ks, fallback=fallback, km_cdf=table)


def _parse_choice(path: Path, i: int, raw: Any) -> PolicyChoice:
    where = f"choices[{i}]"
    if not isinstance(raw, dict):
        raise InputError(f"{path}: field '{where}' must be an object; regenerate it with 'kvtrace fit'")
    pol = raw.get("policy")
    if pol not in PLUGIN_POLICIES:
        raise InputError(f"{path}: field '{where}.policy' is {pol!r}; it must be one of "
                         f"{', '.join(PLUGIN_POLICIES)}")
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise InputError(f"{path}: field '{where}.params' must be an object")
    for key in ("train", "test"):
        if not isinstance(raw.get(key) or {}, dict):
            raise InputError(f"{path}: field '{where}.{key}' must be an object")
    blocks = _number(path, where, raw, "capacity_blocks", lo=1.0, hi=2.0**62)
    if blocks != int(blocks):
        raise InputError(f"{path}: field '{where}.capacity_blocks' must be a whole number of blocks")
    return PolicyChoice(capacity=str(raw.get("capacity") or int(blocks)), capacity_blocks=int(blocks),
                        policy=str(pol), params=dict(params), train=dict(raw.get("train") or {}),
                        test=dict(raw.get("test") or {}))


def _parse_buckets(path: Path, raw: Any) -> list[int]:
    if raw is None:
        return [1, 2, 3]
    ok = (isinstance(raw, list) and raw and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                                                for b in raw) and raw == sorted(set(raw)))
    if not ok:
        raise InputError(f"{path}: field 'turn_buckets' must be a non-empty increasing list of positive "
                         f"integers, got {raw!r}; regenerate it with 'kvtrace fit'")
    return [int(b) for b in raw]


def parse_policy(doc: Any, path: Path) -> PolicyParams:
    """Validate a decoded policy document (version 1 or 2); raise InputError naming the file and field."""
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a kvtrace policy file (top level is not an object)")
    schema = doc.get("schema")
    if schema not in (POLICY_SCHEMA, POLICY_SCHEMA_V1):
        raise InputError(f"{path}: field 'schema' is {schema!r}, this kvtrace reads {POLICY_SCHEMA!r} "
                         f"and {POLICY_SCHEMA_V1!r}; regenerate it with 'kvtrace fit'")
    for key in ("categories", "default"):
        if key not in doc:
            raise InputError(f"{path}: field '{key}' is missing; regenerate it with 'kvtrace fit'")
    cats = doc["categories"]
    if not isinstance(cats, dict):
        raise InputError(f"{path}: field 'categories' must be an object of category -> parameters")
    if schema == POLICY_SCHEMA:
        grid = doc.get("km_grid_s")
        if not isinstance(grid, list) or len(grid) != KM_NUM or any(
                not isinstance(g, int | float) or not math.isclose(g, e, rel_tol=1e-9, abs_tol=1e-12)
                for g, e in zip(grid, km_grid_s(), strict=False)):
            raise InputError(f"{path}: field 'km_grid_s' differs from this kvtrace's grid; "
                             "regenerate it with 'kvtrace fit'")
    choices = doc.get("choices") or []
    if not isinstance(choices, list):
        raise InputError(f"{path}: field 'choices' must be a list")
    for key in ("trace", "window"):
        if not isinstance(doc.get(key) or {}, dict):
            raise InputError(f"{path}: field '{key}' must be an object")
    return PolicyParams(
        categories={str(k): _parse_category(path, f"categories.{k}", v) for k, v in cats.items()},
        default=_parse_category(path, "default", doc["default"]),
        trace=dict(doc.get("trace") or {}),
        window=dict(doc.get("window") or {}),
        turn_buckets=_parse_buckets(path, doc.get("turn_buckets")),
        choices=[_parse_choice(path, i, c) for i, c in enumerate(choices)],
        schema=str(schema),
        context=_parse_context(path, doc.get("context")),
    )


def _parse_context(path: Path, raw: Any) -> RequestContext | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: field 'context' must be null or an object {{gap_splits_s, pace_split_s, "
                         "pace_min_gaps}; regenerate it with 'kvtrace fit'")
    splits = raw.get("gap_splits_s") or []
    if not isinstance(splits, list) or any(not isinstance(v, int | float) or isinstance(v, bool) or not
                                           math.isfinite(v) or v <= 0 for v in splits) or splits != sorted(set(splits)):
        raise InputError(f"{path}: field 'context.gap_splits_s' must be an increasing list of positive seconds, "
                         f"got {splits!r}; regenerate it with 'kvtrace fit'")
    pace = None if raw.get("pace_split_s") is None else _number(path, "context", raw, "pace_split_s")
    gaps = raw.get("pace_min_gaps", 2)
    if not isinstance(gaps, int) or isinstance(gaps, bool) or gaps < 1:
        raise InputError(f"{path}: field 'context.pace_min_gaps' must be an integer >= 1, got {gaps!r}; "
                         "regenerate it with 'kvtrace fit'")
    return RequestContext(tuple(float(v) for v in splits), pace, gaps)


def load_policy(path: str | Path) -> PolicyParams:
    """Read and validate a kvtrace.policy/2 (or /1) file."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a folder, not a policy file; give the JSON written by 'kvtrace fit' "
                         f"(e.g. {p / 'fit' / 'policy.json'})")
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise InputError(f"{p}: cannot read the policy file ({e.strerror}); check the path") from e
    except json.JSONDecodeError as e:
        raise InputError(f"{p}:{e.lineno}: invalid JSON ({e.msg}); regenerate it with 'kvtrace fit'") from e
    except UnicodeDecodeError:
        raise InputError(f"{p}: not a text file; give the JSON written by 'kvtrace fit'") from None
    return parse_policy(doc, p)


def save_policy(params: PolicyParams, path: str | Path) -> None:
    """Write PARAMS as a kvtrace.policy/2 JSON file, atomically (a unique temporary file, then rename)."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a folder; give a file name for the policy (e.g. {p / 'policy.json'})")
    if p.exists() and not p.is_file():
        raise InputError(f"{p}: is not a regular file; give a file name for the policy")
    blocker = next((a for a in p.parents if a.exists() or a.is_symlink()), None)
    if blocker is not None and not blocker.is_dir():
        raise InputError(f"{p}: {blocker} is a file, not a folder; give the policy a path in a folder")
    text = json.dumps(params.to_json(), indent=2, allow_nan=False) + "\n"
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(p, text)
    except OSError as e:
        raise InputError(f"{p}: cannot write the policy file ({e.strerror}); choose a writable path") from e
