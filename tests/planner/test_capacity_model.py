"""Capacities in bytes and models from a Hugging Face config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tongyi_trace.analysis.common import model_record
from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.models import GIB, get_preset
from tongyi_trace.sim.capacity import parse_bytes, parse_capacities

QWEN2_7B_CONFIG = {  # Qwen/Qwen2-7B config.json (the fields kvtrace reads)
    "_name_or_path": "Qwen/Qwen2-7B", "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "hidden_size": 3584, "intermediate_size": 18944, "vocab_size": 152064,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_bytes_units() -> None:
    assert parse_bytes("40GiB") == 40 * 2**30
    assert parse_bytes("200GB") == 200e9
    assert parse_bytes("1.5 TiB") == 1.5 * 2**40
    assert parse_bytes("4096") is None and parse_bytes("5%") is None


def test_gib_round_trip() -> None:
    """bytes -> blocks -> reported GiB: within half a block of what was asked."""
    m = get_preset("qwen2-7b")
    per_block = m.kv_bytes_per_block(16)
    assert per_block == 917_504  # 2 x 28 x 4 x 128 x 2 B x 16 tokens
    caps = parse_capacities("40GiB,200GB,1x", num_distinct=10**9, block_size_tokens=16, model=m)
    assert [c.num_blocks for c in caps[:2]] == [46_811, 217_983]  # round(40 GiB / 917,504), round(200e9 / ...)
    assert caps[0].bytes_per_block == per_block and caps[2].bytes_per_block is None
    assert caps[0].num_bytes is not None and abs(caps[0].num_bytes / GIB - 40) <= per_block / 2 / GIB
    assert abs(caps[1].num_bytes / 1e9 - 200) <= per_block / 2 / 1e9  # type: ignore[operator]


def test_bytes_need_a_model() -> None:
    with pytest.raises(UsageError, match="give --model"):
        parse_capacities("40GiB", num_distinct=100, block_size_tokens=16, model=None)


def test_config_json_equals_preset(tmp_path: Path) -> None:
    cfg = tmp_path / "Qwen2-7B" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(QWEN2_7B_CONFIG))
    from_cfg, preset = get_preset(str(cfg)), get_preset("qwen2-7b")
    assert from_cfg.name == "Qwen2-7B"
    a, b = model_record(from_cfg, 16), model_record(preset, 16)
    for k in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes", "tp", "kv_bytes_per_token",
              "kv_bytes_per_block", "gpu_mem_bytes"):
        assert a[k] == b[k], k
    assert from_cfg.num_params == pytest.approx(7.6e9, rel=0.005)  # counted from the shapes: 7.62e9
    assert a["hbm_blocks"] == pytest.approx(b["hbm_blocks"], rel=0.001)
    caps = [parse_capacities("40GiB", num_distinct=10**6, block_size_tokens=16, model=m)[0].num_blocks
            for m in (from_cfg, preset)]
    assert caps[0] == caps[1]
    # a folder holding config.json works too, and overrides apply as for presets
    assert get_preset(str(cfg.parent), tp=2, gpu_mem_gib=40).gpu_mem_bytes == 40 * GIB


def test_config_json_defaults_and_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096,
                               "torch_dtype": "float32"}))
    m = get_preset(str(cfg))
    assert (m.num_kv_heads, m.head_dim, m.dtype_bytes) == (32, 128, 4)  # MHA, hidden / heads
    cfg.write_text(json.dumps({"num_hidden_layers": 32}))
    with pytest.raises(InputError, match="num_attention_heads missing"):
        get_preset(str(cfg))
    with pytest.raises(UsageError, match="unknown model preset 'gpt5'"):
        get_preset("gpt5")
    with pytest.raises(InputError, match=r"no such config\.json"):
        get_preset(str(tmp_path / "nope.json"))
