//! `jwt`: bearer tokens (RFC 6750) whose signature, issuer, audience, times and claims are checked with the
//! `jsonwebtoken` crate (aws-lc-rs underneath): HS256/384/512, RS256/384/512, PS256/384/512, ES256/384 and
//! EdDSA, against keys from the configuration, a JWKS file, or a JWKS URL (`jwks.rs`).
//!
//! A token that passes goes upstream with the claims `forward_claims` names as headers (values the client
//! sent under those names are always removed first, so a client cannot claim them), without the
//! `Authorization` header unless `forward_authorization`, and with its `identity_claim` (`sub`) as the access
//! log's user. Refusals follow RFC 6750 section 3: no token is `401` with a bare `Bearer` challenge, an
//! unreadable `Authorization` is `400 invalid_request`, a token that does not verify (signature, key, expiry,
//! `nbf`, issuer, audience, a required claim, a revoked `jti`) is `401 invalid_token`, and a verified token
//! without a required claim value is `403 insufficient_scope`.
//!
//! A token that verified is remembered per worker thread (a least-recently-used set of
//! `VERIFIED_PER_WORKER`, found by a 128-bit hash of the token seeded per filter instance, and the token itself
//! compared in full, so no other token can pass for it) until its `exp` (plus the leeway) passes or the JWKS it
//! was verified with changes, so a client's next requests with the same token cost a hash, a lookup and a
//! comparison instead of a signature check. Tokens over `MAX_REMEMBERED_TOKEN` bytes are not remembered. A reload makes a new instance (and so a new set):
//! a changed revocation list applies to every token at once.
//!
//! A token whose `kid` no key has, with a JWKS URL configured, asks the JWKS thread for a fetch (at most one
//! per `unknown_kid_interval`) and waits for it without holding the worker (`Step::Wait`), then is checked
//! against the new set.

use super::denials::Denial;
use super::filter::{Filter, RequestCx, Resume, Step};
use super::jwks::{configured_key, parse_jwks, FetchSettings, JwksSource, KeySet, VerifyKey};
use crate::codec::RequestHead;
use crate::message::LocalResponse;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use portico_config::{JwtFilter, LoadedConfig};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Verified tokens remembered per worker thread, across every `jwt` filter.
const VERIFIED_PER_WORKER: usize = 4096;
/// The longest token remembered: the set holds at most `VERIFIED_PER_WORKER` of these per worker.
const MAX_REMEMBERED_TOKEN: usize = 2048;

