//! `watch: true`: what is compared every second to notice a changed configuration or certificate.

use portico_config::LoadedConfig;
use std::path::Path;
use std::time::SystemTime;

/// Size and modification time: what `watch: true` compares every second.
fn file_stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

/// What `watch: true` watches: the configuration file and every certificate, key and CA file it names, so a
/// renewed certificate is served without a signal, and the password and key files of `auth_basic` and
/// `api_key` filters, and the key, JWKS and revocation files of `jwt` filters.
pub fn watched_stamps(config: &Path, loaded: &LoadedConfig) -> Vec<Option<(u64, SystemTime)>> {
    let mut stamps = vec![file_stamp(config)];
    for tls in loaded.config.listeners.iter().filter_map(|l| l.tls.as_ref()) {
        let files = tls.certificates.iter().flat_map(|c| [&c.cert, &c.key]).chain(tls.client_ca.as_ref());
        stamps.extend(files.map(|f| file_stamp(&loaded.resolve(f))));
    }
    let filters = loaded.config.filters.iter().chain(loaded.config.routes.iter().flat_map(|r| &r.filters));
    for f in filters {
        let file = match f {
            portico_config::Filter::AuthBasic(a) => Some(&a.users_file),
            portico_config::Filter::ApiKey(k) => k.keys_file.as_ref(),
            portico_config::Filter::Jwt(j) => {
                let keys = j.keys.iter().flat_map(|k| [&k.secret_file, &k.public_key_file]).flatten();
                let files = keys.chain(&j.jwks_file).chain(&j.revoked_file);
                stamps.extend(files.map(|f| file_stamp(&loaded.resolve(f))));
                None
            }
            _ => None,
        };
        stamps.extend(file.map(|f| file_stamp(&loaded.resolve(f))));
    }
    stamps
}
