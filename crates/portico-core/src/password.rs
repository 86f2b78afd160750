//! Password files and the hashes in them, shared by the HTTP plane's `auth_basic` filter and the MQTT
//! plane's `mqtt.auth.password_file`.
//!
//! One `user:hash` a line (blank lines and `#` comments skipped). The hashes are checked by maintained
//! crates (RustCrypto's `argon2`, `pbkdf2`, `sha1`, `sha2` and `md-5`, and `bcrypt`):
//!
//! - `$argon2id$...` (also `$argon2i$`, `$argon2d$`): a PHC string, as `argon2` tools write it;
//! - `$2y$...` (also `$2a$`, `$2b$`): bcrypt, as `htpasswd -B` writes it;
//! - `$apr1$salt$hash`: Apache's MD5 crypt, `htpasswd -m` (the default of `htpasswd`);
//! - `{SHA}base64`: an unsalted SHA-1, `htpasswd -s`;
//! - `$7$iterations$salt$hash`: Mosquitto 2's `mosquitto_passwd` (PBKDF2-HMAC-SHA512, base64 salt and hash);
//! - `$6$salt$hash`: older `mosquitto_passwd` (SHA-512 of password then salt).
//!
//! APR1, `{SHA}` and Mosquitto's `$6$` are weak (fast, and `{SHA}` unsalted): they are accepted so that
//! existing files keep working, and new passwords should be bcrypt or argon2. No crate verifies APR1 and is
//! maintained (`pwhash` has the `$1$` MD5 crypt only; `htpasswd-verify` depends on the abandoned
//! `rust-crypto`), so its construction (Poul-Henning Kamp's MD5 crypt with the `$apr1$` magic, a thousand
//! rounds of MD5) is written here over the `md-5` crate, and checked against `htpasswd` and OpenSSL's output.
//!
//! Argon2, bcrypt and PBKDF2 are slow on purpose ([`PasswordHash::is_slow`]): callers run them off any thread
//! that serves connections.

use base64::Engine;
use std::collections::HashMap;
use subtle::ConstantTimeEq;

/// Why a password file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PasswordFileError {
    #[error("cannot read the password file {file}: {error}")]
    Read { file: String, error: std::io::Error },
    #[error("{file}:{line}: {what}")]
    Line { file: String, line: usize, what: String },
}

