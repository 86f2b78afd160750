//! A function as a route target: `portico_http::handler::Handler`, its `fetch` handler answering.

use crate::function::{input_of, run, AnswerBody, Compiled};
use crate::instance::Hook;
use bytes::Bytes;
use http_body_util::BodyExt;
use portico_http::codec::BodyFraming;
use portico_http::handler::{boxed, full, Handler, HandlerFuture, Request};
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

/// A request body up to this size whose length is known is read before the call (one piece, no pulls);
/// larger ones and chunked ones stream to the handler as it reads.
const READ_BEFORE: u64 = 64 * 1024;

/// Most header fields a function's response may have.
const MAX_HEADERS: usize = 1000;

impl Handler for FunctionHandler {
    fn handle<'a>(&self, req: Request<'a>) -> HandlerFuture<'a> {
        let compiled = self.compiled.clone();
        Box::pin(async move {
            let upstreams = req.upstreams.clone();
            let headers = portico_http::handler::forwarded_headers(&req.head);
            let mut input = input_of(&req.head, req.client.https, headers, Vec::new());
            let small = match req.head.body {
                BodyFraming::None => Some(0),
                BodyFraming::Length(n) if n <= READ_BEFORE.min(compiled.max_request as u64) => Some(n),
                _ => None,
            };
            let body = match small {
                Some(0) => None,
                Some(_) => {
                    let read = http_body_util::Limited::new(req.body, compiled.max_request).collect().await;
                    input.body = match read {
                        Ok(collected) => collected.to_bytes().to_vec(),
                        Err(e) => return Err(e),
                    };
                    None
                }
                None => {
                    input.streamed = true;
                    Some(req.body)
                }
            };
            Ok(match run(&compiled, input, upstreams, Hook::Fetch, body).await {
                Ok(answer) => {
                    let body = match answer.body {
                        AnswerBody::Whole(bytes) => full(bytes),
                        AnswerBody::Streamed(stream) => boxed(stream),
                    };
                    let mut response = hyper::Response::new(body);
                    *response.status_mut() =
                        hyper::StatusCode::from_u16(answer.status).unwrap_or(hyper::StatusCode::OK);
                    // At most `MAX_HEADERS` fields: a header map has a fixed capacity, and no client wants more.
                    for (k, v) in answer.headers.into_iter().take(MAX_HEADERS) {
                        let name = hyper::header::HeaderName::from_bytes(k.as_bytes());
                        let value = hyper::header::HeaderValue::from_str(&v);
                        if let (Ok(name), Ok(value)) = (name, value) {
                            let _ = response.headers_mut().try_append(name, value);
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
