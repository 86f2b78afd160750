//! The dashboard's charts without Prometheus: once a second the admin server samples every plane's counters
//! (`PlaneView::sample`) and keeps, per series, the last 15 minutes of requests per second, errors per second and
//! the p50 and p99 latency of that second, in a ring. The workers are not involved: they count as they always do.

use portico_core::stats::BUCKETS;
use portico_core::view::SeriesSample;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Points kept: 15 minutes of one-second steps.
pub const WINDOW: usize = 900;
/// Series kept at most (routes, clusters, endpoints, ...): past it, new series are not charted.
pub const MAX_SERIES: usize = 400;

type Key = (&'static str, String);

/// One second of one series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub rps: f32,
    pub eps: f32,
    /// Milliseconds; NaN when nothing was measured in that second.
    pub p50: f32,
    pub p99: f32,
}

const EMPTY: Point = Point { rps: f32::NAN, eps: f32::NAN, p50: f32::NAN, p99: f32::NAN };

#[derive(Debug, Default)]
struct Track {
    points: VecDeque<Point>,
}

#[derive(Debug, Default)]
pub struct Series {
    /// Unix seconds of each step, oldest first.
    times: VecDeque<u64>,
    tracks: BTreeMap<Key, Track>,
    /// The counters of the previous sample, and when it was taken (monotonic seconds).
    last: HashMap<Key, SeriesSample>,
    last_at: Option<f64>,
}

impl Series {
    /// Adds a step from `samples` taken at `now_unix` (seconds since the epoch) and `mono` (a monotonic clock in
    /// seconds): each series' differences from the previous sample, divided by the time between them.
    pub fn push(&mut self, now_unix: u64, mono: f64, samples: Vec<SeriesSample>) {
        let elapsed = self.last_at.map(|t| mono - t).filter(|&e| e > 0.05);
        self.last_at = Some(mono);
        let mut next_last = HashMap::with_capacity(samples.len());
        let mut step: HashMap<Key, Point> = HashMap::with_capacity(samples.len());
        for s in samples {
            let key = (s.kind, s.name.clone());
            if let (Some(elapsed), Some(before)) = (elapsed, self.last.get(&key)) {
                step.insert(key.clone(), difference(before, &s, elapsed as f32));
            }
            next_last.insert(key, s);
        }
        self.last = next_last;
        if elapsed.is_none() {
            return;
        }
        self.times.push_back(now_unix);
        let full = self.times.len() > WINDOW;
        if full {
            self.times.pop_front();
        }
        let steps = self.times.len();
        for key in step.keys() {
            if !self.tracks.contains_key(key) && self.tracks.len() < MAX_SERIES {
                let mut track = Track::default();
                // A new series has had nothing before: its past steps are empty.
                track.points.extend(std::iter::repeat_n(EMPTY, steps.saturating_sub(1)));
                self.tracks.insert(key.clone(), track);
            }
        }
        self.tracks.retain(|key, track| {
            track.points.push_back(step.get(key).copied().unwrap_or(EMPTY));
            if track.points.len() > steps {
                track.points.pop_front();
            }
            // A series that a reload removed goes once it has no point left in the window.
            track.points.iter().any(|p| !p.rps.is_nan())
        });
    }

    /// The last step of every series, and its time.
    pub fn latest(&self) -> Option<(u64, Vec<(&Key, Point)>)> {
        let t = *self.times.back()?;
        let points = self.tracks.iter().filter_map(|(k, tr)| tr.points.back().map(|p| (k, *p))).collect();
        Some((t, points))
    }

    /// `/admin/series`: the whole window, as columns.
    pub fn to_json(&self) -> serde_json::Value {
        let series: Vec<serde_json::Value> = self
            .tracks
            .iter()
            .map(|((kind, name), track)| {
                let column = |f: fn(&Point) -> f32| -> Vec<serde_json::Value> {
                    track.points.iter().map(|p| number(f(p))).collect()
                };
                serde_json::json!({
                    "kind": kind,
                    "name": name,
                    "rps": column(|p| p.rps),
                    "eps": column(|p| p.eps),
                    "p50_ms": column(|p| p.p50),
                    "p99_ms": column(|p| p.p99),
                })
            })
            .collect();
        serde_json::json!({ "step_s": 1, "t": self.times, "series": series })
    }
}

