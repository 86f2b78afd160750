//! Seeing and changing a running Portico: Prometheus metrics that match the traffic, the admin API, the
//! access log and its reopening, reloads (SIGHUP, admin API, file watch) under load without a failed request.

mod common;
use common::*;
use portico_testkit::Backend;
use std::io::Read;
use std::time::Duration;

#[test]
fn metrics_match_the_requests_sent() {
    let b = Backend::start("b").unwrap();
    let yaml = format!(
        "workers: 2\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - {{ name: web, address: \"{{listen}}\" }}\nroutes:\n  - {{ name: api, match: {{ path_prefix: /api }}, cluster: app }}\n  - {{ name: st, match: {{ path_prefix: /status }}, cluster: app }}\nclusters:\n  app:\n    endpoints: [ {{ address: \"{}\" }} ]\n",
        b.addr
    );
    let p = Portico::start(&yaml);
    for _ in 0..7 {
        let mut conn = Conn::open(p.addr); // new connections spread over both workers
        assert_eq!(conn.get("/api/x", "").status, 200);
    }
    let mut conn = Conn::open(p.addr);
    for _ in 0..3 {
        assert_eq!(conn.get("/nowhere", "").status, 404);
    }
    assert_eq!(conn.get("/status/503", "").status, 503);
    let m = |s: &str| p.metric(s);
    // A request is counted right after its response is written: wait for the last one.
    wait_until("the last request counted", Duration::from_secs(2), || {
        m("portico_requests_total{route=\"st\",cluster=\"app\",status_class=\"5xx\"}") == 1.0
    });
    assert_eq!(m("portico_requests_total{route=\"api\",cluster=\"app\",status_class=\"2xx\"}"), 7.0);
    assert_eq!(m("portico_requests_total{route=\"none\",cluster=\"none\",status_class=\"4xx\"}"), 3.0);
    let ep = format!("cluster=\"app\",endpoint=\"{}\"", b.addr);
    assert_eq!(m(&format!("portico_upstream_requests_total{{{ep},status_class=\"2xx\"}}")), 7.0);
    assert_eq!(m("portico_request_duration_seconds_count{route=\"api\",cluster=\"app\"}"), 7.0);
    assert_eq!(m(&format!("portico_upstream_duration_seconds_count{{{ep}}}")), 8.0);
    let opened = m(&format!("portico_upstream_connections_opened_total{{{ep}}}"));
    assert!((1.0..=2.0).contains(&opened), "opened {opened} upstream connections for 8 sequential requests");
    assert_eq!(m(&format!("portico_upstream_connections_idle{{{ep}}}")), opened);
    assert_eq!(m(&format!("portico_endpoint_healthy{{{ep}}}")), 1.0);
    assert_eq!(m("portico_reloads_total"), 0.0);
    let text = p.admin_get("/metrics").text();
    assert!(text.contains("# TYPE portico_requests_total counter"));
    assert!(text.contains("portico_request_duration_seconds_bucket{route=\"api\",cluster=\"app\",le=\"+Inf\"} 7"));
}

#[test]
fn admin_api_reports_clusters_config_health_and_readiness() {
    let b = Backend::start("b").unwrap();
    let mut p = Portico::simple("least_connections", &[b.addr], "");
    assert_eq!(p.admin_get("/health").status, 200);
    assert_eq!(p.admin_get("/ready").status, 200);
    Conn::open(p.addr).get("/", "");
    // Counted (and pooled) right after the response is written: wait for it.
    wait_until("the request counted", Duration::from_secs(2), || {
        p.clusters()["clusters"][0]["endpoints"][0]["requests"] == 1
    });
    let clusters = p.clusters();
    let ep = &clusters["clusters"][0]["endpoints"][0];
    assert_eq!(clusters["clusters"][0]["name"], "app");
    assert_eq!(ep["address"], b.addr.to_string());
    assert_eq!(ep["healthy"], true);
    assert_eq!(ep["ejected"], false);
    assert_eq!(ep["in_flight"], 0);
    assert_eq!(ep["idle_connections"], 1);
    assert_eq!(ep["requests"], 1);
    let config: serde_json::Value = serde_json::from_slice(&p.admin_get("/admin/config").body).unwrap();
    assert!(config["yaml"].as_str().unwrap().contains("least_connections"));
    let not_found = p.admin_get("/nope");
    assert_eq!(not_found.status, 404);
    for path in ["/metrics", "/admin/clusters", "/admin/reload", "/admin/process", "/admin/upgrade"] {
        assert!(not_found.text().contains(path), "the 404 does not name {path}: {}", not_found.text());
    }
    // Readiness drops when shutting down.
    p.signal(libc::SIGTERM);
    p.wait_exit(Duration::from_secs(5)).expect("exited");
}

