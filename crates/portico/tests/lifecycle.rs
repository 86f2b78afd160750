//! The command line and the process lifecycle: check, demo, graceful shutdown, reload.

mod common;
use common::*;
use portico_testkit::Backend;
use std::process::Command;
use std::time::{Duration, Instant};

fn check(yaml: &str) -> (bool, String, String) {
    let path = temp_dir().join("check.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(portico_bin()).args(["check", "-c"]).arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).replace(&path.display().to_string(), "FILE");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

#[test]
fn check_reports_every_error_with_file_line_col_and_a_hint() {
    let yaml = "\
workers: 1
listeners:
  - name: web
    address: 127.0.0.1:notaport
routes:
  - match: { path_prefix: api }
    cluster: missing
clusters:
  app:
    balancer: round_robin
    endpoints:
      - address: 127.0.0.1
      - address: 127.0.0.1:9001
        weight: 0
";
    let (ok, _, err) = check(yaml);
    assert!(!ok);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("FILE:")).collect();
    assert_eq!(lines.len(), 5, "{err}");
    assert!(lines[0].starts_with("FILE:4:14: invalid listener address"), "{err}");
    assert!(lines[1].starts_with("FILE:6:27: path_prefix \"api\" must start with '/'"), "{err}");
    assert!(lines[2].starts_with("FILE:7:14: route refers to unknown cluster \"missing\""), "{err}");
    assert!(lines[3].starts_with("FILE:12:18: invalid endpoint address"), "{err}");
    assert!(lines[4].starts_with("FILE:14:17: weight must be"), "{err}");
    assert!(err.contains("hint: known clusters: app"), "{err}");
    assert_eq!(err.matches("\n  hint: ").count(), 5, "every error carries a hint: {err}");
}

#[test]
fn check_reports_every_kind_of_problem_in_one_run_in_file_order() {
    // One of each: an unknown key, a bad address, missing certificate and key files, an unknown cluster, a
    // value of the wrong type. Each used to take a run of its own.
    let yaml = "\
listeners:
  - name: web
    address: 127.0.0.1:8080
    timeout: { header_read: 5s }
  - name: secure
    address: 127.0.0.1:99999
    tls:
      certificates: [ { cert: nowhere.pem, key: nowhere.key } ]
routes:
  - match: { path_prefix: /api }
    cluster: api
  - match: { path: /users/:id }
    cluster: users
clusters:
  api:
    endpoints: [ { address: 127.0.0.1:9001 } ]
  spare:
    endpoints: [ { address: 127.0.0.1:9002 } ]
    retries: { attempts: many }
";
    let (ok, _, err) = check(yaml);
    assert!(!ok);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("FILE:")).collect();
    let expected = [
        "FILE:4:5: listeners[0]: unknown field `timeout`",
        "FILE:6:14: invalid listener address \"127.0.0.1:99999\"",
        "FILE:8:31: cannot read ",
        "FILE:8:49: cannot read the private key in ",
        "FILE:13:14: route refers to unknown cluster \"users\"",
        "FILE:19:26: clusters.spare.retries.attempts: invalid type: string \"many\"",
    ];
    assert_eq!(lines.len(), expected.len(), "{err}");
    for (line, want) in lines.iter().zip(expected) {
        assert!(line.starts_with(want), "{line:?} is not {want:?} in:\n{err}");
    }
    assert_eq!(err.matches("\n  hint: ").count(), expected.len(), "every problem carries a hint: {err}");
    assert!(err.contains("hint: did you mean `timeouts`?"), "{err}");
    assert!(err.contains("nowhere.pem: No such file"), "{err}");
    assert!(err.contains("hint: write a whole number here"), "{err}");
}

#[test]
fn check_reports_unknown_keys_and_bad_values_at_their_position() {
    let (ok, _, err) = check("listeners:\n  - name: web\n    address: 127.0.0.1:8080\nclusters:\n  app:\n    balancer: fastest\n    endpoints: []\n");
    assert!(!ok);
    assert!(err.starts_with("FILE:6:15: clusters.app.balancer: unknown variant `fastest`"), "{err}");
    assert!(err.contains("round_robin"), "{err}");
    let (ok, _, err) = check("listeners:\n  - name: web\n    adress: 127.0.0.1:8080\n");
    assert!(!ok);
    assert!(err.starts_with("FILE:3:5:") && err.contains("unknown field `adress`"), "{err}");
    let (ok, _, err) = check("listeners:\n  - { name: web, address: 127.0.0.1:8080 }\nclusters:\n  app:\n    timeouts: { connect: 5 }\n    endpoints: [ { address: 127.0.0.1:1 } ]\n");
    assert!(!ok);
    assert!(err.contains("write it with a unit"), "{err}");
    let (ok, _, err) = check("listeners: [\n");
    assert!(!ok && err.starts_with("FILE:"), "{err}");
}

