//! Portico's HTTP plane: a strict HTTP/1 codec, routing, balancers, upstream connection pools and the
//! streaming proxy, run on per-core worker threads.

pub mod balancer;
pub mod codec;
pub mod pool;
mod proxy;
pub mod router;
pub mod snapshot;
pub mod worker;

pub use snapshot::{build, HealthRegistry, Snapshot};
