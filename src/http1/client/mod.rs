//! The HTTP/1.1 client of the forwarding path.
//!
//! Written for the one job a gateway gives it — one request at a time on a
//! keep-alive connection, inside the task that serves the client — rather
//! than taken from hyper's general client, which runs each connection as its
//! own task behind a channel. The profile put the upstream half of a proxied
//! request at 4.7 µs of user time, more than the whole downstream half; most
//! of it was that hand-over (task wake-ups, the dispatch channel, a body
//! channel) and per-field allocations of the response head.
//!
//! [`exchange`] writes a request and reads the response head ([`head`]
//! encodes and parses heads; [`interim`] says which 1xx go on to the client),
//! [`response_body`] streams the body back and
//! hands its connection back through [`CheckIn`](response_body::CheckIn), and [`chunked`] decodes the
//! transfer coding. Which connection, and whether to retry, is the upstream
//! layer's (`upstream::pool`); what a request body is, the pipeline's
//! ([`OutgoingBody`](exchange::OutgoingBody)).

pub mod chunked;
pub(crate) mod conn;
pub mod exchange;
pub mod head;
pub(crate) mod interim;
pub(crate) mod response_body;

pub(crate) use conn::UpstreamConn;
pub(crate) use head::OwnFields;
pub(crate) use interim::InterimSink;
pub(crate) use response_body::UpstreamBody;
