//! JavaScript functions as route targets, through the binary: both handler shapes, the Web API subset, the
//! limits against hostile code (each hit answered, the worker serving on), isolation between functions,
//! compile errors at file:line:col, and a reload that swaps a function's code.

mod common;
use common::echo::check_fails_at;
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

const HELLO: &str = r#"export default {
  async fetch(request, env, ctx) {
    const url = new URL(request.url);
    const body = request.method === "POST" ? await request.text() : null;
    return Response.json(
      { greeting: env.GREETING, path: url.pathname, q: url.searchParams.get("q"), method: request.method, body,
        agent: request.headers.get("x-agent"), encoded: btoa("hi"), bytes: new TextEncoder().encode("é").length },
      { status: 201, headers: { "x-function": "hello" } },
    );
  },
};
"#;

const LEGACY: &str = r#"function handler(request) {
  globalThis.count = (globalThis.count || 0) + 1;
  return new Response(`legacy ${request.method} ${typeof globalThis.hostile}\n`, { headers: { "x-count": String(count) } });
}
"#;

const HOSTILE: &str = r#"export default {
  fetch(request) {
    globalThis.hostile = "set by hostile";
    const path = new URL(request.url).pathname;
    if (path === "/hostile/loop") { while (true) {} }
    if (path === "/hostile/array") { const a = []; while (true) a.push(new Array(100000).fill(1.5)); }
    if (path === "/hostile/string") { let s = "x"; while (true) s += s; }
    if (path === "/hostile/deep") { const f = (n) => f(n + 1) + 1; return new Response(String(f(0))); }
    if (path === "/hostile/never") { return new Promise(() => {}); }
    if (path === "/hostile/regex") { return new Response(String(/^(a+)+$/.test("a".repeat(40) + "b"))); }
    if (path === "/hostile/throw") { throw new TypeError("thrown on purpose"); }
    if (path === "/hostile/nothing") { return "not a response"; }
    return new Response("still here\n");
  },
};
"#;

fn write(dir: &Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).unwrap();
}

fn start(dir: &Path) -> Portico {
    write(dir, "hello.js", HELLO);
    write(dir, "legacy.js", LEGACY);
    write(dir, "hostile.js", HOSTILE);
    Portico::start_in(
        dir,
        "workers: 1\nadmin: { address: \"{admin}\" }\nlisteners: [ { name: web, address: \"{listen}\" } ]\n\
         functions:\n\
         \x20 hello: { source: hello.js, env: { GREETING: hi } }\n\
         \x20 legacy: { source: legacy.js, limits: { max_request: 1KiB } }\n\
         \x20 hostile: { source: hostile.js, limits: { cpu: 100ms, memory: 8MiB } }\n\
         routes:\n\
         \x20 - { match: { path_prefix: /hello }, function: hello }\n\
         \x20 - { match: { path_prefix: /legacy }, function: legacy }\n\
         \x20 - { match: { path_prefix: /hostile }, function: hostile }\n",
    )
}

#[test]
fn both_handler_shapes_answer_with_the_web_api_subset() {
    let p = start(&temp_dir());
    let r = Conn::open(p.addr).get("/hello/there?q=a%20b", "x-agent: tests\r\n");
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.header("x-function").as_deref(), Some("hello"));
    assert_eq!(r.header("content-type").as_deref(), Some("application/json"));
    let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        json,
        serde_json::json!({ "greeting": "hi", "path": "/hello/there", "q": "a b", "method": "GET", "body": null,
            "agent": "tests", "encoded": "aGk=", "bytes": 2 })
    );
    let mut conn = Conn::open(p.addr);
    conn.send(b"POST /hello/post HTTP/1.1\r\nHost: a\r\nContent-Length: 7\r\n\r\nposted!");
    let json: serde_json::Value = serde_json::from_slice(&conn.read_response(false).body).unwrap();
    assert_eq!(json["body"], "posted!");
    let r = Conn::open(p.addr).get("/legacy", "");
    assert_eq!(r.text(), "legacy GET undefined\n");
    // Over HTTP/2 too (curl, prior knowledge).
    let out = std::process::Command::new("curl")
        .args(["-sS", "--http2-prior-knowledge", "-w", " %{http_version}"])
        .arg(format!("http://{}/hello/h2", p.addr))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"path\":\"/hello/h2\"") && text.ends_with(" 2"), "{text}");
}

#[test]
fn hostile_code_is_stopped_at_its_limits_and_the_worker_serves_on() {
    let p = start(&temp_dir());
    let cases = [
        ("/hostile/loop", "ran past its CPU limit (100ms)"),
        ("/hostile/regex", "ran past its CPU limit (100ms)"),
        ("/hostile/array", "ran out of memory"),
        ("/hostile/string", "failed: "),
        ("/hostile/deep", "RangeError: Maximum call stack size exceeded"),
        ("/hostile/never", "returned a promise that never settles"),
        ("/hostile/throw", "failed: TypeError: thrown on purpose (at fetch ("),
        ("/hostile/nothing", "not a Response"),
    ];
    for (path, reason) in cases {
        let started = Instant::now();
        let r = Conn::open(p.addr).get(path, "");
        assert_eq!(r.status, 500, "{path}: {}", r.text());
        assert!(r.text().contains(reason), "{path}: {}", r.text());
        assert!(started.elapsed() < Duration::from_secs(5), "{path} took {:?}", started.elapsed());
        // The same function serves its next request (on a new runtime when the old one hit a limit), and so
        // do the others.
        assert_eq!(Conn::open(p.addr).get("/hostile/fine", "").text(), "still here\n", "after {path}");
        assert_eq!(Conn::open(p.addr).get("/hello", "").status, 201, "after {path}");
    }
    // Each kind counted; a runtime made anew after each CPU or memory limit (3), besides the first.
    let metric =
        |kind: &str| p.metric(&format!("portico_function_errors_total{{function=\"hostile\",kind=\"{kind}\"}}"));
    assert_eq!(metric("cpu_limit"), 2.0);
    assert_eq!(metric("memory_limit"), 1.0);
    assert_eq!(metric("unsettled"), 1.0);
    assert_eq!(metric("exception"), 4.0, "string, deep, throw, nothing");
    assert_eq!(p.metric("portico_function_runtimes_created_total{function=\"hostile\"}"), 4.0);
    assert_eq!(p.metric("portico_function_invocations_total{function=\"hostile\"}"), 16.0);
    // A body larger than the function's max_request that the handler does not read does not matter.
    let mut conn = Conn::open(p.addr);
    conn.send(
        format!("POST /legacy HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\n\r\n{}", "x".repeat(2000)).as_bytes(),
    );
    assert_eq!(conn.read_response(false).status, 200);
}