/// An example that names files under `certs/` is checked from a copy next to freshly made certificates (the
/// repository ships no private keys).
fn with_example_certificates(example: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(example).unwrap();
    if !text.contains("certs/") {
        return example.to_path_buf();
    }
    let dir = temp_dir();
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = common::pki::Ca::new(&certs, "upstream-ca");
    common::pki::Ca::new(&certs, "clients-ca");
    ca.server(&certs, "site", "site", &["example.com"]);
    let copy = dir.join(example.file_name().unwrap());
    std::fs::write(&copy, text).unwrap();
    copy
}

#[test]
fn check_accepts_a_valid_file_and_every_example() {
    let (ok, out, err) = check("listeners:\n  - { name: web, address: 127.0.0.1:8080 }\nroutes:\n  - { cluster: app }\nclusters:\n  app:\n    endpoints: [ { address: 127.0.0.1:9001 } ]\n");
    assert!(ok, "{err}");
    assert!(out.contains("valid"));
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let path = with_example_certificates(&path);
            let out = Command::new(portico_bin()).args(["check", "-c"]).arg(&path).output().unwrap();
            assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
            seen += 1;
        }
    }
    assert!(seen >= 3, "examples/ has no configurations");
}

#[test]
fn run_refuses_an_invalid_file_and_a_taken_port() {
    let path = temp_dir().join("bad.yaml");
    std::fs::write(&path, "listeners: []\n").unwrap();
    let out = Command::new(portico_bin()).args(["run", "-c"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no listeners"));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let yaml = format!("listeners:\n  - {{ name: web, address: \"{}\" }}\n", taken.local_addr().unwrap());
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(portico_bin()).args(["run", "-c"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot listen on"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn version_and_help() {
    let out = Command::new(portico_bin()).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("portico "));
    let out = Command::new(portico_bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for verb in ["run", "check", "demo"] {
        assert!(help.contains(verb), "{help}");
    }
}

/// A child process killed when dropped (a test that fails must not leave it running).
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn demo_serves_three_backends_round_robin() {
    let port = free_port();
    // Killed if an assertion fails: a demo left running would hold the test harness's output open.
    let mut child = ChildGuard(
        Command::new(portico_bin())
            .args(["demo", "--listen", &format!("127.0.0.1:{port}")])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut seen: Vec<String> = (0..6)
        .map(|_| {
            let (ok, body) = curl(&[&format!("http://127.0.0.1:{port}/")]);
            assert!(ok);
            body
        })
        .collect();
    // The other targets and the global filter.
    let (ok, health) = curl(&["-si", &format!("http://127.0.0.1:{port}/healthz")]);
    assert!(ok && health.starts_with("HTTP/1.1 200") && health.ends_with("\r\n\r\nok\n"), "{health}");
    assert!(health.contains("x-served-by: portico-demo"), "{health}");
    let (ok, moved) = curl(&["-si", &format!("http://127.0.0.1:{port}/old/echo")]);
    assert!(ok && moved.starts_with("HTTP/1.1 301") && moved.contains("location: /echo\r\n"), "{moved}");
    let (ok, whoami) = curl(&["-si", &format!("http://127.0.0.1:{port}/whoami")]);
    assert!(ok && whoami.starts_with("HTTP/1.1 200") && whoami.contains("GET /whoami"), "{whoami}");
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let status = child.0.wait().unwrap();
    assert!(status.success());
    assert_eq!(&seen[..3], &seen[3..], "not a rotation: {seen:?}");
    seen.sort();
    seen.dedup();
    assert_eq!(seen, vec!["hello from alpha\n", "hello from beta\n", "hello from gamma\n"]);
}

#[test]
fn sigterm_finishes_in_flight_requests_then_exits_zero() {
    let b = Backend::start("b").unwrap();
    let yaml = simple_yaml("round_robin", &[b.addr], "").replace("workers: 1", "workers: 2\nshutdown: { grace: 5s }");
    let mut p = Portico::start(&yaml);
    let mut idle = Conn::open(p.addr);
    assert_eq!(idle.get("/", "").status, 200);
    let mut busy = Conn::open(p.addr);
    busy.send(b"GET /slow/1000 HTTP/1.1\r\nHost: a\r\n\r\n");
    // Connected, request not sent yet: it must be answered, not closed (its client has not heard from us).
    let mut fresh = Conn::open(p.addr);
    // Connected and silent (a preconnect): it must not hold the shutdown for long.
    let _silent = std::net::TcpStream::connect(p.addr).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    p.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    let r = fresh.get("/", "");
    assert_eq!((r.status, r.header("connection").as_deref()), (200, Some("close")), "{}", r.text());
    // No new connections once shutting down.
    assert!(std::net::TcpStream::connect(p.addr).is_err(), "still accepting after SIGTERM");
    // The in-flight request completes, marked as the last on its connection.
    let r = busy.read_response(false);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection").as_deref(), Some("close"));
    assert!(idle.is_closed(), "idle keep-alive connection not closed on shutdown");
    let status = p.wait_exit(Duration::from_secs(5)).expect("exited");
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

#[test]
fn sighup_reloads_routes_and_keeps_the_old_config_when_the_new_one_is_invalid() {
    let a = Backend::start("a").unwrap();
    let b = Backend::start("b").unwrap();
    let p = Portico::simple("round_robin", &[a.addr], "");
    let mut conn = Conn::open(p.addr);
    assert_eq!(backend_of(&mut conn, "/", ""), "a");
    p.rewrite_config(&simple_yaml("round_robin", &[b.addr], ""));
    p.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend_of(&mut Conn::open(p.addr), "/", "") != "b" {
        assert!(Instant::now() < deadline, "reload not applied");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The keep-alive connection that idled through the reload uses the new routes for its next request.
    assert_eq!(backend_of(&mut conn, "/", ""), "b");
    std::fs::write(&p.config, "listeners: [ broken\n").unwrap();
    p.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(backend_of(&mut conn, "/", ""), "b", "an invalid reload changed the running config");
}

#[test]
fn the_open_file_limit_is_raised_and_a_short_one_is_reported() {
    // Started with a soft limit of 1024 under a higher hard limit: Portico raises the soft limit itself.
    let hard = std::fs::read_to_string("/proc/self/limits")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4)?.parse::<u64>().ok())
        .expect("hard open-file limit");
    let dir = temp_dir();
    let config = dir.join("portico.yaml");
    let port = free_port();
    let yaml = format!(
        "listeners: [ {{ name: web, address: \"127.0.0.1:{port}\", limits: {{ max_connections: {} }} }} ]\nroutes: [ {{ cluster: app }} ]\nclusters: {{ app: {{ endpoints: [ {{ address: \"127.0.0.1:9\" }} ] }} }}\n",
        hard * 2
    );
    std::fs::write(&config, yaml).unwrap();
    let mut child = Command::new("prlimit")
        .arg(format!("--nofile=1024:{hard}"))
        .arg(portico_bin())
        .args(["run", "-c"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("prlimit (util-linux)");
    wait_until("portico listens", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let soft =
        limits.lines().find(|l| l.starts_with("Max open files")).and_then(|l| l.split_whitespace().nth(3)).unwrap();
    assert_eq!(soft, hard.to_string(), "{limits}");
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the open-file limit is") && err.contains("LimitNOFILE="), "{err}");
}

#[test]
fn check_lists_what_a_reload_would_change() {
    let b = portico_testkit::Backend::start("b0").unwrap();
    let yaml = format!(
        "admin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\nroutes:\n  - {{ name: api, match: {{ path_prefix: /api/ }}, cluster: api }}\n  - {{ name: rest, cluster: app }}\nclusters:\n  app: {{ endpoints: [ {{ address: \"{0}\" }}, {{ address: \"127.0.0.1:9\" }} ] }}\n  api: {{ endpoints: [ {{ address: \"{0}\" }} ] }}\n",
        b.addr
    );
    let p = Portico::start(&yaml);
    let running = std::fs::read_to_string(&p.config).unwrap();
    let next = running
        .replace("127.0.0.1:9\" }", "127.0.0.1:10\" }")
        .replace("  api: {", "  web: { endpoints: [ { address: \"127.0.0.1:11\" } ] }\n  api: { balancer: random,")
        .replace("  - { name: rest, cluster: app }", "  - { name: rest, cluster: web }");
    let path = p.config.with_file_name("next.yaml");
    std::fs::write(&path, &next).unwrap();
    // Against the running Portico (the admin address in the file).
    let out = Command::new(portico_bin()).args(["check", "-c"]).arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "compared with http://",
        "+ cluster web",
        "~ route rest: settings changed",
        "~ cluster api: settings changed",
        "+ endpoint 127.0.0.1:10 in cluster app",
        "- endpoint 127.0.0.1:9 in cluster app",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert!(!text.contains("route api"), "{text}");
    // Against a file.
    let out =
        Command::new(portico_bin()).args(["check", "-c"]).arg(&p.config).arg("--against").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("- cluster web") && text.contains("+ endpoint 127.0.0.1:9 in cluster app"), "{text}");
    // Nothing to compare with: just valid.
    drop(p);
    let out = Command::new(portico_bin()).args(["check", "-c"]).arg(&path).output().unwrap();
    assert!(out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("compared"));
}

#[test]
fn check_against_something_unavailable_still_validates_the_file() {
    let path = temp_dir().join("valid.yaml");
    std::fs::write(&path, "listeners:\n  - { name: web, address: 127.0.0.1:8080 }\nroutes:\n  - { cluster: app }\nclusters:\n  app:\n    endpoints: [ { address: 127.0.0.1:9001 } ]\n").unwrap();
    let nothing_listens = format!("http://127.0.0.1:{}", free_port());
    for against in [nothing_listens.as_str(), "/nonexistent/portico.yaml"] {
        let out =
            Command::new(portico_bin()).args(["check", "-c"]).arg(&path).args(["--against", against]).output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && stdout.contains("valid"), "against {against}: the valid file failed: {stderr}");
        assert!(stderr.contains("warning: cannot compare") && stderr.contains(against), "against {against}: {stderr}");
        // The hint names the option that holds the wrong value.
        assert!(stderr.contains("--against") && !stderr.contains("-c/--config"), "against {against}: {stderr}");
    }
}

/// `portico run -c config` with `NOTIFY_SOCKET` set, as systemd starts a `Type=notify` service.
fn run_under_notify_socket(config: &std::path::Path, socket: &std::path::Path) -> std::process::Child {
    Command::new(portico_bin())
        .args(["run", "-c"])
        .arg(config)
        .env("NOTIFY_SOCKET", socket)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start portico")
}

#[test]
fn systemd_is_told_ready_reloading_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = temp_dir();
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let port = free_port();
    let config = dir.join("portico.yaml");
    std::fs::write(
        &config,
        format!("listeners: [ {{ name: web, address: \"127.0.0.1:{port}\" }} ]\nroutes: [ {{ cluster: app }} ]\nclusters: {{ app: {{ endpoints: [ {{ address: \"127.0.0.1:9\" }} ] }} }}\n"),
    )
    .unwrap();
    let mut child = run_under_notify_socket(&config, &socket_path);
    let next = || {
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let ready = next();
    assert!(ready.contains("READY=1") && ready.contains(&format!("STATUS=serving on 127.0.0.1:{port}")), "{ready}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(), "READY came before the listener");
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let reloading = next();
    assert!(reloading.contains("RELOADING=1") && reloading.contains("MONOTONIC_USEC="), "{reloading}");
    assert!(next().contains("READY=1"));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(next().contains("STOPPING=1"));
    let _ = child.wait();
}

/// A configuration in `dir` with a listener and an admin API on free ports (returned) and a 2 s grace.
fn config_with_admin(dir: &std::path::Path, backend: std::net::SocketAddr) -> (std::path::PathBuf, u16, u16) {
    let (port, admin) = (free_port(), free_port());
    let config = dir.join("portico.yaml");
    std::fs::write(
        &config,
        format!("shutdown: {{ grace: 2s }}\nadmin: {{ address: \"127.0.0.1:{admin}\" }}\nlisteners: [ {{ name: web, address: \"127.0.0.1:{port}\" }} ]\nroutes: [ {{ cluster: app }} ]\nclusters: {{ app: {{ endpoints: [ {{ address: \"{backend}\" }} ] }} }}\n"),
    )
    .unwrap();
    (config, port, admin)
}

#[test]
fn under_systemd_an_upgrade_makes_the_new_process_the_main_one() {
    use std::os::unix::net::UnixDatagram;
    let b = Backend::start("b0").unwrap();
    let dir = temp_dir();
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let (config, port, admin) = config_with_admin(&dir, b.addr);
    let mut old = run_under_notify_socket(&config, &socket_path);
    let _cleanup = KillOnDrop(config.clone());
    let next = || {
        let mut buf = [0u8; 512];
        socket.recv(&mut buf).map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    assert!(next().expect("READY").contains("READY=1"));
    unsafe { libc::kill(old.id() as i32, libc::SIGUSR2) };
    // The old (main) process names the new one; the new one's READY went to the old one, not to systemd.
    let main_pid = next().expect("MAINPID");
    let new_pid: i32 = main_pid
        .lines()
        .find_map(|l| l.strip_prefix("MAINPID="))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("expected MAINPID=, got {main_pid:?}"));
    assert_ne!(new_pid, old.id() as i32);
    let admin_addr: std::net::SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    wait_until("the new process answers on the admin API", Duration::from_secs(10), || {
        let r = Conn::open(admin_addr).get("/admin/process", "");
        r.status == 200 && r.text().contains(&format!("\"pid\": {new_pid}"))
    });
    assert!(old.wait().unwrap().success(), "the old process drains and exits 0");
    // Nothing from the old process says the service stops.
    socket.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    assert!(next().is_err(), "the old process must not tell systemd it stops");
    socket.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    // The new process talks to systemd's socket from now on.
    unsafe { libc::kill(new_pid, libc::SIGHUP) };
    assert!(next().expect("RELOADING").contains("RELOADING=1"));
    assert!(next().expect("READY").contains("READY=1"));
    assert_eq!(Conn::open(format!("127.0.0.1:{port}").parse().unwrap()).get("/", "").status, 200);
    unsafe { libc::kill(new_pid, libc::SIGTERM) };
    assert!(next().expect("STOPPING").contains("STOPPING=1"));
}

#[test]
fn listeners_take_sockets_passed_by_systemd() {
    if !have_tool("systemd-socket-activate", "listeners_take_sockets_passed_by_systemd") {
        return;
    }
    // systemd-socket-activate binds the port, then starts Portico on the first connection with the socket in
    // LISTEN_FDS, as systemd does with a .socket unit.
    let b = Backend::start("b0").unwrap();
    let dir = temp_dir();
    let port = free_port();
    let config = dir.join("portico.yaml");
    std::fs::write(
        &config,
        format!("workers: 2\nlisteners: [ {{ name: web, address: \"127.0.0.1:{port}\" }} ]\nroutes: [ {{ cluster: app }} ]\nclusters: {{ app: {{ endpoints: [ {{ address: \"{}\" }} ] }} }}\n", b.addr),
    )
    .unwrap();
    let mut activator = Command::new("systemd-socket-activate")
        .arg(format!("--listen=127.0.0.1:{port}"))
        .arg(portico_bin())
        .args(["run", "-c"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("systemd-socket-activate (systemd)");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until("the socket is bound", Duration::from_secs(5), || std::net::TcpStream::connect(addr).is_ok());
    // The first connection started Portico; it and the next ones are served on the passed socket.
    for _ in 0..20 {
        let r = Conn::open(addr).get("/", "");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    unsafe { libc::kill(activator.id() as i32, libc::SIGTERM) };
    let _ = activator.wait();
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

#[test]
fn started_as_root_it_goes_on_as_the_configured_user() {
    if !running_as_root() {
        eprintln!("not root: nothing to drop (CI runs as root)");
        return;
    }
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&format!(
        "user: nobody\nadmin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\nroutes: [ {{ cluster: app }} ]\nclusters: {{ app: {{ endpoints: [ {{ address: \"{}\" }} ] }} }}\n",
        b.addr
    ));
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(uid.split_whitespace().skip(1).all(|u| u == "65534"), "{uid}");
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
    assert_eq!(p.admin_get("/ready").status, 200);
}

#[test]
fn a_port_below_1024_needs_only_cap_net_bind_service() {
    if !running_as_root() {
        eprintln!("not root: cannot hand out capabilities (CI runs as root)");
        return;
    }
    let b = Backend::start("b0").unwrap();
    let port =
        (600..1000).find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok()).expect("a free port below 1024");
    let dir = temp_dir();
    let config = dir.join("portico.yaml");
    std::fs::write(
        &config,
        format!("listeners: [ {{ name: web, address: \"127.0.0.1:{port}\" }} ]\nroutes: [ {{ cluster: app }} ]\nclusters: {{ app: {{ endpoints: [ {{ address: \"{}\" }} ] }} }}\n", b.addr),
    )
    .unwrap();
    // As nobody, with every capability gone but CAP_NET_BIND_SERVICE (what the systemd unit grants).
    let as_nobody = |caps: &[&str]| {
        let mut command = Command::new("setpriv");
        command.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).args(caps).arg(portico_bin());
        command.args(["run", "-c"]).arg(&config);
        command
    };
    let mut child = as_nobody(&[
        "--bounding-set=-all,+net_bind_service",
        "--inh-caps=-all,+net_bind_service",
        "--ambient-caps=-all,+net_bind_service",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .expect("setpriv (util-linux)");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until("Portico listens below 1024", Duration::from_secs(10), || std::net::TcpStream::connect(addr).is_ok());
    assert_eq!(Conn::open(addr).get("/", "").status, 200);
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    // setpriv execs Portico in place: the same pid, running as nobody with the one capability.
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or("");
    assert!(uid.split_whitespace().skip(1).all(|u| u == "65534"), "{uid}");
    let effective = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap_or("").trim();
    assert_eq!(u64::from_str_radix(effective, 16).ok(), Some(1 << 10), "only CAP_NET_BIND_SERVICE: {effective}");
    // Without it, the error says what to do.
    let out = as_nobody(&["--bounding-set=-all"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("CAP_NET_BIND_SERVICE"), "{stderr}");
}

#[test]
fn sigusr2_hands_the_sockets_to_a_new_process_without_failing_a_request() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&format!(
        "workers: 2\nshutdown: {{ grace: 10s }}\nadmin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\nroutes: [ {{ cluster: app }} ]\nclusters: {{ app: {{ endpoints: [ {{ address: \"{}\" }} ] }} }}\n",
        b.addr
    ));
    let _cleanup = KillOnDrop(p.config.clone());
    let load = Load::reconnecting(p.addr, 8);
    // A long download in flight across the upgrade.
    let download = {
        let addr = p.addr;
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /bytes/30000000 HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
            let (mut total, mut buf) = (0usize, vec![0u8; 65536]);
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n,
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            total
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let mut p = p;
    p.signal(libc::SIGUSR2);
    let status = p.wait_exit(Duration::from_secs(20)).expect("the old process exits after the hand-over");
    assert!(status.success(), "{status:?}");
    // The new process serves on the same port and admin address.
    for _ in 0..20 {
        assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
    }
    assert_eq!(p.admin_get("/ready").status, 200);
    let (ok, failed) = load.finish();
    assert!(ok > 100 && failed.is_empty(), "{ok} requests served, failures: {failed:?}");
    assert!(download.join().unwrap() > 30_000_000, "the download across the upgrade was cut short");
    // Stop the new process (a child the test did not start directly).
    kill_processes_with_arg(&p.config.display().to_string());
}

#[test]
fn a_process_started_by_an_upgrade_can_be_upgraded_again() {
    let b = Backend::start("b0").unwrap();
    let dir = temp_dir();
    let (config, port, admin) = config_with_admin(&dir, b.addr);
    let log = dir.join("stderr.log");
    let _cleanup = KillOnDrop(config.clone());
    let mut first = Command::new(portico_bin())
        .args(["run", "-c"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let admin: std::net::SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    let pid = || -> Option<i64> {
        let r = std::panic::catch_unwind(|| Conn::open(admin).get("/admin/process", "")).ok()?;
        serde_json::from_slice::<serde_json::Value>(&r.body).ok()?["pid"].as_i64()
    };
    wait_until("the first process answers", Duration::from_secs(10), || pid() == Some(first.id() as i64));
    unsafe { libc::kill(first.id() as i32, libc::SIGUSR2) };
    wait_until("the second process answers", Duration::from_secs(10), || pid().is_some_and(|p| p != first.id() as i64));
    assert!(first.wait().unwrap().success());
    let second = pid().unwrap() as i32;
    // The second holds the sockets it inherited; handing them on must not close them twice.
    unsafe { libc::kill(second, libc::SIGUSR2) };
    wait_until("the third process answers", Duration::from_secs(10), || pid().is_some_and(|p| p != second as i64));
    wait_until("the second process exits", Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{second}/stat")).map_or(true, |s| s.contains(") Z"))
    });
    let third = pid().unwrap() as i32;
    assert_eq!(Conn::open(format!("127.0.0.1:{port}").parse().unwrap()).get("/", "").status, 200);
    unsafe { libc::kill(third, libc::SIGTERM) };
    let errors = std::fs::read_to_string(&log).unwrap();
    assert!(!errors.contains("fatal") && !errors.contains("panicked"), "{errors}");
}

#[test]
fn portico_upgrade_asks_the_running_process_and_waits_for_the_new_one() {
    let b = Backend::start("b0").unwrap();
    let mut p = Portico::start(&format!(
        "admin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\nroutes: [ {{ cluster: app }} ]\nclusters: {{ app: {{ endpoints: [ {{ address: \"{}\" }} ] }} }}\n",
        b.addr
    ));
    let old = p.pid();
    let _cleanup = KillOnDrop(p.config.clone());
    let out = Command::new(portico_bin()).args(["upgrade", "-c"]).arg(&p.config).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with(&format!("upgraded: pid {old} -> ")), "{text}");
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()), "the old process drained and exited");
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200, "the new process serves");
    // "upgraded: pid OLD -> NEW (version ...)"
    let new: i32 = text.split_whitespace().nth(4).and_then(|pid| pid.parse().ok()).expect("new pid");
    unsafe { libc::kill(new, libc::SIGKILL) };
    // Without an admin address there is nothing to ask: a clear error.
    let bare = p.config.with_file_name("bare.yaml");
    std::fs::write(&bare, "listeners: [ { name: web, address: \"127.0.0.1:1\" } ]\nroutes: [ { cluster: app } ]\nclusters: { app: { endpoints: [ { address: \"127.0.0.1:9\" } ] } }\n").unwrap();
    let out = Command::new(portico_bin()).args(["upgrade", "-c"]).arg(&bare).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("SIGUSR2"));
}

#[test]
fn reloads_add_move_and_remove_listeners_and_connections_on_the_others_stay() {
    let b = Backend::start("b0").unwrap();
    let base = |extra: &str| {
        format!(
            "workers: 2\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\n{extra}routes: [ {{ cluster: app }} ]\nclusters:\n  app:\n    endpoints: [ {{ address: \"{}\" }} ]\n",
            b.addr
        )
    };
    let p = Portico::start(&base(""));
    let mut kept = Conn::open(p.addr);
    assert_eq!(kept.get("/", "").status, 200);
    let reloaded =
        |n: f64| wait_until("the reload", Duration::from_secs(10), || p.metric("portico_reloads_total") == n);
    let answers = |port: u16| {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            && Conn::open(format!("127.0.0.1:{port}").parse().unwrap()).get("/", "").status == 200
    };
    let refused = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_err();

    // Added.
    let (first, second) = (free_port(), free_port());
    p.rewrite_config(&base(&format!("  - name: extra\n    address: \"127.0.0.1:{first}\"\n")));
    p.signal(libc::SIGHUP);
    reloaded(1.0);
    assert!((0..20).all(|_| answers(first)), "every worker accepts on the added listener");
    // Moved.
    p.rewrite_config(&base(&format!("  - name: extra\n    address: \"127.0.0.1:{second}\"\n")));
    p.signal(libc::SIGHUP);
    reloaded(2.0);
    assert!((0..20).all(|_| answers(second)));
    wait_until("the old address is closed", Duration::from_secs(5), || refused(first));
    // An address that cannot be had fails the reload; the running listeners stay.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    p.rewrite_config(&base(&format!(
        "  - name: extra\n    address: \"127.0.0.1:{second}\"\n  - name: clash\n    address: \"127.0.0.1:{taken_port}\"\n"
    )));
    p.signal(libc::SIGHUP);
    wait_until("the failure", Duration::from_secs(10), || p.metric("portico_reload_failures_total") == 1.0);
    assert!(answers(second), "the running configuration still serves");
    // Removed.
    p.rewrite_config(&base(""));
    p.signal(libc::SIGHUP);
    reloaded(3.0);
    wait_until("the removed listener is closed", Duration::from_secs(5), || refused(second));
    // The connection on the listener that stayed never noticed.
    for _ in 0..5 {
        assert_eq!(kept.get("/", "").status, 200);
    }
    assert!(answers(p.addr.port()));
}
