//! The filters that decide who may pass: `auth_basic`, `api_key` and `ip`, and their checks. Files they name
//! (password and key files) are read when the snapshot is built, where a missing or bad file is reported at
//! its key like any other problem.

use crate::fields::{is_token, OWNED_HEADERS};
use serde::Deserialize;

/// `auth_basic:` HTTP Basic authentication against a password file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthBasicFilter {
    /// `user:hash` lines as `htpasswd` writes them (bcrypt, `$apr1$`, `{SHA}`) or argon2 PHC strings;
    /// re-read on every reload.
    pub users_file: String,
    /// The realm of the `WWW-Authenticate: Basic realm="..."` challenge.
    #[serde(default = "default_realm")]
    pub realm: String,
    /// The request header that carries the user name upstream (a value the client sent is removed).
    #[serde(default = "default_user_header")]
    pub user_header: String,
    /// Keep the client's `Authorization` header on the request sent upstream.
    #[serde(default)]
    pub forward_authorization: bool,
    /// Count and log the requests that would be refused, and refuse none.
    #[serde(default)]
    pub shadow: bool,
}

/// Why "Restricted": what browsers show in their password prompt, and nginx's and Apache's examples use.
fn default_realm() -> String {
    "Restricted".into()
}

/// Why `x-auth-user`: a name that says what it holds, not taken by a standard header.
fn default_user_header() -> String {
    "x-auth-user".into()
}

/// `api_key:` keys in a header or a query parameter, each with a name that goes upstream and to the log.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyFilter {
    /// The request header that holds the key. `x-api-key` when neither `header` nor `query` is given.
    #[serde(default)]
    pub header: Option<String>,
    /// The query parameter that holds the key (read when the header is absent, if both are given).
    #[serde(default)]
    pub query: Option<String>,
    /// Keys written in the configuration.
    #[serde(default)]
    pub keys: Vec<ApiKey>,
    /// A file of `name:key` lines (`name:{SHA256}hex` for a key kept as its SHA-256); re-read on every reload.
    #[serde(default)]
    pub keys_file: Option<String>,
    /// The request header that carries the key's name upstream (a value the client sent is removed).
    #[serde(default = "default_key_name_header")]
    pub name_header: String,
    /// Count and log the requests that would be refused, and refuse none.
    #[serde(default)]
    pub shadow: bool,
}

impl ApiKeyFilter {
    /// Where the key is read: the header (if any) and the query parameter (if any).
    pub fn places(&self) -> (Option<&str>, Option<&str>) {
        match (&self.header, &self.query) {
            (None, None) => (Some(DEFAULT_KEY_HEADER), None),
            (h, q) => (h.as_deref(), q.as_deref()),
        }
    }
}

pub const DEFAULT_KEY_HEADER: &str = "x-api-key";

/// Why `x-api-key-name`: it says it is the key's name, next to the `x-api-key` the key came in.
fn default_key_name_header() -> String {
    "x-api-key-name".into()
}

/// One key of `api_key.keys`: its name and the key itself, or the key's SHA-256.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    /// Forwarded upstream in `name_header` and logged; never the key.
    pub name: String,
    /// The key, as clients send it (masked by `/admin/config`).
    #[serde(default)]
    pub secret: Option<String>,
    /// The key's SHA-256 in hex, so the configuration need not hold the key.
    #[serde(default)]
    pub sha256: Option<String>,
}

/// `ip:` allow and deny lists of CIDR ranges for the client's address.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpFilter {
    /// When not empty, only clients in one of these ranges pass.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Clients in one of these ranges are refused, even when `allow` has them.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Peers whose `x-forwarded-for` says who the client is: the client is the rightmost address in it that is
    /// not a trusted proxy.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Count and log the requests that would be refused, and refuse none.
    #[serde(default)]
    pub shadow: bool,
}

/// An address range as written: `10.0.0.0/8`, `2001:db8::/32`, or one address.
pub fn parse_cidr(text: &str) -> Result<ipnet::IpNet, String> {
    let text = text.trim();
    if let Ok(net) = text.parse::<ipnet::IpNet>() {
        return Ok(net.trunc());
    }
    text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from).map_err(|_| format!("{text:?} is not an address range"))
}

