//! TLS termination on listeners, on rustls: certificates loaded and checked when a snapshot is built (so a bad
//! file fails the reload with `file:line:col` and the running config stays), SNI picking the certificate,
//! optional client certificate verification. Each snapshot carries its own acceptor, so a reload serves new
//! certificates to new connections while open ones keep theirs.

use portico_config::{ClientAuth, Listener, ListenerTls, LoadedConfig, TlsVersion};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_rustls::TlsAcceptor;

/// What a TLS listener needs at accept time; part of the snapshot.
pub struct TlsTerminator {
    pub acceptor: TlsAcceptor,
    pub handshake_timeout: Duration,
    /// The header that carries the verified client certificate's subject upstream (mutual TLS only).
    pub client_cert_header: Option<Arc<str>>,
    /// Each certificate's file and expiry, for the metrics.
    pub certificates: Vec<CertificateInfo>,
}

impl std::fmt::Debug for TlsTerminator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTerminator").field("certificates", &self.certificates).finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
pub struct CertificateInfo {
    /// The certificate file as configured.
    pub file: String,
    /// The leaf certificate's `notAfter`, as seconds since the Unix epoch.
    pub not_after: i64,
    /// The DNS names the certificate covers (subject alternative names).
    pub names: Vec<String>,
}

/// The crypto provider for every TLS connection: ring, which builds with a C compiler only (aws-lc-rs
/// would also need cmake and NASM on the build machine).
///
/// Cipher suites with SHA-256 come first: a TLS 1.3 handshake hashes its transcript and derives its keys with
/// the suite's hash, and SHA-256 runs on the CPU's SHA extensions where SHA-384 does not. That is a measured
/// part of a full handshake's CPU (bench/RESULTS.md); AES-128-GCM is as strong as anyone needs.
impl TlsTerminator {
    /// Completes the TLS handshake within the listener's handshake timeout, counted in `stats` for `worker`.
    /// Failures are counted, not logged above debug: a scanner or a client that distrusts the certificate must
    /// not flood the log.
    pub async fn handshake(
        &self,
        io: tokio::net::TcpStream,
        stats: &crate::stats::ListenerStats,
        worker: usize,
    ) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
        let counters = crate::stats::slot(&stats.slots, worker);
        match tokio::time::timeout(self.handshake_timeout, self.acceptor.accept(io)).await {
            Ok(Ok(stream)) => {
                counters.tls_handshakes.inc();
                Some(stream)
            }
            Ok(Err(e)) => {
                counters.tls_handshake_failures.inc();
                tracing::debug!(listener = %stats.listener, "TLS handshake failed: {e}");
                None
            }
            Err(_) => {
                counters.tls_handshake_timeouts.inc();
                None
            }
        }
    }
}

pub fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.sort_by_key(|suite| match suite.suite() {
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => 1,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 2,
        _ => 3, // TLS 1.2 suites keep their order
    });
    Arc::new(provider)
}

fn ticketer() -> Option<Arc<dyn rustls::server::ProducesTickets>> {
    static TICKETER: std::sync::OnceLock<Option<Arc<dyn rustls::server::ProducesTickets>>> = std::sync::OnceLock::new();
    TICKETER.get_or_init(|| rustls::crypto::ring::Ticketer::new().ok()).clone()
}

/// A problem with one configured value: its YAML path, the message and a hint.
pub type Problem = (String, String, Option<String>);

