"""The compiled fast path of the JSONL reader (trace/jsonl_reader.py): records of the usual shape are parsed here,
straight from the file's bytes into columns, and every other line is left to the reader's precise
per-line checks, which accept or name the problem exactly as before.

`scan` reads the lines of BUF from POS on and stops at the first line it cannot vouch for, so the reader
sees every such line itself, in file order. A line is taken here only when it certainly passes the
reader's checks and decodes to the same values:
- one JSON object of the trace format's fields (Bailian: chat_id, parent_chat_id, timestamp, input_length,
  output_length, type, turn, hash_ids and an optional user_id; Mooncake: timestamp, input_length,
  output_length, hash_ids), each once, in any order, blanks (space, tab, CR) anywhere JSON allows;
- integer fields as integer literals within the reader's ranges; hash ids signed 64-bit integer literals;
- the timestamp an integer literal, or a decimal whose value is exact by Clinger's fast path (at most
  2^53 in its digits, a power of ten up to 22): one correctly rounded operation, the value a correct
  parser (orjson, the standard library) gives;
- strings of printable ASCII without escapes (their bytes are their text); user_id a string, an integer
  literal or null;
- any other field (ignored, as the reader ignores it) with a scalar value: a number, true, false, null, or
  a string of printable ASCII with JSON escapes.
Anything else (a key twice, also one kvtrace does not read, which the reader counts as a finding; an escape in
a key or in a field kvtrace reads; more than MAX_OTHER_KEYS other fields; a float the fast path cannot round,
an id beyond int64, an array or object in another field, a malformed line) stops the scan at that line.
Blank lines (spaces, tabs, CR only) are counted here.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# field codes: the column of REC and the bit of the field in a line's mask
CHAT, PARENT, TIMESTAMP, INPUT, OUTPUT, TYPE, TURN, HASH_IDS, USER = range(9)
_NAMES = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn",
          "hash_ids", "user_id")
_KEY_LEN = np.array([len(k) for k in _NAMES], dtype=np.int64)
_KEY_BYTES = np.zeros((len(_NAMES), max(_KEY_LEN)), dtype=np.uint8)
for _i, _k in enumerate(_NAMES):
    _KEY_BYTES[_i, :len(_k)] = np.frombuffer(_k.encode(), dtype=np.uint8)
BAILIAN_REQUIRED = sum(1 << f for f in (CHAT, PARENT, TIMESTAMP, INPUT, OUTPUT, TYPE, TURN, HASH_IDS))
MOONCAKE_REQUIRED = sum(1 << f for f in (TIMESTAMP, INPUT, OUTPUT, HASH_IDS))
# REC columns: CHAT..TURN as above (unused ones 0), then the record's line (counted from the scan's start),
# its number of hash ids, user_id's kind (USER_NONE, USER_STR or USER_INT) and span, and the type's span
LINE, NUM_IDS, USER_KIND, USER_START, USER_END, TYPE_START, TYPE_END = 9, 10, 11, 12, 13, 14, 15
REC_COLS = 16
USER_NONE, USER_STR, USER_INT = 0, 1, 2
# scan's status
END, FULL, SLOW = 0, 1, 2
MAX_OTHER_KEYS = 8  # other fields a line may have and still be scanned (their names are compared for repeats)

_TRUE, _FALSE, _NULL = (np.frombuffer(w, dtype=np.uint8).copy() for w in (b"true", b"false", b"null"))
_POW10 = np.array([float(10 ** i) for i in range(23)], dtype=np.float64)  # each exact
_2P53 = 1 << 53
_I64_MAX = (1 << 63) - 1


@njit(cache=True, nogil=True, inline="always")
def _blanks(buf: np.ndarray, p: int, end: int) -> int:
    while p < end and (buf[p] == 32 or buf[p] == 9 or buf[p] == 13):
        p += 1
    return p


@njit(cache=True, nogil=True, inline="always")
def _is_digit(c: np.uint8) -> bool:
    return bool(48 <= c <= 57)


@njit(cache=True, nogil=True)
def _int_literal(buf: np.ndarray, p: int, end: int) -> tuple[bool, int, int]:
    """(ok, value, end of the literal) of the JSON integer literal at P; not ok when it is not one (a
    fraction or exponent included) or leaves int64."""
    neg = p < end and buf[p] == 45
    if neg:
        p += 1
    if p >= end or not _is_digit(buf[p]):
        return False, 0, p
    v = np.uint64(0)
    n = 0
    if buf[p] == 48:
        p += 1
    else:
        while p < end and _is_digit(buf[p]):
            if n == 19:
                return False, 0, p
            v = v * np.uint64(10) + np.uint64(buf[p] - 48)
            n += 1
            p += 1
    if p < end and (buf[p] == 46 or buf[p] == 101 or buf[p] == 69 or _is_digit(buf[p])):
        return False, 0, p
    if n == 19 and v > np.uint64(_I64_MAX) + np.uint64(neg):  # 19 digits may pass 2^63 - 1 (or 2^63)
        return False, 0, p
    if neg and v > 0:
        return True, int(-np.int64(v - np.uint64(1)) - 1), p  # -2^63 included
    return True, int(np.int64(v)), p


INVALID, INEXACT, EXACT = 0, 1, 2  # _number's verdict


@njit(cache=True, nogil=True)
def _number(buf: np.ndarray, p: int, end: int) -> tuple[int, float, int]:
    """(verdict, value, end) of the JSON number at P: INVALID when it is not one, INEXACT when it is but
    Clinger's fast path cannot round it, EXACT with its double."""
    neg = p < end and buf[p] == 45
    if neg:
        p += 1
    if p >= end or not _is_digit(buf[p]):
        return INVALID, 0.0, p
    m = np.uint64(0)
    n = 0  # significant digits accumulated into m (leading zeros are free); beyond 18: inexact
    e10 = 0
    literal_int = True  # no fraction, no exponent: an integer, whose zero has no sign
    if buf[p] == 48:
        p += 1
    else:
        while p < end and _is_digit(buf[p]):
            if n < 18:
                m = m * np.uint64(10) + np.uint64(buf[p] - 48)
                n += int(m > 0)
            else:
                n, e10 = 19, e10 + 1
            p += 1
    if p < end and buf[p] == 46:
        p += 1
        literal_int = False
        if p >= end or not _is_digit(buf[p]):
            return INVALID, 0.0, p
        while p < end and _is_digit(buf[p]):
            if n < 18:
                m = m * np.uint64(10) + np.uint64(buf[p] - 48)
                n += int(m > 0)
                e10 -= 1
            else:
                n = 19
            p += 1
    if p < end and (buf[p] == 101 or buf[p] == 69):
        p += 1
        literal_int = False
        eneg = p < end and buf[p] == 45
        if p < end and (buf[p] == 45 or buf[p] == 43):
            p += 1
        if p >= end or not _is_digit(buf[p]):
            return INVALID, 0.0, p
        x = 0
        while p < end and _is_digit(buf[p]):
            x = min(x * 10 + (buf[p] - 48), 100000)
            p += 1
        e10 += -x if eneg else x
    if p < end and _is_digit(buf[p]):
        return INVALID, 0.0, p  # a leading zero
    if n > 18 or m > np.uint64(_2P53) or (m > 0 and (e10 > 22 or e10 < -22)):
        return INEXACT, 0.0, p
    if m == 0:
        return EXACT, -0.0 if neg and not literal_int else 0.0, p
    v = np.float64(m) * _POW10[e10] if e10 >= 0 else np.float64(m) / _POW10[-e10]
    return EXACT, -v if neg else v, p


