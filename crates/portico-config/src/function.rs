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
    /// Secrets handed to the handler in `env` too, read from an environment variable or a file when the
    /// configuration is loaded; their values are never logged nor shown by the admin API.
    #[serde(default)]
    pub secrets: BTreeMap<String, SecretSource>,
}

/// Where a secret's value comes from: exactly one of the two.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSource {
    /// An environment variable of the Portico process.
    #[serde(default)]
    pub env: Option<String>,
    /// A file (relative to the configuration file); one trailing newline is dropped.
    #[serde(default)]
    pub file: Option<String>,
}

impl SecretSource {
    /// The secret's value, read now; `Err` says why there is none.
    pub fn read(&self, loaded: &crate::LoadedConfig) -> Result<String, String> {
        match (&self.env, &self.file) {
            (Some(var), None) => std::env::var(var).map_err(|_| format!("the environment variable {var} is not set")),
            (None, Some(file)) => {
                let text =
                    std::fs::read_to_string(loaded.resolve(file)).map_err(|e| format!("cannot read {file}: {e}"))?;
                Ok(text.strip_suffix('\n').map(str::to_string).unwrap_or(text))
            }
            _ => Err("a secret comes from exactly one of `env: VARIABLE` or `file: PATH`".into()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FunctionLimits {
    /// CPU time one request may spend running JavaScript; past it: 500.
    pub cpu: HumanDuration,
    /// Time from the request reaching the function to its response (waiting for timers, fetches, or a turn
    /// under the concurrency limit included); past it: 504 (503 while still waiting for a turn).
    pub wall: HumanDuration,
    /// Calls of the function one worker runs at once (each waiting for timers or fetches between its slices);
    /// more wait for a turn.
    pub concurrency: usize,
    /// Heap of one runtime (each worker runs its own); past it: 500, and the runtime is made anew.
    pub memory: ByteSize,
    /// Largest response body; past it: 500.
    pub max_response: ByteSize,
    /// Largest request body a handler is given; past it: 413.
    pub max_request: ByteSize,
    /// How long the file's top-level code may run when the configuration loads; past it the load fails.
    pub startup: HumanDuration,
}

impl Default for FunctionLimits {
    fn default() -> Self {
        FunctionLimits {
            cpu: HumanDuration(std::time::Duration::from_millis(50)),
            wall: HumanDuration(std::time::Duration::from_secs(30)),
            concurrency: 64,
            memory: ByteSize(32 << 20),
            max_response: ByteSize(16 << 20),
            max_request: ByteSize(16 << 20),
            startup: HumanDuration(std::time::Duration::from_secs(1)),
        }
    }
}
