//! The request's phases before its target, in one place for HTTP/1 and HTTP/2:
//!
//! ```text
//! read head -> normalise path -> route -> redirect_https -> request filters -> function filters -> target
//!                  |               |                            |                  |               |
//!                 400             404                     early answer       early answer    static / redirect
//! ```
//!
//! Function filters may wait (on a `fetch`, a timer): `front` stops before them with `Front::Gated`, and the
//! caller awaits `pass_gates`, which ends the same way `front` would have.
//!
//! A cluster target is the caller's to forward, a handler target the caller's to run; everything else ends
//! here in a `LocalResponse`. Response
//! filters run when a response head is written (see `filters`), whoever wrote it.

use crate::codec::{HeadError, RequestHead};
use crate::filters::{RequestCx, Step, Wait};
use crate::handler::{ClientInfo, Upstreams};
use crate::message::LocalResponse;
use crate::pattern::Captured;
use crate::router::{CompiledRoute, Target};
use crate::snapshot::{ListenerSettings, Snapshot};
use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

/// What the phases before the target decided.
pub(crate) enum Front {
    /// Forward to the route's cluster.
    Cluster { route: usize, cluster: usize },
    /// Answer with this response (a local target, a filter's answer, a redirect to HTTPS); a static target's
    /// is shared, not copied per request.
    Answer { route: usize, response: Arc<LocalResponse> },
    /// Answer with this in-process handler; `params` are the route's path parameters by name.
    Handler { route: usize, handler: Arc<dyn crate::handler::Handler>, params: Vec<(String, String)> },
    /// Hand the connection to this WebSocket endpoint once the handshake is answered (HTTP/1 only).
    WebSocket { route: usize, endpoint: crate::router::WebSocketEndpoint },
    /// The route's function filters must run first, or a request filter waits for work off the worker's
    /// thread: `pass_gates` then finishes the filters and decides the target.
    Gated { route: usize, captured: Box<Waiting> },
    /// No route matches.
    NoRoute,
    /// The path cannot be normalised: 400, and the connection is closed.
    BadPath(HeadError),
}

impl Front {
    pub fn route(&self) -> Option<usize> {
        match self {
            Front::Cluster { route, .. }
            | Front::Answer { route, .. }
            | Front::Handler { route, .. }
            | Front::WebSocket { route, .. }
            | Front::Gated { route, .. } => Some(*route),
            Front::NoRoute | Front::BadPath(_) => None,
        }
    }
}

/// Where the filters of a `Front::Gated` request stopped: what the route captured, and the request filter
/// that waits (with the index of the next one), if one does.
pub(crate) struct Waiting {
    captured: Captured,
    wait: Option<(Wait, usize)>,
}

/// Normalises, routes and filters `head`; `https`: whether the client came over TLS; `peer`: the client's
/// address.
pub(crate) fn front(
    head: &mut RequestHead,
    snapshot: &Snapshot,
    settings: &ListenerSettings,
    https: bool,
    peer: IpAddr,
) -> Front {
    let normalized = match crate::path::normalize(head.path(), &settings.paths) {
        Ok(Cow::Borrowed(_)) => None,
        Ok(Cow::Owned(path)) => Some(path),
        Err(e) => return Front::BadPath(HeadError { status: 400, reason: e.reason }),
    };
    if let Some(path) = normalized {
        head.set_path(&path);
    }
    let Some((index, captured)) = snapshot.router.find(head) else {
        return Front::NoRoute;
    };
    let Some(route) = snapshot.router.get(index) else {
        return Front::NoRoute;
    };
    if let Some(redirect) = route.redirect_https.filter(|_| !https) {
        let response = match head.host_name() {
            Some(host) => LocalResponse::empty(
                redirect.status_for(head.method()),
                vec![("location".into(), crate::redirect::https_location(host, redirect.port, head).into())],
            ),
            None => LocalResponse::text(400, "a redirect to HTTPS needs the Host header"),
        };
        return Front::Answer { route: index, response: Arc::new(response) };
    }
    if let Some(chain) = &route.filters {
        let cx = context(route, &captured, peer);
        for (i, f) in chain.iter().enumerate() {
            match f.on_request(head, &cx) {
                Step::Continue => {}
                Step::Respond(response) => return Front::Answer { route: index, response: Arc::new(response) },
                Step::Wait(wait) => {
                    let waiting = Waiting { captured, wait: Some((wait, i + 1)) };
                    return Front::Gated { route: index, captured: Box::new(waiting) };
                }
            }
        }
    }
    if route.gates.is_some() {
        return Front::Gated { route: index, captured: Box::new(Waiting { captured, wait: None }) };
    }
    target(head, index, route, &captured, https)
}

