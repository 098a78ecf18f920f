# Shared by bench/load.sh and bench/instructions.sh (sourced, not run): the
# tools they need, waiting for a port, and the two configurations both
# measure — the nginx upstream and tollgate's token-bucket limit — so the
# scripts always measure the same thing.

# Installs the commands named (package = command) that are missing.
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
}

# Waits until something accepts on 127.0.0.1:$1 (up to 10 s).
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