#[test]
fn functions_are_isolated_and_keep_their_state_between_requests() {
    let p = start(&temp_dir());
    // `hostile` sets a global: `legacy` never sees it.
    assert_eq!(Conn::open(p.addr).get("/hostile/fine", "").status, 200);
    let first = Conn::open(p.addr).get("/legacy", "");
    assert_eq!(first.text(), "legacy GET undefined\n");
    // Within one function, module state persists between requests on a worker (as in workerd and Deno).
    let second = Conn::open(p.addr).get("/legacy", "");
    let count = |r: &Resp| r.header("x-count").unwrap().parse::<u32>().unwrap();
    assert_eq!(count(&second), count(&first) + 1);
}

#[test]
fn a_function_that_does_not_compile_is_refused_at_its_position_and_a_reload_keeps_the_old_one() {
    let dir = temp_dir();
    let p = start(&dir);
    assert_eq!(Conn::open(p.addr).get("/legacy", "").text(), "legacy GET undefined\n");
    // A new version is served after a reload.
    write(&dir, "legacy.js", &LEGACY.replace("legacy ${", "renewed ${"));
    p.signal(libc::SIGHUP);
    wait_until("the new version", Duration::from_secs(10), || {
        Conn::open(p.addr).get("/legacy", "").text().starts_with("renewed")
    });
    // A broken one is refused, and the running version stays.
    write(&dir, "legacy.js", "function handler(request) {\n  return new Response(;\n}\n");
    p.signal(libc::SIGHUP);
    wait_until("the refused reload", Duration::from_secs(10), || p.metric("portico_reload_failures_total") == 1.0);
    // (The counter moves before /admin/reload's status is written: waited for too.)
    wait_until("the refused reload's status", Duration::from_secs(10), || {
        p.admin_get("/admin/reload").text().contains("legacy.js:2:")
    });
    assert!(Conn::open(p.addr).get("/legacy", "").text().starts_with("renewed"));
    // `portico check` says where.
    let yaml = "listeners: [ { name: web, address: 127.0.0.1:1 } ]\nfunctions:\n  broken: { source: broken.js }\nroutes:\n  - { function: broken }\n";
    let check_dir = temp_dir();
    write(&check_dir, "broken.js", "export default {\n  fetch(request) { return new Response( }\n};\n");
    let file = check_dir.join("portico.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = std::process::Command::new(portico_bin()).args(["check", "-c"]).arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(text.contains("broken.js:2:"), "{text}");
    check_fails_at(
        "listeners: [ { name: web, address: 127.0.0.1:1 } ]\nroutes:\n  - { function: nowhere }\n",
        3..=3,
        "unknown function \"nowhere\"",
    );
}

/// `limits.startup` bounds the file's top-level code when the configuration loads: past it, `portico check` names
/// the file and the limit; a larger limit lets the same file load.
#[test]
fn slow_top_level_code_is_refused_past_limits_startup() {
    let dir = temp_dir();
    write(
        &dir,
        "slow.js",
        "const until = Date.now() + 300;\nwhile (Date.now() < until) {}\nexport default { fetch() { return new Response(\"ok\"); } };\n",
    );
    let check = |startup: &str| {
        let yaml = format!(
            "listeners: [ {{ name: web, address: 127.0.0.1:1 }} ]\nfunctions:\n  slow: {{ source: slow.js, limits: {{ startup: {startup} }} }}\nroutes:\n  - {{ function: slow }}\n"
        );
        let file = dir.join("portico.yaml");
        std::fs::write(&file, yaml).unwrap();
        let out = std::process::Command::new(portico_bin()).args(["check", "-c"]).arg(&file).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, text) = check("100ms");
    assert!(!ok, "{text}");
    assert!(
        text.contains("portico.yaml:3:") && text.contains("slow.js: its top-level code ran for more than 100ms"),
        "{text}"
    );
    let (ok, text) = check("5s");
    assert!(ok, "{text}");
    let (ok, text) = check("1ms");
    assert!(!ok && text.contains("startup must be at least 10ms"), "{text}");
}

/// A handler that reports what the Web APIs give on fixed inputs and on the request: run by Portico and by
/// Deno (`deno serve`), the two answers must be the same.
const REFERENCE: &str = r#"export default {
  async fetch(request) {
    const url = new URL(request.url);
    const out = {};
    out.method = request.method;
    out.path = url.pathname;
    out.search = url.search;
    out.params = [...url.searchParams];
    out.getAll = url.searchParams.getAll("a");
    out.header = request.headers.get("x-test");
    out.body = await request.text();
    const urls = ["http://example.com", "https://example.com:443/a/b/../c?x=1#frag", "http://EXAMPLE.com:8080/%7Euser",
      "http://u:p@example.com/p?q", "http://example.com/a/./b/"];
    out.urls = urls.map((u) => { const p = new URL(u);
      return [p.href, p.protocol, p.host, p.hostname, p.port, p.pathname, p.search, p.hash, p.origin]; });
    out.relative = [new URL("/x?y=1", "http://example.com/a/b").href, new URL("c", "http://example.com/a/b").href,
      new URL("../d", "http://example.com/a/b/c").href, new URL("?z", "http://example.com/a?b").href];
    out.invalid = (() => { try { new URL("not a url"); return "parsed"; } catch (e) { return e.constructor.name; } })();
    const sp = new URLSearchParams("b=2&a=1&a=3&c=%20x+y");
    sp.append("d", "é &=");
    sp.sort();
    out.searchParams = [sp.toString(), sp.get("c"), sp.has("a"), sp.size];
    const h = new Headers({ "Content-Type": "text/plain", "X-B": "1" });
    h.append("x-b", "2");
    h.set("X-A", " padded ");
    out.headers = [...h];
    out.headerGet = [h.get("x-b"), h.get("missing"), h.has("CONTENT-TYPE")];
    out.encoded = [...new TextEncoder().encode("aé€😀")];
    out.decoded = new TextDecoder().decode(new Uint8Array([0x61, 0xc3, 0xa9, 0xff, 0xe2, 0x82, 0xac]));
    out.base64 = [btoa("hello"), atob("aGVsbG8="), btoa(""), atob("YQ")];
    const r = Response.json({ a: 1 }, { status: 202, headers: { "x-r": "1" } });
    out.response = [r.status, r.ok, r.headers.get("content-type"), await r.text()];
    const t = new Response("text");
    out.textResponse = [t.status, t.headers.get("content-type"), t.statusText];
    const redirect = Response.redirect("http://example.com/next", 307);
    out.redirect = [redirect.status, redirect.headers.get("location")];
    const hex = (buffer) => [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
    const enc = new TextEncoder();
    const digests = [];
    for (const name of ["SHA-1", "SHA-256", "SHA-384", "SHA-512"]) digests.push(hex(await crypto.subtle.digest(name, enc.encode("abc"))));
    const key = await crypto.subtle.importKey("raw", enc.encode("key"), { name: "HMAC", hash: "SHA-256" }, false, ["sign", "verify"]);
    const tag = await crypto.subtle.sign("HMAC", key, enc.encode("The quick brown fox jumps over the lazy dog"));
    out.crypto = [digests, hex(tag), await crypto.subtle.verify("HMAC", key, tag, enc.encode("The quick brown fox jumps over the lazy dog")),
      await crypto.subtle.verify("HMAC", key, tag, enc.encode("another message")), key.algorithm,
      /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(crypto.randomUUID()),
      crypto.getRandomValues(new Uint8Array(16)).length, crypto.randomUUID() !== crypto.randomUUID()];
    out.timers = await (async () => {
      const seen = [];
      setTimeout(() => seen.push("timeout 0"), 0);
      setTimeout((a, b) => seen.push(`timeout 5 ${a} ${b}`), 5, "with", "args");
      queueMicrotask(() => seen.push("microtask"));
      Promise.resolve().then(() => seen.push("then"));
      const cleared = setTimeout(() => seen.push("cleared"), 1);
      clearTimeout(cleared);
      let ticks = 0;
      await new Promise((resolve) => { const i = setInterval(() => { if (++ticks === 3) { clearInterval(i); resolve(); } }, 1); });
      await new Promise((resolve) => setTimeout(resolve, 20));
      seen.push(`ticks ${ticks}`);
      return seen;
    })();
    return Response.json(out);
  },
};
"#;

#[test]
fn the_web_apis_answer_as_deno_does() {
    let Some(deno) = deno() else {
        skip_outside_ci("the_web_apis_answer_as_deno_does", "Deno is not installed (`bash .ci/test` installs it)");
        return;
    };
    let dir = temp_dir();
    write(&dir, "reference.js", REFERENCE);
    let p = Portico::start_in(
        &dir,
        "workers: 1\nlisteners: [ { name: web, address: \"{listen}\" } ]\nfunctions:\n  reference: { source: reference.js }\nroutes:\n  - { function: reference }\n",
    );
    let port = free_port();
    let mut child = std::process::Command::new(deno)
        .args(["serve", "--quiet", "--no-prompt", "--port", &port.to_string()])
        .arg(dir.join("reference.js"))
        .env("DENO_DIR", dir.join("deno-cache"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("deno");
    let deno_addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until("deno serves", Duration::from_secs(30), || std::net::TcpStream::connect(deno_addr).is_ok());
    let request =
        b"POST /path/x?a=1&b=two&a=3 HTTP/1.1\r\nHost: test\r\nX-Test: value\r\nContent-Length: 4\r\n\r\nbody";
    let ask = |addr| {
        let mut conn = Conn::open(addr);
        conn.send(request);
        let r = conn.read_response(false);
        (r.status, serde_json::from_slice::<serde_json::Value>(&r.body).unwrap_or_else(|_| r.text().into()))
    };
    let (ours, theirs) = (ask(p.addr), ask(deno_addr));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(theirs.0, 200, "deno: {}", theirs.1);
    let (ours, theirs) = (ours.1, theirs.1);
    for key in theirs.as_object().unwrap().keys() {
        assert_eq!(ours[key], theirs[key], "`{key}` differs from Deno's");
    }
}

#[test]
fn secrets_reach_the_handler_and_nothing_else() {
    let dir = temp_dir();
    write(&dir, "secret.txt", "from-a-file\n");
    write(
        &dir,
        "secrets.js",
        "export default { fetch(request, env) { return Response.json({ key: env.API_KEY, file: env.FILE_SECRET, plain: env.PLAIN }); } };\n",
    );
    // SAFETY of the test: the variable's name is this test's own.
    std::env::set_var("PORTICO_TEST_SECRET_API_KEY", "from-the-environment");
    let p = Portico::start_in(
        &dir,
        "workers: 1\nadmin: { address: \"{admin}\" }\nlisteners: [ { name: web, address: \"{listen}\" } ]\n\
         functions:\n  s:\n    source: secrets.js\n    env: { PLAIN: visible }\n\
         \x20   secrets: { API_KEY: { env: PORTICO_TEST_SECRET_API_KEY }, FILE_SECRET: { file: secret.txt } }\n\
         routes:\n  - { function: s }\n",
    );
    let json: serde_json::Value = serde_json::from_slice(&Conn::open(p.addr).get("/", "").body).unwrap();
    assert_eq!(json, serde_json::json!({ "key": "from-the-environment", "file": "from-a-file", "plain": "visible" }));
    let config = p.admin_get("/admin/config").text();
    assert!(!config.contains("from-the-environment") && !config.contains("from-a-file"), "{config}");
    // A secret whose source is missing is a configuration error at its key.
    let yaml = "listeners: [ { name: web, address: 127.0.0.1:1 } ]\nfunctions:\n  s:\n    source: secrets.js\n    secrets: { API_KEY: { env: PORTICO_TEST_SECRET_NOT_SET } }\nroutes:\n  - { function: s }\n";
    let file = dir.join("missing.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = std::process::Command::new(portico_bin()).args(["check", "-c"]).arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(text.contains("missing.yaml:5:") && text.contains("PORTICO_TEST_SECRET_NOT_SET is not set"), "{text}");
}

const EVENTS: &str = r#"let finished = 0;
export default {
  async fetch(request, env, ctx) {
    const url = new URL(request.url);
    const path = url.pathname;
    const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
    if (path === "/events/sleep") { await sleep(Number(url.searchParams.get("ms"))); return new Response("slept"); }
    if (path === "/events/later") {
      ctx.waitUntil(sleep(100).then(() => { finished++; }));
      return new Response(`finished ${finished}`);
    }
    if (path === "/events/finished") return new Response(`finished ${finished}`);
    if (path === "/events/forever") { await sleep(60000); return new Response("woke"); }
    if (path === "/events/spin") { await sleep(10); while (true) {} }
    if (path === "/events/slices") {
      // 25 ms of CPU at a time, six times, with waits between: no slice is long, their sum is past the limit.
      for (let i = 0; i < 6; i++) { const until = Date.now() + 25; while (Date.now() < until) {} await sleep(5); }
      return new Response("done");
    }
    return new Response("events");
  },
};
"#;

fn start_events(dir: &Path) -> Portico {
    write(dir, "events.js", EVENTS);
    write(dir, "hello.js", HELLO);
    Portico::start_in(
        dir,
        "workers: 1\nadmin: { address: \"{admin}\" }\nlisteners: [ { name: web, address: \"{listen}\" } ]\n\
         functions:\n\
         \x20 events: { source: events.js, limits: { cpu: 100ms, wall: 2s, concurrency: 4 } }\n\
         \x20 hello: { source: hello.js }\n\
         routes:\n\
         \x20 - { match: { path_prefix: /events }, function: events }\n\
         \x20 - { match: { path_prefix: /hello }, function: hello }\n",
    )
}

#[test]
fn calls_wait_on_timers_without_holding_the_worker_and_queue_past_the_concurrency_limit() {
    let p = start_events(&temp_dir());
    // Twelve calls sleeping 200 ms each on one worker, four at a time: three rounds, not twelve.
    let started = Instant::now();
    let answers: Vec<_> = (0..12)
        .map(|_| {
            let addr = p.addr;
            std::thread::spawn(move || Conn::open(addr).get("/events/sleep?ms=200", ""))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let took = started.elapsed();
    for r in &answers {
        assert_eq!((r.status, r.text().as_str()), (200, "slept"));
    }
    assert!(took >= Duration::from_millis(550), "four at a time, in three rounds: {took:?}");
    assert!(took < Duration::from_millis(1800), "the calls waited together: {took:?}");
    // A call that waits past its wall limit is answered 504; the worker serves meanwhile.
    let addr = p.addr;
    let forever = std::thread::spawn(move || (Instant::now(), Conn::open(addr).get("/events/forever", "")));
    std::thread::sleep(Duration::from_millis(200));
    let quick = Instant::now();
    assert_eq!(Conn::open(p.addr).get("/hello", "").status, 201);
    assert!(quick.elapsed() < Duration::from_millis(500), "served while a call waits: {:?}", quick.elapsed());
    let (since, r) = forever.join().unwrap();
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(r.text().contains("did not answer within its wall limit (2s)"), "{}", r.text());
    assert!(since.elapsed() >= Duration::from_secs(2) && since.elapsed() < Duration::from_secs(4));
    assert_eq!(p.metric("portico_function_errors_total{function=\"events\",kind=\"wall_limit\"}"), 1.0);
}

#[test]
fn cpu_time_is_counted_across_a_calls_slices_and_wait_until_runs_after_the_response() {
    let p = start_events(&temp_dir());
    for path in ["/events/slices", "/events/spin"] {
        let r = Conn::open(p.addr).get(path, "");
        assert_eq!(r.status, 500, "{path}: {}", r.text());
        assert!(r.text().contains("ran past its CPU limit (100ms)"), "{path}: {}", r.text());
    }
    assert_eq!(p.metric("portico_function_errors_total{function=\"events\",kind=\"cpu_limit\"}"), 2.0);
    assert!(p.metric("portico_function_cpu_seconds_bucket{function=\"events\",le=\"0.25\"}") >= 2.0);
    // `ctx.waitUntil`: the answer goes out at once, the work finishes after it.
    assert_eq!(Conn::open(p.addr).get("/events/later", "").text(), "finished 0");
    wait_until("the waitUntil work", Duration::from_secs(5), || {
        Conn::open(p.addr).get("/events/finished", "").text() == "finished 1"
    });
    assert_eq!(Conn::open(p.addr).get("/events/fine", "").text(), "events");
}

const GATEWAY: &str = r#"let memo;
export default {
  async fetch(request, env) {
    const path = new URL(request.url).pathname;
    if (path === "/gw/origin") {
      // A listed endpoint's origin reaches its cluster; another origin does not.
      const listed = await (await fetch(`${env.ORIGIN}/echo`)).json();
      let other;
      try { await fetch("http://127.0.0.1:1/"); other = "fetched"; } catch (e) { other = e.message; }
      return Response.json({ backend: listed.backend, other });
    }
    if (path === "/gw/echo") {
      const r = await fetch("http://api/echo?x=1", { method: "POST", headers: { "x-from": "function" }, body: "payload" });
      const echo = await r.json();
      const from = echo.headers.find(([k]) => k === "x-from");
      const forwarded = echo.headers.find(([k]) => k === "x-forwarded-for");
      return Response.json({ status: r.status, ok: r.ok, backend: r.headers.get("x-backend"), method: echo.method,
        target: echo.target, length: echo.body_len, from: from && from[1], forwarded: forwarded && forwarded[1], url: r.url });
    }
    if (path === "/gw/both") {
      const answers = await Promise.all([fetch("http://api/a"), fetch("http://api/b"), fetch(new Request("http://api/c"))]);
      return Response.json(await Promise.all(answers.map((r) => r.text())));
    }
    if (path === "/gw/status") return new Response(String((await fetch("http://api/status/404")).status));
    if (path === "/gw/unknown") {
      try { await fetch("http://nowhere.example/"); return new Response("fetched"); }
      catch (e) { return new Response(`${e.constructor.name}: ${e.message}`); }
    }
    if (path === "/gw/dead") {
      try { await fetch("http://dead/"); return new Response("fetched"); }
      catch (e) { return new Response(`${e.constructor.name}: ${e.message}`); }
    }
    if (path === "/gw/slow") { await fetch("http://api/slow/5000"); return new Response("late"); }
    if (path === "/gw/memo") {
      // A promise shared across requests, whose fetch the first request's end cancels: later ones see it reject.
      memo ??= fetch("http://api/slow/3000").then((r) => r.text());
      try { return new Response(await memo); } catch (e) { memo = undefined; return new Response(`memo: ${e.message}`); }
    }
    if (path === "/gw/weird") {
      try { await fetch("http://api/status/799"); return new Response("fetched"); } catch (e) { return new Response(`${e.constructor.name}: ${e.message}`); }
    }
    if (path === "/gw/redirects") {
      // Followed: a 302 after a POST goes on as a GET without its body; a 307 keeps the method and the body.
      const post = { method: "POST", headers: { "content-type": "text/plain" }, body: "payload" };
      const r302 = await fetch("http://api/redirect/302?to=/echo?hop=1", post);
      const e302 = await r302.json();
      const r307 = await fetch("http://api/redirect/307?to=http://api/echo?hop=2", post);
      const e307 = await r307.json();
      const manual = await fetch("http://api/redirect/301?to=/echo", { redirect: "manual" });
      const outcome = async (url, init) => { try { return (await fetch(url, init)).status; } catch (e) { return `${e.constructor.name}: ${e.message}`; } };
      return Response.json({
        followed: [r302.status, r302.redirected, r302.url, e302.method, e302.target, e302.body_len],
        kept: [r307.status, r307.redirected, e307.method, e307.target, e307.body_len],
        manual: [manual.status, manual.redirected, manual.headers.get("location")],
        error: await outcome("http://api/redirect/302?to=/echo", { redirect: "error" }),
        loop: await outcome("http://api/redirect/302?to="), // a Location of "" is the same URL
        elsewhere: await outcome("http://api/redirect/302?to=http://nowhere.example/"),
      });
    }
    if (path === "/gw/nan") { await new Promise((resolve) => setTimeout(resolve, NaN)); return new Response("woke"); }
    return new Response("gateway");
  },
};
"#;

#[test]
fn fetch_reaches_the_configurations_clusters_through_their_pools() {
    let a = portico_testkit::Backend::start("a").unwrap();
    let b = portico_testkit::Backend::start("b").unwrap();
    let dir = temp_dir();
    write(&dir, "gateway.js", GATEWAY);
    let dead = free_port();
    let p = Portico::start_in(
        &dir,
        &format!(
            "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\n\
             clusters:\n\
             \x20 api: {{ endpoints: [ {{ address: \"{}\" }}, {{ address: \"{}\" }} ], balancer: round_robin }}\n\
             \x20 dead: {{ endpoints: [ {{ address: \"127.0.0.1:{dead}\" }} ] }}\n\
             functions:\n\
             \x20 gateway: {{ source: gateway.js, limits: {{ wall: 1s }}, env: {{ ORIGIN: \"http://{1}\" }} }}\n\
             routes:\n\
             \x20 - {{ match: {{ path_prefix: /gw }}, function: gateway }}\n",
            a.addr, b.addr
        ),
    );
    let r = Conn::open(p.addr).get("/gw/echo", "");
    assert_eq!(r.status, 200, "{}", r.text());
    let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(json["status"], 200);
    assert_eq!(json["ok"], true);
    assert_eq!(json["method"], "POST");
    assert_eq!(json["target"], "/echo?x=1");
    assert_eq!(json["length"], 7);
    assert_eq!(json["from"], "function");
    assert_eq!(json["forwarded"], "127.0.0.1", "the subrequest says whom it is for");
    assert_eq!(json["url"], "http://api/echo?x=1");
    let r = Conn::open(p.addr).get("/gw/origin", "");
    let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_else(|_| panic!("{}", r.text()));
    assert!(json["backend"] == "a" || json["backend"] == "b", "through cluster api: {json}");
    assert!(json["other"].as_str().unwrap().contains("not a cluster of this configuration"), "{json}");
    // Concurrent fetches, balanced over the cluster, on pooled connections.
    let r = Conn::open(p.addr).get("/gw/both", "");
    let answers: Vec<String> = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(answers.len(), 3);
    assert!(answers.iter().any(|t| t.contains("hello from a")) && answers.iter().any(|t| t.contains("hello from b")));
    let connections = a.connections() + b.connections();
    for _ in 0..5 {
        Conn::open(p.addr).get("/gw/both", "");
    }
    assert!(a.connections() + b.connections() <= connections + 1, "fetches reuse pooled connections");
    assert_eq!(Conn::open(p.addr).get("/gw/status", "").text(), "404");
    // What cannot be fetched is a TypeError with the reason.
    let text = Conn::open(p.addr).get("/gw/unknown", "").text();
    assert!(text.starts_with("TypeError: fetch to nowhere.example: not a cluster of this configuration"), "{text}");
    let text = Conn::open(p.addr).get("/gw/dead", "").text();
    assert!(text.contains("TypeError: fetch failed: cluster \"dead\": 502 upstream refused the connection"), "{text}");
    // A fetch that outlasts the wall limit ends the call with 504, and the fetch is abandoned.
    let started = Instant::now();
    let r = Conn::open(p.addr).get("/gw/slow", "");
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(started.elapsed() < Duration::from_secs(3));
    // A memoised fetch cancelled with the request that started it rejects for the next one (no hang).
    assert_eq!(Conn::open(p.addr).get("/gw/memo", "").status, 504);
    let text = Conn::open(p.addr).get("/gw/memo", "").text();
    assert_eq!(text, "memo: the request that started this operation has ended");
    let text = Conn::open(p.addr).get("/gw/weird", "").text();
    assert!(text.starts_with("TypeError: fetch to http://api/status/799: the upstream answered status 799"), "{text}");
    assert_eq!(Conn::open(p.addr).get("/gw/nan", "").text(), "woke");
    // Redirects are followed as the Fetch Standard says, to wherever a fetch may go.
    let r = Conn::open(p.addr).get("/gw/redirects", "");
    let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_else(|_| panic!("{}", r.text()));
    assert_eq!(json["followed"], serde_json::json!([200, true, "http://api/echo?hop=1", "GET", "/echo?hop=1", 0]));
    assert_eq!(json["kept"], serde_json::json!([200, true, "POST", "/echo?hop=2", 7]));
    assert_eq!(json["manual"], serde_json::json!([301, false, "/echo"]));
    assert!(json["error"].as_str().unwrap_or_default().contains("(redirect: \"error\")"), "{json}");
    assert!(json["loop"].as_str().unwrap_or_default().contains("more than 20 redirects"), "{json}");
    assert!(json["elsewhere"].as_str().unwrap_or_default().contains("not a cluster of this configuration"), "{json}");
    // Subrequests are counted as the cluster's requests.
    let metrics = p.admin_get("/metrics").text();
    let tries: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("portico_upstream_requests_total{cluster=\"api\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(tries >= 19.0, "{tries} upstream tries counted:\n{metrics}");
}

const AUTH: &str = r#"export default {
  async onRequest(request, env) {
    const url = new URL(request.url);
    if (url.searchParams.has("login")) return Response.redirect("https://login.example/", 302);
    const token = request.headers.get("authorization");
    if (!token) return new Response("no token\n", { status: 401, headers: { "www-authenticate": "Bearer" } });
    // The verdict comes from a cluster.
    const verdict = await fetch(`http://auth/status/${token === "Bearer good" ? 200 : 403}`);
    if (!verdict.ok) return new Response("denied\n", { status: 403 });
    request.headers.set("x-user", env.USER);
    request.headers.delete("authorization");
    request.headers.set("transfer-encoding", "chunked"); // Portico's own: ignored
    if (url.pathname === "/old") return new Request("http://ignored/echo?rewritten=1", { headers: request.headers });
  },
  onResponse(response, request) {
    response.headers.set("x-checked-for", request.headers.get("x-user") ?? "nobody");
    response.headers.set("x-status-seen", String(response.status));
    response.headers.delete("x-backend");
    response.headers.set("content-length", "0"); // Portico's own: ignored
  },
  fetch() { return new Response("the same module is a target too\n"); },
};
"#;

#[test]
fn a_function_filter_answers_early_or_changes_the_request_before_the_target() {
    let backend = portico_testkit::Backend::start("app").unwrap();
    let dir = temp_dir();
    write(&dir, "auth.js", AUTH);
    write(&dir, "hello.js", HELLO);
    let p = Portico::start_in(
        &dir,
        &format!(
            "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners: [ {{ name: web, address: \"{{listen}}\" }} ]\n\
             clusters:\n\
             \x20 app: {{ endpoints: [ {{ address: \"{0}\" }} ] }}\n\
             \x20 auth: {{ endpoints: [ {{ address: \"{0}\" }} ] }}\n\
             functions:\n\
             \x20 auth: {{ source: auth.js, env: {{ USER: alice }} }}\n\
             routes:\n\
             \x20 - {{ match: {{ path_prefix: /target }}, function: auth }}\n\
             \x20 - {{ match: {{ path_prefix: / }}, cluster: app, filters: [ {{ headers: {{ request: {{ set: {{ x-before: sync }} }} }} }}, {{ function: auth }} ] }}\n",
            backend.addr
        ),
    );
    // No token: answered by the filter; the target never sees the request.
    let before = backend.requests();
    let r = Conn::open(p.addr).get("/echo", "");
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer"));
    assert_eq!(r.header("x-status-seen").as_deref(), Some("401"), "the filter's own answer goes through onResponse");
    assert_eq!(backend.requests(), before);
    let r = Conn::open(p.addr).get("/echo?login", "");
    assert_eq!((r.status, r.header("location").as_deref()), (302, Some("https://login.example/")));
    // A token the auth cluster refuses.
    assert_eq!(Conn::open(p.addr).get("/echo", "Authorization: Bearer bad\r\n").status, 403);
    // A good one: the request goes on with the filter's changes (and the synchronous filter's before it).
    let r = Conn::open(p.addr).get("/echo", "Authorization: Bearer good\r\n");
    assert_eq!(r.status, 200, "{}", r.text());
    let echo: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let header = |name: &str| {
        echo["headers"].as_array().unwrap().iter().find(|h| h[0] == name).map(|h| h[1].as_str().unwrap().to_string())
    };
    assert_eq!(header("x-user").as_deref(), Some("alice"));
    assert_eq!(header("x-before").as_deref(), Some("sync"));
    // The response went through onResponse: a header set, the backend's removed.
    assert_eq!(r.header("x-checked-for").as_deref(), Some("alice"));
    assert_eq!(r.header("x-status-seen").as_deref(), Some("200"));
    assert_eq!(r.header("x-backend"), None);
    assert_eq!(header("authorization"), None);
    assert_eq!(header("transfer-encoding"), None, "a filter cannot set a framing header");
    assert_eq!(echo["target"], "/echo");
    // A Request returned with another URL: its path and query go upstream.
    let r = Conn::open(p.addr).get("/old?x=1", "Authorization: Bearer good\r\n");
    let echo: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(echo["target"], "/echo?rewritten=1");
    // Over HTTP/2 too.
    let (ok, text) = curl(&[
        "-sS",
        "--http2-prior-knowledge",
        "-H",
        "authorization: Bearer good",
        &format!("http://{}/echo", p.addr),
    ]);
    assert!(ok && text.contains("\"x-user\",\"alice\""), "{text}");
    let (ok, text) =
        curl(&["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--http2-prior-knowledge", &p.url("/echo")]);
    assert!(ok && text == "401", "{text}");
    // The same module's fetch handler serves as a target.
    assert_eq!(Conn::open(p.addr).get("/target", "").text(), "the same module is a target too\n");
    // A function without the entry point its use needs is refused where it is used.
    check_fails_at(
        "listeners: [ { name: web, address: 127.0.0.1:1 } ]\nfunctions:\n  hello: { source: HELLO }\nroutes:\n  - { function: hello, filters: [ { function: hello } ] }\n"
            .replace("HELLO", &dir.join("hello.js").display().to_string())
            .as_str(),
        5..=5,
        "function \"hello\" has no onRequest or onResponse hook, so it cannot be a filter",
    );
}

#[test]
fn console_lines_name_their_function_and_request() {
    let dir = temp_dir();
    write(
        &dir,
        "talk.js",
        "export default { fetch(request) { console.log('said', { n: 1 }); console.error(new TypeError('bad')); return new Response('ok'); } };\n",
    );
    let (addr, log) = (format!("127.0.0.1:{}", free_port()), dir.join("stderr.log"));
    let config = dir.join("portico.yaml");
    std::fs::write(
        &config,
        format!(
            "workers: 1\nlog: {{ format: json }}\nlisteners: [ {{ name: web, address: \"{addr}\" }} ]\n\
             functions:\n  talk: {{ source: talk.js }}\nroutes:\n  - {{ function: talk }}\n"
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(portico_bin())
        .args(["run", "-c"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    wait_until("portico serves", Duration::from_secs(10), || std::net::TcpStream::connect(addr).is_ok());
    assert_eq!(Conn::open(addr).get("/spoken?x=1", "").text(), "ok");
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the console lines", Duration::from_secs(5), || lines().contains("TypeError: bad"));
    let _ = child.kill();
    let _ = child.wait();
    let text = lines();
    let said = text.lines().find(|l| l.contains("said {\\\"n\\\":1}")).unwrap_or_else(|| panic!("{text}"));
    assert!(said.contains("\"function\":\"talk\""), "{said}");
    assert!(said.contains("\"request\":\"GET http://") && said.contains("/spoken?x=1\""), "{said}");
    assert!(said.contains("\"level\":\"info\""), "{said}");
    let bad = text.lines().find(|l| l.contains("TypeError: bad")).unwrap();
    assert!(bad.contains("\"level\":\"error\""), "{bad}");
}

/// The seed's pool bugs, and reloads, under load: every request of a steady load is answered 200 while the
/// function's code is swapped by reloads (requests in flight finish on the version they started on), and a
/// runtime serves thousands of requests without breaking.
#[test]
fn reloads_under_load_fail_no_request_and_a_runtime_serves_thousands() {
    let dir = temp_dir();
    let version = |n: u32| {
        format!(
            "let served = 0;\nexport default {{ async fetch(request) {{\n  served++;\n  await new Promise((r) => setTimeout(r, 1));\n  return new Response(`v{n} ${{served}}\\n`);\n}} }};\n"
        )
    };
    write(&dir, "live.js", &version(0));
    let p = Portico::start_in(
        &dir,
        "workers: 2\nadmin: { address: \"{admin}\" }\nlisteners: [ { name: web, address: \"{listen}\" } ]\n\
         functions:\n  live: { source: live.js, limits: { concurrency: 2 } }\nroutes:\n  - { function: live }\n",
    );
    // More connections than the function's concurrency per worker: they queue for a turn, never a 503.
    let load = Load::start(p.addr, 8);
    for n in 1..=5 {
        std::thread::sleep(Duration::from_millis(300));
        write(&dir, "live.js", &version(n));
        p.signal(libc::SIGHUP);
        wait_until("the new version", Duration::from_secs(10), || {
            Conn::open(p.addr).get("/", "").text().starts_with(&format!("v{n} "))
        });
    }
    std::thread::sleep(Duration::from_millis(300));
    let (ok, failed) = load.finish();
    assert!(failed.is_empty(), "{} failed, e.g. {:?}", failed.len(), &failed[..failed.len().min(5)]);
    assert!(ok > 500, "only {ok} requests");
    // One runtime per worker per version: none was made again for a broken one.
    let created = p.metric("portico_function_runtimes_created_total{function=\"live\"}");
    assert!(created <= 2.0 * 6.0, "{created} runtimes for 6 versions on 2 workers");
    assert_eq!(p.metric("portico_function_errors_total{function=\"live\",kind=\"concurrency_limit\"}"), 0.0);
    // Thousands of requests on the last version's runtimes, module state counting up.
    let mut conn = Conn::open(p.addr);
    let mut last = 0u64;
    for _ in 0..1200 {
        let text = conn.get("/", "").text();
        let count: u64 = text.trim().split(' ').nth(1).unwrap().parse().unwrap();
        assert!(text.starts_with("v5 "), "{text}");
        last = last.max(count);
    }
    assert!(last >= 600, "module state kept across requests: {last}");
}

const STREAMS: &str = r#"export default {
  async fetch(request) {
    const url = new URL(request.url);
    switch (url.pathname) {
      case "/s/echo": return new Response(request.body);
      case "/s/upper": {
        const upper = new TransformStream({
          transform(chunk, controller) { controller.enqueue(chunk.map((b) => (b >= 97 && b <= 122 ? b - 32 : b))); },
        });
        return new Response(request.body.pipeThrough(upper));
      }
      case "/s/count": {
        let n = 0;
        const reader = request.body.getReader();
        for (;;) { const { done, value } = await reader.read(); if (done) break; n += value.byteLength; }
        return new Response(String(n));
      }
      case "/s/generate": {
        const size = Number(url.searchParams.get("mib")) * 1048576;
        const chunk = new Uint8Array(65536).fill(120);
        let sent = 0;
        return new Response(new ReadableStream({
          pull(controller) {
            if (sent >= size) return controller.close();
            controller.enqueue(chunk);
            sent += chunk.byteLength;
          },
        }, { highWaterMark: 0 }));
      }
      case "/s/text": return new Response(String((await request.text()).length));
      case "/s/clone": {
        const copy = request.clone();
        const [a, b] = await Promise.all([request.text(), copy.text()]);
        return new Response(`${a.length} ${b.length} ${a === b}`);
      }
      case "/s/ticks": {
        let i = 0;
        return new Response(new ReadableStream({
          async pull(controller) {
            await new Promise((resolve) => setTimeout(resolve, 5));
            if (++i <= 5) controller.enqueue(new TextEncoder().encode(`tick ${i}\n`));
            else controller.close();
          },
        }));
      }
      case "/s/body": {
        const reader = new Response("abc").body.getReader();
        const { value } = await reader.read();
        return new Response(value, { headers: { "x-stream": String(typeof ReadableStream) } });
      }
    }
    return new Response("streams");
  },
};
"#;

fn start_streams(dir: &Path) -> Portico {
    write(dir, "streams.js", STREAMS);
    Portico::start_in(
        dir,
        "workers: 1\nadmin: { address: \"{admin}\" }\nlisteners: [ { name: web, address: \"{listen}\" } ]\n\
         functions:\n  streams: { source: streams.js, limits: { cpu: 20s, wall: 60s, max_request: 1MiB } }\n\
         routes:\n  - { function: streams }\n",
    )
}

/// Runs curl and returns what it printed (`-w`), failing the test when curl fails.
fn curl_out(args: &[&str]) -> String {
    let out = std::process::Command::new("curl").args(args).output().expect("curl");
    assert!(out.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn request_and_response_bodies_stream_through_handlers() {
    let p = start_streams(&temp_dir());
    let url = |path: &str| p.url(path);
    assert_eq!(curl_out(&["-sS", "--data-binary", "hello, streams", &url("/s/upper")]), "HELLO, STREAMS");
    assert_eq!(curl_out(&["-sS", "--data-binary", "as it came", &url("/s/echo")]), "as it came");
    assert_eq!(curl_out(&["-sS", &url("/s/ticks")]), "tick 1\ntick 2\ntick 3\ntick 4\ntick 5\n");
    let r = Conn::open(p.addr).get("/s/body", "");
    assert_eq!((r.text().as_str(), r.header("x-stream").as_deref()), ("abc", Some("function")));
    // A chunked upload of 8 MiB, counted as it streams (more than max_request: it is never held whole).
    let dir = temp_dir();
    let file = dir.join("upload");
    std::fs::write(&file, vec![7u8; 8 << 20]).unwrap();
    let upload = format!("@{}", file.display());
    let counted = curl_out(&["-sS", "-H", "transfer-encoding: chunked", "--data-binary", &upload, &url("/s/count")]);
    assert_eq!(counted, (8 << 20).to_string());
    // A clone of a streamed body reads the same bytes as the original.
    let big = dir.join("big");
    std::fs::write(&big, "x".repeat(100 << 10)).unwrap();
    let cloned = curl_out(&["-sS", "--data-binary", &format!("@{}", big.display()), &url("/s/clone")]);
    assert_eq!(cloned, format!("{0} {0} true", 100 << 10));
    // Read whole, the same body is past max_request: 413.
    let code = curl_out(&["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--data-binary", &upload, &url("/s/text")]);
    assert_eq!(code, "413");
    // Over HTTP/2 as well.
    let h2 = curl_out(&["-sS", "--http2-prior-knowledge", "--data-binary", "h2 body", &url("/s/upper")]);
    assert_eq!(h2, "H2 BODY");
    // Over HTTP/2 without a content-length (the body ends with its stream), read whole and streamed.
    let no_length = ["-sS", "--http2-prior-knowledge", "-H", "transfer-encoding: chunked", "--data-binary"];
    let h2 = curl_out(&[&no_length[..], &["no length", &url("/s/upper")]].concat());
    assert_eq!(h2, "NO LENGTH");
    assert_eq!(curl_out(&[&no_length[..], &[&upload, &url("/s/count")]].concat()), (8 << 20).to_string());
}

/// A large body through a handler, both ways, does not grow Portico's memory: nothing is read ahead of what
/// the other side takes.
#[test]
fn a_large_body_passes_through_a_handler_in_bounded_memory() {
    let p = start_streams(&temp_dir());
    let before = p.memory_kib("VmRSS");
    // Generated by JavaScript, chunk by chunk, as the client reads.
    let mib = if cfg!(debug_assertions) { 256 } else { 1024 };
    let size =
        curl_out(&["-sS", "-o", "/dev/null", "-w", "%{size_download}", &p.url(&format!("/s/generate?mib={mib}"))]);
    assert_eq!(size, (mib << 20).to_string());
    // Uploaded and echoed back at once (the request body piped into the response).
    let upload = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "head -c {}M /dev/zero | curl -sS -T - -H 'content-type: application/octet-stream' -o /dev/null -w '%{{size_download}}' {}",
            1024,
            p.url("/s/echo")
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&upload.stdout), (1024u64 << 20).to_string(), "{upload:?}");
    let grown = p.memory_kib("VmRSS").saturating_sub(before);
    assert!(grown < 64 * 1024, "RSS grew by {grown} KiB");
}
