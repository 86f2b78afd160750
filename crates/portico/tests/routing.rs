//! Routing end to end: route targets (`cluster`, `static`, `redirect`), path matching on segment boundaries,
//! parameters and wildcards, conditions, which route wins, path normalisation before routing and forwarding,
//! and the positions `portico check` gives for route errors. Over HTTP/1.1 and cleartext HTTP/2 (prior knowledge).

mod common;
use common::echo::*;
use common::*;
use std::net::SocketAddr;

/// A static route answering `body` for the match written in `m`.
fn static_route(m: &str, body: &str) -> String {
    format!("  - match: {m}\n    static: {{ status: 200, body: \"{body}\" }}\n")
}

fn body_of(addr: SocketAddr, proto: Proto, host: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let r = request(addr, proto, method, host, path, headers, b"");
    if r.status != 200 {
        return format!("<{}>", r.status);
    }
    r.text()
}

#[test]
fn path_prefix_matches_on_segment_boundaries() {
    let mut routes = String::from("routes:\n");
    routes += &static_route("{ path_prefix: / }", "root");
    routes += &static_route("{ path_prefix: /api }", "api");
    routes += &static_route("{ path_prefix: /v1/ }", "v1");
    let p = Portico::start(&config("", &routes));
    for proto in BOTH {
        for (path, want) in [
            ("/api", "api"),
            ("/api/", "api"),
            ("/api/x", "api"),
            ("/api/x/y?z=1", "api"),
            ("/api?x=1", "api"),
            ("/apiary", "root"),
            ("/api-v2/x", "root"),
            ("/v1", "v1"),
            ("/v1/", "v1"),
            ("/v1/users", "v1"),
            ("/v1x", "root"),
            ("/v10/a", "root"),
            ("/", "root"),
        ] {
            assert_eq!(body_of(p.addr, proto, "test.local", "GET", path, &[]), want, "{proto:?} GET {path}");
        }
    }
}

