"""Streams sent once to an executor's workers (tongyi_trace.executor.map_tasks), rebuilt once per worker.

`share_streams` lays each named Stream's fields out as entries of map_tasks' SHARED mapping (numpy arrays,
memory-mapped by the local pool, one object-store copy on Ray) under a fresh share id; a task calls
`worker_stream(shared, name)` to get the Stream back, built over those arrays once per process and share
(a later map_tasks call with another share id drops the streams of the previous one).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from tongyi_trace.sim.stream import Stream

SHARE_ID = "stream_share_id"
_STREAMS: dict[tuple[str, str], Stream] = {}  # (share id, name) -> the stream rebuilt here (per process)


def share_streams(streams: Mapping[str, Stream]) -> dict[str, Any]:
    """The entries of a map_tasks SHARED mapping that carry STREAMS (name -> stream): "<name>.<field>" for
    each field of each stream, and a fresh share id."""
    out: dict[str, Any] = {f"{name}.{f.name}": getattr(st, f.name) for name, st in streams.items()
                           for f in fields(st)}
    out[SHARE_ID] = uuid.uuid4().hex
    return out


def worker_stream(shared: Mapping[str, Any], name: str) -> Stream:
    """The stream NAME that `share_streams` put into SHARED, rebuilt over its arrays once per process."""
    key = (shared[SHARE_ID], name)
    if key not in _STREAMS:
        for old in [k for k in _STREAMS if k[0] != key[0]]:
            del _STREAMS[old]
        prefix = name + "."
        _STREAMS[key] = Stream(**{k[len(prefix):]: v for k, v in shared.items() if k.startswith(prefix)})
    return _STREAMS[key]
