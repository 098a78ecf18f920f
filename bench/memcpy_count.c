// Counts the bytes a process copies with `memcpy` / `memmove` and where
// from: an LD_PRELOAD library for bench/instructions.sh (`MEMCPY=1`).
//
// Rust moves a large value (an async state machine, a response) by a call
// of `memcpy`, so the bytes copied per request measure how much the
// request path moves; callgrind counts the instructions of the copies, not
// their sizes. Each call adds its size to a table keyed by the caller's
// return address. A signal (MEMCPY_COUNT_SIGNAL, default SIGRTMIN + 5)
// appends the running totals to MEMCPY_COUNT_OUT: a line `total CALLS
// BYTES`, a line `base ADDRESS` (the executable's load address, to map
// return addresses to its file), then `site OFFSET CALLS BYTES` per call
// site; the script diffs two dumps taken around a measured run.
//
// Build: cc -O2 -shared -fPIC -o memcpy_count.so memcpy_count.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void *(*copy_fn)(void *, const void *, size_t);

static copy_fn real_memcpy;
static copy_fn real_memmove;

#define SITES 8192
struct site {
  _Atomic uintptr_t at;
  _Atomic uint64_t calls;
  _Atomic uint64_t bytes;
};
static struct site sites[SITES];
static _Atomic uint64_t total_calls;
static _Atomic uint64_t total_bytes;
static uintptr_t exe_base;

static void count(uintptr_t at, size_t n) {
  atomic_fetch_add_explicit(&total_calls, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&total_bytes, n, memory_order_relaxed);
  size_t i = (at >> 2) * 0x9E3779B97F4A7C15ull >> 51; // 13 bits
  for (size_t probes = 0; probes < SITES; probes++, i = (i + 1) % SITES) {
    uintptr_t seen = atomic_load_explicit(&sites[i].at, memory_order_relaxed);
    if (seen == 0) {
      uintptr_t empty = 0;
      if (!atomic_compare_exchange_strong(&sites[i].at, &empty, at) && empty != at)
        continue;
    } else if (seen != at) {
      continue;
    }
    atomic_fetch_add_explicit(&sites[i].calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&sites[i].bytes, n, memory_order_relaxed);
    return;
  }
}

// A byte loop for the calls made before dlsym has answered (dlsym itself
// copies).
static void *copy_bytes(void *dst, const void *src, size_t n) {
  unsigned char *d = dst;
  const unsigned char *s = src;
  if (d < s) {
    for (size_t i = 0; i < n; i++) d[i] = s[i];
  } else {
    for (size_t i = n; i > 0; i--) d[i - 1] = s[i - 1];
  }
  return dst;
}

void *memcpy(void *dst, const void *src, size_t n) {
  count((uintptr_t)__builtin_return_address(0), n);
  if (!real_memcpy) return copy_bytes(dst, src, n);
  return real_memcpy(dst, src, n);
}

void *memmove(void *dst, const void *src, size_t n) {
  count((uintptr_t)__builtin_return_address(0), n);
  if (!real_memmove) return copy_bytes(dst, src, n);
  return real_memmove(dst, src, n);
}

// Async-signal-safe output: decimal and hex numbers by hand.
static char out_buf[1 << 20];
static size_t out_len;

static void put(const char *s) {
  while (*s && out_len < sizeof out_buf) out_buf[out_len++] = *s++;
}

static void put_num(uint64_t v, int base) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v);
  if (base == 16) put("0x");
  while (n > 0 && out_len < sizeof out_buf) out_buf[out_len++] = digits[--n];
}

static void dump(int sig) {
  (void)sig;
  const char *path = getenv("MEMCPY_COUNT_OUT");
  if (!path) return;
  out_len = 0;
  put("total ");
  put_num(atomic_load(&total_calls), 10);
  put(" ");
  put_num(atomic_load(&total_bytes), 10);
  put("\nbase ");
  put_num(exe_base, 16);
  put("\n");
  for (size_t i = 0; i < SITES; i++) {
    uintptr_t at = atomic_load(&sites[i].at);
    if (!at) continue;
    put("site ");
    put_num(at - exe_base, 16);
    put(" ");
    put_num(atomic_load(&sites[i].calls), 10);
    put(" ");
    put_num(atomic_load(&sites[i].bytes), 10);
    put("\n");
  }
  put("end\n");
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < out_len) {
    ssize_t n = write(fd, out_buf + done, out_len - done);
    if (n <= 0) break;
    done += (size_t)n;
  }
  close(fd);
}

static int first_object(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  *(uintptr_t *)data = info->dlpi_addr; // the executable comes first
  return 1;
}

__attribute__((constructor)) static void init(void) {
  real_memcpy = (copy_fn)dlsym(RTLD_NEXT, "memcpy");
  real_memmove = (copy_fn)dlsym(RTLD_NEXT, "memmove");
  dl_iterate_phdr(first_object, &exe_base);
  const char *sig = getenv("MEMCPY_COUNT_SIGNAL");
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = dump;
  action.sa_flags = SA_RESTART;
  sigaction(sig ? atoi(sig) : SIGRTMIN + 5, &action, NULL);
}
