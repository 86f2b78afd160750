//! `api_key`: a key in a request header or query parameter, looked up among the configured keys.
//!
//! Keys are held as their SHA-256, and a presented key is hashed and looked up in a hash map: the time the
//! lookup takes depends on the digest, never on how many leading bytes of a real key the client guessed, so
//! the comparison gives nothing away (the digests of configured keys are not secret in the way keys are). A
//! known key's name goes upstream in `name_header` and to the access log's `user`; the key itself is removed
//! from the request (header and query parameter both), and a value the client sent under `name_header` is
//! always removed. A missing or unknown key is answered `401`.

use super::denials::Denial;
use super::filter::{Filter, RequestCx, Step};
use crate::codec::RequestHead;
use crate::message::LocalResponse;
use portico_config::ApiKeyFilter;
use std::collections::HashMap;
use std::sync::Arc;

type Digest = [u8; 32];

#[derive(Debug)]
pub struct ApiKey {
    /// By the SHA-256 of the key: its name.
    keys: HashMap<Digest, Arc<str>>,
    header: Option<Arc<str>>,
    query: Option<String>,
    name_header: Arc<str>,
    shadow: bool,
}

fn sha256(data: &[u8]) -> Digest {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).into()
}

fn parse_hex(hex: &str) -> Option<Digest> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// The keys of a key file: `name:key` or `name:{SHA256}hex` lines, `#` comments and blank lines skipped.
/// `file` names it in errors.
pub(crate) fn parse_keys_file(text: &str, file: &str) -> Result<Vec<(String, Digest)>, String> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |what: &str| format!("{file}:{}: {what}", i + 1);
        let Some((name, key)) = line.split_once(':') else {
            return Err(at("expected `name:key` or `name:{SHA256}hex`"));
        };
        let (name, key) = (name.trim(), key.trim());
        if name.is_empty() || key.is_empty() {
            return Err(at("a key needs a name and a key"));
        }
        if name.bytes().any(|b| !(b == b' ' || b.is_ascii_graphic())) {
            return Err(at("a key's name is sent as a header: visible ASCII only"));
        }
        let digest = match key.strip_prefix("{SHA256}") {
            Some(hex) => parse_hex(hex).ok_or_else(|| at("a `{SHA256}` key is 64 hexadecimal digits"))?,
            None => sha256(key.as_bytes()),
        };
        keys.push((name.to_string(), digest));
    }
    Ok(keys)
}

impl ApiKey {
    /// `keys_file` is the key file's path, resolved by the caller; it is read here (blocking, while a
    /// snapshot is built). An error is (key below the filter, message).
    pub fn new(config: &ApiKeyFilter, keys_file: Option<&std::path::Path>) -> Result<ApiKey, (String, String)> {
        let mut listed: Vec<(String, Digest)> = Vec::new();
        for (j, k) in config.keys.iter().enumerate() {
            let digest = match (&k.secret, &k.sha256) {
                (Some(secret), _) => sha256(secret.as_bytes()),
                (None, Some(hex)) => parse_hex(hex).ok_or_else(|| {
                    (format!("api_key.keys[{j}].sha256"), "a SHA-256 is 64 hexadecimal digits".to_string())
                })?,
                (None, None) => return Err((format!("api_key.keys[{j}]"), "a key needs `secret` or `sha256`".into())),
            };
            listed.push((k.name.clone(), digest));
        }
        if let Some(path) = keys_file {
            let file = path.display().to_string();
            let text = std::fs::read_to_string(path)
                .map_err(|e| ("api_key.keys_file".to_string(), format!("cannot read the key file {file}: {e}")))?;
            listed.extend(parse_keys_file(&text, &file).map_err(|e| ("api_key.keys_file".to_string(), e))?);
        }
        let mut keys = HashMap::with_capacity(listed.len());
        for (name, digest) in listed {
            if keys.insert(digest, Arc::from(name.as_str())).is_some() {
                let message = format!("the key of {name:?} is listed twice (in `keys` or `keys_file`)");
                return Err(("api_key".into(), message));
            }
        }
        let (header, query) = config.places();
        Ok(ApiKey {
            keys,
            header: header.map(|h| Arc::from(h.to_ascii_lowercase())),
            query: query.map(str::to_string),
            name_header: Arc::from(config.name_header.to_ascii_lowercase()),
            shadow: config.shadow,
        })
    }

