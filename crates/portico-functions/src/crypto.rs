//! The native side of Web Crypto (crypto.js builds `crypto` and `crypto.subtle` on these): random bytes from
//! the system's generator; digests, HMAC, RSASSA-PKCS1-v1_5, RSA-PSS, ECDSA and Ed25519 from `ring`; public
//! keys read from SubjectPublicKeyInfo by `x509-parser`, a PKCS #8 key's members by its `der-parser`. No
//! hand-written cryptography or parsing: what is written here is the DER of exported keys and of ECDSA
//! signatures for `ring`'s DER verifiers.
//!
//! Each native reads its input and does its work before it returns (no JavaScript runs meanwhile), so that
//! crypto.js's promises settle with what the input was when the method was called, as the standard has it.
//!
//! A key is a native object (`Key`) that JavaScript holds in a `CryptoKey` and hands back: parsed once, at
//! import, so that signing does not parse it again. A failure meant as one of the standard's DOMExceptions is
//! thrown as an `Error` whose message starts with its name (`DataError: ...`), which crypto.js turns into the
//! DOMException; the natives are handed to crypto.js's setup function, not set as globals.

use crate::url::guarded;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use rquickjs::class::{JsClass, Readable, Trace, Tracer};
use rquickjs::function::Func;
use rquickjs::{Array, ArrayBuffer, Class, Constructor, Ctx, Exception, JsLifetime, Object, TypedArray, Value};
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

const RSA_ENCRYPTION: &str = "1.2.840.113549.1.1.1";
const EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const ED25519: &str = "1.3.101.112";

/// A failure as the DOMException `name` (crypto.js makes it one).
fn fail(ctx: &Ctx<'_>, name: &str, message: impl std::fmt::Display) -> rquickjs::Error {
    Exception::throw_message(ctx, &format!("{name}: {message}"))
}

/// The bytes of a `Uint8Array`, copied (a detached one has none).
fn bytes_of(bytes: &TypedArray<'_, u8>) -> Vec<u8> {
    // SAFETY: copied at once; no JavaScript runs while the slice is borrowed.
    unsafe { bytes.as_bytes() }.unwrap_or_default().to_vec()
}

/// `length` random bytes (at most 65,536, as `getRandomValues` allows).
fn random<'js>(ctx: Ctx<'js>, length: usize) -> rquickjs::Result<ArrayBuffer<'js>> {
    let mut bytes = vec![0u8; length.min(65_536)];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| fail(&ctx, "OperationError", "the system's random generator failed"))?;
    ArrayBuffer::new(ctx, bytes)
}

#[derive(Clone, Copy, PartialEq)]
enum Hash {
    Sha1,
    Sha256,
    Sha384,
    Sha512,
}

impl Hash {
    fn named(ctx: &Ctx<'_>, name: &str) -> rquickjs::Result<Hash> {
        match name {
            "SHA-1" => Ok(Hash::Sha1),
            "SHA-256" => Ok(Hash::Sha256),
            "SHA-384" => Ok(Hash::Sha384),
            "SHA-512" => Ok(Hash::Sha512),
            _ => Err(fail(ctx, "NotSupportedError", format!("the hash {name} is not supported"))),
        }
    }

    fn digest(self) -> &'static ring::digest::Algorithm {
        match self {
            Hash::Sha1 => &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
            Hash::Sha256 => &ring::digest::SHA256,
            Hash::Sha384 => &ring::digest::SHA384,
            Hash::Sha512 => &ring::digest::SHA512,
        }
    }

    fn hmac(self) -> ring::hmac::Algorithm {
        match self {
            Hash::Sha1 => ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            Hash::Sha256 => ring::hmac::HMAC_SHA256,
            Hash::Sha384 => ring::hmac::HMAC_SHA384,
            Hash::Sha512 => ring::hmac::HMAC_SHA512,
        }
    }
}

/// The digest of the bytes with `algorithm` (`SHA-1`, `SHA-256`, `SHA-384`, `SHA-512`).
fn digest<'js>(ctx: Ctx<'js>, algorithm: String, data: TypedArray<'js, u8>) -> rquickjs::Result<ArrayBuffer<'js>> {
    let hash = Hash::named(&ctx, &algorithm)?;
    let digest = ring::digest::digest(hash.digest(), &bytes_of(&data));
    ArrayBuffer::new_copy(ctx, digest.as_ref())
}

#[derive(Clone, Copy, PartialEq)]
enum Curve {
    P256,
    P384,
}

