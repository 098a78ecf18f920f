//! The request handler as a hyper service: what hyper's servers (HTTP/1.1
//! after the fast path's hand-off, HTTP/2) call for each request, so that
//! a request reaches the same `proxy::handler::handle` whichever protocol
//! carried it.

use std::sync::Arc;

use hyper::service::service_fn;

use crate::app::App;
use crate::http1::server::ConnActivity;
use crate::proxy::body::ClientBody;
use crate::proxy::handler::{Downstream, handle};

/// The service hyper's servers (HTTP/1.1 after the hand-off, HTTP/2) call
/// for each request: the same handler as the fast path's.
pub(crate) fn hyper_service(
    app: Arc<App>,
    activity: Arc<ConnActivity>,
    downstream: Downstream,
) -> impl hyper::service::Service<
    http::Request<hyper::body::Incoming>,
    Response = http::Response<crate::answer::body::ResponseBody>,
    Error = std::convert::Infallible,
    Future = impl Future<
        Output = Result<
            http::Response<crate::answer::body::ResponseBody>,
            std::convert::Infallible,
        >,
    > + Send,
> + Clone {
    service_fn(move |request: http::Request<hyper::body::Incoming>| {
        let app = app.clone();
        let activity = activity.clone();
        activity.request_started();
        async move {
            // Not boxed: the handler's future is kept small (the
            // upstream exchange is boxed where it starts), so hyper's one
            // move of it into its dispatcher costs less than a per-request
            // allocation of it did (user time 5.4 -> 4.8 us/request; see
            // BENCHMARKS.md).
            let (mut response, fields) = handle(
                &app,
                downstream,
                request.map(ClientBody::hyper),
                Some(activity),
            )
            .await;
            fields.apply(response.headers_mut());
            Ok::<_, std::convert::Infallible>(response)
        }
    })
}
