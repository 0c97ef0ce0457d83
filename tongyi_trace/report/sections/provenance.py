"""Provenance: which trace the run came from (file, sha256, format), its size, and ingest's findings."""

from __future__ import annotations

from typing import Any

from tongyi_trace.report import fmt
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.run import RunDir

MAX_EXAMPLES = 3


def build(run: RunDir) -> list[Section]:
    """The provenance section from provenance.json (always present in a run folder)."""
    prov = run.provenance()
    counts = Table(
        columns=["quantity", "value"],
        rows=[
            ["requests", fmt.count(prov.get("num_requests"))],
            ["block references", fmt.count(prov.get("num_block_refs"))],
            ["distinct blocks", fmt.count(prov.get("num_distinct_blocks"))],
            ["block size", f"{fmt.count(prov.get('block_size'))} tokens"],
            ["duration", fmt.seconds(prov.get("duration_s"))],
            ["fields present", _fields_present(prov)],
        ],
    )
    findings: dict[str, Any] = prov.get("findings") or {}
    examples: dict[str, Any] = prov.get("finding_examples") or {}
    finding_rows = [
        [str(kind), fmt.count(n), "; ".join(str(e) for e in (examples.get(kind) or [])[:MAX_EXAMPLES])]
        for kind, n in sorted(findings.items(), key=lambda kv: (-int(kv[1] or 0), str(kv[0])))
    ]
    return [Section(
        key="provenance",
        title="Provenance",
        tables={"counts": counts,
                "findings": Table(columns=["finding", "count", "examples"], rows=finding_rows)},
        values={"source": str(prov.get("source", "")), "sha256": str(prov.get("sha256", "")),
                "format": str(prov.get("format", "")), "created_by": str(prov.get("created_by", "")),
                "num_findings": sum(int(n or 0) for n in findings.values())},
        headline=[
            Headline("requests", fmt.count(prov.get("num_requests")), "43,058 (trace A)"),
            Headline("block references", fmt.count(prov.get("num_block_refs")), "6.29 M (trace A)"),
            Headline("duration", fmt.seconds(prov.get("duration_s")), "~2 h (trace A)"),
        ],
    )]


def _fields_present(prov: dict[str, Any]) -> str:
    names = [name for name in ("types", "turns", "users", "sessions") if prov.get(f"has_{name}")]
    return ", ".join(names) if names else "none beyond timestamps, lengths and block ids"
