"""kvtrace: KV-cache trace characterization, policy fitting, prefix-cache simulation and live vLLM replay."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvtrace")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+source"
