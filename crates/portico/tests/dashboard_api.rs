//! The admin API the dashboard reads and acts through, over real sockets: the admin token on every request that
//! changes state, draining endpoints, live updates at most once a second, the charts' series, recent errors
//! with their reasons, the reload history, and the headers every admin answer carries.

mod common;

use common::*;
use portico_testkit::Backend;
use std::time::{Duration, Instant};

const TOKEN: &str = "test-admin-token-0c9a";

/// A POST to the admin server with extra header lines and a body.
fn post(portico: &Portico, path: &str, headers: &str, body: &str) -> Resp {
    let mut conn = Conn::open(portico.admin);
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        portico.admin,
        body.len()
    );
    conn.send(request.as_bytes());
    conn.read_response(false)
}

fn json(r: &Resp) -> serde_json::Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()))
}

fn two_endpoints(a: &Backend, b: &Backend, admin: &str) -> String {
    format!(
        "workers: 2\nadmin: {admin}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\n\
         routes: [ {{ name: main, match: {{ path_prefix: / }}, cluster: app }} ]\n\
         clusters:\n  app:\n    balancer: round_robin\n    endpoints: [ {{ address: \"{}\" }}, {{ address: \"{}\" }} ]\n",
        a.addr, b.addr
    )
}

#[test]
fn the_admin_token_guards_every_request_that_changes_state() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let portico = Portico::start(&two_endpoints(&a, &b, &format!("{{ address: \"{{admin}}\", token: \"{TOKEN}\" }}")));
    let drain = format!("{{\"cluster\":\"app\",\"endpoint\":\"{}\"}}", a.addr);
    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");
    for path in ["/admin/reload", "/admin/upgrade", "/admin/endpoints/drain", "/admin/endpoints/enable"] {
        let r = post(&portico, path, "", &drain);
        assert_eq!(r.status, 401, "{path} without the token: {}", r.text());
        assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer realm=\"portico admin\""));
        let r = post(&portico, path, "Authorization: Bearer wrong\r\n", &drain);
        assert_eq!(r.status, 401, "{path} with a wrong token: {}", r.text());
    }
    assert_eq!(portico.metric("portico_admin_denials_total{reason=\"missing\"}"), 4.0);
    assert_eq!(portico.metric("portico_admin_denials_total{reason=\"invalid\"}"), 4.0);
    // Nothing was drained, reloaded or upgraded.
    assert_eq!(portico.clusters()["clusters"][0]["endpoints"][0]["drained"], false);
    assert_eq!(json(&portico.admin_get("/admin/reload"))["last_attempt_ms"], serde_json::Value::Null);
    // With the token, they are done.
    let r = post(&portico, "/admin/reload", &bearer, "");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post(&portico, "/admin/endpoints/drain", &bearer, &drain);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(portico.clusters()["clusters"][0]["endpoints"][0]["drained"], true);
    // Even with the token, a page of another origin may not change state.
    let r = post(&portico, "/admin/endpoints/enable", &format!("{bearer}Origin: http://evil.example\r\n"), &drain);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(portico.metric("portico_admin_denials_total{reason=\"origin\"}"), 1.0);
    let same_origin = format!("{bearer}Origin: http://{}\r\n", portico.admin);
    assert_eq!(post(&portico, "/admin/endpoints/enable", &same_origin, &drain).status, 200);
    // Reading needs no token, and the token is never shown.
    let config = portico.admin_get("/admin/config");
    assert_eq!(config.status, 200);
    assert!(!config.text().contains(TOKEN), "{}", config.text());
}

