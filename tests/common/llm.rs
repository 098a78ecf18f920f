//! A scripted OpenAI- and Anthropic-compatible upstream for the token-quota
//! tests: each request says, in headers, how the answer reports its usage
//! (`x-script`) and how many tokens it used (`x-used`); the answer is a
//! JSON body or a server-sent-event stream sent in pieces, with the usage
//! early, late, absent, malformed or cut off before it arrives.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// The scripted upstream, serving until dropped.
pub struct LlmUpstream {
    pub addr: SocketAddr,
    /// The body of the last request it received.
    last_body: Arc<Mutex<Option<Bytes>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LlmUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LlmUpstream {
    pub async fn start() -> LlmUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let last_body = Arc::new(Mutex::new(None));
        let seen = last_body.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let seen = seen.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let seen = seen.clone();
                        async move { Ok::<_, Infallible>(answer(request, &seen).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        LlmUpstream {
            addr,
            last_body,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The last request's body, as JSON.
    pub fn last_body(&self) -> serde_json::Value {
        let body = self.last_body.lock().unwrap().clone().expect("a request");
        serde_json::from_slice(&body).expect("a JSON request body")
    }
}

/// A response body sent in pieces, a pause before each; `cut` ends it
/// with an error, so the connection is closed mid-body.
struct Pieces {
    pieces: std::collections::VecDeque<Bytes>,
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// Before each piece.
    every: Duration,
    cut: bool,
}

impl hyper::body::Body for Pieces {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        let every = this.every;
        let pause = this
            .pause
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
        if pause.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.pause = None;
        match this.pieces.pop_front() {
            Some(piece) => Poll::Ready(Some(Ok(Frame::data(piece)))),
            None if this.cut => Poll::Ready(Some(Err("cut".into()))),
            None => Poll::Ready(None),
        }
    }
}

/// The answer `x-script` asks for, reporting `x-used` tokens.
async fn answer(request: Request<Incoming>, seen: &Mutex<Option<Bytes>>) -> Response<Pieces> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let script = header("x-script").unwrap_or_else(|| "json".into());
    let used: u64 = header("x-used").and_then(|v| v.parse().ok()).unwrap_or(0);
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    *seen.lock().unwrap() = Some(body);
    let (prompt, completion) = (used / 3, used - used / 3);
    let chunk = |text: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
        )
    };
    let openai_usage = format!(
        "{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion},\"total_tokens\":{used}}}"
    );
    let (content_type, pieces, cut, usage_header): (&str, Vec<String>, bool, bool) =
        match script.as_str() {
            "json" => (
                "application/json",
                vec![format!(
                    "{{\"id\":\"c1\",\"object\":\"chat.completion\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"usage: not here\"}}}}],"
                ),
                format!("\"usage\":{openai_usage}}}")],
                false,
                false,
            ),
            "sse" => (
                "text/event-stream",
                vec![
                    chunk("Hel"),
                    chunk("lo"),
                    format!(
                        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{openai_usage}}}\n\n"
                    ),
                    "data: [DONE]\n\n".into(),
                ],
                false,
                false,
            ),
            "anthropic" => (
                "text/event-stream; charset=utf-8",
                vec![
                    format!(
                        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"m1\",\"usage\":{{\"input_tokens\":{prompt},\"output_tokens\":1}}}}}}\n\n"
                    ),
                    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n".into(),
                    format!(
                        "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{{\"output_tokens\":{completion}}}}}\n\n"
                    ),
                    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".into(),
                ],
                false,
                false,
            ),
            // No usage anywhere.
            "none" => (
                "application/json",
                vec!["{\"id\":\"c1\",\"choices\":[]}".into()],
                false,
                false,
            ),
            // A usage that is not a count.
            "malformed" => (
                "application/json",
                vec!["{\"id\":\"c1\",\"usage\":{\"total_tokens\":\"many\"}}".into()],
                false,
                false,
            ),
            // The stream breaks off before its usage.
            "cut" => (
                "text/event-stream",
                vec![chunk("Hel"), chunk("lo")],
                true,
                false,
            ),
            // The OpenAI stream, each piece a second apart: a response
            // still streaming while the test looks.
            "slow" => (
                "text/event-stream",
                vec![
                    chunk("Hel"),
                    format!(
                        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{openai_usage}}}\n\n"
                    ),
                ],
                false,
                false,
            ),
            // The count in a header, the body plain.
            "header" => ("text/plain", vec!["ok".into()], false, true),
            other => panic!("unknown script {other}"),
        };
    let every = Duration::from_millis(if script == "slow" { 1000 } else { 5 });
    let mut response = Response::new(Pieces {
        pieces: pieces.into_iter().map(Bytes::from).collect(),
        pause: None,
        every,
        cut,
    });
    response
        .headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    if usage_header {
        response
            .headers_mut()
            .insert("x-tokens", used.to_string().parse().unwrap());
    }
    response
}
