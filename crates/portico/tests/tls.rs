//! TLS termination on listeners, with real clients (curl and rustls): SNI, versions, mutual TLS, reloads that
//! swap certificates without touching open connections, and bad input of every kind.

mod common;
use common::pki::{self, Ca, Issued};
use common::*;
use portico_testkit::Backend;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A TLS listener in front of one backend; `tls` is the YAML inside `tls:`.
fn tls_yaml(backend: SocketAddr, tls: &str) -> String {
    format!(
        "workers: 2\nwatch: true\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: secure\n    address: \"{{listen}}\"\n    tls:\n{tls}\nroutes:\n  - match: {{ path_prefix: / }}\n    cluster: app\nclusters:\n  app:\n    endpoints:\n      - address: \"{backend}\"\n"
    )
}

fn pair(c: &Issued) -> String {
    format!("{{ cert: \"{}\", key: \"{}\" }}", c.cert.display(), c.key.display())
}

/// curl over TLS to `name` (resolved to Portico's address); returns (ok, stdout, stderr).
fn curl_tls(p: &Portico, name: &str, ca: &Path, extra: &[&str], path: &str) -> (bool, String, String) {
    let url = format!("https://{name}:{}{path}", p.addr.port());
    let resolve = format!("{name}:{}:127.0.0.1", p.addr.port());
    let out = Command::new("curl")
        .args(["-sS", "-v", "--max-time", "10", "--cacert"])
        .arg(ca)
        .args(["--resolve", &resolve])
        .args(extra)
        .arg(&url)
        .output()
        .expect("curl is installed");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn echo_header(json: &str, name: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("not JSON ({e}): {json}"));
    v["headers"].as_array()?.iter().find_map(|h| (h[0] == name).then(|| h[1].as_str().unwrap_or("").to_string()))
}

