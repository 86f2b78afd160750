//! gRPC through Portico with tonic on both sides: an HTTP/2 client (prior knowledge) to a `protocol: h2`
//! cluster. Unary and bidirectional streaming calls, metadata, and error statuses carried in trailers.

// tonic's own `Status` is the error type of every gRPC call.
#![allow(clippy::result_large_err)]

mod common;
use common::*;
use futures_util::StreamExt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;
use tonic::codec::ProstCodec;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{empty_body, http, Body, BoxFuture, Context, Poll, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService, UnaryService};
use tonic::{Request, Response, Status, Streaming};

#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(string, tag = "1")]
    text: String,
    #[prost(uint32, tag = "2")]
    seq: u32,
}

/// `echo.Echo`: `Say` answers its message, `Chat` answers every message of a stream as it arrives, `Fail`
/// answers NOT_FOUND. Written out by hand, as tonic's code generator would, so the test needs no protoc.
#[derive(Clone)]
struct Echo;

impl NamedService for Echo {
    const NAME: &'static str = "echo.Echo";
}

struct Say;
impl UnaryService<Msg> for Say {
    type Response = Msg;
    type Future = BoxFuture<Response<Msg>, Status>;
    fn call(&mut self, request: Request<Msg>) -> Self::Future {
        Box::pin(async move {
            let trace = request.metadata().get("x-trace").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            let msg = request.into_inner();
            let mut resp = Response::new(Msg { text: format!("{}{}", msg.text, trace), seq: msg.seq });
            resp.metadata_mut().insert("x-served-by", "tonic".parse().unwrap());
            Ok(resp)
        })
    }
}

struct Fail;
impl UnaryService<Msg> for Fail {
    type Response = Msg;
    type Future = BoxFuture<Response<Msg>, Status>;
    fn call(&mut self, _: Request<Msg>) -> Self::Future {
        Box::pin(async { Err(Status::not_found("no such thing")) })
    }
}

type MsgStream = Pin<Box<dyn futures_util::Stream<Item = Result<Msg, Status>> + Send>>;

struct Chat;
impl StreamingService<Msg> for Chat {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFuture<Response<MsgStream>, Status>;
    fn call(&mut self, request: Request<Streaming<Msg>>) -> Self::Future {
        Box::pin(async move {
            let stream = request.into_inner().map(|m| m.map(|m| Msg { text: m.text.to_uppercase(), seq: m.seq }));
            Ok(Response::new(Box::pin(stream) as MsgStream))
        })
    }
}

impl<B> Service<http::Request<B>> for Echo
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match req.uri().path() {
            "/echo.Echo/Say" => Box::pin(async move { Ok(Grpc::new(ProstCodec::default()).unary(Say, req).await) }),
            "/echo.Echo/Fail" => Box::pin(async move { Ok(Grpc::new(ProstCodec::default()).unary(Fail, req).await) }),
            "/echo.Echo/Chat" => {
                Box::pin(async move { Ok(Grpc::new(ProstCodec::default()).streaming(Chat, req).await) })
            }
            _ => Box::pin(async move {
                let mut resp = http::Response::new(empty_body());
                resp.headers_mut().insert("grpc-status", http::HeaderValue::from_static("12"));
                resp.headers_mut().insert("content-type", http::HeaderValue::from_static("application/grpc"));
                Ok(resp)
            }),
        }
    }
}

/// Starts the tonic server (with the standard health service) on a thread of its own; returns its address
/// and the health reporter.
fn start_server() -> (SocketAddr, tonic_health::server::HealthReporter) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let (reporter, health) = tonic_health::server::health_reporter();
            tx.send(reporter).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let incoming = tonic::transport::server::TcpIncoming::from_listener(listener, true, None).unwrap();
            let server = tonic::transport::Server::builder().add_service(health).add_service(Echo);
            server.serve_with_incoming(incoming).await.unwrap();
        });
    });
    (addr, rx.recv().unwrap())
}

async fn client(addr: SocketAddr) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(channel)
}

