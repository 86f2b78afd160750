//! The `routes:` and `filters:` sections and a listener's path policy: what a request is matched on, the one
//! target that answers it (`cluster`, `static`, `redirect` or `handler`) and the filters it passes through. Checks that
//! need no other section live here; patterns, templates, regexes and files are compiled (and refused with
//! their position) when the snapshot is built.

use crate::fields::{is_token, OWNED_HEADERS};
use crate::units::{ByteSize, HumanDuration};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Optional name, used in logs and metrics. Defaults to a name made from what the route matches (see
    /// `route_names`), so that it stays when routes are added or moved around it.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "match", default)]
    pub matcher: RouteMatch,
    /// Target: proxy to this cluster.
    #[serde(default)]
    pub cluster: Option<String>,
    /// Target: answer with a fixed response.
    #[serde(rename = "static", default)]
    pub static_response: Option<StaticResponse>,
    /// Target: answer with a redirect.
    #[serde(default)]
    pub redirect: Option<Redirect>,
    /// Target: answer with code built into Portico (one of `HANDLERS`), such as `echo`.
    #[serde(default)]
    pub handler: Option<String>,
    /// Target: answer with a JavaScript function of `functions:`.
    #[serde(default)]
    pub function: Option<String>,
    /// Target: publish the request body to the MQTT broker.
    #[serde(default)]
    pub mqtt_publish: Option<MqttPublish>,
    /// Target: the MQTT broker itself, over this route (`mqtt: websocket`).
    #[serde(default)]
    pub mqtt: Option<MqttRoute>,
    /// Clients that reach this route over plain HTTP are redirected to HTTPS (`true`, or `{ port, status }`);
    /// those on a TLS listener go to the route's target.
    #[serde(default)]
    pub redirect_https: Option<RedirectHttps>,
    /// Run after the global `filters:`, in the order written.
    #[serde(default)]
    pub filters: Vec<Filter>,
    /// Request bodies for the route's cluster are read whole (in memory, then a temporary file) before an
    /// upstream connection is taken: `true` (the default), `false`, or settings.
    #[serde(default)]
    pub request_buffering: Option<RequestBufferingSetting>,
}

/// The name of every route, in file order: its `name`, or one made from what it matches (`match_name`). A made
/// name that another route already has, given or made, gets the first free suffix `#2`, `#3`, ... in file order,
/// so names are unique and a route keeps its name whatever is added above or below it (unless that is a route
/// matching the same requests, listed before it). The router's metrics labels and `portico check --against`
/// both name routes this way.
pub fn route_names(routes: &[Route]) -> Vec<String> {
    let mut taken: std::collections::HashSet<String> = routes.iter().filter_map(|r| r.name.clone()).collect();
    routes
        .iter()
        .map(|r| {
            if let Some(name) = &r.name {
                return name.clone();
            }
            let base = r.matcher.name();
            let name = std::iter::once(base.clone())
                .chain((2..).map(|n| format!("{base}#{n}")))
                .find(|candidate| !taken.contains(candidate))
                .unwrap_or(base);
            taken.insert(name.clone());
            name
        })
        .collect()
}

impl RouteMatch {
    /// What the conditions say, as a name: `[METHODS ][HOST]PATH[?QUERY][ HEADER=VALUE...]`, where PATH is the
    /// `path` as written, or the `path_prefix` followed by `/*` (`/*` alone without either): `GET /users/:id`,
    /// `api.example.com/api/*`, `/healthz`, `GET,POST /api/*?version=2 x-canary=1`.
    pub fn name(&self) -> String {
        let mut name = String::new();
        if let Some(methods) = self.methods.as_ref().filter(|m| !m.is_empty()) {
            name += &methods.iter().map(|m| m.to_ascii_uppercase()).collect::<Vec<_>>().join(",");
            name.push(' ');
        }
        if let Some(host) = &self.host {
            name += &host.to_ascii_lowercase();
        }
        match (&self.path, &self.path_prefix) {
            (Some(path), _) => name += path,
            (None, Some(prefix)) => {
                name += prefix.trim_end_matches('/');
                name += "/*";
            }
            (None, None) => name += "/*",
        }
        if let Some(query) = self.query.as_ref().filter(|q| !q.is_empty()) {
            let pairs: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            name += "?";
            name += &pairs.join("&");
        }
        for (header, value) in self.headers.iter().flatten() {
            name += &format!(" {}={value}", header.to_ascii_lowercase());
        }
        name
    }
}

impl Route {
    /// The cluster label of the route's metrics and log lines: the cluster's name, empty for local targets.
    pub fn cluster_label(&self) -> &str {
        self.cluster.as_deref().unwrap_or("")
    }
}

