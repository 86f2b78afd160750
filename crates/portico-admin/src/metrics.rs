//! Prometheus text exposition: the process-wide counters here, each plane's own through its `PlaneView`.

use portico_core::prometheus::header;
use portico_core::stats::Global;
use portico_core::view::PlaneView;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Renders every metric: the planes' in order, then the process's.
pub fn render(planes: &[Arc<dyn PlaneView>], global: &Global, reload_ok: bool) -> String {
    let mut out = String::with_capacity(16 * 1024);
    for plane in planes {
        plane.render_metrics(&mut out);
    }
    let g = global;
    header(&mut out, "portico_reloads_total", "counter", "Configuration reloads applied.");
    let _ = writeln!(out, "portico_reloads_total {}", g.reloads.load(Ordering::Relaxed));
    header(
        &mut out,
        "portico_reload_failures_total",
        "counter",
        "Reloads refused because the new configuration was invalid.",
    );
    let _ = writeln!(out, "portico_reload_failures_total {}", g.reload_failures.load(Ordering::Relaxed));
    header(&mut out, "portico_config_last_reload_successful", "gauge", "0 when the last reload attempt failed.");
    let _ = writeln!(out, "portico_config_last_reload_successful {}", u8::from(reload_ok));
    header(
        &mut out,
        "portico_access_log_dropped_total",
        "counter",
        "Access-log batches dropped because the writer fell behind.",
    );
    let _ = writeln!(out, "portico_access_log_dropped_total {}", g.access_log_dropped.load(Ordering::Relaxed));
    header(
        &mut out,
        "portico_worker_restarts_total",
        "counter",
        "Worker threads (or worker processes) started again after they died.",
    );
    let _ = writeln!(out, "portico_worker_restarts_total {}", g.worker_restarts.load(Ordering::Relaxed));
    out
}