#[test]
fn grpc_unary_bidirectional_and_errors_pass_through() {
    let (server, _) = start_server();
    let p = Portico::start(&format!(
        "workers: 2\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: grpc\n    address: \"{{listen}}\"\nroutes:\n  - match: {{ path_prefix: /echo.Echo/ }}\n    cluster: echo\nclusters:\n  echo:\n    protocol: h2\n    endpoints: [ {{ address: \"{server}\" }} ]\n"
    ));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut grpc = client(p.addr).await;
        for i in 0..200u32 {
            grpc.ready().await.unwrap();
            let mut request = Request::new(Msg { text: format!("hello {i} "), seq: i });
            request.metadata_mut().insert("x-trace", "t-1".parse().unwrap());
            let resp: Response<Msg> = grpc
                .unary(request, PathAndQuery::from_static("/echo.Echo/Say"), ProstCodec::default())
                .await
                .unwrap_or_else(|s| panic!("call {i}: {s:?}"));
            assert_eq!(resp.metadata().get("x-served-by").and_then(|v| v.to_str().ok()), Some("tonic"));
            assert_eq!(resp.into_inner(), Msg { text: format!("hello {i} t-1"), seq: i });
        }

        // Bidirectional: each message answered while the client is still sending.
        let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(8);
        grpc.ready().await.unwrap();
        let outbound = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let resp: Response<Streaming<Msg>> = grpc
            .streaming(Request::new(outbound), PathAndQuery::from_static("/echo.Echo/Chat"), ProstCodec::default())
            .await
            .unwrap();
        let mut inbound = resp.into_inner();
        for seq in 0..1000u32 {
            tx.send(Msg { text: format!("ping {seq}"), seq }).await.unwrap();
            let answer = inbound.message().await.unwrap().expect("an answer per message");
            assert_eq!(answer, Msg { text: format!("PING {seq}"), seq });
        }
        drop(tx);
        assert!(inbound.message().await.unwrap().is_none(), "the stream ends when the client's does");

        // Errors travel in trailers: code and message intact.
        grpc.ready().await.unwrap();
        let status = grpc
            .unary::<Msg, Msg, _>(
                Request::new(Msg::default()),
                PathAndQuery::from_static("/echo.Echo/Fail"),
                ProstCodec::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert_eq!(status.message(), "no such thing");
    });
    let ok = p.metric("portico_requests_total{route=\"/echo.Echo/*\",cluster=\"echo\",status_class=\"2xx\"}");
    assert_eq!(ok, 202.0, "every call is counted once it ends");
    let opened =
        p.metric(&format!("portico_upstream_connections_opened_total{{cluster=\"echo\",endpoint=\"{server}\"}}"));
    assert!((1.0..=2.0).contains(&opened), "{opened} upstream HTTP/2 connections for 202 calls");
}

#[test]
fn grpc_health_checks_follow_the_serving_status() {
    let (server, mut reporter) = start_server();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(reporter.set_service_status("echo.Echo", tonic_health::ServingStatus::NotServing));
    let p = Portico::start(&format!(
        "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: grpc\n    address: \"{{listen}}\"\nroutes:\n  - match: {{ path_prefix: / }}\n    cluster: echo\nclusters:\n  echo:\n    protocol: h2\n    health_check: {{ type: grpc, grpc_service: echo.Echo, interval: 100ms, healthy_after: 1, unhealthy_after: 1 }}\n    endpoints: [ {{ address: \"{server}\" }} ]\n"
    ));
    let healthy = || p.metric(&format!("portico_endpoint_healthy{{cluster=\"echo\",endpoint=\"{server}\"}}"));
    wait_until("NOT_SERVING marks the endpoint unhealthy", Duration::from_secs(5), || healthy() == 0.0);
    assert_eq!(Conn::open(p.addr).get("/", "").status, 503);
    rt.block_on(reporter.set_service_status("echo.Echo", tonic_health::ServingStatus::Serving));
    wait_until("SERVING brings it back", Duration::from_secs(5), || healthy() == 1.0);
    // An unknown service is not healthy either.
    let path = p.config.clone();
    let text = std::fs::read_to_string(&path).unwrap().replace("grpc_service: echo.Echo", "grpc_service: no.Such");
    std::fs::write(&path, text).unwrap();
    p.signal(libc::SIGHUP);
    wait_until("SERVICE_UNKNOWN marks it unhealthy", Duration::from_secs(5), || healthy() == 0.0);
}