#[test]
fn https_requests_are_proxied_over_keep_alive_tls() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&tls_yaml(b.addr, &format!("      certificates: [{}]", pair(&site))));

    // curl, HTTP/1.1 over TLS 1.3 and over TLS 1.2.
    for versions in [&["--tlsv1.3"][..], &["--tlsv1.2", "--tls-max", "1.2"][..]] {
        let (ok, body, err) = curl_tls(&p, "localhost", &ca.pem, versions, "/echo");
        assert!(ok, "curl {versions:?} failed: {err}");
        assert_eq!(echo_header(&body, "x-forwarded-proto").as_deref(), Some("https"), "{body}");
        assert!(err.contains("ALPN: server accepted h2"), "{err}");
    }

    // One keep-alive TLS connection: small and large responses, uploads, all intact.
    let stream = pki::connect(p.addr, "localhost", &ca.pem, None, &["http/1.1"]).unwrap();
    assert_eq!(stream.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    let mut conn = Conn::from_stream(stream);
    for i in 0..200 {
        let r = conn.get("/", "");
        assert_eq!(r.status, 200, "request {i}");
    }
    let big = conn.get("/bytes/3000000", "");
    assert_eq!(big.body.len(), 3_000_000);
    let chunked = conn.get("/bytes/500000?chunked", "");
    assert_eq!(chunked.body.len(), 500_000);
    let body = vec![b'u'; 1_000_000];
    conn.send(format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
    conn.stream.write_all(&body).unwrap();
    let r = conn.read_response(false);
    assert_eq!(r.text(), format!("1000000 {}", portico_testkit::body_hash(&body)));
    // The upstream side stays plain and pooled.
    assert!(b.connections() <= 4, "opened {} upstream connections", b.connections());
    assert!(p.metric("portico_tls_handshakes_total{listener=\"secure\",result=\"ok\"}") >= 3.0);
    let metrics = p.admin_get("/metrics").text();
    let expiry: f64 = metrics
        .lines()
        .find(|l| l.starts_with("portico_tls_certificate_expiry_timestamp_seconds{listener=\"secure\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no expiry metric: {metrics}"));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(expiry > now + 86_400.0, "expiry {expiry} is not in the future");
}

#[test]
fn sni_picks_the_certificate_and_unknown_names_get_the_default() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let fallback = ca.server(&dir, "fallback", "fallback", &["fallback.test"]);
    let site = ca.server(&dir, "site", "site", &["localhost", "*.example.test"]);
    let other = ca.server(&dir, "other", "other", &["other.test"]);
    let b = Backend::start("b0").unwrap();
    let certs = format!(
        "      certificates:\n        - {}\n        - {}\n        - {{ cert: \"{}\", key: \"{}\", default: true }}",
        pair(&site),
        pair(&other),
        fallback.cert.display(),
        fallback.key.display()
    );
    let p = Portico::start(&tls_yaml(b.addr, &certs));
    for (name, expected) in [
        ("localhost", &site),
        ("api.example.test", &site),
        ("API.Example.Test", &site),
        ("other.test", &other),
        ("fallback.test", &fallback),
    ] {
        let stream = pki::connect(p.addr, name, &ca.pem, None, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(pki::served_leaf(&stream) == expected.der, "{name} got the wrong certificate");
    }
    // A name no certificate covers gets the default one (and the client rightly refuses it).
    let err = pki::connect(p.addr, "unknown.test", &ca.pem, None, &[]).map(|_| ()).expect_err("name mismatch");
    assert!(err.to_string().contains("only valid for DnsName(\"fallback.test\")"), "{err}");
    // Without SNI (an IP address), the default one too: curl names it in its verbose output.
    let url = format!("https://127.0.0.1:{}/", p.addr.port());
    let out = Command::new("curl").args(["-sS", "-v", "-k", "--max-time", "10", &url]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("CN=fallback"), "{err}");
}

#[test]
fn min_version_refuses_older_clients_and_failed_handshakes_are_counted() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let b = Backend::start("b0").unwrap();
    let tls =
        format!("      certificates: [{}]\n      min_version: \"1.3\"\n      handshake_timeout: 300ms", pair(&site));
    let p = Portico::start(&tls_yaml(b.addr, &tls));
    let (ok, _, err) = curl_tls(&p, "localhost", &ca.pem, &["--tlsv1.2", "--tls-max", "1.2"], "/");
    assert!(!ok, "TLS 1.2 was accepted: {err}");
    let (ok, _, err) = curl_tls(&p, "localhost", &ca.pem, &["--tlsv1.3"], "/");
    assert!(ok, "{err}");

    // Plain HTTP on the TLS port: refused and closed, nothing proxied.
    let (answer, closed) = raw_exchange(p.addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert!(closed, "connection left open");
    assert!(!answer.contains("200"), "{answer}");
    // A client that says nothing is cut off after handshake_timeout.
    let mut silent = Conn::open(p.addr);
    std::thread::sleep(Duration::from_millis(600));
    assert!(silent.is_closed(), "a silent client kept its connection past handshake_timeout");

    wait_until("handshake failures counted", Duration::from_secs(5), || {
        p.metric("portico_tls_handshakes_total{listener=\"secure\",result=\"failed\"}") >= 2.0
            && p.metric("portico_tls_handshakes_total{listener=\"secure\",result=\"timeout\"}") >= 1.0
    });
    assert_eq!(b.requests(), 1, "only the TLS 1.3 request reached the backend");
}

/// Sends a GET and reads the first bytes of the answer: `None` when the server refused (alert or close).
fn answered(mut stream: pki::TlsStream) -> Option<usize> {
    use std::io::Read;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").ok()?;
    let mut buf = [0u8; 64];
    stream.read(&mut buf).ok().filter(|&n| n > 0)
}

#[test]
fn mutual_tls_verifies_clients_and_passes_the_subject_upstream() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let client_ca = Ca::new(&dir, "client-ca");
    let stranger_ca = Ca::new(&dir, "stranger-ca");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let alice = client_ca.client(&dir, "alice", "alice");
    let mallory = stranger_ca.client(&dir, "mallory", "mallory");
    let b = Backend::start("b0").unwrap();
    let tls = |auth: &str| {
        format!(
            "      certificates: [{}]\n      client_ca: \"{}\"\n      client_auth: {auth}",
            pair(&site),
            client_ca.pem.display()
        )
    };
    let p = Portico::start(&tls_yaml(b.addr, &tls("required")));
    let spoof = "x-client-cert-subject: CN=admin\r\n";

    let stream = pki::connect(p.addr, "localhost", &ca.pem, Some(&alice), &[]).unwrap();
    let mut conn = Conn::from_stream(stream);
    let r = conn.get("/echo", spoof);
    assert_eq!(r.status, 200);
    let subject = echo_header(&r.text(), "x-client-cert-subject").expect("subject passed upstream");
    assert!(subject.contains("CN=alice") && subject.contains("O=Portico Tests"), "{subject}");
    assert!(!r.text().contains("CN=admin"), "the client's own header went upstream: {}", r.text());

    // No certificate, or one from another CA: refused during the handshake (TLS 1.3 reports it on first use).
    for (who, cert) in [("anonymous", None), ("mallory", Some(&mallory))] {
        let refused = pki::connect(p.addr, "localhost", &ca.pem, cert, &[]).map(answered);
        assert!(!refused.is_ok_and(|n| n.is_some_and(|n| n > 0)), "{who} was let in");
    }

    // Optional: anonymous clients get in, without a subject, and still cannot forge one.
    p.rewrite_config(&tls_yaml(b.addr, &tls("optional")));
    wait_until("reload to optional client auth", Duration::from_secs(10), || {
        pki::connect(p.addr, "localhost", &ca.pem, None, &[]).is_ok_and(|s| answered(s).is_some_and(|n| n > 0))
    });
    let stream = pki::connect(p.addr, "localhost", &ca.pem, None, &[]).unwrap();
    let r = Conn::from_stream(stream).get("/echo", spoof);
    assert_eq!(echo_header(&r.text(), "x-client-cert-subject"), None, "{}", r.text());
    // A certificate from an unknown CA is still refused.
    let refused = pki::connect(p.addr, "localhost", &ca.pem, Some(&mallory), &[]).map(answered);
    assert!(!refused.is_ok_and(|n| n.is_some_and(|n| n > 0)), "mallory was let in");
}

