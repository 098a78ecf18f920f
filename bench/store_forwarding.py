#!/usr/bin/env python3
"""Loads that cannot be forwarded from a store still in flight.

Used by bench/store_forwarding.sh; three commands:

  store_forwarding.py scan WINDOW [LO HI] < LACKEY_TRACE > COUNTS
      Reads `valgrind --tool=lackey --trace-mem=yes` output. A store is
      taken to be in the store buffer for WINDOW instructions after it
      executes. A load that overlaps such a store and is not wholly inside
      the youngest store it overlaps (it spans two stores, or reads past
      the one it overlaps) cannot take its bytes from the store buffer: it
      waits for the stores to reach the cache, about a dozen cycles on
      x86. callgrind counts such a load as one instruction. Writes the
      totals, then a line per load instruction: its count and address,
      and for a load outside the addresses LO..HI (the server's own code;
      `memcpy` in libc above all) the last instruction run inside them,
      the call that led there.

  store_forwarding.py client PORT N EXPECT
      Sends N `GET /` requests one after another on one keep-alive
      connection and checks every status: EXPECT `allow` wants 200, `deny`
      429 (but for two 200s, the bucket's first tokens, as the other
      benches allow). Exits non-zero on any other status or a closed
      socket.

  store_forwarding.py report BEFORE AFTER REQUESTS MAPS [TOP]
      The counts of AFTER less those of BEFORE (two runs of the same
      server, REQUESTS more requests in AFTER) per request, each address
      named by addr2line through the process's memory map MAPS; the TOP
      sites (default 25) and the sum per function.
"""
import collections
import socket
import subprocess
import sys


def scan(window, lo=0, hi=0):
    recent = collections.deque()  # (instruction, addr, size), oldest first
    blocks = collections.defaultdict(list)  # 8-byte block -> its stores
    n = ip = own = loads = failed = 0
    fails = collections.Counter()

    def retire():
        while recent and recent[0][0] < n - window:
            s = recent.popleft()
            for b in range(s[1] >> 3, ((s[1] + s[2] - 1) >> 3) + 1):
                lst = blocks[b]
                lst.remove(s)
                if not lst:
                    del blocks[b]

    for line in sys.stdin:
        kind = line[:2]
        if kind == 'I ':
            n += 1
            ip = int(line[3:line.index(',')], 16)
            if lo <= ip < hi:
                own = ip
            if recent and recent[0][0] < n - window:
                retire()
            continue
        if kind not in (' L', ' S', ' M'):
            continue
        a, sz = line[3:].split(',')
        addr, size = int(a, 16), int(sz)
        if kind != ' S':
            loads += 1
            hit = []
            for b in range(addr >> 3, ((addr + size - 1) >> 3) + 1):
                for s in blocks.get(b, ()):
                    if s[1] < addr + size and addr < s[1] + s[2] and s not in hit:
                        hit.append(s)
            if hit:
                # The youngest store the load overlaps must hold all of it.
                youngest = max(hit)
                if not (youngest[1] <= addr and addr + size <= youngest[1] + youngest[2]):
                    fails[ip, 0 if lo <= ip < hi or not hi else own] += 1
                    failed += 1
        if kind != ' L':
            s = (n, addr, size)
            recent.append(s)
            for b in range(addr >> 3, ((addr + size - 1) >> 3) + 1):
                blocks[b].append(s)
    print(f'instructions {n} loads {loads} unforwardable {failed}')
    for (addr, caller), k in fails.most_common():
        print(f'{k}\t{addr:#x}\t{caller:#x}')