#[test]
fn a_token_file_and_its_errors() {
    let dir = temp_dir();
    std::fs::write(dir.join("admin.token"), format!("{TOKEN}\n")).unwrap();
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let portico = Portico::start_in(&dir, &two_endpoints(&a, &b, "{ address: \"{admin}\", token_file: admin.token }"));
    assert_eq!(post(&portico, "/admin/reload", "", "").status, 401);
    let r = post(&portico, "/admin/reload", &format!("Authorization: Bearer {TOKEN}\r\n"), "");
    assert_eq!(r.status, 200, "the file's token without its newline: {}", r.text());
    // A token file that cannot be read, and both keys at once, are configuration errors with their place.
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, two_endpoints(&a, &b, "{ address: \"127.0.0.1:1\", token_file: missing.token }")).unwrap();
    let out = std::process::Command::new(portico_bin()).args(["check", "-c"]).arg(&bad).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(text.contains("bad.yaml:2:") && text.contains("cannot read the admin token file missing.token"), "{text}");
    std::fs::write(&bad, two_endpoints(&a, &b, "{ address: \"127.0.0.1:1\", token: x, token_file: admin.token }"))
        .unwrap();
    let out = std::process::Command::new(portico_bin()).args(["check", "-c"]).arg(&bad).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("give `token` or `token_file`, not both"), "{text}");
}

#[test]
fn a_drained_endpoint_gets_no_new_requests_until_enabled() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let portico = Portico::start(&two_endpoints(&a, &b, "{ address: \"{admin}\" }"));
    let drain = format!("{{\"cluster\":\"app\",\"endpoint\":\"{}\"}}", a.addr);
    let r = post(&portico, "/admin/endpoints/drain", "Content-Type: application/json\r\n", &drain);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(json(&r)["endpoint"]["changed"], true);
    let before = a.requests();
    let mut conn = Conn::open(portico.addr);
    for _ in 0..20 {
        assert_eq!(conn.get("/", "").status, 200);
    }
    assert_eq!(a.requests(), before, "a drained endpoint was sent requests");
    let sample = format!("portico_endpoint_drained{{cluster=\"app\",endpoint=\"{}\"}}", a.addr);
    assert_eq!(portico.metric(&sample), 1.0);
    // A reload keeps it drained (the state is the endpoint's, kept across reloads).
    portico.rewrite_config(&two_endpoints(&a, &b, "{ address: \"{admin}\" }").replace("workers: 2", "workers: 2\n"));
    assert_eq!(post(&portico, "/admin/reload", "", "").status, 200);
    assert_eq!(portico.metric(&sample), 1.0);
    assert_eq!(post(&portico, "/admin/endpoints/enable", "", &drain).status, 200);
    for _ in 0..20 {
        assert_eq!(conn.get("/", "").status, 200);
    }
    assert!(a.requests() >= before + 9, "an enabled endpoint gets its share again");
    // What does not name an endpoint is refused with a reason.
    let r = post(&portico, "/admin/endpoints/drain", "", "{\"cluster\":\"app\",\"endpoint\":\"10.9.9.9:1\"}");
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(post(&portico, "/admin/endpoints/drain", "", "{\"cluster\":\"app\"}").status, 400);
    assert_eq!(post(&portico, "/admin/endpoints/drain", "", "not json").status, 400);
}