/// Builds the acceptor for `listeners[index].tls`: reads and checks every file, and reports every file that
/// will not do, not only the first.
pub fn build_terminator(
    loaded: &LoadedConfig,
    index: usize,
    listener: &Listener,
    tls: &ListenerTls,
) -> Result<TlsTerminator, Vec<Problem>> {
    let base = format!("listeners[{index}].tls");
    let provider = provider();
    let mut problems = Vec::new();
    let mut keys = Vec::with_capacity(tls.certificates.len());
    let mut infos = Vec::with_capacity(tls.certificates.len());
    for (j, pair) in tls.certificates.iter().enumerate() {
        let cert_path = format!("{base}.certificates[{j}].cert");
        let key_path = format!("{base}.certificates[{j}].key");
        let chain = chain_at(loaded, &cert_path, &pair.cert).map_err(|p| problems.push(p));
        let key = key_at(loaded, &key_path, &pair.key).map_err(|p| problems.push(p));
        let (Ok(chain), Ok(key)) = (chain, key) else { continue };
        let info = match describe(&pair.cert, &chain[0]) {
            Ok(info) => info,
            Err(m) => {
                problems.push((cert_path, m, None));
                continue;
            }
        };
        let signing = match provider.key_provider.load_private_key(key) {
            Ok(signing) => signing,
            Err(e) => {
                let hint = Some("use an RSA, ECDSA or Ed25519 key".into());
                problems.push((key_path, format!("unusable private key: {e}"), hint));
                continue;
            }
        };
        let certified = CertifiedKey::new(chain, signing);
        if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) = certified.keys_match() {
            problems.push((
                key_path,
                format!("the key in {} does not belong to the certificate in {}", pair.key, pair.cert),
                Some("pair each certificate with the key it was issued for".into()),
            ));
            continue;
        }
        keys.push(Arc::new(certified));
        infos.push(info);
    }
    let client_roots = tls.client_ca.as_ref().map(|ca| {
        let path = format!("{base}.client_ca");
        let mut roots = RootCertStore::empty();
        for cert in chain_at(loaded, &path, ca)? {
            roots.add(cert).map_err(|e| (path.clone(), format!("unusable CA certificate in {ca}: {e}"), None))?;
        }
        Ok((path, ca, roots))
    });
    let client_roots = match client_roots {
        Some(Err(p)) => {
            problems.push(p);
            None
        }
        Some(Ok(roots)) => Some(roots),
        None => None,
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    let default = tls.certificates.iter().position(|c| c.default).unwrap_or(0);
    let resolver = SniResolver { names: infos.iter().map(|i| i.names.clone()).collect(), keys, default };

    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| vec![(format!("{base}.min_version"), format!("unsupported TLS versions: {e}"), None)])?;
    let builder = match client_roots {
        None => builder.with_no_client_auth(),
        Some((path, ca, roots)) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let verifier = match tls.client_auth.unwrap_or_default() {
                ClientAuth::Required => verifier,
                ClientAuth::Optional => verifier.allow_unauthenticated(),
            };
            let verifier =
                verifier.build().map_err(|e| vec![(path, format!("cannot verify clients with {ca}: {e}"), None)])?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    // The server's order of cipher suites, not the client's (see `provider`).
    config.ignore_client_order = true;
    config.alpn_protocols = match &tls.alpn {
        Some(offered) => offered.iter().map(|p| p.as_bytes().to_vec()).collect(),
        // MQTT clients rarely offer ALPN, and some offer names of their own (`mqtt`, a cloud's): negotiating
        // none accepts them all.
        None if listener.protocol == portico_config::ListenerProtocol::Mqtt => Vec::new(),
        // `http/1.0` last: a client that offers only that (curl -0) is served rather than refused.
        None if listener.http2.enabled => vec![b"h2".to_vec(), b"http/1.1".to_vec(), b"http/1.0".to_vec()],
        None => vec![b"http/1.1".to_vec(), b"http/1.0".to_vec()],
    };
    // Stateless resumption tickets work across every worker, and across reloads: one ticketer per process
    // (it rotates its own keys).
    if let Some(ticketer) = ticketer() {
        config.ticketer = ticketer;
    }
    Ok(TlsTerminator {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        handshake_timeout: tls.handshake_timeout.0,
        client_cert_header: tls.client_ca.as_ref().map(|_| Arc::from(tls.client_cert_header.to_ascii_lowercase())),
        certificates: infos,
    })
}

