//! A function as a route target: `portico_http::handler::Handler`, its `fetch` handler answering.

use crate::function::{input_of, run, Compiled};
use crate::instance::Hook;
use bytes::Bytes;
use http_body_util::BodyExt;
use portico_http::handler::{full, Handler, HandlerFuture, Request};
use std::sync::Arc;

#[derive(Debug)]
pub struct FunctionHandler {
    compiled: Arc<Compiled>,
}

impl FunctionHandler {
    pub fn new(compiled: Arc<Compiled>) -> FunctionHandler {
        FunctionHandler { compiled }
    }
}

impl Handler for FunctionHandler {
    fn handle<'a>(&self, req: Request<'a>) -> HandlerFuture<'a> {
        let compiled = self.compiled.clone();
        Box::pin(async move {
            let upstreams = req.upstreams.clone();
            let too_large =
                || answer(413, format!("request body larger than function {}'s max_request", compiled.name));
            if let portico_http::codec::BodyFraming::Length(n) = req.head.body {
                if n > compiled.max_request as u64 {
                    return Ok(too_large()); // before any of it is read
                }
            }
            let body = match http_body_util::Limited::new(req.body, compiled.max_request).collect().await {
                Ok(collected) => collected.to_bytes().to_vec(),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => return Ok(too_large()),
                Err(e) => return Err(e),
            };
            let headers = portico_http::handler::forwarded_headers(&req.head);
            let input = input_of(&req.head, req.client.https, headers, body);
            Ok(match run(&compiled, input, upstreams, Hook::Fetch).await {
                Ok(out) => {
                    let mut response = hyper::Response::new(full(Bytes::from(out.body)));
                    *response.status_mut() = hyper::StatusCode::from_u16(out.status).unwrap_or(hyper::StatusCode::OK);
                    for (k, v) in out.headers {
                        let name = hyper::header::HeaderName::from_bytes(k.as_bytes());
                        let value = hyper::header::HeaderValue::from_str(&v);
                        if let (Ok(name), Ok(value)) = (name, value) {
                            response.headers_mut().append(name, value);
                        }
                    }
                    response
                }
                Err(refused) => answer(refused.status, refused.reason),
            })
        })
    }
}

fn answer(status: u16, reason: String) -> portico_http::handler::Response<'static> {
    let mut response = hyper::Response::new(full(Bytes::from(reason + "\n")));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}