@njit(cache=True, nogil=True)
def _string(buf: np.ndarray, p: int, end: int) -> tuple[bool, int]:
    """(ok, end after the closing quote) of the string at P (its opening quote): printable ASCII, no escape."""
    if p >= end or buf[p] != 34:
        return False, p
    p += 1
    while p < end:
        c = buf[p]
        if c == 34:
            return True, p + 1
        if c < 32 or c > 126 or c == 92:
            return False, p
        p += 1
    return False, p


@njit(cache=True, nogil=True)
def _is_hex(c: np.uint8) -> bool:
    return bool(48 <= c <= 57 or 65 <= c <= 70 or 97 <= c <= 102)


@njit(cache=True, nogil=True)
def _skip_scalar(buf: np.ndarray, p: int, end: int) -> tuple[bool, int]:
    """(ok, end) of the value of a field kvtrace does not read, when it is a JSON scalar: a number, true,
    false, null, or a string of printable ASCII with JSON escapes. Anything else is left to the reader."""
    if p >= end:
        return False, p
    c = buf[p]
    if c == 34:
        p += 1
        while p < end:
            c = buf[p]
            if c == 34:
                return True, p + 1
            if c < 32 or c > 126:
                return False, p
            if c == 92:
                if p + 1 >= end:
                    return False, p
                e = buf[p + 1]
                if e == 117:
                    if p + 6 > end or not (_is_hex(buf[p + 2]) and _is_hex(buf[p + 3]) and _is_hex(buf[p + 4])
                                           and _is_hex(buf[p + 5])):
                        return False, p
                    p += 6
                    continue
                if not (e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114
                        or e == 116):
                    return False, p
                p += 2
                continue
            p += 1
        return False, p
    for word in (_TRUE, _FALSE, _NULL):
        n = word.shape[0]
        if p + n <= end:
            same = True
            for j in range(n):
                if buf[p + j] != word[j]:
                    same = False
                    break
            if same:
                return True, p + n
    verdict, _, p = _number(buf, p, end)
    return verdict != INVALID, p