/// Every algorithm, in the order of `Validation`s kept per filter.
const ALGORITHMS: [Algorithm; 12] = [
    Algorithm::HS256,
    Algorithm::HS384,
    Algorithm::HS512,
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Numbers filter instances, so the verified set of one never answers for another (or a reloaded one): the
/// number is mixed into the seed of the set's hashes.
static INSTANCES: AtomicU64 = AtomicU64::new(0);

/// What a verified token gives the request.
#[derive(Debug)]
struct Accepted {
    identity: Option<Arc<str>>,
    headers: Vec<(Arc<str>, Arc<str>)>,
    claims: Arc<Map<String, Value>>,
}

struct Remembered {
    /// The token, compared in full on a hit.
    token: Box<[u8]>,
    /// Seconds since the epoch after which the token is no longer taken (its `exp` plus the leeway).
    until: Option<u64>,
    /// The JWKS generation it was verified with (0: a configured key).
    generation: u64,
    accepted: Arc<Accepted>,
}

thread_local! {
    static VERIFIED: RefCell<lru::LruCache<u128, Remembered>> =
        RefCell::new(lru::LruCache::new(NonZeroUsize::new(VERIFIED_PER_WORKER).unwrap_or(NonZeroUsize::MIN)));
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Missing,
    BadRequest,
    Malformed,
    NoKey,
    Signature,
    Expired,
    NotYet,
    Issuer,
    Audience,
    Claim,
    Revoked,
    Scope,
}

impl Refusal {
    fn denial(self) -> Denial {
        match self {
            Refusal::Missing => Denial::JwtMissing,
            Refusal::BadRequest | Refusal::Malformed => Denial::JwtMalformed,
            Refusal::NoKey | Refusal::Signature => Denial::JwtInvalid,
            Refusal::Expired => Denial::JwtExpired,
            Refusal::NotYet => Denial::JwtNotYetValid,
            Refusal::Issuer | Refusal::Audience | Refusal::Claim => Denial::JwtClaims,
            Refusal::Revoked => Denial::JwtRevoked,
            Refusal::Scope => Denial::JwtForbidden,
        }
    }

    /// The status, the RFC 6750 error code and its description.
    fn answer(self) -> (u16, Option<&'static str>, &'static str) {
        let invalid = Some("invalid_token");
        match self {
            Refusal::Missing => (401, None, "a bearer token is required"),
            Refusal::BadRequest => (400, Some("invalid_request"), "the Authorization header cannot be read"),
            Refusal::Malformed => (401, invalid, "the token is not a JWT"),
            Refusal::NoKey => (401, invalid, "no key verifies this token"),
            Refusal::Signature => (401, invalid, "the signature does not verify"),
            Refusal::Expired => (401, invalid, "the token expired"),
            Refusal::NotYet => (401, invalid, "the token is not valid yet"),
            Refusal::Issuer => (401, invalid, "the token has the wrong issuer"),
            Refusal::Audience => (401, invalid, "the token is not meant for this audience"),
            Refusal::Claim => (401, invalid, "the token lacks a required claim"),
            Refusal::Revoked => (401, invalid, "the token was revoked"),
            Refusal::Scope => (403, Some("insufficient_scope"), "the token does not grant this request"),
        }
    }
}

/// What checking a token came to.
enum Outcome {
    Accepted(Arc<Accepted>),
    Refused(Refusal, Option<Arc<str>>),
    /// No key has the token's `kid`, and the JWKS may get it: wait for a fetch.
    NeedKeys(Arc<JwksSource>),
}

#[derive(Debug)]
struct Inner {
    /// The seed of the remembered tokens' hashes: new for every filter instance (and so every reload).
    seed: u64,
    keys: KeySet,
    jwks: Option<Arc<JwksSource>>,
    /// One per entry of `ALGORITHMS`.
    validations: Vec<Validation>,
    leeway: u64,
    /// Claims that must be present, beyond the ones `jsonwebtoken` checks itself.
    require: Vec<String>,
    values: Vec<(String, Vec<Value>)>,
    forward: Vec<(String, Arc<str>)>,
    identity_claim: String,
    revoked: HashSet<String>,
    /// `Bearer realm="..."` or `Bearer`.
    challenge: String,
    forward_authorization: bool,
    shadow: bool,
}

#[derive(Debug, Clone)]
pub struct Jwt(Arc<Inner>);

fn read(loaded: &LoadedConfig, file: &str, key: &str) -> Result<Vec<u8>, (String, String)> {
    let path = loaded.resolve(file);
    std::fs::read(&path).map_err(|e| (format!("jwt.{key}"), format!("cannot read {}: {e}", path.display())))
}

impl Jwt {
    /// Reads the filter's files (keys, a JWKS file, the revocation list: blocking, as building a snapshot is)
    /// and starts (or finds) its JWKS source. An error is (key below the filter, message).
    pub fn new(config: &JwtFilter, loaded: &LoadedConfig) -> Result<Jwt, (String, String)> {
        // Only aws-lc-rs is compiled in; installing it makes the choice explicit (an error: already done).
        let _ = jsonwebtoken::crypto::aws_lc::DEFAULT_PROVIDER.install_default();
        let mut keys = Vec::new();
        for (i, k) in config.keys.iter().enumerate() {
            let at = format!("keys[{i}]");
            let material = match (&k.secret, &k.secret_file, &k.public_key, &k.public_key_file) {
                (Some(s), ..) => s.as_bytes().to_vec(),
                (_, Some(f), ..) => {
                    let mut bytes = read(loaded, f, &format!("{at}.secret_file"))?;
                    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                        bytes.pop();
                    }
                    bytes
                }
                (_, _, Some(pem), _) => pem.as_bytes().to_vec(),
                (_, _, _, Some(f)) => read(loaded, f, &format!("{at}.public_key_file"))?,
                _ => return Err((format!("jwt.{at}"), "a key needs its secret or public key".into())),
            };
            keys.push(configured_key(k.kid.clone(), &k.algorithm, &material).map_err(|m| (format!("jwt.{at}"), m))?);
        }
        if let Some(file) = &config.jwks_file {
            let text = read(loaded, file, "jwks_file")?;
            let found = parse_jwks(&text).map_err(|m| ("jwt.jwks_file".to_string(), m))?;
            if found.is_empty() {
                return Err(("jwt.jwks_file".into(), "the set has no signing key Portico can use".into()));
            }
            keys.extend(found);
        }
        let jwks = match &config.jwks {
            Some(j) => {
                let ca_pem = j.ca_file.as_deref().map(|f| read(loaded, f, "jwks.ca_file")).transpose()?;
                let settings = FetchSettings {
                    url: j.url.trim().to_string(),
                    ca_pem,
                    refresh: j.refresh.0,
                    unknown_kid_interval: j.unknown_kid_interval.0,
                    timeout: j.timeout.0,
                };
                Some(JwksSource::get(settings).map_err(|m| ("jwt.jwks".to_string(), m))?)
            }
            None => None,
        };
        let revoked = match &config.revoked_file {
            Some(file) => String::from_utf8_lossy(&read(loaded, file, "revoked_file")?)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_string)
                .collect(),
            None => HashSet::new(),
        };
        let spec = ["exp", "nbf", "iss", "aud", "sub"];
        let mut required: Vec<&str> = config.require.iter().map(String::as_str).filter(|c| spec.contains(c)).collect();
        if !config.issuer.is_empty() {
            required.push("iss");
        }
        if !config.audience.is_empty() {
            required.push("aud");
        }
        let leeway = config.leeway.0.as_secs();
        let validations = ALGORITHMS
            .iter()
            .map(|alg| {
                let mut v = Validation::new(*alg);
                v.leeway = leeway;
                v.validate_exp = true;
                v.validate_nbf = true;
                v.set_required_spec_claims(&required);
                if config.issuer.is_empty() {
                    v.iss = None;
                } else {
                    v.set_issuer(&config.issuer);
                }
                if config.audience.is_empty() {
                    v.validate_aud = false;
                } else {
                    v.set_audience(&config.audience);
                }
                v
            })
            .collect();
        let challenge = match &config.realm {
            Some(realm) => format!("Bearer realm=\"{realm}\""),
            None => "Bearer".to_string(),
        };
        Ok(Jwt(Arc::new(Inner {
            seed: INSTANCES.fetch_add(1, Ordering::Relaxed) ^ fastrand::u64(..),
            keys: KeySet { keys, generation: 0 },
            jwks,
            validations,
            leeway,
            require: config.require.iter().filter(|c| !spec.contains(&c.as_str())).cloned().collect(),
            values: config.claims.iter().map(|(k, v)| (k.clone(), v.values().to_vec())).collect(),
            forward: config
                .forward_claims
                .iter()
                .map(|(claim, header)| (claim.clone(), Arc::from(header.to_ascii_lowercase())))
                .collect(),
            identity_claim: config.identity_claim.clone(),
            revoked,
            challenge,
            forward_authorization: config.forward_authorization,
            shadow: config.shadow,
        })))
    }
}

