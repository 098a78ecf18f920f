# Shared by the bench/ scripts (load, instructions, redis, tls, decision;
# sourced, not run): the tools they need, the scratch directory and the
# children to stop, waiting for a port, starting nginx and tollgate (capped
# or pinned to CPUs), CPU ticks and wrk latencies, and the configurations
# they measure — the nginx upstream, nginx `limit_req` as the peer, and
# tollgate's token-bucket limit — so the scripts always measure the same
# thing.

# Installs the commands named (package = command) that are missing, and sets
# $NGINX to nginx's path (it may be outside $PATH, in /usr/sbin).
need_tools() {
  local missing=() tool
  for tool in "$@"; do
    if [ "$tool" = nginx ]; then
      command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
    else
      command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  NGINX=$(command -v nginx || echo /usr/sbin/nginx)
}

# Builds the benchmarked binary (the `dist` profile, target/dist/tollgate)
# unless SKIP_BUILD=1.
build_release() {
  if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --profile dist --bin tollgate
  fi
}

# Makes the scratch directory $TMP and the list $PIDS of children to stop;
# at exit (or on INT/TERM) every child is stopped and $TMP removed.
start_scratch() {
  TMP=$(mktemp -d)
  chmod 755 "$TMP" # nginx workers may run as another user
  PIDS=()
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}

cleanup() {
  local pid group
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for group in "${CPU_GROUPS[@]}"; do rmdir "$group" 2>/dev/null || true; done
  rm -rf "$TMP"
}

# Stops the given children and forgets them (so cleanup never signals a
# reused pid).
stop() {
  local pid keep=()
  for pid in "$@"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    case " $* " in *" $pid "*) ;; *) keep+=("$pid") ;; esac
  done
  PIDS=("${keep[@]}")
}

