//! Checks that serde cannot express: references between sections, address syntax, value ranges.

use crate::schema::{BalancerKind, HashOn};
use crate::{Diagnostic, LoadedConfig};
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

/// An upstream address as written: an IP literal or a DNS name, and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
    pub ip: Option<IpAddr>,
}

impl HostPort {
    /// `host:port` as it would appear in a `Host` header (IPv6 in brackets).
    pub fn authority(&self) -> String {
        match self.ip {
            Some(IpAddr::V6(_)) => format!("[{}]:{}", self.host, self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }
}

/// Parses `127.0.0.1:80`, `[::1]:80` or `backend.internal:80`.
pub fn parse_host_port(text: &str) -> Result<HostPort, String> {
    if let Ok(sa) = text.parse::<SocketAddr>() {
        return Ok(HostPort { host: sa.ip().to_string(), port: sa.port(), ip: Some(sa.ip()) });
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("{text:?} has no port"));
    };
    if host.starts_with('[') || host.contains(':') {
        return Err(format!("{text:?} is not a valid [IPv6]:port address"));
    }
    let port: u16 = port.parse().map_err(|_| format!("{text:?} has an invalid port {port:?}"))?;
    if port == 0 {
        return Err(format!("{text:?} has port 0"));
    }
    let valid_name = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
        });
    if !valid_name {
        return Err(format!("{host:?} is neither an IP address nor a valid DNS name"));
    }
    Ok(HostPort { host: host.to_ascii_lowercase(), port, ip: None })
}

/// How an endpoint is reached, from its address's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointScheme {
    /// No scheme: plain, unless the cluster has `tls:`.
    Unspecified,
    Http,
    Https,
}

/// Parses an endpoint address: `host:port`, or `http://host[:port]` / `https://host[:port]` (no path).
pub fn parse_endpoint(text: &str) -> Result<(EndpointScheme, HostPort), String> {
    let (scheme, rest, default_port) = if let Some(rest) = strip_prefix_ignore_case(text, "https://") {
        (EndpointScheme::Https, rest, 443)
    } else if let Some(rest) = strip_prefix_ignore_case(text, "http://") {
        (EndpointScheme::Http, rest, 80)
    } else if text.contains("://") {
        return Err(format!("{text:?} has an unsupported scheme (use http:// or https://)"));
    } else {
        return parse_host_port(text).map(|hp| (EndpointScheme::Unspecified, hp));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') || rest.contains('?') {
        return Err(format!("{text:?} has a path; an endpoint is only scheme, host and port"));
    }
    let has_port = match rest.rfind(']') {
        Some(close) => rest[close..].contains(':'),
        None => rest.contains(':'),
    };
    let hp = if has_port { parse_host_port(rest) } else { parse_host_port(&format!("{rest}:{default_port}")) }?;
    Ok((scheme, hp))
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &text[prefix.len()..])
}

use crate::fields::is_token;

