//! The generated RateLimitService plumbing over a real socket: the tonic
//! server (`envoy_proto::RateLimitServiceServer`, a tower service) served
//! by hyper-util's auto server (HTTP/1.1 and h2c on one port) from a hyper
//! service that routes gRPC's path to it, as the gateway's listener will,
//! and answering tonic's client over a `Channel` on 127.0.0.1.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Empty, Full};
use hyper::body::Incoming;
use hyper::service::{Service, service_fn};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tollgate::envoy_proto::rate_limit_response::{Code, DescriptorStatus};
use tollgate::envoy_proto::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitService,
    RateLimitServiceClient, RateLimitServiceServer, SERVICE_NAME, rate_limit_descriptor,
};
use tonic::transport::{Channel, Endpoint};

/// A trivial decision: over the limit where a descriptor has the key
/// "one_per_day", and a domain is required.
struct Trivial;

#[tonic::async_trait]
impl RateLimitService for Trivial {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = request.into_inner();
        if request.domain.is_empty() {
            return Err(tonic::Status::invalid_argument("no domain"));
        }
        let statuses: Vec<DescriptorStatus> = request
            .descriptors
            .iter()
            .map(|descriptor| {
                let over = descriptor.entries.iter().any(|e| e.key == "one_per_day");
                DescriptorStatus {
                    code: if over { Code::OverLimit } else { Code::Ok } as i32,
                    ..DescriptorStatus::default()
                }
            })
            .collect();
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

/// The body of what the port answers: the gRPC service's, or the rest's.
type PortBody = Either<tonic::body::Body, Full<Bytes>>;

/// The port's one hyper service, as the gateway's will be: requests under
/// `/envoy.service.ratelimit.v3.RateLimitService/` to the tonic service
/// (hyper's `Incoming` request body as it is; tonic's response body on
/// the left of an `Either`), the rest answered here (404).
fn port_service(
    grpc: RateLimitServiceServer<Trivial>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<PortBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<PortBody>, Infallible>> + Send,
> + Clone {
    // tower's poll_ready-then-call, behind hyper's `call(&self)`.
    let grpc = TowerToHyperService::new(grpc);
    let grpc_path = format!("/{SERVICE_NAME}/");
    service_fn(move |request: Request<Incoming>| {
        let grpc = grpc.clone();
        let is_grpc = request.uri().path().starts_with(&grpc_path);
        async move {
            if is_grpc {
                let response = grpc.call(request).await?;
                return Ok(response.map(Either::Left));
            }
            let mut response =
                Response::new(Either::Right(Full::new(Bytes::from_static(b"not found\n"))));
            *response.status_mut() = StatusCode::NOT_FOUND;
            Ok(response)
        }
    })
}

/// Serves `port_service` on 127.0.0.1 with hyper-util's auto server until
/// the test's runtime ends.
async fn serve() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = port_service(RateLimitServiceServer::new(Trivial));
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service.clone();
            tokio::spawn(async move {
                let served = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                if let Err(error) = served {
                    eprintln!("connection ended with an error: {error}");
                }
            });
        }
    });
    addr
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    RateLimitServiceClient::new(channel)
}

fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![rate_limit_descriptor::Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        }],
        ..RateLimitDescriptor::default()
    }
}

#[tokio::test]
async fn the_generated_server_answers_the_generated_client_over_h2c() {
    let addr = serve().await;
    let mut client = client(addr).await;
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: "dummy".to_owned(),
            descriptors: vec![
                descriptor("one_per_day", "something"),
                descriptor("remote_address", "10.0.0.1"),
            ],
            hits_addend: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    let codes: Vec<i32> = response.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [Code::OverLimit as i32, Code::Ok as i32]);

    // A status from the service reaches the client as that status.
    let status = client
        .should_rate_limit(RateLimitRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), "no domain");
}

#[tokio::test]
async fn the_same_port_answers_http1_from_the_rest_of_the_service() {
    let addr = serve().await;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let response = sender
        .send_request(
            Request::get("/json")
                .header("host", "localhost")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"not found\n");
}