/// What the request filters of `route` are given.
fn context<'a>(route: &'a CompiledRoute, captured: &'a Captured, peer: IpAddr) -> RequestCx<'a> {
    RequestCx {
        matched_path: &captured.path,
        captures: &captured.ranges,
        prefix: route.prefix(),
        peer: peer.to_canonical(),
        denials: &route.denials,
    }
}

/// Waits for `wait`, then runs the request filters of `route` from `next` on (waiting again for any that
/// waits): the answer of one that answered, if one did.
async fn finish_filters(
    head: &mut RequestHead,
    route: &CompiledRoute,
    cx: &RequestCx<'_>,
    (wait, mut next): (Wait, usize),
) -> Option<LocalResponse> {
    let mut step = Step::Wait(wait);
    loop {
        match step {
            Step::Continue => {}
            Step::Respond(response) => return Some(response),
            Step::Wait(wait) => {
                let resume = wait.await;
                step = resume(head, cx);
                continue;
            }
        }
        let f = route.filters.as_ref()?.get(next)?;
        next += 1;
        step = f.on_request(head, cx);
    }
}

/// Runs the function filters of route `index` on `head`, then decides its target as `front` does: the
/// answer of a filter that answered, else the route's target.
pub(crate) async fn pass_gates(
    head: &mut RequestHead,
    snapshot: &Snapshot,
    (index, waiting): (usize, Box<Waiting>),
    client: ClientInfo,
    upstreams: &Upstreams,
) -> Front {
    let Some(route) = snapshot.router.get(index) else {
        return Front::NoRoute;
    };
    let Waiting { captured, wait } = *waiting;
    if let Some(wait) = wait {
        let cx = context(route, &captured, client.addr.ip());
        if let Some(response) = finish_filters(head, route, &cx, wait).await {
            return Front::Answer { route: index, response: Arc::new(response) };
        }
        if route.gates.is_none() {
            return target(head, index, route, &captured, client.https);
        }
    }
    for gate in route.gates.iter().flat_map(|g| g.iter()) {
        if let Some(response) = gate.check(head, client.clone(), upstreams.clone()).await {
            return Front::Answer { route: index, response: Arc::new(response) };
        }
    }
    target(head, index, route, &captured, client.https)
}

/// The route's target for `head`.
fn target(head: &RequestHead, index: usize, route: &CompiledRoute, captured: &Captured, https: bool) -> Front {
    match &route.target {
        Target::Cluster(cluster) => Front::Cluster { route: index, cluster: *cluster },
        Target::Static(response) => Front::Answer { route: index, response: response.clone() },
        Target::Redirect(redirect) => {
            Front::Answer { route: index, response: Arc::new(redirect.respond(head, https, captured)) }
        }
        Target::Handler(handler, names) => {
            let params = names
                .iter()
                .zip(&captured.ranges)
                .map(|(name, &(start, end))| {
                    let value = captured.path.get(start as usize..end as usize).unwrap_or_default();
                    (name.clone(), String::from_utf8_lossy(value).into_owned())
                })
                .collect();
            Front::Handler { route: index, handler: handler.clone(), params }
        }
        Target::WebSocket(endpoint) => Front::WebSocket { route: index, endpoint: *endpoint },
    }
}
