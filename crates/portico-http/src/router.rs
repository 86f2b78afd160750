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
use crate::handler::{CompiledFunction, Gate};
use crate::message::LocalResponse;
use crate::pattern::{Captured, PathPattern};
use crate::registry::Registry;
use crate::request_buffer::BufferPolicy;
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
    /// Code in the process (`handler:`), with the names of the route pattern's parameters.
    Handler(Arc<dyn crate::handler::Handler>, Arc<[String]>),
    /// A WebSocket endpoint in the process (`mqtt: websocket`): it takes the upgraded connection.
    WebSocket(WebSocketEndpoint),
}

/// What a WebSocket route serves (websocket.rs answers the handshake and hands the connection over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebSocketEndpoint {
    /// The MQTT broker (`mqtt: websocket`).
    Mqtt,
}

#[derive(Debug)]
pub struct CompiledRoute {
    pub name: String,
    pub target: Target,
    /// Plain-HTTP clients are redirected to HTTPS.
    pub redirect_https: Option<HttpsRedirect>,
    pub stats: Arc<RouteStats>,
    /// What its filters refused (`portico_filter_denials_total`).
    pub denials: Arc<filters::Denials>,
    /// Global filters, then the route's own; `None` when there are none.
    pub filters: Option<Chain>,
    /// Function filters (global, then the route's own), run after the other request hooks; `None`: none.
    pub gates: Option<Arc<[Arc<dyn Gate>]>>,
    /// Request bodies for the route's cluster are read whole first (HTTP/1 clusters only); `None`: streamed.
    pub(crate) buffering: Option<Arc<crate::request_buffer::BufferPolicy>>,
    host: HostMatch,
    path: PathMatch,
    methods: Option<Vec<Vec<u8>>>,
    headers: Vec<(String, Vec<u8>)>,
    query: Vec<(String, String)>,
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
        let mut functions = HashMap::new();
        for (name, f) in &cfg.functions {
            let compiled = match crate::handler::function_plane() {
                Some(plane) => plane.compile(name, f, loaded),
                None => Err("this build of Portico has no functions plane".to_string()),
            };
            match compiled {
                Ok(function) => {
                    functions.insert(name.clone(), function);
                }
                Err(message) => problems.push((format!("functions.{name}.source"), message, None)),
            }
        }
        let mut global = Filters::default();
        for (j, f) in cfg.filters.iter().enumerate() {
            global.add(f, &[], None, (&functions, loaded), &format!("filters[{j}]"), problems);
        }
        let mut compiled = Vec::with_capacity(cfg.routes.len());
        let names = portico_config::route_names(&cfg.routes);
        let targets = Targets { clusters: cluster_index, functions: &functions };
        for (i, (r, name)) in cfg.routes.iter().zip(names).enumerate() {
            let route = compile_route(loaded, r, i, name, &global, &targets, registry, https_port, problems);
            if let Some(route) = route {
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

    /// Every route, in the order they are tried.
    pub fn routes(&self) -> &[CompiledRoute] {
        &self.routes
    }
}

#[allow(clippy::too_many_arguments)]
fn compile_route(
    loaded: &LoadedConfig,
    r: &Route,
    i: usize,
    name: String,
    global: &Filters,
    targets: &Targets<'_>,
    registry: &Registry,
    https_port: u16,
    problems: &mut Vec<RouteProblem>,
) -> Option<CompiledRoute> {
    let cluster_index = targets.clusters;
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
    } else if let Some(name) = &r.handler {
        match builtin_handler(name) {
            Some(handler) => Target::Handler(handler, names.clone().into()),
            None => {
                problems.push((format!("{base}.handler"), format!("unknown handler {name:?}"), None));
                return None;
            }
        }
    } else if let Some(name) = &r.function {
        // A function that did not compile was reported at its source.
        let Some(handler) = targets.functions.get(name)?.handler.clone() else {
            let message = format!("function {name:?} has no fetch handler, so it cannot be a route's target");
            let hint = "export one: `export default { fetch(request, env, ctx) { ... } }`";
            problems.push((format!("{base}.function"), message, Some(hint.into())));
            return None;
        };
        Target::Handler(handler, names.clone().into())
    } else if let Some(m) = &r.mqtt_publish {
        let publish = crate::mqtt_publish::MqttPublish {
            topic: m.topic.clone(),
            qos: m.qos,
            retain: m.retain,
            prefix: r.matcher.path_prefix.as_ref().map(|p| p.trim_end_matches('/').to_string()),
        };
        Target::Handler(Arc::new(publish), names.clone().into())
    } else if let Some(portico_config::MqttRoute::Websocket) = r.mqtt {
        Target::WebSocket(WebSocketEndpoint::Mqtt)
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
    let mut filters = global.clone();
    for (j, f) in r.filters.iter().enumerate() {
        filters.add(f, &names, Some(&name), (targets.functions, loaded), &format!("{base}.filters[{j}]"), problems);
    }
    let Filters { chain, gates } = filters;
    Some(CompiledRoute {
        target,
        redirect_https: r
            .redirect_https
            .as_ref()
            .and_then(|r| r.settings())
            .map(|s| HttpsRedirect { port: s.port.unwrap_or(https_port), status: s.status }),
        stats: registry.route_stats(&name, r.cluster_label()),
        denials: registry.denials(&name),
        filters: (!chain.is_empty()).then(|| chain.into()),
        gates: (!gates.is_empty()).then(|| gates.into()),
        buffering: r.cluster.as_ref().and(r.buffering()).map(|b| Arc::new(BufferPolicy::from_config(&b, loaded))),
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

/// What routes may name as targets: clusters (by index) and compiled functions.
struct Targets<'a> {
    clusters: &'a HashMap<String, usize>,
    functions: &'a HashMap<String, CompiledFunction>,
}

/// A route's filters as they are compiled: the synchronous ones, and the function filters (gates).
#[derive(Default, Clone)]
struct Filters {
    chain: Vec<Arc<dyn filters::Filter>>,
    gates: Vec<Arc<dyn Gate>>,
}

impl Filters {
    /// Adds filter `f` (at `base` in the file); what cannot be compiled is a problem.
    fn add(
        &mut self,
        f: &portico_config::Filter,
        names: &[String],
        site: Option<&str>,
        (functions, loaded): (&HashMap<String, CompiledFunction>, &LoadedConfig),
        base: &str,
        problems: &mut Vec<RouteProblem>,
    ) {
        if let portico_config::Filter::Function(name) = f {
            // A function that did not compile was reported at its source, an unknown one by validation.
            let Some(function) = functions.get(name) else { return };
            if function.gate.is_none() && function.response.is_none() {
                problems.push((
                    format!("{base}.function"),
                    format!("function {name:?} has no onRequest or onResponse hook, so it cannot be a filter"),
                    Some("export one: `export default { onRequest(request, env, ctx) { ... } }`".into()),
                ));
            }
            self.gates.extend(function.gate.clone());
            self.chain.extend(function.response.clone());
            return;
        }
        match filters::compile(f, names, site, loaded) {
            Ok(f) => self.chain.push(f),
            Err((key, message)) => problems.push((format!("{base}.{key}"), message, None)),
        }
    }
}

/// The handler built into Portico with this name (`portico_config::HANDLERS` lists them).
fn builtin_handler(name: &str) -> Option<Arc<dyn crate::handler::Handler>> {
    match name {
        "echo" => Some(Arc::new(crate::echo::Echo)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use crate::codec::{parse_request, take_request, HeadLimits, Parsed, RequestHead};
    use crate::snapshot::{build, Registry, Snapshot};

    const LIMITS: HeadLimits = HeadLimits { max_request_line: 8192, max_header_bytes: 32768, max_headers: 100 };

    /// A snapshot whose routes are `routes` (YAML list items), each a static route answering its own name.
    fn snapshot(routes: &[&str]) -> Snapshot {
        let mut yaml = String::from("listeners: [ { name: web, address: 127.0.0.1:1 } ]\nroutes:\n");
        for (i, r) in routes.iter().enumerate() {
            yaml += &format!("  - {{ name: r{i}, match: {r}, static: {{ body: r{i} }} }}\n");
        }
        let loaded = portico_config::load_str(&yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        build(&loaded, &Registry::new(1)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn head(request: &str) -> RequestHead {
        let mut buf = bytes::BytesMut::from(request.as_bytes());
        let Ok(Parsed::Complete(h, used)) = parse_request(&buf, &LIMITS) else { panic!("bad request {request:?}") };
        take_request(&mut buf, h, used)
    }

    /// The name of the route `find` picks for `GET path` on `host`, or "none".
    fn pick(s: &Snapshot, host: &str, target: &str, extra: &str) -> String {
        let h = head(&format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n"));
        s.router.find(&h).and_then(|(i, _)| s.router.get(i)).map_or("none".into(), |r| r.name.clone())
    }

    #[test]
    fn an_exact_path_beats_parameters_which_beat_the_longest_prefix() {
        // Written from least to most specific.
        let s = snapshot(&[
            "{ path_prefix: / }",
            "{ path_prefix: /users }",
            "{ path_prefix: /users/admin }",
            "{ path: \"/users/:id/:tab\" }",
            "{ path: \"/users/:id/profile\" }",
            "{ path: /users/me/profile }",
        ]);
        assert_eq!(pick(&s, "a", "/users/me/profile", ""), "r5", "exact");
        assert_eq!(pick(&s, "a", "/users/7/profile", ""), "r4", "more literal text among parameters");
        assert_eq!(pick(&s, "a", "/users/7/posts", ""), "r3", "parameters before any prefix");
        assert_eq!(pick(&s, "a", "/users/admin/x/y", ""), "r2", "the longest prefix");
        assert_eq!(pick(&s, "a", "/users", ""), "r1", "a prefix matches itself");
        assert_eq!(pick(&s, "a", "/usersx", ""), "r0", "not on a segment boundary");
    }

    #[test]
    fn the_host_ranks_before_the_path() {
        let s = snapshot(&[
            "{ path: /exact }",
            "{ host: \"*.example.com\" }",
            "{ host: \"*.api.example.com\" }",
            "{ host: www.example.com }",
        ]);
        assert_eq!(pick(&s, "www.example.com", "/exact", ""), "r3", "an exact host beats a path on any host");
        assert_eq!(pick(&s, "v1.api.example.com:8080", "/exact", ""), "r2", "the longer wildcard, port ignored");
        assert_eq!(pick(&s, "shop.EXAMPLE.com", "/exact", ""), "r1");
        assert_eq!(pick(&s, "example.com", "/exact", ""), "r0", "a wildcard does not match its own domain");
    }

    #[test]
    fn more_conditions_then_the_order_written() {
        let s = snapshot(&[
            "{ path_prefix: /api }",
            "{ path_prefix: /api, methods: [GET] }",
            "{ path_prefix: /api, methods: [GET], headers: { x-canary: \"1\" } }",
            "{ path_prefix: /api, query: { v: \"2\" } }",
            "{ path_prefix: /api, methods: [POST] }",
        ]);
        assert_eq!(pick(&s, "a", "/api/x", "x-canary: 1\r\n"), "r2");
        assert_eq!(pick(&s, "a", "/api/x", ""), "r1", "one condition, written before the query route");
        assert_eq!(pick(&s, "a", "/api/x?v=2", ""), "r1", "equally specific: the order written");
        assert_eq!(pick(&s, "a", "/api/x?v=3", "x-canary: 2\r\n"), "r1");
        let post = head("POST /api/x?v=%32 HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
        let name = |h: &RequestHead| s.router.find(h).and_then(|(i, _)| s.router.get(i)).map(|r| r.name.clone());
        assert_eq!(name(&post).as_deref(), Some("r3"), "the query route was written first among the POST ones");
    }

    #[test]
    fn parameters_are_captured_from_the_path() {
        let s = snapshot(&["{ path: \"/files/:owner/*rest\" }"]);
        let h = head("GET /files/ann/a/b.txt HTTP/1.1\r\nHost: a\r\n\r\n");
        let (_, captured) = s.router.find(&h).expect("matches");
        let values: Vec<&[u8]> = captured.ranges.iter().map(|&(a, b)| &captured.path[a as usize..b as usize]).collect();
        assert_eq!(values, [&b"ann"[..], &b"a/b.txt"[..]]);
        assert_eq!(pick(&s, "a", "/files/ann", ""), "r0", "the rest may be empty");
        assert_eq!(pick(&s, "a", "/files/", ""), "none", "the owner may not");
    }
}
