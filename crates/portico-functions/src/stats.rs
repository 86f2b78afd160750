//! Per-function counters, kept across reloads by name (a function a reload brings back goes on counting), and
//! their Prometheus exposition for the functions in the running configuration.

use portico_core::view::PlaneView;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What a call ended in, for the counters.
#[derive(Debug, Clone, Copy)]
pub enum Ending {
    Answered,
    Exception,
    CpuLimit,
    MemoryLimit,
    Unsettled,
    ResponseTooLarge,
    WallLimit,
    ConcurrencyLimit,
}

#[derive(Debug, Default)]
pub struct FunctionStats {
    invocations: AtomicU64,
    errors: [AtomicU64; 7],
    /// Calls by CPU time, in the buckets of `CPU_BUCKETS` (cumulative when shown).
    cpu_buckets: [AtomicU64; CPU_BUCKETS.len()],
    runtimes_created: AtomicU64,
    run_nanos: AtomicU64,
}

const ERROR_KINDS: [&str; 7] =
    ["exception", "cpu_limit", "memory_limit", "unsettled", "response_too_large", "wall_limit", "concurrency_limit"];

/// Upper bounds (seconds) of the CPU-time histogram's buckets.
const CPU_BUCKETS: [f64; 11] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25];

impl FunctionStats {
    pub fn record(&self, ending: Ending, ran: std::time::Duration) {
        self.invocations.fetch_add(1, Ordering::Relaxed);
        self.run_nanos.fetch_add(ran.as_nanos() as u64, Ordering::Relaxed);
        let seconds = ran.as_secs_f64();
        if let Some(bucket) = CPU_BUCKETS.iter().position(|&le| seconds <= le) {
            self.cpu_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        let kind = match ending {
            Ending::Answered => return,
            Ending::Exception => 0,
            Ending::CpuLimit => 1,
            Ending::MemoryLimit => 2,
            Ending::Unsettled => 3,
            Ending::ResponseTooLarge => 4,
            Ending::WallLimit => 5,
            Ending::ConcurrencyLimit => 6,
        };
        self.errors[kind].fetch_add(1, Ordering::Relaxed);
    }

    pub fn runtime_created(&self) {
        self.runtimes_created.fetch_add(1, Ordering::Relaxed);
    }
}

static ALL: Mutex<BTreeMap<String, Arc<FunctionStats>>> = Mutex::new(BTreeMap::new());

/// The counters of function `name` (made on first use).
pub fn stats_for(name: &str) -> Arc<FunctionStats> {
    let mut all = ALL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    all.entry(name.to_string()).or_default().clone()
}

/// What the functions plane shows the admin server: its metrics, for the functions the running configuration
/// has (taken from the HTTP plane's, which holds them).
pub struct FunctionsView {
    pub running: Arc<dyn PlaneView>,
}

impl PlaneView for FunctionsView {
    fn render_metrics(&self, out: &mut String) {
        let config = self.running.running_config();
        let names: Vec<&String> = config.config.functions.keys().collect();
        if names.is_empty() {
            return;
        }
        let all = ALL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let running: Vec<(&String, &Arc<FunctionStats>)> =
            names.iter().filter_map(|n| all.get_key_value(n.as_str())).collect();
        let family = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(out, "portico_function_invocations_total", "counter", "Calls of a function, however they ended.");
        for (name, s) in &running {
            let n = s.invocations.load(Ordering::Relaxed);
            let _ = writeln!(out, "portico_function_invocations_total{{function=\"{}\"}} {n}", escape(name));
        }
        family(
            out,
            "portico_function_errors_total",
            "counter",
            "Calls that gave no response, by kind: exception, cpu_limit, memory_limit, unsettled, response_too_large, \
             wall_limit, concurrency_limit.",
        );
        for (name, s) in &running {
            for (kind, count) in ERROR_KINDS.iter().zip(&s.errors) {
                let n = count.load(Ordering::Relaxed);
                let _ =
                    writeln!(out, "portico_function_errors_total{{function=\"{}\",kind=\"{kind}\"}} {n}", escape(name));
            }
        }
        family(out, "portico_function_cpu_seconds", "histogram", "CPU time of each call running JavaScript.");
        for (name, s) in &running {
            let name = escape(name);
            let mut count = 0;
            for (le, bucket) in CPU_BUCKETS.iter().zip(&s.cpu_buckets) {
                count += bucket.load(Ordering::Relaxed);
                let _ = writeln!(out, "portico_function_cpu_seconds_bucket{{function=\"{name}\",le=\"{le}\"}} {count}");
            }
            let total = s.invocations.load(Ordering::Relaxed);
            let sum = s.run_nanos.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(out, "portico_function_cpu_seconds_bucket{{function=\"{name}\",le=\"+Inf\"}} {total}");
            let _ = writeln!(out, "portico_function_cpu_seconds_sum{{function=\"{name}\"}} {sum}");
            let _ = writeln!(out, "portico_function_cpu_seconds_count{{function=\"{name}\"}} {total}");
        }
        family(out, "portico_function_run_seconds_total", "counter", "CPU time spent running a function's calls.");
        for (name, s) in &running {
            let seconds = s.run_nanos.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(out, "portico_function_run_seconds_total{{function=\"{}\"}} {seconds}", escape(name));
        }
        family(
            out,
            "portico_function_runtimes_created_total",
            "counter",
            "Runtimes made for a function: one per worker per version, and again after a CPU or memory limit.",
        );
        for (name, s) in &running {
            let n = s.runtimes_created.load(Ordering::Relaxed);
            let _ = writeln!(out, "portico_function_runtimes_created_total{{function=\"{}\"}} {n}", escape(name));
        }
    }

    /// `functions`: each function the running configuration has, with its calls, errors by kind, runtimes made
    /// and CPU time so far.
    fn admin_view(&self, name: &str) -> Option<serde_json::Value> {
        if name != "functions" {
            return None;
        }
        let config = self.running.running_config();
        let all = ALL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let list: Vec<serde_json::Value> = config
            .config
            .functions
            .keys()
            .map(|name| {
                let s = all.get(name);
                let load = |c: Option<&AtomicU64>| c.map_or(0, |c| c.load(Ordering::Relaxed));
                let errors: serde_json::Map<String, serde_json::Value> = ERROR_KINDS
                    .iter()
                    .enumerate()
                    .map(|(i, kind)| (kind.to_string(), load(s.map(|s| &s.errors[i])).into()))
                    .collect();
                serde_json::json!({
                    "name": name,
                    "invocations": load(s.map(|s| &s.invocations)),
                    "errors": errors,
                    "runtimes_created": load(s.map(|s| &s.runtimes_created)),
                    "cpu_seconds": load(s.map(|s| &s.run_nanos)) as f64 / 1e9,
                })
            })
            .collect();
        Some(serde_json::json!({ "functions": list }))
    }

    /// Calls (`requests`) and calls that gave no response (`errors`) of each running function.
    fn sample(&self, out: &mut Vec<portico_core::view::SeriesSample>) {
        let config = self.running.running_config();
        let all = ALL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for name in config.config.functions.keys() {
            let Some(s) = all.get(name) else { continue };
            out.push(portico_core::view::SeriesSample {
                kind: "function",
                name: name.clone(),
                requests: s.invocations.load(Ordering::Relaxed),
                errors: s.errors.iter().map(|e| e.load(Ordering::Relaxed)).sum(),
                latency: None,
            });
        }
    }

    fn running_config(&self) -> Arc<portico_config::LoadedConfig> {
        self.running.running_config()
    }
}

fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