#[test]
fn secrets_are_masked_in_the_config_view() {
    assert_eq!(
        portico_admin::mask_secrets("a: 1\n  password: hunter2\ntoken:\nkey: x"),
        "a: 1\n  password: \"****\"\ntoken:\nkey: x"
    );
}

#[test]
fn admin_reload_applies_valid_and_refuses_invalid_configs() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let p = Portico::simple("round_robin", &[a.addr], "");
    // No reload yet: no outcome to report, neither success nor failure.
    let before: serde_json::Value = serde_json::from_slice(&p.admin_get("/admin/reload").body).unwrap();
    assert_eq!(before, serde_json::json!({ "last_attempt_ms": null, "ok": null, "error": null }));
    p.rewrite_config(&simple_yaml("round_robin", &[b.addr], ""));
    let mut admin = Conn::open(p.admin);
    admin.send(b"POST /admin/reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    let r = admin.read_response(false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(backend_of(&mut Conn::open(p.addr), "/", ""), "b");
    let applied: serde_json::Value = serde_json::from_slice(&p.admin_get("/admin/reload").body).unwrap();
    let unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let at = applied["last_attempt_ms"].as_u64().unwrap_or_default();
    assert!(at <= unix_ms && unix_ms - at < 60_000, "last_attempt_ms is not the time of the reload: {applied}");
    assert_eq!((&applied["ok"], &applied["error"]), (&serde_json::json!(true), &serde_json::Value::Null));
    // An invalid file: refused with FILE:LINE:COL, the running config stays, the failure is counted.
    p.rewrite_config(&simple_yaml("fastest", &[a.addr], ""));
    admin.send(b"POST /admin/reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    let r = admin.read_response(false);
    assert_eq!(r.status, 422);
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("{}:11:15: clusters.app.balancer: unknown variant `fastest`", p.config.display())),
        "{error}"
    );
    assert_eq!(backend_of(&mut Conn::open(p.addr), "/", ""), "b");
    assert_eq!(p.metric("portico_reloads_total"), 1.0);
    assert_eq!(p.metric("portico_reload_failures_total"), 1.0);
    assert_eq!(p.metric("portico_config_last_reload_successful"), 0.0);
    let status: serde_json::Value = serde_json::from_slice(&p.admin_get("/admin/reload").body).unwrap();
    assert!(status["error"].as_str().unwrap().contains("unknown variant"), "{status}");
    assert_eq!(status["ok"], false, "{status}");
    // Every problem of the file, not only the first.
    p.rewrite_config(&simple_yaml("fastest", &[a.addr], "").replace("workers: 1", "workers: 1\nwach: true"));
    admin.send(b"POST /admin/reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    let r = admin.read_response(false);
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let error = body["error"].as_str().unwrap();
    assert!(error.contains(":2:1: unknown field `wach`") && error.contains(":12:15: clusters.app.balancer"), "{error}");
    assert_eq!(backend_of(&mut Conn::open(p.addr), "/", ""), "b");
}

#[test]
fn a_reload_stops_exporting_the_series_of_what_it_removed() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let both = format!(
        "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\nroutes:\n  - {{ name: legacy, match: {{ path_prefix: /old/ }}, cluster: old }}\n  - {{ name: main, cluster: app }}\nclusters:\n  app: {{ endpoints: [ {{ address: \"{}\" }} ] }}\n  old: {{ endpoints: [ {{ address: \"{}\" }} ] }}\n",
        a.addr, b.addr
    );
    let only_app = both
        .replace("  - { name: legacy, match: { path_prefix: /old/ }, cluster: old }\n", "")
        .replace(&format!("  old: {{ endpoints: [ {{ address: \"{}\" }} ] }}\n", b.addr), "");
    assert_ne!(only_app, both);
    let p = Portico::start(&both);
    let legacy_ok = r#"portico_requests_total{route="legacy",cluster="old",status_class="2xx"}"#;
    let main_ok = r#"portico_requests_total{route="main",cluster="app",status_class="2xx"}"#;
    let mut conn = Conn::open(p.addr);
    assert_eq!(backend_of(&mut conn, "/old/x", ""), "b");
    assert_eq!(backend_of(&mut conn, "/", ""), "a");
    wait_until("both requests counted", Duration::from_secs(2), || {
        p.metric(legacy_ok) == 1.0 && p.metric(main_ok) == 1.0
    });
    let removed = |text: &str| -> Vec<String> {
        let marks = ["cluster=\"old\"".to_string(), "route=\"legacy\"".to_string(), format!("\"{}\"", b.addr)];
        text.lines().filter(|l| !l.starts_with('#') && marks.iter().any(|m| l.contains(m))).map(String::from).collect()
    };
    assert!(!removed(&p.admin_get("/metrics").text()).is_empty());
    let reload = |yaml: &str| {
        p.rewrite_config(yaml);
        let mut admin = Conn::open(p.admin);
        admin.send(b"POST /admin/reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
        let r = admin.read_response(false);
        assert_eq!(r.status, 200, "{}", r.text());
    };
    reload(&only_app);
    let text = p.admin_get("/metrics").text();
    assert_eq!(removed(&text), Vec::<String>::new(), "series of the removed route, cluster and endpoint");
    assert_eq!(p.metric(main_ok), 1.0, "what stays is still exported:\n{text}");
    // Brought back, its counters go on from where they were.
    reload(&both);
    assert_eq!(p.metric(legacy_ok), 1.0);
}