/// Whether `value` may be a header value: no line break or NUL, nothing outside visible ASCII but spaces.
fn is_header_value(value: &str) -> bool {
    value.bytes().all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
}

type Report<'a> = dyn FnMut(&str, String, Option<&str>) + 'a;

/// Checks a header name a filter writes: a token, not one Portico writes, not `host` or `authorization`.
fn check_header_name(name: &str, at: &str, err: &mut Report<'_>) {
    if !is_token(name) {
        err(at, format!("invalid header name {name:?}"), Some("header names are tokens such as x-auth-user"));
    } else if OWNED_HEADERS.iter().chain(&["host", "authorization"]).any(|o| o.eq_ignore_ascii_case(name)) {
        err(at, format!("{name:?} cannot carry an identity: Portico or the client writes it"), None);
    }
}

pub(crate) fn validate_auth_basic(a: &AuthBasicFilter, base: &str, err: &mut Report<'_>) {
    let base = format!("{base}.auth_basic");
    if a.users_file.trim().is_empty() {
        err(&format!("{base}.users_file"), "the password file's path is empty".into(), None);
    }
    if a.realm.bytes().any(|b| b == b'"' || b == b'\\') || !is_header_value(&a.realm) {
        err(&format!("{base}.realm"), "a realm cannot hold quotes, backslashes or line breaks".into(), None);
    }
    check_header_name(&a.user_header, &format!("{base}.user_header"), err);
}

pub(crate) fn validate_api_key(k: &ApiKeyFilter, base: &str, err: &mut Report<'_>) {
    let base = format!("{base}.api_key");
    if let Some(header) = &k.header {
        if !is_token(header) || OWNED_HEADERS.iter().chain(&["host"]).any(|o| o.eq_ignore_ascii_case(header)) {
            err(&format!("{base}.header"), format!("{header:?} cannot hold a key"), None);
        }
    }
    if k.query.as_deref().is_some_and(str::is_empty) {
        err(&format!("{base}.query"), "an empty query parameter name".into(), None);
    }
    check_header_name(&k.name_header, &format!("{base}.name_header"), err);
    if k.header.as_deref().is_some_and(|h| h.eq_ignore_ascii_case(&k.name_header)) {
        err(&format!("{base}.name_header"), "the key's name cannot go in the header the key comes in".into(), None);
    }
    if k.keys.is_empty() && k.keys_file.is_none() {
        err(&base, "no key is configured".into(), Some("list `keys`, or name a `keys_file`"));
    }
    if k.keys_file.as_deref().is_some_and(|f| f.trim().is_empty()) {
        err(&format!("{base}.keys_file"), "the key file's path is empty".into(), None);
    }
    let mut seen = std::collections::HashSet::new();
    for (j, key) in k.keys.iter().enumerate() {
        let at = format!("{base}.keys[{j}]");
        if key.name.is_empty() || !is_header_value(&key.name) {
            err(&format!("{at}.name"), format!("{:?} cannot be a key's name (it is sent as a header)", key.name), None);
        }
        match (&key.secret, &key.sha256) {
            (Some(secret), None) => {
                if secret.is_empty() {
                    err(&format!("{at}.secret"), "an empty key".into(), None);
                } else if !seen.insert(format!("secret {secret}")) {
                    err(&format!("{at}.secret"), "this key is listed twice".into(), None);
                }
            }
            (None, Some(hex)) => {
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    err(&format!("{at}.sha256"), "a SHA-256 is 64 hexadecimal digits".into(), None);
                } else if !seen.insert(hex.to_ascii_lowercase()) {
                    err(&format!("{at}.sha256"), "this key is listed twice".into(), None);
                }
            }
            _ => err(&at, "a key needs exactly one of `secret` and `sha256`".into(), None),
        }
    }
}