@njit(cache=True, nogil=True)
def _field(buf: np.ndarray, s: int, e: int) -> int:
    """The code of the field named by BUF[S:E], -1 for another name."""
    n = e - s
    for k in range(_KEY_LEN.shape[0]):
        if _KEY_LEN[k] != n:
            continue
        same = True
        for j in range(n):
            if buf[s + j] != _KEY_BYTES[k, j]:
                same = False
                break
        if same:
            return k
    return -1


@njit(cache=True, nogil=True)
def _new_other_key(buf: np.ndarray, s: int, e: int, others: np.ndarray, n: int) -> bool:
    """True when the key BUF[S:E] (a field kvtrace does not read) has no escape and differs from the N keys
    whose spans OTHERS holds."""
    for j in range(s, e):
        if buf[j] == 92:  # an escape: its text is not its bytes
            return False
    for k in range(n):
        a, b = others[k, 0], others[k, 1]
        if b - a != e - s:
            continue
        same = True
        for j in range(e - s):
            if buf[a + j] != buf[s + j]:
                same = False
                break
        if same:
            return False
    return True


@njit(cache=True, nogil=True)
def _record(buf: np.ndarray, p: int, end: int, bailian: bool, rec: np.ndarray, r: int, ts: np.ndarray,
            ids: np.ndarray, n_ids: int, lim_ts: float, max_tokens: int, max_turn: int,
            others: np.ndarray) -> tuple[bool, int]:
    """Parse the object at P (after blanks) into REC[r], TS[r] and IDS[n_ids:]; (ok, end of the object).
    OTHERS: scratch for the spans of the keys kvtrace does not read (MAX_OTHER_KEYS rows)."""
    if p >= end or buf[p] != 123:
        return False, p
    p += 1
    seen = 0
    n_others = 0
    while True:
        p = _blanks(buf, p, end)
        s = p + 1
        ok, p = _string(buf, p, end)
        if not ok:
            return False, p
        f = _field(buf, s, p - 1)
        if f == USER and not bailian:
            f = -1  # a Mooncake record's user_id is not read
        if f < 0:  # a key twice (or one with an escape, or one too many): left to the reader, which counts it
            if n_others == others.shape[0] or not _new_other_key(buf, s, p - 1, others, n_others):
                return False, p
            others[n_others, 0], others[n_others, 1] = s, p - 1
            n_others += 1
        p = _blanks(buf, p, end)
        if p >= end or buf[p] != 58:
            return False, p
        p = _blanks(buf, p + 1, end)
        if f >= 0 and seen & (1 << f):
            return False, p  # a field twice: left to the reader (which keeps the last and counts it)
        if f >= 0:
            seen |= 1 << f
        if f < 0:  # another field (ignored, like the reader does)
            ok, p = _skip_scalar(buf, p, end)
            if not ok:
                return False, p
        elif f == TIMESTAMP:
            verdict, v, p = _number(buf, p, end)
            if verdict != EXACT or not -lim_ts <= v <= lim_ts:
                return False, p
            ts[r] = v if bailian else v / 1000.0
        elif f == TYPE:
            rec[r, TYPE_START] = p + 1
            ok, p = _string(buf, p, end)
            if not ok:
                return False, p
            rec[r, TYPE_END] = p - 1
        elif f == USER:
            if p + 4 <= end and buf[p] == 110 and buf[p + 1] == 117 and buf[p + 2] == 108 and buf[p + 3] == 108:
                rec[r, USER_KIND] = USER_NONE
                p += 4
            elif p < end and buf[p] == 34:
                rec[r, USER_START] = p + 1
                ok, p = _string(buf, p, end)
                if not ok:
                    return False, p
                rec[r, USER_KIND], rec[r, USER_END] = USER_STR, p - 1
            else:
                rec[r, USER_START] = p
                ok, v, p = _int_literal(buf, p, end)  # beyond int64: left to the reader
                if not ok:
                    return False, p
                rec[r, USER_KIND], rec[r, USER_END] = USER_INT, p
        elif f == HASH_IDS:
            if p >= end or buf[p] != 91:
                return False, p
            p = _blanks(buf, p + 1, end)
            k = n_ids
            if p < end and buf[p] == 93:
                p += 1
            else:
                while True:
                    if k == ids.shape[0]:
                        return False, p
                    ok, v, p = _int_literal(buf, p, end)
                    if not ok:
                        return False, p
                    ids[k] = v
                    k += 1
                    p = _blanks(buf, p, end)
                    if p < end and buf[p] == 44:
                        p = _blanks(buf, p + 1, end)
                    elif p < end and buf[p] == 93:
                        p += 1
                        break
                    else:
                        return False, p
            rec[r, NUM_IDS] = k - n_ids
        else:
            ok, v, p = _int_literal(buf, p, end)
            if not ok:
                return False, p
            if f in (INPUT, OUTPUT):
                if v < 0 or v > max_tokens:
                    return False, p
            elif f == TURN and (v < 0 or v > max_turn):
                return False, p
            rec[r, f] = v
        p = _blanks(buf, p, end)
        if p < end and buf[p] == 44:
            p += 1
        elif p < end and buf[p] == 125:
            p += 1
            break
        else:
            return False, p
    if bailian:
        return (seen & BAILIAN_REQUIRED) == BAILIAN_REQUIRED, p
    return seen == MOONCAKE_REQUIRED, p


