//! Route matching on the normalised request. Among the routes whose conditions all hold, the most specific
//! wins, in this order:
//!
//! 1. host: exact, then the longest `*.` wildcard, then none;
//! 2. path: an exact `path`, then a `path` with parameters (more literal text first), then the longest
//!    `path_prefix`, then none;
//! 3. the number of other conditions (`methods`, each of `headers` and `query`);
//! 4. the order written.
//!
//! This is nginx's server-then-location rule, so a catch-all route written first cannot shadow a specific one
//! below it. `path_prefix` matches on segment boundaries: `/api` (or `/api/`) matches `/api` and `/api/x`,
//! never `/apiary`.

use crate::codec::RequestHead;
use crate::filters::{self, Chain};
use crate::message::LocalResponse;
use crate::pattern::PathPattern;
use crate::snapshot::Registry;
use crate::stats::RouteStats;
use portico_config::{LoadedConfig, Route};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug)]
enum HostMatch {
    Any,
    Exact(Vec<u8>),
    /// `*.example.com` stored as `.example.com`.
    Suffix(Vec<u8>),
}

#[derive(Debug)]
enum PathMatch {
    Any,
    Exact(Vec<u8>),
    Pattern(PathPattern),
    /// Without a trailing slash.
    Prefix(Vec<u8>),
}

/// What answers a route's requests.
#[derive(Debug)]
pub enum Target {
    /// The index of the cluster in the snapshot.
    Cluster(usize),
    Static(Arc<LocalResponse>),
    Redirect(crate::redirect::RedirectTarget),
}

#[derive(Debug)]
pub struct CompiledRoute {
    pub name: String,
    pub target: Target,
    /// Plain-HTTP clients are redirected to HTTPS.
    pub redirect_https: Option<HttpsRedirect>,
    pub stats: Arc<RouteStats>,
    /// Global filters, then the route's own; `None` when there are none.
    pub filters: Option<Chain>,
    host: HostMatch,
    path: PathMatch,
    methods: Option<Vec<Vec<u8>>>,
    headers: Vec<(String, Vec<u8>)>,
    query: Vec<(String, String)>,
}

/// The route's path parameters captured from a request, as ranges into `path`.
#[derive(Debug, Default)]
pub struct Captured {
    pub path: Vec<u8>,
    pub ranges: Vec<(u32, u32)>,
}

impl CompiledRoute {
    fn rank(&self) -> (u8, usize, u8, usize, usize) {
        let (h, hl) = match &self.host {
            HostMatch::Exact(h) => (2, h.len()),
            HostMatch::Suffix(s) => (1, s.len()),
            HostMatch::Any => (0, 0),
        };
        let (p, pl) = match &self.path {
            PathMatch::Exact(p) => (3, p.len()),
            PathMatch::Pattern(p) => (2, p.literal_len()),
            PathMatch::Prefix(p) => (1, p.len()),
            PathMatch::Any => (0, 0),
        };
        (h, hl, p, pl, usize::from(self.methods.is_some()) + self.headers.len() + self.query.len())
    }

    /// The cluster, when the target is one.
    pub fn cluster(&self) -> Option<usize> {
        match self.target {
            Target::Cluster(c) => Some(c),
            _ => None,
        }
    }

    /// The route's `path_prefix` (without a trailing slash), for rewrites.
    pub fn prefix(&self) -> Option<&[u8]> {
        match &self.path {
            PathMatch::Prefix(p) => Some(p),
            PathMatch::Any => Some(b"/"),
            _ => None,
        }
    }

    /// Whether the route matches; path parameters go into `captures`.
    fn matches(&self, req: &RequestHead, captures: &mut Vec<(u32, u32)>) -> bool {
        let host_ok = match &self.host {
            HostMatch::Any => true,
            HostMatch::Exact(h) => req.host_name().is_some_and(|n| n.eq_ignore_ascii_case(h)),
            HostMatch::Suffix(s) => {
                req.host_name().is_some_and(|n| n.len() > s.len() && n[n.len() - s.len()..].eq_ignore_ascii_case(s))
            }
        };
        if !host_ok {
            return false;
        }
        let path = req.path();
        let path_ok = match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => path == p.as_slice(),
            PathMatch::Pattern(p) => p.matches(path, captures),
            PathMatch::Prefix(p) => crate::filters::after_prefix(path, p).is_some(),
        };
        if !path_ok {
            return false;
        }
        if let Some(methods) = &self.methods {
            if !methods.iter().any(|m| m.as_slice() == req.method()) {
                return false;
            }
        }
        if !self.headers.iter().all(|(name, want)| req.values(name).any(|v| v == want.as_slice())) {
            return false;
        }
        self.query.is_empty() || {
            let query = req.query().unwrap_or_default();
            self.query.iter().all(|(name, want)| {
                form_urlencoded::parse(query).any(|(n, v)| n == name.as_str() && v == want.as_str())
            })
        }
    }
}

/// Where and how a plain-HTTP request is sent to HTTPS.
#[derive(Debug, Clone, Copy)]
pub struct HttpsRedirect {
    /// Omitted from the `Location` when 443.
    pub port: u16,
    pub status: Option<u16>,
}

impl HttpsRedirect {
    /// The status for a request with this method: as configured, else 301 for GET and HEAD and 308 otherwise.
    pub fn status_for(&self, method: &[u8]) -> u16 {
        self.status.unwrap_or(if matches!(method, b"GET" | b"HEAD") { 301 } else { 308 })
    }
}