    /// The key the request carries: the header's, else the query parameter's (percent-decoded).
    fn presented(&self, head: &RequestHead) -> Option<Vec<u8>> {
        if let Some(value) = self.header.as_deref().and_then(|h| head.values(h).next()) {
            return Some(crate::codec::trim(value).to_vec()).filter(|v| !v.is_empty());
        }
        let name = self.query.as_deref()?;
        let query = head.query()?;
        form_urlencoded::parse(query).find(|(n, _)| n == name).map(|(_, v)| v.into_owned().into_bytes())
    }
}

/// `head`'s target without the query parameter `name` (every occurrence); the rest of the query as it was.
fn remove_query_parameter(head: &mut RequestHead, name: &str) {
    let Some(query) = head.query() else { return };
    let kept: Vec<&[u8]> = query
        .split(|&b| b == b'&')
        .filter(|pair| {
            let raw_name = pair.split(|&b| b == b'=').next().unwrap_or_default();
            form_urlencoded::parse(raw_name).next().is_none_or(|(n, _)| n != name)
        })
        .collect();
    let path = head.path();
    let mut target = Vec::with_capacity(path.len() + query.len() + 1);
    target.extend_from_slice(path);
    let path_len = target.len();
    for (i, pair) in kept.iter().enumerate() {
        target.push(if i == 0 { b'?' } else { b'&' });
        target.extend_from_slice(pair);
    }
    head.edits_mut().target = Some((target, path_len));
}

