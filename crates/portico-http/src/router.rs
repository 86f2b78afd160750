//! Route matching. Among the routes whose conditions all hold, the most specific wins: first by host (exact,
//! then the longest wildcard, then none), then by path (exact, then the longest prefix, then none), then by the
//! number of method and header conditions; equally specific routes keep their file order. This is nginx's
//! server-then-location rule, so a catch-all route written first cannot shadow a specific one below it.

use crate::codec::RequestHead;
use crate::snapshot::Registry;
use crate::stats::RouteStats;
use portico_config::Route;
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
    Prefix(Vec<u8>),
}

#[derive(Debug)]
pub struct CompiledRoute {
    pub name: String,
    pub cluster: usize,
    /// Plain-HTTP clients are redirected to HTTPS.
    pub redirect_https: Option<HttpsRedirect>,
    pub stats: Arc<RouteStats>,
    host: HostMatch,
    path: PathMatch,
    methods: Option<Vec<Vec<u8>>>,
    headers: Vec<(String, Vec<u8>)>,
}

impl CompiledRoute {
    fn rank(&self) -> (u8, usize, u8, usize, usize) {
        let (h, hl) = match &self.host {
            HostMatch::Exact(h) => (2, h.len()),
            HostMatch::Suffix(s) => (1, s.len()),
            HostMatch::Any => (0, 0),
        };
        let (p, pl) = match &self.path {
            PathMatch::Exact(p) => (2, p.len()),
            PathMatch::Prefix(p) => (1, p.len()),
            PathMatch::Any => (0, 0),
        };
        (h, hl, p, pl, usize::from(self.methods.is_some()) + self.headers.len())
    }

    fn matches(&self, req: &RequestHead) -> bool {
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
        let path_ok = match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => req.path() == p.as_slice(),
            PathMatch::Prefix(p) => req.path().starts_with(p),
        };
        if !path_ok {
            return false;
        }
        if let Some(methods) = &self.methods {
            if !methods.iter().any(|m| m.as_slice() == req.method()) {
                return false;
            }
        }
        self.headers.iter().all(|(name, want)| req.values(name).any(|v| v == want.as_slice()))
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

impl Router {
    /// `https_port`: the port redirects go to when a route does not say (the only TLS listener's, else 443).
    pub fn build(
        routes: &[Route],
        cluster_index: &HashMap<String, usize>,
        registry: &Registry,
        https_port: u16,
    ) -> Router {
        let mut compiled: Vec<CompiledRoute> = routes
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let m = &r.matcher;
                let host = match &m.host {
                    None => HostMatch::Any,
                    Some(h) => match h.strip_prefix('*') {
                        Some(suffix) => HostMatch::Suffix(suffix.to_ascii_lowercase().into_bytes()),
                        None => HostMatch::Exact(h.to_ascii_lowercase().into_bytes()),
                    },
                };
                let path = match (&m.path, &m.path_prefix) {
                    (Some(p), _) => PathMatch::Exact(p.as_bytes().to_vec()),
                    (None, Some(p)) if p == "/" => PathMatch::Any,
                    (None, Some(p)) => PathMatch::Prefix(p.as_bytes().to_vec()),
                    (None, None) => PathMatch::Any,
                };
                let name = r.name.clone().unwrap_or_else(|| format!("route-{i}"));
                Some(CompiledRoute {
                    cluster: *cluster_index.get(&r.cluster)?,
                    redirect_https: r
                        .redirect_https
                        .as_ref()
                        .and_then(|r| r.settings())
                        .map(|s| HttpsRedirect { port: s.port.unwrap_or(https_port), status: s.status }),
                    stats: registry.route_stats(&name, &r.cluster),
                    name,
                    host,
                    path,
                    methods: m
                        .methods
                        .as_ref()
                        .map(|ms| ms.iter().map(|x| x.to_ascii_uppercase().into_bytes()).collect()),
                    headers: m
                        .headers
                        .as_ref()
                        .map(|h| h.iter().map(|(k, v)| (k.clone(), v.clone().into_bytes())).collect())
                        .unwrap_or_default(),
                })
            })
            .collect();
        // Stable sort: equally specific routes keep their file order.
        compiled.sort_by_key(|r| std::cmp::Reverse(r.rank()));
        Router { routes: compiled }
    }

    pub fn find(&self, req: &RequestHead) -> Option<&CompiledRoute> {
        self.routes.iter().find(|r| r.matches(req))
    }

    /// The position of the route `find` would return, for holders that cannot keep a borrow.
    pub fn find_index(&self, req: &RequestHead) -> Option<usize> {
        self.routes.iter().position(|r| r.matches(req))
    }

    pub fn get(&self, index: usize) -> Option<&CompiledRoute> {
        self.routes.get(index)
    }
}