/// The bytes of RFC 6750's `b64token`: letters, digits and `-._~+/=` (a table: a token is checked byte by
/// byte on every request, and a comparison per character cost 2,500 instructions for a usual token).
const B64TOKEN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=');
        b += 1;
    }
    table
};

/// The token of `Authorization: Bearer ...`: `Err(true)` when there is none (or another scheme), `Err(false)`
/// when the header cannot be read as a bearer token (RFC 6750's `b64token`).
fn bearer(head: &RequestHead) -> Result<&[u8], bool> {
    let mut values = head.values("authorization");
    let value = crate::codec::trim(values.next().ok_or(true)?);
    if values.next().is_some() {
        return Err(false);
    }
    let space = value.iter().position(|&b| b == b' ').ok_or(!value.eq_ignore_ascii_case(b"bearer"))?;
    let (scheme, token) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(true);
    }
    let token = crate::codec::trim(token);
    if token.is_empty() || !token.iter().all(|&b| B64TOKEN[b as usize]) {
        return Err(false);
    }
    Ok(token)
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A claim as a header value: strings as they are, other JSON as its text, an array of strings joined with
/// commas; bytes a header cannot carry (controls, and non-ASCII, which HTTP/2 refuses) percent-encoded.
fn header_value(value: &Value) -> Option<String> {
    let text = match value {
        Value::Null => return None,
        Value::String(s) => s.clone(),
        Value::Array(items) if items.iter().all(Value::is_string) => {
            items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",")
        }
        other => other.to_string(),
    };
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b == b'%' || !(b' '..=b'~').contains(&b) {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(b as char);
        }
    }
    Some(out)
}

