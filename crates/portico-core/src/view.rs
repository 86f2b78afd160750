//! What a plane shows on the admin address. The admin server depends on portico-core alone and asks each plane
//! for its part; the binary hands it the planes it runs.

use portico_config::LoadedConfig;
use std::sync::Arc;

pub trait PlaneView: Send + Sync {
    /// Appends this plane's metrics, in the Prometheus text format, one family at a time.
    fn render_metrics(&self, out: &mut String);
    /// The document for `GET /admin/{name}` (the HTTP plane: `clusters`), if this plane serves one.
    fn admin_view(&self, name: &str) -> Option<serde_json::Value>;
    /// The configuration this plane runs now.
    fn running_config(&self) -> Arc<LoadedConfig>;
}