/// `request_buffering: true | false`, or with settings.
#[derive(Debug, Clone)]
pub enum RequestBufferingSetting {
    Enabled(bool),
    With(RequestBuffering),
}

impl<'de> Deserialize<'de> for RequestBufferingSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match bool_or_settings(d)? {
            Ok(enabled) => RequestBufferingSetting::Enabled(enabled),
            Err(settings) => RequestBufferingSetting::With(settings),
        })
    }
}

/// `true`, `false`, or a map of settings (`Err`), the map's own errors (an unknown key, a value of the wrong
/// type) reported as they are, not as serde's "did not match any variant" of an untagged enum.
fn bool_or_settings<'de, D, T>(d: D) -> Result<Result<bool, T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Either<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Either<T> {
        type Value = Result<bool, T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("true, false, or a map of settings")
        }
        fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
            Ok(Ok(b))
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Err)
        }
    }
    d.deserialize_any(Either(std::marker::PhantomData))
}

/// How a route buffers request bodies (nginx's `proxy_request_buffering`, `client_body_buffer_size` and
/// `client_body_temp_path` in one place).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestBuffering {
    /// A body up to this size is held in memory; a larger one goes to a temporary file. Default: 64 KiB, or
    /// `max_size` when that is smaller.
    pub memory: Option<ByteSize>,
    /// A larger body is refused with 413 (before any of it is read when its length is declared).
    pub max_size: ByteSize,
    /// Where temporary files are made (unnamed: nothing is left behind, even after a crash); relative to the
    /// configuration file's directory. Default: `$TMPDIR`, else `/tmp`.
    pub temp_dir: Option<String>,
}

impl Default for RequestBuffering {
    fn default() -> Self {
        RequestBuffering { memory: None, max_size: ByteSize(1 << 30), temp_dir: None }
    }
}

impl RequestBuffering {
    /// The memory a body may take before it goes to a file.
    pub fn memory(&self) -> ByteSize {
        self.memory.unwrap_or(ByteSize(self.max_size.0.min(64 * 1024)))
    }
}

impl Route {
    /// The route's request buffering; `None` when it is turned off.
    pub fn buffering(&self) -> Option<RequestBuffering> {
        match &self.request_buffering {
            None | Some(RequestBufferingSetting::Enabled(true)) => Some(RequestBuffering::default()),
            Some(RequestBufferingSetting::Enabled(false)) => None,
            Some(RequestBufferingSetting::With(b)) => Some(b.clone()),
        }
    }
}

/// `redirect_https: true`, or with settings.
#[derive(Debug, Clone)]
pub enum RedirectHttps {
    Enabled(bool),
    With(RedirectSettings),
}

impl<'de> Deserialize<'de> for RedirectHttps {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match bool_or_settings(d)? {
            Ok(enabled) => RedirectHttps::Enabled(enabled),
            Err(settings) => RedirectHttps::With(settings),
        })
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedirectSettings {
    /// The HTTPS port in the `Location`. Default: the port of the only TLS listener, else 443.
    pub port: Option<u16>,
    /// 301, 302, 307 or 308. Default: 301 for GET and HEAD, 308 (which keeps the method and body) otherwise.
    pub status: Option<u16>,
}