#[test]
fn renewed_certificates_are_served_to_new_connections_while_open_ones_continue() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    // Relative paths start at the configuration file's directory.
    let first = ca.server(&dir, "site", "first", &["localhost"]);
    let b = Backend::start("b0").unwrap();
    let p = Portico::start_in(&dir, &tls_yaml(b.addr, "      certificates: [{ cert: site.pem, key: site.key }]"));
    let stream = pki::connect(p.addr, "localhost", &ca.pem, None, &[]).unwrap();
    assert!(pki::served_leaf(&stream) == first.der);
    let mut open = Conn::from_stream(stream);
    assert_eq!(open.get("/", "").status, 200);

    // Renewal: new files in place; `watch: true` notices without a signal.
    std::thread::sleep(Duration::from_millis(1100)); // a visibly newer modification time
    let renewed = ca.server(&dir, "site", "renewed", &["localhost"]);
    wait_until("the renewed certificate is served", Duration::from_secs(10), || {
        pki::connect(p.addr, "localhost", &ca.pem, None, &[]).is_ok_and(|s| pki::served_leaf(&s) == renewed.der)
    });
    for _ in 0..20 {
        assert_eq!(open.get("/", "").status, 200, "the open connection broke on reload");
    }

    // A broken renewal (a key that does not match) is refused; the running certificate stays.
    let failures = p.metric("portico_reload_failures_total");
    let stray = ca.server(&dir, "stray", "stray", &["localhost"]);
    std::fs::copy(&stray.key, dir.join("site.key")).unwrap();
    wait_until("the bad reload is refused", Duration::from_secs(10), || {
        p.metric("portico_reload_failures_total") > failures
    });
    let s = pki::connect(p.addr, "localhost", &ca.pem, None, &[]).unwrap();
    assert!(pki::served_leaf(&s) == renewed.der);
    assert_eq!(Conn::from_stream(s).get("/", "").status, 200);
    let last = p.admin_get("/admin/reload").text();
    assert!(last.contains("does not belong to the certificate"), "{last}");
}

