//! One Prometheus exposition out of several: with `process_model: multi_process` every worker process counts its
//! own traffic, and the master's `/metrics` adds them up, so a scrape sees one Portico whatever the process model.

use std::collections::HashMap;
use std::fmt::Write;

/// Families only the master knows: reloads are applied (and counted) there, worker restarts are its doing, and
/// certificate expiry is the same everywhere.
const MASTER_FAMILIES: [&str; 4] = [
    "portico_reloads_total",
    "portico_reload_failures_total",
    "portico_config_last_reload_successful",
    "portico_tls_certificate_expiry_timestamp_seconds",
];
/// Families both count: worker processes restarted by the master, worker threads restarted inside them.
const SHARED_FAMILIES: [&str; 1] = ["portico_worker_restarts_total"];

/// How samples of the same series from several workers combine.
fn combine(family: &str) -> fn(f64, f64) -> f64 {
    match family {
        // Healthy only when every worker process's own checks pass.
        "portico_endpoint_healthy" => f64::min,
        // Ejected when any worker process has ejected it.
        "portico_endpoint_ejected" => f64::max,
        // One table, shared by every worker process: each reports the same figures.
        "portico_rate_limit_evictions_total" | "portico_rate_limit_table_keys" => f64::max,
        // Counters, histograms and in-flight gauges add up.
        _ => |a, b| a + b,
    }
}

#[derive(Default)]
struct Family {
    header: Vec<String>,
    /// Series (name and labels) in first-seen order, with their values.
    samples: Vec<(String, f64)>,
    index: HashMap<String, usize>,
}

/// Families in the order they appear, by name.
fn parse(text: &str, into: &mut Vec<(String, Family)>, combine_values: bool) {
    let mut current: Option<usize> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default().to_string();
            let position = match into.iter().position(|(n, _)| *n == name) {
                Some(i) => i,
                None => {
                    into.push((name, Family::default()));
                    into.len() - 1
                }
            };
            let family = &mut into[position].1;
            if family.header.is_empty() {
                family.header.push(line.to_string());
            }
            current = Some(position);
            continue;
        }
        let Some(position) = current else { continue };
        let (name, family) = &mut into[position];
        if line.starts_with("# TYPE ") {
            if family.header.len() < 2 {
                family.header.push(line.to_string());
            }
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        match family.index.get(series) {
            Some(&i) if combine_values => {
                let slot = &mut family.samples[i].1;
                *slot = combine(name)(*slot, value);
            }
            Some(_) => {}
            None => {
                family.index.insert(series.to_string(), family.samples.len());
                family.samples.push((series.to_string(), value));
            }
        }
    }
}

/// The master's own exposition (`own`, for the families it alone knows) with the worker processes' (`workers`,
/// summed series by series for the rest).
pub fn merge_metrics(own: &str, workers: &[String]) -> String {
    let mut mine = Vec::new();
    parse(own, &mut mine, false);
    let mut theirs = Vec::new();
    for text in workers {
        parse(text, &mut theirs, true);
    }
    let mut out = String::with_capacity(own.len() + 1024);
    let mut names: Vec<&str> = mine.iter().map(|(n, _)| n.as_str()).collect();
    names.extend(theirs.iter().map(|(n, _)| n.as_str()).filter(|n| !mine.iter().any(|(m, _)| m == n)));
    for name in names {
        let header = &mine.iter().chain(&theirs).find(|(n, _)| n == name).map(|(_, f)| &f.header);
        for line in header.iter().flat_map(|h| h.iter()) {
            let _ = writeln!(out, "{line}");
        }
        let samples = |from: &Vec<(String, Family)>| -> Vec<(String, f64)> {
            from.iter().filter(|(n, _)| n == name).flat_map(|(_, f)| f.samples.clone()).collect()
        };
        let samples = if MASTER_FAMILIES.contains(&name) {
            samples(&mine)
        } else if SHARED_FAMILIES.contains(&name) {
            let mut all = samples(&mine);
            for (series, value) in samples(&theirs) {
                match all.iter_mut().find(|(s, _)| *s == series) {
                    Some((_, total)) => *total += value,
                    None => all.push((series, value)),
                }
            }
            all
        } else {
            samples(&theirs)
        };
        for (series, value) in &samples {
            if value.fract() == 0.0 && value.abs() < 1e15 {
                let _ = writeln!(out, "{series} {}", *value as i64);
            } else {
                let _ = writeln!(out, "{series} {value}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::merge_metrics;

    #[test]
    fn sums_workers_and_keeps_the_masters_own_families() {
        let own = "# HELP portico_requests_total R.\n# TYPE portico_requests_total counter\n\
                   # HELP portico_reloads_total L.\n# TYPE portico_reloads_total counter\nportico_reloads_total 2\n";
        let worker = |n: u32, healthy: u8| {
            format!(
                "# HELP portico_requests_total R.\n# TYPE portico_requests_total counter\n\
                 portico_requests_total{{route=\"a\",status_class=\"2xx\"}} {n}\n\
                 # HELP portico_request_duration_seconds D.\n# TYPE portico_request_duration_seconds histogram\n\
                 portico_request_duration_seconds_sum{{route=\"a\"}} 0.25\n\
                 # HELP portico_endpoint_healthy H.\n# TYPE portico_endpoint_healthy gauge\n\
                 portico_endpoint_healthy{{endpoint=\"e\"}} {healthy}\n\
                 # HELP portico_reloads_total L.\n# TYPE portico_reloads_total counter\nportico_reloads_total 7\n"
            )
        };
        let merged = merge_metrics(own, &[worker(3, 1), worker(4, 0)]);
        assert!(merged.contains("portico_requests_total{route=\"a\",status_class=\"2xx\"} 7\n"), "{merged}");
        assert!(merged.contains("portico_request_duration_seconds_sum{route=\"a\"} 0.5\n"), "{merged}");
        assert!(merged.contains("portico_endpoint_healthy{endpoint=\"e\"} 0\n"), "{merged}");
        assert!(merged.contains("portico_reloads_total 2\n") && !merged.contains(" 14\n"), "{merged}");
        let restarts = "# HELP portico_worker_restarts_total W.\n# TYPE portico_worker_restarts_total counter\n";
        let summed = merge_metrics(
            &format!("{restarts}portico_worker_restarts_total 1\n"),
            &[format!("{restarts}portico_worker_restarts_total 2\n"), String::new()],
        );
        assert!(summed.contains("portico_worker_restarts_total 3\n"), "{summed}");
        assert_eq!(merged.matches("# HELP portico_requests_total").count(), 1, "{merged}");
        // Families keep the master's order; ones only the workers have follow.
        assert!(merged.find("portico_requests_total").unwrap() < merged.find("portico_reloads_total").unwrap());
    }
}
