//! Verification keys for the `jwt` filter: keys from the configuration and JSON Web Key Sets (RFC 7517) read
//! from a file or fetched from a URL by a background thread.
//!
//! A fetched set lives in a `JwksSource`, one per URL (and CA file) in the process, kept while a filter uses
//! it, so a reload that keeps the URL keeps the keys and fetches nothing. Its thread (`portico-jwks`) fetches
//! the set at start, every `refresh`, and when a request asks for it because a token names a `kid` the set does
//! not have, at most once per `unknown_kid_interval`. Workers never fetch: a request that waits for a fetch
//! holds no worker (the filter's `Step::Wait`), and is woken by the watch channel the thread publishes each
//! attempt on. A failed fetch (an outage, a bad answer) keeps the keys fetched before, so tokens signed with
//! them still verify; it is logged, and tried again at the next refresh or the next unknown `kid`.

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The largest key set read (a set is a few KiB).
const MAX_JWKS_BYTES: u64 = 1 << 20;

/// One key and the algorithms tokens may use it with.
pub(crate) struct VerifyKey {
    pub kid: Option<String>,
    pub algorithms: Vec<Algorithm>,
    pub key: DecodingKey,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyKey").field("kid", &self.kid).field("algorithms", &self.algorithms).finish()
    }
}

/// A set of keys, numbered so that tokens verified with an older set are checked again.
#[derive(Debug, Default)]
pub(crate) struct KeySet {
    pub keys: Vec<VerifyKey>,
    pub generation: u64,
}

impl KeySet {
    /// The keys a token with `kid` (if any) and `alg` may be verified with.
    pub fn candidates<'a>(&'a self, kid: Option<&'a str>, alg: Algorithm) -> impl Iterator<Item = &'a VerifyKey> {
        self.keys.iter().filter(move |k| {
            k.algorithms.contains(&alg) && (kid.is_none() || k.kid.is_none() || k.kid.as_deref() == kid)
        })
    }

    /// Whether the set has a key named `kid`.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }
}

/// The algorithms a JWK may verify: its `alg`, or what its key type allows.
fn jwk_algorithms(jwk: &Jwk) -> Vec<Algorithm> {
    use Algorithm::*;
    if let Some(alg) = &jwk.common.key_algorithm {
        let named = match alg {
            KeyAlgorithm::HS256 => HS256,
            KeyAlgorithm::HS384 => HS384,
            KeyAlgorithm::HS512 => HS512,
            KeyAlgorithm::ES256 => ES256,
            KeyAlgorithm::ES384 => ES384,
            KeyAlgorithm::RS256 => RS256,
            KeyAlgorithm::RS384 => RS384,
            KeyAlgorithm::RS512 => RS512,
            KeyAlgorithm::PS256 => PS256,
            KeyAlgorithm::PS384 => PS384,
            KeyAlgorithm::PS512 => PS512,
            KeyAlgorithm::EdDSA => EdDSA,
            _ => return vec![],
        };
        return vec![named];
    }
    match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![RS256, RS384, RS512, PS256, PS384, PS512],
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => vec![ES256],
            EllipticCurve::P384 => vec![ES384],
            _ => vec![],
        },
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => vec![EdDSA],
        AlgorithmParameters::OctetKeyPair(_) => vec![],
        AlgorithmParameters::OctetKey(_) => vec![HS256, HS384, HS512],
    }
}

/// The signing keys of a JWKS document. Keys for encryption, of unknown types or that do not parse are
/// skipped (an identity provider may publish keys Portico has no use for); a document that is not a key set
/// is an error.
pub(crate) fn parse_jwks(text: &[u8]) -> Result<Vec<VerifyKey>, String> {
    let doc: serde_json::Value = serde_json::from_slice(text).map_err(|e| format!("not a JSON Web Key Set: {e}"))?;
    let Some(serde_json::Value::Array(listed)) = doc.get("keys") else {
        return Err("not a JSON Web Key Set: no `keys` array".into());
    };
    let mut keys = Vec::with_capacity(listed.len());
    for value in listed.iter().cloned() {
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else { continue };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let algorithms = jwk_algorithms(&jwk);
        let Ok(key) = DecodingKey::from_jwk(&jwk) else { continue };
        if !algorithms.is_empty() {
            keys.push(VerifyKey { kid: jwk.common.key_id.clone(), algorithms, key });
        }
    }
    Ok(keys)
}

/// A key of `jwt.keys`, from its text (a secret, or a public key in PEM).
pub(crate) fn configured_key(kid: Option<String>, algorithm: &str, material: &[u8]) -> Result<VerifyKey, String> {
    let alg = Algorithm::from_str(algorithm).map_err(|_| format!("unknown algorithm {algorithm:?}"))?;
    use Algorithm::*;
    let key = match alg {
        HS256 | HS384 | HS512 => Ok(DecodingKey::from_secret(material)),
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => DecodingKey::from_rsa_pem(material),
        ES256 | ES384 => DecodingKey::from_ec_pem(material),
        EdDSA => DecodingKey::from_ed_pem(material),
    }
    .map_err(|e| format!("not a {algorithm} key: {e}"))?;
    Ok(VerifyKey { kid, algorithms: vec![alg], key })
}