impl Curve {
    fn named(ctx: &Ctx<'_>, name: &str) -> rquickjs::Result<Curve> {
        match name {
            "P-256" => Ok(Curve::P256),
            "P-384" => Ok(Curve::P384),
            _ => Err(fail(ctx, "NotSupportedError", format!("the curve {name} is not supported"))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Curve::P256 => "P-256",
            Curve::P384 => "P-384",
        }
    }

    fn oid(self) -> &'static str {
        match self {
            Curve::P256 => "1.2.840.10045.3.1.7",
            Curve::P384 => "1.3.132.0.34",
        }
    }

    /// The DER of the curve's object identifier.
    fn oid_der(self) -> &'static [u8] {
        match self {
            Curve::P256 => &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07],
            Curve::P384 => &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22],
        }
    }

    /// The length of a coordinate (and of a scalar).
    fn size(self) -> usize {
        match self {
            Curve::P256 => 32,
            Curve::P384 => 48,
        }
    }

    fn signing(self) -> &'static signature::EcdsaSigningAlgorithm {
        match self {
            Curve::P256 => &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            Curve::P384 => &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
        }
    }

    /// The hash `ring` signs with on this curve.
    fn hash(self) -> Hash {
        match self {
            Curve::P256 => Hash::Sha256,
            Curve::P384 => Hash::Sha384,
        }
    }
}

enum Material {
    Secret {
        raw: Vec<u8>,
        key: ring::hmac::Key,
    },
    RsaPublic {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// `private`: what a private key is exported as, its JWK members: RSA's d, p, q, dp, dq and qi, EC's d,
    /// Ed25519's d (the seed), big-endian (`ring` keeps them only in forms of its own).
    RsaPrivate {
        pair: RsaKeyPair,
        n: Vec<u8>,
        e: Vec<u8>,
        private: Vec<Vec<u8>>,
    },
    EcPublic {
        curve: Curve,
        point: Vec<u8>,
    },
    EcPrivate {
        curve: Curve,
        pair: EcdsaKeyPair,
        private: Vec<Vec<u8>>,
    },
    EdPublic {
        point: Vec<u8>,
    },
    EdPrivate {
        pair: Ed25519KeyPair,
        private: Vec<Vec<u8>>,
    },
}

/// A key's material, parsed, behind a `CryptoKey`.
pub struct Key(Material);

// SAFETY: no JavaScript value in it, so no lifetime to change.
unsafe impl<'js> JsLifetime<'js> for Key {
    type Changed<'to> = Key;
}

impl<'js> Trace<'js> for Key {
    fn trace<'a>(&self, _tracer: Tracer<'a, 'js>) {}
}

impl<'js> JsClass<'js> for Key {
    const NAME: &'static str = "KeyMaterial";
    type Mutable = Readable;
    fn constructor(_ctx: &Ctx<'js>) -> rquickjs::Result<Option<Constructor<'js>>> {
        Ok(None)
    }
}

fn key<'js>(ctx: &Ctx<'js>, material: Material) -> rquickjs::Result<Class<'js, Key>> {
    Class::instance(ctx.clone(), Key(material))
}

/// A big-endian unsigned integer without its leading zeros.
fn unsigned(bytes: &[u8]) -> Vec<u8> {
    let start = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    bytes[start..].to_vec()
}

fn bits(n: &[u8]) -> usize {
    match n.first() {
        Some(&first) => (n.len() - 1) * 8 + (8 - first.leading_zeros() as usize),
        None => 0,
    }
}

/// RSA public keys `ring` verifies with: 1,024 to 8,192 bits.
fn rsa_public(ctx: &Ctx<'_>, n: &[u8], e: &[u8]) -> rquickjs::Result<Material> {
    let (n, e) = (unsigned(n), unsigned(e));
    if !(1024..=8192).contains(&bits(&n)) {
        return Err(fail(ctx, "NotSupportedError", format!("RSA keys of {} bits are not supported", bits(&n))));
    }
    if e.is_empty() || e.len() > 4 {
        return Err(fail(ctx, "DataError", "the RSA public exponent is out of range"));
    }
    Ok(Material::RsaPublic { n, e })
}

/// An HMAC key of the bytes given, for `hash`.
fn import_secret<'js>(ctx: Ctx<'js>, hash: String, raw: TypedArray<'js, u8>) -> rquickjs::Result<Class<'js, Key>> {
    let hash = Hash::named(&ctx, &hash)?;
    let raw = bytes_of(&raw);
    let hmac = ring::hmac::Key::new(hash.hmac(), &raw);
    key(&ctx, Material::Secret { raw, key: hmac })
}