impl RedirectHttps {
    /// The settings when the redirect is on.
    pub fn settings(&self) -> Option<RedirectSettings> {
        match self {
            RedirectHttps::Enabled(true) => Some(RedirectSettings::default()),
            RedirectHttps::Enabled(false) => None,
            RedirectHttps::With(s) => Some(s.clone()),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteMatch {
    /// Matches this path and everything below it, on segment boundaries: `/api` matches `/api` and `/api/x`,
    /// not `/apiary`.
    pub path_prefix: Option<String>,
    /// The whole path: exact (`/health`), with parameters (`/users/:id`) or a trailing wildcard
    /// (`/files/*rest`).
    pub path: Option<String>,
    /// `example.com` or `*.example.com`; compared without the port, case-insensitively.
    pub host: Option<String>,
    pub methods: Option<Vec<String>>,
    /// Header name to exact value; every listed header must be present with that value.
    pub headers: Option<BTreeMap<String, String>>,
    /// Query parameter name to exact (decoded) value; every listed parameter must be present with that value.
    pub query: Option<BTreeMap<String, String>>,
}

/// `static:` a response made by Portico.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticResponse {
    #[serde(default = "default_static_status")]
    pub status: u16,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The body as text. Without `content-type` in `headers`, it is sent as `text/plain; charset=utf-8`.
    #[serde(default)]
    pub body: Option<String>,
    /// The body from a file, read when the configuration is loaded (relative paths start at the configuration
    /// file's directory). Without `content-type` in `headers`, the type follows the file's extension.
    #[serde(default)]
    pub file: Option<String>,
}

/// The handlers built into Portico, by the name a route's `handler:` gives.
pub const HANDLERS: &[&str] = &["echo"];

fn default_static_status() -> u16 {
    200
}

/// `redirect:` answer with a `Location`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redirect {
    /// The `Location`, with placeholders: `{scheme}`, `{host}` (without port), `{path}`, `{query}` (without
    /// `?`), `{uri}` (path and query) and the route's path parameters (`{id}`).
    pub to: String,
    /// 301, 302, 303, 307 or 308.
    #[serde(default = "default_redirect_status")]
    pub status: u16,
}

fn default_redirect_status() -> u16 {
    302
}

/// One filter: a single key naming its kind (`- cors: { ... }`).
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "FilterKey")]
pub enum Filter {
    /// Change request and response headers.
    Headers(HeadersFilter),
    /// Change the path sent upstream.
    Rewrite(RewriteFilter),
    /// Cross-origin resource sharing: preflights answered at the edge, response headers added.
    Cors(CorsFilter),
    /// Compress response bodies (zstd, brotli, gzip) for clients that accept it.
    Compress(CompressFilter),
    /// HTTP Basic authentication against a password file.
    AuthBasic(crate::access::AuthBasicFilter),
    /// API keys in a header or a query parameter.
    ApiKey(crate::access::ApiKeyFilter),
    /// Allow and deny lists of the client's address.
    Ip(crate::access::IpFilter),
    /// Bearer tokens (JWT) verified against keys or a JWKS.
    Jwt(Box<crate::jwt::JwtFilter>),
    /// Token buckets counted across the node's workers.
    RateLimit(crate::rate_limit::RateLimitFilter),
    /// Request size limits (target, head, body, JSON) and per-address connection caps.
    Limits(crate::limits::LimitsFilter),
    /// Decode compressed response bodies for clients that do not accept their coding.
    Decompress(crate::transform::DecompressFilter),
    /// Set, add and remove query parameters.
    Query(crate::transform::QueryFilter),
    /// A JavaScript function of `functions:` whose `onRequest` hook runs before the target: it may answer
    /// early or change the request.
    Function(String),
}

/// The file's form of a filter: serde_norway reads enums from YAML tags (`!cors`), so the one-key map users
/// write is read as a struct of options and then checked to have exactly one.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterKey {
    headers: Option<HeadersFilter>,
    rewrite: Option<RewriteFilter>,
    cors: Option<CorsFilter>,
    compress: Option<CompressFilter>,
    auth_basic: Option<crate::access::AuthBasicFilter>,
    api_key: Option<crate::access::ApiKeyFilter>,
    ip: Option<crate::access::IpFilter>,
    jwt: Option<Box<crate::jwt::JwtFilter>>,
    rate_limit: Option<crate::rate_limit::RateLimitFilter>,
    limits: Option<crate::limits::LimitsFilter>,
    decompress: Option<crate::transform::DecompressFilter>,
    query: Option<crate::transform::QueryFilter>,
    function: Option<String>,
}

impl TryFrom<FilterKey> for Filter {
    type Error = String;
    fn try_from(key: FilterKey) -> Result<Self, String> {
        let mut kinds = [
            key.headers.map(Filter::Headers),
            key.rewrite.map(Filter::Rewrite),
            key.cors.map(Filter::Cors),
            key.compress.map(Filter::Compress),
            key.auth_basic.map(Filter::AuthBasic),
            key.api_key.map(Filter::ApiKey),
            key.ip.map(Filter::Ip),
            key.jwt.map(Filter::Jwt),
            key.rate_limit.map(Filter::RateLimit),
            key.limits.map(Filter::Limits),
            key.decompress.map(Filter::Decompress),
            key.query.map(Filter::Query),
            key.function.map(Filter::Function),
        ]
        .into_iter()
        .flatten();
        match (kinds.next(), kinds.next()) {
            (Some(filter), None) => Ok(filter),
            (None, _) => Err(
                "a filter needs its kind: `headers`, `rewrite`, `cors`, `compress`, `decompress`, `query`, `auth_basic`, \
                 `api_key`, `ip`, `jwt`, `rate_limit`, `limits` or `function`"
                    .into(),
            ),
            (Some(_), Some(_)) => Err("one filter per list item: write each kind as its own `- kind: {...}`".into()),
        }
    }
}