pub(crate) fn validate_ip(f: &IpFilter, base: &str, err: &mut Report<'_>) {
    let base = format!("{base}.ip");
    if f.allow.is_empty() && f.deny.is_empty() {
        err(
            &base,
            "an ip filter needs `allow` or `deny` ranges".into(),
            Some("for example `ip: { allow: [10.0.0.0/8] }`"),
        );
    }
    for (key, list) in [("allow", &f.allow), ("deny", &f.deny), ("trusted_proxies", &f.trusted_proxies)] {
        for (j, range) in list.iter().enumerate() {
            if let Err(message) = parse_cidr(range) {
                err(
                    &format!("{base}.{key}[{j}]"),
                    message,
                    Some("write an address or a CIDR range: 10.0.0.0/8, 2001:db8::/32"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::load_str;

    use crate::test_support::{errors, BASE};

    #[test]
    fn the_access_filters_load_with_their_defaults() {
        let yaml = r#"
filters:
  - ip: { allow: [10.0.0.0/8, "::1", 127.0.0.1], deny: [10.1.0.0/16], trusted_proxies: [192.168.0.0/16] }
routes:
  - cluster: api
    filters:
      - auth_basic: { users_file: users.htpasswd }
      - api_key:
          keys:
            - { name: mobile, secret: k-123 }
            - { name: batch, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 }
          keys_file: keys.txt
"#;
        let loaded = load_str(&format!("{BASE}{yaml}"), "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let cfg = &loaded.config;
        assert_eq!(cfg.filters[0].kind(), "ip");
        let [crate::Filter::AuthBasic(basic), crate::Filter::ApiKey(keys)] = &cfg.routes[0].filters[..] else {
            panic!("{:?}", cfg.routes[0].filters)
        };
        assert_eq!((basic.realm.as_str(), basic.user_header.as_str()), ("Restricted", "x-auth-user"));
        assert!(!basic.forward_authorization && !basic.shadow);
        assert_eq!(keys.places(), (Some("x-api-key"), None));
        assert_eq!(keys.name_header, "x-api-key-name");
    }

    #[test]
    fn access_filter_mistakes_are_reported_at_their_keys() {
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - ip: { allow: [10.0.0.0/33] }\n");
        assert!(e.iter().any(|e| e.starts_with("7:23") && e.contains("not an address range")), "{e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - ip: {}\n");
        assert!(e.iter().any(|e| e.contains("needs `allow` or `deny`")), "{e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - auth_basic: { users_file: u, user_header: x-forwarded-for }\n");
        assert!(e.iter().any(|e| e.contains("cannot carry an identity")), "{e:?}");
        let e =
            errors("routes:\n  - cluster: api\n    filters:\n      - auth_basic: { users_file: u, realm: 'a\"b' }\n");
        assert!(e.iter().any(|e| e.contains("a realm cannot hold quotes")), "{e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - auth_basic: { realm: x }\n");
        assert!(e.iter().any(|e| e.contains("users_file")), "a password file is required: {e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - api_key: {}\n");
        assert!(e.iter().any(|e| e.contains("no key is configured")), "{e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - api_key: { keys: [ { name: a, secret: x }, { name: b, secret: x } ] }\n");
        assert!(e.iter().any(|e| e.contains("listed twice")), "{e:?}");
        let e = errors(
            "routes:\n  - cluster: api\n    filters:\n      - api_key: { keys: [ { name: a, sha256: abc } ] }\n",
        );
        assert!(e.iter().any(|e| e.contains("64 hexadecimal digits")), "{e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - api_key: { keys: [ { name: a } ] }\n");
        assert!(e.iter().any(|e| e.contains("exactly one of `secret` and `sha256`")), "{e:?}");
        let e = errors("routes:\n  - cluster: api\n    filters:\n      - api_key: { header: x-k, name_header: X-K, keys: [ { name: a, secret: s } ] }\n");
        assert!(e.iter().any(|e| e.contains("the header the key comes in")), "{e:?}");
    }

    #[test]
    fn ranges_are_addresses_or_cidrs() {
        assert_eq!(super::parse_cidr("10.1.2.3/8").map(|n| n.to_string()).as_deref(), Ok("10.0.0.0/8"));
        assert_eq!(super::parse_cidr("::1").map(|n| n.to_string()).as_deref(), Ok("::1/128"));
        assert!(super::parse_cidr("10.0.0.0/").is_err());
        assert!(super::parse_cidr("example.com").is_err());
    }
}
