#!/usr/bin/env python3
"""Sends a Redis the script calls of bench/redis_instructions.sh: tollgate's
src/store/stack.lua in batches of token-bucket decisions (the layout
src/store/mod.rs's batch_cmd sends), or the peer's bench/lua/peer_gcra.lua
one call per decision, over KEYS keys cycling. Checks every answer admits.

usage: redis_drive.py PORT SCRIPT {stack|stack-fcb6666|stack-f735849|peer} BATCH KEYS CALLS

`stack-f735849` is the layout of the script before issue 29 (7 values per
entry, 6 integers answered per entry), `stack-fcb6666` the one before the
parameter sets travelled in the msgpack array (each of their values an
argument), to measure those commits' scripts.
"""

import hashlib
import socket
import struct
import sys

port, script, layout = int(sys.argv[1]), sys.argv[2], sys.argv[3]
batch, nkeys, calls = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])

# A bucket that never denies (capacity 1e6, refilled 1e6/s: T = 1 us), as
# in bench/redis.sh.
CAPACITY, INTERVAL = "1000000", "1.000000"

conn = socket.create_connection(("127.0.0.1", port))
replies = conn.makefile("rb")


def command(*args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if not isinstance(arg, bytes):
            arg = str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


def reply():
    line = replies.readline()
    kind, rest = line[:1], line[1:-2]
    if kind in (b"+", b":"):
        return rest
    if kind == b"-":
        raise SystemExit("redis: " + rest.decode())
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else replies.read(n + 2)[:-2]
    if kind == b"*":
        return [reply() for _ in range(int(rest))]
    raise SystemExit("unexpected reply %r" % line)


def msgpack_int(v):
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if 0 <= v < 128:
        return bytes([v])
    if -32 <= v < 0:
        return struct.pack("b", v)
    if 0 <= v < 1 << 32:
        return b"\xce" + struct.pack(">I", v)
    return b"\xd3" + struct.pack(">q", v)


def msgpack_array(values):
    n = len(values)
    head = bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)
    return head + b"".join(msgpack_int(v) for v in values)


conn.sendall(command("SCRIPT", "LOAD", open(script, "rb").read()))
sha = reply().decode()
keys = [
    "tollgate:per_key:{%s}:tb" % hashlib.md5(b"k%d" % i).hexdigest()
    for i in range(nkeys)
]
cursor = 0


def next_keys(n):
    global cursor
    out = [keys[(cursor + i) % nkeys] for i in range(n)]
    cursor += n
    return out


def call():
    if layout == "peer":
        return command("EVALSHA", sha, 1, next_keys(1)[0], 1, CAPACITY, 1)
    batch_keys = next_keys(batch)
    if layout == "stack-f735849":
        argv = [batch]
        for _ in range(batch):
            argv += [1, 4, CAPACITY, INTERVAL, 0, 0, 0, 1]
        return command("EVALSHA", sha, batch, *batch_keys, *argv)
    # Distinct keys (all bucket keys), one parameter set, then
    # (key * sets + set + 1, cost) per decision.
    distinct = list(dict.fromkeys(batch_keys))
    number = {k: i for i, k in enumerate(distinct)}
    decisions = []
    for k in batch_keys:
        decisions += [number[k] + 1, 1]
    if layout == "stack-fcb6666":
        return command(
            "EVALSHA", sha, len(distinct), *distinct,
            1, 4, CAPACITY, INTERVAL, 0, 0, 0, len(distinct),
            msgpack_array(decisions),
        )
    # msgpack values one after the other: 1 set (algorithm 4, capacity,
    # the interval as a float64, 0, 0, 0), the number of string keys, the
    # decisions.
    values = [1, 4, int(CAPACITY), float(INTERVAL), 0, 0, 0, len(distinct)] + decisions
    return command(
        "EVALSHA", sha, len(distinct), *distinct,
        b"".join(msgpack_int(v) for v in values),
    )


def admitted(answer):
    if layout == "peer":
        return answer[0] == b"1"
    if layout == "stack-f735849":
        return all(v == b"1" for v in answer[0::6])
    # 2 integers per plain admission, its first odd.
    return len(answer) == 2 * batch and all(int(v) & 1 for v in answer[0::2])


# Two calls in flight, as a tollgate worker keeps.
sent = 0
for _ in range(min(2, calls)):
    conn.sendall(call())
    sent += 1
for _ in range(calls):
    answer = reply()
    if not admitted(answer):
        raise SystemExit("a call did not admit: %r" % (answer,))
    if sent < calls:
        conn.sendall(call())
        sent += 1
