//! `auth_basic`: HTTP Basic authentication (RFC 7617) against a password file (`portico_core::password`).
//!
//! A request without credentials, or with a wrong user or password, is answered `401` with
//! `WWW-Authenticate: Basic realm="..."`; one that passes goes on with its user name in `user_header` (a value
//! the client sent under that name is always removed, so it cannot claim a user) and, unless
//! `forward_authorization`, without its `Authorization` header. The user name is also the access log's `user`.
//!
//! Checking a password is slow on purpose for argon2 and bcrypt (milliseconds), and a worker must not stop for
//! it: such a check runs on tokio's blocking pool, at most one per CPU core at a time across the process (a
//! semaphore: more would only queue in the kernel), while the request waits without holding the worker.
//! A successful check is remembered per worker thread in a least-recently-used set of `VERIFIED_PER_WORKER`
//! entries, keyed by a SHA-256 of (this filter's instance, user, password) and never by the password itself,
//! so a client's next requests cost a SHA-256 and a lookup. A reload makes new filter instances, so a changed
//! password file is never answered from the old one's entries. Failures are not remembered. An unknown user's
//! password is checked against another user's hash all the same, so that the answer takes as long and does
//! not tell which users exist.

use super::denials::Denial;
use super::filter::{Filter, RequestCx, Resume, Step};
use crate::codec::RequestHead;
use crate::message::LocalResponse;
use base64::Engine;
use portico_config::AuthBasicFilter;
use portico_core::password::{PasswordFile, PasswordHash};
use std::cell::RefCell;
use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Successful checks remembered per worker thread, across every `auth_basic` filter: about 100 bytes each.
const VERIFIED_PER_WORKER: usize = 4096;

thread_local! {
    static VERIFIED: RefCell<lru::LruCache<[u8; 32], ()>> =
        RefCell::new(lru::LruCache::new(NonZeroUsize::new(VERIFIED_PER_WORKER).unwrap_or(NonZeroUsize::MIN)));
}

/// Numbers filter instances, so the verified set of one never answers for another (or a reloaded one).
static INSTANCES: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone)]
pub struct AuthBasic {
    instance: u64,
    users: Arc<PasswordFile>,
    challenge: LocalResponse,
    user_header: Arc<str>,
    forward_authorization: bool,
    shadow: bool,
}

impl AuthBasic {
    /// Reads the password file (`users_file`, resolved by the caller): blocking, done while building a
    /// snapshot. An error is (key below the filter, message).
    pub fn new(config: &AuthBasicFilter, path: &std::path::Path) -> Result<AuthBasic, (String, String)> {
        let users = PasswordFile::load(path).map_err(|e| ("auth_basic.users_file".to_string(), e.to_string()))?;
        let mut challenge = LocalResponse::text(401, "authentication required");
        challenge
            .headers
            .push(("www-authenticate".into(), format!("Basic realm=\"{}\", charset=\"UTF-8\"", config.realm).into()));
        Ok(AuthBasic {
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            users: Arc::new(users),
            challenge,
            user_header: Arc::from(config.user_header.to_ascii_lowercase()),
            forward_authorization: config.forward_authorization,
            shadow: config.shadow,
        })
    }

    fn cache_key(&self, user: &str, password: &[u8]) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(self.instance.to_le_bytes());
        h.update((user.len() as u64).to_le_bytes());
        h.update(user.as_bytes());
        h.update(password);
        h.finalize().into()
    }

    /// The request goes on as `user`.
    fn accept(&self, head: &mut RequestHead, user: &str) -> Step {
        let edits = head.edits_mut();
        let user: Arc<str> = Arc::from(user);
        edits.headers.set(self.user_header.clone(), user.clone());
        edits.identity = Some(user);
        Step::Continue
    }

    /// The request is refused (or, in shadow mode, counted and let through without a user).
    fn refuse(&self, denial: Denial, cx: &RequestCx<'_>, client: IpAddr, who: Option<&str>) -> Step {
        cx.denials.record(denial, self.shadow, client, who);
        if self.shadow {
            Step::Continue
        } else {
            Step::Respond(self.challenge.clone())
        }
    }
}

