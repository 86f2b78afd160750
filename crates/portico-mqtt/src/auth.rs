//! Who may connect ([`Auth`]: anonymous clients, a password file, client certificates) and what they may do
//! ([`Acl`]). Both live in the broker behind an `ArcSwap` ([`crate::Broker::set_auth`]): a reload replaces
//! them, connections look them up at each CONNECT, PUBLISH and SUBSCRIBE, so new rights apply at once to new
//! operations and nobody is disconnected.
//!
//! # Password file
//!
//! One `user:hash` a line (blank lines and `#` comments skipped), read by `portico_core::password` (which the
//! HTTP plane's `auth_basic` shares): argon2, bcrypt, `mosquitto_passwd`'s `$7$` and `$6$`, and htpasswd's
//! `$apr1$` and `{SHA}`.
//!
//! # ACL evaluation
//!
//! With no entry every client may publish and subscribe to anything. Otherwise the entries are read in
//! order and **the first that applies decides**; when none applies, the operation is denied. This is the
//! order a firewall reads its rules in, and it makes `deny` carve-outs explicit (`deny` before the broader
//! `readwrite`). Mosquitto instead grants when any pattern grants (its `deny` entries are checked first);
//! a Mosquitto ACL file translates by putting its `deny` lines first.
//!
//! An entry applies to a connection when its `user` and `client_id` (if given; `*` matches any run of
//! characters) match, and `%u` / `%c` in its topic can be replaced: an anonymous client has no `%u`, and a
//! user name or client id containing `+`, `#` or `/` is never substituted (it would widen the pattern).
//!
//! - PUBLISH of topic `t`: the first applying entry whose filter matches `t` decides (`write`, `readwrite`:
//!   allowed).
//! - SUBSCRIBE to filter `f`: the first applying entry whose filter covers `f` (every topic `f` matches, it
//!   matches) decides (`read`, `readwrite`: allowed); an applying entry that does not grant read and whose
//!   filter overlaps `f` without covering it denies, since `f` would reach topics the entry forbids (a
//!   subscription to `test/#` is refused while `test/nosubscribe` is denied above the rule that grants
//!   `test/#`). The check is made at SUBSCRIBE: a subscription granted stays until unsubscribed, as in
//!   Mosquitto without per-message read checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The password file and its errors are portico-core's, shared with the HTTP plane's `auth_basic` filter.
pub use portico_core::password::{PasswordFile as Users, PasswordFileError as AuthError};

/// Who may connect.
#[derive(Clone, Debug)]
pub struct Auth {
    /// Clients without a user name may connect.
    pub anonymous: bool,
    /// `None`: no password file; a user name is then taken as given (without a password check) unless a
    /// password file is configured. With one, a user name must come with its password.
    pub users: Option<Arc<Users>>,
    /// A verified client certificate's CN (or first SAN) is the user name, with no password asked.
    pub use_certificate_as_username: bool,
    pub acl: Acl,
}

impl Default for Auth {
    /// Anyone may connect and do anything (the broker's behaviour without `mqtt.auth` / `mqtt.acl`).
    fn default() -> Self {
        Auth { anonymous: true, users: None, use_certificate_as_username: false, acl: Acl::default() }
    }
}

/// What a CONNECT's credentials came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted, as this user (`None`: anonymous).
    Accepted(Option<String>),
    /// Bad user name or password (CONNACK 0x86 / v3 4).
    BadCredentials,
    /// No credentials where they are required (CONNACK 0x87 / v3 5).
    NotAuthorized,
}

impl Auth {
    /// Decides a CONNECT. `certificate_user` is the verified client certificate's name, when the listener
    /// asks for certificates. Runs the password hash: call it on a blocking thread.
    pub fn check(&self, username: Option<&str>, password: Option<&[u8]>, certificate_user: Option<&str>) -> Verdict {
        if self.use_certificate_as_username {
            if let Some(name) = certificate_user {
                return Verdict::Accepted(Some(name.to_string()));
            }
        }
        match (username, &self.users) {
            (None, _) if self.anonymous => Verdict::Accepted(None),
            (None, _) => Verdict::NotAuthorized,
            (Some(user), Some(users)) => match password {
                Some(password) if users.verify(user, password) => Verdict::Accepted(Some(user.to_string())),
                _ => Verdict::BadCredentials,
            },
            // No password file: a user name is only a name (for ACLs), as Mosquitto without password_file.
            (Some(user), None) if self.anonymous => Verdict::Accepted(Some(user.to_string())),
            (Some(_), None) => Verdict::NotAuthorized,
        }
    }
}

/// What an ACL entry allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
    Deny,
}

impl Access {
    fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }
    fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// One ACL entry.
#[derive(Clone, Debug)]
pub struct AclEntry {
    pub topic: String,
    pub access: Access,
    pub user: Option<String>,
    pub client_id: Option<String>,
}