/// `left_out`: what the schema refused, so that what refers to it is not reported too.
pub(crate) fn validate(loaded: &LoadedConfig, left_out: &crate::LeftOut) -> Vec<Diagnostic> {
    let cfg = &loaded.config;
    let mut out = Vec::new();
    let mut err = |path: &str, msg: String, hint: Option<&str>| {
        out.push(loaded.diagnostic(path, msg, hint.map(str::to_string)));
    };

    if cfg.group.is_some() && cfg.user.is_none() && !left_out.setting("user") {
        err("group", "`group` without `user`".into(), Some("give the user to switch to as well"));
    }
    if cfg.listeners.is_empty() && !left_out.any_listener() {
        err(
            "listeners",
            "no listeners: Portico would accept nothing".into(),
            Some("add `listeners: [{ name: web, address: 127.0.0.1:8080 }]`"),
        );
    }
    let mut names = HashSet::new();
    let mut addrs = HashSet::new();
    for (i, l) in cfg.listeners.iter().enumerate() {
        let base = format!("listeners[{i}]");
        if l.name.is_empty() {
            err(&format!("{base}.name"), "listener name is empty".into(), Some("name it, for example `name: web`"));
        } else if !names.insert(l.name.as_str()) {
            err(
                &format!("{base}.name"),
                format!("listener name {:?} is used twice", l.name),
                Some("give every listener its own name"),
            );
        }
        match l.address.parse::<SocketAddr>() {
            Ok(sa) => {
                if !addrs.insert(sa) {
                    err(
                        &format!("{base}.address"),
                        format!("address {sa} is used by two listeners"),
                        Some("give each listener its own IP:PORT"),
                    );
                }
            }
            Err(_) => err(
                &format!("{base}.address"),
                format!("invalid listener address {:?}", l.address),
                Some("write IP:PORT, for example 127.0.0.1:8080, 0.0.0.0:80 or [::]:8080"),
            ),
        }
        let lim = &l.limits;
        if lim.max_headers == 0 || lim.max_headers > 1000 {
            err(
                &format!("{base}.limits.max_headers"),
                format!("max_headers must be between 1 and 1000, got {}", lim.max_headers),
                None,
            );
        }
        if lim.max_request_line.0 < 64 {
            err(
                &format!("{base}.limits.max_request_line"),
                "max_request_line must be at least 64 bytes".into(),
                Some("the default is 8KiB"),
            );
        }
        if lim.max_header_bytes.0 < lim.max_request_line.0 {
            err(
                &format!("{base}.limits.max_header_bytes"),
                "max_header_bytes must be at least max_request_line".into(),
                None,
            );
        }
        if lim.max_header_bytes.0 > 1 << 20 {
            err(
                &format!("{base}.limits.max_header_bytes"),
                "max_header_bytes may be at most 1MiB".into(),
                Some("the default is 32KiB"),
            );
        }
        if lim.max_connections == Some(0) {
            err(
                &format!("{base}.limits.max_connections"),
                "max_connections must be at least 1".into(),
                Some("leave it out to derive it from the open-file limit"),
            );
        }
        let h2 = &l.http2;
        if h2.max_concurrent_streams == 0 {
            err(
                &format!("{base}.http2.max_concurrent_streams"),
                "max_concurrent_streams must be at least 1".into(),
                None,
            );
        }
        for (key, size) in [
            ("initial_stream_window", h2.initial_stream_window),
            ("initial_connection_window", h2.initial_connection_window),
        ] {
            if size.0 < 65_535 || size.0 > (1 << 31) - 1 {
                err(
                    &format!("{base}.http2.{key}"),
                    format!("{key} must be between 65535 bytes and 2GiB - 1 (RFC 9113 6.9.2)"),
                    Some("the default is 1MiB per stream, 2MiB per connection"),
                );
            }
        }
        if h2.max_frame_size.0 < 16_384 || h2.max_frame_size.0 > (1 << 24) - 1 {
            err(
                &format!("{base}.http2.max_frame_size"),
                "max_frame_size must be between 16KiB and 16MiB - 1 (RFC 9113 6.5.2)".into(),
                None,
            );
        }
        if h2.max_header_list_size.0 < 1024 || h2.max_header_list_size.0 > 1 << 20 {
            err(
                &format!("{base}.http2.max_header_list_size"),
                "max_header_list_size must be between 1KiB and 1MiB".into(),
                None,
            );
        }
        if let Some(tls) = &l.tls {
            if tls.certificates.is_empty() {
                err(
                    &format!("{base}.tls.certificates"),
                    "a TLS listener needs at least one certificate".into(),
                    Some("add `certificates: [{ cert: site.pem, key: site.key }]`"),
                );
            }
            if tls.certificates.iter().filter(|c| c.default).count() > 1 {
                err(
                    &format!("{base}.tls.certificates"),
                    "more than one certificate is marked `default: true`".into(),
                    Some("mark one, or none to use the first"),
                );
            }
            let mqtt = l.protocol == crate::schema::ListenerProtocol::Mqtt;
            for (j, proto) in tls.alpn.iter().flatten().enumerate() {
                match proto.as_str() {
                    "mqtt" if mqtt => {}
                    _ if mqtt => err(
                        &format!("{base}.tls.alpn[{j}]"),
                        format!("ALPN protocol {proto:?} on an MQTT listener"),
                        Some("offer `[mqtt]`, or leave `alpn` out to negotiate none"),
                    ),
                    "http/1.1" | "http/1.0" => {}
                    "h2" if l.http2.enabled => {}
                    "h2" => err(
                        &format!("{base}.tls.alpn[{j}]"),
                        "ALPN offers h2 but http2.enabled is false".into(),
                        Some("remove h2, or enable http2"),
                    ),
                    _ => err(
                        &format!("{base}.tls.alpn[{j}]"),
                        format!("ALPN protocol {proto:?} is not supported"),
                        Some("offer `h2` and `http/1.1`"),
                    ),
                }
            }
            if tls.alpn.as_ref().is_some_and(Vec::is_empty) && !mqtt {
                err(&format!("{base}.tls.alpn"), "alpn is empty".into(), Some("offer `[h2, http/1.1]`"));
            }
            if tls.client_auth.is_some() && tls.client_ca.is_none() {
                err(
                    &format!("{base}.tls.client_auth"),
                    "client_auth without client_ca verifies no one".into(),
                    Some("add `client_ca: clients-ca.pem`, or remove client_auth"),
                );
            }
            let header = tls.client_cert_header.to_ascii_lowercase();
            let protocol_header = matches!(
                header.as_str(),
                "host"
                    | "content-length"
                    | "transfer-encoding"
                    | "connection"
                    | "keep-alive"
                    | "te"
                    | "trailer"
                    | "upgrade"
                    | "expect"
                    | "via"
                    | "cookie"
            ) || header.starts_with("x-forwarded-")
                || header.starts_with("proxy-");
            if protocol_header {
                err(
                    &format!("{base}.tls.client_cert_header"),
                    format!("{:?} is a header the proxy itself manages", tls.client_cert_header),
                    Some("use a header of its own, for example `x-client-cert-subject`"),
                );
            }
            if !is_token(&tls.client_cert_header) {
                err(
                    &format!("{base}.tls.client_cert_header"),
                    format!("{:?} is not a valid header name", tls.client_cert_header),
                    Some("for example `x-client-cert-subject`"),
                );
            }
            if tls.handshake_timeout.0.is_zero() {
                err(&format!("{base}.tls.handshake_timeout"), "handshake_timeout must be above 0".into(), None);
            }
        }
    }

    crate::mqtt::validate(cfg, left_out, &mut err);
    crate::mqtt::validate_routes(loaded, left_out, &mut err);

    for (j, f) in cfg.filters.iter().enumerate() {
        crate::route::validate_filter(f, &format!("filters[{j}]"), None, &mut err);
        if let crate::route::Filter::Function(function) = f {
            if !cfg.functions.contains_key(function) {
                let at = format!("filters[{j}].function");
                err(
                    &at,
                    format!("filter refers to unknown function {function:?}"),
                    Some("define it under `functions:`"),
                );
            }
        }
    }
    let mut route_names = HashSet::new();
    for (i, r) in cfg.routes.iter().enumerate() {
        let base = format!("routes[{i}]");
        match r.name.as_deref() {
            Some("") => err(
                &format!("{base}.name"),
                "route name is empty".into(),
                Some("name it, or leave `name` out for a name made from what the route matches"),
            ),
            Some(name) if !route_names.insert(name) => err(
                &format!("{base}.name"),
                format!("route name {name:?} is used twice"),
                Some("a name labels one route's metrics and log lines: give every route its own"),
            ),
            _ => {}
        }
        if let Some(redirect) = r.redirect_https.as_ref().and_then(|r| r.settings()) {
            if redirect.status.is_some_and(|st| ![301, 302, 307, 308].contains(&st)) {
                err(
                    &format!("{base}.redirect_https.status"),
                    "a redirect status must be 301, 302, 307 or 308".into(),
                    Some("308 keeps the method and body; 301 is what browsers cache"),
                );
            }
            if redirect.port == Some(0) {
                err(&format!("{base}.redirect_https.port"), "port 0 is not a port".into(), None);
            }
            if !cfg.listeners.iter().any(|l| l.tls.is_some()) && redirect.port.is_none() && !left_out.any_listener() {
                err(
                    &format!("{base}.redirect_https"),
                    "redirect_https sends clients to HTTPS, but no listener has `tls:`".into(),
                    Some("add a TLS listener, or give the HTTPS server's port: `redirect_https: { port: 443 }`"),
                );
            }
        }
        crate::route::validate_route(r, &base, loaded, &mut err);
        if let Some(cluster) = r.cluster.as_ref().filter(|c| !cfg.clusters.contains_key(*c) && !left_out.cluster(c)) {
            let known: Vec<&str> = cfg.clusters.keys().map(String::as_str).collect();
            let hint = if known.is_empty() {
                "define it under `clusters:`".to_string()
            } else {
                format!("known clusters: {}", known.join(", "))
            };
            err(&format!("{base}.cluster"), format!("route refers to unknown cluster {cluster:?}"), Some(&hint));
        }
        let known_functions = || {
            let known: Vec<&str> = cfg.functions.keys().map(String::as_str).collect();
            if known.is_empty() {
                "define it under `functions:` with its `source` file".to_string()
            } else {
                format!("known functions: {}", known.join(", "))
            }
        };
        if let Some(function) = r.function.as_ref().filter(|f| !cfg.functions.contains_key(*f)) {
            let hint = known_functions();
            err(&format!("{base}.function"), format!("route refers to unknown function {function:?}"), Some(&hint));
        }
        for (j, f) in r.filters.iter().enumerate() {
            if let crate::route::Filter::Function(function) = f {
                if !cfg.functions.contains_key(function) {
                    let (at, hint) = (format!("{base}.filters[{j}].function"), known_functions());
                    err(&at, format!("filter refers to unknown function {function:?}"), Some(&hint));
                }
            }
        }
        let m = &r.matcher;
        if m.path.is_some() && m.path_prefix.is_some() {
            err(
                &format!("{base}.match.path"),
                "a route can match `path` or `path_prefix`, not both".into(),
                Some("split it into two routes"),
            );
        }
        for (key, value) in [("path", &m.path), ("path_prefix", &m.path_prefix)] {
            if let Some(p) = value {
                if !p.starts_with('/') {
                    err(
                        &format!("{base}.match.{key}"),
                        format!("{key} {p:?} must start with '/'"),
                        Some(&format!("write `{key}: /{}`", p.trim_start_matches('/'))),
                    );
                }
            }
        }
        if let Some(host) = &m.host {
            let bare = host.strip_prefix("*.").unwrap_or(host);
            if bare.is_empty() || bare.contains(['/', ' ', '*']) {
                err(
                    &format!("{base}.match.host"),
                    format!("invalid host {host:?}"),
                    Some("write a name like example.com or *.example.com, without scheme or port"),
                );
            }
        }
        if let Some(methods) = &m.methods {
            if methods.is_empty() {
                err(
                    &format!("{base}.match.methods"),
                    "methods is empty, so the route could never match".into(),
                    Some("remove the key to match every method"),
                );
            }
            for (j, method) in methods.iter().enumerate() {
                if !is_token(method) {
                    err(
                        &format!("{base}.match.methods[{j}]"),
                        format!("invalid method {method:?}"),
                        Some("methods are tokens such as GET, POST, PUT, DELETE"),
                    );
                }
            }
        }
        if let Some(headers) = &m.headers {
            for name in headers.keys() {
                if !is_token(name) {
                    err(
                        &format!("{base}.match.headers.{name}"),
                        format!("invalid header name {name:?}"),
                        Some("header names are tokens such as x-canary, without spaces or a colon"),
                    );
                }
            }
        }
    }

    for (name, f) in &cfg.functions {
        let base = format!("functions.{name}");
        let source = loaded.resolve(&f.source);
        if let Err(e) = std::fs::metadata(&source) {
            err(
                &format!("{base}.source"),
                format!("cannot read {}: {e}", source.display()),
                Some("a path relative to the configuration file's directory, to a .js file"),
            );
        }
        for (key, source) in &f.secrets {
            if f.env.contains_key(key) {
                err(&format!("{base}.secrets.{key}"), format!("{key:?} is in `env` too"), Some("give it one place"));
            }
            if let Err(message) = source.read(loaded) {
                err(
                    &format!("{base}.secrets.{key}"),
                    message,
                    Some("set it for the Portico process, or name another source"),
                );
            }
        }
        if f.limits.cpu.0.is_zero() {
            err(&format!("{base}.limits.cpu"), "cpu must be above 0".into(), Some("for example 50ms"));
        }
        if f.limits.memory.0 < 1 << 20 {
            err(&format!("{base}.limits.memory"), "memory must be at least 1MiB".into(), Some("for example 32MiB"));
        }
        if f.limits.startup.0 < std::time::Duration::from_millis(10) {
            err(&format!("{base}.limits.startup"), "startup must be at least 10ms".into(), Some("for example 1s"));
        }
    }

    for (name, c) in &cfg.clusters {
        let base = format!("clusters.{name}");
        if c.endpoints.is_empty() {
            err(
                &format!("{base}.endpoints"),
                format!("cluster {name:?} has no endpoints"),
                Some("add `endpoints: [{ address: 127.0.0.1:9001 }]`"),
            );
        }
        let mut seen = HashSet::new();
        for (j, e) in c.endpoints.iter().enumerate() {
            let path = format!("{base}.endpoints[{j}]");
            match parse_endpoint(&e.address) {
                Ok((_, hp)) => {
                    if !seen.insert(hp.clone()) {
                        err(
                            &format!("{path}.address"),
                            format!("endpoint {} is listed twice", e.address),
                            Some("use `weight` to send it more traffic"),
                        );
                    }
                }
                Err(msg) => err(
                    &format!("{path}.address"),
                    format!("invalid endpoint address: {msg}"),
                    Some("write host:port, [ipv6]:port or dns-name:port"),
                ),
            }
            if e.weight == 0 || e.weight > 10_000 {
                err(
                    &format!("{path}.weight"),
                    format!("weight must be between 1 and 10000, got {}", e.weight),
                    Some("remove the endpoint to stop sending it traffic"),
                );
            }
        }
        if c.health_check.as_ref().is_some_and(|h| h.kind == crate::schema::HealthCheckKind::Grpc)
            && c.protocol != crate::schema::UpstreamProtocol::H2
        {
            err(
                &format!("{base}.health_check.type"),
                "gRPC health checks need `protocol: h2`".into(),
                Some("gRPC runs over HTTP/2: set `protocol: h2` on the cluster"),
            );
        }
        if c.timeouts.tunnel.0.is_zero() {
            err(&format!("{base}.timeouts.tunnel"), "tunnel must be above 0".into(), Some("the default is 1h"));
        }
        if let Some(tls) = &c.tls {
            if tls.cert.is_some() != tls.key.is_some() {
                err(
                    &format!("{base}.tls"),
                    "a client certificate needs both `cert` and `key`".into(),
                    Some("give both files, or neither"),
                );
            }
            if tls.insecure_skip_verify && tls.ca.is_some() {
                err(
                    &format!("{base}.tls.insecure_skip_verify"),
                    "`insecure_skip_verify: true` ignores `ca`".into(),
                    Some("remove one of them"),
                );
            }
        }
        if c.balancer == BalancerKind::ConsistentHash
            && matches!(c.hash.key, HashOn::Header | HashOn::Cookie)
            && c.hash.name.as_deref().is_none_or(str::is_empty)
        {
            err(
                &format!("{base}.hash"),
                "hash.key header/cookie needs hash.name".into(),
                Some("for example `hash: { key: header, name: x-user-id }`"),
            );
        }
        if c.balancer == BalancerKind::StickyCookie && !is_token(&c.sticky.cookie) {
            err(
                &format!("{base}.sticky.cookie"),
                format!("invalid cookie name {:?}", c.sticky.cookie),
                Some("cookie names are tokens: letters, digits and !#$%&'*+-.^_`|~"),
            );
        }
        if c.timeouts.connect.0.is_zero()
            || c.timeouts.response_header.0.is_zero()
            || c.timeouts.read.0.is_zero()
            || c.timeouts.send.0.is_zero()
        {
            err(
                &format!("{base}.timeouts"),
                "upstream timeouts must be greater than zero".into(),
                Some("for example `timeouts: { connect: 3s }`"),
            );
        }
        if let Some(hc) = &c.health_check {
            let hb = format!("{base}.health_check");
            if !hc.path.starts_with('/') {
                err(
                    &format!("{hb}.path"),
                    format!("health check path {:?} must start with '/'", hc.path),
                    Some("for example `path: /health`"),
                );
            }
            if !is_token(&hc.method) {
                err(
                    &format!("{hb}.method"),
                    format!("invalid method {:?}", hc.method),
                    Some("for example GET or HEAD"),
                );
            }
            if hc.status_range().is_none() {
                err(
                    &format!("{hb}.expected_status"),
                    format!("invalid status range {:?}", hc.expected_status),
                    Some("write a status or a range between 100 and 599, like \"200-399\""),
                );
            }
            if hc.interval.0.is_zero() || hc.timeout.0.is_zero() {
                err(
                    &hb,
                    "health check interval and timeout must be greater than zero".into(),
                    Some("for example `interval: 1s, timeout: 500ms`"),
                );
            }
            if hc.healthy_after == 0 || hc.unhealthy_after == 0 {
                err(
                    &hb,
                    "healthy_after and unhealthy_after must be at least 1".into(),
                    Some("1 acts on the first result; 2 or 3 rides out flapping"),
                );
            }
        }
        let od = &c.outlier_detection;
        if od.max_ejected_percent > 100 {
            err(
                &format!("{base}.outlier_detection.max_ejected_percent"),
                format!("max_ejected_percent is a percentage, got {}", od.max_ejected_percent),
                Some("use 0 to 100"),
            );
        }
        if od.base_ejection.0 > od.max_ejection.0 {
            err(
                &format!("{base}.outlier_detection.base_ejection"),
                "base_ejection is longer than max_ejection".into(),
                Some("the ejection time grows from base_ejection up to max_ejection"),
            );
        }
        if c.pool.pipeline_depth > 64 {
            err(
                &format!("{base}.pool.pipeline_depth"),
                format!("at most 64 pipelined requests per connection, got {}", c.pool.pipeline_depth),
                Some("a deep pipeline makes every request wait for the slowest one ahead of it; 4 to 16 is usual"),
            );
        }
        let cb = &c.circuit_breaker;
        if cb.max_connections == 0 || cb.max_requests == 0 || cb.max_pending == 0 {
            err(
                &format!("{base}.circuit_breaker"),
                "max_connections, max_pending and max_requests must be at least 1".into(),
                Some("remove the key for the defaults"),
            );
        }
        let r = &c.retries;
        if r.attempts > 10 {
            err(
                &format!("{base}.retries.attempts"),
                format!("at most 10 retries, got {}", r.attempts),
                Some("a retry storm helps nobody; 1 to 3 is usual"),
            );
        }
        for (j, status) in r.on_status.iter().enumerate() {
            if !(400..=599).contains(status) {
                err(
                    &format!("{base}.retries.on_status[{j}]"),
                    format!("{status} is not an error status"),
                    Some("retry on 5xx statuses such as 502, 503, 504"),
                );
            }
        }
        if r.budget_percent > 100 {
            err(
                &format!("{base}.retries.budget_percent"),
                format!("budget_percent is a percentage, got {}", r.budget_percent),
                Some("use 0 to 100; 20 is usual"),
            );
        }
    }
    if let Some(admin) = &cfg.admin {
        if admin.address.parse::<SocketAddr>().is_err() {
            err(
                "admin.address",
                format!("invalid admin address {:?}", admin.address),
                Some("write IP:PORT, for example 127.0.0.1:9901"),
            );
        } else if cfg.listeners.iter().any(|l| l.address == admin.address) {
            err(
                "admin.address",
                "the admin address is also a listener's".into(),
                Some("give the admin server its own port"),
            );
        }
        if let Err(message) = admin.read_token(loaded) {
            let key =
                if admin.token_file.is_some() && admin.token.is_none() { "admin.token_file" } else { "admin.token" };
            err(key, message, Some("a long random string, for example from `openssl rand -hex 32`"));
        }
    }
    if let Some(log) = &cfg.access_log {
        if log.path.trim().is_empty() {
            err(
                "access_log.path",
                "access_log.path is empty".into(),
                Some("a file path, or \"-\" for standard output"),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ports() {
        assert_eq!(parse_host_port("127.0.0.1:80").unwrap().authority(), "127.0.0.1:80");
        let https = |t: &str| parse_endpoint(t).map(|(s, hp)| (s, hp.authority()));
        assert_eq!(https("https://api.example.com"), Ok((EndpointScheme::Https, "api.example.com:443".into())));
        assert_eq!(https("HTTPS://[::1]/"), Ok((EndpointScheme::Https, "[::1]:443".into())));
        assert_eq!(https("http://10.0.0.1:8080"), Ok((EndpointScheme::Http, "10.0.0.1:8080".into())));
        assert_eq!(https("10.0.0.1:8080"), Ok((EndpointScheme::Unspecified, "10.0.0.1:8080".into())));
        assert!(https("https://a.example/path").is_err());
        assert!(https("ftp://a.example:21").is_err());
        assert_eq!(parse_host_port("[::1]:9000").unwrap().authority(), "[::1]:9000");
        assert_eq!(parse_host_port("Backend.internal:81").unwrap().host, "backend.internal");
        assert!(parse_host_port("backend").is_err());
        assert!(parse_host_port("backend:0").is_err());
        assert!(parse_host_port("bad_name!:80").is_err());
        assert!(parse_host_port("::1:80").is_err());
    }

    #[test]
    fn reports_every_error_with_position() {
        let src = "listeners:\n  - name: web\n    address: nowhere\nroutes:\n  - cluster: missing\nclusters:\n  app:\n    endpoints:\n      - address: 127.0.0.1\n        weight: 0\n";
        let errs = crate::load_str(src, "t.yaml").unwrap_err().0;
        let text: Vec<String> = errs.iter().map(|d| format!("{}:{}: {}", d.line, d.col, d.message)).collect();
        assert_eq!(errs.len(), 4, "{text:#?}");
        assert!(text[0].starts_with("3:14: invalid listener address"), "{text:#?}");
        assert!(text[1].starts_with("5:14: route refers to unknown cluster"), "{text:#?}");
        assert!(text[2].starts_with("9:18: invalid endpoint address"), "{text:#?}");
        assert!(text[3].starts_with("10:17: weight must be"), "{text:#?}");
    }

    #[test]
    fn pipeline_depth_is_bounded() {
        let src = "listeners: [ { name: web, address: 127.0.0.1:1 } ]\nroutes: [ { cluster: app } ]\nclusters:\n  app:\n    pool: { pipeline_depth: 65 }\n    endpoints: [ { address: 127.0.0.1:2 } ]\n";
        let errs = crate::load_str(src, "t.yaml").unwrap_err().0;
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].line, 5, "{errs:?}");
        assert!(errs[0].message.contains("at most 64 pipelined requests"), "{errs:?}");
        assert!(crate::load_str(&src.replace("65", "16"), "t.yaml").is_ok());
    }

    #[test]
    fn unknown_keys_are_located() {
        let src = "listeners:\n  - name: web\n    adress: 127.0.0.1:1\n";
        let errs = crate::load_str(src, "t.yaml").unwrap_err().0;
        assert_eq!((errs[0].line, errs[0].col), (3, 5), "{errs:?}");
        assert!(errs[0].message.contains("unknown field `adress`"), "{errs:?}");
    }
}
