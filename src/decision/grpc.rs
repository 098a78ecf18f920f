//! Envoy's rate-limit service over gRPC: the generated tonic server for
//! `envoy.service.ratelimit.v3.RateLimitService`, answering with
//! [`super::rls`]. tonic does the gRPC framing, the protobuf decoding
//! (a malformed message is `INVALID_ARGUMENT` there) and the status
//! trailers; the connection is the decision listener's (hyper, h2c).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::rls::{RlsError, should_rate_limit};
use crate::app::App;
use crate::envoy_proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use crate::envoy_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// The service over the gateway's state.
pub(crate) struct Rls {
    app: Arc<App>,
}

/// The tonic server of the gateway's rate-limit service.
pub(crate) fn server(app: Arc<App>) -> RateLimitServiceServer<Rls> {
    RateLimitServiceServer::new(Rls { app })
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        match should_rate_limit(&self.app, &self.app.request_snapshot(), request.get_ref()).await {
            Ok(response) => Ok(Response::new(response)),
            Err(RlsError::Invalid(message)) => Err(Status::invalid_argument(message)),
            Err(RlsError::StoreDown) => Err(Status::unavailable(
                "the limiter store is unavailable and store.on_failure is \"deny\"",
            )),
        }
    }
}
