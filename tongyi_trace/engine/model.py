"""The engine's model: a tiny random-weight Qwen2 (config only; vLLM's --load-format dummy makes weights)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tongyi_trace.atomic import atomic_write_text
from tongyi_trace.engine.paths import engine_dir

SERVED_MODEL_NAME = "kvtrace-tiny-qwen2"
VOCAB_SIZE = 32000  # the tiny Qwen2's vocabulary; replay draws prompt token ids below it by default

# A tiny Qwen2: 2 layers, hidden 128, 4 heads, 2 KV heads, head_dim 32 (random weights, no download).
TINY_QWEN2_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 32768,
    "max_window_layers": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def write_model_dir(max_model_len: int, tokenizer: bool = False) -> Path:
    """Write the tiny Qwen2 config.json (random weights are made by --load-format dummy); with TOKENIZER, into
    a folder of its own beside the small local tokenizer of tongyi_trace/engine/tokenizer.py."""
    d = engine_dir() / "model" / ("tiny-qwen2-tokenizer" if tokenizer else "tiny-qwen2")
    d.mkdir(parents=True, exist_ok=True)
    cfg = dict(TINY_QWEN2_CONFIG)
    cfg["max_position_embeddings"] = max(int(cfg["max_position_embeddings"]), max_model_len)
    atomic_write_text(d / "config.json", json.dumps(cfg, indent=2) + "\n")  # engines may start at once
    if tokenizer:
        from tongyi_trace.engine.tokenizer import write_tokenizer_files

        write_tokenizer_files(d, VOCAB_SIZE)
    return d
