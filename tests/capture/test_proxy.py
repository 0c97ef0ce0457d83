"""`kvtrace capture` in front of the small in-process upstream of conftest.py: forwarding byte for byte, the
lines it writes, every error passed through and counted, privacy, stops. The real engine: test_engine.py."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.capture.conftest import SLOW_S, SLOW_TOKENIZE_S, FakeUpstream, fake_token_ids, read_lines

FIELDS = {"chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn", "linked_by",
          "hash_ids"}


def _post(base: str, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(base + path, content=json.dumps(body).encode(), timeout=30,
                      headers={"Content-Type": "application/json", **headers})


def _ids(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


def test_replies_pass_byte_for_byte_with_headers(fake_upstream: FakeUpstream, start_capture: Any,
                                                 tmp_path: Path) -> None:
    cap = start_capture(fake_upstream.url("ok"), tmp_path / "t.jsonl")
    bodies = [{"model": "fake", "prompt": _ids(40), "max_tokens": 3},
              {"model": "fake", "prompt": _ids(40), "max_tokens": 3, "stream": True,
               "stream_options": {"include_usage": True}},
              {"model": "fake", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "stream": True}]
    for body in bodies:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        direct = _post(fake_upstream.url("ok"), path, body)
        n = len(fake_upstream.received)
        proxied = _post(cap.url, path, body, **{"X-Client-Tag": "t1", "Authorization": "Bearer k"})
        assert proxied.status_code == direct.status_code == 200
        assert proxied.content == direct.content
        assert proxied.headers["content-type"] == direct.headers["content-type"]
        up_path, up_headers, up_body = fake_upstream.received[n]
        assert up_path == "/ok" + path and up_body == json.dumps(body).encode()  # the request's bytes, unchanged
        assert up_headers["X-Client-Tag"] == "t1" and up_headers["Authorization"] == "Bearer k"
    models = httpx.get(cap.url + "/v1/models?x=1", timeout=30)  # any other path: forwarded, not recorded
    assert models.json()["data"][0]["id"] == "fake" and models.headers["X-Upstream"] == "models"
    assert fake_upstream.received[-1][0] == "/ok/v1/models"
    s = cap.stop()
    assert (s["num_recorded"], s["num_errors"], s["num_skipped"], s["num_passthrough"]) == (3, 0, 0, 1)
    lines = read_lines(tmp_path / "t.jsonl")
    assert [set(r) for r in lines] == [FIELDS] * 3
    assert [(r["input_length"], r["output_length"], r["type"]) for r in lines] == [(40, 3, "text"), (40, 3, "text"),
                                                                                  (5, 2, "text")]
    # two requests with the same 40 token ids: the same three blocks (16 + 16 + 8 tokens), numbered densely
    assert lines[0]["hash_ids"] == lines[1]["hash_ids"] == [0, 1, 2] and lines[2]["hash_ids"] == [3]
    assert [r["chat_id"] for r in lines] == [0, 1, 2]
    assert lines[0]["timestamp"] < lines[1]["timestamp"] < lines[2]["timestamp"] < s["duration_s"]


def test_errors_pass_through_and_are_counted(fake_upstream: FakeUpstream, start_capture: Any,
                                             tmp_path: Path) -> None:
    body = {"model": "fake", "prompt": _ids(20), "max_tokens": 4}
    # a port nobody listens on: the upstream is down
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{sock.getsockname()[1]}"
    cap = start_capture(down, tmp_path / "down.jsonl")
    r = _post(cap.url, "/v1/completions", body)
    assert r.status_code == 502
    assert f"kvtrace capture: upstream {down} unreachable" in r.json()["error"]["message"]
    assert httpx.get(cap.url + "/v1/models", timeout=30).status_code == 502
    s = cap.stop()
    assert (s["num_recorded"], s["num_errors"], s["errors"]) == (0, 1, {"upstream unreachable": 1})

    out = tmp_path / "errors.jsonl"
    for mode in ("500", "garbage", "cut"):
        cap = start_capture(fake_upstream.url(mode), out, "--overwrite")
        direct_500 = _post(fake_upstream.url("500"), "/v1/completions", body).content
        if mode == "500":
            r = _post(cap.url, "/v1/completions", body)
            assert r.status_code == 500 and r.content == direct_500 and r.headers["X-Upstream"] == "500"
        elif mode == "garbage":
            r = _post(cap.url, "/v1/completions", body)
            assert r.status_code == 200 and r.content == b"this is {not json"
            r = _post(cap.url, "/v1/completions", {**body, "stream": True})  # this upstream answers garbage
            assert r.content == b"this is {not json"
        else:
            with pytest.raises(httpx.RemoteProtocolError):  # the client sees the cut the upstream made
                _post(cap.url, "/v1/completions", {**body, "stream": True})
        ok = _post(cap.url, "/v1/completions", {**body, "max_tokens": 1, "stream": True}) if mode == "cut" else None
        s = cap.stop()
        expected = {"500": {"upstream HTTP 500": 1}, "garbage": {"reply is not JSON": 2},
                    "cut": {"stream cut short by the upstream": 1}}[mode]
        assert s["errors"] == expected and s["num_errors"] == sum(expected.values())
        # a one-token stream ends before the cut: the proxy goes on after an error
        assert s["num_recorded"] == (1 if ok is not None and ok.status_code == 200 else 0)
        assert len(read_lines(out)) == s["num_recorded"]


def test_requests_it_cannot_count_are_skipped_with_their_reason(fake_upstream: FakeUpstream, start_capture: Any,
                                                                tmp_path: Path) -> None:
    cap = start_capture(fake_upstream.url("nousage"), tmp_path / "a.jsonl")
    r = _post(cap.url, "/v1/completions", {"model": "fake", "prompt": _ids(20), "max_tokens": 4})
    assert r.status_code == 200 and "usage" not in r.json()
    # a stream without usage: output tokens counted, one per chunk carrying text
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": _ids(20), "max_tokens": 4, "stream": True})
    s = cap.stop()
    assert s["skipped"] == {"reply without usage (output length unknown)": 1} and s["num_recorded"] == 1
    assert read_lines(tmp_path / "a.jsonl")[0]["output_length"] == 4

    cap = start_capture(fake_upstream.url("notokenize"), tmp_path / "b.jsonl")
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": "some text", "max_tokens": 2})
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": _ids(20), "max_tokens": 2})  # ids: no call
    s = cap.stop()
    assert s["num_recorded"] == 1 and s["num_skipped"] == 1
    (reason,) = s["skipped"]
    assert reason.startswith("no token ids: the upstream has no /tokenize") and "--tokenizer" in reason


def test_text_prompts_batches_and_types(fake_upstream: FakeUpstream, start_capture: Any, tmp_path: Path) -> None:
    cap = start_capture(fake_upstream.url("ok"), tmp_path / "t.jsonl.gz")
    text = "a" * 20 + "b" * 20
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": text, "max_tokens": 2})
    # a batch of two prompts, streamed: one line each, each with its own outputs
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": [text, _ids(17)], "max_tokens": 3, "stream": True})
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": [text, text], "max_tokens": 3})  # not streamed
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {}}]
    _post(cap.url, "/v1/chat/completions", {"model": "fake", "max_tokens": 1,
                                            "messages": [{"role": "user", "content": parts}]})
    num_chat = len(fake_token_ids(str(parts)))  # the fake upstream's chat "template": the contents' text
    _post(cap.url, "/v1/chat/completions", {"model": "fake", "max_tokens": 1, "enable_search": True,
                                            "messages": [{"role": "user", "content": "news?"}]})
    s = cap.stop()
    assert s["skipped"] == {"batched prompts in a reply without per-prompt counts (send stream: true)": 2}
    lines = read_lines(tmp_path / "t.jsonl.gz")
    assert [(r["input_length"], r["output_length"], r["type"], len(r["hash_ids"])) for r in lines] == [
        (40, 2, "text", 3), (40, 3, "text", 3), (17, 3, "text", 2), (num_chat, 1, "image", -(-num_chat // 16)),
        (5, 1, "search", 1)]
    assert lines[1]["hash_ids"] == lines[0]["hash_ids"]  # the same text, tokenized alike
    assert lines[1]["timestamp"] == lines[2]["timestamp"]  # one request, one arrival


def test_no_prompt_text_token_id_or_header_reaches_the_file(fake_upstream: FakeUpstream, start_capture: Any,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    cap = start_capture(fake_upstream.url("ok"), out)
    secret = "SECRET-PROMPT-Zebra"
    ids = [987654321 + 7 * i for i in range(40)]
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": ids, "max_tokens": 2, "user": "alice@example.com"},
          **{"X-User-Id": "alice"})
    _post(cap.url, "/v1/chat/completions", {"model": "fake", "max_tokens": 2, "user": "alice@example.com",
                                            "messages": [{"role": "user", "content": secret}]})
    cap.stop()
    raw = out.read_text()
    for needle in (secret, "Zebra", "SECRET", "alice", "fake", "Bearer", *map(str, ids)):
        assert needle not in raw
    lines = [json.loads(x) for x in raw.splitlines()]
    # the only strings are the type and who linked; every number is a count, a time, a link or a dense block id
    assert all(set(r) == FIELDS and r["type"] == "text" and r["linked_by"] == "kvtrace capture" for r in lines)
    assert [(r["input_length"], len(r["hash_ids"])) for r in lines] == [(40, 3), (len(secret), 2)]
    assert sorted(i for r in lines for i in r["hash_ids"]) == list(range(3 + 2))  # dense ids, nothing else


def test_salt_file_makes_two_captures_agree(fake_upstream: FakeUpstream, start_capture: Any, tmp_path: Path) -> None:
    salt = tmp_path / "k.salt"
    runs = []
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        cap = start_capture(fake_upstream.url("ok"), tmp_path / name, *(["--salt-file", str(salt)] if name != "c.jsonl"
                                                                         else []))
        if name == "b.jsonl":  # another prompt first: dense ids would differ, shared ids do not
            _post(cap.url, "/v1/completions", {"model": "fake", "prompt": _ids(33, 5), "max_tokens": 1})
        _post(cap.url, "/v1/completions", {"model": "fake", "prompt": _ids(33), "max_tokens": 1})
        cap.stop()
        runs.append(read_lines(tmp_path / name)[-1]["hash_ids"])
    assert runs[0] == runs[1] and len(runs[0]) == 3 and all(i >= 2**20 for i in runs[0])
    assert runs[2] == [0, 1, 2]


def test_a_continued_conversation_links_to_its_parent(fake_upstream: FakeUpstream, start_capture: Any,
                                                      tmp_path: Path) -> None:
    cap = start_capture(fake_upstream.url("ok"), tmp_path / "t.jsonl")
    first = _ids(40)
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": first, "max_tokens": 8})
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": _ids(40, 5000), "max_tokens": 8})  # unrelated
    # turn 2: turn 1's prompt, its 8 output tokens and a new question
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": first + _ids(8, 7000) + _ids(30, 8000),
                                       "max_tokens": 8})
    cap.stop()
    lines = read_lines(tmp_path / "t.jsonl")
    assert [(r["chat_id"], r["parent_chat_id"], r["turn"]) for r in lines] == [(0, -1, 1), (1, -1, 1), (2, 0, 2)]


def test_ingest_says_a_capture_s_sessions_were_inferred_by_the_capture(fake_upstream: FakeUpstream,
                                                                       start_capture: Any, tmp_path: Path) -> None:
    """The links in a captured file are the capture's SessionLinker's, not a server's conversation ids: ingest
    keeps them and its provenance says "inferred", by "kvtrace capture" (as a Mooncake trace's say "inferred",
    by "kvtrace ingest"); with --infer-sessions ingest links them itself; the same lines without the capture's
    `linked_by` are a trace with its own links ("given")."""
    from tongyi_trace.run import RunDir
    from tongyi_trace.trace.ingest import ingest_trace

    out = tmp_path / "t.jsonl"
    cap = start_capture(fake_upstream.url("ok"), out)
    first = _ids(40)
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": first, "max_tokens": 8})
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": first + _ids(8, 7000) + _ids(30, 8000),
                                       "max_tokens": 8})
    cap.stop()
    runs = {}
    for name, infer in (("kept", None), ("relinked", True)):
        prov = ingest_trace(out, tmp_path / name, infer_sessions=infer)
        runs[name] = RunDir(tmp_path / name).requests().sort("req_idx")
        assert (prov["sessions"], prov["sessions_linked_by"]) == (
            "inferred", "kvtrace capture" if infer is None else "kvtrace ingest")
        assert prov["has_turns"] and prov["has_sessions"]
    for run in runs.values():  # both linkers give the continuation its parent
        assert run["parent_chat_id"].to_list() == [-1, 0] and run["turn"].to_list() == [1, 2]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "linked_by"}) + "\n"
                             for r in read_lines(out)))
    prov = ingest_trace(plain, tmp_path / "plain")
    assert (prov["sessions"], prov["sessions_linked_by"]) == ("given", None)


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.full)])
def test_a_stop_lets_requests_in_flight_finish_and_leaves_a_valid_zst(fake_upstream: FakeUpstream,
                                                                      start_capture: Any, tmp_path: Path,
                                                                      sig: int) -> None:
    out = tmp_path / "t.jsonl.zst"
    cap = start_capture(fake_upstream.url("slow"), out)
    for k in range(3):
        _post(cap.url, "/v1/completions", {"model": "fake", "prompt": _ids(20 + k), "max_tokens": 2})
    slow: list[httpx.Response] = []
    t = threading.Thread(target=lambda: slow.append(_post(cap.url, "/v1/completions",
                                                          {"model": "fake", "prompt": _ids(50), "max_tokens": 2})))
    t.start()
    time.sleep(SLOW_S / 3)  # the fourth request is in flight
    s = cap.stop(sig)
    t.join(30)
    assert slow and slow[0].status_code == 200  # it finished during the drain
    assert s["num_recorded"] == 4 and s["num_errors"] == s["num_skipped"] == 0
    assert len(read_lines(out)) == 4

    from tongyi_trace.trace.ingest import ingest_trace

    ingest_trace(out, tmp_path / "run")  # the project's reader refuses a .zst whose frame is cut short
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert (prov["format"], prov["block_size"], prov["num_requests"]) == ("bailian", 16, 4)


def test_a_request_that_outlives_the_drain_is_counted_as_skipped(fake_upstream: FakeUpstream, start_capture: Any,
                                                                 tmp_path: Path) -> None:
    cap = start_capture(fake_upstream.url("slow"), tmp_path / "t.jsonl", "--drain-s", "0.2")
    failed: list[BaseException] = []

    def send() -> None:
        try:
            _post(cap.url, "/v1/completions", {"model": "fake", "prompt": _ids(50), "max_tokens": 2})
        except httpx.HTTPError as e:
            failed.append(e)

    t = threading.Thread(target=send)
    t.start()
    time.sleep(SLOW_S / 3)
    s = cap.stop()
    t.join(30)
    assert s["skipped"] == {"stopped before it finished": 1} and s["num_recorded"] == 0
    assert len(failed) == 1  # the client sees its connection closed without an answer


def test_pipelined_chunked_and_abandoned_requests(fake_upstream: FakeUpstream, start_capture: Any,
                                                  tmp_path: Path) -> None:
    """HTTP/1.1 as clients send it: two requests pipelined on one connection are answered in order; a body sent
    chunked reaches the upstream whole (with its Content-Length); a client that gives up on a slow reply is
    counted ("client disconnected") and the proxy goes on."""
    cap = start_capture(fake_upstream.url("ok"), tmp_path / "t.jsonl")
    host, port = cap.url.removeprefix("http://").split(":")
    bodies = [json.dumps({"model": "fake", "prompt": _ids(20 + k), "max_tokens": 1 + k}).encode() for k in range(2)]
    raw = b"".join(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(raw)  # both at once
        got = b""
        while got.count(b'"finish_reason"') < 2:
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
    first, second = got.index(b'"text": "x"'), got.index(b'"text": "xx"')
    assert got.startswith(b"HTTP/1.1 200") and got.count(b"HTTP/1.1 200") == 2 and first < second

    n = len(fake_upstream.received)
    body = json.dumps({"model": "fake", "prompt": _ids(30), "max_tokens": 2}).encode()
    r = httpx.post(cap.url + "/v1/completions", content=iter([body[:10], body[10:]]), timeout=30,
                   headers={"Content-Type": "application/json"})  # an iterator: sent chunked
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 30
    assert fake_upstream.received[n][2] == body and fake_upstream.received[n][1]["Content-Length"] == str(len(body))
    s = cap.stop()
    assert (s["num_recorded"], s["num_errors"]) == (3, 0)

    cap = start_capture(fake_upstream.url("slow"), tmp_path / "t2.jsonl")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(cap.url + "/v1/completions", timeout=SLOW_S / 5,
                   content=json.dumps({"model": "fake", "prompt": _ids(20), "max_tokens": 1}))
    assert _post(cap.url, "/v1/completions", {"model": "fake", "prompt": _ids(20), "max_tokens": 1}).status_code == 200
    s = cap.stop()
    assert (s["num_recorded"], s["errors"]) == (1, {"client disconnected": 1})


def test_a_client_that_leaves_after_the_last_event_is_recorded(fake_upstream: FakeUpstream, start_capture: Any,
                                                                tmp_path: Path) -> None:
    """An SSE client may close its connection on `data: [DONE]`, before the chunked body's end: the request was
    answered and is recorded (a client that leaves earlier is counted: test_pipelined_chunked_and_abandoned)."""
    cap = start_capture(fake_upstream.url("lateend"), tmp_path / "t.jsonl")
    body = {"model": "fake", "prompt": _ids(20), "max_tokens": 3, "stream": True}
    with httpx.Client(timeout=30) as client, client.stream("POST", cap.url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                break  # leaving the block closes the connection, the body's end not read
    s = cap.stop()
    assert (s["num_recorded"], s["num_errors"], s["num_skipped"]) == (1, 0, 0), s
    assert [(x["input_length"], x["output_length"]) for x in read_lines(tmp_path / "t.jsonl")] == [(20, 3)]


def _text_body(k: int) -> dict[str, Any]:
    """A completion whose prompt is text (the recorder asks the upstream's /tokenize) of 20 + K characters."""
    return {"model": "fake", "prompt": "q" * (20 + k), "max_tokens": 2}


def test_a_request_answered_just_before_a_stop_has_its_line(fake_upstream: FakeUpstream, start_capture: Any,
                                                            tmp_path: Path) -> None:
    """The recorder process drains what it was handed: the replies are out at once, each line needs a /tokenize
    that takes SLOW_TOKENIZE_S, and SIGTERM follows the last reply at once; every line is in the file."""
    out = tmp_path / "t.jsonl.zst"
    cap = start_capture(fake_upstream.url("slowtokenize"), out)
    t0 = time.perf_counter()
    for k in range(8):
        assert _post(cap.url, "/v1/completions", _text_body(k)).status_code == 200
    assert time.perf_counter() - t0 < SLOW_TOKENIZE_S * 8  # answered before their lines could all be written
    s = cap.stop()
    assert (s["num_recorded"], s["num_errors"], s["num_skipped"]) == (8, 0, 0)
    assert sorted(r["input_length"] for r in read_lines(out)) == [20 + k for k in range(8)]


def test_lines_keep_the_order_the_replies_ended_in(fake_upstream: FakeUpstream, start_capture: Any,
                                                   tmp_path: Path) -> None:
    """A text prompt waits SLOW_TOKENIZE_S for its token ids, the next request (token ids, no wait) finished after
    it: its line still follows, so the linker sees the first turn before its continuation."""
    out = tmp_path / "t.jsonl"
    cap = start_capture(fake_upstream.url("slowtokenize"), out)
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": "q" * 40, "max_tokens": 8})
    _post(cap.url, "/v1/completions", {"model": "fake", "prompt": fake_token_ids("q" * 40) + _ids(30), "max_tokens": 2})
    cap.stop()
    lines = read_lines(out)
    assert [(r["input_length"], r["chat_id"], r["parent_chat_id"], r["turn"]) for r in lines] == [
        (40, 0, -1, 1), (70, 1, 0, 2)]


def test_a_recording_that_outlives_the_drain_is_counted_as_skipped(fake_upstream: FakeUpstream, start_capture: Any,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl.zst"
    cap = start_capture(fake_upstream.url("slowtokenize"), out, "--drain-s", "0.05")
    for k in range(3):
        _post(cap.url, "/v1/completions", _text_body(k))
    s = cap.stop()
    assert (s["num_recorded"], s["skipped"]) == (0, {"stopped before it finished": 3})
    assert read_lines(out) == []  # the .zst is complete (an empty frame)


def test_the_recorder_closes_the_file_complete_when_the_proxy_is_killed(fake_upstream: FakeUpstream,
                                                                        start_capture: Any, tmp_path: Path) -> None:
    """SIGKILL to the forwarder: its recorder (its own session, deaf to signals) sees its input end, writes
    every line it was handed, however long their /tokenize takes (--drain-s bounds only a stop; a busy machine
    once took the recorder past the 5 s default here) and closes the .zst complete."""
    import psutil

    out = tmp_path / "t.jsonl.zst"
    cap = start_capture(fake_upstream.url("slowtokenize"), out, "--drain-s", "0.05")
    (recorder,) = psutil.Process(cap.proc.pid).children()
    for k in range(3):
        _post(cap.url, "/v1/completions", _text_body(k))
    cap.proc.kill()
    cap.proc.communicate(timeout=30)
    recorder.wait(timeout=30)  # its exit code is not ours to read: the file says it ended well
    assert sorted(r["input_length"] for r in read_lines(out)) == [20, 21, 22]


def test_ingest_reads_what_capture_writes(fake_upstream: FakeUpstream, start_capture: Any, tmp_path: Path) -> None:
    from tongyi_trace.trace.ingest import ingest_trace

    out = tmp_path / "t.jsonl"
    cap = start_capture(fake_upstream.url("ok"), out, "--block-size", "8")
    for k in range(6):
        _post(cap.url, "/v1/completions", {"model": "fake", "prompt": _ids(30 + 7 * k), "max_tokens": 2})
    cap.stop()
    lines = read_lines(out)
    ingest_trace(out, tmp_path / "run", block_size=8)
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert (prov["format"], prov["block_size"], prov["num_requests"]) == ("bailian", 8, 6)
    assert prov["findings"].get("hash_len_mismatch", 0) == 0
    # every prompt starts with the same 30 tokens: 3 full blocks of 8 shared, then each its own
    assert prov["num_block_refs"] == sum(len(r["hash_ids"]) for r in lines) == sum(-(-(30 + 7 * k) // 8)
                                                                                  for k in range(6))


@pytest.mark.parametrize(("args", "message"), [
    (["--upstream", "ftp://example.com"], "error: --upstream 'ftp://example.com': expected the server's base URL"),
    (["--listen", "8100"], "error: --listen '8100': expected HOST:PORT"),
    (["--block-size", "0"], "error: --block-size 0 must be a positive number of tokens"),
    (["--drain-s", "-1"], "error: --drain-s -1.0: give a number of seconds >= 0"),
    (["-o", "EXISTING"], "error: -o EXISTING: exists; choose another name or pass --overwrite"),
    (["-o", "trace.csv"], "must be named *.jsonl, *.jsonl.gz or *.jsonl.zst"),
])
def test_usage_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    import subprocess

    from tests.capture.conftest import KVTRACE

    existing = tmp_path / "old.jsonl"
    existing.write_text("keep\n")
    argv = {"--upstream": "http://127.0.0.1:9", "-o": str(tmp_path / "t.jsonl")}
    for k, v in zip(args[::2], args[1::2], strict=True):
        argv[k] = str(existing) if v == "EXISTING" else str(tmp_path / v) if k == "-o" else v
    proc = subprocess.run([*KVTRACE, "capture", *[x for kv in argv.items() for x in kv]], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message.replace("EXISTING", str(existing)) in proc.stderr
    assert existing.read_text() == "keep\n" and not (tmp_path / "t.jsonl").exists()


def test_a_bad_tokenizer_file_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """A --tokenizer that is not a tokenizer.json: one line, exit 2, no output file and no unclosed session."""
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    out = tmp_path / "cap.jsonl"
    proc = subprocess.run([sys.executable, "-m", "tongyi_trace.cli", "capture", "--upstream", "http://127.0.0.1:9",
                           "--tokenizer", str(bad), "-o", str(out)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "not a Hugging Face tokenizer.json" in proc.stderr, proc.stderr
    assert not out.exists()  # before: an empty file and two "Unclosed client session" warnings
