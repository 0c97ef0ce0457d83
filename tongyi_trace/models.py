"""Model presets for KV size and HBM capacity (paper Fig 21-22, section 5).

kv_bytes_per_token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes, per GPU it is divided by
the tensor-parallel degree (KV heads are sharded). HBM left for KV = tp x (GPU memory x utilization)
- weights - activation reserve. Qwen2-7B: 2 x 28 x 4 x 128 x 2 B = 57,344 B/token = 0.875 MiB per 16 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tongyi_trace.errors import UsageError

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
                             "raise --gpu-mem-gib or --tp")
        return left

    def hbm_blocks(self, block_size_tokens: int) -> int:
        """How many blocks of BLOCK_SIZE_TOKENS fit in the HBM left for KV."""
        return self.hbm_kv_bytes // self.kv_bytes_per_block(block_size_tokens)


PRESETS: dict[str, ModelPreset] = {
    "qwen2-7b": ModelPreset("qwen2-7b", num_layers=28, num_kv_heads=4, head_dim=128, dtype_bytes=2,
                            num_params=7.6e9),
    "llama2-13b": ModelPreset("llama2-13b", num_layers=40, num_kv_heads=40, head_dim=128, dtype_bytes=2,
                              num_params=13.0e9),
    "llama3-70b": ModelPreset("llama3-70b", num_layers=80, num_kv_heads=8, head_dim=128, dtype_bytes=2,
                              num_params=70.6e9, tp=4),
}


def get_preset(name: str, *, gpu_mem_gib: float | None = None, tp: int | None = None,
               reserve_gib: float | None = None, utilization: float | None = None) -> ModelPreset:
    """Preset NAME with optional overrides of GPU memory, TP degree, reserve and utilization."""
    try:
        preset = PRESETS[name.lower()]
    except KeyError:
        raise UsageError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}") from None
    return replace(
        preset,
        gpu_mem_bytes=preset.gpu_mem_bytes if gpu_mem_gib is None else int(gpu_mem_gib * GIB),
        tp=preset.tp if tp is None else tp,
        activation_reserve_bytes=(preset.activation_reserve_bytes if reserve_gib is None
                                  else int(reserve_gib * GIB)),
        gpu_mem_utilization=preset.gpu_mem_utilization if utilization is None else utilization,
    )
