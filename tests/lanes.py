"""The test lanes: what `make test` (the fast lane) and `make test-all` (every test) run, and how hard.

- `full`-marked tests run only in `make test-all` (and so in CI): the slowest real-engine cases and long runs
  whose behaviour the fast lane also covers on a smaller input. `make test` runs `-m "not full"`.
- Hypothesis example counts come from the loaded profile: a test asks for `examples(N)`, N being its count
  under the full profile (`kvtrace`, 100 examples by default); the fast lane's profile (`kvtrace-fast`,
  `--hypothesis-profile kvtrace-fast`) scales every count down by the same factor.
- Per-marker timeouts (tests/conftest.py): a hang fails in minutes, not after the 15-minute global limit.
- Two workers (pytest-xdist, `--dist loadgroup`; pytest < 9.2, whose test ids no longer carry the groups: see
  pyproject.toml): a module's tests stay together (its module fixtures are built once), the real-engine tests
  run on one worker per engine configuration (the tokenizer engine's tests on one, every other engine test on
  the other: each session engine is started once, and the two chains, mostly waiting on their engines,
  overlap), and every Ray test on one worker (one test cluster).
"""

from __future__ import annotations

from hypothesis import settings

FULL_PROFILE_EXAMPLES = 100  # the `kvtrace` profile's max_examples: the counts tests give are relative to it
FAST_PROFILE_EXAMPLES = 30
MIN_EXAMPLES = 5

# Timeout of a test by its markers (the largest that applies), seconds; fixture set-up included.
TIMEOUT_S_BY_MARKER = {"engine": 600, "browser": 300, "slow": 600, "full": 600}
DEFAULT_TIMEOUT_S = 300  # a kernel compiled cold can take minutes (make install compiles them ahead)

settings.register_profile("kvtrace", derandomize=True, deadline=None, max_examples=FULL_PROFILE_EXAMPLES)
settings.register_profile("kvtrace-fast", derandomize=True, deadline=None, max_examples=FAST_PROFILE_EXAMPLES)


def examples(num_full: int) -> int:
    """A property test's example count under the loaded profile: num_full under the full profile, scaled."""
    scale = settings.default.max_examples / FULL_PROFILE_EXAMPLES
    return max(MIN_EXAMPLES, round(num_full * scale))


def timeout_s(markers: set[str]) -> int:
    """The timeout of a test carrying these markers."""
    return max([TIMEOUT_S_BY_MARKER[m] for m in markers if m in TIMEOUT_S_BY_MARKER], default=DEFAULT_TIMEOUT_S)


RAY_FIXTURES = {"ray_address", "make_ray_head", "ray_auth"}


def worker_group(nodeid: str, markers: set[str], fixtures: set[str]) -> str:
    """The parallel worker group of a test: `engine-tok` (the tokenizer engine's), `engine`, `ray`, or its
    module's path."""
    if "engine" in markers:
        return "engine-tok" if "tok_engine" in fixtures else "engine"
    if fixtures & RAY_FIXTURES:
        return "ray"
    return nodeid.split("::", 1)[0]