impl Filter {
    pub fn kind(&self) -> &'static str {
        match self {
            Filter::Headers(_) => "headers",
            Filter::Rewrite(_) => "rewrite",
            Filter::Cors(_) => "cors",
            Filter::Compress(_) => "compress",
            Filter::AuthBasic(_) => "auth_basic",
            Filter::ApiKey(_) => "api_key",
            Filter::Ip(_) => "ip",
            Filter::Jwt(_) => "jwt",
            Filter::RateLimit(_) => "rate_limit",
            Filter::Limits(_) => "limits",
            Filter::Decompress(_) => "decompress",
            Filter::Query(_) => "query",
            Filter::Function(_) => "function",
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadersFilter {
    /// Applied to the request before it goes to the target.
    #[serde(default)]
    pub request: HeaderEdits,
    /// Applied to every response of the route (proxied or made by Portico).
    #[serde(default)]
    pub response: HeaderEdits,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderEdits {
    /// Replace every value of the header with this one.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Add a value, keeping those present.
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    /// Remove the header.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// Exactly one of `path`, `strip_prefix`, `replace_prefix` and `regex` (with `replacement`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewriteFilter {
    /// A new path, with the route's parameters: `/v2/users/:id`, `/assets/*rest`.
    #[serde(default)]
    pub path: Option<String>,
    /// Remove this prefix (on a segment boundary) from the path; `/api/x` without `/api` is `/x`.
    #[serde(default)]
    pub strip_prefix: Option<String>,
    /// Replace the route's `path_prefix` with this one.
    #[serde(default)]
    pub replace_prefix: Option<String>,
    /// A regular expression (Rust `regex` syntax) matched against the path ...
    #[serde(default)]
    pub regex: Option<String>,
    /// ... and what a match is replaced with: `$1` or `${name}` for captures.
    #[serde(default)]
    pub replacement: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsFilter {
    /// Origins allowed (`https://app.example.com`), `https://*.example.com` for its subdomains, or `"*"`.
    pub allow_origins: Vec<String>,
    #[serde(default = "default_cors_methods")]
    pub allow_methods: Vec<String>,
    /// Request headers allowed; `"*"` allows whatever a preflight asks for.
    #[serde(default)]
    pub allow_headers: Vec<String>,
    /// Response headers a page may read beyond the CORS-safelisted ones.
    #[serde(default)]
    pub expose_headers: Vec<String>,
    /// Let pages send cookies and credentials. Not with `"*"` origins.
    #[serde(default)]
    pub allow_credentials: bool,
    /// How long a browser may cache a preflight's answer.
    #[serde(default)]
    pub max_age: Option<HumanDuration>,
}

/// `compress:` compress response bodies (zstd, brotli, gzip) for clients whose `Accept-Encoding` allows it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressFilter {
    /// Media types compressed (`text/*` for a whole type); parameters such as `charset` are ignored.
    #[serde(default = "default_compress_types")]
    pub types: Vec<String>,
    /// Bodies known to be smaller are sent as they are.
    #[serde(default = "default_compress_min_size")]
    pub min_size: crate::units::ByteSize,
    /// The codings offered, in the order preferred among those a client accepts with the same q-value.
    #[serde(default = "default_compress_codings")]
    pub encodings: Vec<crate::transform::Coding>,
    /// gzip level, 1 (fastest) to 9 (smallest).
    #[serde(default = "default_compress_level")]
    pub level: u32,
    /// brotli quality, 0 (fastest) to 11 (smallest).
    #[serde(default = "default_brotli_level")]
    pub brotli_level: u32,
    /// zstd level, 1 (fastest) to 22 (smallest).
    #[serde(default = "default_zstd_level")]
    pub zstd_level: i32,
}

impl Default for CompressFilter {
    fn default() -> Self {
        CompressFilter {
            types: default_compress_types(),
            min_size: default_compress_min_size(),
            encodings: default_compress_codings(),
            level: default_compress_level(),
            brotli_level: default_brotli_level(),
            zstd_level: default_zstd_level(),
        }
    }
}

/// zstd first: the fastest of the three for a given ratio, then brotli (smaller than gzip at equal cost),
/// gzip for every other client.
fn default_compress_codings() -> Vec<crate::transform::Coding> {
    use crate::transform::Coding;
    vec![Coding::Zstd, Coding::Brotli, Coding::Gzip]
}

/// Why 4: the quality on-the-fly brotli is usually run at (about gzip 5's cost, a smaller output); 5 and above
/// switch to a much slower matcher.
fn default_brotli_level() -> u32 {
    4
}

/// zstd's own default.
fn default_zstd_level() -> i32 {
    3
}

fn default_compress_types() -> Vec<String> {
    ["text/*", "application/json", "application/javascript", "image/svg+xml"].map(String::from).to_vec()
}

fn default_compress_min_size() -> crate::units::ByteSize {
    crate::units::ByteSize::kib(1)
}

fn default_compress_level() -> u32 {
    5
}

fn default_cors_methods() -> Vec<String> {
    ["GET", "HEAD", "POST"].map(String::from).to_vec()
}

/// How a listener normalises request paths before routing and forwarding (RFC 3986 section 6).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PathPolicy {
    /// `//` becomes `/`.
    pub merge_slashes: bool,
    /// `%2F` in a path: `reject` (400), `keep` (forwarded encoded, not a separator) or `decode` (a separator).
    pub encoded_slashes: EncodedSlashes,
}

impl Default for PathPolicy {
    fn default() -> Self {
        PathPolicy { merge_slashes: true, encoded_slashes: EncodedSlashes::Reject }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncodedSlashes {
    #[default]
    Reject,
    Keep,
    Decode,
}

type Report<'a> = dyn FnMut(&str, String, Option<&str>) + 'a;

/// Checks one filter at `base` (`filters[0]`, `routes[2].filters[1]`).
pub(crate) fn validate_filter(f: &Filter, base: &str, route: Option<&Route>, err: &mut Report<'_>) {
    match f {
        Filter::Headers(h) => {
            for (side, edits) in [("request", &h.request), ("response", &h.response)] {
                let names = edits.set.keys().chain(edits.add.keys()).chain(edits.remove.iter());
                for name in names {
                    let at = format!("{base}.headers.{side}");
                    if !is_token(name) {
                        err(
                            &at,
                            format!("invalid header name {name:?}"),
                            Some("header names are tokens such as x-tag"),
                        );
                    } else if OWNED_HEADERS.iter().any(|o| o.eq_ignore_ascii_case(name))
                        || (side == "response" && name.eq_ignore_ascii_case("host"))
                    {
                        err(
                            &at,
                            format!("{name:?} cannot be changed by a filter: Portico writes it"),
                            Some("framing, hop-by-hop and x-forwarded-* headers follow the connection"),
                        );
                    }
                }
                for (name, value) in edits.set.iter().chain(edits.add.iter()) {
                    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                        err(&format!("{base}.headers.{side}"), format!("the value of {name:?} has a line break"), None);
                    }
                }
            }
        }
        Filter::Rewrite(r) => {
            let given = [r.path.is_some(), r.strip_prefix.is_some(), r.replace_prefix.is_some(), r.regex.is_some()];
            if given.iter().filter(|g| **g).count() != 1 {
                err(
                    &format!("{base}.rewrite"),
                    "a rewrite needs exactly one of `path`, `strip_prefix`, `replace_prefix` and `regex`".into(),
                    Some("for example `rewrite: { strip_prefix: /api }`"),
                );
            }
            if r.regex.is_some() != r.replacement.is_some() {
                err(
                    &format!("{base}.rewrite"),
                    "`regex` and `replacement` go together".into(),
                    Some("for example `rewrite: { regex: \"^/old/(.*)\", replacement: \"/new/$1\" }`"),
                );
            }
            for (key, value) in
                [("path", &r.path), ("strip_prefix", &r.strip_prefix), ("replace_prefix", &r.replace_prefix)]
            {
                if value.as_ref().is_some_and(|v| !v.starts_with('/')) {
                    err(&format!("{base}.rewrite.{key}"), format!("{key} must start with '/'"), None);
                }
            }
            if r.replace_prefix.is_some() && route.is_some_and(|r| r.matcher.path_prefix.is_none()) {
                err(
                    &format!("{base}.rewrite.replace_prefix"),
                    "replace_prefix replaces the route's `path_prefix`, and this route has none".into(),
                    Some("match with `path_prefix`, or use `strip_prefix` or `regex`"),
                );
            }
            if route.is_none() && (r.path.is_some() || r.replace_prefix.is_some()) {
                err(
                    &format!("{base}.rewrite"),
                    "a global rewrite cannot use the route's path (`path`, `replace_prefix`)".into(),
                    Some("move it into the route's `filters:`"),
                );
            }
        }
        // Whether the function exists is checked with the configuration's `functions:` (validate.rs).
        Filter::Function(_) => {}
        Filter::AuthBasic(a) => crate::access::validate_auth_basic(a, base, err),
        Filter::ApiKey(k) => crate::access::validate_api_key(k, base, err),
        Filter::Ip(f) => crate::access::validate_ip(f, base, err),
        Filter::Jwt(j) => crate::jwt::validate_jwt(j, base, err),
        Filter::RateLimit(r) => crate::rate_limit::validate_rate_limit(r, base, err),
        Filter::Limits(l) => crate::limits::validate_limits(l, base, route.is_none(), err),
        Filter::Decompress(d) => {
            crate::transform::validate_decompress(d, base, err);
            crate::transform::validate_codings(&d.encodings, &format!("{base}.decompress.encodings"), err);
        }
        Filter::Query(q) => crate::transform::validate_query(q, base, err),
        Filter::Compress(c) => {
            if !(1..=9).contains(&c.level) {
                err(&format!("{base}.compress.level"), format!("level {} is not from 1 to 9", c.level), None);
            }
            if c.brotli_level > 11 {
                err(
                    &format!("{base}.compress.brotli_level"),
                    format!("brotli_level {} is not from 0 to 11", c.brotli_level),
                    None,
                );
            }
            if !(1..=22).contains(&c.zstd_level) {
                err(
                    &format!("{base}.compress.zstd_level"),
                    format!("zstd_level {} is not from 1 to 22", c.zstd_level),
                    None,
                );
            }
            if c.encodings.is_empty() {
                err(
                    &format!("{base}.compress.encodings"),
                    "no coding to offer".into(),
                    Some("list some of zstd, br and gzip"),
                );
            }
            crate::transform::validate_codings(&c.encodings, &format!("{base}.compress.encodings"), err);
            for (j, t) in c.types.iter().enumerate() {
                let ok = t.split_once('/').is_some_and(|(ty, sub)| is_token(ty) && (sub == "*" || is_token(sub)));
                if !ok {
                    err(
                        &format!("{base}.compress.types[{j}]"),
                        format!("{t:?} is not a media type"),
                        Some("for example text/html, application/json or text/*"),
                    );
                }
            }
        }
        Filter::Cors(c) => {
            if c.allow_origins.is_empty() {
                err(
                    &format!("{base}.cors.allow_origins"),
                    "no origin is allowed".into(),
                    Some("list origins, or \"*\""),
                );
            }
            for (j, origin) in c.allow_origins.iter().enumerate() {
                let ok = origin == "*"
                    || ((origin.starts_with("https://") || origin.starts_with("http://"))
                        && !origin.trim_end_matches('/').contains(['?', '#', ' '])
                        && origin.matches('/').count() == 2);
                if !ok {
                    err(
                        &format!("{base}.cors.allow_origins[{j}]"),
                        format!("{origin:?} is not an origin"),
                        Some("an origin is scheme://host[:port] without a path, such as https://app.example.com"),
                    );
                }
            }
            if c.allow_credentials && c.allow_origins.iter().any(|o| o == "*") {
                err(
                    &format!("{base}.cors.allow_credentials"),
                    "credentials cannot be allowed for every origin (\"*\")".into(),
                    Some("list the origins that may send credentials"),
                );
            }
            for (key, list) in [("allow_methods", &c.allow_methods), ("allow_headers", &c.allow_headers)] {
                for (j, v) in list.iter().enumerate() {
                    if v != "*" && !is_token(v) {
                        err(&format!("{base}.cors.{key}[{j}]"), format!("{v:?} is not a token"), None);
                    }
                }
            }
            for (j, v) in c.expose_headers.iter().enumerate() {
                if !is_token(v) {
                    err(&format!("{base}.cors.expose_headers[{j}]"), format!("{v:?} is not a header name"), None);
                }
            }
        }
    }
}

/// `mqtt_publish:` publish the request body to a topic of the MQTT broker.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttPublish {
    /// The topic: `{path}` is the request path after the route's `path_prefix` (the whole path without its
    /// leading `/` otherwise), percent-decoded; `{NAME}` a path parameter of the route (`/in/:device`).
    pub topic: String,
    #[serde(default)]
    pub qos: u8,
    #[serde(default)]
    pub retain: bool,
}

/// `mqtt:` on a route: how the broker is reached through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MqttRoute {
    /// MQTT over WebSocket: an HTTP/1.1 WebSocket handshake offering the `mqtt` subprotocol, answered `101`,
    /// and the connection then served by the broker (binary frames carry the MQTT bytes).
    Websocket,
}

/// Checks one route's target and match (references to clusters are checked by the caller).
pub(crate) fn validate_route(r: &Route, base: &str, loaded: &crate::LoadedConfig, err: &mut Report<'_>) {
    let targets = [
        r.cluster.is_some(),
        r.static_response.is_some(),
        r.redirect.is_some(),
        r.handler.is_some(),
        r.function.is_some(),
        r.mqtt_publish.is_some(),
        r.mqtt.is_some(),
    ];
    match targets.iter().filter(|t| **t).count() {
        1 => {}
        0 => err(
            base,
            "the route has no target".into(),
            Some(
                "give it one of `cluster: NAME`, `static: { body: ... }`, `redirect: { to: ... }`, `handler: echo`, \
                 `function: NAME`, `mqtt_publish: { topic: ... }` or `mqtt: websocket`",
            ),
        ),
        _ => err(
            base,
            "a route has exactly one target: `cluster`, `static`, `redirect`, `handler`, `function`, `mqtt_publish` \
             or `mqtt`"
                .into(),
            Some("split it into two routes"),
        ),
    }
    if let Some(m) = &r.mqtt_publish {
        if m.qos > 2 {
            err(&format!("{base}.mqtt_publish.qos"), format!("qos must be 0, 1 or 2, got {}", m.qos), None);
        }
        if m.topic.is_empty() || m.topic.contains(['+', '#']) {
            err(
                &format!("{base}.mqtt_publish.topic"),
                format!("{:?} is not a topic name (not empty, no `+` or `#`)", m.topic),
                Some("for example `topic: \"{path}\"` or `topic: \"devices/{id}/in\"`"),
            );
        }
    }
    if let Some(Some(b)) = r.request_buffering.as_ref().map(|_| r.buffering()) {
        let key = format!("{base}.request_buffering");
        if b.max_size.0 == 0 {
            err(
                &format!("{key}.max_size"),
                "max_size must be above 0".into(),
                Some("to stream bodies instead, write `request_buffering: false`"),
            );
        }
        if let Some(memory) = b.memory.filter(|m| m.0 > b.max_size.0) {
            err(&format!("{key}.memory"), format!("memory ({memory}) is above max_size ({})", b.max_size), None);
        }
        if let Some(dir) = b.temp_dir.as_deref().map(|d| loaded.resolve(d)) {
            match std::fs::metadata(&dir) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => err(&format!("{key}.temp_dir"), format!("{} is not a directory", dir.display()), None),
                Err(e) => err(
                    &format!("{key}.temp_dir"),
                    format!("cannot use {}: {e}", dir.display()),
                    Some(
                        "create the directory, writable by the user Portico runs as, or leave temp_dir out for $TMPDIR",
                    ),
                ),
            }
        }
    }
    if let Some(name) = r.handler.as_deref().filter(|h| !HANDLERS.contains(h)) {
        err(
            &format!("{base}.handler"),
            format!("unknown handler {name:?}"),
            Some(&format!("the handlers built into Portico: {}", HANDLERS.join(", "))),
        );
    }
    if let Some(s) = &r.static_response {
        if !(200..=599).contains(&s.status) {
            err(&format!("{base}.static.status"), format!("{} is not a final status", s.status), None);
        }
        if s.body.is_some() && s.file.is_some() {
            err(&format!("{base}.static"), "`body` and `file` are exclusive".into(), None);
        }
        for (name, value) in &s.headers {
            if !is_token(name) || name.eq_ignore_ascii_case("content-length") {
                err(&format!("{base}.static.headers.{name}"), format!("invalid header name {name:?}"), None);
            }
            if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                err(&format!("{base}.static.headers.{name}"), "the value has a line break".into(), None);
            }
        }
    }
    if let Some(redirect) = &r.redirect {
        if ![301, 302, 303, 307, 308].contains(&redirect.status) {
            err(
                &format!("{base}.redirect.status"),
                "a redirect status must be 301, 302, 303, 307 or 308".into(),
                Some("308 keeps the method and body; 301 is what browsers cache"),
            );
        }
        if redirect.to.is_empty() || redirect.to.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            err(
                &format!("{base}.redirect.to"),
                "the location is empty or has spaces or control characters".into(),
                None,
            );
        }
    }
    if let Some(query) = &r.matcher.query {
        for name in query.keys() {
            if name.is_empty() {
                err(&format!("{base}.match.query"), "an empty query parameter name".into(), None);
            }
        }
    }
    for (j, f) in r.filters.iter().enumerate() {
        validate_filter(f, &format!("{base}.filters[{j}]"), Some(r), err);
    }
}