#[test]
fn exact_paths_parameters_and_wildcards() {
    let echo = Echo::start("users");
    let yaml = config(
        "",
        &format!(
            "routes:\n  - match: {{ path: /users/:id, methods: [GET, PUT] }}\n    cluster: users\n    filters:\n      - rewrite: {{ path: /v2/users/:id }}\n{}{}{}clusters:\n  users:\n    endpoints:\n      - address: \"{}\"\n",
            static_route("{ path: /health }", "health"),
            static_route("{ path: /files/*rest }", "files"),
            static_route("{ path: /a/:x/b/:y }", "two-params"),
            echo.addr
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        // The parameter takes one non-empty segment, and the rewrite template gets its value; the query stays.
        let r = request(p.addr, proto, "GET", "test.local", "/users/42?x=1&y=%20", &[], b"");
        assert_eq!(r.seen().target, "/v2/users/42?x=1&y=%20", "{proto:?}");
        let r = request(p.addr, proto, "PUT", "test.local", "/users/abc-9", &[], b"");
        let seen = r.seen();
        assert_eq!((seen.method.as_str(), seen.target.as_str()), ("PUT", "/v2/users/abc-9"), "{proto:?}");
        for path in ["/users", "/users/", "/users/42/x", "/userss/42"] {
            assert_eq!(get(p.addr, proto, path).status, 404, "{proto:?} GET {path}");
        }
        // A method not listed: the route does not match (no other route: 404).
        assert_eq!(request(p.addr, proto, "DELETE", "t", "/users/42", &[], b"").status, 404, "{proto:?}");
        // Exact.
        assert_eq!(body_of(p.addr, proto, "t", "GET", "/health", &[]), "health", "{proto:?}");
        assert_eq!(body_of(p.addr, proto, "t", "GET", "/health?x=1", &[]), "health", "{proto:?}");
        for path in ["/health/", "/health/x", "/healthz", "/healt"] {
            assert_eq!(get(p.addr, proto, path).status, 404, "{proto:?} GET {path}");
        }
        // Trailing wildcard: the rest of the path, possibly empty.
        for path in ["/files/", "/files/a", "/files/a/b/c.txt", "/files/a?q=1"] {
            assert_eq!(body_of(p.addr, proto, "t", "GET", path, &[]), "files", "{proto:?} GET {path}");
        }
        assert_eq!(get(p.addr, proto, "/filesx/a").status, 404, "{proto:?}");
        // Several parameters with literals between them.
        assert_eq!(body_of(p.addr, proto, "t", "GET", "/a/1/b/2", &[]), "two-params", "{proto:?}");
        for path in ["/a/1/c/2", "/a//b/2", "/a/1/b/", "/a/1/b/2/3"] {
            assert_eq!(get(p.addr, proto, path).status, 404, "{proto:?} GET {path}");
        }
    }
}

#[test]
fn query_header_method_and_host_conditions() {
    let mut routes = String::from("routes:\n");
    routes += &static_route("{ path_prefix: / }", "fallback");
    routes += &static_route("{ path_prefix: /q, query: { v: \"2\" } }", "query-v2");
    routes += &static_route("{ path_prefix: /q, query: { name: \"a b\" } }", "query-name");
    routes += &static_route("{ path_prefix: /h, headers: { x-canary: \"1\" } }", "header-canary");
    routes += &static_route("{ path_prefix: /m, methods: [put, DELETE] }", "methods");
    routes += &static_route("{ path_prefix: /host, host: api.example.com }", "host-exact");
    let p = Portico::start(&config("", &routes));
    for proto in BOTH {
        let b = |method: &str, host: &str, path: &str, headers: &[(&str, &str)]| {
            body_of(p.addr, proto, host, method, path, headers)
        };
        // Query: decoded value, compared exactly.
        assert_eq!(b("GET", "t", "/q?v=2", &[]), "query-v2", "{proto:?}");
        assert_eq!(b("GET", "t", "/q?a=1&v=2&b=3", &[]), "query-v2", "{proto:?}");
        assert_eq!(b("GET", "t", "/q?v=%32", &[]), "query-v2", "{proto:?} (decoded %32 is 2)");
        assert_eq!(b("GET", "t", "/q?v=20", &[]), "fallback", "{proto:?}");
        assert_eq!(b("GET", "t", "/q?v=", &[]), "fallback", "{proto:?}");
        assert_eq!(b("GET", "t", "/q?vv=2", &[]), "fallback", "{proto:?}");
        assert_eq!(b("GET", "t", "/q", &[]), "fallback", "{proto:?}");
        assert_eq!(b("GET", "t", "/q?name=a%20b", &[]), "query-name", "{proto:?}");
        assert_eq!(b("GET", "t", "/q?name=a+b", &[]), "query-name", "{proto:?}");
        assert_eq!(b("GET", "t", "/q?name=ab", &[]), "fallback", "{proto:?}");
        // Headers: present with exactly this value.
        assert_eq!(b("GET", "t", "/h", &[("x-canary", "1")]), "header-canary", "{proto:?}");
        assert_eq!(b("GET", "t", "/h", &[("X-Canary", "1")]), "header-canary", "{proto:?}");
        assert_eq!(b("GET", "t", "/h", &[("x-canary", "10")]), "fallback", "{proto:?}");
        assert_eq!(b("GET", "t", "/h", &[]), "fallback", "{proto:?}");
        // Methods, written in any case.
        assert_eq!(b("PUT", "t", "/m", &[]), "methods", "{proto:?}");
        assert_eq!(b("DELETE", "t", "/m", &[]), "methods", "{proto:?}");
        assert_eq!(b("GET", "t", "/m", &[]), "fallback", "{proto:?}");
        // Host, without port, case-insensitive.
        assert_eq!(b("GET", "api.example.com", "/host", &[]), "host-exact", "{proto:?}");
        assert_eq!(b("GET", "api.example.com:8080", "/host", &[]), "host-exact", "{proto:?}");
        assert_eq!(b("GET", "API.Example.COM", "/host", &[]), "host-exact", "{proto:?}");
        assert_eq!(b("GET", "www.example.com", "/host", &[]), "fallback", "{proto:?}");
    }
}

#[test]
fn priority_host_exact_then_wildcard_then_none_before_path() {
    let mut routes = String::from("routes:\n");
    // Written from least to most specific.
    routes += &static_route("{ path: /x }", "no-host-exact-path");
    routes += &static_route("{ path_prefix: / }", "no-host");
    routes += &static_route("{ host: \"*.example.com\" }", "wildcard");
    routes += &static_route("{ host: \"*.a.example.com\" }", "longer-wildcard");
    routes += &static_route("{ host: api.example.com }", "exact");
    let p = Portico::start(&config("", &routes));
    for proto in BOTH {
        let b = |host: &str, path: &str| body_of(p.addr, proto, host, "GET", path, &[]);
        assert_eq!(b("api.example.com", "/x"), "exact", "{proto:?}: an exact host beats a path without host");
        assert_eq!(b("api.example.com:81", "/y"), "exact", "{proto:?}");
        assert_eq!(b("www.example.com", "/x"), "wildcard", "{proto:?}");
        assert_eq!(b("b.a.example.com", "/x"), "longer-wildcard", "{proto:?}");
        assert_eq!(b("example.com", "/x"), "no-host-exact-path", "{proto:?}: *.example.com is not example.com");
        assert_eq!(b("example.com", "/y"), "no-host", "{proto:?}");
        assert_eq!(b("evil-example.com", "/y"), "no-host", "{proto:?}");
        assert_eq!(b("other.test", "/x"), "no-host-exact-path", "{proto:?}");
    }
}

#[test]
fn priority_path_exact_then_parameters_then_longest_prefix() {
    let mut routes = String::from("routes:\n");
    // Written from least to most specific: the most specific must win anyway.
    routes += &static_route("{ path_prefix: / }", "catch-all");
    routes += &static_route("{ path_prefix: /users }", "prefix-users");
    routes += &static_route("{ path_prefix: /users/admin }", "prefix-admin");
    routes += &static_route("{ path: \"/users/:id/:tab\" }", "params-2");
    routes += &static_route("{ path: \"/users/:id/profile\" }", "params-literal");
    routes += &static_route("{ path: /users/me/profile }", "exact");
    let p = Portico::start(&config("", &routes));
    for proto in BOTH {
        for (path, want) in [
            ("/users/me/profile", "exact"),
            ("/users/7/profile", "params-literal"),
            ("/users/7/posts", "params-2"),
            ("/users/admin/x", "params-2"),
            ("/users/admin/x/y", "prefix-admin"),
            ("/users/admin", "prefix-admin"),
            ("/users/7", "prefix-users"),
            ("/users", "prefix-users"),
            ("/other", "catch-all"),
        ] {
            assert_eq!(body_of(p.addr, proto, "t", "GET", path, &[]), want, "{proto:?} GET {path}");
        }
    }
}

#[test]
fn priority_more_conditions_then_order_written() {
    let mut routes = String::from("routes:\n");
    routes += &static_route("{ path_prefix: /c }", "plain");
    routes += &static_route("{ path_prefix: /c, methods: [GET] }", "one-condition");
    routes += &static_route("{ path_prefix: /c, methods: [GET], headers: { x-a: \"1\" } }", "two-conditions");
    routes +=
        &static_route("{ path_prefix: /c, query: { q: \"1\" }, headers: { x-b: \"1\" }, methods: [GET] }", "three");
    routes += &static_route("{ path_prefix: /d }", "first-written");
    routes += &static_route("{ path_prefix: /d }", "second-written");
    // A longer prefix beats more conditions on a shorter one.
    routes += &static_route("{ path_prefix: /e, methods: [GET], headers: { x-a: \"1\" } }", "short-with-conditions");
    routes += &static_route("{ path_prefix: /e/f }", "longer-prefix");
    let p = Portico::start(&config("", &routes));
    for proto in BOTH {
        let b = |method: &str, path: &str, h: &[(&str, &str)]| body_of(p.addr, proto, "t", method, path, h);
        assert_eq!(b("GET", "/c", &[("x-a", "1")]), "two-conditions", "{proto:?}");
        assert_eq!(b("GET", "/c?q=1", &[("x-a", "1"), ("x-b", "1")]), "three", "{proto:?}");
        assert_eq!(b("GET", "/c", &[]), "one-condition", "{proto:?}");
        assert_eq!(b("DELETE", "/c", &[("x-a", "1")]), "plain", "{proto:?}");
        assert_eq!(b("GET", "/d", &[]), "first-written", "{proto:?}");
        assert_eq!(b("GET", "/e/f", &[("x-a", "1")]), "longer-prefix", "{proto:?}");
        assert_eq!(b("GET", "/e/g", &[("x-a", "1")]), "short-with-conditions", "{proto:?}");
    }
}

#[test]
fn static_routes_answer_status_headers_and_body() {
    let routes = "routes:\n  - match: { path_prefix: /static/ }\n    static: { status: 200, body: \"ok\\n\", headers: { content-type: text/plain, cache-control: max-age=60 } }\n  - match: { path: /down }\n    static: { status: 503, body: \"maintenance\" }\n  - match: { path: /empty }\n    static: { status: 204 }\n";
    let p = Portico::start(&config("", routes));
    for proto in BOTH {
        let r = get(p.addr, proto, "/static/a.txt");
        assert_eq!((r.status, r.text().as_str()), (200, "ok\n"), "{proto:?}");
        assert_eq!(r.header("content-type").as_deref(), Some("text/plain"), "{proto:?}");
        assert_eq!(r.header("cache-control").as_deref(), Some("max-age=60"), "{proto:?}");
        assert_eq!(r.header("content-length").as_deref(), Some("3"), "{proto:?}");
        let r = get(p.addr, proto, "/down");
        assert_eq!((r.status, r.text().as_str()), (503, "maintenance"), "{proto:?}");
        assert_eq!(r.header("content-type").as_deref(), Some("text/plain; charset=utf-8"), "{proto:?}");
        assert_eq!(r.header("content-length").as_deref(), Some("11"), "{proto:?}");
        let r = get(p.addr, proto, "/empty");
        assert_eq!((r.status, r.body.len()), (204, 0), "{proto:?}");
        // HEAD: the headers, with the body's content-length, and no body.
        let r = request(p.addr, proto, "HEAD", "t", "/down", &[], b"");
        assert_eq!(r.status, 503, "{proto:?}");
        assert_eq!(r.header("content-length").as_deref(), Some("11"), "{proto:?}");
        assert!(r.body.is_empty(), "{proto:?}: HEAD got a body {:?}", r.text());
    }
    // HTTP/1.1 HEAD: nothing follows the head on the wire; the connection stays usable.
    let mut conn = Conn::open(p.addr);
    conn.send(b"HEAD /static/x HTTP/1.1\r\nHost: t\r\n\r\nGET /down HTTP/1.1\r\nHost: t\r\n\r\n");
    let head = conn.read_response(true);
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length").as_deref(), Some("3"));
    let next = conn.read_response(false);
    assert_eq!(
        (next.status, next.text().as_str()),
        (503, "maintenance"),
        "the HEAD response carried a body: {}",
        next.head
    );
}

#[test]
fn static_file_routes_guess_the_content_type() {
    let dir = temp_dir();
    std::fs::write(dir.join("page.html"), "<h1>down</h1>\n").unwrap();
    std::fs::write(dir.join("data.json"), "{\"a\":1}").unwrap();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/blob.bin"), [0u8, 1, 2, 255]).unwrap();
    std::fs::write(dir.join("notes.txt"), "notes").unwrap();
    let routes = "routes:\n  - match: { path: /page }\n    static: { file: page.html, status: 503 }\n  - match: { path: /data }\n    static: { file: data.json }\n  - match: { path: /blob }\n    static: { file: sub/blob.bin }\n  - match: { path: /notes }\n    static: { file: notes.txt, headers: { content-type: text/markdown } }\n";
    let p = Portico::start_in(&dir, &config("", routes));
    for proto in BOTH {
        let r = get(p.addr, proto, "/page");
        assert_eq!((r.status, r.text().as_str()), (503, "<h1>down</h1>\n"), "{proto:?}");
        assert!(r.header("content-type").unwrap_or_default().starts_with("text/html"), "{proto:?}: {r:?}");
        let r = get(p.addr, proto, "/data");
        assert_eq!((r.status, r.text().as_str()), (200, "{\"a\":1}"), "{proto:?}");
        assert!(r.header("content-type").unwrap_or_default().starts_with("application/json"), "{proto:?}: {r:?}");
        let r = get(p.addr, proto, "/blob");
        assert_eq!((r.status, r.body.as_slice()), (200, &[0u8, 1, 2, 255][..]), "{proto:?}");
        assert_eq!(r.header("content-type").as_deref(), Some("application/octet-stream"), "{proto:?}");
        let r = get(p.addr, proto, "/notes");
        assert_eq!(r.header("content-type").as_deref(), Some("text/markdown"), "{proto:?}: a given content-type wins");
        let r = request(p.addr, proto, "HEAD", "t", "/page", &[], b"");
        assert_eq!((r.status, r.header("content-length").as_deref()), (503, Some("14")), "{proto:?}");
        assert!(r.body.is_empty(), "{proto:?}");
    }
}

#[test]
fn redirect_routes_fill_placeholders() {
    let routes = "routes:
  - match: { host: old.example.com }
    redirect: { to: \"https://new.example.com{path}\", status: 308 }
  - match: { path_prefix: /all }
    redirect: { to: \"{scheme}://{host}/v2{uri}\" }
  - match: { path_prefix: /q }
    redirect: { to: \"https://x.test/search?{query}\", status: 301 }
  - match: { path: \"/u/:id/:tab\" }
    redirect: { to: \"/profiles/{id}?tab={tab}\", status: 303 }
  - match: { path: /t }
    redirect: { to: \"/elsewhere\", status: 307 }
";
    let p = Portico::start(&config("", routes));
    for proto in BOTH {
        let r = request(p.addr, proto, "GET", "old.example.com", "/a/b?x=1", &[], b"");
        assert_eq!(r.status, 308, "{proto:?}");
        assert_eq!(r.header("location").as_deref(), Some("https://new.example.com/a/b"), "{proto:?}: query not added");
        let r = request(p.addr, proto, "GET", "old.example.com:8080", "/a/./c", &[], b"");
        assert_eq!(r.header("location").as_deref(), Some("https://new.example.com/a/c"), "{proto:?}: normalised path");
        // Default 302; {host} without its port; {uri} is path?query.
        let r = request(p.addr, proto, "GET", "site.test:8080", "/all/x?y=1&z=2", &[], b"");
        assert_eq!(r.status, 302, "{proto:?}");
        assert_eq!(r.header("location").as_deref(), Some("http://site.test/v2/all/x?y=1&z=2"), "{proto:?}");
        let r = request(p.addr, proto, "GET", "site.test", "/all", &[], b"");
        assert_eq!(r.header("location").as_deref(), Some("http://site.test/v2/all"), "{proto:?}");
        let r = request(p.addr, proto, "GET", "t", "/q?a=1&b=%20", &[], b"");
        assert_eq!(r.status, 301, "{proto:?}");
        assert_eq!(r.header("location").as_deref(), Some("https://x.test/search?a=1&b=%20"), "{proto:?}");
        let r = request(p.addr, proto, "GET", "t", "/q", &[], b"");
        assert_eq!(r.header("location").as_deref(), Some("https://x.test/search?"), "{proto:?}: empty {{query}}");
        let r = request(p.addr, proto, "POST", "t", "/u/42/posts", &[], b"x=1");
        assert_eq!(r.status, 303, "{proto:?}");
        assert_eq!(r.header("location").as_deref(), Some("/profiles/42?tab=posts"), "{proto:?}");
        let r = request(p.addr, proto, "GET", "t", "/t", &[], b"");
        assert_eq!((r.status, r.header("location").as_deref()), (307, Some("/elsewhere")), "{proto:?}");
        let r = request(p.addr, proto, "HEAD", "old.example.com", "/h", &[], b"");
        assert_eq!((r.status, r.header("location").as_deref()), (308, Some("https://new.example.com/h")), "{proto:?}");
        assert!(r.body.is_empty(), "{proto:?}");
    }
}

#[test]
fn redirect_https_keeps_working() {
    let routes = "routes:\n  - match: { path_prefix: / }\n    redirect_https: { port: 8443 }\n    static: { status: 200, body: \"secure\" }\n";
    let p = Portico::start(&config("", routes));
    for proto in BOTH {
        let r = request(p.addr, proto, "GET", "site.test", "/a?b=1", &[], b"");
        assert_eq!(r.status, 301, "{proto:?}: {r:?}");
        assert_eq!(r.header("location").as_deref(), Some("https://site.test:8443/a?b=1"), "{proto:?}");
    }
}

/// Path normalisation on the default listener: what a catch-all cluster route forwards.
#[test]
fn paths_are_normalised_before_forwarding() {
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!("routes:\n  - match: {{ path_prefix: / }}\n    cluster: app\nclusters:\n  app:\n    endpoints:\n      - address: \"{}\"\n", echo.addr),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        for (sent, forwarded) in [
            ("/api/%2e%2e/admin", "/admin"),
            ("/api/%2E%2E/admin", "/admin"),
            ("/api/../admin", "/admin"),
            ("/api/./x", "/api/x"),
            ("/api/%2e/x", "/api/x"),
            ("//admin", "/admin"),
            ("/a//b///c", "/a/b/c"),
            ("/a/b/../c/./d?x=1", "/a/c/d?x=1"),
            ("/%7euser", "/~user"),
            ("/%7Euser/%41%62", "/~user/Ab"),
            ("/a%3ab", "/a%3Ab"),
            ("/a%3Ab", "/a%3Ab"),
            ("/caf%c3%a9", "/caf%C3%A9"),
            ("/a/b/..", "/a/"),
            ("/plain/path?q=%2e%2e", "/plain/path?q=%2e%2e"),
        ] {
            let r = get(p.addr, proto, sent);
            assert_eq!(r.seen().target, forwarded, "{proto:?} GET {sent}");
        }
        let before = echo.requests();
        for bad in
            ["/api/..%2fadmin", "/api/..%2Fadmin", "/..", "/a/../..", "/../a", "/%c0%ae%c0%ae/x", "/%zz", "/a%2", "/a%"]
        {
            let r = get(p.addr, proto, bad);
            assert_eq!(r.status, 400, "{proto:?} GET {bad}: {r:?}");
        }
        assert_eq!(echo.requests(), before, "{proto:?}: a bad path reached the upstream");
    }
}

#[test]
fn a_bad_path_400_closes_the_http1_connection() {
    let p =
        Portico::start(&config("", &format!("routes:\n{}", static_route("{ path_prefix: / }", "served-after-400"))));
    for bad in ["/api/..%2fadmin", "/..", "/%zz", "/%c0%ae%c0%ae/x"] {
        // A keep-alive request, followed by a second one on the same connection: only the 400 comes back.
        let raw = format!("GET {bad} HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n");
        let (out, closed) = raw_exchange(p.addr, raw.as_bytes());
        assert!(out.starts_with("HTTP/1.1 400"), "GET {bad}: {out}");
        assert!(closed, "GET {bad}: the connection stayed open after the 400");
        assert!(!out.contains("served-after-400"), "GET {bad}: the next request was served: {out}");
    }
    // An HTTP/2 connection carries on after a stream's 400.
    let r = get(p.addr, Proto::H2, "/..");
    assert_eq!(r.status, 400);
}

#[test]
fn merge_slashes_false_keeps_double_slashes() {
    let echo = Echo::start("app");
    let yaml = config(
        "    paths: { merge_slashes: false }\n",
        &format!("routes:\n  - match: {{ path_prefix: / }}\n    cluster: app\nclusters:\n  app:\n    endpoints:\n      - address: \"{}\"\n", echo.addr),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        assert_eq!(get(p.addr, proto, "//admin").seen().target, "//admin", "{proto:?}");
        assert_eq!(get(p.addr, proto, "/a//b/./c").seen().target, "/a//b/c", "{proto:?}");
        assert_eq!(get(p.addr, proto, "/a/%2e%2e/b").seen().target, "/b", "{proto:?}");
    }
}

fn api_admin_yaml(paths: &str, api: SocketAddr, admin: SocketAddr) -> String {
    config(
        &format!("    paths: {paths}\n"),
        &format!("routes:\n  - match: {{ path_prefix: /api/ }}\n    cluster: api\n  - match: {{ path_prefix: /admin }}\n    cluster: admin\nclusters:\n  api:\n    endpoints:\n      - address: \"{api}\"\n  admin:\n    endpoints:\n      - address: \"{admin}\"\n"),
    )
}

#[test]
fn encoded_slashes_keep_and_decode() {
    let (api, admin) = (Echo::start("api"), Echo::start("admin"));
    let keep = Portico::start(&api_admin_yaml("{ encoded_slashes: keep }", api.addr, admin.addr));
    let decode = Portico::start(&api_admin_yaml("{ encoded_slashes: decode }", api.addr, admin.addr));
    let reject = Portico::start(&api_admin_yaml("{ encoded_slashes: reject }", api.addr, admin.addr));
    for proto in BOTH {
        // keep: not a separator, forwarded upper-cased, routed under /api.
        let r = get(keep.addr, proto, "/api/..%2fadmin");
        assert_eq!(r.header("x-backend").as_deref(), Some("api"), "{proto:?} keep: {r:?}");
        assert_eq!(r.seen().target, "/api/..%2Fadmin", "{proto:?} keep");
        assert_eq!(get(keep.addr, proto, "/api/a%2Fb?x=1").seen().target, "/api/a%2Fb?x=1", "{proto:?} keep");
        // decode: a separator before dot segments are removed.
        let r = get(decode.addr, proto, "/api/..%2fadmin");
        assert_eq!(r.header("x-backend").as_deref(), Some("admin"), "{proto:?} decode: {r:?}");
        assert_eq!(r.seen().target, "/admin", "{proto:?} decode");
        assert_eq!(get(decode.addr, proto, "/api/a%2Fb").seen().target, "/api/a/b", "{proto:?} decode");
        // reject (also the default, see paths_are_normalised_before_forwarding).
        assert_eq!(get(reject.addr, proto, "/api/..%2fadmin").status, 400, "{proto:?} reject");
        assert_eq!(get(reject.addr, proto, "/api/a%2Fb").status, 400, "{proto:?} reject");
    }
}

#[test]
fn dot_segments_cannot_bypass_a_route() {
    let echo = Echo::start("api");
    let yaml = config(
        "",
        &format!("routes:\n  - match: {{ path_prefix: /admin }}\n    static: {{ status: 403, body: \"forbidden\" }}\n  - match: {{ path_prefix: /api/ }}\n    cluster: api\nclusters:\n  api:\n    endpoints:\n      - address: \"{}\"\n", echo.addr),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        assert_eq!(get(p.addr, proto, "/api/x").seen().target, "/api/x", "{proto:?}");
        let before = echo.requests();
        for path in [
            "/api/%2e%2e/admin",
            "/api/%2E%2E/admin/users",
            "/api/../admin",
            "/api/.%2e/admin",
            "/api/x/../../admin",
            "//admin",
            "/api/./../admin?x=1",
            "/%61dmin",
        ] {
            let r = get(p.addr, proto, path);
            assert_eq!((r.status, r.text().as_str()), (403, "forbidden"), "{proto:?} GET {path}: {r:?}");
        }
        for path in ["/api/..%2fadmin", "/api/..%2Fadmin", "/api/%2e%2e%2fadmin"] {
            assert_eq!(get(p.addr, proto, path).status, 400, "{proto:?} GET {path}");
        }
        assert_eq!(echo.requests(), before, "{proto:?}: a request for /admin reached the api cluster");
    }
}

const CLUSTER: &str = "clusters:\n  c:\n    endpoints:\n      - address: \"127.0.0.1:9\"\n";

#[test]
fn check_reports_route_errors_with_positions() {
    let head = "listeners:\n  - name: web\n    address: \"127.0.0.1:8080\"\nroutes:\n";
    // Lines 1-4 are `head`; the route under test starts on line 5.
    let ok = format!("{head}  - match: {{ path: \"/users/:id\" }}\n    cluster: c\n    filters:\n      - rewrite: {{ path: \"/v2/:id\" }}\n  - match: {{ path_prefix: /r }}\n    redirect: {{ to: \"https://x{{path}}\" }}\n{CLUSTER}");
    let (good, text, _) = check(&ok);
    assert!(good, "a valid configuration was refused:\n{ok}\n{text}");

    let two_targets =
        format!("{head}  - match: {{ path_prefix: /a }}\n    cluster: c\n    static: {{ status: 200 }}\n{CLUSTER}");
    check_fails_at(&two_targets, 5..=7, "target");
    let no_target = format!("{head}  - match: {{ path_prefix: /a }}\n{CLUSTER}");
    check_fails_at(&no_target, 5..=5, "target");
    let placeholder = format!(
        "{head}  - match: {{ path_prefix: /a }}\n    cluster: c\n  - match: {{ path: \"/u/:id\" }}\n    redirect: {{ to: \"https://x/{{nope}}\" }}\n{CLUSTER}"
    );
    check_fails_at(&placeholder, 8..=8, "nope");
    let param = format!(
        "{head}  - match: {{ path: \"/users/:id\" }}\n    cluster: c\n    filters:\n      - rewrite: {{ path: \"/v2/users/:uid\" }}\n{CLUSTER}"
    );
    check_fails_at(&param, 8..=8, "uid");
    let regex = format!(
        "{head}  - match: {{ path_prefix: /old }}\n    cluster: c\n    filters:\n      - rewrite: {{ regex: \"^/old/(.*\", replacement: \"/new/$1\" }}\n{CLUSTER}"
    );
    check_fails_at(&regex, 8..=8, "regex");
    let status =
        format!("{head}  - match: {{ path_prefix: /a }}\n    redirect: {{ to: \"/b\", status: 304 }}\n{CLUSTER}");
    check_fails_at(&status, 6..=6, "status");
}

#[test]
fn more_normalisation_cases() {
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!("routes:\n  - match: {{ path_prefix: / }}\n    cluster: app\nclusters:\n  app:\n    endpoints:\n      - address: \"{}\"\n", echo.addr),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        for (sent, forwarded) in [
            ("/%2561dmin", "/%2561dmin"),
            ("/a%2d%5f%2E%7E", "/a-_.~"),
            ("/a/.", "/a/"),
            ("/a/..", "/"),
            ("/a/%2E", "/a/"),
            ("/a%20b", "/a%20b"),
            ("/a/./././b", "/a/b"),
            ("/a/b/c/../../d", "/a/d"),
            ("/..a/b", "/..a/b"),
            ("/a/.b", "/a/.b"),
        ] {
            assert_eq!(get(p.addr, proto, sent).seen().target, forwarded, "{proto:?} GET {sent}");
        }
        let before = echo.requests();
        for bad in ["/%e0%80%ae%e0%80%ae/x", "/%c0%afx", "/a/%2e%2e/%2e%2e", "/%00", "/a%00b"] {
            let r = get(p.addr, proto, bad);
            assert_eq!(r.status, 400, "{proto:?} GET {bad}: {r:?}");
        }
        assert_eq!(echo.requests(), before, "{proto:?}: a bad path reached the upstream");
    }
}

#[test]
fn absolute_form_targets_are_normalised_and_routed_like_origin_form() {
    let echo = Echo::start("api");
    let yaml = config(
        "",
        &format!("routes:\n  - match: {{ path_prefix: /admin }}\n    static: {{ status: 403, body: \"forbidden\" }}\n  - match: {{ path_prefix: /api/, host: api.example.com }}\n    cluster: api\nclusters:\n  api:\n    endpoints:\n      - address: \"{}\"\n", echo.addr),
    );
    let p = Portico::start(&yaml);
    let mut conn = Conn::open(p.addr);
    conn.send(b"GET http://api.example.com/api/x?y=1 HTTP/1.1\r\nHost: api.example.com\r\n\r\n");
    let r = conn.read_response(false);
    assert_eq!(r.status, 200, "{}", r.head);
    let seen = Seen::parse(&r.text());
    assert_eq!(seen.target, "/api/x?y=1");
    for target in [
        "http://api.example.com/api/%2e%2e/admin",
        "http://api.example.com//admin",
        "http://api.example.com/api/../admin",
    ] {
        let mut conn = Conn::open(p.addr);
        conn.send(format!("GET {target} HTTP/1.1\r\nHost: api.example.com\r\n\r\n").as_bytes());
        let r = conn.read_response(false);
        assert_eq!((r.status, r.text().as_str()), (403, "forbidden"), "GET {target}: {}", r.head);
    }
    let (out, _) =
        raw_exchange(p.addr, b"GET http://api.example.com/api/..%2fadmin HTTP/1.1\r\nHost: api.example.com\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert_eq!(echo.requests(), 1);
}

#[test]
fn redirect_parameters_and_paths_keep_their_encoding() {
    let routes = "routes:
  - match: { path: \"/u/:id\" }
    redirect: { to: \"https://x.test/users/{id}\", status: 301 }
  - match: { path: \"/f/*rest\" }
    redirect: { to: \"https://x.test/files/{rest}\", status: 301 }
  - match: { path_prefix: /p }
    redirect: { to: \"https://x.test{path}\" }
";
    let p = Portico::start(&config("", routes));
    for proto in BOTH {
        let r = get(p.addr, proto, "/u/a%20b");
        assert_eq!((r.status, r.header("location").as_deref()), (301, Some("https://x.test/users/a%20b")), "{proto:?}");
        let r = get(p.addr, proto, "/u/%7ebob");
        assert_eq!(r.header("location").as_deref(), Some("https://x.test/users/~bob"), "{proto:?}");
        let r = get(p.addr, proto, "/f/a/b.txt");
        assert_eq!(r.header("location").as_deref(), Some("https://x.test/files/a/b.txt"), "{proto:?}");
        let r = get(p.addr, proto, "/p/%3a/x");
        assert_eq!(r.header("location").as_deref(), Some("https://x.test/p/%3A/x"), "{proto:?}");
    }
}

#[test]
fn routing_uses_the_normalised_path() {
    let mut routes = String::from("routes:\n");
    routes += &static_route("{ path_prefix: / }", "root");
    routes += &static_route("{ path_prefix: /api }", "api");
    routes += &static_route("{ path: /users/me }", "me");
    routes += &static_route("{ path: \"/users/:id\" }", "user");
    let p = Portico::start(&config("", &routes));
    for proto in BOTH {
        for (path, want) in [
            ("/%61pi/x", "api"),
            ("/x/../api", "api"),
            ("//api//x", "api"),
            ("/users/%6De", "me"),
            ("/users/./me", "me"),
            ("/users//me", "me"),
            ("/users/x/../me", "me"),
            ("/apiary/../api/v", "api"),
            ("/api/../apiary", "root"),
        ] {
            assert_eq!(body_of(p.addr, proto, "t", "GET", path, &[]), want, "{proto:?} GET {path}");
        }
    }
}

#[test]
fn redirect_host_placeholder_drops_the_port_of_ip_literals() {
    let routes = "routes:\n  - match: { path_prefix: / }\n    redirect: { to: \"https://{host}{uri}\", status: 301 }\n";
    let p = Portico::start(&config("", routes));
    for proto in BOTH {
        for (authority, want) in [
            ("[::1]:8080", "https://[::1]/x?y"),
            ("[::1]", "https://[::1]/x?y"),
            ("127.0.0.1:8080", "https://127.0.0.1/x?y"),
            ("Site.Test:81", "https://site.test/x?y"),
        ] {
            let r = request(p.addr, proto, "GET", authority, "/x?y", &[], b"");
            assert_eq!(r.status, 301, "{proto:?} Host {authority}: {r:?}");
            let loc = r.header("location").unwrap_or_default();
            assert!(loc.eq_ignore_ascii_case(want), "{proto:?} Host {authority}: location {loc}, expected {want}");
        }
    }
}

#[test]
fn kept_encoded_slashes_are_not_separators_for_routing() {
    let (api, admin) = (Echo::start("api"), Echo::start("admin"));
    let keep = Portico::start(&api_admin_yaml("{ encoded_slashes: keep }", api.addr, admin.addr));
    for proto in BOTH {
        assert_eq!(
            get(keep.addr, proto, "/api%2Fx").status,
            404,
            "{proto:?}: /api%2Fx is one segment, not under /api/"
        );
        assert_eq!(get(keep.addr, proto, "/admin%2f..").status, 404, "{proto:?}");
        let r = get(keep.addr, proto, "/api/%2e%2e%2fadmin");
        assert_eq!(r.header("x-backend").as_deref(), Some("api"), "{proto:?}: {r:?}");
        assert_eq!(r.seen().target, "/api/..%2Fadmin", "{proto:?}");
        let r = get(keep.addr, proto, "/api/x%2F..%2F..%2Fadmin");
        assert_eq!(r.seen().target, "/api/x%2F..%2F..%2Fadmin", "{proto:?}");
    }
    assert_eq!(admin.requests(), 0);
}

#[test]
fn dot_segments_with_merge_slashes_off() {
    let echo = Echo::start("app");
    let yaml = config(
        "    paths: { merge_slashes: false }\n",
        &format!("routes:\n  - match: {{ path_prefix: / }}\n    cluster: app\nclusters:\n  app:\n    endpoints:\n      - address: \"{}\"\n", echo.addr),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        assert_eq!(get(p.addr, proto, "/a//../b").seen().target, "/a/b", "{proto:?}");
        assert_eq!(get(p.addr, proto, "//./x").seen().target, "//x", "{proto:?}");
        assert_eq!(get(p.addr, proto, "/a/..//b").seen().target, "//b", "{proto:?}");
    }
}

#[test]
fn local_answers_never_read_a_request_body_as_a_request() {
    let routes = "routes:\n  - match: { path: /s }\n    static: { status: 200, body: \"static\" }\n  - match: { path: /r }\n    redirect: { to: /elsewhere, status: 307 }\n";
    let p = Portico::start(&config("", routes));
    let smuggled = "GET /r HTTP/1.1\r\nHost: t\r\n\r\n";
    let chunked = format!("{:x}\r\n{smuggled}\r\n0\r\n\r\n", smuggled.len());
    for (method, framing, body) in [
        ("POST /s", format!("Content-Length: {}", smuggled.len()), smuggled.to_string()),
        ("POST /s", "Transfer-Encoding: chunked".to_string(), chunked.clone()),
        ("POST /r", format!("Content-Length: {}", smuggled.len()), smuggled.to_string()),
        ("POST /r", "Transfer-Encoding: chunked".to_string(), chunked.clone()),
    ] {
        // The body holds a request for /r; a request for /s follows it. Portico may drain the body and keep the
        // connection, or answer with `connection: close` and close it; it must never answer the body as a request.
        let first_status = if method.ends_with("/s") { 200 } else { 307 };
        let raw = format!("{method} HTTP/1.1\r\nHost: t\r\n{framing}\r\n\r\n{body}GET /s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let (out, _) = raw_exchange(p.addr, raw.as_bytes());
        let statuses: Vec<&str> =
            out.match_indices("HTTP/1.1 ").map(|(i, _)| &out[i..(i + 12).min(out.len())]).collect();
        assert!(!statuses.is_empty(), "{method} {framing}: no answer");
        assert!(statuses[0].starts_with(&format!("HTTP/1.1 {first_status}")), "{method} {framing}: {out}");
        if statuses.len() == 1 {
            assert!(
                out.to_ascii_lowercase().contains("connection: close"),
                "{method} {framing}: one answer, no close: {out}"
            );
        } else {
            assert_eq!(statuses.len(), 2, "{method} {framing}: the body was answered as a request: {out}");
            assert!(
                statuses[1].starts_with("HTTP/1.1 200"),
                "{method} {framing}: the body was answered as a request: {out}"
            );
        }
    }
    // Over HTTP/2 with a body.
    let r = request(p.addr, Proto::H2, "POST", "t", "/s", &[], &[b'x'; 100_000]);
    assert_eq!((r.status, r.text().as_str()), (200, "static"));
}