#[test]
fn watch_reloads_when_the_file_changes() {
    let (a, b) = (Backend::start("a").unwrap(), Backend::start("b").unwrap());
    let p = Portico::start(&simple_yaml("round_robin", &[a.addr], "").replace("workers: 1", "workers: 1\nwatch: true"));
    assert_eq!(backend_of(&mut Conn::open(p.addr), "/", ""), "a");
    std::thread::sleep(Duration::from_millis(1100)); // a different modification time
    let yaml = simple_yaml("round_robin", &[b.addr], "").replace("workers: 1", "workers: 1\nwatch: true");
    p.rewrite_config(&yaml);
    wait_until("the changed file applied", Duration::from_secs(5), || {
        backend_of(&mut Conn::open(p.addr), "/", "") == "b"
    });
}

#[test]
fn access_log_lines_and_reopen_on_sigusr1() {
    let b = Backend::start("b").unwrap();
    let dir = temp_dir();
    let log = dir.join("logs/access.log");
    let yaml = simple_yaml("round_robin", &[b.addr], "")
        .replace("workers: 1", &format!("workers: 1\naccess_log: {{ path: \"{}\", format: json }}", log.display()));
    let p = Portico::start(&yaml);
    let mut conn = Conn::open(p.addr);
    conn.get("/echo?x=1", "User-Agent: test-agent\r\n");
    conn.get("/missing/status/404", "");
    wait_until("two lines logged", Duration::from_secs(3), || {
        std::fs::read_to_string(&log).unwrap_or_default().lines().count() == 2
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["method"], "GET");
    assert_eq!(first["target"], "/echo?x=1");
    assert_eq!(first["status"], 200);
    assert_eq!(first["upstream"], b.addr.to_string());
    assert_eq!(first["retries"], 0);
    assert_eq!(first["user_agent"], "test-agent");
    assert_eq!(first["route"], "/*", "the default name says what the route matches");
    assert!(first["bytes"].as_u64().unwrap() > 0);
    assert!(first["duration_ms"].as_f64().unwrap() >= first["upstream_ms"].as_f64().unwrap());
    // Rotate: move the file away, SIGUSR1, and new lines go to a new file.
    let rotated = dir.join("logs/access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    p.signal(libc::SIGUSR1);
    std::thread::sleep(Duration::from_millis(200));
    conn.get("/after-rotation", "");
    wait_until("a line in the new file", Duration::from_secs(3), || {
        std::fs::read_to_string(&log).unwrap_or_default().contains("/after-rotation")
    });
    assert_eq!(std::fs::read_to_string(&rotated).unwrap().lines().count(), 2);
}

#[test]
fn relative_paths_start_at_the_configuration_files_directory() {
    let b = Backend::start("b").unwrap();
    let (dir, elsewhere) = (temp_dir(), temp_dir());
    std::fs::write(dir.join("hello.txt"), "hello from a file\n").unwrap();
    let yaml = simple_yaml("round_robin", &[b.addr], "")
        .replace("workers: 1", "workers: 1\naccess_log: { path: logs/access.log }")
        .replace("routes:\n", "routes:\n  - { match: { path: /hello }, static: { file: hello.txt } }\n");
    // Started from another directory, as systemd starts a service from `/`.
    let p = Portico::start_in_from(&dir, &elsewhere, &yaml);
    let mut conn = Conn::open(p.addr);
    assert_eq!(conn.get("/hello", "").text(), "hello from a file\n");
    assert_eq!(conn.get("/", "").status, 200);
    let log = dir.join("logs/access.log");
    wait_until("two lines next to the configuration", Duration::from_secs(3), || {
        std::fs::read_to_string(&log).unwrap_or_default().lines().count() == 2
    });
    assert!(!elsewhere.join("logs").exists(), "a log was written under the working directory");
}

#[test]
fn a_route_added_above_another_leaves_its_name_its_metrics_and_check_against_alone() {
    let b = Backend::start("b").unwrap();
    let yaml = format!(
        "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\nroutes:\n  - {{ match: {{ path_prefix: /api, methods: [GET] }}, cluster: app }}\nclusters:\n  app: {{ endpoints: [ {{ address: \"{}\" }} ] }}\n",
        b.addr
    );
    let p = Portico::start(&yaml);
    let api = "portico_requests_total{route=\"GET /api/*\",cluster=\"app\",status_class=\"2xx\"}";
    assert_eq!(Conn::open(p.addr).get("/api/x", "").status, 200);
    // Counted just after the response is written: the client may ask before that.
    wait_until("the request counted", Duration::from_secs(5), || p.metric(api) == 1.0);
    let running = std::fs::read_to_string(&p.config).unwrap();
    let next = running.replace("routes:\n", "routes:\n  - { match: { path: /api/health }, static: { body: ok } }\n");
    let next_path = p.config.with_file_name("next.yaml");
    std::fs::write(&next_path, &next).unwrap();
    let out = std::process::Command::new(portico_bin())
        .args(["check", "-c"])
        .arg(&next_path)
        .arg("--against")
        .arg(&p.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("+ route /api/health"), "{text}");
    assert!(!text.contains("/api/*"), "the route below is reported: {text}");
    std::fs::write(&p.config, &next).unwrap();
    p.signal(libc::SIGHUP);
    wait_until("the new route answers", Duration::from_secs(5), || {
        Conn::open(p.addr).get("/api/health", "").text() == "ok"
    });
    // Until the reload, /api/health went to the route below (counted under its name too). A request is
    // counted just after its response is written: let the last ones land before reading.
    std::thread::sleep(Duration::from_millis(200));
    let before = p.metric(api);
    assert_eq!(Conn::open(p.addr).get("/api/x", "").status, 200);
    wait_until("the request counted under the same name", Duration::from_secs(5), || p.metric(api) == before + 1.0);
    let metrics = p.admin_get("/metrics").text();
    assert!(!metrics.contains("route=\"GET /api/*#"), "{metrics}");
}

#[test]
fn shutdown_loses_no_access_log_line_and_refused_heads_are_counted() {
    let b = Backend::start("b").unwrap();
    let log = temp_dir().join("access.log");
    let yaml = simple_yaml("round_robin", &[b.addr], "")
        .replace("workers: 1", &format!("workers: 2\naccess_log: {{ path: \"{}\" }}", log.display()));
    let mut p = Portico::start(&yaml);
    let mut conn = Conn::open(p.addr);
    for _ in 0..50 {
        conn.get("/", "");
    }
    // A malformed head is answered 400, counted as unrouted and logged too.
    let (out, _) = raw_exchange(p.addr, b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 400"));
    wait_until("the 400 counted", Duration::from_secs(2), || {
        p.metric("portico_requests_total{route=\"none\",cluster=\"none\",status_class=\"4xx\"}") == 1.0
    });
    drop(conn);
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(5)).expect("exited").success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), 51, "lines lost at shutdown");
    assert!(text.contains("\"status\":400"));
}

