//! The request body the server side hands over: streamed by hyper, or read
//! whole with its head by the fast path. The codec's own type (as hyper's
//! `Incoming` is hyper's), so the codec names nothing of the pipeline and
//! stays non-generic: a generic request body here cost ~110 instructions
//! per request in inlining lost (bench/instructions.sh, deny path).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// The client's request body, as the server side hands it to the handler.
#[derive(Debug)]
pub enum ClientBody {
    /// Streamed from the connection by hyper.
    Hyper(Incoming),
    /// Read whole together with the head (by the fast path, which takes only
    /// requests whose body is already in its buffer).
    Complete(Option<Bytes>),
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ClientBody::Hyper(inner) => Pin::new(inner).poll_frame(cx),
            ClientBody::Complete(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(inner) => inner.is_end_stream(),
            ClientBody::Complete(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(inner) => inner.size_hint(),
            ClientBody::Complete(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