/// The ACL: see the module's documentation for how it is read.
#[derive(Clone, Debug, Default)]
pub struct Acl {
    pub entries: Vec<AclEntry>,
}

impl Acl {
    /// Whether the client may publish to `topic`.
    pub fn can_publish(&self, user: Option<&str>, client_id: &str, topic: &str) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        for entry in &self.entries {
            let Some(filter) = entry.applies(user, client_id) else { continue };
            if crate::topic::matches(&filter, topic) {
                return entry.access.writes();
            }
        }
        false
    }

    /// Whether the client may subscribe to `filter` (a shared subscription's filter proper).
    pub fn can_subscribe(&self, user: Option<&str>, client_id: &str, filter: &str) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        for entry in &self.entries {
            let Some(pattern) = entry.applies(user, client_id) else { continue };
            if covers(&pattern, filter) {
                return entry.access.reads();
            }
            if !entry.access.reads() && overlaps(&pattern, filter) {
                return false;
            }
        }
        false
    }
}

impl AclEntry {
    /// The entry's filter with `%u` and `%c` replaced, if the entry applies to this client.
    fn applies(&self, user: Option<&str>, client_id: &str) -> Option<String> {
        if let Some(pattern) = &self.user {
            if !user.is_some_and(|u| glob(pattern, u)) {
                return None;
            }
        }
        if let Some(pattern) = &self.client_id {
            if !glob(pattern, client_id) {
                return None;
            }
        }
        let safe = |s: &str| !s.is_empty() && !s.contains(['+', '#', '/']);
        let mut topic = self.topic.clone();
        if topic.contains("%u") {
            let user = user.filter(|u| safe(u))?;
            topic = topic.replace("%u", user);
        }
        if topic.contains("%c") {
            if !safe(client_id) {
                return None;
            }
            topic = topic.replace("%c", client_id);
        }
        Some(topic)
    }
}

/// `*` matches any run of characters; everything else itself.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Whether every topic `filter` matches is matched by `pattern` (both valid filters).
fn covers(pattern: &str, filter: &str) -> bool {
    // A leading wildcard of the pattern does not reach `$` topics [MQTT-4.7.2-1].
    if filter.starts_with('$') && pattern.starts_with(['+', '#']) {
        return false;
    }
    let mut f = filter.split('/');
    for p in pattern.split('/') {
        match (p, f.next()) {
            ("#", _) => return true,
            (_, None) => return false,
            (_, Some("#")) => return false,
            ("+", Some(_)) => {}
            (literal, Some(level)) => {
                if level == "+" || level != literal {
                    return false;
                }
            }
        }
    }
    f.next().is_none()
}

/// Whether some topic matches both filters.
fn overlaps(a: &str, b: &str) -> bool {
    let dollar = |s: &str| s.starts_with('$');
    if (dollar(a) && b.starts_with(['+', '#'])) || (dollar(b) && a.starts_with(['+', '#'])) {
        return false;
    }
    let (mut a, mut b) = (a.split('/'), b.split('/'));
    loop {
        match (a.next(), b.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (None, None) => return true,
            // `x/#` matches `x`: one side ending where the other has only `#` left is handled above.
            (None, Some(_)) | (Some(_), None) => return false,
            (Some(x), Some(y)) => {
                if x != "+" && y != "+" && x != y {
                    return false;
                }
            }
        }
    }
}

