#!/usr/bin/env python3
"""One round of bench/flood.sh's pipelined flood: does one connection that
pipelines a flood hold the server's worker, or does another client's
request get its turn?

A flooder sends N requests for /flood (x-api-key: abuser, denied) in one
stream without waiting, and a thread counts the responses it reads. Once
the first are back (the server is busy with the flood), a legitimate
client, already connected, sends one request for /legit (x-api-key: good)
and waits for its answer. Printed: how long that took, and how many flood
responses the server sent meanwhile (`between`: the flood responses read
from the legitimate request's send to its answer). `between` counts
requests, not time, so a stall of the machine, which delays both
connections alike, does not change it: it says how long the server keeps
serving one connection while another waits.

usage: pipelined_flood.py PORT N
prints one line: "legit_us=N between=N flood_ms=N denied=N legit_status=N"
and exits 1 unless every flood request was answered (429, but the one
grant a minute the flood's limit allows) and the legitimate one with 200.
"""

import socket
import sys
import threading
import time

port, n = int(sys.argv[1]), int(sys.argv[2])
FLOOD = b"GET /flood HTTP/1.1\r\nHost: bench\r\nx-api-key: abuser\r\n\r\n"
LEGIT = b"GET /legit HTTP/1.1\r\nHost: bench\r\nx-api-key: good\r\n\r\n"
MARK = b"HTTP/1.1 "


def statuses(chunks):
    """The status codes of the responses in `chunks` (a stream's reads):
    every status line, also one split across two reads."""
    data = b"".join(chunks)
    out, at = [], data.find(MARK)
    while at >= 0:
        out.append(int(data[at + len(MARK) : at + len(MARK) + 3]))
        at = data.find(MARK, at + 1)
    return out


def read_response(sock):
    """One response with a Content-Length body; returns its status."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit("the legitimate connection closed")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += sock.recv(65536)
    return int(head[len(MARK) : len(MARK) + 3])


legit = socket.create_connection(("127.0.0.1", port))
legit.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
legit.sendall(LEGIT)
read_response(legit)  # connected and warm

flood = socket.create_connection(("127.0.0.1", port))
seen = [0]  # flood responses read so far (status lines; a split one later)
chunks = []
finished = threading.Event()


def reader():
    tail = b""
    while True:
        chunk = flood.recv(1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        # Status lines in this read, one split across reads included.
        seen[0] += (tail + chunk).count(MARK)
        tail = chunk[-(len(MARK) - 1) :]
        if seen[0] >= n:
            break
    finished.set()


threading.Thread(target=reader, daemon=True).start()
threading.Thread(target=lambda: flood.sendall(FLOOD * n), daemon=True).start()
deadline = time.monotonic() + 10
while seen[0] == 0 and time.monotonic() < deadline:
    time.sleep(0.0001)
started = time.monotonic()
before = seen[0]
legit.sendall(LEGIT)
status = read_response(legit)
answered = time.monotonic()
between = seen[0] - before
finished.wait(60)
ended = time.monotonic()
got = statuses(chunks)
denied = got.count(429)
print(
    "legit_us=%d between=%d flood_ms=%d denied=%d legit_status=%d"
    % ((answered - started) * 1e6, between, (ended - started) * 1e3, denied, status)
)
if len(got) != n or denied < n - 1 or any(s not in (200, 429) for s in got):
    sys.exit("flood: %d responses of %d, %d of them 429" % (len(got), n, denied))
if status != 200:
    sys.exit("the legitimate request got %d" % status)
