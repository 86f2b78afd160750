//! The `jwt` filter's settings: where its keys come from (inline, files, a JWKS file or URL), what a token
//! must claim, which claims go upstream, and the revocation list.

use crate::fields::{is_token, OWNED_HEADERS};
use crate::units::HumanDuration;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// The signature algorithms a key may be used with.
pub const JWT_ALGORITHMS: [&str; 12] =
    ["HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"];

/// `jwt:` bearer tokens (RFC 6750) verified against configured keys or a JWKS.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtFilter {
    /// Keys written in the configuration or in files of their own.
    #[serde(default)]
    pub keys: Vec<JwtKey>,
    /// A JSON Web Key Set in a file (RFC 7517), read with the configuration.
    #[serde(default)]
    pub jwks_file: Option<String>,
    /// A JSON Web Key Set fetched from a URL in the background and refreshed.
    #[serde(default)]
    pub jwks: Option<JwksSource>,
    /// The `iss` a token must have (one of these), when given.
    #[serde(default, deserialize_with = "one_or_many")]
    pub issuer: Vec<String>,
    /// An `aud` a token must have (one of these), when given.
    #[serde(default, deserialize_with = "one_or_many")]
    pub audience: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "default_leeway")]
    pub leeway: HumanDuration,
    /// Claims a token must have. `[exp]` by default (a token without an expiry is refused).
    #[serde(default = "default_require")]
    pub require: Vec<String>,
    /// Claims a token must have with a value: `{ role: admin }`, `{ scope: write }`, `{ tenant: [a, b] }` (one
    /// of). An array claim must contain the value; `scope` and `scp` are space-separated lists (RFC 8693).
    #[serde(default)]
    pub claims: BTreeMap<String, ClaimValue>,
    /// Claims sent upstream as request headers: `{ sub: x-user-id, email: x-user-email }`.
    #[serde(default)]
    pub forward_claims: BTreeMap<String, String>,
    /// The claim that names the client in the access log.
    #[serde(default = "default_identity_claim")]
    pub identity_claim: String,
    /// A file of revoked token ids (`jti`), one a line; read with the configuration (and watched with
    /// `watch: true`).
    #[serde(default)]
    pub revoked_file: Option<String>,
    /// The realm of the `WWW-Authenticate: Bearer realm="..."` challenge.
    #[serde(default)]
    pub realm: Option<String>,
    /// Keep the client's `Authorization` header on the request sent upstream.
    #[serde(default)]
    pub forward_authorization: bool,
    /// Count and log the requests that would be refused, and refuse none.
    #[serde(default)]
    pub shadow: bool,
}

fn default_leeway() -> HumanDuration {
    HumanDuration::secs(60)
}

fn default_require() -> Vec<String> {
    vec!["exp".into()]
}

fn default_identity_claim() -> String {
    "sub".into()
}

/// One key of `jwt.keys`: its algorithm and exactly one of `secret`, `secret_file`, `public_key` (PEM) and
/// `public_key_file`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtKey {
    /// The `kid` tokens signed with it name; a token without `kid` is tried against every key of its algorithm.
    #[serde(default)]
    pub kid: Option<String>,
    /// `HS256`, `HS384`, `HS512`, `RS256`, `RS384`, `RS512`, `PS256`, `PS384`, `PS512`, `ES256`, `ES384` or `EdDSA`.
    pub algorithm: String,
    /// An HMAC secret (HS*), as written (masked by `/admin/config`).
    #[serde(default)]
    pub secret: Option<String>,
    /// A file holding the HMAC secret (its bytes, a final newline removed).
    #[serde(default)]
    pub secret_file: Option<String>,
    /// A public key in PEM (`-----BEGIN PUBLIC KEY-----`; `BEGIN RSA PUBLIC KEY` too).
    #[serde(default)]
    pub public_key: Option<String>,
    /// A file holding a public key in PEM.
    #[serde(default)]
    pub public_key_file: Option<String>,
}

/// `jwt.jwks`: a JSON Web Key Set fetched over HTTP(S) by a background thread.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct JwksSource {
    /// `https://idp.example.com/.well-known/jwks.json` (or `http://` on a trusted network).
    pub url: String,
    /// How often the set is fetched again.
    #[serde(default = "default_refresh")]
    pub refresh: HumanDuration,
    /// A token whose `kid` is not in the set has it fetched again at once, at most once per this interval.
    #[serde(default = "default_unknown_kid_interval")]
    pub unknown_kid_interval: HumanDuration,
    /// How long one fetch may take.
    #[serde(default = "default_jwks_timeout")]
    pub timeout: HumanDuration,
    /// CA certificates (PEM) to trust for an `https` URL instead of the system's.
    #[serde(default)]
    pub ca_file: Option<String>,
}