/// A public key (`kind`: `rsa`, `ec` on `curve`, or `ed25519`) from a DER SubjectPublicKeyInfo (`spki`) or
/// the standard's raw form (`raw`: an uncompressed point, Ed25519's 32 bytes).
fn import_public<'js>(
    ctx: Ctx<'js>,
    kind: String,
    curve: String,
    format: String,
    data: TypedArray<'js, u8>,
) -> rquickjs::Result<Class<'js, Key>> {
    let data = bytes_of(&data);
    let material = guarded("key parser", || match format.as_str() {
        "spki" => from_spki(&ctx, &kind, &curve, &data),
        "raw" => match kind.as_str() {
            "ec" => ec_public(&ctx, Curve::named(&ctx, &curve)?, data.clone()),
            "ed25519" => ed_public(&ctx, data.clone()),
            _ => Err(fail(&ctx, "NotSupportedError", "raw RSA keys are not supported")),
        },
        _ => Err(fail(&ctx, "NotSupportedError", format!("the format {format} is not supported for public keys"))),
    })?;
    key(&ctx, material)
}

fn ec_public(ctx: &Ctx<'_>, curve: Curve, point: Vec<u8>) -> rquickjs::Result<Material> {
    match point.first() {
        Some(4) if point.len() == 1 + 2 * curve.size() => {
            if !on_curve(curve, &point) {
                return Err(fail(ctx, "DataError", format!("the point is not on {}", curve.name())));
            }
            Ok(Material::EcPublic { curve, point })
        }
        Some(2 | 3) if point.len() == 1 + curve.size() => {
            Err(fail(ctx, "NotSupportedError", "compressed elliptic curve points are not supported"))
        }
        _ => Err(fail(ctx, "DataError", format!("not a {} point", curve.name()))),
    }
}

/// Whether `point` is on the curve, as the standard checks at import. `ring` has no call for that alone, but
/// ECDH checks its peer's point before it uses it: one with a throwaway key does.
fn on_curve(curve: Curve, point: &[u8]) -> bool {
    use ring::agreement;
    let algorithm = match curve {
        Curve::P256 => &agreement::ECDH_P256,
        Curve::P384 => &agreement::ECDH_P384,
    };
    let Ok(ours) = agreement::EphemeralPrivateKey::generate(algorithm, &SystemRandom::new()) else { return false };
    agreement::agree_ephemeral(ours, &agreement::UnparsedPublicKey::new(algorithm, point), |_| ()).is_ok()
}

fn ed_public(ctx: &Ctx<'_>, point: Vec<u8>) -> rquickjs::Result<Material> {
    if point.len() != 32 {
        return Err(fail(ctx, "DataError", "an Ed25519 public key is 32 bytes"));
    }
    Ok(Material::EdPublic { point })
}

fn from_spki(ctx: &Ctx<'_>, kind: &str, curve: &str, der: &[u8]) -> rquickjs::Result<Material> {
    let invalid = || fail(ctx, "DataError", "not a DER SubjectPublicKeyInfo");
    let (rest, spki) = SubjectPublicKeyInfo::from_der(der).map_err(|_| invalid())?;
    if !rest.is_empty() {
        return Err(invalid());
    }
    let algorithm = spki.algorithm.algorithm.to_id_string();
    let parameter = spki.algorithm.parameters.clone().and_then(|p| x509_parser::der_parser::Oid::try_from(p).ok());
    let key = spki.subject_public_key.data.to_vec();
    match kind {
        "rsa" if algorithm == RSA_ENCRYPTION => match spki.parsed() {
            Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => rsa_public(ctx, rsa.modulus, rsa.exponent),
            _ => Err(invalid()),
        },
        "ec" if algorithm == EC_PUBLIC_KEY => {
            let curve = Curve::named(ctx, curve)?;
            if parameter.map(|p| p.to_id_string()).as_deref() != Some(curve.oid()) {
                return Err(fail(ctx, "DataError", format!("the key is not on {}", curve.name())));
            }
            ec_public(ctx, curve, key)
        }
        "ed25519" if algorithm == ED25519 => ed_public(ctx, key),
        _ => Err(fail(ctx, "DataError", format!("the key's algorithm ({algorithm}) is not the one asked for"))),
    }
}

/// `ring`'s refusal of a private key: a `NotSupportedError` for a key it does not take (an RSA key of fewer than
/// 2,048 or more than 4,096 bits, an EC key without its public key, ...), a `DataError` for one that is no key.
fn refused(ctx: &Ctx<'_>, what: &str, e: ring::error::KeyRejected) -> rquickjs::Error {
    let reason = e.to_string();
    let name = match reason.as_str() {
        "TooSmall" | "TooLarge" | "VersionNotSupported" | "PublicKeyIsMissing" => "NotSupportedError",
        _ => "DataError",
    };
    fail(ctx, name, format!("the {what} was refused: {reason}"))
}

/// A private key from a DER PKCS #8 PrivateKeyInfo.
fn import_private<'js>(
    ctx: Ctx<'js>,
    kind: String,
    curve: String,
    der: TypedArray<'js, u8>,
) -> rquickjs::Result<Class<'js, Key>> {
    let der = bytes_of(&der);
    let material = guarded("key parser", || from_pkcs8(&ctx, &kind, &curve, &der))?;
    key(&ctx, material)
}

