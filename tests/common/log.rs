//! The log lines of an in-process gateway, for tests that read what the
//! binary would write to stderr (an upstream error, a failed reload): a
//! subscriber formatting as the binary does (human format, or JSON as
//! with `--log-format json`; INFO and up, no colours) into a buffer, the
//! default of the test's thread while the [`LogCapture`] lives. On a `#[tokio::test]` runtime (one thread) that
//! is everything a one-worker gateway logs, an in-process reload
//! included; not what blocking-pool threads log.
//!
//! A no-op global subscriber is installed first: with a thread's default
//! the only subscriber, a callsite first reached on another test's thread
//! (which has none) is cached as uninteresting for every thread, and this
//! thread's lines from it are lost. With two, a callsite is asked again on
//! each thread.

use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// What the gateway logged on this thread since [`capture`].
pub struct LogCapture {
    text: Arc<Mutex<Vec<u8>>>,
    _default: DefaultGuard,
}

/// Starts capturing this thread's log lines, in the human format.
pub fn capture() -> LogCapture {
    global_no_op();
    let text = Arc::new(Mutex::new(Vec::new()));
    let sink = text.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || Writer(sink.clone()))
        .finish();
    LogCapture {
        text,
        _default: tracing::subscriber::set_default(subscriber),
    }
}

/// Starts capturing this thread's log lines as JSON objects, one a line,
/// the event's fields beside `target` and `level` (`--log-format json`).
pub fn capture_json() -> LogCapture {
    global_no_op();
    let text = Arc::new(Mutex::new(Vec::new()));
    let sink = text.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || Writer(sink.clone()))
        .json()
        .flatten_event(true)
        .finish();
    LogCapture {
        text,
        _default: tracing::subscriber::set_default(subscriber),
    }
}

impl LogCapture {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap()).into_owned()
    }

    /// Waits until the log satisfies `done` (a line may follow the answer
    /// it belongs to), at most [`super::EVENTUALLY`]; returns the log
    /// either way.
    pub async fn when(&self, done: impl Fn(&str) -> bool) -> String {
        super::eventually(async || done(&self.text())).await;
        self.text()
    }
}

/// Installs the no-op global subscriber (see the module doc), once; a
/// test binary that installs a global subscriber of its own keeps it.
fn global_no_op() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ =
            tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
    });
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