/// Where a key set is fetched from, and how.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct FetchSettings {
    pub url: String,
    /// The CA certificates' PEM, when the configuration names a file (read while the snapshot is built).
    pub ca_pem: Option<Vec<u8>>,
    pub refresh: Duration,
    pub unknown_kid_interval: Duration,
    pub timeout: Duration,
}

/// What the fetching thread and the requests share.
#[derive(Debug, Default)]
struct Schedule {
    /// A request asked for a fetch (an unknown `kid`).
    wanted: bool,
    /// When the last fetch started.
    last_attempt: Option<Instant>,
    /// A fetch is under way.
    in_flight: bool,
    /// Every filter using the source is gone: the thread ends.
    stopped: bool,
}

#[derive(Debug)]
struct Shared {
    schedule: Mutex<Schedule>,
    wake: Condvar,
    keys: ArcSwap<KeySet>,
    /// Bumped after every attempt (failed ones too), so waiting requests look again.
    attempts: tokio::sync::watch::Sender<u64>,
}

/// A key set fetched from a URL, kept current by a background thread.
#[derive(Debug)]
pub(crate) struct JwksSource {
    settings: FetchSettings,
    shared: Arc<Shared>,
}

impl Drop for JwksSource {
    fn drop(&mut self) {
        locked(&self.shared.schedule).stopped = true;
        self.shared.wake.notify_all();
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type Sources = Mutex<HashMap<FetchSettings, Weak<JwksSource>>>;

fn sources() -> &'static Sources {
    static SOURCES: OnceLock<Sources> = OnceLock::new();
    SOURCES.get_or_init(Sources::default)
}

impl JwksSource {
    /// The source for `settings`: the running one, or a new one with its thread started.
    pub fn get(settings: FetchSettings) -> Result<Arc<JwksSource>, String> {
        let mut all = locked(sources());
        all.retain(|_, s| s.strong_count() > 0);
        if let Some(running) = all.get(&settings).and_then(Weak::upgrade) {
            return Ok(running);
        }
        let agent = agent(&settings)?;
        let (attempts, _) = tokio::sync::watch::channel(0);
        let shared = Arc::new(Shared {
            schedule: Mutex::default(),
            wake: Condvar::new(),
            keys: ArcSwap::from_pointee(KeySet::default()),
            attempts,
        });
        let source = Arc::new(JwksSource { settings: settings.clone(), shared: shared.clone() });
        let (url, refresh) = (settings.url.clone(), settings.refresh);
        std::thread::Builder::new()
            .name("portico-jwks".into())
            .spawn(move || fetch_loop(&shared, &agent, &url, refresh))
            .map_err(|e| format!("cannot start the JWKS thread: {e}"))?;
        all.insert(settings, Arc::downgrade(&source));
        Ok(source)
    }

    /// The keys fetched last.
    pub fn keys(&self) -> arc_swap::Guard<Arc<KeySet>> {
        self.shared.keys.load()
    }

    /// Asks for a fetch because a token named a `kid` the set does not have. `None` when a fetch started
    /// less than `unknown_kid_interval` ago (and none is pending): the set stays as it is. Otherwise a
    /// receiver that changes when the fetch is done.
    pub fn want_refresh(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        let mut schedule = locked(&self.shared.schedule);
        // Subscribed under the lock: the attempt under way (or asked for) is published after this.
        let receiver = self.shared.attempts.subscribe();
        if schedule.in_flight {
            return Some(receiver);
        }
        let recent = schedule.last_attempt.is_some_and(|t| t.elapsed() < self.settings.unknown_kid_interval);
        if recent && !schedule.wanted {
            return None;
        }
        schedule.wanted = true;
        drop(schedule);
        self.shared.wake.notify_all();
        Some(receiver)
    }

    /// How long a request waits for a fetch it asked for.
    pub fn wait_limit(&self) -> Duration {
        self.settings.timeout + Duration::from_millis(500)
    }

    /// Whether the first fetch has not ended yet (requests wait for it rather than fail).
    pub fn never_tried(&self) -> bool {
        let schedule = locked(&self.shared.schedule);
        schedule.last_attempt.is_none() || (schedule.in_flight && *self.shared.attempts.borrow() == 0)
    }
}

/// The HTTP client of one source: its timeout, and the CA file's certificates or the system's.
fn agent(settings: &FetchSettings) -> Result<ureq::Agent, String> {
    use ureq::tls::{Certificate, RootCerts, TlsConfig};
    let roots: Vec<Certificate<'static>> = match &settings.ca_pem {
        Some(pem) => {
            let mut certs = Vec::new();
            for item in ureq::tls::parse_pem(pem) {
                if let Ok(ureq::tls::PemItem::Certificate(c)) = item {
                    certs.push(c.to_owned());
                }
            }
            if certs.is_empty() {
                return Err("the CA file holds no certificate".into());
            }
            certs
        }
        None => rustls_native_certs::load_native_certs()
            .certs
            .iter()
            .map(|der| Certificate::from_der(der.as_ref()).to_owned())
            .collect(),
    };
    let tls = TlsConfig::builder().root_certs(RootCerts::Specific(Arc::new(roots))).build();
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(settings.timeout))
        .tls_config(tls)
        .user_agent("portico-jwks")
        .build();
    Ok(config.into())
}