fn from_pkcs8(ctx: &Ctx<'_>, kind: &str, curve: &str, der: &[u8]) -> rquickjs::Result<Material> {
    let rejected = |e| refused(ctx, "PKCS #8 key", e);
    let members = || pkcs8_members(kind, der).ok_or_else(|| fail(ctx, "DataError", "not a PKCS #8 key of this kind"));
    match kind {
        "rsa" => {
            let pair = RsaKeyPair::from_pkcs8(der).map_err(rejected)?;
            let public = signature::RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
            Ok(Material::RsaPrivate { pair, n: public.n, e: public.e, private: members()? })
        }
        "ec" => {
            let curve = Curve::named(ctx, curve)?;
            let pair = EcdsaKeyPair::from_pkcs8(curve.signing(), der, &SystemRandom::new()).map_err(rejected)?;
            let mut private = members()?;
            // (d as long as the curve's scalars, as a JWK writes it.)
            if let Some(d) = private.first_mut() {
                while d.len() < curve.size() {
                    d.insert(0, 0);
                }
            }
            Ok(Material::EcPrivate { curve, pair, private })
        }
        "ed25519" => {
            let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der).map_err(rejected)?;
            Ok(Material::EdPrivate { pair, private: members()? })
        }
        _ => Err(fail(ctx, "NotSupportedError", format!("{kind} keys are not supported"))),
    }
}

/// The JWK members of a PKCS #8 key `ring` has accepted (`ring` reads them, but keeps them to itself): RSA's
/// d, p, q, dp, dq and qi (RFC 8017's RSAPrivateKey), EC's d (RFC 5915's ECPrivateKey), Ed25519's seed
/// (RFC 8410's CurvePrivateKey).
fn pkcs8_members(kind: &str, der: &[u8]) -> Option<Vec<Vec<u8>>> {
    use x509_parser::der_parser::parse_der;
    let (_, info) = parse_der(der).ok()?;
    let key = info.as_sequence().ok()?.get(2)?.as_slice().ok()?;
    let (_, inner) = parse_der(key).ok()?;
    match kind {
        "rsa" => {
            let fields = inner.as_sequence().ok()?;
            fields.get(3..9)?.iter().map(|f| f.as_slice().ok().map(unsigned)).collect()
        }
        "ec" => Some(vec![inner.as_sequence().ok()?.get(1)?.as_slice().ok()?.to_vec()]),
        _ => Some(vec![inner.as_slice().ok()?.to_vec()]),
    }
}

/// A key from a JWK's members, decoded from base64url by crypto.js: RSA `[n, e]` or `[n, e, d, p, q, dp, dq,
/// qi]`, EC `[x, y]` or `[x, y, d]`, Ed25519 `[x]` or `[x, d]`.
fn import_jwk<'js>(
    ctx: Ctx<'js>,
    kind: String,
    curve: String,
    parts: Vec<TypedArray<'js, u8>>,
) -> rquickjs::Result<Class<'js, Key>> {
    let parts: Vec<Vec<u8>> = parts.iter().map(bytes_of).collect();
    let rejected = |e| refused(&ctx, "JWK", e);
    let material = guarded("key parser", || match (kind.as_str(), parts.as_slice()) {
        ("rsa", [n, e]) => rsa_public(&ctx, n, e),
        ("rsa", [n, e, d, p, q, dp, dq, qi]) => {
            let components = ring::rsa::KeyPairComponents {
                public_key: ring::rsa::PublicKeyComponents { n: unsigned(n), e: unsigned(e) },
                d: unsigned(d),
                p: unsigned(p),
                q: unsigned(q),
                dP: unsigned(dp),
                dQ: unsigned(dq),
                qInv: unsigned(qi),
            };
            let pair = RsaKeyPair::from_components(&components).map_err(rejected)?;
            let private = parts[2..].iter().map(|p| unsigned(p)).collect();
            Ok(Material::RsaPrivate { pair, n: unsigned(n), e: unsigned(e), private })
        }
        ("ec", [x, y, rest @ ..]) if rest.len() <= 1 => {
            let curve = Curve::named(&ctx, &curve)?;
            if x.len() != curve.size() || y.len() != curve.size() {
                return Err(fail(
                    &ctx,
                    "DataError",
                    format!("the coordinates are not those of a {} point", curve.name()),
                ));
            }
            let point = [&[4u8][..], x, y].concat();
            match rest {
                [d] => {
                    let pair =
                        EcdsaKeyPair::from_private_key_and_public_key(curve.signing(), d, &point, &SystemRandom::new())
                            .map_err(rejected)?;
                    Ok(Material::EcPrivate { curve, pair, private: vec![d.clone()] })
                }
                _ => ec_public(&ctx, curve, point),
            }
        }
        ("ed25519", [x]) => ed_public(&ctx, x.clone()),
        ("ed25519", [x, d]) => {
            let pair = Ed25519KeyPair::from_seed_and_public_key(d, x).map_err(rejected)?;
            Ok(Material::EdPrivate { pair, private: vec![d.clone()] })
        }
        _ => Err(fail(&ctx, "DataError", "the JWK lacks members its key type needs")),
    })?;
    key(&ctx, material)
}