#[test]
fn live_updates_come_at_most_once_a_second_and_the_series_fill() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let portico = Portico::start(&two_endpoints(&a, &b, "{ address: \"{admin}\" }"));
    let load = Load::start(portico.addr, 2);
    let mut stream = std::net::TcpStream::connect(portico.admin).unwrap();
    use std::io::{Read, Write};
    stream.write_all(b"GET /admin/events HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let (started, mut seen) = (Instant::now(), Vec::new());
    while started.elapsed() < Duration::from_millis(4500) {
        let mut buf = [0u8; 65536];
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    let (ok, _) = load.finish();
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 200") && text.contains("content-type: text/event-stream"), "{text:.300}");
    let updates = text.matches("data: {").count();
    assert!((3..=5).contains(&updates), "{updates} updates in 4.5 s");
    // Each update is an overview; the charts' last second shows the load on the route.
    let last = text.rsplit("data: ").next().and_then(|d| d.split("\r\n").next()).unwrap_or_default();
    let overview: serde_json::Value = serde_json::from_str(last.trim()).unwrap_or_else(|e| panic!("{e}: {last}"));
    let route = overview["series"].as_array().unwrap().iter().find(|s| s["kind"] == "route" && s["name"] == "main");
    assert!(route.is_some_and(|r| r["rps"].as_f64() > Some(0.0)), "{}", overview["series"]);
    assert!(ok > 0);
    let series = json(&portico.admin_get("/admin/series"));
    let total = series["series"].as_array().unwrap().iter().find(|s| s["kind"] == "total").expect("total series");
    assert_eq!(total["rps"].as_array().unwrap().len(), series["t"].as_array().unwrap().len());
    assert!(total["p99_ms"].as_array().unwrap().iter().any(|v| v.as_f64().is_some_and(|ms| ms > 0.0)));
}

/// `/admin/listeners`' counters of the listener `name`.
fn listener(portico: &Portico, name: &str) -> serde_json::Value {
    let all = json(&portico.admin_get("/admin/listeners"));
    all["listeners"].as_array().unwrap().iter().find(|l| l["name"] == name).cloned().unwrap_or_default()
}

#[test]
fn each_listener_counts_its_own_requests_over_http1_and_http2() {
    let test = "each_listener_counts_its_own_requests_over_http1_and_http2";
    if !have_tool("curl", test) {
        return;
    }
    let a = Backend::start("a").unwrap();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let api = free_port();
    let portico = Portico::start(&format!(
        "workers: 2\nadmin: {{ address: \"{{admin}}\" }}\n\
         listeners:\n  - {{ name: web, address: \"{{listen}}\" }}\n  - {{ name: api, address: \"127.0.0.1:{api}\" }}\n\
         routes:\n  - {{ name: echo, match: {{ path_prefix: /echo }}, handler: echo }}\n\
         \x20 - {{ name: dead, match: {{ path_prefix: /dead }}, cluster: dead }}\n\
         \x20 - {{ name: main, match: {{ path_prefix: / }}, cluster: app }}\n\
         clusters:\n  app: {{ endpoints: [ {{ address: \"{}\" }} ] }}\n  dead: {{ endpoints: [ {{ address: \"{dead}\" }} ] }}\n",
        a.addr
    ));
    // The charts' first step is taken (the one before it is their baseline): every request below is charted.
    wait_until("the first step", Duration::from_secs(10), || {
        !json(&portico.admin_get("/admin/series"))["t"].as_array().unwrap().is_empty()
    });
    // HTTP/1 on `web`: 30 proxied requests and 3 bad heads (answered 400 before any route).
    let mut conn = Conn::open(portico.addr);
    for _ in 0..30 {
        assert_eq!(conn.get("/x", "").status, 200);
    }
    for _ in 0..3 {
        let (answer, _) = raw_exchange(portico.addr, b"GET /x HTTP/1.1\r\nHost: a\r\nbad header\r\n\r\n");
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    }
    // HTTP/2 (prior knowledge, curl) on `api`: proxied, answered by a handler, and failing upstream (502 or 503).
    // One connection per request: curl 7.88 fails a second request on a prior-knowledge connection ("Error in
    // the HTTP2 framing layer", against any h2c server).
    let h2 = |path: &str, n: usize| {
        let url = format!("http://127.0.0.1:{api}{path}");
        let answers = (0..n).map(|_| {
            let (ok, out) =
                curl(&["--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_version} %{http_code}", &url]);
            assert!(ok, "curl: {out}");
            out
        });
        answers.collect::<Vec<_>>()
    };
    assert!(h2("/x", 20).iter().all(|l| l == "2 200"));
    assert!(h2("/echo/y", 10).iter().all(|l| l == "2 200"));
    assert!(h2("/dead/z", 5).iter().all(|l| l == "2 502" || l == "2 503"));
    wait_until("each listener's requests are counted", Duration::from_secs(10), || {
        let (web, api) = (listener(&portico, "web"), listener(&portico, "api"));
        web["requests"] == 33 && web["errors"] == 0 && api["requests"] == 35 && api["errors"] == 5
    });
    // And charted: each listener's series shows its own traffic (and the errors only on `api`).
    let mut totals = (0.0, 0.0, 0.0);
    wait_until("the listeners' series have their requests", Duration::from_secs(10), || {
        let series = json(&portico.admin_get("/admin/series"));
        let sum = |name: &str, column: &str| -> f64 {
            let list = series["series"].as_array().unwrap();
            let s = list.iter().find(|s| s["kind"] == "listener" && s["name"] == name);
            s.and_then(|s| s[column].as_array()).map_or(0.0, |c| c.iter().filter_map(|v| v.as_f64()).sum())
        };
        totals = (sum("web", "rps"), sum("api", "rps"), sum("api", "eps"));
        // Rates a second apart: their sum is the count, give or take the timer's jitter.
        totals.0 > 30.0 && totals.1 > 31.0 && totals.2 > 4.0
    });
    let (web, api, api_errors) = totals;
    assert!(web < 36.0 && api < 39.0 && api_errors < 6.0, "{totals:?}");
    let series = json(&portico.admin_get("/admin/series"));
    let web_errors =
        series["series"].as_array().unwrap().iter().find(|s| s["kind"] == "listener" && s["name"] == "web");
    let web_eps: f64 = web_errors.unwrap()["eps"].as_array().unwrap().iter().filter_map(|v| v.as_f64()).sum();
    assert_eq!(web_eps, 0.0, "the errors were `api`'s");
}

#[test]
fn recent_errors_and_the_reload_history() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap(); // nothing listens now
    let yaml = |route: &str| {
        format!(
            "admin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\n\
             routes: [ {{ name: {route}, match: {{ path_prefix: / }}, cluster: gone }} ]\n\
             clusters: {{ gone: {{ endpoints: [ {{ address: \"{dead}\" }} ] }} }}\n"
        )
    };
    let portico = Portico::start(&yaml("first"));
    let r = Conn::open(portico.addr).get("/some/path?q=1", "");
    assert_eq!(r.status, 502);
    // Recorded once the response is written: a moment after the client has it.
    let mut errors = serde_json::Value::Null;
    wait_until("the error is recorded", Duration::from_secs(5), || {
        errors = json(&portico.admin_get("/admin/errors"));
        errors["errors"][0].is_object()
    });
    let e = &errors["errors"][0];
    assert_eq!(e["status"], 502);
    assert_eq!(e["reason"], "upstream refused the connection");
    assert_eq!((e["route"].as_str(), e["cluster"].as_str()), (Some("first"), Some("gone")));
    assert_eq!(e["endpoint"], dead.to_string());
    assert_eq!((e["method"].as_str(), e["path"].as_str()), (Some("GET"), Some("/some/path")), "without the query");
    // A reload: its changes and diff; a refused one: its errors and the diff of what was tried.
    portico.rewrite_config(&yaml("second"));
    assert_eq!(post(&portico, "/admin/reload", "", "").status, 200);
    portico.rewrite_config(&yaml("third").replace("cluster: gone", "cluster: nowhere"));
    assert_eq!(post(&portico, "/admin/reload", "", "").status, 422);
    let history = json(&portico.admin_get("/admin/reloads"));
    let (refused, applied) = (&history["reloads"][0], &history["reloads"][1]);
    assert_eq!((refused["ok"].as_bool(), applied["ok"].as_bool()), (Some(false), Some(true)));
    assert_eq!(applied["trigger"], "admin API");
    assert!(applied["changes"].as_array().unwrap().iter().any(|c| c == "+ route second"), "{applied}");
    assert!(applied["diff"].as_str().unwrap().contains("+routes: [ { name: second"), "{applied}");
    assert!(refused["error"].as_str().unwrap().contains("portico.yaml:3:"), "{refused}");
    assert!(refused["diff"].as_str().unwrap().contains("cluster: nowhere"), "{refused}");
    assert_eq!(json(&portico.admin_get("/admin/overview"))["reloads"]["last_id"], 2);
}