#[cfg(test)]
mod tests {
    use crate::load_str;

    const BASE: &str = "listeners: [ { name: web, address: 127.0.0.1:8080 } ]\nclusters:\n  users: { endpoints: [ { address: 127.0.0.1:9001 } ] }\n  api: { endpoints: [ { address: 127.0.0.1:9002 } ] }\n";

    /// Every error of `routes` (appended to a valid base), as `line:col message`.
    fn errors(extra: &str) -> Vec<String> {
        crate::test_support::errors_of(&format!("{BASE}{extra}"))
    }

    #[test]
    fn the_issue_examples_load() {
        let yaml = r#"
filters:
  - headers: { response: { set: { x-served-by: portico } } }
routes:
  - match: { path: /users/:id, methods: [GET, PUT] }
    cluster: users
    filters:
      - rewrite: { path: /v2/users/:id }
  - match: { path_prefix: /static/ }
    static: { status: 200, body: "ok\n", headers: { content-type: text/plain } }
  - match: { host: old.example.com }
    redirect: { to: "https://new.example.com{path}", status: 308 }
  - match: { path_prefix: /api/, query: { v: "2" } }
    cluster: api
    filters:
      - headers:
          request:  { set: { x-api-version: "2" }, add: { x-tag: a }, remove: [cookie] }
          response: { set: { cache-control: no-store }, remove: [server] }
      - rewrite: { strip_prefix: /api }
      - cors: { allow_origins: ["https://app.example.com"], allow_methods: [GET, POST], allow_headers: [content-type], allow_credentials: true, max_age: 10m }
"#;
        let loaded = load_str(&format!("{BASE}{yaml}"), "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let cfg = &loaded.config;
        assert_eq!(cfg.filters.len(), 1);
        assert_eq!(cfg.routes.len(), 4);
        assert!(matches!(cfg.routes[0].filters[0], super::Filter::Rewrite(_)));
        assert_eq!(cfg.routes[1].static_response.as_ref().map(|s| s.status), Some(200));
        assert_eq!(cfg.routes[2].redirect.as_ref().map(|r| r.status), Some(308));
        assert_eq!(cfg.routes[3].filters.iter().map(|f| f.kind()).collect::<Vec<_>>(), ["headers", "rewrite", "cors"]);
    }

    #[test]
    fn default_names_say_what_a_route_matches_and_stay_unique() {
        let yaml = r#"
routes:
  - { match: { path: /users/:id, methods: [get, PUT] }, cluster: users }
  - { match: { host: API.example.com, path_prefix: /api/ }, cluster: api }
  - { match: { path_prefix: /api, query: { v: "2" }, headers: { X-Canary: "1" } }, cluster: api }
  - { name: "/healthz", match: { path: /status }, static: { body: ok } }
  - { match: { path: /healthz }, static: { body: ok } }
  - { match: { path: /healthz }, static: { body: ok } }
  - { cluster: api }
"#;
        let loaded = load_str(&format!("{BASE}{yaml}"), "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            super::route_names(&loaded.config.routes),
            [
                "GET,PUT /users/:id",
                "api.example.com/api/*",
                "/api/*?v=2 x-canary=1",
                "/healthz",
                "/healthz#2",
                "/healthz#3",
                "/*"
            ]
        );
        // Another route above changes no name.
        let above = yaml.replacen("routes:\n", "routes:\n  - { match: { path: /new }, cluster: api }\n", 1);
        let loaded = load_str(&format!("{BASE}{above}"), "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            super::route_names(&loaded.config.routes)[1..],
            super::route_names(&load_str(&format!("{BASE}{yaml}"), "t.yaml").unwrap().config.routes)
        );
    }

    #[test]
    fn route_names_given_are_unique() {
        let e = errors("routes:\n  - { name: api, cluster: api }\n  - { name: api, cluster: users }\n");
        assert!(e.iter().any(|e| e.starts_with("7:13") && e.contains("route name \"api\" is used twice")), "{e:?}");
    }

    #[test]
    fn a_route_has_exactly_one_target() {
        let none = errors("routes:\n  - match: { path: /x }\n");
        assert!(none.iter().any(|e| e.starts_with("6:5") && e.contains("no target")), "{none:?}");
        let two = errors("routes:\n  - cluster: api\n    redirect: { to: /y }\n");
        assert!(two.iter().any(|e| e.contains("exactly one target")), "{two:?}");
        let two = errors("routes:\n  - cluster: api\n    handler: echo\n");
        assert!(two.iter().any(|e| e.contains("exactly one target")), "{two:?}");
        assert!(errors("routes:\n  - handler: echo\n").is_empty());
        let unknown = errors("routes:\n  - handler: ech\n");
        assert!(unknown.iter().any(|e| e.starts_with("6:14") && e.contains("unknown handler \"ech\"")), "{unknown:?}");
    }

    #[test]
    fn filter_mistakes_are_reported_at_their_position() {
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - rewrite: { strip_prefix: /a, path: /b }\n");
        assert!(e.iter().any(|e| e.starts_with("8:9") && e.contains("exactly one of")), "{e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - rewrite: { replace_prefix: /b }\n");
        assert!(e.iter().any(|e| e.contains("has none")), "{e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - cors: { allow_origins: [\"*\"], allow_credentials: true }\n");
        assert!(e.iter().any(|e| e.contains("credentials cannot be allowed")), "{e:?}");
        let e = errors(
            "routes:\n  - cluster: api\n    filters:\n      - cors: { allow_origins: [\"https://a.example/path\"] }\n",
        );
        assert!(e.iter().any(|e| e.contains("is not an origin")), "{e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - headers: { request: { set: { content-length: \"1\" } } }\n");
        assert!(e.iter().any(|e| e.contains("Portico writes it")), "{e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - gzip: {}\n");
        assert!(!e.is_empty(), "an unknown filter kind is an error");
        let e = errors("routes:\n  - redirect: { to: /x, status: 200 }\n");
        assert!(e.iter().any(|e| e.contains("301, 302, 303, 307 or 308")), "{e:?}");
    }
}