/// A new key pair, `[private, public]` (`kind`: `ec` on `curve`, or `ed25519`; `ring` makes no RSA keys).
fn generate<'js>(ctx: Ctx<'js>, kind: String, curve: String) -> rquickjs::Result<Array<'js>> {
    let rng = SystemRandom::new();
    let failed = |_: ring::error::Unspecified| fail(&ctx, "OperationError", "the key could not be generated");
    let pkcs8 = match kind.as_str() {
        "ec" => EcdsaKeyPair::generate_pkcs8(Curve::named(&ctx, &curve)?.signing(), &rng).map_err(failed)?,
        "ed25519" => Ed25519KeyPair::generate_pkcs8(&rng).map_err(failed)?,
        _ => return Err(fail(&ctx, "NotSupportedError", format!("generating {kind} keys is not supported"))),
    };
    let private = from_pkcs8(&ctx, &kind, &curve, pkcs8.as_ref())?;
    let public = match &private {
        Material::EcPrivate { curve, pair, .. } => {
            Material::EcPublic { curve: *curve, point: pair.public_key().as_ref().to_vec() }
        }
        Material::EdPrivate { pair, .. } => Material::EdPublic { point: pair.public_key().as_ref().to_vec() },
        _ => return Err(fail(&ctx, "OperationError", "the key could not be generated")),
    };
    let pair = Array::new(ctx.clone())?;
    pair.set(0, key(&ctx, private)?)?;
    pair.set(1, key(&ctx, public)?)?;
    Ok(pair)
}

/// What crypto.js needs of a key for its `CryptoKey`: `[type, kind, detail...]`, where the detail is the
/// length in bits of a secret, the modulus length and public exponent of an RSA key, an EC key's curve.
fn describe<'js>(ctx: Ctx<'js>, key: Class<'js, Key>) -> rquickjs::Result<Array<'js>> {
    let key = key.borrow();
    let out = Array::new(ctx.clone())?;
    let (kind, kind_name) = match &key.0 {
        Material::Secret { raw, .. } => {
            out.set(2, raw.len() * 8)?;
            ("secret", "hmac")
        }
        Material::RsaPublic { n, e } | Material::RsaPrivate { n, e, .. } => {
            out.set(2, bits(n))?;
            out.set(3, ArrayBuffer::new_copy(ctx.clone(), e)?)?;
            (if matches!(key.0, Material::RsaPublic { .. }) { "public" } else { "private" }, "rsa")
        }
        Material::EcPublic { curve, .. } => {
            out.set(2, curve.name())?;
            ("public", "ec")
        }
        Material::EcPrivate { curve, .. } => {
            out.set(2, curve.name())?;
            ("private", "ec")
        }
        Material::EdPublic { .. } => ("public", "ed25519"),
        Material::EdPrivate { .. } => ("private", "ed25519"),
    };
    out.set(0, kind)?;
    out.set(1, kind_name)?;
    Ok(out)
}

/// The signature of `data` (`scheme`: `hmac`, `pkcs1`, `pss`, `ecdsa` or `ed25519`; `hash` for ECDSA,
/// `salt` for PSS).
fn sign<'js>(
    ctx: Ctx<'js>,
    key: Class<'js, Key>,
    scheme: String,
    hash: String,
    salt: f64,
    data: TypedArray<'js, u8>,
) -> rquickjs::Result<ArrayBuffer<'js>> {
    let key = key.borrow();
    let data = bytes_of(&data);
    let rng = SystemRandom::new();
    let failed = |_| fail(&ctx, "OperationError", "signing failed");
    let signature: Vec<u8> = match (&key.0, scheme.as_str()) {
        (Material::Secret { key, .. }, "hmac") => ring::hmac::sign(key, &data).as_ref().to_vec(),
        (Material::RsaPrivate { pair, .. }, "pkcs1" | "pss") => {
            let encoding = rsa_encoding(&ctx, &scheme, Hash::named(&ctx, &hash)?, salt)?;
            let mut out = vec![0; pair.public().modulus_len()];
            pair.sign(encoding, &rng, &data, &mut out).map_err(failed)?;
            out
        }
        (Material::EcPrivate { curve, pair, .. }, "ecdsa") => {
            if Hash::named(&ctx, &hash)? != curve.hash() {
                return Err(fail(
                    &ctx,
                    "NotSupportedError",
                    format!("ECDSA on {} signs with {} only", curve.name(), hash_name(curve.hash())),
                ));
            }
            pair.sign(&rng, &data).map_err(failed)?.as_ref().to_vec()
        }
        (Material::EdPrivate { pair, .. }, "ed25519") => pair.sign(&data).as_ref().to_vec(),
        _ => return Err(fail(&ctx, "InvalidAccessError", "the key cannot sign with this algorithm")),
    };
    ArrayBuffer::new(ctx, signature)
}