#[test]
fn every_admin_answer_forbids_framing_and_foreign_content() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let portico = Portico::start(&two_endpoints(&a, &b, "{ address: \"{admin}\" }"));
    for path in ["/", "/dashboard/app.js", "/dashboard/vendor/uplot/uPlot.esm.js", "/metrics", "/admin/clusters", "/x"]
    {
        let r = portico.admin_get(path);
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"), "{path}: {}", r.head);
        assert_eq!(r.header("x-frame-options").as_deref(), Some("DENY"), "{path}");
        assert_eq!(r.header("x-content-type-options").as_deref(), Some("nosniff"), "{path}");
    }
    let page = portico.admin_get("/");
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").unwrap_or_default().starts_with("text/html"));
    // The page names no other origin: every script and stylesheet is the admin server's own.
    let html = page.text();
    assert!(!html.contains("http://") && !html.contains("https://") && !html.contains("//cdn"), "{html}");
    assert_eq!(portico.admin_get("/dashboard/vendor/uplot/LICENSE").status, 200);
}

#[test]
fn with_worker_processes_the_master_sums_their_series_and_errors() {
    let a = Backend::start("a").unwrap();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let portico = Portico::start(&format!(
        "workers: 2\nprocess_model: multi_process\nadmin: {{ address: \"{{admin}}\" }}\n\
         listeners: [ {{ name: web, address: \"{{listen}}\" }} ]\n\
         routes:\n  - {{ name: gone, match: {{ path_prefix: /gone }}, cluster: gone }}\n  - {{ name: main, match: {{ path_prefix: / }}, cluster: app }}\n\
         clusters:\n  app: {{ endpoints: [ {{ address: \"{}\" }} ] }}\n  gone: {{ endpoints: [ {{ address: \"{dead}\" }} ] }}\n",
        a.addr
    ));
    let load = Load::reconnecting(portico.addr, 4);
    for _ in 0..4 {
        // 502 until outlier detection ejects the endpoint, 503 after.
        let status = Conn::open(portico.addr).get("/gone/x", "").status;
        assert!(status == 502 || status == 503, "{status}");
    }
    let mut route_rps = 0.0;
    wait_until("the master charts its workers' requests", Duration::from_secs(10), || {
        let series = json(&portico.admin_get("/admin/series"));
        route_rps = series["series"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["kind"] == "route" && s["name"] == "main")
            .and_then(|s| s["rps"].as_array()?.iter().filter_map(|v| v.as_f64()).reduce(f64::max))
            .unwrap_or(0.0);
        route_rps > 0.0
    });
    let (ok, _) = load.finish();
    assert!(ok > 0);
    // The listener's series too: every worker process's requests on it.
    let series = json(&portico.admin_get("/admin/series"));
    let web = series["series"].as_array().unwrap().iter().find(|s| s["kind"] == "listener" && s["name"] == "web");
    let web_rps = web.and_then(|s| s["rps"].as_array()?.iter().filter_map(|v| v.as_f64()).reduce(f64::max));
    assert!(web_rps.is_some_and(|r| r > 0.0), "{series}");
    let errors = json(&portico.admin_get("/admin/errors"));
    let list = errors["errors"].as_array().unwrap();
    assert_eq!(list.len(), 4, "each worker process's errors, together: {errors}");
    let reasons = ["upstream refused the connection", "no healthy upstream endpoint"];
    assert!(list.iter().all(|e| reasons.iter().any(|r| e["reason"] == *r)), "{errors}");
    // Draining is each worker process's own state: refused with a reason rather than done in one of them.
    let r =
        post(&portico, "/admin/endpoints/drain", "", &format!("{{\"cluster\":\"app\",\"endpoint\":\"{}\"}}", a.addr));
    assert_eq!(r.status, 409, "{}", r.text());
}
