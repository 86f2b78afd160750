//! Portico's configuration: one YAML file, parsed strictly, validated fully, every error located at
//! `file:line:col` with a hint. Loading never has side effects, so a reload can validate before anything changes.

mod diff;
mod route;
mod schema;
mod spans;
mod units;
mod validate;

pub use diff::{diff, Change};
pub use route::*;
pub use schema::*;
pub use spans::{Position, SpanIndex};
pub use units::{parse_size, ByteSize, HumanDuration};
pub use validate::{parse_endpoint, parse_host_port, EndpointScheme, HostPort};

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in a configuration file, with where it is and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
    pub hint: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.col, self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// Everything wrong with a configuration, in file order.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigErrors(pub Vec<Diagnostic>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// A parsed and validated configuration together with the positions of its values, so that later checks (DNS
/// resolution when the snapshot is built) can still report `file:line:col`.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    pub file: String,
    pub spans: SpanIndex,
    /// The YAML text as loaded (shown, with secrets masked, by the admin API).
    pub source: String,
}

impl LoadedConfig {
    /// A diagnostic pointing at the value under `path` (for example `clusters.app.endpoints[0].address`).
    pub fn diagnostic(&self, path: &str, message: impl Into<String>, hint: Option<String>) -> Diagnostic {
        let pos = self.spans.locate(path);
        Diagnostic { file: self.file.clone(), line: pos.line, col: pos.col, message: message.into(), hint }
    }

    /// Where a path written in the configuration points: relative paths start at the configuration file's
    /// directory, never at the working directory (under systemd that is `/`), so a configuration and the files
    /// it names can move together.
    pub fn resolve(&self, path: &str) -> PathBuf {
        let path = Path::new(path);
        match Path::new(&self.file).parent() {
            Some(dir) if path.is_relative() && !dir.as_os_str().is_empty() => dir.join(path),
            _ => path.to_path_buf(),
        }
    }
}

/// Reads and validates the file at `path`.
pub fn load_file(path: &Path) -> Result<LoadedConfig, ConfigErrors> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![Diagnostic {
            file: file.clone(),
            line: 1,
            col: 1,
            message: format!("cannot read the configuration file: {e}"),
            hint: Some("check the path given with -c/--config".into()),
        }])
    })?;
    load_str(&source, &file)
}

/// Parses and validates `source`; `file` is only used in diagnostics.
pub fn load_str(source: &str, file: &str) -> Result<LoadedConfig, ConfigErrors> {
    let config: Config = serde_norway::from_str(source).map_err(|e| ConfigErrors(vec![serde_diagnostic(&e, file)]))?;
    let loaded =
        LoadedConfig { config, file: file.to_string(), spans: SpanIndex::build(source), source: source.to_string() };
    let problems = validate::validate(&loaded);
    if problems.is_empty() {
        Ok(loaded)
    } else {
        Err(ConfigErrors(problems))
    }
}

fn serde_diagnostic(e: &serde_norway::Error, file: &str) -> Diagnostic {
    let (line, col) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
    // serde_norway appends " at line X column Y" to its messages; the position is already in front.
    let mut message = e.to_string();
    if let Some(i) = message.find(" at line ") {
        message.truncate(i);
    }
    let hint = if message.contains("unknown field") {
        Some("check the spelling against docs/configuration.md; unknown keys are rejected".to_string())
    } else if message.contains("unknown variant") {
        Some("use one of the values listed in the message".to_string())
    } else if message.contains("missing field") {
        Some("add the key; docs/configuration.md shows an example".to_string())
    } else {
        Some("docs/configuration.md shows the expected form of every key".to_string())
    };
    Diagnostic { file: file.to_string(), line, col, message, hint }
}

/// The default location of the configuration file when `-c` is not given.
pub fn default_path() -> PathBuf {
    PathBuf::from("portico.yaml")
}
