"""Model presets for KV size and HBM capacity (paper Fig 21-22, section 5).

kv_bytes_per_token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes, per GPU it is divided by
the tensor-parallel degree (KV heads are sharded). HBM left for KV = tp x (GPU memory x utilization)
- weights - activation reserve. Qwen2-7B: 2 x 28 x 4 x 128 x 2 B = 57,344 B/token = 0.875 MiB per 16 tokens.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tongyi_trace.errors import InputError, KvtraceError, UsageError
from tongyi_trace.schemas import SIZING_SCHEMA

GIB = 1024**3


@dataclass(frozen=True)
class ModelPreset:
    """Shape of a served model and the GPU it runs on, enough to size its KV cache."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    num_params: float
    tp: int = 1
    gpu_mem_bytes: int = 80 * GIB
    gpu_mem_utilization: float = 0.9
    activation_reserve_bytes: int = 2 * GIB

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies over the whole model (all TP shards)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_block(self, block_size_tokens: int) -> int:
        """KV-cache bytes of one block of BLOCK_SIZE_TOKENS tokens."""
        return self.kv_bytes_per_token * block_size_tokens

    @property
    def weights_bytes(self) -> int:
        """Bytes of the model weights (num_params x dtype bytes)."""
        return int(self.num_params * self.dtype_bytes)

    @property
    def hbm_kv_bytes(self) -> int:
        """HBM left for the KV cache over the TP group: GPU memory x utilization - weights - reserve."""
        total = self.tp * self.gpu_mem_bytes * self.gpu_mem_utilization
        left = int(total - self.weights_bytes - self.tp * self.activation_reserve_bytes)
        if left <= 0:
            raise UsageError(f"model {self.name}: weights and reserve exceed GPU memory; "
                             "raise --gpu-mem or --tp")
        return left

    def hbm_blocks(self, block_size_tokens: int) -> int:
        """How many blocks of BLOCK_SIZE_TOKENS fit in the HBM left for KV."""
        return self.hbm_kv_bytes // self.kv_bytes_per_block(block_size_tokens)

    def x_hbm(self, num_bytes: float) -> float:
        """NUM_BYTES of KV in "x HBM": over the HBM left for KV (hbm_kv_bytes), the one meaning of x HBM
        everywhere (capacities such as 1x, the live set, request sizes, the Recommendation)."""
        return num_bytes / self.hbm_kv_bytes

    def hbm_definition(self) -> str:
        """The sentence that defines 1x HBM for this model and GPU settings, printed once per output:
        '1x HBM = 55.8 GiB: the KV memory of 1 x 80 GiB GPU at 90% after qwen2-7b's 14.2 GiB weights and
        a 2.0 GiB reserve per GPU'."""
        gpus = f"{self.tp} x {self.gpu_mem_bytes / GIB:g} GiB GPU{'s' if self.tp != 1 else ''}"
        return (f"1x HBM = {self.hbm_kv_bytes / GIB:,.1f} GiB: the KV memory of {gpus} at "
                f"{100 * self.gpu_mem_utilization:g}% after {self.name}'s {self.weights_bytes / GIB:,.1f} GiB "
                f"weights and a {self.activation_reserve_bytes / GIB:g} GiB reserve per GPU")


DEFAULT_MODEL = "qwen2-7b"  # the model of x HBM capacities, bytes and QTTFT when no --model is given
PRESETS: dict[str, ModelPreset] = {
    "qwen2-7b": ModelPreset("qwen2-7b", num_layers=28, num_kv_heads=4, head_dim=128, dtype_bytes=2,
                            num_params=7.6e9),
    "llama2-13b": ModelPreset("llama2-13b", num_layers=40, num_kv_heads=40, head_dim=128, dtype_bytes=2,
                              num_params=13.0e9),
    "llama3-70b": ModelPreset("llama3-70b", num_layers=80, num_kv_heads=8, head_dim=128, dtype_bytes=2,
                              num_params=70.6e9, tp=4),
}


DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "fp8": 1, "int8": 1}


MAX_GPU_MEM_GIB = 2**20  # the largest GPU memory, TP degree or reserve an option takes (1 PiB)
MAX_MODEL_NUMBER = 1e15  # the largest model shape number an option takes (layers, heads, parameters, ...)


def get_preset(name: str, *, gpu_mem_gib: float | None = None, tp: int | None = None,
               reserve_gib: float | None = None, utilization: float | None = None) -> ModelPreset:
    """Model NAME (a preset name or the path of a Hugging Face config.json) with optional overrides of GPU
    memory, TP degree, reserve and utilization."""
    base = load_hf_config(Path(name)) if _is_config_path(name) else PRESETS.get(name.lower())
    if base is None:
        raise UsageError(f"unknown model preset {name!r}; give a preset ({', '.join(PRESETS)}) or the path of a "
                         "Hugging Face config.json")
    for flag, v in (("--gpu-mem", gpu_mem_gib), ("--tp", tp)):
        if v is not None and not (math.isfinite(v) and 0 < v <= MAX_GPU_MEM_GIB):
            raise UsageError(f"{flag} {v}: give a number > 0 and <= {MAX_GPU_MEM_GIB}")
    return replace(
        base,
        gpu_mem_bytes=base.gpu_mem_bytes if gpu_mem_gib is None else int(gpu_mem_gib * GIB),
        tp=base.tp if tp is None else tp,
        activation_reserve_bytes=(base.activation_reserve_bytes if reserve_gib is None
                                  else int(reserve_gib * GIB)),
        gpu_mem_utilization=base.gpu_mem_utilization if utilization is None else utilization,
    )


