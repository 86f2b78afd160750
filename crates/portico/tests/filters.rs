//! Filters end to end: `headers` (request and response, global and per route, their order), `rewrite`
//! (strip_prefix, replace_prefix, regex, path templates), `cors` (preflights and ordinary requests), and the
//! configuration errors `portico check` reports for them. Over HTTP/1.1 and cleartext HTTP/2 (prior knowledge).

mod common;
use bytes::Bytes;
use common::echo::*;
use common::*;
use http_body_util::{BodyExt, Full};
use std::net::SocketAddr;
fn cluster_yaml(name: &str, addr: SocketAddr) -> String {
    format!("clusters:\n  {name}:\n    endpoints:\n      - address: \"{addr}\"\n")
}

#[test]
fn request_headers_set_add_remove() {
    let echo = Echo::start("api");
    let yaml = config(
        "",
        &format!(
            "routes:
  - match: {{ path_prefix: /api/ }}
    cluster: api
    filters:
      - headers:
          request:  {{ set: {{ x-api-version: \"2\" }}, add: {{ x-tag: a }}, remove: [cookie, x-drop] }}
{}",
            cluster_yaml("api", echo.addr)
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let r = request(
            p.addr,
            proto,
            "GET",
            "t",
            "/api/echo",
            &[
                ("x-api-version", "1"),
                ("x-api-version", "3"),
                ("x-tag", "b"),
                ("cookie", "s=1"),
                ("x-drop", "1"),
                ("x-keep", "k"),
            ],
            b"",
        );
        let seen = r.seen();
        assert_eq!(seen.all("x-api-version"), vec!["2"], "{proto:?}: set replaces every value");
        let mut tags: Vec<String> = seen
            .all("x-tag")
            .iter()
            .flat_map(|v| v.split(',').map(|t| t.trim().to_string()).collect::<Vec<_>>())
            .collect();
        tags.sort();
        assert_eq!(tags, vec!["a", "b"], "{proto:?}: add keeps the value present");
        assert!(seen.all("cookie").is_empty(), "{proto:?}: cookie not removed: {seen:?}");
        assert!(seen.all("x-drop").is_empty(), "{proto:?}: x-drop not removed");
        assert_eq!(seen.one("x-keep").as_deref(), Some("k"), "{proto:?}");
        // Without the headers in the request: set and add create them.
        let seen = request(p.addr, proto, "GET", "t", "/api/echo", &[], b"").seen();
        assert_eq!(seen.all("x-api-version"), vec!["2"], "{proto:?}");
        assert_eq!(seen.all("x-tag"), vec!["a"], "{proto:?}");
    }
}

#[test]
fn within_one_filter_remove_then_set_then_add() {
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!(
            "routes:
  - match: {{ path_prefix: / }}
    cluster: app
    filters:
      - headers:
          request:  {{ add: {{ x-a: added }}, set: {{ x-a: set }}, remove: [x-a] }}
          response: {{ add: {{ x-r: added }}, set: {{ x-r: set }}, remove: [x-r] }}
{}",
            cluster_yaml("app", echo.addr)
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let r =
            request(p.addr, proto, "GET", "t", "/", &[("x-a", "client"), ("x-echo-response", "x-r: upstream")], b"");
        assert_eq!(r.all("x-r"), vec!["set", "added"], "{proto:?}: response x-r");
        let seen = r.seen();
        assert_eq!(seen.all("x-a"), vec!["set", "added"], "{proto:?}: request x-a");
    }
}

#[test]
fn host_can_be_set_for_the_upstream() {
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!(
            "routes:
  - match: {{ path_prefix: / }}
    cluster: app
    filters:
      - headers: {{ request: {{ set: {{ host: upstream.internal }} }} }}
{}",
            cluster_yaml("app", echo.addr)
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let seen = request(p.addr, proto, "GET", "public.example.com", "/x", &[], b"").seen();
        assert_eq!(seen.one("host").as_deref(), Some("upstream.internal"), "{proto:?}: {seen:?}");
        // The client's host is still what x-forwarded-host names.
        assert_eq!(seen.one("x-forwarded-host").as_deref(), Some("public.example.com"), "{proto:?}: {seen:?}");
    }
}

#[test]
fn response_headers_global_first_then_route() {
    let echo = Echo::start("api");
    let yaml = config(
        "",
        &format!(
            "filters:
  - headers: {{ response: {{ set: {{ x-served-by: portico, x-who: global }}, add: {{ x-trail: g }} }} }}
routes:
  - match: {{ path_prefix: /api/ }}
    cluster: api
    filters:
      - headers:
          response: {{ set: {{ cache-control: no-store, x-who: route }}, remove: [server], add: {{ x-trail: r }} }}
  - match: {{ path_prefix: /plain/ }}
    cluster: api
{}",
            cluster_yaml("api", echo.addr)
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let r = request(p.addr, proto, "GET", "t", "/api/x", &[("x-echo-response", "cache-control: public")], b"");
        assert_eq!(r.status, 200, "{proto:?}");
        assert_eq!(r.header("x-served-by").as_deref(), Some("portico"), "{proto:?}");
        assert_eq!(r.all("x-who"), vec!["route"], "{proto:?}: the route's set runs last and wins");
        assert_eq!(r.all("cache-control"), vec!["no-store"], "{proto:?}");
        assert_eq!(r.all("x-trail"), vec!["g", "r"], "{proto:?}: response filters in order written");
        assert!(r.all("server").is_empty(), "{proto:?}: server not removed: {:?}", r.all("server"));
        // Only the global filter on another route.
        let r = request(p.addr, proto, "GET", "t", "/plain/x", &[], b"");
        assert_eq!(r.all("x-who"), vec!["global"], "{proto:?}");
        assert_eq!(r.all("server"), vec!["echo-server"], "{proto:?}");
        assert!(r.all("cache-control").is_empty(), "{proto:?}");
    }
}

#[test]
fn global_request_filters_run_before_the_routes() {
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!(
            "filters:
  - headers: {{ request: {{ set: {{ x-order: global }} }} }}
  - headers: {{ request: {{ add: {{ x-order: global-2 }} }} }}
routes:
  - match: {{ path_prefix: / }}
    cluster: app
    filters:
      - headers: {{ request: {{ add: {{ x-order: route }} }} }}
      - headers: {{ request: {{ add: {{ x-order: route-2 }} }} }}
{}",
            cluster_yaml("app", echo.addr)
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let seen = request(p.addr, proto, "GET", "t", "/", &[("x-order", "client")], b"").seen();
        assert_eq!(seen.all("x-order"), vec!["global", "global-2", "route", "route-2"], "{proto:?}");
    }
}

#[test]
fn response_filters_apply_to_static_redirect_and_errors() {
    let dead = free_port();
    let yaml = config(
        "",
        &format!(
            "filters:
  - headers: {{ response: {{ set: {{ x-served-by: portico, x-who: global }} }} }}
routes:
  - match: {{ path: /static }}
    static: {{ status: 200, body: \"s\", headers: {{ x-who: static-config }} }}
    filters:
      - headers: {{ response: {{ set: {{ x-who: route }} }} }}
  - match: {{ path: /redirect }}
    redirect: {{ to: /elsewhere }}
    filters:
      - headers: {{ response: {{ set: {{ x-who: route }} }} }}
  - match: {{ path: /down }}
    cluster: dead
    filters:
      - headers: {{ response: {{ set: {{ x-who: route }}, add: {{ cache-control: no-store }} }} }}
clusters:
  dead:
    endpoints:
      - address: \"127.0.0.1:{dead}\"
"
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        for (path, status) in [("/static", 200), ("/redirect", 302), ("/down", 502)] {
            let r = request(p.addr, proto, "GET", "t", path, &[], b"");
            assert_eq!(r.status, status, "{proto:?} GET {path}: {r:?}");
            assert_eq!(r.header("x-served-by").as_deref(), Some("portico"), "{proto:?} GET {path}: {r:?}");
            assert_eq!(r.all("x-who"), vec!["route"], "{proto:?} GET {path}");
        }
        let r = request(p.addr, proto, "GET", "t", "/down", &[], b"");
        assert_eq!(r.all("cache-control"), vec!["no-store"], "{proto:?}: the 502");
        let r = request(p.addr, proto, "HEAD", "t", "/static", &[], b"");
        assert_eq!((r.status, r.header("x-who").as_deref()), (200, Some("route")), "{proto:?} HEAD");
        // A request no route matches passes through no filter.
        let r = request(p.addr, proto, "GET", "t", "/nothing", &[], b"");
        assert_eq!(r.status, 404, "{proto:?}");
        assert!(r.all("x-served-by").is_empty(), "{proto:?}: a 404 without a route went through filters");
    }
}

fn rewrite_portico(echo: &Echo, m: &str, rewrite: &str) -> Portico {
    Portico::start(&config(
        "",
        &format!(
            "routes:\n  - match: {m}\n    cluster: app\n    filters:\n      - rewrite: {rewrite}\n{}",
            cluster_yaml("app", echo.addr)
        ),
    ))
}

#[test]
fn rewrite_strip_prefix_keeps_the_query() {
    let echo = Echo::start("app");
    let p = rewrite_portico(&echo, "{ path_prefix: /api }", "{ strip_prefix: /api }");
    for proto in BOTH {
        for (sent, forwarded) in [
            ("/api/x?q=1", "/x?q=1"),
            ("/api/x/y", "/x/y"),
            ("/api", "/"),
            ("/api/", "/"),
            ("/api?q=1", "/?q=1"),
            ("/api/./a/../b?z=%20", "/b?z=%20"),
            ("/api/%7ex", "/~x"),
        ] {
            assert_eq!(get(p.addr, proto, sent).seen().target, forwarded, "{proto:?} GET {sent}");
        }
    }
}

#[test]
fn rewrite_strip_prefix_in_a_global_filter_leaves_other_paths() {
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!(
            "filters:\n  - rewrite: {{ strip_prefix: /api }}\nroutes:\n  - match: {{ path_prefix: / }}\n    cluster: app\n{}",
            cluster_yaml("app", echo.addr)
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        assert_eq!(get(p.addr, proto, "/api/x?a=b").seen().target, "/x?a=b", "{proto:?}");
        assert_eq!(get(p.addr, proto, "/apiary/x").seen().target, "/apiary/x", "{proto:?}: not on a segment boundary");
        assert_eq!(get(p.addr, proto, "/other?a=b").seen().target, "/other?a=b", "{proto:?}");
    }
}

#[test]
fn rewrite_replace_prefix() {
    let echo = Echo::start("app");
    let p = rewrite_portico(&echo, "{ path_prefix: /api }", "{ replace_prefix: /v2 }");
    for proto in BOTH {
        for (sent, forwarded) in
            [("/api/users?x=1", "/v2/users?x=1"), ("/api", "/v2"), ("/api/", "/v2/"), ("/api/a/b", "/v2/a/b")]
        {
            assert_eq!(get(p.addr, proto, sent).seen().target, forwarded, "{proto:?} GET {sent}");
        }
    }
    let echo2 = Echo::start("app");
    let p = rewrite_portico(&echo2, "{ path_prefix: /api/ }", "{ replace_prefix: / }");
    for proto in BOTH {
        assert_eq!(get(p.addr, proto, "/api/users?x=1").seen().target, "/users?x=1", "{proto:?}");
    }
}

#[test]
fn rewrite_regex() {
    let echo = Echo::start("app");
    let p = rewrite_portico(&echo, "{ path_prefix: / }", "{ regex: \"^/old/(.*)\", replacement: \"/new/$1\" }");
    for proto in BOTH {
        for (sent, forwarded) in
            [("/old/a/b?z=1", "/new/a/b?z=1"), ("/old/", "/new/"), ("/keep/old/x", "/keep/old/x"), ("/old", "/old")]
        {
            assert_eq!(get(p.addr, proto, sent).seen().target, forwarded, "{proto:?} GET {sent}");
        }
    }
    let echo2 = Echo::start("app");
    let p = rewrite_portico(
        &echo2,
        "{ path_prefix: / }",
        "{ regex: \"^/u/(?P<name>[^/]+)/(\\\\d+)$\", replacement: \"/users/$2/${name}\" }",
    );
    for proto in BOTH {
        assert_eq!(get(p.addr, proto, "/u/bob/17?x").seen().target, "/users/17/bob?x", "{proto:?}");
    }
}

#[test]
fn rewrite_path_template_with_parameters() {
    let echo = Echo::start("users");
    let yaml = config(
        "",
        &format!(
            "routes:
  - match: {{ path: \"/users/:id\", methods: [GET, PUT] }}
    cluster: users
    filters:
      - rewrite: {{ path: \"/v2/users/:id\" }}
  - match: {{ path: \"/orgs/:org/repos/:repo\" }}
    cluster: users
    filters:
      - rewrite: {{ path: \"/r/:repo/:org\" }}
  - match: {{ path: \"/files/*rest\" }}
    cluster: users
    filters:
      - rewrite: {{ path: /static }}
{}",
            cluster_yaml("users", echo.addr)
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        assert_eq!(get(p.addr, proto, "/users/42?x=1").seen().target, "/v2/users/42?x=1", "{proto:?}");
        let seen = request(p.addr, proto, "PUT", "t", "/users/7", &[], b"{}").seen();
        assert_eq!((seen.method.as_str(), seen.target.as_str()), ("PUT", "/v2/users/7"), "{proto:?}");
        assert_eq!(request(p.addr, proto, "POST", "t", "/users/7", &[], b"").status, 404, "{proto:?}");
        assert_eq!(get(p.addr, proto, "/orgs/acme/repos/site").seen().target, "/r/site/acme", "{proto:?}");
        assert_eq!(get(p.addr, proto, "/files/a/b?v=1").seen().target, "/static?v=1", "{proto:?}");
        // A percent-encoded parameter stays encoded in the rewritten path.
        assert_eq!(get(p.addr, proto, "/users/a%20b").seen().target, "/v2/users/a%20b", "{proto:?}");
    }
}

fn cors_portico(echo: &Echo, cors: &str) -> Portico {
    Portico::start(&config(
        "",
        &format!(
            "routes:\n  - match: {{ path_prefix: /api/ }}\n    cluster: api\n    filters:\n      - cors: {cors}\n{}",
            cluster_yaml("api", echo.addr)
        ),
    ))
}

const CORS: &str = "{ allow_origins: [\"https://app.example.com\", \"https://*.example.com\"], allow_methods: [GET, POST], allow_headers: [content-type], expose_headers: [x-request-id], allow_credentials: true, max_age: 10m }";

fn preflight(addr: SocketAddr, proto: Proto, origin: &str, method: &str, headers: Option<&str>) -> Reply {
    let mut h = vec![("origin", origin), ("access-control-request-method", method)];
    if let Some(v) = headers {
        h.push(("access-control-request-headers", v));
    }
    request(addr, proto, "OPTIONS", "api.example.com", "/api/items", &h, b"")
}

#[test]
fn cors_preflight_is_answered_by_portico() {
    let echo = Echo::start("api");
    let p = cors_portico(&echo, CORS);
    for proto in BOTH {
        for origin in ["https://app.example.com", "https://shop.example.com"] {
            let r = preflight(p.addr, proto, origin, "POST", Some("content-type"));
            assert_eq!(r.status, 204, "{proto:?} preflight from {origin}: {r:?}");
            assert_eq!(r.header("access-control-allow-origin").as_deref(), Some(origin), "{proto:?}");
            let methods = r.tokens("access-control-allow-methods");
            assert!(methods.contains(&"get".into()) && methods.contains(&"post".into()), "{proto:?}: {methods:?}");
            assert_eq!(r.tokens("access-control-allow-headers"), vec!["content-type"], "{proto:?}");
            assert_eq!(r.header("access-control-allow-credentials").as_deref(), Some("true"), "{proto:?}");
            assert_eq!(r.header("access-control-max-age").as_deref(), Some("600"), "{proto:?}");
            assert!(r.tokens("vary").contains(&"origin".into()), "{proto:?}: vary {:?}", r.all("vary"));
            assert!(r.all("x-backend").is_empty(), "{proto:?}: the preflight reached the upstream");
            assert!(r.body.is_empty(), "{proto:?}");
        }
        // Origins not allowed: 403.
        for origin in ["https://evil.test", "https://example.com", "https://evil-example.com", "http://app.example.com"]
        {
            let r = preflight(p.addr, proto, origin, "GET", None);
            assert_eq!(r.status, 403, "{proto:?} preflight from {origin}: {r:?}");
            assert!(r.all("access-control-allow-origin").is_empty(), "{proto:?} {origin}");
            assert!(r.all("x-backend").is_empty(), "{proto:?}: the preflight reached the upstream");
        }
    }
    assert_eq!(echo.requests(), 0, "a preflight reached the upstream");
    // An OPTIONS without Access-Control-Request-Method is not a preflight: it is proxied.
    for proto in BOTH {
        let r = request(p.addr, proto, "OPTIONS", "t", "/api/items", &[("origin", "https://app.example.com")], b"");
        assert_eq!(r.header("x-backend").as_deref(), Some("api"), "{proto:?}: {r:?}");
    }
}

#[test]
fn cors_any_origin_and_any_header() {
    let echo = Echo::start("api");
    let p = cors_portico(&echo, "{ allow_origins: [\"*\"], allow_headers: [\"*\"] }");
    for proto in BOTH {
        let r = preflight(p.addr, proto, "https://anything.test", "GET", Some("x-foo, content-type"));
        assert_eq!(r.status, 204, "{proto:?}: {r:?}");
        assert_eq!(r.header("access-control-allow-origin").as_deref(), Some("*"), "{proto:?}");
        let mut asked = r.tokens("access-control-allow-headers");
        asked.sort();
        assert_eq!(asked, vec!["content-type", "x-foo"], "{proto:?}: the requested headers are echoed");
        assert!(r.all("access-control-allow-credentials").is_empty(), "{proto:?}");
        assert!(r.all("access-control-max-age").is_empty(), "{proto:?}: max_age not configured");
        let r = request(p.addr, proto, "GET", "t", "/api/x", &[("origin", "https://anything.test")], b"");
        assert_eq!((r.status, r.header("access-control-allow-origin").as_deref()), (200, Some("*")), "{proto:?}");
    }
    assert_eq!(echo.requests(), 2);
}

#[test]
fn cors_on_ordinary_requests() {
    let echo = Echo::start("api");
    let p = cors_portico(&echo, CORS);
    for proto in BOTH {
        for origin in ["https://app.example.com", "https://a.example.com"] {
            // The upstream's own access-control-allow-origin is replaced.
            let r = request(
                p.addr,
                proto,
                "GET",
                "t",
                "/api/x",
                &[("origin", origin), ("x-echo-response", "access-control-allow-origin: https://upstream.test")],
                b"",
            );
            assert_eq!(r.status, 200, "{proto:?}");
            assert_eq!(r.all("access-control-allow-origin"), vec![origin.to_string()], "{proto:?} {origin}");
            assert_eq!(r.header("access-control-allow-credentials").as_deref(), Some("true"), "{proto:?}");
            assert_eq!(r.tokens("access-control-expose-headers"), vec!["x-request-id"], "{proto:?}");
            assert!(r.tokens("vary").contains(&"origin".into()), "{proto:?}: vary {:?}", r.all("vary"));
            assert_eq!(r.seen().method, "GET", "{proto:?}");
        }
        for origin in ["https://evil.test", "https://example.com", "https://evil-example.com", "http://a.example.com"] {
            let r = request(
                p.addr,
                proto,
                "GET",
                "t",
                "/api/x",
                &[("origin", origin), ("x-echo-response", "access-control-allow-origin: *")],
                b"",
            );
            assert_eq!(r.status, 200, "{proto:?}: an ordinary request is not refused");
            assert!(
                r.all("access-control-allow-origin").is_empty(),
                "{proto:?} {origin}: {:?}",
                r.all("access-control-allow-origin")
            );
            assert!(r.all("access-control-allow-credentials").is_empty(), "{proto:?} {origin}");
            assert!(r.tokens("vary").contains(&"origin".into()), "{proto:?} {origin}: vary {:?}", r.all("vary"));
        }
    }
}

#[test]
fn check_reports_filter_errors_with_positions() {
    let head = "listeners:\n  - name: web\n    address: \"127.0.0.1:8080\"\nroutes:\n  - match: { path_prefix: /api }\n    cluster: c\n    filters:\n";
    // The filter under test is on line 8.
    let cluster = "clusters:\n  c:\n    endpoints:\n      - address: \"127.0.0.1:9\"\n";
    let ok = format!("{head}      - headers: {{ request: {{ set: {{ host: a.test, x-a: \"1\" }} }}, response: {{ remove: [server] }} }}\n      - cors: {{ allow_origins: [\"*\"] }}\n{cluster}");
    let (good, text, _) = check(&ok);
    assert!(good, "a valid configuration was refused:\n{ok}\n{text}");
    for (filter, needle) in [
        ("headers: { request: { set: { content-length: \"5\" } } }", "content-length"),
        ("headers: { response: { remove: [transfer-encoding] } }", "transfer-encoding"),
        ("headers: { request: { add: { connection: close } } }", "connection"),
        ("headers: { request: { set: { x-forwarded-for: 1.2.3.4 } } }", "x-forwarded-for"),
        ("headers: { request: { remove: [x-forwarded-proto] } }", "x-forwarded-proto"),
        ("headers: { response: { set: { via: me } } }", "via"),
        ("cors: { allow_origins: [\"*\"], allow_credentials: true }", "credentials"),
        ("rewrite: { regex: \"^/old/(.*\", replacement: \"/new/$1\" }", "regex"),
        ("rewrite: { path: \"/v2/:id\" }", "id"),
    ] {
        let yaml = format!("{head}      - {filter}\n{cluster}");
        check_fails_at(&yaml, 8..=8, needle);
    }
    // path and replace_prefix need a route: not in global filters.
    let global = format!(
        "filters:\n  - rewrite: {{ replace_prefix: /v2 }}\n{head}      - rewrite: {{ strip_prefix: /api }}\n{cluster}"
    );
    check_fails_at(&global, 2..=2, "replace_prefix");
}

#[test]
fn cors_preflight_gets_response_filters_and_vary_is_merged() {
    let echo = Echo::start("api");
    let yaml = config(
        "",
        &format!(
            "filters:
  - headers: {{ response: {{ set: {{ x-served-by: portico }} }} }}
routes:
  - match: {{ path_prefix: /api/ }}
    cluster: api
    filters:
      - cors: {CORS}
{}",
            cluster_yaml("api", echo.addr)
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let r = preflight(p.addr, proto, "https://app.example.com", "GET", None);
        assert_eq!(r.status, 204, "{proto:?}");
        assert_eq!(
            r.header("x-served-by").as_deref(),
            Some("portico"),
            "{proto:?}: the preflight's answer skipped the response filters"
        );
        let r = preflight(p.addr, proto, "https://evil.test", "GET", None);
        assert_eq!(r.status, 403, "{proto:?}");
        assert_eq!(
            r.header("x-served-by").as_deref(),
            Some("portico"),
            "{proto:?}: the 403 skipped the response filters"
        );
        // The upstream's Vary is kept, with Origin added.
        let r = request(
            p.addr,
            proto,
            "GET",
            "t",
            "/api/x",
            &[("origin", "https://app.example.com"), ("x-echo-response", "vary: Accept-Encoding")],
            b"",
        );
        let vary = r.tokens("vary");
        assert!(
            vary.contains(&"accept-encoding".into()) && vary.contains(&"origin".into()),
            "{proto:?}: vary {:?}",
            r.all("vary")
        );
        // A preflight asking for a header not allowed: no header beyond the configured list is granted.
        let r = preflight(p.addr, proto, "https://app.example.com", "POST", Some("x-secret"));
        assert!(!r.tokens("access-control-allow-headers").contains(&"x-secret".into()), "{proto:?}: {r:?}");
    }
    assert_eq!(echo.requests(), 2);
}

#[test]
fn cors_applies_to_static_answers_too() {
    let yaml = config(
        "",
        &format!(
            "routes:
  - match: {{ path_prefix: /s }}
    static: {{ status: 200, body: \"s\" }}
    filters:
      - cors: {CORS}
"
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let r = request(p.addr, proto, "GET", "t", "/s", &[("origin", "https://app.example.com")], b"");
        assert_eq!(r.header("access-control-allow-origin").as_deref(), Some("https://app.example.com"), "{proto:?}");
        // The preflight goes to /api/items, which no route matches here: use a path under /s.
        let r = request(
            p.addr,
            proto,
            "OPTIONS",
            "t",
            "/s/x",
            &[("origin", "https://app.example.com"), ("access-control-request-method", "POST")],
            b"",
        );
        assert_eq!(r.status, 204, "{proto:?}: {r:?}");
        assert!(r.body.is_empty(), "{proto:?}: the static body answered the preflight");
    }
}

#[test]
fn request_header_filters_on_http2_cookies() {
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!(
            "routes:\n  - match: {{ path_prefix: / }}\n    cluster: app\n    filters:\n      - headers: {{ request: {{ remove: [Cookie, X-Upper] }} }}\n{}",
            cluster_yaml("app", echo.addr)
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let seen =
            request(p.addr, proto, "GET", "t", "/", &[("cookie", "a=1"), ("cookie", "b=2"), ("x-upper", "1")], b"")
                .seen();
        assert!(seen.all("cookie").is_empty(), "{proto:?}: {seen:?}");
        assert!(seen.all("x-upper").is_empty(), "{proto:?}: names are case-insensitive");
    }
}

#[test]
fn check_refuses_the_headers_portico_writes_in_any_case() {
    let head = "listeners:\n  - name: web\n    address: \"127.0.0.1:8080\"\nroutes:\n  - match: { path_prefix: /api }\n    cluster: c\n    filters:\n";
    let cluster = "clusters:\n  c:\n    endpoints:\n      - address: \"127.0.0.1:9\"\n";
    for (filter, needle) in [
        ("headers: { request: { set: { Content-Length: \"5\" } } }", "content-length"),
        ("headers: { request: { set: { X-Forwarded-For: 1.2.3.4 } } }", "x-forwarded-for"),
        ("headers: { request: { set: { x-forwarded-host: a.test } } }", "x-forwarded-host"),
        ("headers: { request: { remove: [VIA] } }", "via"),
    ] {
        let yaml = format!("{head}      - {filter}\n{cluster}");
        check_fails_at(&yaml, 8..=8, needle);
    }
    // A header Portico does not write is the user's to set (x-forwarded-port behind an L4 balancer).
    let dir = common::temp_dir();
    let path = dir.join("portico.yaml");
    let filter = "headers: { request: { set: { x-forwarded-port: \"443\" } } }";
    std::fs::write(&path, format!("{head}      - {filter}\n{cluster}")).unwrap();
    let out = std::process::Command::new(common::portico_bin()).args(["check", "-c"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn filters_run_once_when_a_request_is_retried() {
    let failing = portico_testkit::Backend::start("failing").unwrap();
    failing.set_status(503);
    let echo = Echo::start("echo");
    let yaml = config(
        "",
        &format!(
            "filters:
  - headers: {{ request: {{ add: {{ x-global: g }} }}, response: {{ add: {{ x-resp: g }} }} }}
routes:
  - match: {{ path_prefix: /api }}
    cluster: app
    filters:
      - headers: {{ request: {{ add: {{ x-tag: a }} }}, response: {{ add: {{ x-resp: r }} }} }}
      - rewrite: {{ strip_prefix: /api }}
clusters:
  app:
    balancer: round_robin
    retries: {{ attempts: 2, on_status: [503], backoff: 1ms, max_backoff: 2ms, budget_percent: 100, min_retry_concurrency: 100 }}
    outlier_detection: {{ consecutive_failures: 1000, consecutive_5xx: 1000 }}
    endpoints:
      - address: \"{}\"
      - address: \"{}\"
",
            failing.addr, echo.addr
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        for i in 0..4 {
            let r = request(p.addr, proto, "GET", "t", "/api/api/x?q=1", &[], b"");
            assert_eq!(r.header("x-backend").as_deref(), Some("echo"), "{proto:?} #{i}: {r:?}");
            assert_eq!(r.all("x-resp"), vec!["g", "r"], "{proto:?} #{i}: response filters ran more than once");
            let seen = r.seen();
            assert_eq!(seen.target, "/api/x?q=1", "{proto:?} #{i}: the rewrite ran again on the retry");
            assert_eq!(seen.all("x-tag"), vec!["a"], "{proto:?} #{i}: request filters ran again on the retry");
            assert_eq!(seen.all("x-global"), vec!["g"], "{proto:?} #{i}");
        }
    }
    assert!(failing.requests() >= 2, "the failing endpoint was never tried: the test proves nothing");
}

#[test]
fn filters_do_not_leak_between_requests_on_one_connection() {
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!(
            "routes:
  - match: {{ path_prefix: /a }}
    cluster: app
    filters:
      - headers: {{ request: {{ set: {{ x-a: \"1\", host: a.internal }} }}, response: {{ set: {{ x-ra: \"1\" }} }} }}
      - rewrite: {{ replace_prefix: /rewritten }}
      - cors: {CORS}
  - match: {{ path_prefix: /b }}
    cluster: app
{}",
            cluster_yaml("app", echo.addr)
        ),
    );
    let p = Portico::start(&yaml);
    // HTTP/1.1 keep-alive.
    let mut conn = Conn::open(p.addr);
    for _ in 0..2 {
        let a = conn.get("/a/x", "Origin: https://app.example.com\r\n");
        assert_eq!(a.status, 200);
        let seen = Seen::parse(&a.text());
        assert_eq!(seen.target, "/rewritten/x");
        assert_eq!(a.header("x-ra").as_deref(), Some("1"));
        let b = conn.get("/b/y", "Origin: https://app.example.com\r\n");
        let seen = Seen::parse(&b.text());
        assert_eq!(seen.target, "/b/y", "{}", b.text());
        assert!(seen.all("x-a").is_empty(), "{seen:?}");
        assert_eq!(seen.one("host").as_deref(), Some("test.local"));
        assert!(b.header("x-ra").is_none() && b.header("access-control-allow-origin").is_none(), "{}", b.head);
    }
    // HTTP/2: streams on one connection.
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let mut sender = h2c(p.addr).await;
        for path in ["/a/x", "/b/y", "/a/x", "/b/y"] {
            let req = hyper::Request::get(format!("http://test.local{path}"))
                .header("origin", "https://app.example.com")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let resp = sender.send_request(req).await.unwrap();
            let has_ra = resp.headers().contains_key("x-ra");
            let has_acao = resp.headers().contains_key("access-control-allow-origin");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let seen = Seen::parse(&String::from_utf8_lossy(&body));
            if path == "/a/x" {
                assert!(has_ra && has_acao);
                assert_eq!(seen.target, "/rewritten/x");
                assert_eq!(seen.one("host").as_deref(), Some("a.internal"));
            } else {
                assert!(!has_ra && !has_acao, "filters of /a applied to /b");
                assert_eq!(seen.target, "/b/y");
                assert!(seen.all("x-a").is_empty(), "{seen:?}");
                assert_eq!(seen.one("host").as_deref(), Some("test.local"), "{seen:?}");
            }
        }
    });
}

#[test]
fn filters_apply_to_an_http2_upstream() {
    let b = portico_testkit::Backend::start_h2("h2up").unwrap();
    let yaml = config(
        "",
        &format!(
            "routes:
  - match: {{ path_prefix: /api }}
    cluster: up
    filters:
      - headers: {{ request: {{ set: {{ host: upstream.internal, x-api-version: \"2\" }}, remove: [cookie] }}, response: {{ set: {{ x-r: \"1\" }} }} }}
      - rewrite: {{ strip_prefix: /api }}
clusters:
  up:
    protocol: h2
    endpoints:
      - address: \"{}\"
",
            b.addr
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let r = request(p.addr, proto, "GET", "public.test", "/api/echo?x=1", &[("cookie", "a=1")], b"");
        assert_eq!(r.status, 200, "{proto:?}: {r:?}");
        assert_eq!(r.header("x-r").as_deref(), Some("1"), "{proto:?}");
        let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let target = json["target"].as_str().unwrap().to_string();
        assert!(target.ends_with("/echo?x=1") && !target.contains("/api"), "{proto:?}: target {target}");
        let headers: Vec<(String, String)> = serde_json::from_value(json["headers"].clone()).unwrap();
        let find = |n: &str| headers.iter().filter(|(k, _)| k == n).map(|(_, v)| v.clone()).collect::<Vec<_>>();
        // The authority is the host set by the filter, whether carried in :authority or host.
        let authority =
            if target.starts_with("http") { target.split('/').nth(2).unwrap_or("").to_string() } else { String::new() };
        let hosts = find("host");
        assert!(
            (authority == "upstream.internal" && hosts.iter().all(|h| h == "upstream.internal"))
                || (authority.is_empty() && hosts == vec!["upstream.internal".to_string()]),
            "{proto:?}: authority {authority:?}, host {hosts:?}"
        );
        assert_eq!(find("x-api-version"), vec!["2"], "{proto:?}");
        assert!(find("cookie").is_empty(), "{proto:?}");
    }
}

#[test]
fn cors_origin_matching_is_exact() {
    let echo = Echo::start("api");
    let p = cors_portico(&echo, CORS);
    for proto in BOTH {
        for origin in [
            "https://app.example.com:8443",
            "https://a.example.com.evil.test",
            "https://example.com.evil.test",
            "https://aexample.com",
            "null",
            "https://app.example.co",
        ] {
            let r = preflight(p.addr, proto, origin, "GET", None);
            assert_eq!(r.status, 403, "{proto:?} preflight from {origin}: {r:?}");
            let r = request(p.addr, proto, "GET", "t", "/api/x", &[("origin", origin)], b"");
            assert!(r.all("access-control-allow-origin").is_empty(), "{proto:?} GET from {origin}: {r:?}");
        }
        for origin in ["https://a.b.example.com", "https://x-y.example.com"] {
            let r = preflight(p.addr, proto, origin, "GET", None);
            assert_eq!(r.status, 204, "{proto:?} preflight from {origin}: {r:?}");
        }
    }
}

#[test]
fn response_filters_apply_to_gateway_timeouts() {
    let slow = portico_testkit::Backend::start("slow").unwrap();
    let yaml = config(
        "",
        &format!(
            "filters:
  - headers: {{ response: {{ set: {{ x-served-by: portico }} }} }}
routes:
  - match: {{ path_prefix: / }}
    cluster: slow
    filters:
      - headers: {{ response: {{ add: {{ x-route: r }} }} }}
      - cors: {{ allow_origins: [\"https://app.example.com\"] }}
clusters:
  slow:
    timeouts: {{ response_header: 300ms }}
    endpoints:
      - address: \"{}\"
",
            slow.addr
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let r = request(p.addr, proto, "GET", "t", "/slow/3000", &[("origin", "https://app.example.com")], b"");
        assert_eq!(r.status, 504, "{proto:?}: {r:?}");
        assert_eq!(r.header("x-served-by").as_deref(), Some("portico"), "{proto:?}");
        assert_eq!(r.all("x-route"), vec!["r"], "{proto:?}");
        assert_eq!(r.header("access-control-allow-origin").as_deref(), Some("https://app.example.com"), "{proto:?}");
    }
}