/// The user name and password of `Authorization: Basic ...`; `None` when there is none or it cannot be read.
pub(crate) fn credentials(head: &RequestHead) -> Option<(String, Vec<u8>)> {
    let value = crate::codec::trim(head.values("authorization").next()?);
    let (scheme, token) = value.split_at(value.iter().position(|&b| b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let decoded = engine.decode(crate::codec::trim(token)).ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = std::str::from_utf8(&decoded[..colon]).ok()?;
    if user.is_empty() || user.bytes().any(|b| b.is_ascii_control()) {
        return None;
    }
    Some((user.to_string(), decoded[colon + 1..].to_vec()))
}

/// Checks `password` against `hash` on the blocking pool, at most one check per CPU core at a time.
async fn verify_off_thread(users: Arc<PasswordFile>, user: Option<String>, password: Vec<u8>) -> bool {
    static SLOTS: OnceLock<Arc<tokio::sync::Semaphore>> = OnceLock::new();
    let slots = SLOTS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Arc::new(tokio::sync::Semaphore::new(cores))
    });
    let Ok(permit) = slots.clone().acquire_owned().await else { return false };
    let checked = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let hash: Option<&PasswordHash> = match &user {
            Some(user) => users.get(user),
            None => users.decoy(),
        };
        user.is_some() && hash.is_some_and(|h| h.verify(&password))
    });
    checked.await.unwrap_or(false)
}

impl Filter for AuthBasic {
    fn on_request(&self, head: &mut RequestHead, cx: &RequestCx<'_>) -> Step {
        let client = cx.peer;
        let found = credentials(head);
        let edits = head.edits_mut();
        edits.headers.remove(self.user_header.clone());
        if !self.forward_authorization {
            edits.headers.remove("authorization");
        }
        let Some((user, password)) = found else {
            return self.refuse(Denial::BasicMissing, cx, client, None);
        };
        let key = self.cache_key(&user, &password);
        if VERIFIED.with(|v| v.borrow_mut().get(&key).is_some()) {
            return self.accept(head, &user);
        }
        let hash = self.users.get(&user);
        if let Some(hash) = hash.filter(|h| !h.is_slow()) {
            // APR1 and {SHA}: fast enough to check here (APR1 is a thousand MD5 rounds, about 0.1 ms).
            if !hash.verify(&password) {
                return self.refuse(Denial::BasicInvalid, cx, client, Some(&user));
            }
            VERIFIED.with(|v| v.borrow_mut().put(key, ()));
            return self.accept(head, &user);
        }
        let known = hash.is_some().then(|| user.clone());
        let this = self.clone();
        let users = self.users.clone();
        Step::Wait(Box::pin(async move {
            let ok = verify_off_thread(users, known, password).await;
            let resume: Resume = Box::new(move |head: &mut RequestHead, cx: &RequestCx<'_>| {
                if !ok {
                    return this.refuse(Denial::BasicInvalid, cx, cx.peer, Some(&user));
                }
                VERIFIED.with(|v| v.borrow_mut().put(key, ()));
                this.accept(head, &user)
            });
            resume
        }))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::codec::{parse_request, take_request, HeadLimits, Parsed};
    use crate::filters::Denials;

    pub(crate) fn head(extra: &str) -> RequestHead {
        let raw = format!("GET /x?a=1 HTTP/1.1\r\nhost: x\r\n{extra}\r\n");
        let limits = HeadLimits { max_request_line: 8192, max_header_bytes: 32768, max_headers: 100 };
        let mut buf = bytes::BytesMut::from(raw.as_bytes());
        match parse_request(&buf, &limits) {
            Ok(Parsed::Complete(head, used)) => take_request(&mut buf, head, used),
            _ => panic!("unparsed"),
        }
    }

    fn basic(user_pass: &str) -> String {
        format!("authorization: Basic {}\r\n", base64::engine::general_purpose::STANDARD.encode(user_pass))
    }