# SERVER_CPU (e.g. 0.5): each server started by start_nginx/start_tollgate
# runs in its own cgroup with that many cores of CPU time (CFS quota over a
# 10 ms period), so that the server, not the load generator sharing its
# machine, sets the pace: what a client on another machine would see. Both
# peers get the same budget; unset, nothing is capped.
CPU_GROUPS=()
cpu_cap_dir() { # the directory of a new capped cgroup, in $CPU_GROUP
  CPU_GROUP=
  [ -n "${SERVER_CPU:-}" ] || return 0
  local period=10000 quota base
  quota=$(awk -v c="$SERVER_CPU" 'BEGIN {printf "%d", c * 10000}')
  if [ -d /sys/fs/cgroup/cpu ] && [ -w /sys/fs/cgroup/cpu ]; then
    base=/sys/fs/cgroup/cpu/tollgate-bench-$$-${#CPU_GROUPS[@]}
    mkdir "$base"
    echo "$period" >"$base/cpu.cfs_period_us"
    echo "$quota" >"$base/cpu.cfs_quota_us"
  elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    base=/sys/fs/cgroup/tollgate-bench-$$-${#CPU_GROUPS[@]}
    mkdir "$base"
    echo "$quota $period" >"$base/cpu.max"
  else
    echo "SERVER_CPU needs a writable cgroup cpu controller (v1 or v2); run as root" >&2
    exit 1
  fi
  CPU_GROUPS+=("$base")
  CPU_GROUP=$base
}

# SERVER_CPUSET (e.g. 0, a `taskset -c` list): each server started by
# start_nginx/start_upstream/start_tollgate runs on those CPUs only, its
# threads and nginx's workers included, so that a script can keep the
# servers and the load generator on cores of their own. Unset: not pinned.
pinned() { # the command prefix that pins, or nothing
  if [ -n "${SERVER_CPUSET:-}" ]; then echo taskset -c "$SERVER_CPUSET"; fi
}

# Becomes "$@" (exec: called as `capped … &`, the background child is the
# server itself, so $! is the server's pid) in cgroup $CPU_GROUP when
# it is set (cpu_cap_dir, called before in this shell: a `&` child could not
# record the group for cleanup), else as it is; on SERVER_CPUSET's CPUs
# when that is set.
capped() {
  # shellcheck disable=SC2046 # pinned's words are the prefix, or none
  set -- $(pinned) "$@"
  if [ -n "$CPU_GROUP" ]; then
    exec sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CPU_GROUP" "$@"
  else
    exec "$@"
  fi
}

# Waits until something accepts on 127.0.0.1:$1 (up to 10 s).
# Fails the run when something already listens on port $1: wait_port would
# then find that process, and the bench would measure it.
port_free() {
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "127.0.0.1:$1 is already taken: stop what listens there or set BASE_PORT" >&2
    exit 1
  fi
}

wait_port() {
  for _ in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "nothing listens on 127.0.0.1:$1" >&2
  exit 1
}

# The upstream: nginx `return 200 "ok\n"`, 1 worker, on port $1, files in $2.
upstream_conf() {
  cat <<CONF
daemon off;
worker_processes 1;
pid $2/upstream.pid;
error_log $2/upstream.err error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  server {
    listen 127.0.0.1:$1;
    location / { return 200 "ok\n"; }
  }
}
CONF
}

# nginx as the peer proxy, with `limit_req`: $1 = workers, $2 = port, $3 =
# extra `limit_req` parameters, $4 = the zone's rate, $5 = the upstream's
# port, $6 = the directory for its pid and error files. With more than one
# worker it listens with `reuseport`, as tollgate's workers do: the kernel
# then spreads wrk's connections over the workers by hash. Without it the
# worker that wakes first accepts them, and in two of four 64-connection
# runs one nginx worker took all 64 (BENCHMARKS.md, *A flood*), so "two
# workers" measured one.
nginx_proxy_conf() {
  local reuseport=""
  [ "$1" -gt 1 ] && reuseport=" reuseport"
  cat <<CONF
daemon off;
worker_processes $1;
pid $6/ng-$2.pid;
# crit: limit_req logs every denial at "error"; tollgate logs none.
error_log $6/ng-$2.err crit;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  limit_req_zone \$binary_remote_addr zone=z$2:10m rate=$4;
  limit_req_status 429;
  upstream up {
    server 127.0.0.1:$5;
    keepalive 64;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$2$reuseport;
    location / {
      limit_req zone=z$2 $3;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
CONF
}

# tollgate in front of the upstream on port $5: $1 = workers, $2 = port,
# $3 = token-bucket capacity, $4 = refill.
tollgate_conf() {
  cat <<CONF
[server]
listen = "127.0.0.1:$2"
workers = $1

[upstreams.up]
url = "http://127.0.0.1:$5"

[limits.per_ip]
key = "ip"
algorithm = "token_bucket"
capacity = $3
refill = "$4"

[[routes]]
name = "all"
match = { path_prefix = "/" }
upstream = "up"
limits = ["per_ip"]
CONF
}

# The TLS certificate both servers present: ECDSA P-256 for localhost and
# 127.0.0.1, written to $1/cert.pem and $1/key.pem.
make_tls_cert() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1/key.pem" -out "$1/cert.pem" -days 2 -subj /CN=localhost \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
  chmod 644 "$1/key.pem" # nginx reads it as root, but its workers may not be
}

# nginx as the peer over TLS: nginx_proxy_conf's proxy (one worker), its
# listener turned into `ssl http2` with $5's certificate, TLS 1.2 and 1.3
# (1.22's default lacks 1.3), and otherwise nginx's TLS defaults, as
# tollgate has rustls's (both send two TLS 1.3 session tickets per
# handshake). $1 = port, $2 = limit_req parameters, $3 = rate, $4 = the
# upstream's port, $5 = the directory of the certificate and its files.
nginx_tls_conf() {
  nginx_proxy_conf 1 "$1" "$2" "$3" "$4" "$5" | sed \
    -e "s|^    listen 127.0.0.1:$1;|    listen 127.0.0.1:$1 ssl http2;\\
    ssl_certificate $5/cert.pem;\\
    ssl_certificate_key $5/key.pem;\\
    ssl_protocols TLSv1.2 TLSv1.3;|"
}

# tollgate_conf's gateway (one worker, its cleartext listener on $2, which
# nothing is sent to) with a `[server.tls]` listener on $1 and $6's
# certificate: $3 = capacity, $4 = refill, $5 = the upstream's port.
tollgate_tls_conf() {
  tollgate_conf 1 "$2" "$3" "$4" "$5"
  cat <<CONF

[server.tls]
listen = "127.0.0.1:$1"
cert = "$6/cert.pem"
key = "$6/key.pem"
CONF
}

# Starts nginx in the foreground (`daemon off`, a child of this shell) with
# config file $1; its pid goes to $STARTED and the cleanup list.
start_nginx() {
  cpu_cap_dir
  capped "$NGINX" -p "$TMP/" -e "$1.err" -c "$1" >/dev/null 2>&1 &
  STARTED=$!
  PIDS+=("$STARTED")
}

# Starts the upstream's nginx with config file $1, never capped: the cap
# is for the servers compared, and the upstream serves both alike.
start_upstream() {
  SERVER_CPU= start_nginx "$1"
}

# Starts $TOLLGATE with config file $1; pid in $STARTED, as for nginx.
start_tollgate() {
  cpu_cap_dir
  TOLLGATE_LOG=warn capped "$TOLLGATE" run -c "$1" >/dev/null 2>>"$1.err" &
  STARTED=$!
  PIDS+=("$STARTED")
}

# CPU ticks (utime + stime) of a process and its direct children.
cpu_ticks() {
  local user sys
  read -r user sys <<<"$(cpu_user_sys "$1")"
  echo $((user + sys))
}

# awk functions for a bench's summary, put before its program (`awk -F'\t'
# "$AWK_STATS"'{ ... }'`); a list is numbers separated by spaces.
# sorted(list, a): sorts them into a[1..n], returns n; median(list);
# range(list, fmt): "min-max", each in fmt; median_range(list, fmt):
# "median [min-max]". Headline figures are medians with their range.
# shellcheck disable=SC2034 # used by the scripts that source this file
AWK_STATS='
  function sorted(list, a,   n, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n
  }
  function median(list,   a, n) {
    n = sorted(list, a)
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function range(list, fmt,   a, n) {
    n = sorted(list, a)
    return sprintf(fmt "-" fmt, a[1], a[n])
  }
  function median_range(list, fmt) {
    return sprintf(fmt " [%s]", median(list), range(list, fmt))
  }
'

# CPU ticks of a process and its direct children, user and kernel apart:
# "UTIME STIME".
cpu_user_sys() {
  local user=0 sys=0 pid u s
  for pid in "$1" $(pgrep -P "$1" || true); do
    [ -r "/proc/$pid/stat" ] || continue
    # Fields after the ")" of the command name: state is $1, utime $12, stime $13.
    read -r u s < <(sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12, $13}')
    user=$((user + u))
    sys=$((sys + s))
  done
  echo "$user $sys"
}

# Context switches (voluntary and not) of every thread of a process and of
# its direct children: how often a server went to sleep or was preempted.
ctx_switches() {
  local pid
  for pid in "$1" $(pgrep -P "$1" || true); do
    cat /proc/"$pid"/task/*/status 2>/dev/null || true
  done | awk '/^(non)?voluntary_ctxt_switches:/ {n += $2} END {print n + 0}'
}

# Latency text from wrk ("812.00us", "1.20ms", "1.01s") in microseconds.
to_us() {
  awk -v t="$1" 'BEGIN {
    v = t + 0
    if (t ~ /us$/) m = 1; else if (t ~ /ms$/) m = 1000; else if (t ~ /s$/) m = 1000000; else m = 1
    printf "%.1f", v * m
  }'
}

# Fails the run unless wrk's output $2 shows the statuses expected of it:
# $1 = allow (every response 2xx/3xx) or deny (every one refused, but the
# two a fresh quota and one refill of a 1/m limit may still admit), and no
# socket error (a reset, a refused connection or a timeout has no status,
# and would pass for nothing at all). wrk counts any status as a request,
# and its summary lumps every non-2xx/3xx together: unchecked, 502s would
# pass for allowed requests and 503s for denials. So a deny check also
# needs the URL the run was against ($3, then any more wrk arguments, such
# as -H, in $4...): probe_statuses asks it again and requires 429s.
# (STATUSES_PROBED=1: the caller probed the same server itself.)
check_statuses() {
  local total refused socket
  total=$(awk '/requests in/ {print $1}' "$2")
  [ -n "$total" ] || { echo "$2: not wrk's output" >&2; exit 1; }
  refused=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$2")
  refused=${refused:-0}
  socket=$(awk '/Socket errors:/ {gsub(",", ""); print $4 + $6 + $8 + $10}' "$2")
  [ "${socket:-0}" = 0 ] || {
    echo "$2: $socket socket errors (connect, read, write, timeout) in $total requests: $(grep 'Socket errors:' "$2")" >&2
    exit 1
  }
  case $1 in
    allow) [ "$refused" = 0 ] || {
      echo "$2: $refused of $total responses were not 2xx/3xx on the allowed path" >&2
      exit 1
    } ;;
    deny)
      [ "$refused" -ge $((total - 2)) ] || {
        echo "$2: only $refused of $total responses were refused on the denied path" >&2
        exit 1
      }
      if [ $# -ge 3 ]; then
        shift 2
        probe_statuses deny "$@"
      elif [ "${STATUSES_PROBED:-0}" != 1 ]; then
        echo "check_statuses deny $2: give the URL, to probe which statuses the refusals were" >&2
        exit 1
      fi
      ;;
    *) echo "check_statuses: allow or deny, not $1" >&2; exit 2 ;;
  esac
}

# A short wrk run (1 s, 4 connections; $PROBE_SECONDS) against URL $2 (more
# wrk arguments after it) with bench/lua/statuses.lua, failing the bench
# unless every response was what $1 expects: allow, 2xx; deny, 429 (but
# for two 2xx, as check_statuses), and no socket error. What a measured
# run's summary cannot tell: a 502 or 503 from a 429.
probe_statuses() {
  local expect=$1 url=$2 out
  shift 2
  out=$(mktemp "${TMP:-/tmp}/probe.XXXXXX")
  wrk -t1 -c4 -d"${PROBE_SECONDS:-1}s" -s "$(dirname "${BASH_SOURCE[0]}")/lua/statuses.lua" "$@" "$url" >"$out"
  awk -v expect="$expect" -v url="$url" '
    $1 == "status" { n[$2] += $3; counted += $3 }
    $1 == "socket_errors" { socket = $2 }
    $1 == "requests" { requests = $2 }
    END {
      if (requests == 0) { print url ": the probe got no response" > "/dev/stderr"; exit 1 }
      if (socket > 0) { printf "%s: %d socket errors in the probe of %d requests\n", url, socket, requests > "/dev/stderr"; exit 1 }
      other = ""; admitted = 0
      for (s in n) {
        if (s >= 200 && s < 300) admitted += n[s]
        else if (!(expect == "deny" && s == 429)) other = other " " s ":" n[s]
      }
      if (other != "") { printf "%s: statuses%s in the probe (%s path)\n", url, other, expect > "/dev/stderr"; exit 1 }
      if (expect == "deny" && admitted > 2) { printf "%s: %d of %d admitted in the probe of the denied path\n", url, admitted, counted > "/dev/stderr"; exit 1 }
    }' "$out" || { sed 's/^/  probe: /' "$out" >&2; exit 1; }
  rm -f "$out"
}
