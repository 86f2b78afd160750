//! The `functions:` section: JavaScript handlers run in-process (docs/functions.md). Each is a route target
//! (`function: NAME`) with limits enforced per request.

use crate::units::{ByteSize, HumanDuration};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Function {
    /// The handler's file (relative to the configuration file): `export default { fetch(request, env, ctx) }`
    /// or `function handler(request)`.
    pub source: String,
    #[serde(default)]
    pub limits: FunctionLimits,
    /// Variables handed to the handler as `env`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FunctionLimits {
    /// CPU time one request may spend running JavaScript; past it: 500.
    pub cpu: HumanDuration,
    /// Heap of one runtime (each worker runs its own); past it: 500, and the runtime is made anew.
    pub memory: ByteSize,
    /// Largest response body; past it: 500.
    pub max_response: ByteSize,
    /// Largest request body a handler is given; past it: 413.
    pub max_request: ByteSize,
}

impl Default for FunctionLimits {
    fn default() -> Self {
        FunctionLimits {
            cpu: HumanDuration(std::time::Duration::from_millis(50)),
            memory: ByteSize(32 << 20),
            max_response: ByteSize(16 << 20),
            max_request: ByteSize(16 << 20),
        }
    }
}
