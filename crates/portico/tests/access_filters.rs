//! The filters that decide who may pass, end to end through the binary with curl over HTTP/1.1 and cleartext
//! HTTP/2 (prior knowledge): `auth_basic` with password files written by `htpasswd` (bcrypt, APR1, SHA-1) and
//! the `argon2` tool, re-read on reload; `api_key` from the configuration, a key file, a header and a query
//! parameter; `ip` with allow and deny lists and `trusted_proxies`; `shadow: true` on each; their counters,
//! the access log's user, and `portico check`'s errors at the keys.

mod common;
use common::echo::*;
use common::*;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// (curl's protocol flag, the HTTP version curl reports for it).
const PROTOCOLS: [(&str, &str); 2] = [("--http1.1", "1.1"), ("--http2-prior-knowledge", "2")];

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

fn run(tool: &str, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new(tool)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{tool} {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

/// `user:hash` lines made by the real tools: bcrypt, APR1 and SHA-1 by `htpasswd`, argon2id by `argon2`.
fn htpasswd_lines() -> String {
    let mut text = String::new();
    for (flag, user, password) in [("-B", "alice", "wonder land"), ("-m", "bob", "b0b"), ("-s", "carol", "c:rol")] {
        text += run("htpasswd", &["-nb", flag, user, password], None).trim_end();
        text.push('\n');
    }
    let argon = run("argon2", &["saltysalt", "-id", "-e", "-t", "2", "-m", "12"], Some("dav3"));
    text += &format!("dave:{}\n", argon.trim());
    text
}

fn tools_for(test: &str) -> bool {
    have_tool("curl", test) && have_tool("htpasswd", test) && have_tool("argon2", test)
}

fn route_yaml(filters: &str, echo: SocketAddr) -> String {
    format!(
        "routes:\n  - name: private\n    match: {{ path_prefix: / }}\n    cluster: app\n    filters:\n{filters}clusters:\n  app:\n    endpoints:\n      - address: \"{echo}\"\n"
    )
}

fn post_reload(p: &Portico) -> (u16, String) {
    let mut admin = Conn::open(p.admin);
    admin.send(b"POST /admin/reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    let r = admin.read_response(false);
    (r.status, r.text())
}

fn denials(p: &Portico, route: &str, filter: &str, reason: &str, shadow: bool) -> f64 {
    p.metric(&format!(
        "portico_filter_denials_total{{route=\"{route}\",filter=\"{filter}\",reason=\"{reason}\",shadow=\"{shadow}\"}}"
    ))
}

#[test]
fn auth_basic_checks_htpasswd_and_argon2_users_and_rereads_the_file_on_reload() {
    let test = "auth_basic_checks_htpasswd_and_argon2_users_and_rereads_the_file_on_reload";
    if !tools_for(test) {
        return;
    }
    let echo = Echo::start("app");
    let dir = temp_dir();
    std::fs::write(dir.join("users.htpasswd"), htpasswd_lines()).unwrap();
    let yaml = config(
        "",
        &format!(
            "access_log: {{ path: access.log, format: json }}\n{}",
            route_yaml("      - auth_basic: { users_file: users.htpasswd, realm: Staff only }\n", echo.addr)
        ),
    );
    let p = Portico::start_in(&dir, &yaml);
    let url = p.url("/private/page?x=1");
    for (proto, _) in PROTOCOLS {
        // No credentials, a wrong password, an unknown user: 401 with the challenge, nothing upstream.
        for args in [&[][..], &["-u", "alice:wonderland"][..], &["-u", "mallory:wonder land"][..]] {
            let (status, headers, _) = curl_req(proto, &url, args);
            assert_eq!(status, 401, "{proto} {args:?}");
            assert!(headers.contains("www-authenticate: basic realm=\"staff only\""), "{proto}: {headers}");
        }
        // Each kind of hash, twice (the second time from the worker's verified set): the user goes upstream
        // in x-auth-user (the client's own value replaced), without the Authorization header.
        for (user, password) in [("alice", "wonder land"), ("bob", "b0b"), ("carol", "c:rol"), ("dave", "dav3")] {
            for _ in 0..2 {
                let creds = format!("{user}:{password}");
                let (status, _, body) = curl_req(proto, &url, &["-u", &creds, "-H", "x-auth-user: root"]);
                assert_eq!(status, 200, "{proto} {user}: {body}");
                let seen = Seen::parse(&body);
                assert_eq!(seen.all("x-auth-user"), vec![user.to_string()], "{proto}: {body}");
                assert!(seen.all("authorization").is_empty(), "{proto}: {body}");
            }
        }
    }
    assert_eq!(denials(&p, "private", "auth_basic", "missing", false), 2.0);
    assert_eq!(denials(&p, "private", "auth_basic", "invalid", false), 4.0);
    // The access log names the user (and never a password).
    let log = dir.join("access.log");
    wait_until("the access log's lines", Duration::from_secs(5), || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("\"user\":\"dave\""))
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("\"user\":\"alice\"") && text.contains("\"user\":null"), "{text}");
    assert!(!text.contains("wonder land") && !text.contains("dav3"), "{text}");

    // A reload reads the file again: bob is gone, erin is new.
    let lines: String = htpasswd_lines().lines().filter(|l| !l.starts_with("bob:")).map(|l| format!("{l}\n")).collect();
    let erin = run("htpasswd", &["-nbB", "erin", "3rin"], None);
    std::fs::write(dir.join("users.htpasswd"), format!("{lines}{}\n", erin.trim())).unwrap();
    assert_eq!(post_reload(&p).0, 200);
    for (proto, _) in PROTOCOLS {
        assert_eq!(curl_req(proto, &url, &["-u", "bob:b0b"]).0, 401, "{proto}");
        assert_eq!(curl_req(proto, &url, &["-u", "erin:3rin"]).0, 200, "{proto}");
    }
    // A file that is gone fails the reload at the key that names it, and the running users stay.
    std::fs::remove_file(dir.join("users.htpasswd")).unwrap();
    let (status, body) = post_reload(&p);
    assert_eq!(status, 422, "{body}");
    let line = yaml.lines().position(|l| l.contains("users_file")).unwrap() + 1;
    assert!(body.contains(&format!("{}:{line}:", p.config.display())), "{body}");
    assert!(body.contains("cannot read the password file"), "{body}");
    assert_eq!(curl_req("--http1.1", &url, &["-u", "erin:3rin"]).0, 200);
}

#[test]
fn auth_basic_can_forward_authorization_and_name_another_header() {
    if !have_tool("curl", "auth_basic_can_forward_authorization_and_name_another_header") {
        return;
    }
    let echo = Echo::start("app");
    let dir = temp_dir();
    // `htpasswd -nbs carol pw`: a fixed line, so this test needs no htpasswd.
    std::fs::write(dir.join("users"), "carol:{SHA}GpHWL3ymc5liWkNopqtdSjuqYHM=\n").unwrap();
    let filter = "      - auth_basic: { users_file: users, user_header: x-remote-user, forward_authorization: true }\n";
    let p = Portico::start_in(&dir, &config("", &route_yaml(filter, echo.addr)));
    for (proto, _) in PROTOCOLS {
        let (status, _, body) = curl_req(proto, &p.url("/"), &["-u", "carol:pw", "-H", "x_remote_user: forged"]);
        assert_eq!(status, 200, "{proto}: {body}");
        let seen = Seen::parse(&body);
        assert_eq!(seen.all("x-remote-user"), vec!["carol"], "{proto}: {body}");
        assert!(seen.all("x_remote_user").is_empty(), "{proto}: the underscore spelling is removed too: {body}");
        assert_eq!(seen.all("authorization"), vec!["Basic Y2Fyb2w6cHc="], "{proto}: {body}");
    }
}

#[test]
fn api_keys_from_the_config_and_a_file_in_a_header_or_the_query() {
    if !have_tool("curl", "api_keys_from_the_config_and_a_file_in_a_header_or_the_query") {
        return;
    }
    let echo = Echo::start("app");
    let dir = temp_dir();
    std::fs::write(dir.join("keys.txt"), "# name:key\nops:k-ops\n").unwrap();
    // The configuration holds the SHA-256 of "k-batch", as `printf k-batch | sha256sum` writes it.
    let sha = run("sha256sum", &[], Some("k-batch"));
    let sha = sha.split_whitespace().next().unwrap_or_default();
    let filter = format!(
        "      - api_key:\n          header: x-api-key\n          query: api_key\n          keys_file: keys.txt\n          keys:\n            - {{ name: mobile, secret: k-mobile }}\n            - {{ name: batch, sha256: {sha} }}\n"
    );
    let p = Portico::start_in(&dir, &config("", &route_yaml(&filter, echo.addr)));
    for (proto, _) in PROTOCOLS {
        for (key, name) in [("k-mobile", "mobile"), ("k-batch", "batch"), ("k-ops", "ops")] {
            let header = format!("x-api-key: {key}");
            let (status, _, body) =
                curl_req(proto, &p.url("/v1/things"), &["-H", &header, "-H", "x-api-key-name: root"]);
            assert_eq!(status, 200, "{proto} {key}: {body}");
            let seen = Seen::parse(&body);
            assert_eq!(seen.all("x-api-key-name"), vec![name.to_string()], "{proto}: {body}");
            assert!(seen.all("x-api-key").is_empty(), "{proto}: the key went upstream: {body}");
            // In the query, percent-encoded: it is read, and removed from what goes upstream.
            let url = p.url(&format!("/v1/things?a=1&api_key={}&b=2", key.replace('-', "%2D")));
            let (status, _, body) = curl_req(proto, &url, &[]);
            assert_eq!(status, 200, "{proto} {key} in the query: {body}");
            let seen = Seen::parse(&body);
            assert_eq!(seen.target, "/v1/things?a=1&b=2", "{proto}: {body}");
            assert_eq!(seen.all("x-api-key-name"), vec![name.to_string()], "{proto}: {body}");
        }
        let (status, _, body) = curl_req(proto, &p.url("/v1/things"), &["-H", "x-api-key: k-mobil"]);
        assert_eq!((status, body.trim()), (401, "a valid API key is required"), "{proto}");
        assert_eq!(curl_req(proto, &p.url("/v1/things?api_key="), &[]).0, 401, "{proto}");
        assert_eq!(curl_req(proto, &p.url("/v1/things"), &[]).0, 401, "{proto}");
    }
    assert_eq!(denials(&p, "private", "api_key", "invalid", false), 4.0);
    assert_eq!(denials(&p, "private", "api_key", "missing", false), 2.0);
    // A key file that is gone is an error at `keys_file` for `portico check`.
    std::fs::remove_file(dir.join("keys.txt")).unwrap();
    let text = std::fs::read_to_string(&p.config).unwrap();
    let line = text.lines().position(|l| l.contains("keys_file")).unwrap() + 1;
    check_fails_at(
        &text.replace("keys.txt", &dir.join("keys.txt").display().to_string()),
        line..=line,
        "cannot read the key file",
    );
}

#[test]
fn ip_lists_apply_to_the_peer_or_what_trusted_proxies_forward() {
    if !have_tool("curl", "ip_lists_apply_to_the_peer_or_what_trusted_proxies_forward") {
        return;
    }
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!(
            "routes:
  - name: loopback
    match: {{ path_prefix: /local/ }}
    cluster: app
    filters:
      - ip: {{ allow: [127.0.0.0/8, \"::1\"], deny: [127.0.0.2] }}
  - name: proxied
    match: {{ path_prefix: /proxied/ }}
    cluster: app
    filters:
      - ip: {{ allow: [203.0.113.0/24], trusted_proxies: [127.0.0.1, 10.0.0.0/8] }}
clusters:
  app:
    endpoints:
      - address: \"{}\"
",
            echo.addr
        ),
    );
    let p = Portico::start(&yaml);
    for (proto, _) in PROTOCOLS {
        assert_eq!(curl_req(proto, &p.url("/local/x"), &[]).0, 200, "{proto}");
        let (status, _, body) = curl_req(proto, &p.url("/local/x"), &["--interface", "127.0.0.2"]);
        assert_eq!((status, body.trim()), (403, "this client address is not allowed"), "{proto}");
        assert_eq!(curl_req(proto, &p.url("/local/x"), &["--interface", "127.0.0.3"]).0, 200, "{proto}");
        // From a trusted proxy: the rightmost address that is not a trusted proxy is the client.
        for (forwarded, status) in [
            ("203.0.113.5", 200),
            ("198.51.100.1, 203.0.113.5, 10.1.2.3", 200),
            ("203.0.113.5, 198.51.100.1", 403),
            ("unknown, 10.1.2.3", 403),
        ] {
            let header = format!("x-forwarded-for: {forwarded}");
            assert_eq!(curl_req(proto, &p.url("/proxied/x"), &["-H", &header]).0, status, "{proto} {forwarded}");
        }
        // No header: the trusted peer itself, not allowed.
        assert_eq!(curl_req(proto, &p.url("/proxied/x"), &[]).0, 403, "{proto}");
        // Not from a trusted proxy: its x-forwarded-for is not believed.
        let from_untrusted = ["--interface", "127.0.0.3", "-H", "x-forwarded-for: 203.0.113.5"];
        assert_eq!(curl_req(proto, &p.url("/proxied/x"), &from_untrusted).0, 403, "{proto}");
    }
    assert_eq!(denials(&p, "loopback", "ip", "denied", false), 2.0);
    assert_eq!(denials(&p, "proxied", "ip", "denied", false), 6.0);
    assert_eq!(denials(&p, "proxied", "ip", "unknown_client", false), 2.0);
}

#[test]
fn shadow_mode_counts_what_it_would_refuse_and_refuses_nothing() {
    if !have_tool("curl", "shadow_mode_counts_what_it_would_refuse_and_refuses_nothing") {
        return;
    }
    let echo = Echo::start("app");
    let dir = temp_dir();
    std::fs::write(dir.join("users"), "carol:{SHA}GpHWL3ymc5liWkNopqtdSjuqYHM=\n").unwrap();
    let filters = "      - ip: { deny: [127.0.0.0/8], shadow: true }
      - auth_basic: { users_file: users, shadow: true }
      - api_key: { keys: [ { name: mobile, secret: k-mobile } ], shadow: true }
";
    let p = Portico::start_in(&dir, &config("", &route_yaml(filters, echo.addr)));
    for (proto, _) in PROTOCOLS {
        let forged = ["-H", "x-auth-user: root", "-H", "x-api-key-name: root"];
        let (status, _, body) = curl_req(proto, &p.url("/"), &forged);
        assert_eq!(status, 200, "{proto}: {body}");
        let seen = Seen::parse(&body);
        assert!(seen.all("x-auth-user").is_empty() && seen.all("x-api-key-name").is_empty(), "{proto}: {body}");
        // What would pass still passes as it would: with the user and the key's name.
        let (status, _, body) = curl_req(proto, &p.url("/"), &["-u", "carol:pw", "-H", "x-api-key: k-mobile"]);
        assert_eq!(status, 200, "{proto}: {body}");
        let seen = Seen::parse(&body);
        assert_eq!(
            (seen.all("x-auth-user"), seen.all("x-api-key-name")),
            (vec!["carol".into()], vec!["mobile".into()])
        );
    }
    assert_eq!(denials(&p, "private", "ip", "denied", true), 4.0);
    assert_eq!(denials(&p, "private", "auth_basic", "missing", true), 2.0);
    assert_eq!(denials(&p, "private", "api_key", "missing", true), 2.0);
    assert_eq!(denials(&p, "private", "ip", "denied", false), 0.0);
}

#[test]
fn check_reports_access_filter_mistakes_at_their_keys() {
    let base = "listeners: [ { name: web, address: 127.0.0.1:8080 } ]\nclusters:\n  app: { endpoints: [ { address: 127.0.0.1:9 } ] }\nroutes:\n  - cluster: app\n    filters:\n";
    check_fails_at(
        &format!("{base}      - auth_basic: {{ users_file: nowhere.htpasswd }}\n"),
        7..=7,
        "cannot read the password file",
    );
    let dir = temp_dir();
    let bad = dir.join("bad.htpasswd");
    std::fs::write(&bad, "alice:plaintext\n").unwrap();
    let text = check_fails_at(
        &format!("{base}      - auth_basic: {{ users_file: \"{}\" }}\n", bad.display()),
        7..=7,
        "unknown hash",
    );
    assert!(text.contains("bad.htpasswd:1:"), "{text}");
    check_fails_at(&format!("{base}      - ip: {{ allow: [10.0.0.0/40] }}\n"), 7..=7, "not an address range");
    check_fails_at(&format!("{base}      - api_key: {{ keys: [ {{ name: a }} ] }}\n"), 7..=7, "exactly one of");
    let ok = Path::new(&bad).with_file_name("ok.htpasswd");
    std::fs::write(&ok, "carol:{SHA}GpHWL3ymc5liWkNopqtdSjuqYHM=\n").unwrap();
    let (passed, text, _) = check(&format!("{base}      - auth_basic: {{ users_file: \"{}\" }}\n", ok.display()));
    assert!(passed, "{text}");
}
