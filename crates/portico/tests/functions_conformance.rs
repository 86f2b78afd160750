//! The functions' Web APIs against their standards, through the binary: a handler (tests/data/conformance.js)
//! runs web-platform-tests' URL cases (urltestdata.json, setters_tests.json), its form-urlencoded parser cases
//! and URLSearchParams cases adapted from it, with the runtime's `URL` and `URLSearchParams`, and answers the
//! cases that fail: they must be exactly the known ones of tests/data/url_known_failures.txt, each a documented
//! difference of the `url` crate. The same handler under Deno (`deno serve`) must answer the same on edge cases
//! of URL, URLSearchParams, DOMException, Event, EventTarget, AbortController, AbortSignal and structuredClone,
//! and fail no standard case that Deno passes.

mod common;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(file)
}

/// The standard's suites: the handler's path and the data it is given.
const SUITES: [(&str, &str); 4] = [
    ("/url", "urltestdata.json"),
    ("/setters", "setters_tests.json"),
    ("/urlencoded", "urlencoded-parser-data.json"),
    ("/searchparams", "searchparams.json"),
];

/// Portico serving conformance.js (with room for the suites: the debug build's QuickJS is slow).
fn start_portico(dir: &Path) -> Portico {
    std::fs::copy(data("conformance.js"), dir.join("conformance.js")).unwrap();
    Portico::start_in(
        dir,
        "workers: 1\nlisteners: [ { name: web, address: \"{listen}\" } ]\nfunctions:\n\
         \x20 conformance: { source: conformance.js, limits: { cpu: 30s, memory: 256MiB } }\n\
         routes:\n  - { function: conformance }\n",
    )
}