def client(port, n, expect):
    want = {'allow': '200', 'deny': '429'}[expect]
    admitted = 0
    s = socket.create_connection(('127.0.0.1', port))
    request = b'GET / HTTP/1.1\r\nHost: bench\r\n\r\n'
    buf = b''
    for i in range(n):
        s.sendall(request)
        while True:
            end = buf.find(b'\r\n\r\n')
            if end >= 0:
                head = buf[:end].decode('latin-1').split('\r\n')
                length = 0
                for field in head[1:]:
                    name, value = field.split(':', 1)
                    if name.strip().lower() == 'content-length':
                        length = int(value)
                if len(buf) >= end + 4 + length:
                    status = head[0].split(' ')[1]
                    if expect == 'deny' and status == '200' and admitted < 2:
                        admitted += 1
                    elif status != want:
                        sys.exit(f'request {i + 1}: status {status}, not {want} ({expect} path)')
                    buf = buf[end + 4 + length:]
                    break
            data = s.recv(65536)
            if not data:
                sys.exit(f'request {i + 1}: the server closed the connection')
            buf += data
    s.close()


def load_counts(path):
    with open(path) as f:
        totals = dict(zip(*[iter(f.readline().split())] * 2))
        counts = {}
        for line in f:
            k, addr, caller = line.split('\t')
            counts[int(addr, 16), int(caller, 16)] = int(k)
    return {k: int(v) for k, v in totals.items()}, counts


def report(before, after, requests, maps, top):
    t0, c0 = load_counts(before)
    t1, c1 = load_counts(after)
    per = {k: (c1.get(k, 0) - c0.get(k, 0)) / requests for k in set(c0) | set(c1)}
    print(f'instructions per request {(t1["instructions"] - t0["instructions"]) / requests:.0f}, '
          f'unforwardable loads per request {(t1["unforwardable"] - t0["unforwardable"]) / requests:.1f}')
    # Each object's first mapping is its load base: addr2line wants the
    # address less that.
    segments, bases = [], {}
    with open(maps) as f:
        for line in f:
            p = line.split()
            if len(p) < 6:
                continue
            lo, hi = (int(x, 16) for x in p[0].split('-'))
            bases.setdefault(p[5], lo)
            if 'x' in p[1]:
                segments.append((lo, hi, bases[p[5]], p[5]))

    def place(addr):
        for lo, hi, base, path in segments:
            if lo <= addr < hi:
                return path, addr - base
        return '?', addr

    sites = [(v, place(a), place(c) if c else None) for (a, c), v in per.items() if v >= 0.5]
    # addr2line once per object, for every address of it wanted.
    wanted = collections.defaultdict(set)
    for v, site, caller in sites:
        for path, a in filter(None, (site, caller)):
            wanted[path].add(a)
    names = {}
    for path, addrs in wanted.items():
        addrs = sorted(addrs)
        out = ['?'] * (2 * len(addrs))
        if path != '?':
            out = subprocess.run(['addr2line', '-f', '-C', '-e', path] + [hex(a) for a in addrs],
                                 capture_output=True, text=True).stdout.split('\n')
        for i, a in enumerate(addrs):
            names[path, a] = (out[2 * i][:100], out[2 * i + 1].split('/')[-1])

    def label(site, caller):
        fn, line = names[site]
        where = f'{fn}  {line}'
        if caller:
            cfn, cline = names[caller]
            where += f'  (from {cfn}  {cline})'
        return where

    sites.sort(key=lambda x: -x[0])
    for v, site, caller in sites[:top]:
        print(f'{v:6.1f}  {site[0].split("/")[-1]}  {site[1]:#x}  {label(site, caller)}')
    print('per function (a call into another object: per calling function):')
    sums = collections.Counter()
    for v, site, caller in sites:
        fn = names[site][0]
        if caller:
            fn += f' from {names[caller][0]}'
        sums[fn] += v
    for fn, v in sums.most_common(top):
        print(f'{v:6.1f}  {fn[:160]}')


if __name__ == '__main__':
    cmd = sys.argv[1]
    if cmd == 'scan':
        scan(int(sys.argv[2]), *(int(x, 16) for x in sys.argv[3:5]))
    elif cmd == 'client':
        client(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif cmd == 'report':
        report(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5],
               int(sys.argv[6]) if len(sys.argv) > 6 else 25)
    else:
        sys.exit(__doc__)