/// A number, or null when not measured; rounded to what a chart shows.
pub fn number(v: f32) -> serde_json::Value {
    if v.is_finite() {
        serde_json::Value::from((f64::from(v) * 1000.0).round() / 1000.0)
    } else {
        serde_json::Value::Null
    }
}

fn difference(before: &SeriesSample, now: &SeriesSample, elapsed: f32) -> Point {
    let requests = now.requests.saturating_sub(before.requests) as f32;
    let errors = now.errors.saturating_sub(before.errors) as f32;
    let (p50, p99) = match (&before.latency, &now.latency) {
        (Some(b), Some(n)) => {
            let mut counts = [0u64; BUCKETS.len() + 1];
            for ((c, b), n) in counts.iter_mut().zip(b.iter()).zip(n.iter()) {
                *c = n.saturating_sub(*b);
            }
            (quantile(&counts, 0.5), quantile(&counts, 0.99))
        }
        _ => (f32::NAN, f32::NAN),
    };
    Point { rps: requests / elapsed, eps: errors / elapsed, p50, p99 }
}

/// The `q` quantile in milliseconds of a histogram's counts per bucket (`BUCKETS`, then +Inf), interpolated
/// linearly within its bucket as Prometheus' `histogram_quantile` does; NaN without observations.
pub fn quantile(counts: &[u64; BUCKETS.len() + 1], q: f64) -> f32 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return f32::NAN;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (i, &n) in counts.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let lower = if i == 0 { 0.0 } else { BUCKETS[i - 1] };
            // The +Inf bucket has no upper bound: its observations are reported at the last finite bound.
            let Some(&upper) = BUCKETS.get(i) else { return (lower * 1000.0) as f32 };
            let within = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            return ((lower + (upper - lower) * within) * 1000.0) as f32;
        }
        below += n;
    }
    (BUCKETS[BUCKETS.len() - 1] * 1000.0) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(requests: u64, errors: u64, latency: [u64; BUCKETS.len() + 1]) -> SeriesSample {
        SeriesSample { kind: "route", name: "r".into(), requests, errors, latency: Some(Box::new(latency)) }
    }

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let mut counts = [0u64; BUCKETS.len() + 1];
        counts[1] = 100; // (0.5 ms, 1 ms]
        assert!((quantile(&counts, 0.5) - 0.75).abs() < 1e-4, "{}", quantile(&counts, 0.5));
        counts[BUCKETS.len()] = 100; // over 10 s
        assert_eq!(quantile(&counts, 0.99), 10_000.0);
        assert!(quantile(&[0; BUCKETS.len() + 1], 0.5).is_nan());
    }

    #[test]
    fn steps_are_differences_per_second_and_the_window_is_bounded() {
        let mut s = Series::default();
        let mut latency = [0u64; BUCKETS.len() + 1];
        s.push(100, 0.0, vec![sample(0, 0, latency)]);
        assert!(s.latest().is_none(), "the first sample only sets the baseline");
        latency[4] = 10; // (5 ms, 10 ms]
        s.push(101, 2.0, vec![sample(20, 4, latency)]);
        let (t, points) = s.latest().expect("a step");
        assert_eq!(t, 101);
        assert_eq!(points[0].1.rps, 10.0);
        assert_eq!(points[0].1.eps, 2.0);
        assert!((points[0].1.p50 - 7.5).abs() < 1e-3);
        for i in 0..(WINDOW as u64 + 50) {
            s.push(102 + i, 3.0 + i as f64, vec![sample(20, 4, latency)]);
        }
        assert_eq!(s.times.len(), WINDOW);
        assert_eq!(s.tracks.values().next().map(|t| t.points.len()), Some(WINDOW));
        // A series gone from the samples leaves once its last point has left the window.
        for i in 0..(WINDOW as u64 + 1) {
            s.push(2000 + i, 2000.0 + i as f64, Vec::new());
        }
        assert!(s.tracks.is_empty());
    }
}