#[test]
fn combined_access_log_format() {
    let b = Backend::start("b").unwrap();
    let log = temp_dir().join("access.log");
    let yaml = simple_yaml("round_robin", &[b.addr], "")
        .replace("workers: 1", &format!("workers: 1\naccess_log: {{ path: \"{}\", format: combined }}", log.display()));
    let p = Portico::start(&yaml);
    Conn::open(p.addr).get("/x", "Referer: http://r/\r\nUser-Agent: ua\r\n");
    wait_until("a line", Duration::from_secs(3), || std::fs::read_to_string(&log).unwrap_or_default().contains('\n'));
    let line = std::fs::read_to_string(&log).unwrap();
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    assert!(line.contains("] \"GET /x HTTP/1.1\" 200 "), "{line}");
    assert!(line.contains("\"http://r/\" \"ua\" rt="), "{line}");
    assert!(line.contains(&format!("upstream={}", b.addr)), "{line}");
    assert!(line.contains("retries=0 route=/* cluster=app"), "{line}");
}

/// Runs `portico run` with `log_settings` and stderr to a pipe (as under a supervisor, or with `2>file`) at the
/// default level, until it serves; then stops it and returns its admin address and everything it logged.
fn error_log_through_a_pipe(log_settings: &str) -> (std::net::SocketAddr, String) {
    let b = Backend::start("b").unwrap();
    let dir = temp_dir();
    let admin: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let config = dir.join("portico.yaml");
    let yaml = simple_yaml("round_robin", &[b.addr], "")
        .replace("{admin}", &admin.to_string())
        .replace("{listen}", &format!("127.0.0.1:{}", free_port()));
    std::fs::write(&config, format!("{log_settings}\n{yaml}")).unwrap();
    let child = std::process::Command::new(portico_bin())
        .args(["run", "-c"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("portico serves", Duration::from_secs(15), || answers_ready(admin));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    (admin, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn the_error_log_has_no_colour_escapes_off_a_terminal() {
    let (admin, log) = error_log_through_a_pipe("");
    assert!(log.contains("listening on") && log.contains("stopped"), "{log}");
    assert!(
        log.contains(&format!("admin API on http://{admin}")),
        "the start-up log does not give the admin API: {log}"
    );
    assert!(!log.contains("\x1b["), "colour escapes in a log written to a pipe:\n{log:?}");
}

#[test]
fn log_format_json_writes_one_object_per_line() {
    let (_, log) = error_log_through_a_pipe("log: { format: json }");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}")))
        .collect();
    for line in &lines {
        assert!(line["level"].is_string() && line["message"].is_string() && line["fields"].is_object(), "{line}");
        assert!(line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{line}");
    }
    let start = lines.iter().find(|l| l["message"].as_str().is_some_and(|m| m.contains("listening on")));
    let start = start.unwrap_or_else(|| panic!("no start-up line in {log}"));
    assert_eq!(start["level"], "info", "{start}");
    assert_eq!(start["fields"]["workers"], 1, "a field keeps its type: {start}");
}

#[test]
fn ten_reloads_under_load_fail_no_request_and_finish_a_long_download() {
    let bs: Vec<Backend> = (0..3).map(|i| Backend::start(&format!("b{i}")).unwrap()).collect();
    let config_for = |n: usize| -> String {
        // Alternate endpoints and routes on every reload.
        let (eps, extra_route) = if n.is_multiple_of(2) {
            (vec![bs[0].addr, bs[1].addr], "")
        } else {
            (vec![bs[1].addr, bs[2].addr], "  - { match: { path_prefix: /other }, cluster: app }\n")
        };
        let eps: String = eps.iter().map(|a| format!("      - address: \"{a}\"\n")).collect();
        format!(
            "workers: 2\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - {{ name: web, address: \"{{listen}}\" }}\nroutes:\n  - {{ match: {{ path_prefix: / }}, cluster: app }}\n{extra_route}clusters:\n  app:\n    endpoints:\n{eps}"
        )
    };
    let p = Portico::start(&config_for(0));

    // A long download, read slowly so that it spans every reload.
    let addr = p.addr;
    let download = std::thread::spawn(move || {
        let size: u64 = 48 << 20;
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        use std::io::Write;
        s.write_all(format!("GET /bytes/{size} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
        let mut total = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(e) => panic!("download failed after {total} bytes: {e}"),
            }
            std::thread::sleep(Duration::from_millis(4));
        }
        total > size
    });
    let load = Load::start(addr, 4);
    for n in 1..=10 {
        std::thread::sleep(Duration::from_millis(250));
        p.rewrite_config(&config_for(n));
        if n.is_multiple_of(2) {
            let mut admin = Conn::open(p.admin);
            admin.send(b"POST /admin/reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
            assert_eq!(admin.read_response(false).status, 200);
        } else {
            p.signal(libc::SIGHUP);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let (ok, failed) = load.finish();
    assert!(download.join().unwrap(), "the download did not complete");
    assert!(ok > 200, "only {ok} requests");
    assert!(failed.is_empty(), "{} requests failed during reloads: {failed:?}", failed.len());
    assert_eq!(p.metric("portico_reloads_total"), 10.0);
    // The last configuration (n = 10, even) is live: b0 and b1 serve, b2 does not.
    let mut conn = Conn::open(p.addr);
    let mut seen: Vec<String> = (0..4).map(|_| backend_of(&mut conn, "/", "")).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, vec!["b0", "b1"]);
}
