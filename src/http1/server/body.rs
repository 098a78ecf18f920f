//! The request body the server side hands over: streamed by hyper, or read
//! whole with its head by the fast path. The codec's own type (as hyper's
//! `Incoming` is hyper's), so the codec names nothing of the pipeline and
//! stays non-generic: a generic request body here cost ~110 instructions
//! per request in inlining lost (bench/instructions.sh, deny path).
//!
//! 32 bytes, so a request is 256: a request moves several times on its way
//! into the handler, and memcpy copies 256 bytes in half the instructions it
//! takes for 264 (~25 fewer per move, five moves per request). hyper's
//! `Incoming` (40 bytes) is boxed for it, one allocation per request that
//! hyper serves anyway.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// The client's request body, as the server side hands it to the handler.
#[derive(Debug)]
pub enum ClientBody {
    /// Streamed from the connection by hyper.
    Hyper(Box<Incoming>),
    /// Read whole together with the head (by the fast path, which takes only
    /// requests whose body is already in its buffer); empty once read, or
    /// for a request without a body.
    Complete(Bytes),
}

impl ClientBody {
    /// A request body hyper streams.
    pub(crate) fn hyper(incoming: Incoming) -> ClientBody {
        ClientBody::Hyper(Box::new(incoming))
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ClientBody::Hyper(inner) => Pin::new(&mut **inner).poll_frame(cx),
            ClientBody::Complete(bytes) if bytes.is_empty() => Poll::Ready(None),
            ClientBody::Complete(bytes) => {
                Poll::Ready(Some(Ok(Frame::data(std::mem::take(bytes)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(inner) => inner.is_end_stream(),
            ClientBody::Complete(bytes) => bytes.is_empty(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(inner) => inner.size_hint(),
            ClientBody::Complete(bytes) => SizeHint::with_exact(bytes.len() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn a_request_is_256_bytes() {
        assert_eq!(std::mem::size_of::<ClientBody>(), 32);
        assert_eq!(std::mem::size_of::<http::Request<ClientBody>>(), 256);
    }

    #[tokio::test]
    async fn a_complete_body_yields_its_bytes_once_and_an_empty_one_none() {
        let mut body = ClientBody::Complete(Bytes::from_static(b"abc"));
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(3));
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"abc"));
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none());
        let mut empty = ClientBody::Complete(Bytes::new());
        assert!(empty.is_end_stream());
        assert!(empty.frame().await.is_none());
    }
}
