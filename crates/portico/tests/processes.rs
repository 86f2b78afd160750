//! `process_model: multi_process`: a master with worker processes, checked through real processes and sockets.

mod common;

use common::*;
use portico_testkit::Backend;
use std::time::Duration;

fn children(pid: i32) -> Vec<i32> {
    let mut pids = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        pids.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    pids.sort();
    pids
}

fn alive(pid: i32) -> bool {
    // A zombie has exited: only its parent's wait is missing.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
}

fn config(endpoint: std::net::SocketAddr) -> String {
    format!(
        "workers: 2\nprocess_model: multi_process\nshutdown: {{ grace: 5s }}\nadmin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\nroutes: [ {{ name: all, cluster: app }} ]\nclusters: {{ app: {{ endpoints: [ {{ address: \"{endpoint}\" }} ] }} }}\n"
    )
}

#[test]
fn worker_processes_serve_and_the_master_sums_their_metrics() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&config(b.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    wait_until("worker processes named portico-w0 and portico-w1", Duration::from_secs(5), || {
        let mut names: Vec<String> = children(p.pid())
            .iter()
            .map(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default())
            .collect();
        names.sort();
        names == ["portico-w0\n", "portico-w1\n"]
    });
    // New connections: the kernel spreads them over both processes' sockets.
    for _ in 0..40 {
        assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
    }
    let sample = "portico_requests_total{route=\"all\",cluster=\"app\",status_class=\"2xx\"}";
    assert_eq!(p.metric(sample), 40.0, "the master's /metrics adds up both worker processes");
    let text = p.admin_get("/metrics").text();
    assert_eq!(text.matches("# TYPE portico_requests_total ").count(), 1, "{text}");
    let healthy = format!("portico_endpoint_healthy{{cluster=\"app\",endpoint=\"{}\"}}", b.addr);
    assert_eq!(p.metric(&healthy), 1.0, "{text}");
    assert_eq!(p.clusters()["clusters"][0]["name"], "app", "/admin/clusters comes from a worker process");
}

