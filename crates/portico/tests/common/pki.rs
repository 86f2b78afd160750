//! A throw-away PKI for TLS tests: a CA, server certificates for chosen names, client certificates, written
//! as PEM files, plus a blocking rustls client that trusts the CA.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
    pub pem: PathBuf,
}

/// A certificate and key written to `<dir>/<name>.pem` and `<dir>/<name>.key`.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: Vec<u8>,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        let pem = dir.join(format!("{name}.pem"));
        std::fs::write(&pem, cert.pem()).unwrap();
        Ca { cert, key, pem }
    }

    fn issue(
        &self,
        dir: &Path,
        file: &str,
        common_name: &str,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> Issued {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        if common_name.starts_with("expired") {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.distinguished_name.push(DnType::OrganizationName, "Portico Tests");
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let issued = Issued {
            cert: dir.join(format!("{file}.pem")),
            key: dir.join(format!("{file}.key")),
            der: cert.der().to_vec(),
        };
        std::fs::write(&issued.cert, cert.pem()).unwrap();
        std::fs::write(&issued.key, key.serialize_pem()).unwrap();
        issued
    }

    /// A server certificate for `names` (DNS names), with `common_name` as its subject (one whose common name
    /// starts with `expired` expired in 2021).
    pub fn server(&self, dir: &Path, file: &str, common_name: &str, names: &[&str]) -> Issued {
        self.issue(dir, file, common_name, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    pub fn client(&self, dir: &Path, file: &str, common_name: &str) -> Issued {
        self.issue(dir, file, common_name, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

pub type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A blocking TLS client connection to `addr` for `server_name`, trusting `ca`, optionally presenting a client
/// certificate, offering `alpn`. The handshake is complete when it returns.
pub fn connect(
    addr: SocketAddr,
    server_name: &str,
    ca: &Path,
    client: Option<&Issued>,
    alpn: &[&str],
) -> std::io::Result<TlsStream> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        Some(c) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(&c.cert).unwrap().map(|c| c.unwrap()).collect(),
                PrivateKeyDer::from_pem_file(&c.key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let name = ServerName::try_from(server_name.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(stream)
}

/// The DER of the leaf certificate the server presented.
pub fn served_leaf(stream: &TlsStream) -> Vec<u8> {
    stream.conn.peer_certificates().and_then(|c| c.first()).map(|c| c.to_vec()).unwrap_or_default()
}
