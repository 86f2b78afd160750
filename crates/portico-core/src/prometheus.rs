//! Writing the Prometheus text exposition format: families with their help and type, labels escaped,
//! histograms summed over per-worker slots.

use crate::stats::{sum_histograms, Histogram, BUCKETS, CLASS_LABELS};
use std::fmt::Write;

/// A metric read from one per-worker slot: name, type, help, how to read it.
pub type SlotMetric<T> = (&'static str, &'static str, &'static str, fn(&T) -> i64);

pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

pub fn histogram<'a>(out: &mut String, name: &str, labels: &str, hs: impl Iterator<Item = &'a Histogram>) {
    let totals = sum_histograms(hs);
    for (i, bound) in BUCKETS.iter().enumerate() {
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {}", totals.cumulative[i]);
    }
    let count = totals.cumulative[BUCKETS.len()];
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", totals.sum_seconds);
    let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
}

/// One sample per status class that has been seen; `count(i)` sums class `i` over the workers.
pub fn by_class(out: &mut String, name: &str, labels: &str, count: impl Fn(usize) -> u64) {
    for (class, label) in CLASS_LABELS.iter().enumerate() {
        let n = count(class);
        if n > 0 {
            let _ = writeln!(out, "{name}{{{labels},status_class=\"{label}\"}} {n}");
        }
    }
}