/// A suite's answer: how many cases it ran, and each failed case's name and what was wrong.
fn run_suite(addr: SocketAddr, path: &str, file: &str) -> (u64, BTreeMap<String, String>) {
    let answer = ask_json(addr, path, Some(&std::fs::read(data(file)).unwrap()));
    let total = answer["total"].as_u64().unwrap();
    let failures = answer["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_string(), f["error"].as_str().unwrap().to_string()))
        .collect();
    (total, failures)
}

/// How many cases a data file holds (what the handler must report having run).
fn cases_in(file: &str) -> u64 {
    // (serde_json refuses the lone surrogates some cases hold, which JavaScript's JSON takes: for counting, any
    // \uD8xx..\uDFxx escape may stand for another character.)
    let text = std::fs::read_to_string(data(file)).unwrap().replace("\\ud", "\\u0").replace("\\uD", "\\u0");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    match json {
        serde_json::Value::Array(cases) => {
            let objects = cases.iter().filter(|c| c.is_object()).count() as u64;
            // Each form-urlencoded case runs twice: through URLSearchParams and through a URL's searchParams.
            if file == "urlencoded-parser-data.json" {
                objects * 2
            } else {
                objects
            }
        }
        serde_json::Value::Object(attributes) => attributes
            .iter()
            .filter(|(key, _)| key.as_str() != "comment")
            .map(|(_, cases)| cases.as_array().map_or(0, |c| c.len() as u64))
            .sum(),
        _ => panic!("{file}: neither an array nor an object"),
    }
}

fn known_failures() -> BTreeSet<String> {
    std::fs::read_to_string(data("url_known_failures.txt"))
        .unwrap()
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn url_and_url_search_params_pass_the_web_platform_tests_but_the_known_cases() {
    let p = start_portico(&temp_dir());
    let known = known_failures();
    let mut failed = BTreeMap::new();
    let (mut passed, mut total) = (0, 0);
    for (path, file) in SUITES {
        let (ran, failures) = run_suite(p.addr, path, file);
        assert_eq!(ran, cases_in(file), "{path} ran {ran} cases of {file}");
        eprintln!("{path}: {} of {ran} cases pass", ran - failures.len() as u64);
        passed += ran - failures.len() as u64;
        total += ran;
        failed.extend(failures);
    }
    eprintln!("all: {passed} of {total} pass; {} known failures", known.len());
    let new: Vec<String> =
        failed.iter().filter(|(name, _)| !known.contains(*name)).map(|(n, e)| format!("{n}: {e}")).collect();
    assert!(new.is_empty(), "{} cases fail that did not:\n{}", new.len(), new.join("\n"));
    let fixed: Vec<&String> = known.iter().filter(|name| !failed.contains_key(*name)).collect();
    assert!(fixed.is_empty(), "known failures that now pass (remove them from url_known_failures.txt): {fixed:#?}");
    // The worker serves on.
    assert_eq!(Conn::open(p.addr).get("/nothing", "").status, 404);
}

#[test]
fn hostile_inputs_to_url_and_url_search_params_are_values_or_type_errors() {
    let p = start_portico(&temp_dir());
    let answer = ask_json(p.addr, "/hostile", None);
    let outcomes = answer.as_array().unwrap();
    assert!(outcomes.len() > 20, "{answer}");
    for (i, outcome) in outcomes.iter().enumerate() {
        assert!(outcome == "ok" || outcome == "TypeError", "hostile case {i}: {outcome}");
    }
    // The ones that must be refused are.
    assert_eq!(outcomes[13], "TypeError", "a symbol");
    assert_eq!(outcomes[20], "TypeError", "a symbol for the protocol");
    assert_eq!(Conn::open(p.addr).get("/nothing", "").status, 404);
}

/// Where Deno departs from the standards, checked on Portico alone: Event, EventTarget and AbortController are
/// platform objects that structuredClone refuses (Deno clones them as plain objects), and a transfer list that
/// names an ArrayBuffer twice is a DataCloneError (Deno ignores the duplicate).
#[test]
fn events_abort_signals_and_structured_clone_follow_the_standards() {
    let p = start_portico(&temp_dir());
    let events = ask_json(p.addr, "/events", None);
    let refused = serde_json::json!([true, "DataCloneError", 25]);
    assert_eq!(events["standardOnly"], serde_json::json!([[refused, refused, refused], "throws DataCloneError"]));
    // A few answers spelled out, for a run without Deno.
    assert_eq!(events["abort"][1], true);
    assert_eq!(events["abort"][4], serde_json::json!([["onabort", "abort", true, true, true], ["listener", true]]));
    assert_eq!(events["any"][2], "b's reason");
    assert_eq!(
        events["domException"][2],
        serde_json::json!([true, true, "AbortError", "m", 20, "AbortError: m", "[object DOMException]"])
    );
    assert_eq!(events["clone"][1], true, "a cycle is kept");
    assert!(events["cloneErrors"].as_array().unwrap().iter().all(|e| *e == refused), "{}", events["cloneErrors"]);
    let edge = ask_json(p.addr, "/edge", None);
    assert_eq!(edge["live"][4], "https://example.com/p?a=1&b=2&a=3&c=x+y#h");
    assert_eq!(edge["relative"][0], "http://example.com/x?y=1");
}

#[test]
fn the_web_apis_answer_as_deno_does_on_their_edge_cases() {
    let Some(deno) = deno() else {
        skip_outside_ci(
            "the_web_apis_answer_as_deno_does_on_their_edge_cases",
            "Deno is not installed (`bash .ci/test` installs it)",
        );
        return;
    };
    let dir = temp_dir();
    let p = start_portico(&dir);
    let port = free_port();
    let mut child = std::process::Command::new(deno)
        .args(["serve", "--quiet", "--no-prompt", "--port", &port.to_string()])
        .arg(dir.join("conformance.js"))
        .env("DENO_DIR", dir.join("deno-cache"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("deno");
    let deno_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until("deno serves", Duration::from_secs(30), || std::net::TcpStream::connect(deno_addr).is_ok());
    let mut differences = Vec::new();
    for path in ["/edge", "/events", "/json"] {
        let (ours, theirs) = (ask_json(p.addr, path, None), ask_json(deno_addr, path, None));
        for (key, value) in theirs.as_object().unwrap() {
            // (Checked against the standard by the test above: Deno departs from it there.)
            if key == "standardOnly" || ours[key] == *value {
                continue;
            }
            match (ours[key].as_array(), value.as_array()) {
                // A list of cases: each case that differs, by its place.
                (Some(mine), Some(deno)) if mine.len() == deno.len() => {
                    for (i, (a, b)) in mine.iter().zip(deno).enumerate().filter(|(_, (a, b))| a != b) {
                        differences.push(format!("{path} `{key}` case {i}:\n  ours:   {a}\n  Deno's: {b}"));
                    }
                }
                _ => differences.push(format!("{path} `{key}`:\n  ours:   {}\n  Deno's: {value}", ours[key])),
            }
        }
        assert_eq!(ours.as_object().unwrap().len(), theirs.as_object().unwrap().len(), "{path}: the same keys");
    }
    // On the standard's suites, nothing fails here that passes under Deno.
    for (path, file) in SUITES {
        let (_, ours) = run_suite(p.addr, path, file);
        let (_, theirs) = run_suite(deno_addr, path, file);
        for (name, error) in &ours {
            if !theirs.contains_key(name) {
                differences.push(format!("{path} {name} fails here ({error}) and passes under Deno"));
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}