/// Fetches and parses the set at `url`.
fn fetch(agent: &ureq::Agent, url: &str) -> Result<Vec<VerifyKey>, String> {
    let mut response = agent
        .get(url)
        .header("accept", "application/json, application/jwk-set+json")
        .call()
        .map_err(|e| e.to_string())?;
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_JWKS_BYTES)
        .read_to_vec()
        .map_err(|e| format!("reading the answer: {e}"))?;
    let keys = parse_jwks(&body)?;
    if keys.is_empty() {
        return Err("the set has no signing key Portico can use".into());
    }
    Ok(keys)
}

/// The background thread: fetch, publish, sleep until the next refresh or an unknown `kid`'s request.
fn fetch_loop(shared: &Shared, agent: &ureq::Agent, url: &str, refresh: Duration) {
    let mut generation = 0u64;
    loop {
        {
            let mut schedule = locked(&shared.schedule);
            if schedule.stopped {
                return;
            }
            schedule.wanted = false;
            schedule.in_flight = true;
            schedule.last_attempt = Some(Instant::now());
        }
        match fetch(agent, url) {
            Ok(keys) => {
                generation += 1;
                tracing::info!(url, keys = keys.len(), "JWKS fetched");
                shared.keys.store(Arc::new(KeySet { keys, generation }));
            }
            Err(e) => {
                let kept = shared.keys.load().keys.len();
                tracing::warn!(url, kept, "cannot fetch the JWKS ({e}); the keys fetched before stay in use");
            }
        }
        let mut schedule = locked(&shared.schedule);
        schedule.in_flight = false;
        shared.attempts.send_modify(|n| *n += 1);
        let due = Instant::now() + refresh;
        while !schedule.stopped && !schedule.wanted {
            let left = due.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            schedule = shared.wake.wait_timeout(schedule, left).map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7517 appendix A.1's public keys (an EC P-256 key and an RSA key), and a key for encryption.
    const SET: &str = r#"{"keys":[
      {"kty":"EC","crv":"P-256","x":"MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4","y":"4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM","use":"sig","kid":"1"},
      {"kty":"RSA","n":"0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw","e":"AQAB","alg":"RS256","kid":"2011-04-29"},
      {"kty":"RSA","n":"0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw","e":"AQAB","use":"enc","kid":"enc"},
      {"kty":"XYZ","kid":"unknown"}
    ]}"#;

    #[test]
    fn signing_keys_are_read_and_others_skipped() {
        let keys = parse_jwks(SET.as_bytes()).unwrap();
        let summary: Vec<_> = keys.iter().map(|k| (k.kid.clone().unwrap(), k.algorithms.clone())).collect();
        assert_eq!(summary, vec![("1".into(), vec![Algorithm::ES256]), ("2011-04-29".into(), vec![Algorithm::RS256])]);
        let set = KeySet { keys, generation: 1 };
        assert_eq!(set.candidates(Some("1"), Algorithm::ES256).count(), 1);
        assert_eq!(set.candidates(Some("1"), Algorithm::RS256).count(), 0, "a key only verifies its algorithm");
        assert_eq!(set.candidates(None, Algorithm::RS256).count(), 1);
        assert!(set.has_kid("2011-04-29") && !set.has_kid("enc"));
        assert!(parse_jwks(b"{\"keys\": 3}").is_err());
        assert!(parse_jwks(b"[]").is_err());
    }

    #[test]
    fn configured_keys_need_their_algorithm_s_material() {
        assert!(configured_key(None, "HS256", b"0123456789abcdef0123456789abcdef").is_ok());
        let e = configured_key(None, "ES256", b"not a pem").unwrap_err();
        assert!(e.starts_with("not a ES256 key"), "{e}");
        assert!(configured_key(None, "none", b"x").is_err());
    }

    #[test]
    fn a_source_that_cannot_be_reached_keeps_no_keys_and_says_so() {
        // A port nothing listens on: the first attempt fails, and a request's refresh is limited.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let settings = FetchSettings {
            url: format!("http://127.0.0.1:{port}/jwks"),
            ca_pem: None,
            refresh: Duration::from_secs(3600),
            unknown_kid_interval: Duration::from_secs(3600),
            timeout: Duration::from_secs(1),
        };
        let source = JwksSource::get(settings.clone()).unwrap();
        assert!(Arc::ptr_eq(&source, &JwksSource::get(settings).unwrap()), "one source per URL");
        let mut rx = source.shared.attempts.subscribe();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|n| *n >= 1)).await })
            .unwrap()
            .unwrap();
        assert!(source.keys().keys.is_empty());
        assert!(!source.never_tried());
        assert!(source.want_refresh().is_none(), "an unknown kid does not fetch again within the interval");
    }
}