#[derive(Debug, Default)]
pub struct Router {
    routes: Vec<CompiledRoute>,
}

/// A problem found while compiling routes: (dotted path in the file, message, hint).
pub type RouteProblem = (String, String, Option<String>);

impl Router {
    /// `https_port`: the port redirects go to when a route does not say (the only TLS listener's, else 443).
    pub fn build(
        loaded: &LoadedConfig,
        cluster_index: &HashMap<String, usize>,
        registry: &Registry,
        https_port: u16,
        problems: &mut Vec<RouteProblem>,
    ) -> Router {
        let cfg = &loaded.config;
        let mut global: Vec<Arc<dyn filters::Filter>> = Vec::new();
        for (j, f) in cfg.filters.iter().enumerate() {
            match filters::compile(f, &[]) {
                Ok(f) => global.push(f),
                Err((key, message)) => problems.push((format!("filters[{j}].{key}"), message, None)),
            }
        }
        let mut compiled = Vec::with_capacity(cfg.routes.len());
        for (i, r) in cfg.routes.iter().enumerate() {
            if let Some(route) = compile_route(loaded, r, i, &global, cluster_index, registry, https_port, problems) {
                compiled.push(route);
            }
        }
        // Stable sort: equally specific routes keep their file order.
        compiled.sort_by_key(|r| std::cmp::Reverse(r.rank()));
        Router { routes: compiled }
    }

    /// The route for `req` and the path parameters it captured.
    pub fn find(&self, req: &RequestHead) -> Option<(usize, Captured)> {
        let mut ranges = Vec::new();
        let index = self.routes.iter().position(|r| r.matches(req, &mut ranges))?;
        let path = if ranges.is_empty() { Vec::new() } else { req.path().to_vec() };
        Some((index, Captured { path, ranges }))
    }

    /// The route at `index` (as `find` returned it).
    pub fn get(&self, index: usize) -> Option<&CompiledRoute> {
        self.routes.get(index)
    }
}

#[allow(clippy::too_many_arguments)]
fn compile_route(
    loaded: &LoadedConfig,
    r: &Route,
    i: usize,
    global: &[Arc<dyn filters::Filter>],
    cluster_index: &HashMap<String, usize>,
    registry: &Registry,
    https_port: u16,
    problems: &mut Vec<RouteProblem>,
) -> Option<CompiledRoute> {
    let base = format!("routes[{i}]");
    let m = &r.matcher;
    let host = match &m.host {
        None => HostMatch::Any,
        Some(h) => match h.strip_prefix('*') {
            Some(suffix) => HostMatch::Suffix(suffix.to_ascii_lowercase().into_bytes()),
            None => HostMatch::Exact(h.to_ascii_lowercase().into_bytes()),
        },
    };
    let mut names: Vec<String> = Vec::new();
    let path = match (&m.path, &m.path_prefix) {
        (Some(p), _) => match PathPattern::parse(p) {
            Ok(pattern) if pattern.has_params() => {
                names = pattern.names().to_vec();
                PathMatch::Pattern(pattern)
            }
            Ok(_) => PathMatch::Exact(p.as_bytes().to_vec()),
            Err(e) => {
                problems.push((
                    format!("{base}.match.path"),
                    e.0,
                    Some("for example /users/:id or /files/*rest".into()),
                ));
                return None;
            }
        },
        (None, Some(p)) => match crate::filters::trim_prefix(p) {
            b"/" => PathMatch::Any,
            p => PathMatch::Prefix(p.to_vec()),
        },
        (None, None) => PathMatch::Any,
    };
    let target = if let Some(cluster) = &r.cluster {
        Target::Cluster(*cluster_index.get(cluster)?)
    } else if let Some(s) = &r.static_response {
        match crate::redirect::static_response(loaded, s) {
            Ok(resp) => Target::Static(Arc::new(resp)),
            Err(message) => {
                problems.push((format!("{base}.static.file"), message, None));
                return None;
            }
        }
    } else if let Some(redirect) = &r.redirect {
        match crate::redirect::RedirectTarget::parse(redirect, &names) {
            Ok(t) => Target::Redirect(t),
            Err(message) => {
                problems.push((format!("{base}.redirect.to"), message, None));
                return None;
            }
        }
    } else {
        return None;
    };
    let mut chain: Vec<Arc<dyn filters::Filter>> = global.to_vec();
    for (j, f) in r.filters.iter().enumerate() {
        match filters::compile(f, &names) {
            Ok(f) => chain.push(f),
            Err((key, message)) => problems.push((format!("{base}.filters[{j}].{key}"), message, None)),
        }
    }
    let name = r.name.clone().unwrap_or_else(|| format!("route-{i}"));
    Some(CompiledRoute {
        target,
        redirect_https: r
            .redirect_https
            .as_ref()
            .and_then(|r| r.settings())
            .map(|s| HttpsRedirect { port: s.port.unwrap_or(https_port), status: s.status }),
        stats: registry.route_stats(&name, r.cluster_label()),
        filters: (!chain.is_empty()).then(|| chain.into()),
        name,
        host,
        path,
        methods: m.methods.as_ref().map(|ms| ms.iter().map(|x| x.to_ascii_uppercase().into_bytes()).collect()),
        headers: m
            .headers
            .as_ref()
            .map(|h| h.iter().map(|(k, v)| (k.clone(), v.clone().into_bytes())).collect())
            .unwrap_or_default(),
        query: m.query.as_ref().map(|q| q.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default(),
    })
}