/// Whether `claim` holds `wanted`: equal, an element of an array claim, or a word of a space-separated
/// `scope`/`scp` claim.
fn claim_matches(name: &str, claim: &Value, wanted: &Value) -> bool {
    match claim {
        Value::Array(items) => items.iter().any(|i| i == wanted),
        Value::String(s) if name == "scope" || name == "scp" => {
            wanted.as_str().is_some_and(|w| s.split(' ').any(|word| word == w))
        }
        other => other == wanted,
    }
}

impl Inner {
    fn cache_key(&self, token: &[u8]) -> u128 {
        xxhash_rust::xxh3::xxh3_128_with_seed(token, self.seed)
    }

    fn generation(&self) -> u64 {
        self.jwks.as_ref().map_or(0, |j| j.keys().generation)
    }

    /// The token's outcome if this worker verified it before and it still holds.
    fn remembered(&self, token: &[u8], key: u128) -> Option<Arc<Accepted>> {
        VERIFIED.with(|v| {
            let mut v = v.borrow_mut();
            let r = v.get(&key)?;
            if &*r.token != token {
                return None;
            }
            let current = r.generation == 0 || r.generation == self.generation();
            if r.until.is_none_or(|until| now_secs() <= until) && current {
                return Some(r.accepted.clone());
            }
            v.pop(&key);
            None
        })
    }

    /// Checks `token`; `may_fetch`: an unknown `kid` may ask the JWKS for a fetch.
    fn check(&self, token: &str, key: u128, may_fetch: bool) -> Outcome {
        if let Some(accepted) = self.remembered(token.as_bytes(), key) {
            return Outcome::Accepted(accepted);
        }
        let generation = self.generation();
        let Ok(header) = jsonwebtoken::decode_header(token) else {
            return Outcome::Refused(Refusal::Malformed, None);
        };
        let Some(at) = ALGORITHMS.iter().position(|a| *a == header.alg) else {
            return Outcome::Refused(Refusal::NoKey, None);
        };
        let kid = header.kid.as_deref();
        let fetched = self.jwks.as_ref().map(|j| j.keys());
        let from_jwks: Vec<&VerifyKey> =
            fetched.as_ref().map(|set| set.candidates(kid, header.alg).collect()).unwrap_or_default();
        let candidates: Vec<(&VerifyKey, u64)> = self
            .keys
            .candidates(kid, header.alg)
            .map(|k| (k, 0))
            .chain(from_jwks.into_iter().map(|k| (k, generation)))
            .collect();
        if candidates.is_empty() {
            if let (Some(source), true) = (&self.jwks, may_fetch) {
                let unknown = kid.is_some_and(|k| !fetched.as_ref().is_some_and(|s| s.has_kid(k)));
                if unknown || source.never_tried() || fetched.as_ref().is_some_and(|s| s.keys.is_empty()) {
                    return Outcome::NeedKeys(source.clone());
                }
            }
            return Outcome::Refused(Refusal::NoKey, None);
        }
        let mut refusal = Refusal::Signature;
        for (candidate, generation) in candidates {
            match jsonwebtoken::decode::<Map<String, Value>>(token, &candidate.key, &self.validations[at]) {
                Ok(data) => return self.accept(token, data.claims, key, generation),
                Err(e) => {
                    refusal = match e.kind() {
                        ErrorKind::InvalidSignature
                        | ErrorKind::InvalidAlgorithm
                        | ErrorKind::InvalidEcdsaKey
                        | ErrorKind::InvalidRsaKey(_)
                        | ErrorKind::InvalidEddsaKey
                        | ErrorKind::InvalidKeyFormat => continue,
                        ErrorKind::ExpiredSignature => Refusal::Expired,
                        ErrorKind::ImmatureSignature => Refusal::NotYet,
                        ErrorKind::InvalidIssuer => Refusal::Issuer,
                        ErrorKind::InvalidAudience => Refusal::Audience,
                        ErrorKind::MissingRequiredClaim(_) | ErrorKind::InvalidClaimFormat(_) => Refusal::Claim,
                        _ => Refusal::Malformed,
                    };
                    // The signature verified (claims are checked after it): no other key would do better.
                    break;
                }
            }
        }
        Outcome::Refused(refusal, None)
    }