    fn filter(shadow: bool) -> AuthBasic {
        let dir = std::env::temp_dir().join(format!("portico-auth-basic-{}-{shadow}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("users");
        // `htpasswd -nbs carol pw`, `htpasswd -nbm bob pw` and `htpasswd -nbB ann pw`.
        let lines = [
            "carol:{SHA}GpHWL3ymc5liWkNopqtdSjuqYHM=",
            "bob:$apr1$NOKjtWKT$bZ2sH.z4qxrvHujrNkC2y0",
            "ann:$2y$05$PiZfdC72Dxdly9nkjViOHuYUCP3NTOC5S5mEh/m1FJLlcQOaXYXB6",
        ];
        std::fs::write(&file, lines.join("\n")).unwrap();
        AuthBasic::new(&config("Staff", shadow), &file).unwrap()
    }

    fn config(realm: &str, shadow: bool) -> AuthBasicFilter {
        AuthBasicFilter {
            users_file: "x".into(),
            realm: realm.into(),
            user_header: "x-auth-user".into(),
            forward_authorization: false,
            shadow,
        }
    }

    fn run(f: &AuthBasic, head: &mut RequestHead, denials: &Denials) -> Step {
        let cx =
            RequestCx { matched_path: b"/x", captures: &[], prefix: None, peer: IpAddr::from([127, 0, 0, 1]), denials };
        match f.on_request(head, &cx) {
            Step::Wait(wait) => {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                let resume = rt.block_on(wait);
                resume(head, &cx)
            }
            step => step,
        }
    }

    #[test]
    fn credentials_are_read_as_rfc_7617_says() {
        assert_eq!(credentials(&head(&basic("alice:open:sesame"))), Some(("alice".into(), b"open:sesame".to_vec())));
        assert_eq!(credentials(&head("authorization: basic   YTpi\r\n")), Some(("a".into(), b"b".to_vec())));
        assert_eq!(credentials(&head("authorization: Basic YTpiYw\r\n")), Some(("a".into(), b"bc".to_vec())));
        assert_eq!(credentials(&head("authorization: Bearer YTpi\r\n")), None);
        assert_eq!(credentials(&head("authorization: Basic !!!\r\n")), None);
        assert_eq!(credentials(&head(&basic("nocolon"))), None);
        assert_eq!(credentials(&head(&basic(":pw"))), None);
        assert_eq!(credentials(&head("")), None);
    }

    #[test]
    fn users_pass_with_their_name_and_without_authorization() {
        let f = filter(false);
        let denials = Denials::new("r");
        for user in ["carol", "bob", "ann"] {
            let mut h = head(&format!("{}x-auth-user: admin\r\n", basic(&format!("{user}:pw"))));
            assert!(matches!(run(&f, &mut h, &denials), Step::Continue), "{user}");
            let edits = h.edits.as_ref().unwrap();
            assert!(edits.headers.drops(b"authorization") && edits.headers.drops(b"X_Auth_User"));
            assert_eq!(edits.headers.appended_value("x-auth-user"), Some(user));
            assert_eq!(edits.identity.as_deref(), Some(user));
            // Again: from the verified set this time.
            let mut h = head(&basic(&format!("{user}:pw")));
            assert!(matches!(run(&f, &mut h, &denials), Step::Continue), "{user} again");
        }
        for (creds, denial) in [
            (basic("ann:px"), Denial::BasicInvalid),
            (basic("bob:px"), Denial::BasicInvalid),
            (basic("dave:pw"), Denial::BasicInvalid),
            (String::new(), Denial::BasicMissing),
        ] {
            let mut h = head(&creds);
            let Step::Respond(r) = run(&f, &mut h, &denials) else { panic!("{creds} passed") };
            assert_eq!(r.status, 401);
            assert!(r
                .headers
                .iter()
                .any(|(n, v)| &**n == "www-authenticate" && v.starts_with("Basic realm=\"Staff\"")));
            assert!(denials.count(denial, false) > 0);
        }
    }

    #[test]
    fn shadow_mode_counts_and_lets_through_without_a_user() {
        let f = filter(true);
        let denials = Denials::new("r");
        let mut h = head(&format!("{}x-auth-user: admin\r\n", basic("ann:wrong")));
        assert!(matches!(run(&f, &mut h, &denials), Step::Continue));
        let edits = h.edits.as_ref().unwrap();
        assert!(edits.headers.drops(b"x-auth-user") && edits.headers.appended_value("x-auth-user").is_none());
        assert_eq!(denials.count(Denial::BasicInvalid, true), 1);
        assert_eq!(denials.count(Denial::BasicInvalid, false), 0);
    }

    #[test]
    fn a_missing_file_is_an_error_at_its_key() {
        let (key, message) =
            AuthBasic::new(&config("r", false), std::path::Path::new("/nonexistent/users")).unwrap_err();
        assert_eq!(key, "auth_basic.users_file");
        assert!(message.contains("cannot read the password file /nonexistent/users"), "{message}");
    }
}
