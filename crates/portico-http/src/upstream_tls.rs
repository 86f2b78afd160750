//! TLS towards upstream endpoints, on rustls: one client configuration per cluster (roots, client
//! certificate, resumption cache shared by its endpoints), built when a snapshot is built so a bad file fails
//! the reload with its position. Connections are verified against the endpoint's host (or `tls.server_name`)
//! and pooled like plain ones.

use portico_config::{LoadedConfig, UpstreamProtocol, UpstreamTls};
use portico_core::tls::{chain_at, key_at, provider, Problem};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::{Arc, OnceLock};
use tokio_rustls::TlsConnector;

/// How one endpoint is reached over TLS.
#[derive(Clone)]
pub struct EndpointTls {
    pub connector: TlsConnector,
    pub server_name: ServerName<'static>,
}

impl std::fmt::Debug for EndpointTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointTls").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

/// The server name an endpoint is verified against: `tls.server_name`, else the endpoint's host.
pub fn server_name(configured: Option<&str>, host: &str) -> Result<ServerName<'static>, String> {
    let name = configured.unwrap_or(host);
    ServerName::try_from(name.to_string()).map_err(|_| format!("{name:?} is not a valid TLS server name"))
}

/// Builds the client configuration for cluster `name`; `tls` is its `tls:` section, if any. Every file that will
/// not do is reported, not only the first.
pub fn client_config(
    loaded: &LoadedConfig,
    name: &str,
    tls: Option<&UpstreamTls>,
    protocol: UpstreamProtocol,
) -> Result<TlsConnector, Vec<Problem>> {
    let defaults = UpstreamTls::default();
    let tls = tls.unwrap_or(&defaults);
    let base = format!("clusters.{name}.tls");
    let provider = provider();
    let mut problems = Vec::new();
    let ca = (!tls.insecure_skip_verify).then_some(tls.ca.as_ref()).flatten().and_then(|ca| {
        let path = format!("{base}.ca");
        chain_at(loaded, &path, ca).map(|chain| (path, ca, chain)).map_err(|p| problems.push(p)).ok()
    });
    let client_cert = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key_file)) => {
            let chain = chain_at(loaded, &format!("{base}.cert"), cert).map_err(|p| problems.push(p));
            let key = key_at(loaded, &format!("{base}.key"), key_file).map_err(|p| problems.push(p));
            chain.and_then(|chain| Ok((cert, key_file, chain, key?))).ok()
        }
        _ => None,
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| vec![(base.clone(), format!("unsupported TLS versions: {e}"), None)])?;
    let builder = if tls.insecure_skip_verify {
        tracing::warn!(cluster = name, "tls.insecure_skip_verify: upstream certificates are NOT verified");
        builder.dangerous().with_custom_certificate_verifier(Arc::new(NoVerification(provider.clone())))
    } else {
        let roots = match ca {
            Some((path, ca, chain)) => {
                let mut roots = RootCertStore::empty();
                for cert in chain {
                    roots
                        .add(cert)
                        .map_err(|e| vec![(path.clone(), format!("unusable CA certificate in {ca}: {e}"), None)])?;
                }
                Arc::new(roots)
            }
            None => system_roots().map_err(|m| {
                vec![(
                    base.clone(),
                    m,
                    Some("set `tls.ca` to a PEM bundle, or install the system's CA certificates".into()),
                )]
            })?,
        };
        builder.with_root_certificates(roots)
    };
    let mut config = match client_cert {
        Some((cert, key_file, chain, key)) => builder.with_client_auth_cert(chain, key).map_err(|e| match e {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => vec![(
                format!("{base}.key"),
                format!("the key in {key_file} does not belong to the certificate in {cert}"),
                Some("pair the client certificate with the key it was issued for".to_string()),
            )],
            e => vec![(format!("{base}.key"), format!("unusable client certificate or key: {e}"), None)],
        })?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = match protocol {
        UpstreamProtocol::Http1 => vec![b"http/1.1".to_vec()],
        UpstreamProtocol::H2 => vec![b"h2".to_vec()],
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The operating system's trusted roots, read once per process.
fn system_roots() -> Result<Arc<RootCertStore>, String> {
    static ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found.errors.first().map(|e| format!(": {e}")).unwrap_or_default();
                return Err(format!("no system CA certificates found{why}"));
            }
            Ok(Arc::new(roots))
        })
        .clone()
}

/// `insecure_skip_verify`: accepts any certificate. Signatures are still checked, so the peer must hold the
/// key of the certificate it sent; who that certificate names is not.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