    /// The claims of a token whose signature, times, issuer and audience are good: revocation, required
    /// claims and values, then what goes upstream.
    fn accept(&self, token: &str, claims: Map<String, Value>, key: u128, generation: u64) -> Outcome {
        let identity = claims.get(&self.identity_claim).and_then(|v| match v {
            Value::String(s) => Some(Arc::from(s.as_str())),
            Value::Number(n) => Some(Arc::from(n.to_string())),
            _ => None,
        });
        if let Some(Value::String(jti)) = claims.get("jti") {
            if self.revoked.contains(jti) {
                return Outcome::Refused(Refusal::Revoked, identity);
            }
        }
        if self.require.iter().any(|c| claims.get(c).is_none_or(Value::is_null)) {
            return Outcome::Refused(Refusal::Claim, identity);
        }
        for (name, wanted) in &self.values {
            let held = claims.get(name).is_some_and(|c| wanted.iter().any(|w| claim_matches(name, c, w)));
            if !held {
                return Outcome::Refused(Refusal::Scope, identity);
            }
        }
        let headers = self
            .forward
            .iter()
            .filter_map(|(claim, header)| {
                let value = header_value(claims.get(claim)?)?;
                Some((header.clone(), Arc::from(value)))
            })
            .collect();
        let until =
            claims.get("exp").and_then(Value::as_f64).map(|exp| (exp.max(0.0) as u64).saturating_add(self.leeway));
        let accepted = Arc::new(Accepted { identity, headers, claims: Arc::new(claims) });
        if token.len() <= MAX_REMEMBERED_TOKEN {
            let remembered =
                Remembered { token: token.as_bytes().into(), until, generation, accepted: accepted.clone() };
            VERIFIED.with(|v| v.borrow_mut().put(key, remembered));
        }
        Outcome::Accepted(accepted)
    }

    fn pass(&self, head: &mut RequestHead, accepted: &Accepted) -> Step {
        let edits = head.edits_mut();
        for (name, value) in &accepted.headers {
            edits.headers.set(name.clone(), value.clone());
        }
        if accepted.identity.is_some() {
            edits.identity = accepted.identity.clone();
        }
        edits.claims = Some(accepted.claims.clone());
        Step::Continue
    }

    fn refuse(&self, refusal: Refusal, who: Option<&str>, cx: &RequestCx<'_>) -> Step {
        cx.denials.record(refusal.denial(), self.shadow, cx.peer, who);
        if self.shadow {
            return Step::Continue;
        }
        let (status, error, description) = refusal.answer();
        let challenge = match error {
            None => self.challenge.clone(),
            Some(code) => {
                let sep = if self.challenge.len() > "Bearer".len() { "," } else { "" };
                format!("{}{sep} error=\"{code}\", error_description=\"{description}\"", self.challenge)
            }
        };
        let mut answer = LocalResponse::text(status, description);
        answer.headers.push(("www-authenticate".into(), challenge.into()));
        Step::Respond(answer)
    }