def _is_config_path(name: str) -> bool:
    return name.lower().endswith(".json") or "/" in name or Path(name).is_file()


def load_hf_config(path: Path) -> ModelPreset:
    """A model shape from a Hugging Face config.json (a file, or a folder holding one); nothing is
    downloaded. Layers, KV heads (num_key_value_heads, else num_attention_heads), head dim (head_dim, else
    hidden_size / heads) and dtype (torch_dtype) are read; parameters are counted from the shapes
    (embeddings, attention, gated MLP) for the weights' share of HBM."""
    if path.is_dir():
        path = path / "config.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such config.json; give a preset ({', '.join(PRESETS)}) or a config "
                         "path") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable JSON config ({e})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}:1: a config.json is a JSON object")
    if "num_hidden_layers" not in doc and isinstance(doc.get("text_config"), dict):
        doc = {**doc, **doc["text_config"]}  # multimodal configs nest the language model
    name = config_model_name(doc, path)
    layers = _field(path, doc, "num_hidden_layers")
    heads = _field(path, doc, "num_attention_heads")
    kv_heads = _field(path, doc, "num_key_value_heads", heads)
    hidden = _field(path, doc, "hidden_size")
    head_dim = _field(path, doc, "head_dim", hidden // heads if heads else None)
    dtype = str(doc.get("torch_dtype") or doc.get("dtype") or "bfloat16").lower().removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"{path}: field torch_dtype {dtype!r} unknown; use one of {', '.join(DTYPE_BYTES)}")
    return ModelPreset(name, num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                       dtype_bytes=DTYPE_BYTES[dtype], num_params=_count_params(doc, layers, heads, kv_heads,
                                                                                head_dim, hidden))


def config_model_name(doc: dict[str, Any], path: Path) -> str:
    """The name of a model given by a config.json: its `_name_or_path` (last part), else its first
    `architectures` entry, else the file's name (a folder's config.json: the folder's name)."""
    named = str(doc.get("_name_or_path") or "").rstrip("/").split("/")[-1]
    if named:
        return named
    archs = doc.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0]:
        return archs[0]
    stem = path.stem
    return (path.parent.name or stem) if stem == "config" else stem


def _field(path: Path, doc: dict[str, Any], key: str, default: int | None = None) -> int:
    v = doc.get(key, default)
    if v is None:
        raise InputError(f"{path}: field {key} missing; a decoder config.json needs it")
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise InputError(f"{path}: field {key} is {v!r}; it must be a positive integer")
    return v


def _count_params(doc: dict[str, Any], layers: int, heads: int, kv_heads: int, head_dim: int,
                  hidden: int) -> float:
    """Parameters of a decoder: embeddings (twice unless tied) + per layer Q, K, V, O and a gated MLP."""
    inter = int(doc.get("intermediate_size") or 4 * hidden)
    vocab = int(doc.get("vocab_size") or 0)
    attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * inter
    experts = int(doc.get("num_local_experts") or doc.get("num_experts") or 1)
    emb = vocab * hidden * (1 if doc.get("tie_word_embeddings") else 2)
    return float(emb + layers * (attn + experts * mlp))




@dataclass(frozen=True)
class Sizing:
    """The model (a preset name or a config.json path) and the GPU settings a run is sized with."""

    model: str = DEFAULT_MODEL
    gpu_mem_gib: float | None = None
    tp: int | None = None

    def preset(self) -> ModelPreset:
        """The model shape with the GPU settings applied."""
        return get_preset(self.model, gpu_mem_gib=self.gpu_mem_gib, tp=self.tp)


def run_sizing(run_path: Path, model: str | None = None, gpu_mem_gib: float | None = None,
               tp: int | None = None) -> Sizing:
    """The sizing of a command over RUN_PATH: MODEL, GPU_MEM_GIB and TP where given, the rest from what the
    run was last sized with (RUN/sizing.json: only when MODEL is not given or names the same model), else
    the defaults (DEFAULT_MODEL, 80 GiB, the preset's TP). A config path is kept absolute."""
    if model is not None and _is_config_path(model):
        model = str(Path(model).resolve())
    last = remembered_sizing(run_path)
    if last is not None and model in (None, last.model):
        return Sizing(last.model, last.gpu_mem_gib if gpu_mem_gib is None else gpu_mem_gib,
                      last.tp if tp is None else tp)
    return Sizing(model or DEFAULT_MODEL, gpu_mem_gib, tp)


def remembered_sizing(run_path: Path) -> Sizing | None:
    """What RUN/sizing.json holds, None when there is none (or it is of another ingest, or unreadable)."""
    from tongyi_trace.run import SIZING_FILE, read_artifact

    try:
        doc = read_artifact(Path(run_path) / SIZING_FILE, SIZING_SCHEMA, required=False)
    except KvtraceError:
        return None
    if not doc or not isinstance(doc.get("model"), str):
        return None
    return Sizing(doc["model"], doc.get("gpu_mem_gib"), doc.get("tp"))


def remember_sizing(run_path: Path, sizing: Sizing, by: str) -> None:
    """Write RUN/sizing.json: SIZING, with the model's resolved name and the command that set it (BY); a sizing
    equal to the remembered one is not written again (the file changes only when the sizing does)."""
    from tongyi_trace.run import SIZING_FILE, write_json

    if remembered_sizing(run_path) == sizing:
        return
    write_json(Path(run_path) / SIZING_FILE, {"schema": SIZING_SCHEMA, "model": sizing.model,
                                              "model_name": sizing.preset().name, "gpu_mem_gib": sizing.gpu_mem_gib,
                                              "tp": sizing.tp, "by": by})
