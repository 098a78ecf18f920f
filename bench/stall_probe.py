#!/usr/bin/env python3
"""How long this CPU stalls, measured from inside: a loop that asks to wake
every PERIOD_US and records how late each wake-up is. Run it SCHED_FIFO and
pinned (bench/flood.sh does: `chrt -f 20 taskset -c N`), so that no process
of the benchmark can delay it; what it still sees late is the machine's own
(a virtual CPU the hypervisor did not run, an interrupt storm), and a
server's latency measured at the same time carries the same stall.

usage: stall_probe.py SECONDS [PERIOD_US]
prints "started" on stderr once the interpreter is up, then, SECONDS later,
one line on stdout: "p99_us=N max_us=N wakeups=N"

Start it and wait for "started" before what it watches: the interpreter's
start-up is tens of ms of CPU, run SCHED_FIFO ahead of everything on its
CPU, and is itself a stall of whatever runs there (one the probe cannot
see, since it is not yet measuring).
"""

import sys
import time

seconds = float(sys.argv[1])
period = (int(sys.argv[2]) if len(sys.argv) > 2 else 1000) / 1e6

print("started", file=sys.stderr, flush=True)
late = []
clock, sleep = time.monotonic, time.sleep
start = clock()
due = start
while due - start < seconds:
    due += period
    now = clock()
    if due > now:
        sleep(due - now)
    now = clock()
    late.append(now - due)
    if now - due > period:
        # After a stall, the next wake-up is a period from now, not a burst
        # of catch-up wake-ups that would each count the same stall again.
        due = now

late.sort()
n = len(late)
print("p99_us=%d max_us=%d wakeups=%d" % (late[n * 99 // 100] * 1e6, late[-1] * 1e6, n))