/// Logs authentication failures at most once a second (with how many were not logged), never the password.
pub(crate) fn log_failure(peer: std::net::SocketAddr, client_id: &str, user: Option<&str>, why: &str) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    static SKIPPED: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    if now > last && LAST.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
        let skipped = SKIPPED.swap(0, Ordering::Relaxed);
        tracing::warn!(%peer, client_id, user = user.unwrap_or("-"), not_logged_since = skipped, "MQTT authentication failed: {why}");
    } else {
        SKIPPED.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(topic: &str, access: Access) -> AclEntry {
        AclEntry { topic: topic.into(), access, user: None, client_id: None }
    }

    #[test]
    fn password_hashes_of_every_kind() {
        let argon = {
            use argon2::password_hash::PasswordHasher;
            argon2::Argon2::default().hash_password(b"argon-pw").expect("hash").to_string()
        };
        let bcrypt = bcrypt::hash("bcrypt-pw", 4).expect("hash");
        // Written by `mosquitto_passwd -b pw.txt mosq secret` (Mosquitto 2.0, Debian).
        let mosq = "$7$101$ZT2UAXR7jqpQsn97$rSm/XObu3tvWfHWSuYZgBzh+rtAWAX7Xq67scmJX9aUdmASsbKuMjT2Cj8wRR1OtiMdraludLAmE4XcWt/RRiw==";
        let text = format!("# users\nann:{argon}\nbob:{bcrypt}\n\nmosq:{mosq}\n");
        let users = Users::parse(&text, "p").expect("parses");
        assert_eq!(users.len(), 3);
        assert!(users.verify("mosq", b"secret") && !users.verify("mosq", b"Secret"));
        assert!(users.verify("ann", b"argon-pw") && !users.verify("ann", b"argon-px"));
        assert!(users.verify("bob", b"bcrypt-pw") && !users.verify("bob", b"argon-pw"));
        assert!(!users.verify("carl", b"x"));
        let err = Users::parse("a:b:c\nd:plain\n", "p.txt").expect_err("plain text refused").to_string();
        assert!(err.starts_with("p.txt:1: unknown hash"), "{err}");
        let mut pbkdf = [0u8; 64];
        pbkdf2::pbkdf2_hmac::<sha2::Sha512>(b"pw", b"salt", 101, &mut pbkdf);
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let line = format!("m:$7$101${}${}", b64(b"salt"), b64(&pbkdf));
        let users = Users::parse(&line, "p").expect("parses");
        assert!(users.verify("m", b"pw") && !users.verify("m", b"pW"));
    }

    #[test]
    fn connect_verdicts() {
        let users = Arc::new(Users::parse(&format!("u:{}\n", bcrypt::hash("p", 4).expect("hash")), "f").expect("ok"));
        let auth = Auth { anonymous: false, users: Some(users), ..Auth::default() };
        assert_eq!(auth.check(Some("u"), Some(b"p"), None), Verdict::Accepted(Some("u".into())));
        assert_eq!(auth.check(Some("u"), Some(b"q"), None), Verdict::BadCredentials);
        assert_eq!(auth.check(Some("u"), None, None), Verdict::BadCredentials);
        assert_eq!(auth.check(None, None, None), Verdict::NotAuthorized);
        assert_eq!(auth.check(None, None, Some("cn")), Verdict::NotAuthorized);
        let certs = Auth { use_certificate_as_username: true, ..auth };
        assert_eq!(certs.check(None, None, Some("cn")), Verdict::Accepted(Some("cn".into())));
        assert_eq!(Auth::default().check(None, None, None), Verdict::Accepted(None));
    }

    #[test]
    fn acl_first_match_wins_with_substitution() {
        let acl = Acl {
            entries: vec![
                entry("devices/%c/#", Access::ReadWrite),
                entry("test/nosubscribe", Access::Deny),
                AclEntry { user: Some("admin*".into()), ..entry("#", Access::ReadWrite) },
                entry("users/%u/in", Access::Read),
                entry("test/#", Access::ReadWrite),
            ],
        };
        assert!(acl.can_publish(None, "d1", "devices/d1/temp"));
        assert!(!acl.can_publish(None, "d1", "devices/d2/temp"));
        assert!(acl.can_publish(Some("admin-2"), "x", "devices/d2/temp"));
        assert!(!acl.can_publish(Some("admin"), "x", "test/nosubscribe"), "deny comes first");
        assert!(!acl.can_publish(Some("u"), "x", "users/u/in"), "read only");
        assert!(acl.can_subscribe(Some("u"), "x", "users/u/in"));
        assert!(!acl.can_subscribe(None, "x", "users/u/in"), "no %u for anonymous clients");
        assert!(!acl.can_subscribe(None, "d/1", "devices/d/1/x"), "a client id with / is not substituted");
        assert!(acl.can_subscribe(None, "d1", "devices/d1/+/x"));
        assert!(!acl.can_subscribe(None, "d1", "devices/+/x"));
        assert!(!acl.can_subscribe(None, "x", "test/nosubscribe"));
        assert!(!acl.can_subscribe(None, "x", "test/#"), "would reach the denied topic");
        assert!(!acl.can_subscribe(None, "x", "test/+"));
        assert!(acl.can_subscribe(None, "x", "test/other/+"));
        assert!(acl.can_publish(None, "x", "test/other"));
        assert!(!acl.can_publish(None, "x", "elsewhere"), "nothing applies: denied");
        assert!(Acl::default().can_publish(None, "x", "anything"));
    }

    #[test]
    fn filters_cover_and_overlap() {
        assert!(covers("a/#", "a") && covers("a/#", "a/+/c") && covers("+/b", "x/b") && covers("#", "a/#"));
        assert!(!covers("a/+", "a/#") && !covers("a/b", "a/+") && !covers("#", "$SYS/x") && !covers("a", "a/b"));
        assert!(overlaps("a/+", "a/b") && overlaps("a/#", "a") && overlaps("+/b", "a/+"));
        assert!(!overlaps("a/b", "a/c") && !overlaps("a", "a/b") && !overlaps("#", "$SYS/#"));
        assert!(glob("a*c", "abbc") && glob("*", "") && !glob("a*c", "abd") && glob("x", "x") && !glob("x", "xy"));
    }
}
