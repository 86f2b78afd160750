//! What the dashboard reads: the overview (charts' latest step, clusters, listeners, recent errors, reloads, and
//! the functions and MQTT sections when configured), the sampling task that feeds the charts' ring, and the live
//! updates (`/admin/events`, server-sent events): one overview a second, made once and written to every page.

use crate::series::{number, Series};
use crate::{history::History, json, AdminState, Body};
use bytes::Bytes;
use hyper::{Response, StatusCode};
use portico_core::stats::BUCKETS;
use portico_core::view::SeriesSample;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

/// Pages that may follow the live updates at once; more are answered 503.
pub const MAX_LIVE_PAGES: usize = 64;
/// Recent errors an update carries (`/admin/errors` has them all).
const ERRORS_IN_UPDATE: usize = 25;
/// Recent errors `/admin/errors` shows with worker processes (each keeps its own last 100).
pub const KEPT_ERRORS: usize = 100;

/// The dashboard's state in the admin server.
#[derive(Debug, Default)]
pub struct Dashboard {
    pub series: Mutex<Series>,
    pub history: Mutex<History>,
    /// The pages following `/admin/events`: each gets the same update once a second.
    live: Mutex<Vec<mpsc::Sender<Bytes>>>,
}

/// Samples every plane once a second into the charts' ring; while pages follow the live updates, makes one
/// overview and hands it to each (a page that has not taken the previous ones misses this one).
pub async fn sample_every_second(state: Arc<AdminState>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let started = std::time::Instant::now();
    loop {
        tick.tick().await;
        let samples = match state.workers.clone() {
            // With worker processes, the counters are theirs: each answers with its samples, summed here.
            Some(gather) => {
                let answers = tokio::task::spawn_blocking(move || gather("sample")).await.unwrap_or_default();
                sum_workers(&answers)
            }
            None => {
                let mut samples = Vec::with_capacity(64);
                for plane in &state.planes {
                    plane.sample(&mut samples);
                }
                samples
            }
        };
        let mut samples = samples;
        add_total(&mut samples);
        let now = unix_ms() / 1000;
        state.dashboard.series.lock().unwrap_or_else(|p| p.into_inner()).push(
            now,
            started.elapsed().as_secs_f64(),
            samples,
        );
        if state.dashboard.live.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            continue;
        }
        let event = Bytes::from(format!("data: {}\n\n", overview(&state).await));
        state.dashboard.live.lock().unwrap_or_else(|p| p.into_inner()).retain(|page| {
            match page.try_send(event.clone()) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => true,
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }
}

/// The samples of every worker process (each a JSON array of `SeriesSample::to_json`), summed by series.
fn sum_workers(answers: &[String]) -> Vec<SeriesSample> {
    let mut by_key: std::collections::BTreeMap<(&'static str, String), SeriesSample> = Default::default();
    for answer in answers {
        let Ok(serde_json::Value::Array(list)) = serde_json::from_str(answer) else { continue };
        for s in list.iter().filter_map(SeriesSample::from_json) {
            match by_key.get_mut(&(s.kind, s.name.clone())) {
                Some(sum) => sum.add(&s),
                None => {
                    by_key.insert((s.kind, s.name.clone()), s);
                }
            }
        }
    }
    by_key.into_values().collect()
}

/// The recent errors: this process's, or with worker processes every one's, newest first.
async fn recent_errors(state: &AdminState) -> serde_json::Value {
    let Some(gather) = state.workers.clone() else {
        return state
            .planes
            .iter()
            .find_map(|p| p.admin_view("errors"))
            .unwrap_or_else(|| serde_json::json!({ "errors": [] }));
    };
    let answers = tokio::task::spawn_blocking(move || gather("errors")).await.unwrap_or_default();
    let mut all: Vec<serde_json::Value> = answers
        .iter()
        .filter_map(|a| serde_json::from_str::<serde_json::Value>(a).ok())
        .filter_map(|v| v["errors"].as_array().cloned())
        .flatten()
        .collect();
    all.sort_by_key(|e| std::cmp::Reverse(e["at_ms"].as_u64().unwrap_or(0)));
    all.truncate(crate::dashboard::KEPT_ERRORS);
    serde_json::json!({ "errors": all })
}

/// The `total` series: every route's requests, errors and latencies together.
fn add_total(samples: &mut Vec<SeriesSample>) {
    let mut total = SeriesSample {
        kind: "total",
        name: "all".into(),
        requests: 0,
        errors: 0,
        latency: Some(Box::new([0; BUCKETS.len() + 1])),
    };
    for s in samples.iter().filter(|s| s.kind == "route") {
        total.requests += s.requests;
        total.errors += s.errors;
        if let (Some(sum), Some(l)) = (total.latency.as_mut(), &s.latency) {
            for (t, n) in sum.iter_mut().zip(l.iter()) {
                *t += n;
            }
        }
    }
    samples.push(total);
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `/admin/errors`.
pub async fn errors(state: &AdminState) -> serde_json::Value {
    recent_errors(state).await
}

/// `/admin/clusters`: with worker processes, the first one's view (each runs its own checks).
pub async fn clusters(state: &AdminState) -> serde_json::Value {
    let first = match state.workers.clone() {
        Some(gather) => tokio::task::spawn_blocking(move || gather("clusters"))
            .await
            .unwrap_or_default()
            .into_iter()
            .find_map(|answer| serde_json::from_str(&answer).ok()),
        None => None,
    };
    let own = || state.planes.iter().find_map(|p| p.admin_view("clusters"));
    first.or_else(own).unwrap_or_else(|| serde_json::json!({ "clusters": [] }))
}

/// `/admin/overview`, and each live update.
pub async fn overview(state: &AdminState) -> serde_json::Value {
    let config = state.planes.first().map(|p| p.running_config());
    let view = |name: &str| state.planes.iter().find_map(|p| p.admin_view(name));
    let (t, latest) = {
        let series = state.dashboard.series.lock().unwrap_or_else(|p| p.into_inner());
        match series.latest() {
            Some((t, points)) => {
                let list: Vec<serde_json::Value> = points
                    .into_iter()
                    .map(|((kind, name), p)| {
                        serde_json::json!({
                            "kind": kind, "name": name,
                            "rps": number(p.rps), "eps": number(p.eps), "p50_ms": number(p.p50), "p99_ms": number(p.p99),
                        })
                    })
                    .collect();
                (Some(t), list)
            }
            None => (None, Vec::new()),
        }
    };
    let mut errors = recent_errors(state).await;
    if let Some(list) = errors["errors"].as_array_mut() {
        list.truncate(ERRORS_IN_UPDATE);
    }
    let (reloads, last_reload) = {
        let history = state.dashboard.history.lock().unwrap_or_else(|p| p.into_inner());
        (history.last_id(), state.last_reload.lock().unwrap_or_else(|p| p.into_inner()).clone())
    };
    let has_mqtt = config.as_ref().is_some_and(|c| {
        c.config.listeners.iter().any(|l| l.protocol == portico_config::ListenerProtocol::Mqtt)
            || c.config.routes.iter().any(|r| r.mqtt.is_some())
    });
    let has_functions = config.as_ref().is_some_and(|c| !c.config.functions.is_empty());
    serde_json::json!({
        "t": t,
        "process": { "pid": std::process::id(), "version": state.version, "worker_processes": state.workers.is_some() },
        "ready": state.ready.load(std::sync::atomic::Ordering::SeqCst),
        "token_required": state.guard.has_token(),
        "reload_available": state.reload.is_some(),
        "series": latest,
        "clusters": clusters(state).await["clusters"],
        "listeners": view("listeners").map(|l| l["listeners"].clone()),
        "errors": errors["errors"],
        "reloads": {
            "last_id": reloads,
            "last_attempt_ms": last_reload.at_ms,
            "last_ok": last_reload.at_ms.map(|_| last_reload.ok),
        },
        "functions": if has_functions { view("functions").map(|f| f["functions"].clone()) } else { None },
        "mqtt": if has_mqtt { view("mqtt") } else { None },
    })
}

/// `/admin/events`: the overview once a second, as server-sent events.
pub async fn events(state: &Arc<AdminState>) -> Response<Body> {
    let (tx, rx) = mpsc::channel(2);
    {
        let mut live = state.dashboard.live.lock().unwrap_or_else(|p| p.into_inner());
        live.retain(|page| !page.is_closed());
        if live.len() >= MAX_LIVE_PAGES {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({ "error": format!("{MAX_LIVE_PAGES} pages follow the live updates already") }),
            );
        }
        live.push(tx);
    }
    // The page has the overview from `/admin/overview` already: the stream starts with the next second's.
    let first = Bytes::from_static(b"retry: 2000\n\n");
    let mut r = Response::new(http_body_util::Either::Right(LiveBody { first: Some(first), rx }));
    let headers = r.headers_mut();
    headers.insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/event-stream"));
    headers.insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-store"));
    r
}

/// The body of `/admin/events`: each update as it comes, until the page goes (or the process does).
#[derive(Debug)]
pub struct LiveBody {
    first: Option<Bytes>,
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for LiveBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(first))));
        }
        self.rx.poll_recv(cx).map(|update| update.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}
