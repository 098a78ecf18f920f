//! tollgate: a rate-limiting reverse proxy and API gateway.
//!
//! # Architecture: layers that point down
//!
//! Each folder is a layer, and a layer imports only the ones below it (no
//! import cycle between files either; `tests/layers.rs` checks both):
//!
//! 1. `http/` — wire vocabulary both sides share: field lines
//!    (`http::field_lines`), the RFC 9651 writer (`http::structured`),
//!    hop-by-hop rules, chunked framing, the cached `Date`, the one host
//!    rule for `Host`, a target's authority and `:authority` (`http::host`),
//!    and the one RFC 9457 problem+json writer (`http::problem`) of every
//!    body the gateway answers with itself: the codec's refusals, the
//!    pipeline's errors and its 429s. Beside it, [`envoy_proto`]: Envoy's
//!    rate-limit service messages (protobuf and proto3 JSON) and its gRPC
//!    server and client, generated from `proto/` by `build.rs`.
//! 2. [`http1`] — the HTTP/1.1 codec, bytes ↔ `http` types: the server side
//!    ([`http1::server`]: the fast path, lingering close, the bytes handed
//!    to hyper) and the upstream client (`http1::client`: head codec,
//!    exchange, chunked decoder, response body). It knows nothing of
//!    routes, limits, the app or the pool: the server side hands over its
//!    own body type (`ClientBody`) and marks a connection's activity in its
//!    own record (`ConnActivity`, which the watchdog reads and the
//!    pipeline's response bodies update); the client sends any
//!    `OutgoingBody` and gives a finished response's connection back
//!    through a `CheckIn` the pool implements.
//! 3. `upstream/` — connections to upstreams: an upstream's pool per URL
//!    and the round robin over them, checkout and the retry rule, and the
//!    reused deadline timers.
//! 4. [`app`] — the shared state a request reads: the configuration
//!    snapshot (swapped whole, `arc-swap`) and the limiter registry, which
//!    lives outside the snapshot so a reload keeps its state, with the
//!    idle sweeper that evicts its keys back at full quota (`app::sweep`,
//!    started by [`gateway`]).
//! 5. [`admission`] — the limit decision, as a value: a routed request
//!    in (`admission::Routed`: route, head, peer, body, time), one call
//!    (`admission::admit_request`), a `RequestAdmission` out (admitted
//!    with its token bill, denied by which limit, a missing key, the store
//!    down, the body refused, the caller unidentified), with the request's
//!    `Ticket` (verdicts, permits, what to settle). The only code that
//!    decides: the proxy, `/auth` and `simulate` make that one call, the
//!    Envoy service its keyed form (`admission::admit_keyed`), and the
//!    explain endpoint reads a key (`admission::explain`). Identification
//!    (token, consumer, client IP, the body read for its fields), the
//!    token reservation, the memory and shared tiers with leases and
//!    `on_failure`, decision metrics and `cost_header` settlement live
//!    here.
//! 6. `answer/` — what every front tells a client in HTTP: the rate-limit
//!    fields, a denial's fields as a value and the 429 written from it
//!    (`answer::ratelimit`), the one error → status mapping
//!    (`answer::error`), the gateway's problem responses and the response
//!    body. Below the fronts, so that none borrows it from another.
//! 7. `proxy/` — the pipeline: `proxy::handler::handle` and its steps
//!    (guard, route, admit, act, settle), the forwarding header rules and
//!    the send upstream, retries, upgrade tunnels, the request body. It
//!    never names the connection layer, and no other front names it.
//! 8. [`conn`] — listeners, the accept loop, worker threads, the
//!    per-connection watchdog (`conn::watchdog`: one loop for eviction, the
//!    drain and the deadlines, whichever protocol serves), graceful drain,
//!    and the hand-off from the fast path to hyper. Connections only: the
//!    limiter state's sweeper is `app`'s. TLS (`conn::tls`) is one more kind of stream
//!    under the same connection code: after the handshake a TLS stream is
//!    served like a TCP one, or by hyper's HTTP/2 server (`conn::h2`) when
//!    ALPN chose `h2` or a cleartext client opened with the h2 preface.
//! 9. [`admin`], [`reload`], [`gateway`] ([`run`]: the whole gateway as
//!    one future over bound listeners, for the binary and for in-process
//!    tests), [`simulate`] (a trace through the same routing, keys and
//!    limiters on a virtual clock, offline), [`import`] (other rate
//!    limiters' configuration files as `gateway.toml`: envoyproxy/ratelimit's
//!    YAML), and the binary (`main.rs`: command line, logging, signals).
//!
//! Beside the layers, below the pipeline and never importing it: [`config`]
//! (raw serde mirror → validated types), [`limit`] (the algorithms, pure
//! functions of an injected clock, and the in-memory store), [`identity`]
//! (client IP behind proxies, consumers, limit keys; it reads `config`,
//! never the other way), [`jose`] (JWT signature algorithms and key sets,
//! below both `config` and `identity`), [`llm`] (what an
//! LLM API request reserves of a token quota, and the usage its response
//! reports), [`routing`],
//! [`metrics`], `access_log`, `ratelimit_policy` (a stack's
//! `RateLimit-Policy`, built once per snapshot), [`summary`], `trace`
//! (OpenTelemetry spans, sampled per request and exported over OTLP off
//! the request path), [`fd_limit`] (the open-file limit raised at start),
//! [`store`] (the Redis store: shared limits decided by one script call),
//! [`usage`] (the usage events of settled requests, spooled on disk and
//! exported on threads of their own), `post_client` (the HTTP/1.1 client
//! both the usage and the trace exporters POST their batches with) and
//! [`worker`] (which worker thread code runs on).
//!
//! # The life of a request
//!
//! **accept** ([`conn`]) → **parse** ([`http1::server`], or hyper for what
//! the fast path hands off) → **snapshot** ([`app`]) → **guard** →
//! **route** ([`routing`]) → **admit**: identify and limit, one call
//! ([`admission`], on [`identity`] and [`limit`]) → **act**: answer, or
//! forward (`proxy::send` → `proxy::forward` → `upstream/` →
//! `http1::client`) → **respond** and **settle** (`answer::ratelimit`,
//! `answer::response`, errors via `answer::error`) → **observe**
//! ([`metrics`], `access_log`, `trace`). `proxy::handler` calls the steps in this
//! order, one function per step.
//!
//! With `workers = N > 1` a connection lives on one of N threads, each its
//! own single-threaded runtime ([`conn`], [`worker`]); state that must be
//! exact for the process (limiters, metrics, the snapshot) is shared.
//! Operators read the metrics, health and running configuration on a
//! separate listener, [`admin`].
//!
//! With `store.backend = "redis"` the limit step sends a stack's shared
//! limits to [`store`] (one Lua script decision per request, all or
//! nothing; a worker's concurrent requests share one call); `local = true`
//! limits stay in memory.
//!
//! Every request head is checked by one framing rule before anything
//! serves it ([`http1::server::framing`]; `Content-Length` by
//! [`http::content_length`]): an ambiguous or malformed request is
//! answered 400 and its connection closed, so nothing can be smuggled past
//! the gateway.

// What nothing outside the crate can reach is `pub(crate)`, so the compiler
// finds what nothing uses (CI's clippy runs with `-D warnings`).
#![warn(unreachable_pub)]
// Docs link to private items as well: rustdoc still resolves and checks
// those links, writes them as plain text in the public docs and as links
// with `--document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub(crate) mod access_log;
pub mod admin;
pub mod admission;
pub mod allocator;
pub(crate) mod answer;
pub mod app;
pub mod config;
pub mod conn;
pub(crate) mod decision;
pub mod envoy_proto;
pub mod fd_limit;
pub(crate) mod gateway;
pub mod http;
pub mod http1;
pub mod identity;
pub mod import;
pub mod jose;
pub mod limit;
pub mod llm;
pub mod metrics;
pub(crate) mod post_client;
pub(crate) mod proxy;
pub(crate) mod ratelimit_policy;
pub mod reload;
pub mod routing;
pub mod simulate;
pub(crate) mod store;
pub mod summary;
pub(crate) mod trace;
pub mod upstream;
pub(crate) mod usage;
pub mod worker;

pub use gateway::{Listeners, run};