impl Filter for ApiKey {
    fn on_request(&self, head: &mut RequestHead, cx: &RequestCx<'_>) -> Step {
        let presented = self.presented(head);
        let edits = head.edits_mut();
        edits.headers.remove(self.name_header.clone());
        if let Some(header) = &self.header {
            edits.headers.remove(header.clone());
        }
        if let Some(name) = &self.query {
            if head.query().is_some_and(|q| form_urlencoded::parse(q).any(|(n, _)| n == name.as_str())) {
                remove_query_parameter(head, name);
            }
        }
        let denial = match presented.map(|key| self.keys.get(&sha256(&key))) {
            Some(Some(name)) => {
                let edits = head.edits_mut();
                edits.headers.set(self.name_header.clone(), name.clone());
                edits.identity = Some(name.clone());
                edits.key_name = Some(name.clone());
                return Step::Continue;
            }
            Some(None) => Denial::KeyInvalid,
            None => Denial::KeyMissing,
        };
        cx.denials.record(denial, self.shadow, cx.peer, None);
        if self.shadow {
            return Step::Continue;
        }
        Step::Respond(LocalResponse::text(401, "a valid API key is required"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::auth_basic::tests::head;
    use crate::filters::Denials;
    use portico_config::ApiKey as KeyConfig;

    fn config(header: Option<&str>, query: Option<&str>, shadow: bool) -> ApiKeyFilter {
        ApiKeyFilter {
            header: header.map(String::from),
            query: query.map(String::from),
            keys: vec![
                KeyConfig { name: "mobile".into(), secret: Some("k-123".into()), sha256: None },
                KeyConfig { name: "batch".into(), secret: None, sha256: Some(hex(&sha256(b"k-456"))) },
            ],
            keys_file: None,
            name_header: "x-api-key-name".into(),
            shadow,
        }
    }

    fn hex(d: &Digest) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn run(f: &ApiKey, h: &mut RequestHead, denials: &Denials) -> Step {
        let cx = RequestCx { matched_path: b"/x", captures: &[], prefix: None, peer: [127, 0, 0, 1].into(), denials };
        f.on_request(h, &cx)
    }

    #[test]
    fn a_known_key_passes_with_its_name_and_without_itself() {
        let f = ApiKey::new(&config(None, None, false), None).unwrap();
        let denials = Denials::new("r");
        for (key, name) in [("k-123", "mobile"), ("k-456", "batch")] {
            let mut h = head(&format!("x-api-key: {key}\r\nx-api-key-name: forged\r\n"));
            assert!(matches!(run(&f, &mut h, &denials), Step::Continue));
            let edits = &h.edits.as_ref().unwrap().headers;
            assert!(edits.drops(b"x-api-key") && edits.drops(b"x-api-key-name"));
            assert_eq!(edits.appended_value("x-api-key-name"), Some(name));
            assert_eq!(h.edits.as_ref().unwrap().identity.as_deref(), Some(name));
        }
        for (extra, denial) in [("x-api-key: k-12\r\n", Denial::KeyInvalid), ("", Denial::KeyMissing)] {
            let Step::Respond(r) = run(&f, &mut head(extra), &denials) else { panic!("{extra} passed") };
            assert_eq!(r.status, 401);
            assert_eq!(denials.count(denial, false), 1);
        }
    }

    #[test]
    fn a_key_in_the_query_is_read_and_removed() {
        let f = ApiKey::new(&config(Some("x-key"), Some("api_key"), false), None).unwrap();
        let denials = Denials::new("r");
        let mut h = head("");
        h.edits_mut().target = Some((b"/x?a=1&api%5Fkey=k%2D123&b=2&api_key=other".to_vec(), 2));
        assert!(matches!(run(&f, &mut h, &denials), Step::Continue));
        assert_eq!(h.origin_form(), b"/x?a=1&b=2");
        let mut h = head("x-key: k-456\r\n");
        assert!(matches!(run(&f, &mut h, &denials), Step::Continue), "the header first");
        assert_eq!(h.edits.as_ref().unwrap().headers.appended_value("x-api-key-name"), Some("batch"));
        let mut h = head("");
        h.edits_mut().target = Some((b"/x?api_key=k-123".to_vec(), 2));
        assert!(matches!(run(&f, &mut h, &denials), Step::Continue));
        assert_eq!(h.origin_form(), b"/x");
    }

    #[test]
    fn shadow_mode_lets_unknown_keys_through_uncredited() {
        let f = ApiKey::new(&config(None, None, true), None).unwrap();
        let denials = Denials::new("r");
        let mut h = head("x-api-key: nope\r\nx-api-key-name: forged\r\n");
        assert!(matches!(run(&f, &mut h, &denials), Step::Continue));
        let edits = &h.edits.as_ref().unwrap().headers;
        assert!(edits.drops(b"x-api-key-name") && edits.appended_value("x-api-key-name").is_none());
        assert_eq!(denials.count(Denial::KeyInvalid, true), 1);
    }

    #[test]
    fn key_files_and_duplicates() {
        let text = format!("# keys\nops:s3cret\n\nci: {{SHA256}}{}\n", hex(&sha256(b"ci-key")));
        let keys = parse_keys_file(&text, "keys.txt").unwrap();
        assert_eq!(keys, vec![("ops".to_string(), sha256(b"s3cret")), ("ci".to_string(), sha256(b"ci-key"))]);
        assert_eq!(parse_keys_file("nokey\n", "k").unwrap_err(), "k:1: expected `name:key` or `name:{SHA256}hex`");
        assert!(parse_keys_file("a:{SHA256}12\n", "k").unwrap_err().starts_with("k:1: a `{SHA256}` key"));
        let dir = std::env::temp_dir().join(format!("portico-api-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keys"), "again:k-123\n").unwrap();
        let (key, message) = ApiKey::new(&config(None, None, false), Some(&dir.join("keys"))).unwrap_err();
        assert_eq!(key, "api_key");
        assert!(message.contains("listed twice"), "{message}");
        let (key, message) = ApiKey::new(&config(None, None, false), Some(&dir.join("missing"))).unwrap_err();
        assert_eq!(key, "api_key.keys_file");
        assert!(message.starts_with("cannot read the key file"), "{message}");
    }
}