@njit(cache=True, nogil=True)
def scan(buf: np.ndarray, pos: int, end: int, bailian: bool, max_records: int, max_ids: int, rec: np.ndarray,
         ts: np.ndarray, ids: np.ndarray, lim_ts: float, max_tokens: int,
         max_turn: int) -> tuple[int, int, int, int, int]:
    """Parse the lines of BUF[POS:END] (END at a line's end) into REC (one row per record, REC_COLS), TS and
    IDS, until MAX_RECORDS records or MAX_IDS ids (the record that reaches it included; IDS may hold more)
    or the first line left to the reader. Returns (where it stopped: a line's start, lines consumed (blank
    ones included), records, ids, status: END, FULL or SLOW (the line at the returned position))."""
    lines = 0
    r = 0
    n_ids = 0
    others = np.empty((MAX_OTHER_KEYS, 2), dtype=np.int64)
    while pos < end:
        if r == max_records or n_ids >= max_ids:
            return pos, lines, r, n_ids, FULL
        p = _blanks(buf, pos, end)
        if p == end or buf[p] == 10:  # blank
            pos = p + 1
            lines += 1
            continue
        rec[r, USER_KIND] = USER_NONE
        ok, p = _record(buf, p, end, bailian, rec, r, ts, ids, n_ids, lim_ts, max_tokens, max_turn, others)
        if ok:
            p = _blanks(buf, p, end)
            ok = p == end or buf[p] == 10
        if not ok:
            return pos, lines, r, n_ids, SLOW
        rec[r, LINE] = lines
        n_ids += rec[r, NUM_IDS]
        r += 1
        lines += 1
        pos = p + 1
    return min(pos, end), lines, r, n_ids, END