fn hash_name(hash: Hash) -> &'static str {
    match hash {
        Hash::Sha1 => "SHA-1",
        Hash::Sha256 => "SHA-256",
        Hash::Sha384 => "SHA-384",
        Hash::Sha512 => "SHA-512",
    }
}

/// RSA signing's padding: PKCS #1 v1.5, or PSS with a salt as long as the hash (all `ring` does).
fn rsa_encoding(
    ctx: &Ctx<'_>,
    scheme: &str,
    hash: Hash,
    salt: f64,
) -> rquickjs::Result<&'static dyn signature::RsaEncoding> {
    match (scheme, hash) {
        ("pkcs1", Hash::Sha256) => Ok(&signature::RSA_PKCS1_SHA256),
        ("pkcs1", Hash::Sha384) => Ok(&signature::RSA_PKCS1_SHA384),
        ("pkcs1", Hash::Sha512) => Ok(&signature::RSA_PKCS1_SHA512),
        ("pss", _) if salt != hash.digest().output_len() as f64 => Err(pss_salt(ctx, hash)),
        ("pss", Hash::Sha256) => Ok(&signature::RSA_PSS_SHA256),
        ("pss", Hash::Sha384) => Ok(&signature::RSA_PSS_SHA384),
        ("pss", Hash::Sha512) => Ok(&signature::RSA_PSS_SHA512),
        _ => Err(fail(ctx, "NotSupportedError", format!("signing RSA with {} is not supported", hash_name(hash)))),
    }
}

fn pss_salt(ctx: &Ctx<'_>, hash: Hash) -> rquickjs::Error {
    let length = hash.digest().output_len();
    fail(ctx, "NotSupportedError", format!("RSA-PSS with {} takes a saltLength of {length} only", hash_name(hash)))
}

/// RSA verification for the key's size: PKCS #1 v1.5 from 1,024 bits (2,048 with SHA-384), PSS from 2,048.
fn rsa_parameters(
    ctx: &Ctx<'_>,
    scheme: &str,
    hash: Hash,
    salt: f64,
) -> rquickjs::Result<&'static signature::RsaParameters> {
    match (scheme, hash) {
        ("pkcs1", Hash::Sha1) => Ok(&signature::RSA_PKCS1_1024_8192_SHA1_FOR_LEGACY_USE_ONLY),
        ("pkcs1", Hash::Sha256) => Ok(&signature::RSA_PKCS1_1024_8192_SHA256_FOR_LEGACY_USE_ONLY),
        ("pkcs1", Hash::Sha384) => Ok(&signature::RSA_PKCS1_2048_8192_SHA384),
        ("pkcs1", Hash::Sha512) => Ok(&signature::RSA_PKCS1_1024_8192_SHA512_FOR_LEGACY_USE_ONLY),
        ("pss", _) if salt != hash.digest().output_len() as f64 => Err(pss_salt(ctx, hash)),
        ("pss", Hash::Sha256) => Ok(&signature::RSA_PSS_2048_8192_SHA256),
        ("pss", Hash::Sha384) => Ok(&signature::RSA_PSS_2048_8192_SHA384),
        ("pss", Hash::Sha512) => Ok(&signature::RSA_PSS_2048_8192_SHA512),
        _ => Err(fail(ctx, "NotSupportedError", format!("RSA-PSS with {} is not supported", hash_name(hash)))),
    }
}

/// An ECDSA signature as the standard gives it (r and s, each as long as the curve's scalars) in DER, for
/// the `ring` algorithms that take DER.
fn ecdsa_der(signature: &[u8], size: usize) -> Option<Vec<u8>> {
    if signature.len() != 2 * size {
        return None;
    }
    let (r, s) = signature.split_at(size);
    Some(der(0x30, &[der_unsigned(r), der_unsigned(s)].concat()))
}