/// A password hash, parsed.
#[derive(Clone)]
pub enum PasswordHash {
    Argon2(String),
    Bcrypt(String),
    /// Apache's `$apr1$`: the salt (at most 8 characters) and the 22-character checksum.
    Apr1 {
        salt: String,
        checksum: String,
    },
    /// `{SHA}`: SHA-1 of the password.
    Sha1(Vec<u8>),
    /// Mosquitto `$7$`.
    Pbkdf2Sha512 {
        iterations: u32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
    /// Mosquitto `$6$`.
    Sha512 {
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
}

impl std::fmt::Debug for PasswordHash {
    /// The kind only: a hash is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

/// The characters of crypt's base 64, in their order.
const CRYPT64: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

impl PasswordHash {
    pub fn parse(text: &str) -> Result<PasswordHash, String> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| format!("bad base64: {e}"));
        if text.starts_with("$argon2") {
            argon2::password_hash::phc::PasswordHash::new(text).map_err(|e| format!("bad argon2 hash: {e}"))?;
            Ok(PasswordHash::Argon2(text.to_string()))
        } else if text.starts_with("$2a$") || text.starts_with("$2b$") || text.starts_with("$2y$") {
            Ok(PasswordHash::Bcrypt(text.to_string()))
        } else if let Some(rest) = text.strip_prefix("$apr1$") {
            let Some((salt, checksum)) = rest.split_once('$') else {
                return Err("an `$apr1$` hash is `$apr1$salt$checksum`".into());
            };
            let crypt64 = |s: &str| s.bytes().all(|b| CRYPT64.contains(&b));
            if salt.len() > 8 || !crypt64(salt) || checksum.len() != 22 || !crypt64(checksum) {
                return Err("bad `$apr1$` hash: a salt of up to 8 characters and a 22-character checksum".into());
            }
            Ok(PasswordHash::Apr1 { salt: salt.to_string(), checksum: checksum.to_string() })
        } else if let Some(rest) = text.strip_prefix("{SHA}") {
            let digest = b64(rest)?;
            if digest.len() != 20 {
                return Err("a `{SHA}` hash is the base64 of a 20-byte SHA-1".into());
            }
            Ok(PasswordHash::Sha1(digest))
        } else if let Some(rest) = text.strip_prefix("$7$") {
            let mut parts = rest.split('$');
            let (Some(iterations), Some(salt), Some(hash), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err("a `$7$` hash is `$7$iterations$salt$hash`".into());
            };
            let iterations: u32 = iterations.parse().map_err(|_| format!("bad iteration count {iterations:?}"))?;
            if iterations == 0 {
                return Err("an iteration count of 0".into());
            }
            Ok(PasswordHash::Pbkdf2Sha512 { iterations, salt: b64(salt)?, hash: b64(hash)? })
        } else if let Some(rest) = text.strip_prefix("$6$") {
            let Some((salt, hash)) = rest.split_once('$') else {
                return Err("a `$6$` hash is `$6$salt$hash`".into());
            };
            Ok(PasswordHash::Sha512 { salt: b64(salt)?, hash: b64(hash)? })
        } else {
            Err("unknown hash: expected `$argon2id$...`, `$2y$...` (bcrypt), `$apr1$...` or `{SHA}...` (htpasswd), or `$7$...` / `$6$...` (mosquitto_passwd); plain-text passwords are not accepted".into())
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            PasswordHash::Argon2(_) => "argon2",
            PasswordHash::Bcrypt(_) => "bcrypt",
            PasswordHash::Apr1 { .. } => "apr1",
            PasswordHash::Sha1(_) => "sha1",
            PasswordHash::Pbkdf2Sha512 { .. } => "pbkdf2-sha512",
            PasswordHash::Sha512 { .. } => "sha512",
        }
    }

    /// Whether checking a password takes long enough (milliseconds) that it must not run on a thread that
    /// serves connections: argon2, bcrypt and PBKDF2. APR1's thousand MD5 rounds take about 0.1 ms.
    pub fn is_slow(&self) -> bool {
        matches!(self, PasswordHash::Argon2(_) | PasswordHash::Bcrypt(_) | PasswordHash::Pbkdf2Sha512 { .. })
    }

    /// Whether `password` hashes to this. Slow for the kinds `is_slow` names.
    pub fn verify(&self, password: &[u8]) -> bool {
        match self {
            PasswordHash::Argon2(phc) => {
                use argon2::password_hash::PasswordVerifier;
                argon2::password_hash::phc::PasswordHash::new(phc)
                    .is_ok_and(|hash| argon2::Argon2::default().verify_password(password, &hash).is_ok())
            }
            PasswordHash::Bcrypt(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            PasswordHash::Apr1 { salt, checksum } => {
                bool::from(apr1(password, salt.as_bytes()).ct_eq(checksum.as_bytes()))
            }
            PasswordHash::Sha1(digest) => {
                use sha1::Digest;
                bool::from(sha1::Sha1::digest(password).as_slice().ct_eq(digest))
            }
            PasswordHash::Pbkdf2Sha512 { iterations, salt, hash } => {
                let mut out = vec![0u8; hash.len()];
                pbkdf2::pbkdf2_hmac::<sha2::Sha512>(password, salt, *iterations, &mut out);
                !hash.is_empty() && bool::from(out.ct_eq(hash))
            }
            PasswordHash::Sha512 { salt, hash } => {
                use sha2::Digest;
                let mut digest = sha2::Sha512::new();
                digest.update(password);
                digest.update(salt);
                bool::from(digest.finalize().as_slice().ct_eq(hash))
            }
        }
    }
}

/// Apache's MD5 crypt of `password` with `salt` (at most 8 bytes): the 22-character checksum.
fn apr1(password: &[u8], salt: &[u8]) -> [u8; 22] {
    use md5::{Digest, Md5};
    const MAGIC: &[u8] = b"$apr1$";
    let alternate = Md5::new().chain_update(password).chain_update(salt).chain_update(password).finalize();
    let mut ctx = Md5::new().chain_update(password).chain_update(MAGIC).chain_update(salt);
    for chunk in (0..password.len()).step_by(16) {
        ctx.update(&alternate[..(password.len() - chunk).min(16)]);
    }
    let mut n = password.len();
    while n > 0 {
        // Kamp's quirk, kept by every implementation: a zero byte for a set bit, the first byte otherwise.
        ctx.update(if n & 1 == 1 { &[0u8][..] } else { &password[..1] });
        n >>= 1;
    }
    let mut digest = ctx.finalize();
    for round in 0..1000 {
        let mut ctx = Md5::new();
        if round % 2 == 1 {
            ctx.update(password);
        } else {
            ctx.update(digest);
        }
        if round % 3 != 0 {
            ctx.update(salt);
        }
        if round % 7 != 0 {
            ctx.update(password);
        }
        if round % 2 == 1 {
            ctx.update(digest);
        } else {
            ctx.update(password);
        }
        digest = ctx.finalize();
    }
    let d = digest;
    let mut out = [0u8; 22];
    let groups =
        [(d[0], d[6], d[12]), (d[1], d[7], d[13]), (d[2], d[8], d[14]), (d[3], d[9], d[15]), (d[4], d[10], d[5])];
    for (i, (a, b, c)) in groups.into_iter().enumerate() {
        let mut v = (u32::from(a) << 16) | (u32::from(b) << 8) | u32::from(c);
        for slot in &mut out[i * 4..i * 4 + 4] {
            *slot = CRYPT64[(v & 0x3f) as usize];
            v >>= 6;
        }
    }
    let mut v = u32::from(d[11]);
    for slot in &mut out[20..22] {
        *slot = CRYPT64[(v & 0x3f) as usize];
        v >>= 6;
    }
    out
}

/// The users of a password file.
#[derive(Clone, Debug, Default)]
pub struct PasswordFile {
    users: HashMap<String, PasswordHash>,
    /// The user whose hash stands in for unknown users' (the first in name order).
    decoy: Option<String>,
}

impl PasswordFile {
    /// Reads a password file. Blocking: call it where reading the disk is allowed (start-up, reloads).
    pub fn load(path: &std::path::Path) -> Result<PasswordFile, PasswordFileError> {
        let file = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|error| PasswordFileError::Read { file: file.clone(), error })?;
        PasswordFile::parse(&text, &file)
    }

    /// Parses the text of a password file (`file` names it in errors).
    pub fn parse(text: &str, file: &str) -> Result<PasswordFile, PasswordFileError> {
        let mut users = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let error = |what: String| PasswordFileError::Line { file: file.to_string(), line: i + 1, what };
            let Some((user, hash)) = line.split_once(':') else {
                return Err(error("expected `user:hash`".into()));
            };
            if user.is_empty() {
                return Err(error("an empty user name".into()));
            }
            let hash = PasswordHash::parse(hash).map_err(error)?;
            if users.insert(user.to_string(), hash).is_some() {
                return Err(error(format!("user {user:?} is listed twice")));
            }
        }
        let decoy = users.keys().min().cloned();
        Ok(PasswordFile { users, decoy })
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// The hash listed for `user`.
    pub fn get(&self, user: &str) -> Option<&PasswordHash> {
        self.users.get(user)
    }

    /// A hash of the file to check an unknown user's password against, so that an unknown user takes as
    /// long to refuse as a known one with a wrong password (the file's first user in name order).
    pub fn decoy(&self) -> Option<&PasswordHash> {
        self.decoy.as_ref().and_then(|user| self.users.get(user))
    }

    /// Whether `user` is listed with `password`. Slow for slow hashes.
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        self.users.get(user).is_some_and(|hash| hash.verify(password))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apr1_matches_htpasswd_and_openssl() {
        // `openssl passwd -apr1 -salt xxxxxxxx password`, from OpenSSL's manual.
        assert_eq!(&apr1(b"password", b"xxxxxxxx"), b"dxHfLAsjHkDRmG83UXe8K0");
        // Written by `htpasswd -nbm bob pw` (Apache 2.4, Debian).
        let h = PasswordHash::parse("$apr1$NOKjtWKT$bZ2sH.z4qxrvHujrNkC2y0").expect("parses");
        assert!(h.verify(b"pw") && !h.verify(b"pW") && !h.verify(b""));
        // Passwords longer than a digest and of every parity go through the length loops.
        let long = b"a password longer than sixteen bytes, and odd";
        let checksum = apr1(long, b"salt");
        let h = PasswordHash::parse(&format!("$apr1$salt${}", std::str::from_utf8(&checksum).unwrap())).unwrap();
        assert!(h.verify(long) && !h.verify(&long[..long.len() - 1]));
        assert!(PasswordHash::parse("$apr1$toolongsalt$bZ2sH.z4qxrvHujrNkC2y0").is_err());
        assert!(PasswordHash::parse("$apr1$NOKjtWKT$short").is_err());
    }

    #[test]
    fn sha1_as_htpasswd_writes_it() {
        // `htpasswd -nbs carol pw`.
        let h = PasswordHash::parse("{SHA}GpHWL3ymc5liWkNopqtdSjuqYHM=").expect("parses");
        assert!(h.verify(b"pw") && !h.verify(b"pw2"));
        assert!(!h.is_slow());
        assert!(PasswordHash::parse("{SHA}AAAA").is_err(), "not 20 bytes");
    }

    #[test]
    fn bcrypt_and_argon2_from_their_tools() {
        // `htpasswd -nbB alice pw` and `echo -n pw | argon2 saltsalt -id -e`.
        let b = PasswordHash::parse("$2y$05$PiZfdC72Dxdly9nkjViOHuYUCP3NTOC5S5mEh/m1FJLlcQOaXYXB6").unwrap();
        assert!(b.verify(b"pw") && !b.verify(b"px") && b.is_slow());
        let a = PasswordHash::parse(
            "$argon2id$v=19$m=4096,t=3,p=1$c2FsdHNhbHQ$5fWUFPxh3TPcMxvs+Gl2oSqZlEHGO1HNBik1Z6Kt3dQ",
        )
        .unwrap();
        assert!(a.verify(b"pw") && !a.verify(b"px") && a.is_slow());
        assert_eq!(format!("{a:?}"), "argon2", "a hash is never printed");
    }

    #[test]
    fn files_name_their_bad_lines() {
        let text = "# comment\n\nalice:{SHA}GpHWL3ymc5liWkNopqtdSjuqYHM=\n";
        let users = PasswordFile::parse(text, "f").expect("parses");
        assert_eq!(users.len(), 1);
        assert!(users.verify("alice", b"pw") && !users.verify("bob", b"pw"));
        assert!(users.decoy().is_some());
        let err = PasswordFile::parse("a:b:c\nd:plain\n", "p.txt").expect_err("plain text refused").to_string();
        assert!(err.starts_with("p.txt:1: unknown hash"), "{err}");
        let err = PasswordFile::parse(&format!("{text}{}", &text[11..]), "p").expect_err("twice").to_string();
        assert!(err.contains("p:4: user \"alice\" is listed twice"), "{err}");
        let err = PasswordFile::parse(":{SHA}GpHWL3ymc5liWkNopqtdSjuqYHM=", "p").expect_err("empty").to_string();
        assert!(err.contains("an empty user name"), "{err}");
    }
}