#[test]
fn bad_tls_settings_are_reported_with_their_position() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let other = ca.server(&dir, "other", "other", &["localhost"]);
    let check = |tls: &str| {
        let path = dir.join("check.yaml");
        std::fs::write(
            &path,
            tls_yaml("127.0.0.1:9".parse().unwrap(), tls)
                .replace("{listen}", "127.0.0.1:1")
                .replace("{admin}", "127.0.0.1:2"),
        )
        .unwrap();
        let out = Command::new(portico_bin()).args(["check", "-c"]).arg(&path).output().unwrap();
        assert!(!out.status.success(), "accepted: {tls}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = check("      certificates: [{ cert: missing.pem, key: site.key }]");
    assert!(err.contains("check.yaml:8:") && err.contains("cannot read") && err.contains("missing.pem"), "{err}");
    let err = check(&format!(
        "      certificates: [{{ cert: \"{}\", key: \"{}\" }}]",
        site.cert.display(),
        other.key.display()
    ));
    assert!(err.contains("check.yaml:8:") && err.contains("does not belong"), "{err}");
    let err = check(&format!(
        "      certificates: [{{ cert: \"{}\", key: \"{}\" }}]",
        site.key.display(),
        site.key.display()
    ));
    assert!(err.contains("holds no PEM certificate"), "{err}");
    let err = check(&format!("      certificates: [{}]\n      client_auth: optional", pair(&site)));
    assert!(err.contains("client_auth without client_ca"), "{err}");
    let err = check(&format!(
        "      certificates: [{}]\n      client_ca: \"{}\"\n      client_cert_header: Content-Length",
        pair(&site),
        ca.pem.display()
    ));
    assert!(err.contains("manages"), "{err}");
    let no_tls = tls_yaml("127.0.0.1:9".parse().unwrap(), "      certificates: [{ cert: a.pem, key: a.key }]")
        .replace("    tls:\n      certificates: [{ cert: a.pem, key: a.key }]\n", "")
        .replace("    cluster: app\n", "    cluster: app\n    redirect_https: true\n")
        .replace("{listen}", "127.0.0.1:1")
        .replace("{admin}", "127.0.0.1:2");
    let path = dir.join("no-tls.yaml");
    std::fs::write(&path, no_tls).unwrap();
    let out = Command::new(portico_bin()).args(["check", "-c"]).arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no listener has `tls:`"), "{err}");
    let encrypted = dir.join("encrypted.key");
    std::fs::write(&encrypted, "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n")
        .unwrap();
    let err = check(&format!(
        "      certificates: [{{ cert: \"{}\", key: \"{}\" }}]",
        site.cert.display(),
        encrypted.display()
    ));
    assert!(err.contains("encrypted private key") && err.contains("openssl pkey"), "{err}");
    let err = check("      certificates: []");
    assert!(err.contains("at least one certificate"), "{err}");
    let err = check(&format!("      certificates: [{}]\n      min_version: \"1.1\"", pair(&site)));
    assert!(err.contains("check.yaml:9:") && err.contains("1.1"), "{err}");
}

#[test]
fn a_tls_client_that_stops_reading_is_let_go_after_the_send_timeout() {
    // Review finding: closing a TLS connection flushed the session's pending records with no deadline, so a
    // client that stopped reading held its connection (and a connection slot) forever.
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let b = Backend::start("b0").unwrap();
    let yaml = tls_yaml(b.addr, &format!("      certificates: [{}]", pair(&site)))
        .replace("workers: 2", "workers: 1")
        .replace("    tls:\n", "    timeouts: { send: 500ms }\n    limits: { max_connections: 1 }\n    tls:\n");
    let p = Portico::start(&yaml);
    let mut stuck = pki::connect(p.addr, "localhost", &ca.pem, None, &[]).unwrap();
    stuck.write_all(b"GET /bytes/200000000 HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // The only connection slot is taken until Portico gives up on the stuck client.
    wait_until("the stuck client's slot is freed", Duration::from_secs(10), || {
        pki::connect(p.addr, "localhost", &ca.pem, None, &[]).is_ok_and(|s| answered(s).is_some())
    });
    drop(stuck);
}

#[test]
fn connection_close_over_tls_ends_with_close_notify() {
    // Review finding: a client that asked to close got a TCP FIN without close_notify, so it could not tell a
    // complete response from a truncated one.
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let b = Backend::start("b0").unwrap();
    let p = Portico::start(&tls_yaml(b.addr, &format!("      certificates: [{}]", pair(&site))));
    for request in
        [&b"GET /bytes/5000 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"[..], b"GET /bytes/5000 HTTP/1.0\r\n\r\n"]
    {
        let mut s = pki::connect(p.addr, "localhost", &ca.pem, None, &[]).unwrap();
        s.write_all(request).unwrap();
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut s, &mut all).expect("a clean TLS close");
        assert!(all.starts_with(b"HTTP/1.1 200") && all.len() > 5000, "{}", String::from_utf8_lossy(&all));
    }
}

#[test]
fn the_client_certificate_header_cannot_be_forged_through_any_listener() {
    // Review finding: the header was only removed on the mutual-TLS listener itself, so a plain listener in
    // front of the same cluster let a client send it.
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let clients = Ca::new(&dir, "clients");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let b = Backend::start("b0").unwrap();
    let plain_port = free_port();
    let tls = format!("      certificates: [{}]\n      client_ca: \"{}\"", pair(&site), clients.pem.display());
    let yaml = tls_yaml(b.addr, &tls)
        .replace("routes:", &format!("  - name: plain\n    address: \"127.0.0.1:{plain_port}\"\nroutes:"));
    let _p = Portico::start(&yaml);
    let mut conn = Conn::open(format!("127.0.0.1:{plain_port}").parse().unwrap());
    for forged in ["x-client-cert-subject: CN=admin\r\n", "X_Client_Cert_Subject: CN=root\r\n"] {
        let r = conn.get("/echo", forged);
        assert_eq!(r.status, 200);
        assert!(!r.text().contains("CN="), "a forged subject reached the upstream: {}", r.text());
    }
}

#[test]
fn watch_follows_a_config_that_moves_to_new_certificate_files() {
    // Review finding: with the old files gone for good, `watch` waited for them forever.
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    ca.server(&dir, "site-2026", "old", &["localhost"]);
    let b = Backend::start("b0").unwrap();
    let p =
        Portico::start_in(&dir, &tls_yaml(b.addr, "      certificates: [{ cert: site-2026.pem, key: site-2026.key }]"));
    let next = ca.server(&dir, "site-2027", "new", &["localhost"]);
    std::fs::remove_file(dir.join("site-2026.pem")).unwrap();
    std::fs::remove_file(dir.join("site-2026.key")).unwrap();
    p.rewrite_config(&tls_yaml(b.addr, "      certificates: [{ cert: site-2027.pem, key: site-2027.key }]"));
    wait_until("the new files are served", Duration::from_secs(10), || {
        pki::connect(p.addr, "localhost", &ca.pem, None, &[]).is_ok_and(|s| pki::served_leaf(&s) == next.der)
    });
}

#[test]
fn plain_http_clients_are_redirected_to_https_by_route() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let site = ca.server(&dir, "site", "site", &["localhost"]);
    let b = Backend::start("b0").unwrap();
    let plain_port = free_port();
    let yaml = tls_yaml(b.addr, &format!("      certificates: [{}]", pair(&site)))
        .replace("routes:", &format!("  - name: plain\n    address: \"127.0.0.1:{plain_port}\"\nroutes:"))
        .replace("    cluster: app\n", "    cluster: app\n    redirect_https: true\n")
        .replace("routes:\n", "routes:\n  - match: { path_prefix: /legacy/ }\n    cluster: app\n    redirect_https: { port: 443, status: 302 }\n");
    let p = Portico::start(&yaml);
    let plain: SocketAddr = format!("127.0.0.1:{plain_port}").parse().unwrap();
    let mut conn = Conn::open(plain);
    let r = conn.get("/path/x?q=1", "");
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some(format!("https://test.local:{}/path/x?q=1", p.addr.port())));
    conn.send(b"POST /form HTTP/1.1\r\nHost: shop.example:8080\r\nContent-Length: 3\r\n\r\nabc");
    let r = conn.read_response(false);
    assert_eq!(r.status, 308, "a POST keeps its method and body");
    assert_eq!(r.header("location"), Some(format!("https://shop.example:{}/form", p.addr.port())));
    let r = conn.get("/legacy/a", "");
    assert_eq!((r.status, r.header("location").as_deref()), (302, Some("https://test.local/legacy/a")));
    // HTTP/2 in cleartext is redirected the same way; over TLS the route is proxied.
    let (ok, out) = curl(&[
        "--http2-prior-knowledge",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{redirect_url}",
        &format!("http://127.0.0.1:{plain_port}/h2"),
    ]);
    assert!(ok && out.starts_with("301 https://127.0.0.1:"), "{out}");
    let (ok, body, err) = curl_tls(&p, "localhost", &ca.pem, &[], "/echo");
    assert!(ok && body.contains("\"backend\":\"b0\""), "{err}");
    assert_eq!(b.requests(), 1, "only the HTTPS request was proxied");
}

#[test]
fn check_warns_about_expired_certificates() {
    let dir = temp_dir();
    let ca = Ca::new(&dir, "ca");
    let old = ca.server(&dir, "old", "expired-site", &["localhost"]);
    let path = dir.join("expired.yaml");
    let yaml = tls_yaml("127.0.0.1:9".parse().unwrap(), &format!("      certificates: [{}]", pair(&old)))
        .replace("{listen}", "127.0.0.1:1")
        .replace("{admin}", "127.0.0.1:2");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(portico_bin()).args(["check", "-c"]).arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "an expired certificate is served with a warning, not refused");
    assert!(text.contains("warning:") && text.contains("old.pem") && text.contains("expired"), "{text}");
}
