//! Portico's HTTP plane: a strict HTTP/1 codec, the HTTP/2 server, normalising and routing, filters, route
//! targets, balancers, upstream connection pools and the streaming proxy. It runs on portico-core's worker
//! threads as a `Plane` (`plane::HttpPlane`).

pub mod access_log;
pub mod balancer;
mod body;
mod buffers;
mod client;
pub mod codec;
mod context;
mod date;
mod echo;
mod endpoint;
mod exec;
pub mod filters;
mod forward;
mod forward_h2;
mod h1_response;
mod h2_request;
mod h2_response;
pub mod handler;
pub mod health;
mod http2;
mod intake;
pub mod message;
pub mod metrics;
pub mod mqtt_publish;
mod outcome;
pub mod path;
pub mod pattern;
mod phases;
mod pipeline;
pub mod plane;
pub mod pool;
mod proxy;
pub mod recent_errors;
mod redirect;
mod registry;
mod relay;
mod request_buffer;
mod response_body;
mod retry;
pub mod router;
mod serve_h2;
mod serve_handler;
pub mod snapshot;
mod source_body;
pub mod stats;
pub mod stream_body;
pub mod subrequest;
mod tunnel;
mod upstream;
pub mod upstream_h2;
pub mod upstream_tls;
pub mod websocket;

pub use snapshot::{build, build_checked, Registry, Snapshot};
