//! Portico's HTTP plane: a strict HTTP/1 codec, routing, balancers, upstream connection pools and the
//! streaming proxy, run on per-core worker threads.

pub mod access_log;
pub mod balancer;
mod body;
mod buffers;
mod client;
pub mod codec;
mod context;
mod echo;
mod endpoint;
pub mod filters;
mod forward;
mod forward_h2;
pub mod handler;
pub mod health;
mod http2;
mod io;
pub mod message;
mod outcome;
pub mod path;
pub mod pattern;
mod phases;
mod pipeline;
pub mod pool;
mod proxy;
mod redirect;
mod registry;
mod relay;
mod response_body;
mod retry;
pub mod router;
mod serve_h2;
mod serve_handler;
pub mod shared;
pub mod snapshot;
pub mod stats;
pub mod stream_body;
pub mod tls;
mod tunnel;
mod upstream;
pub mod upstream_h2;
pub mod upstream_tls;
pub mod worker;

pub use context::panic_message;
pub use snapshot::{build, Registry, Snapshot};