/// Whether `signature` is `data`'s under the key.
fn verify<'js>(
    ctx: Ctx<'js>,
    key: Class<'js, Key>,
    scheme: String,
    hash: String,
    salt: f64,
    signature: TypedArray<'js, u8>,
    data: TypedArray<'js, u8>,
) -> rquickjs::Result<bool> {
    let key = key.borrow();
    let (signature, data) = (bytes_of(&signature), bytes_of(&data));
    Ok(match (&key.0, scheme.as_str()) {
        (Material::Secret { key, .. }, "hmac") => ring::hmac::verify(key, &data, &signature).is_ok(),
        (Material::RsaPublic { n, e }, "pkcs1" | "pss") => {
            let parameters = rsa_parameters(&ctx, &scheme, Hash::named(&ctx, &hash)?, salt)?;
            signature::RsaPublicKeyComponents { n, e }.verify(parameters, &data, &signature).is_ok()
        }
        (Material::EcPublic { curve, point }, "ecdsa") => {
            let hash = Hash::named(&ctx, &hash)?;
            let (algorithm, signature): (&signature::EcdsaVerificationAlgorithm, Option<Vec<u8>>) = match (curve, hash)
            {
                (Curve::P256, Hash::Sha256) => (&signature::ECDSA_P256_SHA256_FIXED, Some(signature)),
                (Curve::P384, Hash::Sha384) => (&signature::ECDSA_P384_SHA384_FIXED, Some(signature)),
                (Curve::P256, Hash::Sha384) => (&signature::ECDSA_P256_SHA384_ASN1, ecdsa_der(&signature, 32)),
                (Curve::P384, Hash::Sha256) => (&signature::ECDSA_P384_SHA256_ASN1, ecdsa_der(&signature, 48)),
                _ => {
                    return Err(fail(
                        &ctx,
                        "NotSupportedError",
                        format!("ECDSA on {} with {} is not supported", curve.name(), hash_name(hash)),
                    ))
                }
            };
            signature.is_some_and(|signature| {
                signature::UnparsedPublicKey::new(algorithm, point).verify(&data, &signature).is_ok()
            })
        }
        (Material::EdPublic { point }, "ed25519") => {
            signature::UnparsedPublicKey::new(&signature::ED25519, point).verify(&data, &signature).is_ok()
        }
        _ => return Err(fail(&ctx, "InvalidAccessError", "the key cannot verify with this algorithm")),
    })
}