/// Reads the certificates (or CAs) in `file`, as written at `at` in the configuration.
pub fn chain_at(loaded: &LoadedConfig, at: &str, file: &str) -> Result<Vec<CertificateDer<'static>>, Problem> {
    let path = loaded.resolve(file);
    read_chain(&path).map_err(|message| {
        let hint = unusable_file_hint(file, &path).unwrap_or_else(|| {
            format!(
                "a certificate file holds PEM blocks that start `-----BEGIN CERTIFICATE-----`; convert a DER file with \
                 `openssl x509 -inform der -in {file} -out {file}.pem`"
            )
        });
        (at.to_string(), message, Some(hint))
    })
}

/// Reads the private key in `file`, as written at `at` in the configuration.
pub fn key_at(loaded: &LoadedConfig, at: &str, file: &str) -> Result<PrivateKeyDer<'static>, Problem> {
    let path = loaded.resolve(file);
    read_key(&path).map_err(|message| {
        let hint = unusable_file_hint(file, &path).unwrap_or_else(|| {
            format!("a key file holds one unencrypted PEM private key; `openssl pkey -in {file} -out {file}.pem` writes one")
        });
        (at.to_string(), message, Some(hint))
    })
}

/// What to do about a file that is missing or cannot be opened; `None` when it opens (its contents are wrong).
fn unusable_file_hint(written: &str, path: &Path) -> Option<String> {
    match std::fs::File::open(path) {
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && Path::new(written).is_relative() => Some(format!(
            "relative paths start at the configuration file's directory: it was looked for as {}",
            std::path::absolute(path).as_deref().unwrap_or(path).display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("check the path".into()),
        Err(_) => Some("make it readable by the user Portico runs as".into()),
    }
}

pub fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let iter = CertificateDer::pem_file_iter(path).map_err(|e| format!("cannot read {shown}: {}", pem_error(&e)))?;
    let chain = iter
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot parse {shown} as PEM certificates: {}", pem_error(&e)))?;
    if chain.is_empty() {
        return Err(format!("{shown} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)"));
    }
    Ok(chain)
}

pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    if std::fs::read_to_string(path).is_ok_and(|text| text.contains("ENCRYPTED")) {
        return Err(format!(
            "{0} holds an encrypted private key, and Portico reads unencrypted keys only; decrypt it with \
             `openssl pkey -in {0} -out {0}.plain` and make that file readable by Portico alone",
            path.display()
        ));
    }
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("{} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)", path.display())
        }
        e => format!("cannot read the private key in {}: {}", path.display(), pem_error(&e)),
    })
}

fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        other => format!("{other:?}"),
    }
}

/// Reads what the listener needs to know of a leaf certificate: its names and expiry.
fn describe(file: &str, leaf: &CertificateDer<'_>) -> Result<CertificateInfo, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("the first certificate in {file} is not valid X.509: {e}"))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                names.push(dns.to_ascii_lowercase());
            }
        }
    }
    let not_after = cert.validity().not_after.timestamp();
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    if not_after < now {
        tracing::warn!(certificate = file, "certificate expired at {}", cert.validity().not_after);
    }
    Ok(CertificateInfo { file: file.to_string(), not_after, names })
}

/// The name a verified client certificate gives its holder: the subject's first Common Name, or, without
/// one, its first subject alternative name (DNS name, e-mail address or URI). `None` without a certificate.
pub fn client_identity(conn: &rustls::ServerConnection) -> Option<String> {
    let leaf = conn.peer_certificates()?.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
    if let Some(cn) = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()) {
        return Some(cn.to_string());
    }
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|name| match name {
        x509_parser::extensions::GeneralName::DNSName(s)
        | x509_parser::extensions::GeneralName::RFC822Name(s)
        | x509_parser::extensions::GeneralName::URI(s) => Some(s.to_string()),
        _ => None,
    })
}

