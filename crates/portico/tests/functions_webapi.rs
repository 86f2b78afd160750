//! The Encoding Standard and Web Crypto in functions, through the binary. Two handlers run under Portico:
//! tests/data/encoding.js runs web-platform-tests' encoding cases (ported to it) and the standard's table of
//! labels (encoding-labels.json); tests/data/crypto.js checks published test vectors (FIPS 180, RFC 4231,
//! RFC 7515 appendix A, RFC 8032), what misuses throw, and keys made, exported, imported and signed with. The
//! same handlers run under Deno (`deno serve`): they must answer the same where Deno follows the standards,
//! and each runtime must verify what the other signs, with keys the other made and exported.

mod common;
use common::*;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(file)
}

/// Portico serving both handlers, `/encoding/...` and `/crypto/...` (with room for the suites: the debug
/// build's QuickJS is slow).
fn start_portico(dir: &Path) -> Portico {
    for file in ["encoding.js", "crypto.js"] {
        std::fs::copy(data(file), dir.join(file)).unwrap();
    }
    Portico::start_in(
        dir,
        "workers: 1\nlisteners: [ { name: web, address: \"{listen}\" } ]\nfunctions:\n\
         \x20 encoding: { source: encoding.js, limits: { cpu: 30s, memory: 256MiB } }\n\
         \x20 crypto: { source: crypto.js, limits: { cpu: 30s, memory: 256MiB } }\n\
         routes:\n\
         \x20 - { match: { path_prefix: /encoding/ }, function: encoding }\n\
         \x20 - { match: { path_prefix: /crypto/ }, function: crypto }\n",
    )
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Value {
    ask_json(addr, path, Some(&serde_json::to_vec(body).unwrap()))
}

/// A suite's answer: how many cases it ran, and each failed case's name and what was wrong.
fn failures(answer: &Value) -> (u64, Vec<(String, String)>) {
    let total = answer["total"].as_u64().unwrap();
    let failed = answer["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_string(), f["error"].as_str().unwrap().to_string()))
        .collect();
    (total, failed)
}

/// The labels of the standard's table, counted.
fn labels() -> (Vec<u8>, u64) {
    let text = std::fs::read(data("encoding-labels.json")).unwrap();
    let table: Value = serde_json::from_slice(&text).unwrap();
    let count = table.as_array().unwrap().iter().map(|e| e["labels"].as_array().unwrap().len() as u64).sum();
    (text, count)
}

/// What Deno gives where it departs from the standards (checked on Portico alone, against the standard).
/// Each: the handler's path, the key in its answer, and the standard's answer.
const DENO_DEPARTS: [(&str, &str, &str); 4] = [
    // WebIDL: `hash` and `namedCurve` are required members (a TypeError when missing); Deno says DataError.
    ("/crypto/errors", "HMAC without hash", "TypeError"),
    ("/crypto/errors", "ECDSA without curve", "TypeError"),
    // WebIDL: a usage that is no KeyUsage is a TypeError; Deno says SyntaxError.
    ("/crypto/errors", "HMAC bogus usage", "TypeError"),
    // Web Crypto's JWK import: a crv other than the namedCurve is a DataError; Deno imports the key.
    ("/crypto/errors", "EC jwk crv", "DataError"),
];

#[test]
fn encoding_passes_the_web_platform_tests_and_every_label() {
    let p = start_portico(&temp_dir());
    let (total, failed) = failures(&ask_json(p.addr, "/encoding/wpt", None));
    assert!(total > 190, "ran {total} cases");
    assert!(failed.is_empty(), "{} of {total} cases fail:\n{failed:#?}", failed.len());
    let (table, count) = labels();
    let (total, failed) = failures(&ask_json(p.addr, "/encoding/labels", Some(&table)));
    assert_eq!(total, count, "labels checked");
    assert!(failed.is_empty(), "{} of {total} labels fail:\n{failed:#?}", failed.len());
    // A few answers spelled out, for a run without Deno.
    let observed = ask_json(p.addr, "/encoding/observe", None);
    let windows = observed["windows-1252"].as_str().unwrap();
    assert_eq!(windows.chars().nth(0x80), Some('€'));
    assert_eq!(windows.chars().nth(0x81), Some('\u{81}'));
    assert_eq!(observed["shift_jis"][0], "あ日本語A\u{fffd}");
    assert_eq!(observed["shift_jis"][2], "TypeError");
    assert_eq!(
        observed["encode"],
        serde_json::json!([97, 195, 169, 226, 130, 172, 240, 159, 152, 128, 239, 191, 189, 122])
    );
    assert_eq!(observed["attributes"][0], "windows-1252");
    assert_eq!(
        observed["errors"],
        serde_json::json!(["RangeError", "TypeError", "TypeError", "TypeError", "TypeError", "TypeError"])
    );
}

/// A request body piped through TextDecoderStream and TextEncoderStream, its characters split between the
/// pieces it comes in.
#[test]
fn text_streams_carry_characters_split_between_body_pieces() {
    let p = start_portico(&temp_dir());
    let text = "aé€😀ß and so on, ünïcödé".repeat(50);
    for (label, bytes) in
        [("utf-8", text.as_bytes().to_vec()), ("utf-16be", text.encode_utf16().flat_map(u16::to_be_bytes).collect())]
    {
        let mut conn = Conn::open(p.addr);
        conn.send(
            format!(
                "POST /encoding/pipe?encoding={label} HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            .as_bytes(),
        );
        // Pieces of 1 to 7 bytes, most of them ending inside a character.
        let mut at = 0;
        for size in (1..=7).cycle() {
            if at >= bytes.len() {
                break;
            }
            let piece = &bytes[at..(at + size).min(bytes.len())];
            let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
            chunk.extend_from_slice(piece);
            chunk.extend_from_slice(b"\r\n");
            conn.send(&chunk);
            at += size;
            if at % 97 < 7 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        conn.send(b"0\r\n\r\n");
        let r = conn.read_response(false);
        assert_eq!(r.status, 200, "{label}: {}", r.text());
        assert_eq!(r.text(), text.to_uppercase(), "{label}");
    }
}

#[test]
fn crypto_passes_the_published_test_vectors_and_signs_and_verifies_its_own_keys() {
    let p = start_portico(&temp_dir());
    let vectors = ask_json(p.addr, "/crypto/vectors", None);
    let (total, failed) = failures(&vectors);
    assert_eq!(total, 11, "vectors checked");
    assert!(failed.is_empty(), "{} of {total} vectors fail:\n{failed:#?}", failed.len());
    assert_eq!(vectors["standardOnly"]["ecJwkAlg"], serde_json::json!([null, null]), "an ECDSA JWK has no alg");
    // The standard's answers to misuses (the same as Deno's but where DENO_DEPARTS says).
    let errors = ask_json(p.addr, "/crypto/errors", None);
    for (key, expected) in [
        ("unknown algorithm", "NotSupportedError"),
        ("HMAC no usage", "SyntaxError"),
        ("spki other curve", "DataError"),
        ("sign with a public key", "InvalidAccessError"),
        ("export not extractable", "InvalidAccessError"),
        ("digest a string", "TypeError"),
        ("getRandomValues too many", "QuotaExceededError"),
        ("rejects, not throws", "rejected NotSupportedError"),
    ] {
        assert_eq!(errors[key], expected, "{key}");
    }
    for (_, key, expected) in DENO_DEPARTS {
        assert_eq!(errors[key], expected, "{key}");
    }
    assert_eq!(errors["verify a short signature"], false);
    // Bytes of any shape are refused as what the standard says, and the runtime goes on.
    let hostile = ask_json(p.addr, "/crypto/hostile", None);
    let outcomes = hostile.as_object().unwrap();
    assert!(outcomes.keys().all(|k| ["DataError", "NotSupportedError"].contains(&k.as_str())), "{hostile}");
    assert!(outcomes.values().map(|n| n.as_u64().unwrap()).sum::<u64>() >= 5 * 3 * 47 - 1, "{hostile}");
    // Keys made here, imported again in each format they export in, sign and verify.
    let keys = ask_json(p.addr, "/crypto/keys", None);
    let made: Vec<(&str, Option<&str>)> =
        keys.as_array().unwrap().iter().map(|k| (k["id"].as_str().unwrap(), k["unsupported"].as_str())).collect();
    assert_eq!(
        made,
        [
            ("ecdsa-p256", None),
            ("ecdsa-p384", None),
            // `ring` signs on P-256 with SHA-256 only (it verifies with SHA-384 too).
            ("ecdsa-p256-sha384", Some("NotSupportedError")),
            ("ed25519", None),
            ("hmac-sha256", None),
            ("hmac-sha512", None),
            // `ring` makes no RSA keys.
            ("rsa-pkcs1-sha256", Some("NotSupportedError")),
            ("rsa-pss-sha384", Some("NotSupportedError")),
            ("rsa-pkcs1-sha1-1024", Some("NotSupportedError")),
            ("rsa-pkcs1-sha512-rfc7515", None),
            ("rsa-pss-sha256-rfc7515", None),
        ]
    );
    // Each exported in every format the standard has for it.
    for key in keys.as_array().unwrap().iter().filter(|k| k["unsupported"].is_null()) {
        let id = key["id"].as_str().unwrap();
        let formats: &[&str] = match id {
            _ if id.starts_with("hmac") => &["raw", "jwk"],
            _ if id.starts_with("rsa") => &["pkcs8", "privateJwk", "publicJwk"],
            _ => &["pkcs8", "privateJwk", "spki", "publicJwk", "raw"],
        };
        for format in formats {
            assert!(!key[format].is_null(), "{id} is not exported as {format}: {key}");
        }
    }
    let checked = post(p.addr, "/crypto/check", &keys);
    assert_all_true(&checked["checks"], "Portico's keys, checked by Portico", 25);
    let verified =
        post(p.addr, "/crypto/verify", &serde_json::json!({ "keys": keys, "signatures": checked["signatures"] }));
    assert_all_true(&verified, "Portico's signatures, verified by Portico", 10);
}

/// Every value `true`, and at least `at_least` of them.
fn assert_all_true(answer: &Value, what: &str, at_least: usize) {
    let answer = answer.as_object().unwrap();
    let wrong: Vec<String> =
        answer.iter().filter(|(_, v)| **v != Value::Bool(true)).map(|(k, v)| format!("{k}: {v}")).collect();
    assert!(wrong.is_empty(), "{what}:\n{}", wrong.join("\n"));
    assert!(answer.len() >= at_least, "{what}: only {} checks: {answer:?}", answer.len());
}

/// `deno serve` running one handler; killed when dropped.
struct Deno {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Deno {
    fn serve(deno: &Path, dir: &Path, file: &str) -> Deno {
        let port = free_port();
        let child = std::process::Command::new(deno)
            .args(["serve", "--quiet", "--no-prompt", "--port", &port.to_string()])
            .arg(dir.join(file))
            .env("DENO_DIR", dir.join("deno-cache"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("deno");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_until("deno serves", Duration::from_secs(30), || std::net::TcpStream::connect(addr).is_ok());
        Deno { child, addr }
    }
}

impl Drop for Deno {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The keys of `ours` whose values differ from `theirs`', but for those DENO_DEPARTS names for `path`.
fn differences(path: &str, ours: &Value, theirs: &Value) -> Vec<String> {
    let (ours, theirs) = (ours.as_object().unwrap(), theirs.as_object().unwrap());
    let mut out = Vec::new();
    for key in ours.keys().chain(theirs.keys().filter(|k| !ours.contains_key(*k))) {
        if DENO_DEPARTS.iter().any(|(p, k, _)| *p == path && k == key) {
            continue;
        }
        if ours.get(key) != theirs.get(key) {
            out.push(format!(
                "{path} `{key}`:\n  ours:   {}\n  Deno's: {}",
                ours.get(key).unwrap_or(&Value::Null),
                theirs.get(key).unwrap_or(&Value::Null)
            ));
        }
    }
    out
}

#[test]
fn encoding_and_crypto_answer_as_deno_does_and_verify_each_others_signatures() {
    let Some(deno) = deno() else {
        skip_outside_ci(
            "encoding_and_crypto_answer_as_deno_does_and_verify_each_others_signatures",
            "Deno is not installed (`bash .ci/test` installs it)",
        );
        return;
    };
    let dir = temp_dir();
    let p = start_portico(&dir);
    let (encoding, crypto) = (Deno::serve(&deno, &dir, "encoding.js"), Deno::serve(&deno, &dir, "crypto.js"));
    let mut wrong = Vec::new();

    // The ported web-platform-tests: nothing fails here that passes under Deno (and Deno passes them).
    let (ours, theirs) = (ask_json(p.addr, "/encoding/wpt", None), ask_json(encoding.addr, "/wpt", None));
    let (ours, theirs) = (failures(&ours).1, failures(&theirs).1);
    for (name, error) in &ours {
        if !theirs.iter().any(|(n, _)| n == name) {
            wrong.push(format!("/encoding/wpt {name} fails here ({error}) and passes under Deno"));
        }
    }
    assert!(theirs.is_empty(), "Deno fails ported cases (is the port right?): {theirs:#?}");
    let (table, _) = labels();
    assert_eq!(failures(&ask_json(encoding.addr, "/labels", Some(&table))).1, []);
    wrong.extend(differences(
        "/encoding/observe",
        &ask_json(p.addr, "/encoding/observe", None),
        &ask_json(encoding.addr, "/observe", None),
    ));

    // Published vectors: both pass, and what they export and sign again is the same.
    let (ours, theirs) = (ask_json(p.addr, "/crypto/vectors", None), ask_json(crypto.addr, "/vectors", None));
    assert_eq!(failures(&theirs).1, [], "Deno fails vectors (are they right?)");
    wrong.extend(differences("/crypto/vectors", &ours["outputs"], &theirs["outputs"]));
    wrong.extend(differences(
        "/crypto/errors",
        &ask_json(p.addr, "/crypto/errors", None),
        &ask_json(crypto.addr, "/errors", None),
    ));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Keys made by one, exported, imported by the other: each verifies the other's signatures, and signs with
    // the other's private keys what the other verifies.
    let (our_keys, their_keys) = (ask_json(p.addr, "/crypto/keys", None), ask_json(crypto.addr, "/keys", None));
    assert!(
        their_keys.as_array().unwrap().iter().all(|k| k["unsupported"].is_null()),
        "Deno makes every key: {their_keys}"
    );
    let mut ours_of_theirs = post(p.addr, "/crypto/check", &their_keys);
    // (`ring` signs on P-256 with SHA-256 only, and with RSA keys of 2,048 bits or more: Portico verifies such
    // signatures, and cannot make them.)
    let checks = ours_of_theirs["checks"].as_object_mut().unwrap();
    for id in ["ecdsa-p256-sha384", "rsa-pkcs1-sha1-1024"] {
        for format in ["pkcs8", "privateJwk"] {
            let key = format!("{id} sign with {format}");
            let refused = checks.remove(&key).unwrap_or_default();
            assert!(refused.as_str().is_some_and(|e| e.starts_with("NotSupportedError")), "{key}: {refused}");
        }
    }
    assert_all_true(&ours_of_theirs["checks"], "Deno's keys and signatures, checked by Portico", 30);
    let back = json_of(&their_keys, &ours_of_theirs["signatures"]);
    assert_all_true(
        &post(crypto.addr, "/verify", &back),
        "Portico's signatures with Deno's keys, verified by Deno",
        10,
    );
    let theirs_of_ours = post(crypto.addr, "/check", &our_keys);
    assert_all_true(&theirs_of_ours["checks"], "Portico's keys and signatures, checked by Deno", 20);
    let back = json_of(&our_keys, &theirs_of_ours["signatures"]);
    assert_all_true(
        &post(p.addr, "/crypto/verify", &back),
        "Deno's signatures with Portico's keys, verified by Portico",
        5,
    );
}

fn json_of(keys: &Value, signatures: &Value) -> Value {
    serde_json::json!({ "keys": keys, "signatures": signatures })
}
