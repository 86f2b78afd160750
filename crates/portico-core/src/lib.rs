//! What every plane of Portico stands on: listening sockets (bound, inherited from systemd or an upgrade,
//! changed by reloads) and the worker threads that accept on them with their supervisor, TLS termination, the
//! byte-stream type, per-worker counters, the access log's writer, systemd notification, the upgrade's socket
//! hand-over, worker processes (`process_model: multi_process`) and what a plane shows the admin server. Depends on portico-config only; the planes (portico-http, later portico-mqtt) depend on
//! it, never the other way round.

pub mod access_log;
pub mod idle;
pub mod io;
pub mod listeners;
pub mod metrics_merge;
pub mod panic;
pub mod password;
pub mod process_setup;
pub mod processes;
pub mod prometheus;
pub mod rate_table;
pub mod shared;
pub mod stats;
pub mod supervisor;
pub mod systemd;
pub mod tls;
pub mod upgrade;
pub mod view;
pub mod watch;
pub mod worker;
