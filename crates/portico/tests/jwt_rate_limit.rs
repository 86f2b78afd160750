//! The `jwt` and `rate_limit` filters end to end through the binary, with curl over HTTP/1.1 and cleartext
//! HTTP/2: tokens signed by PyJWT (with keys made by `cryptography`) for every algorithm family, keys inline,
//! in files and in a JWKS file; a JWKS server (Python's http.server) that rotates its keys and goes down
//! during the test; expiry, leeway, `nbf`, audience, issuer, required claims and values, a revocation list
//! re-read when it changes (`watch: true`); rate limits that hold across 2 worker threads and across
//! `process_model: multi_process`, with `Retry-After` and the `RateLimit-Policy` / `RateLimit` fields;
//! shadow mode and the denials counters. `.ci/install-test-deps` puts PyJWT and cryptography in
//! target/test-tools/venv.

mod common;
use common::echo::*;
use common::*;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// (curl's protocol flag, the HTTP version curl reports for it).
const PROTOCOLS: [(&str, &str); 2] = [("--http1.1", "1.1"), ("--http2-prior-knowledge", "2")];
const SECRET: &str = "a secret of at least thirty-two bytes";

fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-tools/venv/bin/python")
}

fn tool() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jwt_tool.py")
}

/// Whether PyJWT and curl are here (skipped, or failed under CI, when not).
fn tools_for(test: &str) -> bool {
    if !have_tool("curl", test) {
        return false;
    }
    let found =
        Command::new(python()).args(["-c", "import jwt, cryptography"]).output().is_ok_and(|o| o.status.success());
    if !found {
        skip_outside_ci(test, "PyJWT is not in target/test-tools/venv (`bash .ci/install-test-deps`)");
    }
    found
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// Makes the keys (PyJWT and cryptography) in `dir`.
fn make_keys(dir: &Path) {
    let out = Command::new(python()).arg(tool()).arg("keys").arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Tokens signed by PyJWT: (algorithm, key (a secret for HS*, else a key's name in `dir`), kid, claims).
fn sign(dir: &Path, tokens: &[(&str, &str, Option<&str>, serde_json::Value)]) -> Vec<String> {
    let mut child = Command::new(python())
        .arg(tool())
        .arg("sign")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for (alg, key, kid, claims) in tokens {
        let line = serde_json::json!({"alg": alg, "key": key, "kid": kid, "claims": claims});
        writeln!(stdin, "{line}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

/// A curl request: (status, response headers in lower case, body). `args` go before the URL.
fn curl_req(proto: &str, url: &str, args: &[&str]) -> (u16, String, String) {
    let dir = temp_dir();
    let head = dir.join("head");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", proto, "-D"])
        .arg(&head)
        .args(["-w", "\n%{http_code} %{http_version}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl is installed");
    assert!(out.status.success(), "curl {args:?} {url}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, last) = text.rsplit_once('\n').unwrap_or(("", &text));
    let (status, version) = last.split_once(' ').unwrap_or((last, ""));
    let expected = PROTOCOLS.iter().find(|(flag, _)| *flag == proto).map_or("", |(_, v)| *v);
    assert_eq!(version, expected, "curl spoke HTTP/{version}, not {proto}");
    let headers = std::fs::read_to_string(head).unwrap_or_default().to_ascii_lowercase();
    (status.parse().unwrap_or(0), headers, body.to_string())
}

fn bearer(proto: &str, url: &str, token: &str) -> (u16, String, String) {
    curl_req(proto, url, &["-H", &format!("authorization: Bearer {token}"), "-H", "x-user: forged"])
}

fn header_of<'a>(headers: &'a str, name: &str) -> Vec<&'a str> {
    headers.lines().filter_map(|l| l.split_once(':')).filter(|(n, _)| n.trim() == name).map(|(_, v)| v.trim()).collect()
}

fn denials(p: &Portico, route: &str, filter: &str, reason: &str, shadow: bool) -> f64 {
    p.metric(&format!(
        "portico_filter_denials_total{{route=\"{route}\",filter=\"{filter}\",reason=\"{reason}\",shadow=\"{shadow}\"}}"
    ))
}

/// The JWKS server (Python's http.server), ended when dropped.
struct JwksServer {
    child: Child,
    port: u16,
}

impl JwksServer {
    fn start(dir: &Path) -> JwksServer {
        let port = free_port();
        let mut child = Command::new(python())
            .arg(tool())
            .arg("serve")
            .arg(dir)
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "serving");
        JwksServer { child, port }
    }

    fn count(&self) -> u64 {
        let (ok, body) = curl(&["-sS", &format!("http://127.0.0.1:{}/count", self.port)]);
        assert!(ok, "{body}");
        body.trim().parse().unwrap()
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A JWKS document of the keys named (their `.jwk` files in `dir`), each with its kid.
fn write_jwks(dir: &Path, keys: &[(&str, &str)]) {
    let listed: Vec<serde_json::Value> = keys
        .iter()
        .map(|(name, kid)| {
            let mut jwk: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.jwk"))).unwrap()).unwrap();
            jwk["kid"] = (*kid).into();
            jwk
        })
        .collect();
    let tmp = dir.join("jwks.json.tmp");
    std::fs::write(&tmp, serde_json::json!({ "keys": listed }).to_string()).unwrap();
    std::fs::rename(tmp, dir.join("jwks.json")).unwrap();
}

#[test]
fn jwt_verifies_pyjwt_tokens_of_every_algorithm_and_refuses_as_rfc_6750_says() {
    let test = "jwt_verifies_pyjwt_tokens_of_every_algorithm_and_refuses_as_rfc_6750_says";
    if !tools_for(test) {
        return;
    }
    let echo = Echo::start("app");
    let dir = temp_dir();
    make_keys(&dir);
    std::fs::write(dir.join("hs.secret"), format!("{SECRET}\n")).unwrap();
    std::fs::write(dir.join("revoked.txt"), "# revoked token ids\n").unwrap();
    // A JWKS file with the P-384 key.
    let mut p384: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("p384.jwk")).unwrap()).unwrap();
    p384["kid"] = "file-384".into();
    std::fs::write(dir.join("keys.json"), serde_json::json!({ "keys": [p384] }).to_string()).unwrap();
    let ed_pem = std::fs::read_to_string(dir.join("ed25519.pub")).unwrap();
    let ed_inline = ed_pem.lines().map(|l| format!("                {l}\n")).collect::<String>();
    let yaml = config(
        "",
        &format!(
            "watch: true
access_log: {{ path: access.log, format: json }}
routes:
  - name: api
    match: {{ path_prefix: / }}
    cluster: app
    filters:
      - jwt:
          keys:
            - {{ kid: hs, algorithm: HS256, secret: \"{SECRET}\" }}
            - {{ kid: hs384, algorithm: HS384, secret_file: hs.secret }}
            - {{ kid: hs512, algorithm: HS512, secret_file: hs.secret }}
            - {{ kid: rs256, algorithm: RS256, public_key_file: rsa.pub }}
            - {{ kid: rs384, algorithm: RS384, public_key_file: rsa.pub }}
            - {{ kid: rs512, algorithm: RS512, public_key_file: rsa.pub }}
            - {{ kid: ps256, algorithm: PS256, public_key_file: rsa.pub }}
            - {{ kid: es256, algorithm: ES256, public_key_file: p256.pub }}
            - kid: ed
              algorithm: EdDSA
              public_key: |
{ed_inline}          jwks_file: keys.json
          issuer: https://idp.example
          audience: [orders, billing]
          leeway: 30s
          require: [exp, sub]
          claims: {{ scope: orders:read }}
          forward_claims: {{ sub: x-user, tenant: x-tenant }}
          revoked_file: revoked.txt
          realm: orders
clusters:
  app:
    endpoints:
      - address: \"{}\"
",
            echo.addr
        ),
    );
    let p = Portico::start_in(&dir, &yaml);
    let url = p.url("/orders/1");
    let t = now();
    let claims = |sub: &str| serde_json::json!({"sub": sub, "iss": "https://idp.example", "aud": "orders", "exp": t + 600, "scope": "profile orders:read", "tenant": "acme", "jti": format!("jti-{sub}")});
    let with = |sub: &str, changes: serde_json::Value| {
        let mut c = claims(sub);
        for (k, v) in changes.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    };
    let good: Vec<(&str, &str, Option<&str>, serde_json::Value)> = vec![
        ("HS256", SECRET, Some("hs"), claims("hs256")),
        ("HS384", SECRET, Some("hs384"), claims("hs384")),
        ("HS512", SECRET, Some("hs512"), claims("hs512")),
        ("RS256", "rsa", Some("rs256"), claims("rs256")),
        ("RS384", "rsa", Some("rs384"), claims("rs384")),
        ("RS512", "rsa", Some("rs512"), claims("rs512")),
        ("PS256", "rsa", Some("ps256"), claims("ps256")),
        ("ES256", "p256", Some("es256"), claims("es256")),
        ("ES384", "p384", Some("file-384"), claims("es384")),
        ("EdDSA", "ed25519", Some("ed"), claims("eddsa")),
        // No kid: tried against every key of its algorithm.
        ("ES256", "p256", None, claims("no-kid")),
        // Expired 20 seconds ago, within the 30 s leeway; an audience among several.
        ("ES256", "p256", Some("es256"), with("leeway", serde_json::json!({"exp": t - 20}))),
        ("ES256", "p256", Some("es256"), with("billing", serde_json::json!({"aud": ["billing", "other"]}))),
    ];
    let tokens = sign(&dir, &good);
    for (proto, _) in PROTOCOLS {
        for (token, (alg, _, _, claims)) in tokens.iter().zip(&good) {
            let (status, _, body) = bearer(proto, &url, token);
            assert_eq!(status, 200, "{proto} {alg} {claims}: {body}");
            let seen = Seen::parse(&body);
            assert_eq!(seen.all("x-user"), vec![claims["sub"].as_str().unwrap().to_string()], "{proto} {alg}: {body}");
            assert_eq!(seen.all("x-tenant"), vec!["acme"], "{proto} {alg}: {body}");
            assert!(seen.all("authorization").is_empty(), "{proto}: the token went upstream: {body}");
        }
    }
    // Refused: (claims or token, status, error code, denial reason).
    let bad = [
        (
            ("ES256", "p256", Some("es256"), with("expired", serde_json::json!({"exp": t - 120}))),
            401,
            "invalid_token",
            "expired",
        ),
        (
            ("ES256", "p256", Some("es256"), with("early", serde_json::json!({"nbf": t + 600}))),
            401,
            "invalid_token",
            "not_yet_valid",
        ),
        (
            ("ES256", "p256", Some("es256"), with("aud", serde_json::json!({"aud": "payroll"}))),
            401,
            "invalid_token",
            "claims",
        ),
        (
            ("ES256", "p256", Some("es256"), with("iss", serde_json::json!({"iss": "https://evil.example"}))),
            401,
            "invalid_token",
            "claims",
        ),
        (
            ("ES256", "p256", Some("es256"), with("noexp", serde_json::json!({"exp": null}))),
            401,
            "invalid_token",
            "claims",
        ),
        (
            ("ES256", "p256", Some("es256"), with("nosub", serde_json::json!({"sub": null}))),
            401,
            "invalid_token",
            "claims",
        ),
        (
            ("ES256", "p256", Some("es256"), with("scope", serde_json::json!({"scope": "orders:write"}))),
            403,
            "insufficient_scope",
            "insufficient_scope",
        ),
        // Signed by a key Portico does not have under that kid (the RSA key claiming to be es256's).
        (("RS256", "rsa", Some("es256"), claims("confused")), 401, "invalid_token", "invalid"),
        (("ES256", "jwks-a", Some("es256"), claims("forged")), 401, "invalid_token", "invalid"),
        (("ES256", "p256", Some("nobody"), claims("unknown-kid")), 401, "invalid_token", "invalid"),
    ];
    let bad_tokens = sign(&dir, &bad.iter().map(|(t, ..)| t.clone()).collect::<Vec<_>>());
    for (proto, _) in PROTOCOLS {
        for (token, (_, status, code, _)) in bad_tokens.iter().zip(&bad) {
            let (got, headers, body) = bearer(proto, &url, token);
            assert_eq!(got, *status, "{proto} {code}: {body}");
            let challenge = header_of(&headers, "www-authenticate");
            assert_eq!(challenge.len(), 1, "{headers}");
            assert!(
                challenge[0].starts_with(&format!("bearer realm=\"orders\", error=\"{code}\", error_description=\"")),
                "{headers}"
            );
        }
        // No token: a bare challenge; a broken header: 400 invalid_request.
        let (status, headers, _) = curl_req(proto, &url, &[]);
        assert_eq!((status, header_of(&headers, "www-authenticate")), (401, vec!["bearer realm=\"orders\""]));
        let (status, headers, _) = curl_req(proto, &url, &["-H", "authorization: Bearer a b"]);
        assert_eq!(status, 400, "{headers}");
        assert!(headers.contains("error=\"invalid_request\""), "{headers}");
        // A signature tampered with.
        let tampered = format!("{}AA", tokens[7]);
        assert_eq!(bearer(proto, &url, &tampered).0, 401, "{proto}");
    }
    for (_, _, _, reason) in &bad {
        assert!(denials(&p, "api", "jwt", reason, false) >= 2.0, "{reason}");
    }
    assert_eq!(denials(&p, "api", "jwt", "missing", false), 2.0);
    assert_eq!(denials(&p, "api", "jwt", "expired", false), 2.0);
    // The access log's user is the token's subject.
    let log = dir.join("access.log");
    wait_until("the access log's lines", Duration::from_secs(5), || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("\"user\":\"eddsa\""))
    });
    // Revoking a token: the list is re-read when it changes (`watch: true`), and the token is refused at once
    // although it verified (and was remembered) before.
    std::fs::write(dir.join("revoked.txt"), "# revoked token ids\njti-es256\n").unwrap();
    wait_until("the revocation to apply", Duration::from_secs(10), || bearer("--http1.1", &url, &tokens[7]).0 == 401);
    for (proto, _) in PROTOCOLS {
        let (status, headers, _) = bearer(proto, &url, &tokens[7]);
        assert_eq!(status, 401, "{proto}");
        assert!(headers.contains("the token was revoked"), "{headers}");
        assert_eq!(bearer(proto, &url, &tokens[0]).0, 200, "{proto}: other tokens still pass");
    }
    assert!(denials(&p, "api", "jwt", "revoked", false) >= 3.0);
}

#[test]
fn jwks_keys_rotate_and_an_outage_keeps_the_keys_fetched_before() {
    let test = "jwks_keys_rotate_and_an_outage_keeps_the_keys_fetched_before";
    if !tools_for(test) {
        return;
    }
    let echo = Echo::start("app");
    let dir = temp_dir();
    make_keys(&dir);
    write_jwks(&dir, &[("jwks-a", "a")]);
    let server = JwksServer::start(&dir);
    let yaml = config(
        "",
        &format!(
            "routes:
  - name: api
    match: {{ path_prefix: / }}
    cluster: app
    filters:
      - jwt:
          jwks: {{ url: \"http://127.0.0.1:{}/jwks.json\", refresh: 1h, unknown_kid_interval: 2s, timeout: 2s }}
          forward_claims: {{ sub: x-user }}
clusters:
  app:
    endpoints:
      - address: \"{}\"
",
            server.port, echo.addr
        ),
    );
    let p = Portico::start_in(&dir, &yaml);
    let url = p.url("/x");
    let exp = now() + 600;
    let token = |alg: &'static str, key: &'static str, kid: &'static str, sub: &str| {
        (alg, key, Some(kid), serde_json::json!({"sub": sub, "exp": exp}))
    };
    let t = sign(
        &dir,
        &[
            token("ES256", "jwks-a", "a", "a1"),
            token("RS256", "jwks-b", "b", "b1"),
            token("ES256", "jwks-a", "a", "a2"),
            token("RS256", "jwks-b", "b", "b2"),
            token("ES256", "jwks-a", "c", "c1"),
            token("ES256", "jwks-a", "a", "a3"),
        ],
    );
    // Key a, fetched in the background at start (a request that comes first waits for it).
    for (proto, _) in PROTOCOLS {
        let (status, _, body) = bearer(proto, &url, &t[0]);
        assert_eq!(status, 200, "{proto}: {body}");
        assert_eq!(Seen::parse(&body).all("x-user"), vec!["a1"]);
    }
    // The server rotates to b: a token with kid b has the set fetched again while it waits, and passes.
    write_jwks(&dir, &[("jwks-a", "a"), ("jwks-b", "b")]);
    let fetched = server.count();
    std::thread::sleep(Duration::from_millis(2100));
    let (status, _, body) = bearer("--http2-prior-knowledge", &url, &t[1]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(server.count(), fetched + 1, "one fetch for the unknown kid");
    assert_eq!(bearer("--http1.1", &url, &t[1]).0, 200);
    // A kid nobody has: refused, and fetches at most once per interval however many ask.
    let fetched = server.count();
    std::thread::sleep(Duration::from_millis(2100));
    for _ in 0..5 {
        assert_eq!(bearer("--http1.1", &url, &t[4]).0, 401);
    }
    assert_eq!(server.count(), fetched + 1, "at most one fetch per unknown_kid_interval");
    // The endpoint goes down: tokens (new ones, not remembered) still verify with the keys fetched before.
    std::fs::write(dir.join("down"), "").unwrap();
    std::thread::sleep(Duration::from_millis(2100));
    let (status, _, body) = bearer("--http1.1", &url, &t[4]);
    assert_eq!(status, 401, "{body}");
    assert!(server.count() > fetched + 1, "the unknown kid asked the server, which answered 503");
    for (proto, _) in PROTOCOLS {
        assert_eq!(bearer(proto, &url, &t[2]).0, 200, "{proto}: key a survives the outage");
        assert_eq!(bearer(proto, &url, &t[3]).0, 200, "{proto}: key b survives the outage");
    }
    // And the server gone entirely.
    drop(server);
    assert_eq!(bearer("--http1.1", &url, &t[5]).0, 200);
}

/// `workers: 2` (threads) or `process_model: multi_process`, one route limited per `x-client`.
fn limited(echo: &Echo, multi_process: bool, filter: &str) -> String {
    format!(
        "workers: 2\n{}admin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\nroutes:
  - name: limited
    match: {{ path_prefix: / }}
    cluster: app
    filters:
      - {filter}
clusters:
  app:
    endpoints:
      - address: \"{}\"
",
        if multi_process { "process_model: multi_process\n" } else { "" },
        echo.addr
    )
}

/// Sends `n` requests, each on a new connection (so both workers take some), alternating HTTP/1.1 and
/// HTTP/2; returns the responses' (status, headers).
fn burst(p: &Portico, n: usize, client: &str) -> Vec<(u16, String)> {
    (0..n)
        .map(|i| {
            let (status, headers, _) =
                curl_req(PROTOCOLS[i % 2].0, &p.url("/x"), &["-H", &format!("x-client: {client}")]);
            (status, headers)
        })
        .collect()
}

fn check_limit(p: &Portico, policy: &str) {
    // 10 an hour, burst 5: the first 5 pass whichever worker takes them, the other 15 are refused.
    let answers = burst(p, 20, "alice");
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 5, "{statuses:?}");
    assert!(statuses[..5].iter().all(|s| *s == 200), "{statuses:?}");
    for (i, (status, headers)) in answers.iter().enumerate() {
        assert_eq!(header_of(headers, "ratelimit-policy"), vec![policy], "{headers}");
        let limit = header_of(headers, "ratelimit");
        assert_eq!(limit.len(), 1, "{headers}");
        if *status == 200 {
            assert!(limit[0].starts_with(&format!("\"per-client\";r={};t=", 4 - i)), "{headers}");
        } else {
            assert_eq!(*status, 429);
            let retry: u64 = header_of(headers, "retry-after")[0].parse().unwrap();
            assert!((350..=360).contains(&retry), "one token every 6 minutes: {headers}");
            assert!(limit[0].starts_with("\"per-client\";r=0;t="), "{headers}");
        }
    }
    // Another client has its own bucket.
    assert_eq!(burst(p, 1, "bob")[0].0, 200);
    assert_eq!(denials(p, "limited", "rate_limit", "exceeded", false), 15.0);
}

#[test]
fn a_rate_limit_holds_across_two_worker_threads() {
    if !have_tool("curl", "a_rate_limit_holds_across_two_worker_threads") {
        return;
    }
    let echo = Echo::start("app");
    let filter = "rate_limit: { rate: 10/h, burst: 5, key: { header: x-client }, name: per-client }";
    let p = Portico::start(&limited(&echo, false, filter));
    check_limit(&p, "\"per-client\";q=10;w=3600");
}

#[test]
fn a_rate_limit_holds_across_worker_processes() {
    if !have_tool("curl", "a_rate_limit_holds_across_worker_processes") {
        return;
    }
    let echo = Echo::start("app");
    let filter = "rate_limit: { rate: 10/h, burst: 5, key: { header: x-client }, name: per-client }";
    let p = Portico::start(&limited(&echo, true, filter));
    check_limit(&p, "\"per-client\";q=10;w=3600");
    assert_eq!(p.metric("portico_rate_limit_table_keys"), (1 << 20) as f64);
}

#[test]
fn a_shadowed_rate_limit_counts_and_refuses_nothing() {
    if !have_tool("curl", "a_shadowed_rate_limit_counts_and_refuses_nothing") {
        return;
    }
    let echo = Echo::start("app");
    let filter = "rate_limit: { rate: 1/h, burst: 2, shadow: true }";
    let p = Portico::start(&limited(&echo, false, filter));
    let answers = burst(&p, 6, "x");
    assert!(answers.iter().all(|(s, h)| *s == 200 && header_of(h, "ratelimit").is_empty()), "{answers:?}");
    assert_eq!(denials(&p, "limited", "rate_limit", "exceeded", true), 4.0);
    assert_eq!(denials(&p, "limited", "rate_limit", "exceeded", false), 0.0);
}

#[test]
fn a_rate_limit_counts_by_the_verified_subject() {
    let test = "a_rate_limit_counts_by_the_verified_subject";
    if !tools_for(test) {
        return;
    }
    let echo = Echo::start("app");
    let dir = temp_dir();
    make_keys(&dir);
    let yaml = config(
        "",
        &format!(
            "routes:
  - name: api
    match: {{ path_prefix: / }}
    cluster: app
    filters:
      - jwt: {{ keys: [ {{ algorithm: ES256, public_key_file: p256.pub }} ] }}
      - rate_limit: {{ rate: 1/h, burst: 2, key: {{ claim: sub }}, headers: false }}
clusters:
  app:
    endpoints:
      - address: \"{}\"
",
            echo.addr
        ),
    );
    let p = Portico::start_in(&dir, &yaml);
    let exp = now() + 600;
    let t = sign(
        &dir,
        &[
            ("ES256", "p256", None, serde_json::json!({"sub": "alice", "exp": exp, "n": 1})),
            ("ES256", "p256", None, serde_json::json!({"sub": "alice", "exp": exp, "n": 2})),
            ("ES256", "p256", None, serde_json::json!({"sub": "bob", "exp": exp})),
        ],
    );
    let url = p.url("/x");
    // Two tokens of alice share her bucket of 2; bob has his own.
    assert_eq!(bearer("--http1.1", &url, &t[0]).0, 200);
    let (status, headers, _) = bearer("--http2-prior-knowledge", &url, &t[1]);
    assert_eq!(status, 200);
    assert!(header_of(&headers, "ratelimit").is_empty(), "headers: false: {headers}");
    let (status, headers, _) = bearer("--http1.1", &url, &t[0]);
    assert_eq!(status, 429);
    assert!(header_of(&headers, "ratelimit")[0].starts_with("\"api\";r=0;t="), "a 429 has the fields: {headers}");
    assert_eq!(bearer("--http1.1", &url, &t[2]).0, 200);
    // Without a token the jwt filter refuses first: the limit never sees it.
    assert_eq!(curl_req("--http1.1", &url, &[]).0, 401);
}

#[test]
fn check_reports_jwt_and_rate_limit_mistakes_at_their_keys() {
    let base = "listeners: [ { name: web, address: 127.0.0.1:8080 } ]\nclusters:\n  app: { endpoints: [ { address: 127.0.0.1:9 } ] }\nroutes:\n  - cluster: app\n    filters:\n";
    check_fails_at(
        &format!("{base}      - jwt: {{ keys: [ {{ algorithm: ES256, public_key_file: nowhere.pem }} ] }}\n"),
        7..=7,
        "cannot read",
    );
    let dir = temp_dir();
    std::fs::write(dir.join("junk.pem"), "not a key\n").unwrap();
    let junk = dir.join("junk.pem").display().to_string();
    check_fails_at(
        &format!("{base}      - jwt: {{ keys: [ {{ algorithm: ES256, public_key_file: \"{junk}\" }} ] }}\n"),
        7..=7,
        "not a ES256 key",
    );
    check_fails_at(
        &format!("{base}      - jwt: {{ keys: [ {{ algorithm: none, secret: x }} ] }}\n"),
        7..=7,
        "unknown algorithm",
    );
    check_fails_at(&format!("{base}      - rate_limit: {{ rate: 10/fortnight }}\n"), 7..=7, "is not a period");
    check_fails_at(
        &format!("{base}      - rate_limit: {{ rate: 10/s, key: {{ cookie: x }} }}\n"),
        7..=7,
        "a key is `ip`",
    );
}
