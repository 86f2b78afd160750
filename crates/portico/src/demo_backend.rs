//! The demo's built-in backends: tiny HTTP servers on loopback that say who they are (`hello from NAME`)
//! and, on `/echo`, what they received. Part of the binary rather than the test kit, which the release
//! binary does not link.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use std::convert::Infallible;
use std::net::SocketAddr;

pub struct DemoBackend {
    pub name: String,
    pub addr: SocketAddr,
}

/// Starts one backend on a free loopback port, on its own thread.
pub fn start(name: &str) -> std::io::Result<DemoBackend> {
    start_on(SocketAddr::from(([127, 0, 0, 1], 0)), name)
}

/// Starts one backend on `addr`, on its own thread.
pub fn start_on(addr: SocketAddr, name: &str) -> std::io::Result<DemoBackend> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let owned = name.to_string();
    std::thread::Builder::new().name(format!("demo-{name}")).spawn(move || {
        runtime.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let name = owned.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| answer(req, name.clone()));
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        })
    })?;
    Ok(DemoBackend { name: name.to_string(), addr })
}

async fn answer(req: Request<Incoming>, name: String) -> Result<Response<Full<Bytes>>, Infallible> {
    let text = if req.uri().path() == "/echo" {
        let mut text = format!("{name} received:\n{} {} {:?}\n", req.method(), req.uri(), req.version());
        for (header, value) in req.headers() {
            text.push_str(&format!("{header}: {}\n", String::from_utf8_lossy(value.as_bytes())));
        }
        let body = req.into_body().collect().await.map(|b| b.to_bytes().len()).unwrap_or(0);
        text.push_str(&format!("({body} body bytes)\n"));
        text
    } else {
        format!("hello from {name}\n")
    };
    let mut response = Response::new(Full::new(Bytes::from(text)));
    response.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"));
    if let Ok(value) = hyper::header::HeaderValue::from_str(&name) {
        response.headers_mut().insert("x-backend", value);
    }
    Ok(response)
}