/// A DER element.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let length = content.len().to_be_bytes();
    if content.len() < 128 {
        out.push(content.len() as u8);
    } else {
        let skip = length.iter().position(|&b| b != 0).unwrap_or(length.len() - 1);
        out.push(0x80 | (length.len() - skip) as u8);
        out.extend_from_slice(&length[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// A DER INTEGER of a big-endian unsigned integer.
fn der_unsigned(bytes: &[u8]) -> Vec<u8> {
    let mut content = unsigned(bytes);
    if content.first().is_none_or(|&b| b & 0x80 != 0) {
        content.insert(0, 0);
    }
    der(0x02, &content)
}

/// A DER SubjectPublicKeyInfo: the algorithm identifier's content, and the key.
fn spki(algorithm: &[u8], key: &[u8]) -> Vec<u8> {
    der(0x30, &[der(0x30, algorithm), der(0x03, &[&[0u8][..], key].concat())].concat())
}

/// A DER PKCS #8 PrivateKeyInfo (version 0): the algorithm identifier's content, and the private key.
fn pkcs8(algorithm: &[u8], key: &[u8]) -> Vec<u8> {
    der(0x30, &[der_unsigned(&[0]), der(0x30, algorithm), der(0x04, key)].concat())
}

/// The key in `format`: `raw`, `spki` or `pkcs8` bytes, or for `jwk` its members' bytes, in the order
/// import_jwk takes them (a secret: `[k]`).
fn export<'js>(ctx: Ctx<'js>, key: Class<'js, Key>, format: String) -> rquickjs::Result<Value<'js>> {
    let key = key.borrow();
    let bytes = |bytes: &[u8]| ArrayBuffer::new_copy(ctx.clone(), bytes).map(|b| b.into_value());
    let list = |parts: Vec<&[u8]>| -> rquickjs::Result<Value<'js>> {
        let array = Array::new(ctx.clone())?;
        for (i, part) in parts.into_iter().enumerate() {
            array.set(i, ArrayBuffer::new_copy(ctx.clone(), part)?)?;
        }
        Ok(array.into_value())
    };
    let unsupported = || fail(&ctx, "NotSupportedError", format!("this key cannot be exported as {format}"));
    let rsa_oid = [0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00];
    let ec_oid = [0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    let ed_oid = [0x06, 0x03, 0x2b, 0x65, 0x70];
    match (&key.0, format.as_str()) {
        (Material::Secret { raw, .. }, "raw") => bytes(raw),
        (Material::Secret { raw, .. }, "jwk") => list(vec![raw]),
        (Material::RsaPublic { n, e }, "spki") => {
            bytes(&spki(&rsa_oid, &der(0x30, &[der_unsigned(n), der_unsigned(e)].concat())))
        }
        (Material::RsaPublic { n, e }, "jwk") => list(vec![n, e]),
        (Material::EcPublic { point, .. }, "raw") | (Material::EdPublic { point }, "raw") => bytes(point),
        (Material::EcPublic { curve, point }, "spki") => bytes(&spki(&[&ec_oid[..], curve.oid_der()].concat(), point)),
        (Material::EcPublic { curve, point }, "jwk") => {
            let size = curve.size();
            list(vec![&point[1..1 + size], &point[1 + size..]])
        }
        (Material::EdPublic { point }, "spki") => bytes(&spki(&ed_oid, point)),
        (Material::EdPublic { point }, "jwk") => list(vec![point]),
        (Material::RsaPrivate { n, e, private, .. }, "pkcs8") => {
            let fields: Vec<u8> = [&[0u8][..], n, e]
                .into_iter()
                .chain(private.iter().map(Vec::as_slice))
                .flat_map(der_unsigned)
                .collect();
            bytes(&pkcs8(&rsa_oid, &der(0x30, &fields)))
        }
        (Material::EcPrivate { curve, pair, private }, "pkcs8") => {
            let d = private.first().map(Vec::as_slice).unwrap_or_default();
            let point = [&[0u8][..], pair.public_key().as_ref()].concat();
            let ec_private_key = [der_unsigned(&[1]), der(0x04, d), der(0xa1, &der(0x03, &point))].concat();
            bytes(&pkcs8(&[&ec_oid[..], curve.oid_der()].concat(), &der(0x30, &ec_private_key)))
        }
        (Material::EdPrivate { private, .. }, "pkcs8") => {
            let seed = private.first().map(Vec::as_slice).unwrap_or_default();
            bytes(&pkcs8(&ed_oid, &der(0x04, seed)))
        }
        (Material::RsaPrivate { n, e, private, .. }, "jwk") => {
            list([&n[..], &e[..]].into_iter().chain(private.iter().map(Vec::as_slice)).collect())
        }
        (Material::EcPrivate { curve, pair, private }, "jwk") => {
            let point = pair.public_key().as_ref();
            let size = curve.size();
            let coordinates = [&point[1..1 + size], &point[1 + size..]];
            list(coordinates.into_iter().chain(private.iter().map(Vec::as_slice)).collect())
        }
        (Material::EdPrivate { pair, private }, "jwk") => {
            list([pair.public_key().as_ref()].into_iter().chain(private.iter().map(Vec::as_slice)).collect())
        }
        _ => Err(unsupported()),
    }
}

/// The natives crypto.js's setup function takes.
pub fn natives<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Value<'js>> {
    let natives = Object::new(ctx.clone())?;
    natives.set("random", Func::from(random))?;
    natives.set("digest", Func::from(digest))?;
    natives.set("importSecret", Func::from(import_secret))?;
    natives.set("importPublic", Func::from(import_public))?;
    natives.set("importPrivate", Func::from(import_private))?;
    natives.set("importJwk", Func::from(import_jwk))?;
    natives.set("generate", Func::from(generate))?;
    natives.set("describe", Func::from(describe))?;
    natives.set("sign", Func::from(sign))?;
    natives.set("verify", Func::from(verify))?;
    natives.set("export", Func::from(export))?;
    Ok(natives.into_value())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths_and_integers() {
        assert_eq!(der(0x04, &[1, 2]), vec![0x04, 2, 1, 2]);
        let long = der(0x04, &[0; 300]);
        assert_eq!(&long[..4], &[0x04, 0x82, 0x01, 0x2c]);
        assert_eq!(der_unsigned(&[0, 0, 0x80]), vec![0x02, 2, 0, 0x80]);
        assert_eq!(der_unsigned(&[0, 0]), vec![0x02, 1, 0]);
        assert_eq!(der_unsigned(&[0x7f]), vec![0x02, 1, 0x7f]);
    }

    #[test]
    fn spki_prefixes_are_the_standard_ones() {
        // The fixed prefixes every encoder writes before an Ed25519 or P-256 key.
        let ed = spki(&[0x06, 0x03, 0x2b, 0x65, 0x70], &[0; 32]);
        assert_eq!(&ed[..12], &[0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00]);
        let ec = spki(
            &[&[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01][..], Curve::P256.oid_der()].concat(),
            &[4; 65],
        );
        assert_eq!(&ec[..4], &[0x30, 0x59, 0x30, 0x13]);
        assert_eq!(&ec[23..27], &[0x03, 0x42, 0x00, 0x04]);
    }
}
