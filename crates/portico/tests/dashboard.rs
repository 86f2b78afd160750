//! The dashboard on the admin address, end to end in a real browser: headless Chromium (Debian's `chromium`)
//! driven by playwright-core (npm), both installed by `.ci/install-test-deps`. Portico runs with two backends,
//! a health check and an admin token, under a load generator; the browser script (tests/dashboard/e2e.mjs)
//! checks the page and asks this test to kill a backend and to change the configuration. Screenshots are
//! written under the target directory (`CARGO_TARGET_TMPDIR/dashboard/`).

mod common;

use common::*;
use portico_testkit::Backend;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "dashboard-test-token-5d1c";

/// `side` is a second listener, which the load does not reach: its chart stays flat until the script sends to it.
fn config(a: std::net::SocketAddr, b: std::net::SocketAddr, side: u16, extra_route: bool) -> String {
    let extra =
        if extra_route { "  - name: extra\n    match: { path_prefix: /extra }\n    cluster: app\n" } else { "" };
    format!(
        "workers: 2\n\
         admin: {{ address: \"{{admin}}\", token: \"{TOKEN}\" }}\n\
         listeners:\n  - name: web\n    address: \"{{listen}}\"\n  - name: side\n    address: \"127.0.0.1:{side}\"\n\
         routes:\n\
         \x20 - name: solo\n    match: {{ path_prefix: /solo }}\n    cluster: solo\n\
         {extra}\
         \x20 - name: app\n    match: {{ path_prefix: / }}\n    cluster: app\n\
         clusters:\n\
         \x20 app:\n\
         \x20   health_check: {{ path: /health, interval: 500ms, timeout: 400ms, healthy_after: 1, unhealthy_after: 1 }}\n\
         \x20   endpoints: [ {{ address: \"{a}\" }}, {{ address: \"{b}\" }} ]\n\
         \x20 solo:\n\
         \x20   endpoints: [ {{ address: \"{b}\" }} ]\n"
    )
}

/// playwright-core where `.ci/install-test-deps` puts it.
fn tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-tools")
}

#[test]
fn dashboard_in_a_real_browser() {
    let test = "dashboard_in_a_real_browser";
    let chromium = Path::new("/usr/bin/chromium");
    if !chromium.exists() {
        return skip_outside_ci(test, "Debian's `chromium` is not installed (`bash .ci/test` installs it)");
    }
    if !tool_exists("node") || !tools().join("node_modules/playwright-core/package.json").exists() {
        return skip_outside_ci(test, "node or playwright-core is not installed (`bash .ci/test` installs them)");
    }
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    let _ = std::fs::remove_dir_all(&artifacts);
    std::fs::create_dir_all(&artifacts).expect("artifacts directory");

    let a = Backend::start("a").expect("backend a");
    let b = Backend::start("b").expect("backend b");
    let (a_addr, b_addr) = (a.addr, b.addr);
    let side = free_port();
    let portico = Portico::start(&config(a_addr, b_addr, side, false));
    let load = Load::start(portico.addr, 2);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/e2e.mjs");
    let mut node = Command::new("node")
        .arg(&script)
        .env("ADMIN", format!("http://{}", portico.admin))
        .env("PROXY", format!("http://{}", portico.addr))
        .env("SIDE", format!("http://127.0.0.1:{side}"))
        .env("TOKEN", TOKEN)
        .env("KILLED", b_addr.to_string())
        .env("TOOLS", tools())
        .env("ARTIFACTS", &artifacts)
        .env("CHROMIUM", chromium)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start node");
    let mut to_node = node.stdin.take().expect("node's stdin");
    let from_node = BufReader::new(node.stdout.take().expect("node's stdout"));
    // The script's steps, done here; the whole run is bounded.
    let deadline = Instant::now() + Duration::from_secs(180);
    let watchdog_pid = node.id() as i32;
    let watchdog = std::thread::spawn(move || {
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            // SAFETY: signal 0 only checks that the process is there.
            if unsafe { libc::kill(watchdog_pid, 0) } != 0 {
                return false;
            }
        }
        // SAFETY: the node process this test started.
        unsafe { libc::kill(watchdog_pid, libc::SIGKILL) };
        true
    });
    let mut b = Some(b);
    let mut passed = false;
    for line in from_node.lines() {
        let Ok(line) = line else { break };
        match line.as_str() {
            "STEP kill" => drop(b.take()),
            "STEP add-route" => portico.rewrite_config(&config(a_addr, b_addr, side, true)),
            "STEP break-config" => portico
                .rewrite_config(&config(a_addr, b_addr, side, true).replace("cluster: app\n", "cluster: nowhere\n")),
            "PASS" => {
                passed = true;
                continue;
            }
            other => {
                eprintln!("node: {other}");
                continue;
            }
        }
        writeln!(to_node, "done").expect("answer the script");
    }
    let status = node.wait().expect("node ends");
    let timed_out = watchdog.join().unwrap_or(false);
    let (ok, failed) = load.finish();
    assert!(!timed_out, "the browser script did not finish within 180 s");
    assert!(status.success() && passed, "the browser script failed ({status}); see its output above");
    assert!(ok > 0, "the load generator got answers");
    // The killed backend's tries failed over to the other endpoint, or were answered 502/503 to the load.
    eprintln!("load: {ok} answered, {} not: {:?}", failed.len(), failed.iter().take(3).collect::<Vec<_>>());
    for name in [
        "01-overview",
        "02-charts-under-load",
        "02-listener-charts",
        "03-backend-down",
        "07-reload-history",
        "09-narrow",
    ] {
        let png = artifacts.join(format!("{name}.png"));
        let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
        assert!(size > 5_000, "{} was not written", png.display());
    }
    drop(a);
}
