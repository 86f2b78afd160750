//! The Fetch Standard's `Headers`, `Request` and `Response` (and the `Blob` bodies are read as) in functions,
//! through the binary: a handler (tests/data/fetch_wpt.js) runs web-platform-tests' cases of fetch/api/headers,
//! fetch/api/request, fetch/api/response and FileAPI/blob, ported to it, and answers the cases that fail. Under Portico they must be exactly the
//! ones of tests/data/fetch_known_failures.txt, each group there with its reason. The same handler runs under
//! Deno (`deno serve`): every case that passes there passes here, but the groups the list marks
//! `[differs from Deno]`; and the groups marked `[as Deno]` fail there too.

mod common;
use common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(file)
}

/// Portico serving fetch_wpt.js (with room for the suite: the debug build's QuickJS is slow).
fn start_portico(dir: &Path) -> Portico {
    std::fs::copy(data("fetch_wpt.js"), dir.join("fetch_wpt.js")).unwrap();
    Portico::start_in(
        dir,
        "workers: 1\nlisteners: [ { name: web, address: \"{listen}\" } ]\nfunctions:\n\
         \x20 fetch_wpt: { source: fetch_wpt.js, limits: { cpu: 30s, memory: 256MiB } }\n\
         routes:\n  - { function: fetch_wpt }\n",
    )
}

/// A run of the suite: every case's name, in order, and each failed case's error.
struct Run {
    names: Vec<String>,
    failures: BTreeMap<String, String>,
}

