//! Certificates for `portico demo -c FILE`: the TLS files a configuration names that do not exist yet are made
//! by a throw-away demo CA (certificates for `localhost` and `127.0.0.1`, the CA's own certificate where a CA
//! file is named), so that a TLS example runs as written. `portico run` never makes certificates.

use anyhow::Context;
use portico_config::LoadedConfig;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use std::path::PathBuf;

/// Makes every missing certificate, key and CA file `loaded` names; returns the files written.
pub fn make_missing(loaded: &LoadedConfig) -> anyhow::Result<Vec<PathBuf>> {
    let config = &loaded.config;
    let missing = |p: &String| !loaded.resolve(p).exists();
    let mut pairs: Vec<(&String, &String)> = Vec::new();
    let mut cas: Vec<&String> = Vec::new();
    for tls in config.listeners.iter().filter_map(|l| l.tls.as_ref()) {
        pairs.extend(tls.certificates.iter().map(|c| (&c.cert, &c.key)));
        cas.extend(tls.client_ca.as_ref());
    }
    for tls in config.clusters.values().filter_map(|c| c.tls.as_ref()) {
        cas.extend(tls.ca.as_ref());
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            pairs.push((cert, key));
        }
    }
    pairs.retain(|(cert, key)| missing(cert) || missing(key));
    cas.retain(|ca| missing(ca));
    if pairs.is_empty() && cas.is_empty() {
        return Ok(Vec::new());
    }
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "Portico demo CA (not for production)");
    let ca = ca_params.self_signed(&ca_key)?;
    let mut written = Vec::new();
    let mut write = |path: &String, contents: String| -> anyhow::Result<()> {
        let path = loaded.resolve(path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&path, contents).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    for ca_file in cas {
        write(ca_file, ca.pem())?;
    }
    for (cert_file, key_file) in pairs {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
        params.distinguished_name.push(DnType::CommonName, "localhost");
        let cert = params.signed_by(&key, &ca, &ca_key)?;
        write(cert_file, cert.pem() + &ca.pem())?;
        write(key_file, key.serialize_pem())?;
    }
    Ok(written)
}
