//! The gateway filters `compress` (zstd, br, gzip), `decompress`, `query` and `limits` end to end, through the
//! binary over HTTP/1.1 and cleartext HTTP/2: compressed bodies decoded by real decoders (curl `--compressed`,
//! Python's gzip, the `brotli` and `zstandard` packages from PyPI), upstream bodies made by real encoders,
//! query edits seen by a real upstream, limits hit and not hit (declared, chunked and streamed bodies, JSON
//! depth, connections and slow connections per address), shadow mode and the denials metric.

mod common;
use bytes::Bytes;
use common::echo::*;
use common::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn venv_python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-tools/venv/bin/python")
}

/// Whether the venv has Python's brotli and zstandard packages; says SKIPPED (fails under CI) otherwise.
fn have_codecs(test: &str) -> bool {
    let ok = std::process::Command::new(venv_python())
        .args(["-c", "import brotli, zstandard"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip_outside_ci(test, "brotli and zstandard are not in target/test-tools/venv (`bash .ci/install-test-deps`)");
    }
    ok
}

/// `data` through a Python expression over `d` (the input bytes), e.g. `gzip.decompress(d)`.
fn python(expr: &str, data: &[u8]) -> Result<Vec<u8>, String> {
    let code =
        format!("import sys, gzip, brotli, zstandard\nd = sys.stdin.buffer.read()\nsys.stdout.buffer.write({expr})");
    let mut child = std::process::Command::new(venv_python())
        .args(["-c", &code])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python");
    let mut stdin = child.stdin.take().unwrap();
    let input = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    let _ = writer.join();
    match out.status.success() {
        true => Ok(out.stdout),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// Decodes `data` with the real decoder of `coding`.
fn decode(coding: &str, data: &[u8]) -> Vec<u8> {
    let expr = match coding {
        "gzip" => "gzip.decompress(d)",
        "br" => "brotli.decompress(d)",
        // A streamed response has no content size in its frame header: decode it as a stream.
        "zstd" => "zstandard.ZstdDecompressor().decompressobj().decompress(d)",
        other => panic!("{other}"),
    };
    python(expr, data).unwrap_or_else(|e| panic!("{coding}: not decodable ({} bytes): {e}", data.len()))
}

fn encode(coding: &str, data: &[u8]) -> Vec<u8> {
    let expr = match coding {
        "gzip" => "gzip.compress(d)",
        "br" => "brotli.compress(d)",
        "zstd" => "zstandard.ZstdCompressor().compress(d)",
        other => panic!("{other}"),
    };
    python(expr, data).unwrap()
}

fn json_payload(n: usize) -> Vec<u8> {
    let mut out = b"[".to_vec();
    let mut i = 0;
    while out.len() < n {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(
            format!("{{\"id\":{i},\"name\":\"user {}\",\"active\":{}}}", i * 7 % 1000, i % 2 == 0).as_bytes(),
        );
        i += 1;
    }
    out.push(b']');
    out
}

#[test]
fn compress_picks_zstd_br_or_gzip_and_real_decoders_read_them() {
    if !have_codecs("compress_picks_zstd_br_or_gzip_and_real_decoders_read_them") {
        return;
    }
    let dir = temp_dir();
    std::fs::write(dir.join("data.json"), json_payload(64 * 1024)).unwrap();
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!(
            "routes:
  - match: {{ path_prefix: /api }}
    cluster: app
    filters: [ {{ compress: {{ brotli_level: 5, zstd_level: 6 }} }} ]
  - match: {{ path: /data.json }}
    static: {{ file: data.json }}
    filters: [ {{ compress: {{}} }} ]
  - match: {{ path: /gzip-first.json }}
    static: {{ file: data.json }}
    filters: [ {{ compress: {{ encodings: [gzip, br] }} }} ]
clusters:
  app:
    endpoints: [ {{ address: \"{}\" }} ]
",
            echo.addr
        ),
    );
    let p = Portico::start_in(&dir, &yaml);
    let plain = std::fs::read(dir.join("data.json")).unwrap();
    let pad = "p".repeat(3000);
    for proto in BOTH {
        for (accept, coding) in [
            ("gzip", "gzip"),
            ("br", "br"),
            ("zstd", "zstd"),
            ("gzip, deflate, br, zstd", "zstd"),
            ("br;q=0.9, zstd;q=0.5, gzip;q=0.1", "br"),
            ("zstd;q=0, *", "br"),
        ] {
            let r = request(p.addr, proto, "GET", "t", "/api/x", &[("accept-encoding", accept), ("x-pad", &pad)], b"");
            assert_eq!(r.header("content-encoding").as_deref(), Some(coding), "{proto:?} {accept}: {r:?}");
            assert_eq!(r.tokens("vary"), vec!["accept-encoding"], "{proto:?}");
            assert_eq!(r.header("content-length"), None, "{proto:?}");
            let text = String::from_utf8(decode(coding, &r.body)).unwrap();
            assert!(text.starts_with("GET /api/x\n") && text.contains(&pad), "{proto:?} {accept}: {text}");
            assert!(r.body.len() < text.len() / 4, "{proto:?} {coding}: {} -> {}", text.len(), r.body.len());

            let r = request(p.addr, proto, "GET", "t", "/data.json", &[("accept-encoding", accept)], b"");
            assert_eq!(r.header("content-encoding").as_deref(), Some(coding), "{proto:?} {accept}");
            assert!(decode(coding, &r.body) == plain, "{proto:?} {coding}: the body differs after decoding");
        }
        // The server's order among equal q-values.
        let r = request(p.addr, proto, "GET", "t", "/gzip-first.json", &[("accept-encoding", "br, gzip, zstd")], b"");
        assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"), "{proto:?}");
        assert!(decode("gzip", &r.body) == plain);
    }
    // curl --compressed (it offers deflate, gzip, br, zstd here) over both protocols.
    let url = p.url("/data.json");
    for args in [vec!["--compressed", &url[..]], vec!["--compressed", "--http2-prior-knowledge", &url[..]]] {
        let (ok, body) = curl(&args);
        assert!(ok && body.as_bytes() == &plain[..], "curl {args:?}: {} bytes", body.len());
        let (ok, head) = curl(&[&args[..], &["-o", "/dev/null", "-D", "-"]].concat());
        assert!(ok && head.to_ascii_lowercase().contains("content-encoding: zstd"), "curl {args:?}: {head}");
    }
}

#[test]
fn compress_streams_each_coding_piece_by_piece() {
    if !have_codecs("compress_streams_each_coding_piece_by_piece") {
        return;
    }
    // A handler body sent slowly: each coding flushes what it has when the source pauses, so the client
    // decodes the first piece before the last is sent.
    let p = Portico::start(&config(
        "",
        "routes:\n  - match: { path_prefix: /echo }\n    handler: echo\n    filters: [ { compress: { types: [text/plain] } } ]\n",
    ));
    for coding in ["gzip", "br", "zstd"] {
        let mut conn = std::net::TcpStream::connect(p.addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let first = "first piece ".repeat(200);
        let head = format!(
            "POST /echo/s HTTP/1.1\r\nHost: t\r\nAccept-Encoding: {coding}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n",
            first.len()
        );
        conn.write_all(head.as_bytes()).unwrap();
        // Read until the compressed first piece has arrived (the request is still open).
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 65536];
        let body_start = loop {
            use std::io::Read;
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0, "{coding}: closed");
            got.extend_from_slice(&buf[..n]);
            if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            assert!(std::time::Instant::now() < deadline);
        };
        let head_text = String::from_utf8_lossy(&got[..body_start]).to_ascii_lowercase();
        assert!(head_text.contains(&format!("content-encoding: {coding}")), "{coding}: {head_text}");
        // Chunks so far: decode them with a streaming decoder, which must yield the first piece.
        let mut chunked = got[body_start..].to_vec();
        let decoded = loop {
            let data = dechunk(&chunked);
            let expr = match coding {
                "gzip" => "__import__('zlib').decompressobj(31).decompress(d)",
                "br" => "brotli.Decompressor().process(d)",
                _ => "zstandard.ZstdDecompressor().decompressobj().decompress(d)",
            };
            let out = python(expr, &data).unwrap_or_default();
            if String::from_utf8_lossy(&out).contains("first piece first piece") {
                break out;
            }
            use std::io::Read;
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0 && std::time::Instant::now() < deadline, "{coding}: the first piece never came out");
            chunked.extend_from_slice(&buf[..n]);
        };
        assert!(String::from_utf8_lossy(&decoded).contains("POST /echo/s"), "{coding}");
        conn.write_all(b"4\r\nlast\r\n0\r\n\r\n").unwrap();
    }
}

/// The data of complete chunks in `raw` (an HTTP/1.1 chunked body, possibly cut short).
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = raw.windows(2).position(|w| w == b"\r\n") {
        let Ok(size) = usize::from_str_radix(std::str::from_utf8(&raw[..end]).unwrap_or("x").trim(), 16) else {
            break;
        };
        if size == 0 || raw.len() < end + 2 + size + 2 {
            break;
        }
        out.extend_from_slice(&raw[end + 2..end + 2 + size]);
        raw = &raw[end + 2 + size + 2..];
    }
    out
}

#[test]
fn decompress_decodes_for_clients_that_cannot_and_cuts_off_bombs() {
    if !have_codecs("decompress_decodes_for_clients_that_cannot_and_cuts_off_bombs") {
        return;
    }
    let dir = temp_dir();
    let plain = json_payload(200 * 1024);
    let mut files = String::new();
    for coding in ["gzip", "br", "zstd"] {
        std::fs::write(dir.join(format!("data.{coding}")), encode(coding, &plain)).unwrap();
        std::fs::write(dir.join(format!("bomb.{coding}")), encode(coding, &vec![0u8; 16 << 20])).unwrap();
        for what in ["data", "bomb"] {
            files += &format!(
                "  - match: {{ path: /files/{what}.{coding} }}\n    static: {{ file: {what}.{coding}, headers: {{ content-type: application/json, content-encoding: {coding}, etag: '\"e1\"' }} }}\n"
            );
        }
    }
    // The upstream is Portico itself: /files/* answers compressed bodies, as an upstream that always
    // compresses; /up/* proxies to it through `decompress`.
    let yaml = config(
        "",
        &format!(
            "routes:
  - match: {{ path_prefix: /up }}
    cluster: self
    filters: [ {{ rewrite: {{ strip_prefix: /up }} }}, {{ decompress: {{ max_size: 1MiB }} }} ]
  - match: {{ path_prefix: /regzip }}
    cluster: self
    filters: [ {{ rewrite: {{ strip_prefix: /regzip }} }}, {{ decompress: {{}} }}, {{ compress: {{ encodings: [gzip] }} }} ]
{files}clusters:
  self:
    endpoints: [ {{ address: \"{{listen}}\" }} ]
"
        ),
    );
    let p = Portico::start_in(&dir, &yaml);
    for proto in BOTH {
        for coding in ["gzip", "br", "zstd"] {
            let path = format!("/up/files/data.{coding}");
            for accept in [None, Some("identity"), Some("deflate")] {
                let headers: Vec<(&str, &str)> = accept.map(|a| ("accept-encoding", a)).into_iter().collect();
                let r = request(p.addr, proto, "GET", "t", &path, &headers, b"");
                assert_eq!(r.status, 200, "{proto:?} {coding}: {r:?}");
                assert_eq!(r.header("content-encoding"), None, "{proto:?} {coding} {accept:?}");
                assert_eq!(r.header("etag").as_deref(), Some("W/\"e1\""), "{proto:?}");
                assert_eq!(r.tokens("vary"), vec!["accept-encoding"], "{proto:?}");
                assert!(r.body == plain, "{proto:?} {coding} {accept:?}: {} bytes", r.body.len());
            }
            // A client that takes the coding gets the body as it came, which its decoder reads.
            let r = request(p.addr, proto, "GET", "t", &path, &[("accept-encoding", coding)], b"");
            assert_eq!(r.header("content-encoding").as_deref(), Some(coding), "{proto:?}");
            assert!(decode(coding, &r.body) == plain, "{proto:?} {coding}");
            // A client that takes only gzip: decoded, then gzip-compressed again by `compress`.
            let r = request(
                p.addr,
                proto,
                "GET",
                "t",
                &format!("/regzip/files/data.{coding}"),
                &[("accept-encoding", "gzip")],
                b"",
            );
            assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"), "{proto:?} {coding}");
            assert!(decode("gzip", &r.body) == plain, "{proto:?} {coding}: re-encoded");
        }
    }
    // A bomb (16 MiB of zeros in a few KiB) against max_size 1MiB: the response is cut off, over both
    // protocols, and curl says the transfer failed.
    for coding in ["gzip", "br", "zstd"] {
        let compressed = std::fs::metadata(dir.join(format!("bomb.{coding}"))).unwrap().len();
        assert!(compressed < 64 * 1024, "{coding}: {compressed}");
        let url = p.url(&format!("/up/files/bomb.{coding}"));
        for proto in [&["--http1.1"][..], &["--http2-prior-knowledge"][..]] {
            let out = std::process::Command::new("curl")
                .args(["-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{size_download}"])
                .args(proto)
                .arg(&url)
                .output()
                .unwrap();
            let got: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
            assert!(!out.status.success(), "{coding} {proto:?}: the bomb was delivered whole ({got} bytes)");
            assert!(got <= 1 << 20, "{coding} {proto:?}: {got} bytes passed the bound");
        }
    }
    // Portico is still serving.
    assert_eq!(get(p.addr, Proto::H1, "/up/files/data.gzip").status, 200);
}

#[test]
fn query_edits_reach_the_upstream_exactly() {
    let echo = Echo::start("app");
    let yaml = config(
        "",
        &format!(
            "filters:
  - query: {{ remove: [debug] }}
routes:
  - match: {{ path_prefix: /api }}
    cluster: app
    filters:
      - query: {{ set: {{ version: \"2\" }}, add: {{ tag: \"a b&c\" }}, remove: [token] }}
clusters:
  app:
    endpoints: [ {{ address: \"{}\" }} ]
",
            echo.addr
        ),
    );
    let p = Portico::start(&yaml);
    for proto in BOTH {
        let seen = get(p.addr, proto, "/api/x?b=%2F%2f&debug=1&version=1&c=d+e&token=s&version=3&z").seen();
        assert_eq!(seen.target, "/api/x?b=%2F%2f&version=2&c=d+e&z&tag=a+b%26c", "{proto:?}");
        let seen = get(p.addr, proto, "/api/y").seen();
        assert_eq!(seen.target, "/api/y?version=2&tag=a+b%26c", "{proto:?}");
        let seen = get(p.addr, proto, "/api/z?de%62ug=x&keep=%41").seen();
        assert_eq!(seen.target, "/api/z?keep=%41&version=2&tag=a+b%26c", "{proto:?}: a name matched decoded");
    }
}

fn limits_portico(echo: &Echo, extra_global: &str) -> Portico {
    let yaml = config(
        "",
        &format!(
            "filters:
{extra_global}routes:
  - match: {{ path_prefix: /small }}
    cluster: app
    filters:
      - limits: {{ max_uri_length: 64, max_headers: 12, max_header_bytes: 2KiB, max_body_size: 1KiB }}
  - match: {{ path_prefix: /stream }}
    cluster: app
    request_buffering: false
    filters:
      - limits: {{ max_body_size: 1KiB }}
  - match: {{ path_prefix: /json }}
    cluster: app
    request_buffering: false
    filters:
      - limits: {{ max_json_depth: 4, max_json_size: 4KiB }}
  - match: {{ path_prefix: /buffered-json }}
    cluster: app
    request_buffering: false
    filters:
      - limits: {{ max_json_depth: 4, max_json_size: 4KiB, buffer_json: true }}
  - match: {{ path_prefix: /shadow }}
    cluster: app
    filters:
      - limits: {{ max_body_size: 10, max_json_depth: 2, shadow: true }}
  - match: {{ path_prefix: /echo }}
    handler: echo
    filters:
      - limits: {{ max_body_size: 1KiB }}
clusters:
  app:
    endpoints: [ {{ address: \"{}\" }} ]
",
            echo.addr
        ),
    );
    Portico::start(&yaml)
}

/// Sends a raw HTTP/1.1 request with a chunked body of `pieces` and reads the answer.
fn chunked(addr: std::net::SocketAddr, path: &str, headers: &str, pieces: &[&[u8]]) -> Resp {
    let mut conn = Conn::open(addr);
    let mut raw =
        format!("POST {path} HTTP/1.1\r\nHost: t\r\n{headers}Transfer-Encoding: chunked\r\n\r\n").into_bytes();
    for p in pieces {
        raw.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
        raw.extend_from_slice(p);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    conn.send(&raw);
    conn.read_response(false)
}

/// A POST over HTTP/2 whose body streams in `pieces` without a content-length.
fn h2_streamed(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    pieces: Vec<Vec<u8>>,
) -> (u16, Vec<u8>) {
    use http_body_util::BodyExt;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut sender = h2c(addr).await;
        let frames =
            pieces.into_iter().map(|p| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from(p))));
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let mut b = hyper::Request::builder().method("POST").uri(format!("http://t{path}"));
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(b.body(body).unwrap()))
            .await
            .expect("an answer within 10 s")
            .expect("an answer");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map(|c| c.to_bytes().to_vec()).unwrap_or_default();
        (status, body)
    })
}

#[test]
fn limits_on_the_head_and_declared_bodies() {
    let echo = Echo::start("app");
    let p = limits_portico(&echo, "");
    for proto in BOTH {
        assert_eq!(get(p.addr, proto, "/small/ok").status, 200, "{proto:?}");
        let long = format!("/small/{}", "x".repeat(64));
        assert_eq!(get(p.addr, proto, &long).status, 414, "{proto:?}");
        let many: Vec<(String, String)> = (0..12).map(|i| (format!("x-h{i}"), "v".into())).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(request(p.addr, proto, "GET", "t", "/small/h", &many, b"").status, 431, "{proto:?}");
        let big = "v".repeat(2100);
        assert_eq!(request(p.addr, proto, "GET", "t", "/small/h", &[("x-big", &big)], b"").status, 431, "{proto:?}");
        let r = request(p.addr, proto, "POST", "t", "/small/b", &[], &[b'a'; 1025]);
        assert_eq!(r.status, 413, "{proto:?}: {}", r.text());
        assert_eq!(request(p.addr, proto, "POST", "t", "/small/b", &[], &[b'a'; 1024]).status, 200, "{proto:?}");
        // A handler target: the same limits.
        assert_eq!(request(p.addr, proto, "POST", "t", "/echo/x", &[], &[b'a'; 2000]).status, 413, "{proto:?}");
    }
    let denied = |reason: &str| {
        p.metric(&format!(
            "portico_filter_denials_total{{route=\"/small/*\",filter=\"limits\",reason=\"{reason}\",shadow=\"false\"}}"
        ))
    };
    wait_until("denials counted", Duration::from_secs(5), || {
        denied("uri_too_long") == 2.0
            && denied("too_many_headers") == 2.0
            && denied("headers_too_large") == 2.0
            && denied("body_too_large") == 2.0
    });
}

#[test]
fn limits_count_bodies_as_they_stream() {
    let echo = Echo::start("app");
    let p = limits_portico(&echo, "");
    let kib = [b'x'; 512];
    // HTTP/1.1 chunked: to a buffering route (the default) and to a streaming one.
    for path in ["/small/c", "/stream/c"] {
        let r = chunked(p.addr, path, "", &[&kib, &kib]);
        assert_eq!(r.status, 200, "{path}: exactly the limit");
        let r = chunked(p.addr, path, "", &[&kib, &kib, b"!"]);
        assert_eq!(r.status, 413, "{path}: {}", r.text());
    }
    // HTTP/2 without a content-length.
    for path in ["/small/c", "/stream/c"] {
        let (status, _) = h2_streamed(p.addr, path, &[], vec![kib.to_vec(), kib.to_vec()]);
        assert_eq!(status, 200, "{path}");
        let (status, body) = h2_streamed(p.addr, path, &[], vec![kib.to_vec(), kib.to_vec(), b"!".to_vec()]);
        assert_eq!(status, 413, "{path}: {}", String::from_utf8_lossy(&body));
    }
    wait_until("denials counted", Duration::from_secs(5), || {
        p.metric("portico_filter_denials_total{route=\"/stream/*\",filter=\"limits\",reason=\"body_too_large\",shadow=\"false\"}")
            == 2.0
    });
}

#[test]
fn limits_on_json_depth_and_size() {
    let echo = Echo::start("app");
    let p = limits_portico(&echo, "");
    let json = ("content-type", "application/json");
    let ok = br#"{"a": [1, {"b": ["[[[[ not brackets"]}]}"#;
    let deep = br#"{"a": [1, {"b": [[2]]}]}"#;
    for proto in BOTH {
        for path in ["/json/x", "/buffered-json/x"] {
            assert_eq!(request(p.addr, proto, "POST", "t", path, &[json], ok).status, 200, "{proto:?} {path}");
            let r = request(p.addr, proto, "POST", "t", path, &[json], deep);
            assert_eq!(r.status, 400, "{proto:?} {path}: {}", r.text());
            assert!(r.text().contains("nests deeper"), "{proto:?}: {}", r.text());
            let r = request(p.addr, proto, "POST", "t", path, &[json], b"[1, 2]]");
            assert_eq!(r.status, 400, "{proto:?} {path}: unbalanced");
            // Not JSON: the depth is not looked at.
            let r = request(p.addr, proto, "POST", "t", path, &[("content-type", "text/plain")], deep);
            assert_eq!(r.status, 200, "{proto:?} {path}");
            let big = json_payload(5000);
            assert_eq!(request(p.addr, proto, "POST", "t", path, &[json], &big).status, 413, "{proto:?} {path}");
        }
    }
    // Streamed (chunked, HTTP/2 without a length): the depth is found across pieces.
    let r = chunked(p.addr, "/json/s", "Content-Type: application/json\r\n", &[b"{\"a\": [1, {\"b\":", b" [[2]]}]}"]);
    assert_eq!(r.status, 400, "{}", r.text());
    let r = chunked(p.addr, "/json/s", "Content-Type: application/json\r\n", &[b"{\"a\": [1, ", b"{\"b\": []}]}"]);
    assert_eq!(r.status, 200);
    let (status, _) = h2_streamed(p.addr, "/json/s", &[json], vec![b"[[[".to_vec(), b"[".to_vec(), b"[]]]]]".to_vec()]);
    assert_eq!(status, 400);
    let (status, _) = h2_streamed(p.addr, "/json/s", &[json], vec![b"[[[".to_vec(), b"[]]]]".to_vec()]);
    assert_eq!(status, 200);
    // With buffer_json a refused body never reaches the upstream: count what the upstream was sent.
    let before = echo.requests();
    let r = chunked(p.addr, "/buffered-json/s", "Content-Type: application/json\r\n", &[b"[[[[", b"[]]]]]"]);
    assert_eq!(r.status, 400);
    assert_eq!(echo.requests(), before, "the upstream saw the refused body");
}

#[test]
fn limits_in_shadow_mode_count_and_pass() {
    let echo = Echo::start("app");
    let p = limits_portico(&echo, "");
    let json = ("content-type", "application/json");
    for proto in BOTH {
        let r = request(p.addr, proto, "POST", "t", "/shadow/x", &[json], b"[[[1]]] and more than ten bytes");
        assert_eq!(r.status, 200, "{proto:?}");
    }
    let r = chunked(p.addr, "/shadow/x", "Content-Type: application/json\r\n", &[b"[[[", b"1]]]"]);
    assert_eq!(r.status, 200);
    let shadowed = |reason: &str| {
        p.metric(&format!(
            "portico_filter_denials_total{{route=\"/shadow/*\",filter=\"limits\",reason=\"{reason}\",shadow=\"true\"}}"
        ))
    };
    // The declared lengths would be refused on their length, then on their depth (shadow mode goes on
    // checking what a refusal would have stopped); the chunked one on its depth.
    wait_until("shadow denials", Duration::from_secs(5), || {
        shadowed("body_too_large") == 2.0 && shadowed("json_too_deep") == 3.0
    });
    assert_eq!(echo.requests(), 3, "every request reached the upstream");
}

#[test]
fn limits_cap_connections_per_address() {
    let echo = Echo::start("app");
    let p = limits_portico(&echo, "  - limits: { max_connections_per_ip: 3 }\n");
    // Three connections are within the cap.
    let mut held: Vec<Conn> = (0..3).map(|_| Conn::open(p.addr)).collect();
    assert_eq!(held[0].get("/small/a", "").status, 200);
    // A fourth (HTTP/1.1, then HTTP/2) is refused while the others stay open.
    let extra = Conn::open(p.addr);
    wait_until("four connections counted", Duration::from_secs(5), || get(p.addr, Proto::H1, "/small/a").status == 429);
    assert_eq!(get(p.addr, Proto::H2, "/small/a").status, 429);
    drop(extra);
    held.truncate(1);
    wait_until("connections released", Duration::from_secs(5), || get(p.addr, Proto::H1, "/small/a").status == 200);
    assert_eq!(get(p.addr, Proto::H2, "/small/a").status, 200);
    assert!(
        p.metric("portico_filter_denials_total{route=\"/small/*\",filter=\"limits\",reason=\"too_many_connections\",shadow=\"false\"}")
            >= 2.0
    );
}

#[test]
fn limits_cap_slow_connections_per_address() {
    let echo = Echo::start("app");
    let p = limits_portico(&echo, "  - limits: { max_slow_connections_per_ip: 2, slow_after: 300ms }\n");
    // Three connections send half a head each and stall: past 300 ms each is slow; the third is one too many.
    let mut slow: Vec<Conn> = (0..3)
        .map(|_| {
            let mut c = Conn::open(p.addr);
            c.send(b"GET /small/s HTTP/1.1\r\nHost: t\r\n");
            std::thread::sleep(Duration::from_millis(50));
            c
        })
        .collect();
    let third = slow.pop().unwrap();
    let mut third = third;
    let r = third.read_response(false);
    assert_eq!(r.status, 408, "{}", r.text());
    assert!(r.text().contains("too many slow connections"), "{}", r.text());
    // The first two finish their heads and are answered; a fast client is never slow.
    for c in &mut slow {
        c.send(b"\r\n");
        assert_eq!(c.read_response(false).status, 200);
    }
    assert_eq!(get(p.addr, Proto::H1, "/small/f").status, 200);
    wait_until("slow denial counted", Duration::from_secs(5), || {
        p.metric("portico_filter_denials_total{route=\"\",filter=\"limits\",reason=\"too_many_slow_connections\",shadow=\"false\"}")
            == 1.0
    });
}

/// A TCP stream whose writes trickle, one byte every `pause`, once `slow` is set: a slowloris client under a
/// real HTTP/2 client (the `h2` crate), which sends its preface and SETTINGS at full speed and then its request
/// head a byte at a time.
struct Trickle {
    tcp: tokio::net::TcpStream,
    slow: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pause: Duration,
    wait: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl tokio::io::AsyncRead for Trickle {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Trickle {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if !self.slow.load(std::sync::atomic::Ordering::SeqCst) || buf.is_empty() {
            return std::pin::Pin::new(&mut self.tcp).poll_write(cx, buf);
        }
        if let Some(wait) = self.wait.as_mut() {
            std::task::ready!(std::future::Future::poll(wait.as_mut(), cx));
        }
        let written = std::task::ready!(std::pin::Pin::new(&mut self.tcp).poll_write(cx, &buf[..1]));
        self.wait = Some(Box::pin(tokio::time::sleep(self.pause)));
        std::task::Poll::Ready(written)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// What a trickled HTTP/2 request got: its status, or the error that ended it (with the GOAWAY's reason when
/// the client read it), and when.
#[derive(Debug)]
enum Trickled {
    Status(u16),
    Failed(Option<h2::Reason>, String),
}

/// Opens an h2c connection to `addr` with a real HTTP/2 client, lets its preface and SETTINGS go, then sends a
/// GET of `path` whose head trickles at a byte per `pause`. Started when it returns; the result comes from the
/// task.
async fn trickled_get(addr: std::net::SocketAddr, path: &str, pause: Duration) -> tokio::task::JoinHandle<Trickled> {
    let slow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = Trickle { tcp, slow: slow.clone(), pause, wait: None };
    let (client, conn) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    // The preface, SETTINGS and their acknowledgements go at full speed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    slow.store(true, std::sync::atomic::Ordering::SeqCst);
    let request = hyper::Request::get(format!("http://test.local{path}")).body(()).unwrap();
    let sent = client.send_request(request, true);
    tokio::spawn(async move {
        let outcome = match sent {
            Ok((response, _)) => response.await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(response) => Trickled::Status(response.status().as_u16()),
            Err(e) => Trickled::Failed(e.reason(), e.to_string()),
        }
    })
}

#[test]
fn limits_cap_slow_http2_connections_per_address() {
    let echo = Echo::start("app");
    let p = limits_portico(&echo, "  - limits: { max_slow_connections_per_ip: 2, slow_after: 300ms }\n");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // Three HTTP/2 connections send their request heads a byte every 100 ms (about 3 s for the head): past
        // 300 ms each is slow, and the third is one too many, closed with a GOAWAY long before its head is in.
        let started = std::time::Instant::now();
        let mut slow = Vec::new();
        for _ in 0..3 {
            slow.push(trickled_get(p.addr, "/small/s", Duration::from_millis(100)).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let third = slow.pop().unwrap().await.unwrap();
        let refused_after = started.elapsed();
        match &third {
            Trickled::Failed(reason, message) => {
                // The client may see the GOAWAY's reason, or only the connection closing under its writes.
                assert!(reason.is_none_or(|r| r == h2::Reason::ENHANCE_YOUR_CALM), "{message}");
            }
            Trickled::Status(s) => panic!("the third slow connection was answered {s}"),
        }
        assert!(refused_after < Duration::from_millis(2000), "refused after {refused_after:?}");
        // A fast client meanwhile is not slow.
        let fast = tokio::task::spawn_blocking(move || get(p.addr, Proto::H2, "/small/f").status);
        assert_eq!(fast.await.unwrap(), 200);
        // The first two finish their heads and are answered.
        for c in slow {
            match c.await.unwrap() {
                Trickled::Status(200) => {}
                other => panic!("a slow connection within the cap got {other:?}"),
            }
        }
    });
    assert_eq!(
        p.metric("portico_filter_denials_total{route=\"\",filter=\"limits\",reason=\"too_many_slow_connections\",shadow=\"false\"}"),
        1.0
    );
}

#[test]
fn an_http2_head_slower_than_header_read_closes_its_connection() {
    let echo = Echo::start("app");
    let yaml = config(
        "    timeouts: { header_read: 1s }\n",
        &format!(
            "routes:\n  - cluster: app\nclusters:\n  app: {{ endpoints: [ {{ address: \"{}\" }} ] }}\n",
            echo.addr
        ),
    );
    let p = Portico::start(&yaml);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // About 3 s for the head at a byte every 100 ms: closed at 1 s. A head at full speed is answered.
        let started = std::time::Instant::now();
        let slow = trickled_get(p.addr, "/a", Duration::from_millis(100)).await.await.unwrap();
        let closed_after = started.elapsed();
        assert!(matches!(slow, Trickled::Failed(..)), "{slow:?}");
        assert!(closed_after < Duration::from_millis(2500), "closed after {closed_after:?}");
        let quick = trickled_get(p.addr, "/a", Duration::ZERO).await.await.unwrap();
        assert!(matches!(quick, Trickled::Status(200)), "{quick:?}");
    });
}

#[test]
fn limits_on_bodies_a_function_or_an_h2_cluster_reads() {
    let backend = portico_testkit::Backend::start_h2("h2app").unwrap();
    let dir = temp_dir();
    // A function that reads the whole body before it answers.
    std::fs::write(
        dir.join("size.js"),
        "export default { async fetch(request) { const t = await request.text(); return new Response(`read ${t.length}`); } };\n",
    )
    .unwrap();
    let limits = "filters: [ { limits: { max_body_size: 1KiB, max_json_depth: 3 } } ]";
    let yaml = config(
        "",
        &format!(
            "functions:
  size: {{ source: size.js }}
routes:
  - match: {{ path_prefix: /fn }}
    function: size
    {limits}
  - match: {{ path_prefix: /echo }}
    handler: echo
    {limits}
  - match: {{ path_prefix: /h2 }}
    cluster: h2app
    filters: [ {{ rewrite: {{ strip_prefix: /h2 }} }}, {{ limits: {{ max_body_size: 1KiB, max_json_depth: 3 }} }} ]
clusters:
  h2app:
    protocol: h2
    endpoints: [ {{ address: \"{}\" }} ]
",
            backend.addr
        ),
    );
    let p = Portico::start_in(&dir, &yaml);
    let kib = [b'x'; 512];
    let json = ("content-type", "application/json");
    // A function reads the body: within the limit it sees all of it; past it the client gets 413, or 400 for
    // a JSON body nesting too deep (HTTP/1.1 chunked, HTTP/2 without a length).
    let r = chunked(p.addr, "/fn/a", "", &[&kib, &kib]);
    assert_eq!((r.status, r.text().as_str()), (200, "read 1024"));
    let r = chunked(p.addr, "/fn/a", "", &[&kib, &kib, b"!"]);
    assert_eq!(r.status, 413, "{}", r.text());
    // Over HTTP/2 with a declared length (a function reads no body that streams without one: see the report
    // of this branch), the depth is found as the function reads.
    let (status, body) =
        h2_streamed(p.addr, "/fn/a", &[json, ("content-length", "8")], vec![b"[[[".to_vec(), b"[]]]]".to_vec()]);
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let (status, body) =
        h2_streamed(p.addr, "/fn/a", &[json, ("content-length", "6")], vec![b"[[[".to_vec(), b"]]]".to_vec()]);
    assert_eq!((status, &body[..]), (200, &b"read 6"[..]));
    let r = request(p.addr, Proto::H1, "POST", "t", "/fn/a", &[json], b"[[[[]]]]");
    assert_eq!(r.status, 400, "{}", r.text());
    // `echo` answers before it reads: a body refused later cuts its answer off (no complete 200).
    let (status, _) = h2_streamed(p.addr, "/echo/a", &[], vec![kib.to_vec(), kib.to_vec()]);
    assert_eq!(status, 200);
    let (_, body) = h2_streamed(p.addr, "/echo/a", &[], vec![kib.to_vec(), kib.to_vec(), b"!".to_vec()]);
    assert!(body.len() < 1025, "the whole body was echoed");
    // An HTTP/2 cluster, from HTTP/2 clients (the stream's body goes straight upstream) and HTTP/1.1 ones.
    let (status, body) = h2_streamed(p.addr, "/h2/echo", &[], vec![kib.to_vec(), kib.to_vec()]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, body) = h2_streamed(p.addr, "/h2/echo", &[], vec![kib.to_vec(), kib.to_vec(), b"!".to_vec()]);
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    let (status, _) = h2_streamed(p.addr, "/h2/echo", &[json], vec![b"[[[".to_vec(), b"[]]]]".to_vec()]);
    assert_eq!(status, 400);
    let r = chunked(p.addr, "/h2/echo", "", &[&kib, &kib, b"!"]);
    assert_eq!(r.status, 413, "{}", r.text());
    let r = chunked(p.addr, "/h2/echo", "", &[&kib]);
    assert_eq!(r.status, 200, "{}", r.text());
}