fn run(addr: SocketAddr) -> Run {
    let mut conn = Conn::open(addr);
    conn.stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    conn.send(b"GET /wpt HTTP/1.1\r\nHost: test\r\n\r\n");
    let r = conn.read_response(false);
    assert_eq!(r.status, 200, "{addr}/wpt: {}", r.text());
    let answer: Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{addr}/wpt: {e}: {}", r.text().chars().take(2000).collect::<String>()));
    let names: Vec<String> =
        answer["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
    assert_eq!(answer["total"].as_u64(), Some(names.len() as u64));
    let failures = answer["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_string(), f["error"].as_str().unwrap().to_string()))
        .collect();
    Run { names, failures }
}

/// A group of the list: its reason (the comment lines above it), whether Deno passes its cases, and its cases.
struct Group {
    reason: String,
    differs_from_deno: bool,
    cases: Vec<String>,
}

/// The list's groups: a block of comment lines right above its cases gives a group's reason (a comment block
/// followed by a blank line, such as the file's heading, is no group's).
fn known_failures() -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let (mut reason, mut in_comment) = (String::new(), false);
    for line in std::fs::read_to_string(data("fetch_known_failures.txt")).unwrap().lines() {
        let line = line.trim_end();
        if let Some(comment) = line.strip_prefix('#') {
            if !in_comment {
                reason.clear();
                in_comment = true;
            }
            reason.push_str(comment.trim());
            reason.push(' ');
        } else if line.is_empty() {
            in_comment = false;
            reason.clear();
        } else {
            if in_comment {
                in_comment = false;
                let differs_from_deno = reason.contains("[differs from Deno]");
                assert!(
                    differs_from_deno || reason.contains("[as Deno]"),
                    "fetch_known_failures.txt: the reason of {line:?} says neither [as Deno] nor [differs from Deno]"
                );
                groups.push(Group { reason: reason.trim().to_string(), differs_from_deno, cases: Vec::new() });
            }
            groups
                .last_mut()
                .expect("fetch_known_failures.txt: a case without a reason above it")
                .cases
                .push(line.to_string());
        }
    }
    groups
}

#[test]
fn headers_requests_and_responses_pass_the_web_platform_tests_but_the_known_failures() {
    let p = start_portico(&temp_dir());
    let ours = run(p.addr);
    let groups = known_failures();
    let known: BTreeSet<&String> = groups.iter().flat_map(|g| &g.cases).collect();
    assert_eq!(known.len(), groups.iter().map(|g| g.cases.len()).sum::<usize>(), "a case listed twice");
    let total = ours.names.len();
    assert!(total > 600, "ran {total} cases");
    let unique: BTreeSet<&String> = ours.names.iter().collect();
    assert_eq!(unique.len(), total, "two cases of the same name");
    let unknown: Vec<&String> = known.iter().copied().filter(|name| !unique.contains(name)).collect();
    assert!(unknown.is_empty(), "fetch_known_failures.txt lists cases the suite does not have: {unknown:#?}");
    eprintln!(
        "{} of {total} cases pass; {} known failures ({} where Deno passes)",
        total - ours.failures.len(),
        known.len(),
        groups.iter().filter(|g| g.differs_from_deno).map(|g| g.cases.len()).sum::<usize>()
    );
    let new: Vec<String> =
        ours.failures.iter().filter(|(name, _)| !known.contains(name)).map(|(n, e)| format!("{n}: {e}")).collect();
    assert!(new.is_empty(), "{} cases fail that are not known failures:\n{}", new.len(), new.join("\n"));
    let fixed: Vec<&&String> = known.iter().filter(|name| !ours.failures.contains_key(**name)).collect();
    assert!(fixed.is_empty(), "known failures that now pass (remove them from fetch_known_failures.txt): {fixed:#?}");
    // A second run answers the same (each run makes its cases anew), and the worker serves on.
    assert_eq!(run(p.addr).failures.keys().collect::<Vec<_>>(), ours.failures.keys().collect::<Vec<_>>());
    assert_eq!(Conn::open(p.addr).get("/nothing", "").status, 404);
}

/// Deno from the PATH or where `.ci/install-test-deps` puts it.
fn deno() -> Option<PathBuf> {
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-tools/node_modules/.bin/deno");
    if local.exists() {
        return Some(local);
    }
    tool_exists("deno").then(|| "deno".into())
}

#[test]
fn every_case_that_passes_under_deno_passes_here_but_the_listed_differences() {
    let Some(deno) = deno() else {
        skip_outside_ci(
            "every_case_that_passes_under_deno_passes_here_but_the_listed_differences",
            "Deno is not installed (`bash .ci/test` installs it)",
        );
        return;
    };
    let dir = temp_dir();
    let p = start_portico(&dir);
    let port = free_port();
    let child = std::process::Command::new(deno)
        .args(["serve", "--quiet", "--no-prompt", "--port", &port.to_string()])
        .arg(dir.join("fetch_wpt.js"))
        .env("DENO_DIR", dir.join("deno-cache"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("deno");
    // Ended however the test ends.
    struct Ends(std::process::Child);
    impl Drop for Ends {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = Ends(child);
    let deno_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until("deno serves", Duration::from_secs(30), || std::net::TcpStream::connect(deno_addr).is_ok());
    let (ours, theirs) = (run(p.addr), run(deno_addr));
    drop(child);
    assert_eq!(ours.names, theirs.names, "the same cases run under both");
    let groups = known_failures();
    let differs: BTreeSet<&String> = groups.iter().filter(|g| g.differs_from_deno).flat_map(|g| &g.cases).collect();
    let mut problems = Vec::new();
    for (name, error) in &ours.failures {
        if !theirs.failures.contains_key(name) && !differs.contains(name) {
            problems.push(format!("{name} fails here ({error}) and passes under Deno"));
        }
    }
    for group in &groups {
        for name in &group.cases {
            match (group.differs_from_deno, theirs.failures.get(name)) {
                (true, Some(error)) => problems.push(format!(
                    "{name} is listed [differs from Deno] but fails under Deno too ({error}): list it [as Deno]"
                )),
                (false, None) => problems.push(format!(
                    "{name} is listed [as Deno] but passes under Deno: list it [differs from Deno] ({})",
                    group.reason.trim()
                )),
                _ => {}
            }
        }
    }
    eprintln!(
        "{} cases: {} pass under Deno, {} here",
        ours.names.len(),
        ours.names.len() - theirs.failures.len(),
        ours.names.len() - ours.failures.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