/// The subject of a verified client certificate as an RFC 4514 string (`CN=alice,O=Example`, most specific
/// first, as nginx's `$ssl_client_s_dn`), in ASCII: special characters are escaped and any other byte goes
/// as `\XX`, so an attribute value can never pass for another attribute, and nothing can end a header line.
pub fn client_subject(conn: &rustls::ServerConnection) -> Option<Box<str>> {
    let leaf = conn.peer_certificates()?.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
    let mut out = String::new();
    for (i, rdn) in cert.subject().iter().collect::<Vec<_>>().into_iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, attr) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            let oid = attr.attr_type().to_id_string();
            out.push_str(match oid.as_str() {
                "2.5.4.3" => "CN",
                "2.5.4.6" => "C",
                "2.5.4.7" => "L",
                "2.5.4.8" => "ST",
                "2.5.4.9" => "STREET",
                "2.5.4.10" => "O",
                "2.5.4.11" => "OU",
                "0.9.2342.19200300.100.1.1" => "UID",
                "0.9.2342.19200300.100.1.25" => "DC",
                other => other,
            });
            out.push('=');
            match attr.as_str() {
                Ok(value) => escape_rdn_value(&mut out, value),
                // Not a string type: the DER value in hex (RFC 4514 2.4).
                Err(_) => {
                    out.push('#');
                    for b in attr.attr_value().data.iter() {
                        out.push_str(&format!("{b:02x}"));
                    }
                }
            }
        }
    }
    Some(out.into_boxed_str())
}

/// RFC 4514 2.4 escaping, plus `\XX` for every byte that is not printable ASCII.
fn escape_rdn_value(out: &mut String, value: &str) {
    let bytes = value.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let edge_space = b == b' ' && (i == 0 || i == bytes.len() - 1);
        match b {
            b'"' | b'+' | b',' | b';' | b'<' | b'>' | b'\\' | b'=' => {
                out.push('\\');
                out.push(b as char);
            }
            b'#' if i == 0 => out.push_str("\\#"),
            _ if edge_space => out.push_str("\\ "),
            0x21..=0x7e | b' ' => out.push(b as char),
            _ => out.push_str(&format!("\\{b:02X}")),
        }
    }
}

/// Picks the certificate for a client hello's SNI name: the first whose names cover it (exactly, or by a
/// `*.` wildcard covering one label), else the default.
#[derive(Debug)]
struct SniResolver {
    keys: Vec<Arc<CertifiedKey>>,
    names: Vec<Vec<String>>,
    default: usize,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(sni) = hello.server_name() {
            let sni = sni.to_ascii_lowercase();
            if let Some(i) = self.names.iter().position(|names| names.iter().any(|n| name_covers(n, &sni))) {
                return Some(self.keys[i].clone());
            }
        }
        self.keys.get(self.default).cloned()
    }
}

fn name_covers(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.split_once('.').is_some_and(|(label, rest)| !label.is_empty() && rest.eq_ignore_ascii_case(suffix))
        }
        None => pattern.eq_ignore_ascii_case(host),
    }
}

#[cfg(test)]
mod tests {
    use super::name_covers;

    #[test]
    fn subject_values_are_escaped() {
        let escaped = |v: &str| {
            let mut out = String::new();
            super::escape_rdn_value(&mut out, v);
            out
        };
        assert_eq!(escaped("alice"), "alice");
        assert_eq!(escaped("eve, O=Admin"), "eve\\, O\\=Admin");
        assert_eq!(escaped("#x y "), "\\#x y\\ ");
        assert_eq!(escaped("a\"b+c;d<e>f\\"), "a\\\"b\\+c\\;d\\<e\\>f\\\\");
        assert_eq!(escaped("Zoë\r\n"), "Zo\\C3\\AB\\0D\\0A");
    }

    #[test]
    fn wildcards_cover_one_label() {
        assert!(name_covers("example.com", "example.com"));
        assert!(name_covers("*.example.com", "api.example.com"));
        assert!(!name_covers("*.example.com", "example.com"));
        assert!(!name_covers("*.example.com", "a.b.example.com"));
        assert!(!name_covers("api.example.com", "www.example.com"));
    }
}
