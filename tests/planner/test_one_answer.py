"""One answer (issue 43, items 1-3): "x HBM" has one meaning in every place that prints it; `fit`, `simulate`,
the report and the Python API say the same thing per capacity; the report reads a pinned sweep; the run
remembers the model it was sized with. On the real Mooncake synthetic trace (3,993 requests)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import tongyi_trace as kv
from tongyi_trace.analysis import AnalysisOptions, resolve_models, run_analyses
from tongyi_trace.fit.policy_fit import fit_policy
from tongyi_trace.models import GIB, PRESETS, get_preset, load_hf_config, remembered_sizing
from tongyi_trace.policy.file import load_policy
from tongyi_trace.report.sections import recommendation
from tongyi_trace.run import open_run
from tongyi_trace.sim.capacity import parse_capacities
from tongyi_trace.sim.recommend import choice_answer, describe, recommend_run, report_sweep
from tongyi_trace.sim.sweep import SimulateOptions, simulate_run
from tongyi_trace.trace.ingest import ingest_trace

CAPS = "0.25L,2L"


@pytest.fixture(scope="module")
def synthetic_run(mooncake_synthetic_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one-answer") / "run"
    ingest_trace(mooncake_synthetic_path, out)
    return out


@pytest.fixture(scope="module")
def fitted_run(synthetic_run: Path) -> tuple[Path, Path]:
    """The run fitted at CAPS (train = the first 700 of 1,022 s, choice on its held-out end) and swept over CAPS."""
    policy = synthetic_run / "fit" / "policy.json"
    fit_policy(synthetic_run, policy, capacities=CAPS, model=PRESETS["qwen2-7b"], jobs=1, train="0:700")
    simulate_run(synthetic_run, SimulateOptions(policies="lru,s3fifo,fitted,wa", capacities=CAPS,
                                                params_path=policy, jobs=1))
    return synthetic_run, policy


def _x_hbm(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"([0-9.]+)x HBM", text)]


def test_x_hbm_one_meaning(fitted_run: tuple[Path, Path]) -> None:
    """The live set's peak x HBM (analysis), 1L in the Recommendation, fit's answer at 1L and a 1x capacity all
    divide by the same HBM left for KV after the weights (55.8 GiB for qwen2-7b on one 80 GiB GPU)."""
    run, policy = fitted_run
    qwen = PRESETS["qwen2-7b"]
    assert qwen.hbm_kv_bytes / GIB == pytest.approx(55.8, abs=0.05)
    assert qwen.hbm_definition().startswith("1x HBM = 55.8 GiB: the KV memory of 1 x 80 GiB GPU at 90%")
    run_analyses(open_run(run), only=["live_set"], options=AnalysisOptions(models=resolve_models(["qwen2-7b"])))
    live = json.loads((run / "analysis" / "live_set.json").read_text())
    peak_x = live["headline"]["models"]["qwen2-7b"]["peak_x_hbm"]
    res = simulate_run(run, SimulateOptions(policies="lru,s3fifo", capacities="1L,1x", jobs=1, name="sizes"))
    rec = recommend_run(run)
    assert rec is not None
    by = {e["capacity"]: e for e in rec["capacities"]}
    # 1L = the oracle's peak live set, the same blocks the analysis measured
    assert by["1L"]["capacity_blocks"] == res.summary["peak_live_blocks"]
    assert by["1L"]["size"]["qwen2-7b"]["x_hbm"] == pytest.approx(peak_x, rel=1e-9)
    # 1x is one HBM for KV (to the block: whole blocks fit)
    hbm_blocks = qwen.hbm_blocks(int(res.summary["block_size"]))
    assert by["1x"]["capacity_blocks"] == hbm_blocks
    assert by["1x"]["size"]["qwen2-7b"]["x_hbm"] == pytest.approx(1.0, abs=1 / hbm_blocks)
    lines = describe(rec)
    text = "\n".join(lines)
    assert f"{peak_x:.2f}x HBM" in next(line for line in lines if line.startswith("At 1L "))
    assert text.count("1x HBM = 55.8 GiB") == 1  # stated once
    # every size printed is blocks x KV bytes per block / HBM for KV
    per_block = qwen.kv_bytes_per_block(int(res.summary["block_size"]))
    for e in rec["capacities"]:
        line = next(x for x in lines if x.startswith(f"At {e['capacity']} "))
        assert _x_hbm(line)[0] == pytest.approx(e["capacity_blocks"] * per_block / qwen.hbm_kv_bytes, abs=0.006)
    # fit's answer sizes its capacities the same way
    ch = load_policy(policy).choices[0]
    assert _x_hbm(choice_answer(ch, qwen, int(res.summary["block_size"])))[0] == pytest.approx(
        ch.capacity_blocks * per_block / qwen.hbm_kv_bytes, abs=0.006)
    # 1x resolves to the HBM's blocks, with --gpu-mem and --tp too
    big = get_preset("qwen2-7b", gpu_mem_gib=40, tp=2)
    [one] = parse_capacities("1x", num_distinct=10**9, block_size_tokens=512, model=big)
    assert big.x_hbm(one.num_blocks * big.kv_bytes_per_block(512)) == pytest.approx(1.0, abs=1e-3)


def test_fit_simulate_report_api_one_answer(fitted_run: tuple[Path, Path]) -> None:
    """Per fitted capacity, `fit`'s sentence starts `simulate`'s, and the report and the API print the same
    lines; what runs is the policy file's choice (`fitted`), also where the sweep's best is another."""
    run, policy = fitted_run
    simulate_run(run, SimulateOptions(policies="lru,s3fifo,fitted,wa", capacities=CAPS, params_path=policy,
                                      jobs=1, name="answer"))
    rec = recommend_run(run)
    assert rec is not None and rec["sweep"]["name"] == "answer"
    lines = describe(rec)
    choices = load_policy(policy).choices
    assert len(choices) == 2
    bs = int(rec["block_size"])
    for ch in choices:
        entry = next(e for e in rec["capacities"] if e["capacity"] == ch.capacity)
        assert entry["decided_by"] == "fit" and entry["run_policy"] == ch.policy
        fit_line = choice_answer(ch, PRESETS["qwen2-7b"], bs)
        sim_line = next(x for x in lines if x.startswith(f"At {ch.capacity} "))
        assert sim_line.startswith(fit_line), (fit_line, sim_line)
    [section] = recommendation.build(open_run(run))
    assert section.values["lines"] == lines
    assert kv.open_run(run).recommendation_lines() == lines
    assert "fitted = the policy file's choice per capacity (deploy this" in "\n".join(lines)


def test_report_reads_the_pinned_sweep(fitted_run: tuple[Path, Path]) -> None:
    """A one-off sweep does not replace what the report reads; the first full sweep is kept and pinned."""
    run = fitted_run[0]
    pin = report_sweep(run)
    assert pin is not None and pin.name is not None  # pinned by the fixture's first sweep or a --name
    before = recommend_run(run)
    simulate_run(run, SimulateOptions(policies="lru", capacities="10TB", jobs=1))  # a one-off
    assert json.loads((run / "sim" / "summary.json").read_text())["policies"] == ["lru"]  # RUN/sim/ = latest
    after = recommend_run(run)
    assert after is not None and before is not None
    assert [e["capacity"] for e in after["capacities"]] == [e["capacity"] for e in before["capacities"]]
    assert "10TB" not in "\n".join(describe(after))
    [section] = recommendation.build(open_run(run))
    assert pin.describe() in section.definition


def test_first_full_sweep_pinned(mooncake_synthetic_path: Path, tmp_path: Path) -> None:
    """With nothing pinned, a one-off does not pin; the first full unnamed sweep is copied to RUN/sim/first/."""
    run = tmp_path / "run"
    ingest_trace(mooncake_synthetic_path, run)
    simulate_run(run, SimulateOptions(policies="lru", capacities="1000", jobs=1))
    pin = report_sweep(run)
    assert pin is not None and pin.name is None  # none pinned: the latest
    simulate_run(run, SimulateOptions(policies="lru,fifo", capacities="1000,4000", jobs=1))
    simulate_run(run, SimulateOptions(policies="lru,s3fifo", capacities="2000,8000", jobs=1))
    pin = report_sweep(run)
    assert pin is not None and pin.name == "first" and "the first full sweep" in pin.why
    rec = recommend_run(run)
    assert rec is not None and [e["capacity"] for e in rec["capacities"]] == ["1000", "4000"]


def test_run_remembers_its_model(synthetic_run: Path, tmp_path: Path) -> None:
    """Sized once with a config.json and --gpu-mem, later commands use the same model; the name comes from
    the config (`_name_or_path`, else `architectures`, else the file name), never from its folder."""
    cfg = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
           "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
    folder = tmp_path / "ux"
    folder.mkdir()
    (folder / "llama3-8b-config.json").write_text(json.dumps(cfg))
    assert load_hf_config(folder / "llama3-8b-config.json").name == "llama3-8b-config"
    (folder / "arch.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    assert load_hf_config(folder / "arch.json").name == "LlamaForCausalLM"
    (folder / "named.json").write_text(json.dumps({**cfg, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}))
    assert load_hf_config(folder / "named.json").name == "Meta-Llama-3-8B"
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_hf_config(folder).name == "ux"  # a folder's config.json: the folder names the model

    run = synthetic_run
    simulate_run(run, SimulateOptions(policies="lru", capacities="1x", jobs=1, name="llama",
                                      model=str(folder / "llama3-8b-config.json"), gpu_mem_gib=40))
    last = remembered_sizing(run)
    assert last is not None and last.gpu_mem_gib == 40 and last.model.endswith("llama3-8b-config.json")
    res = simulate_run(run, SimulateOptions(policies="lru", capacities="1x", jobs=1, name="again"))
    assert res.summary["model"] == "llama3-8b-config"
    assert res.summary["model_shape"]["gpu_mem_bytes"] == 40 * GIB
    rec = recommend_run(run)
    assert rec is not None and rec["sweep_model"] == "llama3-8b-config"
    assert "sizes for llama3-8b-config" in "\n".join(describe(rec))
    # another model given: the GPU settings start from the defaults again
    res = simulate_run(run, SimulateOptions(policies="lru", capacities="1x", jobs=1, name="qwen", model="qwen2-7b"))
    assert res.summary["model"] == "qwen2-7b" and res.summary["model_shape"]["gpu_mem_bytes"] == 80 * GIB