    fn decide(
        self: &Arc<Self>,
        head: &mut RequestHead,
        cx: &RequestCx<'_>,
        token: String,
        key: u128,
        may_fetch: bool,
    ) -> Step {
        match self.check(&token, key, may_fetch) {
            Outcome::Accepted(accepted) => self.pass(head, &accepted),
            Outcome::Refused(refusal, who) => self.refuse(refusal, who.as_deref(), cx),
            Outcome::NeedKeys(source) => {
                let Some(mut fetched) = source.want_refresh() else {
                    return self.refuse(Refusal::NoKey, None, cx);
                };
                let this = self.clone();
                let limit = source.wait_limit();
                Step::Wait(Box::pin(async move {
                    let _ = tokio::time::timeout(limit, fetched.changed()).await;
                    let resume: Resume = Box::new(move |head: &mut RequestHead, cx: &RequestCx<'_>| {
                        this.decide(head, cx, token, key, false)
                    });
                    resume
                }))
            }
        }
    }
}

impl Filter for Jwt {
    fn on_request(&self, head: &mut RequestHead, cx: &RequestCx<'_>) -> Step {
        let this = &self.0;
        // A token this worker verified before is found without copying it.
        let found = bearer(head).map(|token| {
            let key = this.cache_key(token);
            (key, this.remembered(token, key).ok_or_else(|| String::from_utf8_lossy(token).into_owned()))
        });
        let edits = head.edits_mut();
        for (_, header) in &this.forward {
            edits.headers.remove(header.clone());
        }
        if !this.forward_authorization {
            edits.headers.remove("authorization");
        }
        match found {
            Ok((_, Ok(accepted))) => this.pass(head, &accepted),
            Ok((key, Err(token))) => this.decide(head, cx, token, key, true),
            Err(true) => this.refuse(Refusal::Missing, None, cx),
            Err(false) => this.refuse(Refusal::BadRequest, None, cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filters::auth_basic::tests::head;
    use crate::filters::Denials;
    use jsonwebtoken::{encode, EncodingKey, Header};

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn filter(extra: &str) -> Jwt {
        let yaml = format!(
            "listeners: [ {{ name: web, address: 127.0.0.1:8080 }} ]\nroutes:\n  - static: {{ status: 200 }}\n    filters:\n      - jwt: {{ keys: [ {{ kid: k1, algorithm: HS256, secret: \"{SECRET}\" }} ], {extra} }}\n"
        );
        let loaded = portico_config::load_str(&yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"));
        let portico_config::Filter::Jwt(config) = &loaded.config.routes[0].filters[0] else { panic!() };
        Jwt::new(config, &loaded).unwrap()
    }

    fn token(claims: Value, kid: Option<&str>) -> String {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = kid.map(str::to_string);
        let _ = jsonwebtoken::crypto::aws_lc::DEFAULT_PROVIDER.install_default();
        encode(&header, &claims, &EncodingKey::from_secret(SECRET.as_bytes())).unwrap()
    }

    fn run(f: &Jwt, h: &mut RequestHead, denials: &Denials) -> Step {
        let cx = RequestCx { matched_path: b"/x", captures: &[], prefix: None, peer: [127, 0, 0, 1].into(), denials };
        f.on_request(h, &cx)
    }

    fn refused(step: Step) -> (u16, String) {
        let Step::Respond(r) = step else { panic!("passed: {step:?}") };
        let challenge = r.headers.iter().find(|(n, _)| &**n == "www-authenticate").map(|(_, v)| v.to_string());
        (r.status, challenge.unwrap_or_default())
    }

    #[test]
    fn bearer_tokens_are_read_as_rfc_6750_says() {
        assert_eq!(bearer(&head("authorization: Bearer abc.DEF-_~+/=\r\n")), Ok(&b"abc.DEF-_~+/="[..]));
        assert_eq!(bearer(&head("authorization: bearer   abc \r\n")), Ok(&b"abc"[..]));
        assert_eq!(bearer(&head("")), Err(true));
        assert_eq!(bearer(&head("authorization: Basic YTpi\r\n")), Err(true));
        assert_eq!(bearer(&head("authorization: Bearer\r\n")), Err(false));
        assert_eq!(bearer(&head("authorization: Bearer a\"b\r\n")), Err(false));
        assert_eq!(bearer(&head("authorization: Bearer a\r\nauthorization: Bearer b\r\n")), Err(false));
    }

    #[test]
    fn a_good_token_passes_with_its_claims_forwarded() {
        let f = filter("forward_claims: { sub: x-user, roles: x-roles, name: x-name }, audience: api, issuer: idp");
        let denials = Denials::new("r");
        let exp = now_secs() + 600;
        let t = token(
            serde_json::json!({"sub": "alice", "exp": exp, "aud": ["api", "x"], "iss": "idp", "roles": ["a", "b"], "name": "José"}),
            Some("k1"),
        );
        for _ in 0..2 {
            let mut h = head(&format!("authorization: Bearer {t}\r\nx-user: mallory\r\nx_user: mallory\r\n"));
            assert!(matches!(run(&f, &mut h, &denials), Step::Continue));
            let edits = h.edits.as_ref().unwrap();
            assert!(edits.headers.drops(b"x-user") && edits.headers.drops(b"authorization"));
            assert_eq!(edits.headers.appended_value("x-user"), Some("alice"));
            assert_eq!(edits.headers.appended_value("x-roles"), Some("a,b"));
            assert_eq!(edits.headers.appended_value("x-name"), Some("Jos%C3%A9"));
            assert_eq!(edits.identity.as_deref(), Some("alice"));
            assert_eq!(edits.claims.as_ref().unwrap()["sub"], "alice");
        }
    }

    #[test]
    fn refusals_answer_as_rfc_6750_says() {
        let f = filter("realm: api, audience: api, issuer: idp, require: [exp, tenant], claims: { scope: write }");
        let denials = Denials::new("r");
        let now = now_secs();
        let good = serde_json::json!({"sub": "a", "exp": now + 600, "aud": "api", "iss": "idp", "tenant": "t", "scope": "read write"});
        let with = |changes: Value| {
            let mut claims = good.clone();
            for (k, v) in changes.as_object().unwrap() {
                if v.is_null() {
                    claims.as_object_mut().unwrap().remove(k);
                } else {
                    claims[k] = v.clone();
                }
            }
            format!("authorization: Bearer {}\r\n", token(claims, Some("k1")))
        };
        assert!(matches!(run(&f, &mut head(&with(serde_json::json!({}))), &denials), Step::Continue));
        assert_eq!(refused(run(&f, &mut head(""), &denials)), (401, "Bearer realm=\"api\"".into()));
        let cases = [
            (with(serde_json::json!({"exp": now - 120})), 401, "invalid_token", Denial::JwtExpired),
            (with(serde_json::json!({"exp": now - 30})), 0, "", Denial::JwtExpired),
            (with(serde_json::json!({"nbf": now + 600})), 401, "invalid_token", Denial::JwtNotYetValid),
            (with(serde_json::json!({"aud": "other"})), 401, "invalid_token", Denial::JwtClaims),
            (with(serde_json::json!({"iss": "evil"})), 401, "invalid_token", Denial::JwtClaims),
            (with(serde_json::json!({"exp": null})), 401, "invalid_token", Denial::JwtClaims),
            (with(serde_json::json!({"tenant": null})), 401, "invalid_token", Denial::JwtClaims),
            (with(serde_json::json!({"scope": "read"})), 403, "insufficient_scope", Denial::JwtForbidden),
            (with(serde_json::json!({"exp": "never"})), 401, "invalid_token", Denial::JwtClaims),
            ("authorization: Bearer not.a.jwt\r\n".into(), 401, "invalid_token", Denial::JwtMalformed),
            ("authorization: Bearer a b\r\n".into(), 400, "invalid_request", Denial::JwtMalformed),
        ];
        for (extra, status, code, denial) in cases {
            let before = denials.count(denial, false);
            let step = run(&f, &mut head(&extra), &denials);
            if status == 0 {
                assert!(matches!(step, Step::Continue), "within the leeway: {extra}");
                continue;
            }
            let (got, challenge) = refused(step);
            assert_eq!(got, status, "{extra}");
            assert!(
                challenge.starts_with(&format!("Bearer realm=\"api\", error=\"{code}\", error_description=\"")),
                "{challenge}"
            );
            assert_eq!(denials.count(denial, false), before + 1, "{extra}");
        }
        // A signature made with another secret.
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k1".into());
        let forged = encode(&header, &good, &EncodingKey::from_secret(b"another secret, 32 bytes long!!!")).unwrap();
        let (status, challenge) = refused(run(&f, &mut head(&format!("authorization: Bearer {forged}\r\n")), &denials));
        assert_eq!(status, 401);
        assert!(challenge.contains("the signature does not verify"), "{challenge}");
        // An unknown kid, and an algorithm no key has (alg confusion: HS256 keys only).
        let other = token(good.clone(), Some("k2"));
        assert!(refused(run(&f, &mut head(&format!("authorization: Bearer {other}\r\n")), &denials))
            .1
            .contains("no key verifies"));
    }

    #[test]
    fn revoked_tokens_are_refused_and_shadow_mode_lets_through() {
        let dir = std::env::temp_dir().join(format!("portico-jwt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("revoked"), "# revoked\nbad-1\n\n").unwrap();
        let f = filter(&format!("revoked_file: \"{}\"", dir.join("revoked").display()));
        let denials = Denials::new("r");
        let exp = now_secs() + 600;
        let bad = token(serde_json::json!({"sub": "a", "exp": exp, "jti": "bad-1"}), None);
        let fine = token(serde_json::json!({"sub": "a", "exp": exp, "jti": "ok-1"}), None);
        assert_eq!(refused(run(&f, &mut head(&format!("authorization: Bearer {bad}\r\n")), &denials)).0, 401);
        assert_eq!(denials.count(Denial::JwtRevoked, false), 1);
        assert!(matches!(run(&f, &mut head(&format!("authorization: Bearer {fine}\r\n")), &denials), Step::Continue));
        let shadow = filter("shadow: true, forward_claims: { sub: x-user }");
        let expired = token(serde_json::json!({"sub": "a", "exp": exp - 7200}), None);
        let mut h = head(&format!("authorization: Bearer {expired}\r\nx-user: forged\r\n"));
        assert!(matches!(run(&shadow, &mut h, &denials), Step::Continue));
        let edits = h.edits.as_ref().unwrap();
        assert!(edits.headers.drops(b"x-user") && edits.headers.appended_value("x-user").is_none());
        assert_eq!(denials.count(Denial::JwtExpired, true), 1);
    }

    #[test]
    fn claim_values_match_as_documented() {
        let scope = Value::from("read write");
        assert!(claim_matches("scope", &scope, &"write".into()) && !claim_matches("scope", &scope, &"wri".into()));
        assert!(!claim_matches("title", &scope, &"write".into()), "only scope and scp are word lists");
        assert!(claim_matches("roles", &serde_json::json!(["a", "b"]), &"b".into()));
        assert!(claim_matches("admin", &Value::Bool(true), &Value::Bool(true)));
        assert!(claim_matches("level", &serde_json::json!(3), &serde_json::json!(3)));
        assert_eq!(header_value(&serde_json::json!({"a": 1})).as_deref(), Some("{\"a\":1}"));
        assert_eq!(header_value(&Value::from("a\r\nb%")).as_deref(), Some("a%0D%0Ab%25"));
        assert_eq!(header_value(&Value::Null), None);
    }
}