#[test]
fn a_killed_worker_process_is_replaced_and_no_connection_is_refused() {
    let (b, b1) = (Backend::start("b0").unwrap(), Backend::start("b1").unwrap());
    let p = Portico::start(&config(b.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    let before = children(p.pid());
    for _ in 0..40 {
        assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
    }
    let sample = "portico_requests_total{route=\"all\",cluster=\"app\",status_class=\"2xx\"}";
    assert_eq!(p.metric(sample), 40.0);
    // The file is edited but not reloaded: the replacement must run the configuration the others run.
    p.rewrite_config(&config(b1.addr));
    // A worker process dies the hardest way; the other serves, and connections queued on the dead one's socket
    // wait for its replacement (the master keeps the socket).
    unsafe { libc::kill(before[0], libc::SIGKILL) };
    for _ in 0..40 {
        let r = Conn::open(p.addr).get("/", "");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    wait_until("a replacement worker process", Duration::from_secs(5), || {
        let now = children(p.pid());
        now.len() == 2 && !now.contains(&before[0])
    });
    assert_eq!(p.metric("portico_worker_restarts_total"), 1.0);
    for _ in 0..20 {
        assert_eq!(backend_of(&mut Conn::open(p.addr), "/", ""), "b0", "a worker process runs an unapplied file");
    }
    assert!(before.iter().skip(1).all(|&pid| alive(pid)), "the other worker process was not touched");
    // The dead process's requests still count: counters never go down.
    assert_eq!(p.metric(sample), 100.0, "{}", p.admin_get("/metrics").text());
    // Signals passed on to a worker process while it starts wait for its handlers (SIGUSR1 would kill it).
    let current = children(p.pid());
    unsafe { libc::kill(current[0], libc::SIGKILL) };
    // From the death until well after the replacement started (it is due 400 ms after the death).
    let until = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < until {
        p.signal(libc::SIGUSR1);
        std::thread::sleep(Duration::from_millis(1));
    }
    wait_until("another replacement", Duration::from_secs(5), || {
        let now = children(p.pid());
        now.len() == 2 && !now.contains(&current[0])
    });
    assert_eq!(p.metric("portico_worker_restarts_total"), 2.0, "a worker process died of a signal");
}

#[test]
fn reloads_reach_every_worker_process_and_sigterm_stops_them_all() {
    let (b0, b1) = (Backend::start("b0").unwrap(), Backend::start("b1").unwrap());
    let mut p = Portico::start(&config(b0.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    let workers = children(p.pid());
    p.rewrite_config(&config(b1.addr));
    // Sent to a worker process (as `kill -HUP $(pidof -s portico)` may), it goes to the master.
    unsafe { libc::kill(workers[1], libc::SIGHUP) };
    // Twenty new connections land on both processes: every one must have reloaded.
    wait_until("every worker process routes to b1", Duration::from_secs(5), || {
        (0..20).all(|_| backend_of(&mut Conn::open(p.addr), "/", "") == "b1")
    });
    assert_eq!(p.metric("portico_reloads_total"), 1.0, "counted once, by the master");
    // An invalid file is refused by the master and never reaches the workers.
    p.rewrite_config("listeners: [ { name: web, address: \"{listen}\" } ]\nroutes: [ { cluster: nowhere } ]\n");
    let mut admin = Conn::open(p.admin);
    admin.send(b"POST /admin/reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    let r = admin.read_response(false);
    assert_eq!(r.status, 422, "{}", r.text());
    assert!((0..10).all(|_| backend_of(&mut Conn::open(p.addr), "/", "") == "b1"));
    p.signal(libc::SIGTERM);
    let status = p.wait_exit(Duration::from_secs(10)).expect("the master exits");
    assert!(status.success(), "{status:?}");
    assert!(workers.iter().all(|&pid| !alive(pid)), "worker processes outlived the master");
}

#[test]
fn worker_processes_go_when_the_master_is_killed() {
    let b = Backend::start("b0").unwrap();
    let mut p = Portico::start(&config(b.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    let workers = children(p.pid());
    p.signal(libc::SIGKILL);
    let _ = p.wait_exit(Duration::from_secs(5));
    wait_until("the worker processes exit", Duration::from_secs(10), || workers.iter().all(|&pid| !alive(pid)));
}

#[test]
fn worker_processes_share_the_access_log_and_reopen_it_on_sigusr1() {
    let b = Backend::start("b0").unwrap();
    let dir = temp_dir();
    let log = dir.join("access.log");
    let yaml = config(b.addr)
        .replace("listeners:", &format!("access_log: {{ path: \"{}\", format: json }}\nlisteners:", log.display()));
    let p = Portico::start_in(&dir, &yaml);
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    // Two connections at a time, so both processes write at once.
    let send = |n: usize| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let addr = p.addr;
                std::thread::spawn(move || {
                    for _ in 0..n {
                        assert_eq!(Conn::open(addr).get("/", "").status, 200);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
    };
    let lines = |path: &std::path::Path| {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        }
        text.lines().count()
    };
    send(150);
    wait_until("300 whole lines in the access log", Duration::from_secs(5), || lines(&log) == 300);
    let rotated = dir.join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    p.signal(libc::SIGUSR1);
    // Each worker process reopens when it handles the signal; then nothing more goes to the rotated file.
    std::thread::sleep(Duration::from_millis(500));
    let (old, new) = (lines(&rotated), lines(&log));
    assert!(old >= 300, "the rotated file keeps what it had: {old}");
    send(50);
    wait_until("100 more lines in the reopened log", Duration::from_secs(5), || lines(&log) == new + 100);
    assert_eq!(lines(&rotated), old, "a worker process still writes to the rotated file");
}

#[test]
fn an_upgrade_replaces_the_master_and_its_workers_without_failing_a_request() {
    let b = Backend::start("b0").unwrap();
    let mut p = Portico::start(&config(b.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    let old_workers = children(p.pid());
    let _cleanup = KillOnDrop(p.config.clone());
    let load = Load::reconnecting(p.addr, 8);
    std::thread::sleep(Duration::from_millis(300));
    let old = p.pid();
    // Sent to a worker process, it goes to the master.
    unsafe { libc::kill(old_workers[0], libc::SIGUSR2) };
    let status = p.wait_exit(Duration::from_secs(20)).expect("the old master exits after the hand-over");
    assert!(status.success(), "{status:?}");
    assert!(old_workers.iter().all(|&pid| !alive(pid)), "the old worker processes drained and exited");
    std::thread::sleep(Duration::from_millis(300));
    let (ok, failed) = load.finish();
    assert!(ok > 100 && failed.is_empty(), "{ok} requests served, failures: {failed:?}");
    // The new master runs two new worker processes and answers on the same admin address.
    let process: serde_json::Value = serde_json::from_slice(&p.admin_get("/admin/process").body).unwrap();
    let new = process["pid"].as_i64().expect("pid") as i32;
    assert_ne!(new, old);
    wait_until("the new master's two worker processes", Duration::from_secs(5), || children(new).len() == 2);
    assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
    unsafe { libc::kill(new, libc::SIGTERM) };
    wait_until("the new master exits", Duration::from_secs(10), || !alive(new));
}

#[test]
fn a_worker_process_that_cannot_start_fails_the_start_and_an_upgrade_keeps_the_old_master() {
    let b = Backend::start("b0").unwrap();
    // The master does not open the access log; its worker processes do, and cannot here.
    let unwritable =
        config(b.addr).replace("listeners:", "access_log: { path: \"/proc/portico/access.log\" }\nlisteners:");
    let dir = temp_dir();
    let path = dir.join("bad.yaml");
    let port = free_port();
    std::fs::write(
        &path,
        unwritable
            .replace("{listen}", &format!("127.0.0.1:{port}"))
            .replace("{admin}", &format!("127.0.0.1:{}", free_port())),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = std::process::Command::new(portico_bin()).args(["run", "-c"]).arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("worker process 0 exited before it served"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // An upgrade whose new worker processes cannot start leaves the old master serving.
    let p = Portico::start(&config(b.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    p.rewrite_config(&unwritable);
    p.signal(libc::SIGUSR2);
    std::thread::sleep(Duration::from_secs(2));
    let process: serde_json::Value = serde_json::from_slice(&p.admin_get("/admin/process").body).unwrap();
    assert_eq!(process["pid"].as_i64(), Some(p.pid() as i64), "the old master must keep serving");
    assert!(alive(p.pid()));
    for _ in 0..20 {
        assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
    }
}

#[test]
fn scrapes_during_start_up_do_not_hold_it_up() {
    let b = Backend::start("b0").unwrap();
    let (port, admin) = (free_port(), free_port());
    let dir = temp_dir();
    let path = dir.join("portico.yaml");
    let yaml = config(b.addr)
        .replace("{listen}", &format!("127.0.0.1:{port}"))
        .replace("{admin}", &format!("127.0.0.1:{admin}"));
    std::fs::write(&path, yaml.replace("workers: 2", "workers: 4")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", admin)) {
                    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
                    let _ = s.read_to_end(&mut Vec::new());
                }
            }
        })
    };
    let _cleanup = KillOnDrop(path.clone());
    let mut child = std::process::Command::new(portico_bin())
        .args(["run", "-c"])
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // A worker's "serving" message taken for a stale answer by a scrape held start-up for 30 s, then failed it.
    let admin_addr: std::net::SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    wait_until("ready while scraped", Duration::from_secs(10), || answers_ready(admin_addr));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    scraper.join().unwrap();
    assert_eq!(Conn::open(addr).get("/", "").status, 200);
    let _ = child.kill();
    let _ = child.wait();
}

/// `config` with more listeners after `web` (each `, { name: N, address: "A" }`).
fn config_with(endpoint: std::net::SocketAddr, listeners: &str) -> String {
    config(endpoint).replace("address: \"{listen}\" }", &format!("address: \"{{listen}}\" }}{listeners}"))
}

/// A listener entry for `config_with`.
fn listener(name: &str, port: u16) -> String {
    format!(", {{ name: {name}, address: \"127.0.0.1:{port}\" }}")
}

fn at(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// The inodes of the sockets process `pid` holds.
fn socket_inodes(pid: i32) -> Vec<u64> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten();
    fds.filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        .collect()
}

/// The inodes of this host's TCP sockets in `state` (`0A` listening, `01` established) on local port `port`.
fn tcp_inodes(port: u16, state: &str) -> Vec<u64> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1).and_then(|a| a.rsplit_once(':')).map(|(_, p)| p);
            if local_port.and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port) && fields.get(3) == Some(&state) {
                inodes.extend(fields.get(9).and_then(|i| i.parse::<u64>().ok()));
            }
        }
    }
    inodes
}

/// How many connections to `port` process `pid` has accepted and holds open.
fn accepted_on(pid: i32, port: u16) -> usize {
    let established = tcp_inodes(port, "01");
    socket_inodes(pid).iter().filter(|i| established.contains(i)).count()
}

/// Whether process `pid` holds a socket listening on `port`.
fn listens_on(pid: i32, port: u16) -> bool {
    let listening = tcp_inodes(port, "0A");
    socket_inodes(pid).iter().any(|i| listening.contains(i))
}

/// Sixteen connections to `port`, each answered, held open: every worker process must have accepted some (the
/// kernel spreads them over the worker processes' sockets; one that did not accept would leave some waiting).
fn every_worker_process_serves(p: &Portico, port: u16) -> Vec<Conn> {
    let conns: Vec<Conn> = (0..16)
        .map(|_| {
            let mut c = Conn::open(at(port));
            let r = c.get("/", "");
            assert_eq!(r.status, 200, "{}", r.text());
            c
        })
        .collect();
    let workers = children(p.pid());
    assert_eq!(workers.len(), 2);
    for pid in workers {
        assert!(listens_on(pid, port), "worker process {pid} does not listen on {port}");
        assert!(accepted_on(pid, port) > 0, "worker process {pid} accepted none of 16 connections on {port}");
    }
    conns
}

fn reloaded(p: &Portico, n: f64) {
    wait_until("the reload", Duration::from_secs(10), || p.metric("portico_reloads_total") == n);
}

fn refused(port: u16) -> bool {
    std::net::TcpStream::connect(at(port)).is_err()
}

#[test]
fn a_reload_adds_a_listener_that_every_worker_process_serves() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&config(b.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    let workers = children(p.pid());
    let mut kept = Conn::open(p.addr);
    assert_eq!(kept.get("/", "").status, 200);
    let port = free_port();
    p.rewrite_config(&config_with(b.addr, &listener("extra", port)));
    p.signal(libc::SIGHUP);
    reloaded(&p, 1.0);
    let _held = every_worker_process_serves(&p, port);
    // The listener that stayed serves, new connections and the one opened before the reload.
    for _ in 0..10 {
        assert_eq!(Conn::open(p.addr).get("/", "").status, 200);
    }
    for _ in 0..3 {
        assert_eq!(kept.get("/", "").status, 200);
    }
    assert_eq!(children(p.pid()), workers, "no worker process was started again");
    assert_eq!(p.metric("portico_worker_restarts_total"), 0.0);
    let status: serde_json::Value = serde_json::from_slice(&p.admin_get("/admin/reload").body).unwrap();
    assert_eq!(status["ok"], true, "{status}");
}

#[test]
fn a_reload_moves_a_listener_and_connections_on_the_old_address_finish() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&config(b.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    let old = p.addr.port();
    let mut kept = Conn::open(p.addr);
    assert_eq!(kept.get("/", "").status, 200);
    let mut in_flight = Conn::open(p.addr);
    in_flight.send(b"GET /slow/1500 HTTP/1.1\r\nHost: a\r\n\r\n");
    std::thread::sleep(Duration::from_millis(100));
    let port = free_port();
    p.rewrite_config(&config(b.addr).replace("{listen}", &at(port).to_string()));
    p.signal(libc::SIGHUP);
    reloaded(&p, 1.0);
    let _held = every_worker_process_serves(&p, port);
    wait_until("the old address refuses new connections", Duration::from_secs(5), || refused(old));
    for pid in children(p.pid()) {
        assert!(!listens_on(pid, old), "worker process {pid} still listens on {old}");
    }
    // Connections accepted on the old address go on: the request in flight finishes, the idle one serves more.
    let r = in_flight.read_response(false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("slow hello"), "{}", r.text());
    for _ in 0..3 {
        assert_eq!(kept.get("/", "").status, 200);
    }
    assert_eq!(p.metric("portico_worker_restarts_total"), 0.0);
}

#[test]
fn a_reload_removes_a_listener() {
    let b = Backend::start("b0").unwrap();
    let port = free_port();
    let p = Portico::start(&config_with(b.addr, &listener("extra", port)));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    let _held = every_worker_process_serves(&p, port);
    let mut kept = Conn::open(p.addr);
    assert_eq!(kept.get("/", "").status, 200);
    p.rewrite_config(&config(b.addr));
    p.signal(libc::SIGHUP);
    reloaded(&p, 1.0);
    wait_until("the removed listener refuses connections", Duration::from_secs(5), || refused(port));
    for pid in children(p.pid()) {
        assert!(!listens_on(pid, port), "worker process {pid} still listens on {port}");
    }
    let _others = every_worker_process_serves(&p, p.addr.port());
    for _ in 0..3 {
        assert_eq!(kept.get("/", "").status, 200);
    }
    assert_eq!(p.metric("portico_worker_restarts_total"), 0.0);
}

#[test]
fn a_reload_whose_new_address_is_taken_fails_and_the_running_listeners_stay() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&config(b.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    let workers = children(p.pid());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    // One listener that could be had and one that cannot: neither is applied.
    let free = free_port();
    p.rewrite_config(&config_with(b.addr, &format!("{}{}", listener("extra", free), listener("clash", taken_port))));
    let mut admin = Conn::open(p.admin);
    admin.send(b"POST /admin/reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    let r = admin.read_response(false);
    assert_eq!(r.status, 422, "{}", r.text());
    let expected = format!("cannot listen on 127.0.0.1:{taken_port} (listener \\\"clash\\\")");
    assert!(r.text().contains(&expected), "{}", r.text());
    assert!(r.text().contains("another process listens there"), "{}", r.text());
    let status = p.admin_get("/admin/reload").text();
    assert!(status.contains(&expected), "{status}");
    assert_eq!(p.metric("portico_reload_failures_total"), 1.0);
    assert_eq!(p.metric("portico_reloads_total"), 0.0);
    assert!(refused(free), "a listener of the failed reload was applied");
    let _held = every_worker_process_serves(&p, p.addr.port());
    assert_eq!(children(p.pid()), workers);
    drop(taken);
}

#[test]
fn a_worker_process_killed_after_a_listener_change_is_replaced_on_the_new_listeners() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&config(b.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    let old = p.addr.port();
    // `web` moves, `extra` comes.
    let (moved, extra) = (free_port(), free_port());
    let yaml = config_with(b.addr, &listener("extra", extra)).replace("{listen}", &at(moved).to_string());
    p.rewrite_config(&yaml);
    p.signal(libc::SIGHUP);
    reloaded(&p, 1.0);
    wait_until("the old address refuses new connections", Duration::from_secs(5), || refused(old));
    let before = children(p.pid());
    unsafe { libc::kill(before[0], libc::SIGKILL) };
    wait_until("a replacement worker process", Duration::from_secs(5), || {
        let now = children(p.pid());
        now.len() == 2 && !now.contains(&before[0])
    });
    let replacement = *children(p.pid()).iter().find(|pid| !before.contains(pid)).unwrap();
    wait_until("the replacement listens on the current listeners", Duration::from_secs(5), || {
        listens_on(replacement, moved) && listens_on(replacement, extra)
    });
    assert!(!listens_on(replacement, old), "the replacement was given the socket of the listener's old address");
    let _moved = every_worker_process_serves(&p, moved);
    let _extra = every_worker_process_serves(&p, extra);
    assert!(refused(old));
    assert_eq!(p.metric("portico_worker_restarts_total"), 1.0);
}

#[test]
fn a_worker_process_starting_during_a_listener_change_gets_the_new_sockets_once_it_serves() {
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&config(b.addr));
    wait_until("two worker processes", Duration::from_secs(5), || children(p.pid()).len() == 2);
    // A replacement held before it serves: stopped after its exec (the master waits for that) and before it runs
    // Portico's code (which names it portico-w0), so it was started with the sockets of before the reload.
    let mut held = None;
    for _ in 0..20 {
        let before = children(p.pid());
        unsafe { libc::kill(before[0], libc::SIGKILL) };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let new = loop {
            if let Some(&pid) = children(p.pid()).iter().find(|pid| !before.contains(pid)) {
                break pid;
            }
            assert!(std::time::Instant::now() < deadline, "no replacement");
        };
        let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        while comm(new) == "portico\n" && std::time::Instant::now() < deadline {}
        if comm(new) == "exe\n" {
            unsafe { libc::kill(new, libc::SIGSTOP) };
            if comm(new) == "exe\n" {
                held = Some(new);
                break;
            }
            unsafe { libc::kill(new, libc::SIGCONT) };
        }
        wait_until("the replacement serves", Duration::from_secs(10), || comm(new).starts_with("portico-w"));
        std::thread::sleep(Duration::from_millis(200));
    }
    let held = held.expect("a replacement stopped before it started serving");
    let port = free_port();
    p.rewrite_config(&config_with(b.addr, &listener("extra", port)));
    p.signal(libc::SIGHUP);
    reloaded(&p, 1.0);
    assert!(!listens_on(held, port));
    unsafe { libc::kill(held, libc::SIGCONT) };
    wait_until("the replacement listens on the added listener", Duration::from_secs(10), || listens_on(held, port));
    let _held = every_worker_process_serves(&p, port);
    let _web = every_worker_process_serves(&p, p.addr.port());
}