fn default_refresh() -> HumanDuration {
    HumanDuration::secs(600)
}

fn default_unknown_kid_interval() -> HumanDuration {
    HumanDuration::secs(30)
}

fn default_jwks_timeout() -> HumanDuration {
    HumanDuration::secs(5)
}

/// A required claim's value: one value, or a list of which one must match.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ClaimValue {
    AnyOf(Vec<serde_json::Value>),
    One(serde_json::Value),
}

impl ClaimValue {
    pub fn values(&self) -> &[serde_json::Value] {
        match self {
            ClaimValue::One(v) => std::slice::from_ref(v),
            ClaimValue::AnyOf(v) => v,
        }
    }
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        One(String),
        Many(Vec<String>),
    }
    Form::deserialize(d).map(|f| match f {
        Form::One(s) => vec![s],
        Form::Many(v) => v,
    })
}

type Report<'a> = dyn FnMut(&str, String, Option<&str>) + 'a;

pub(crate) fn validate_jwt(j: &JwtFilter, base: &str, err: &mut Report<'_>) {
    let base = format!("{base}.jwt");
    if j.keys.is_empty() && j.jwks_file.is_none() && j.jwks.is_none() {
        err(&base, "no key is configured".into(), Some("list `keys`, or give a `jwks_file` or a `jwks: { url }`"));
    }
    for (i, k) in j.keys.iter().enumerate() {
        let at = format!("{base}.keys[{i}]");
        let alg = k.algorithm.as_str();
        if !JWT_ALGORITHMS.contains(&alg) {
            err(&format!("{at}.algorithm"), format!("unknown algorithm {alg:?}"), Some(&JWT_ALGORITHMS.join(", ")));
            continue;
        }
        let given = [&k.secret, &k.secret_file, &k.public_key, &k.public_key_file];
        if given.iter().filter(|g| g.is_some()).count() != 1 {
            err(
                &at,
                "a key needs exactly one of `secret`, `secret_file`, `public_key` and `public_key_file`".into(),
                None,
            );
            continue;
        }
        let hmac = alg.starts_with("HS");
        if hmac && (k.public_key.is_some() || k.public_key_file.is_some()) {
            err(&at, format!("{alg} is an HMAC: its key is a `secret` or `secret_file`"), None);
        } else if !hmac && (k.secret.is_some() || k.secret_file.is_some()) {
            err(&at, format!("{alg} verifies with a public key: `public_key` or `public_key_file`"), None);
        }
        if k.secret.as_deref().is_some_and(|s| s.len() < 32) {
            err(&format!("{at}.secret"), "an HMAC secret shorter than 32 bytes can be guessed".into(), None);
        }
    }
    if let Some(jwks) = &j.jwks {
        let url = jwks.url.trim();
        if !(url.starts_with("https://") || url.starts_with("http://")) || url::Url::parse(url).is_err() {
            err(&format!("{base}.jwks.url"), format!("{url:?} is not an http or https URL"), None);
        }
        if jwks.refresh.0 < std::time::Duration::from_secs(1) {
            err(&format!("{base}.jwks.refresh"), "refresh at most once a second".into(), None);
        }
        if jwks.timeout.0.is_zero() {
            err(&format!("{base}.jwks.timeout"), "a fetch needs some time".into(), None);
        }
    }
    for (key, list) in [("issuer", &j.issuer), ("audience", &j.audience)] {
        if list.iter().any(String::is_empty) {
            err(&format!("{base}.{key}"), format!("an empty {key}"), None);
        }
    }
    for (i, claim) in j.require.iter().enumerate() {
        if claim.is_empty() {
            err(&format!("{base}.require[{i}]"), "an empty claim name".into(), None);
        }
    }
    for (claim, value) in &j.claims {
        if value.values().is_empty() || value.values().iter().any(|v| v.is_object() || v.is_array() || v.is_null()) {
            err(
                &format!("{base}.claims.{claim}"),
                "a required value is a string, a number or a boolean, or a list of them".into(),
                None,
            );
        }
    }
    for (claim, header) in &j.forward_claims {
        let at = format!("{base}.forward_claims.{claim}");
        if !is_token(header) {
            err(&at, format!("invalid header name {header:?}"), Some("header names are tokens such as x-user-id"));
        } else if OWNED_HEADERS.iter().chain(&["host", "authorization"]).any(|o| o.eq_ignore_ascii_case(header)) {
            err(&at, format!("{header:?} cannot carry a claim: Portico or the client writes it"), None);
        }
    }
    if let Some(realm) = &j.realm {
        if realm.bytes().any(|b| b == b'"' || b == b'\\' || !(b' '..=b'~').contains(&b)) {
            err(&format!("{base}.realm"), "a realm is printable ASCII without quotes or backslashes".into(), None);
        }
    }
    for (key, file) in [("jwks_file", &j.jwks_file), ("revoked_file", &j.revoked_file)] {
        if file.as_deref().is_some_and(|f| f.trim().is_empty()) {
            err(&format!("{base}.{key}"), "an empty path".into(), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load_str;

    use crate::test_support::{errors, BASE};

    #[test]
    fn the_filter_loads_with_its_defaults() {
        let yaml = r#"
routes:
  - cluster: api
    filters:
      - jwt:
          keys:
            - { kid: k1, algorithm: ES256, public_key_file: ec.pem }
            - { algorithm: HS256, secret: "0123456789abcdef0123456789abcdef" }
          jwks: { url: "https://idp.example.com/jwks.json" }
          issuer: https://idp.example.com
          audience: [api, web]
          claims: { scope: write, tenant: [a, b], admin: true }
          forward_claims: { sub: x-user-id }
"#;
        let loaded = load_str(&format!("{BASE}{yaml}"), "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let [crate::Filter::Jwt(j)] = &loaded.config.routes[0].filters[..] else { panic!() };
        assert_eq!(j.issuer, ["https://idp.example.com"]);
        assert_eq!(j.audience, ["api", "web"]);
        assert_eq!(
            (j.leeway, j.require.clone(), j.identity_claim.as_str()),
            (HumanDuration::secs(60), vec!["exp".to_string()], "sub")
        );
        let jwks = j.jwks.as_ref().unwrap();
        assert_eq!(
            (jwks.refresh, jwks.unknown_kid_interval, jwks.timeout),
            (HumanDuration::secs(600), HumanDuration::secs(30), HumanDuration::secs(5))
        );
        assert_eq!(j.claims["tenant"].values().len(), 2);
        assert_eq!(j.claims["admin"].values(), [serde_json::Value::Bool(true)]);
        assert!(!j.shadow && !j.forward_authorization);
    }

    #[test]
    fn mistakes_are_reported_at_their_keys() {
        let route = |f: &str| errors(&format!("routes:\n  - cluster: api\n    filters:\n      - jwt: {f}\n"));
        let e = route("{}");
        assert!(e.iter().any(|e| e.contains("no key is configured")), "{e:?}");
        let e = route("{ keys: [ { algorithm: HS257, secret: x } ] }");
        assert!(e.iter().any(|e| e.contains("unknown algorithm \"HS257\"")), "{e:?}");
        let e = route("{ keys: [ { algorithm: ES256, secret: 0123456789abcdef0123456789abcdef } ] }");
        assert!(e.iter().any(|e| e.contains("verifies with a public key")), "{e:?}");
        let e = route("{ keys: [ { algorithm: HS256, public_key_file: k.pem } ] }");
        assert!(e.iter().any(|e| e.contains("is an HMAC")), "{e:?}");
        let e = route("{ keys: [ { algorithm: HS256, secret: short } ] }");
        assert!(e.iter().any(|e| e.contains("shorter than 32 bytes")), "{e:?}");
        let e = route("{ keys: [ { algorithm: HS256 } ] }");
        assert!(e.iter().any(|e| e.contains("exactly one of")), "{e:?}");
        let e = route("{ jwks: { url: ftp://x/keys } }");
        assert!(e.iter().any(|e| e.contains("not an http or https URL")), "{e:?}");
        let e = route("{ jwks_file: k.json, forward_claims: { sub: x-forwarded-for } }");
        assert!(e.iter().any(|e| e.contains("cannot carry a claim")), "{e:?}");
        let e = route("{ jwks_file: k.json, claims: { roles: { a: 1 } } }");
        assert!(e.iter().any(|e| e.contains("a required value is a string")), "{e:?}");
        let e = route("{ jwks_file: k.json, realm: 'a\"b' }");
        assert!(e.iter().any(|e| e.contains("a realm is printable ASCII")), "{e:?}");
    }
}
