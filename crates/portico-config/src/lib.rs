//! Portico's configuration: one YAML file, parsed strictly, validated fully, every error located at
//! `file:line:col` with a hint. Loading never has side effects, so a reload can validate before anything changes.

mod access;
mod diff;
mod fields;
mod function;
mod jwt;
mod limits;
mod mqtt;
mod rate_limit;
mod read;
mod route;
mod schema;
mod spans;
#[cfg(test)]
mod test_support;
mod transform;
mod units;
mod validate;

pub use access::{parse_cidr, ApiKey, ApiKeyFilter, AuthBasicFilter, IpFilter, DEFAULT_KEY_HEADER};
pub use diff::{diff, Change};
pub use fields::OWNED_HEADERS;
pub use function::{Function, FunctionLimits, SecretSource};
pub use jwt::{ClaimValue, JwksSource, JwtFilter, JwtKey, JWT_ALGORITHMS};
pub use limits::LimitsFilter;
pub use rate_limit::{parse_rate, Rate, RateKey, RateLimitFilter, RateLimits};
pub use read::LeftOut;
pub use route::*;
pub use schema::*;
pub use spans::{Position, SpanIndex};
pub use transform::{Coding, DecompressFilter, QueryFilter};
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
    /// Without a hint of its own, it points to where the key is documented.
    pub fn diagnostic(&self, path: &str, message: impl Into<String>, hint: Option<String>) -> Diagnostic {
        let pos = self.spans.locate(path);
        let hint = hint.or_else(|| Some(format!("docs/configuration.md describes `{}`", documented_key(path))));
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

/// The key as the reference names it: `listeners[0].limits.max_headers` is `limits.max_headers`, the table
/// rows of a section being relative to its items.
fn documented_key(path: &str) -> String {
    let without_indices: Vec<&str> = path.split('.').map(|part| part.split('[').next().unwrap_or(part)).collect();
    let within_item = match without_indices.as_slice() {
        // A cluster's entry is named by the user: its keys start after the name.
        ["clusters", _, rest @ ..] if !rest.is_empty() => rest,
        [_, rest @ ..] if !rest.is_empty() && path.split('.').next().is_some_and(|first| first.contains('[')) => rest,
        all => all,
    };
    within_item.join(".")
}

/// What reading a configuration found: every problem, and the configuration as far as it could be read, for the
/// checks that only building it can make (certificate files, path patterns, DNS names).
#[derive(Debug, Clone)]
pub struct Checked {
    /// Without the items the schema refused a value of (see `left_out`); `None` when the file could not be read
    /// at all (not YAML, not a mapping, not there).
    pub partial: Option<LoadedConfig>,
    /// In file order.
    pub problems: Vec<Diagnostic>,
    /// What `partial` lacks, so that a check of what refers to it can stay quiet.
    pub left_out: LeftOut,
}

impl Checked {
    /// The configuration when it has no problem, else every problem.
    pub fn into_result(self) -> Result<LoadedConfig, ConfigErrors> {
        match self.partial {
            Some(loaded) if self.problems.is_empty() => Ok(loaded),
            _ => Err(ConfigErrors(self.problems)),
        }
    }
}

/// Reads and validates the file at `path`.
pub fn load_file(path: &Path) -> Result<LoadedConfig, ConfigErrors> {
    check_file(path).into_result()
}

/// Parses and validates `source`; `file` is only used in diagnostics and to find relative paths.
pub fn load_str(source: &str, file: &str) -> Result<LoadedConfig, ConfigErrors> {
    check_str(source, file).into_result()
}

/// Reads and checks the file at `path`, reporting every problem at once.
pub fn check_file(path: &Path) -> Checked {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(source) => check_str(&source, &file),
        Err(e) => Checked {
            partial: None,
            problems: vec![Diagnostic {
                file,
                line: 1,
                col: 1,
                message: format!("cannot read the configuration file: {e}"),
                hint: Some("check the path given with -c/--config".into()),
            }],
            left_out: LeftOut::default(),
        },
    }
}

/// Reads and checks `source` (`file` names it in diagnostics): first what the schema refuses (every unknown key
/// and value of the wrong type), then, on what could be read, the checks serde cannot express (validate.rs).
pub fn check_str(source: &str, file: &str) -> Checked {
    let mut spans = SpanIndex::build(source);
    let reading = read::read(source, file, &spans);
    let mut problems = reading.problems;
    let partial = reading.config.map(|config| {
        spans.renumber(reading.renumbered);
        LoadedConfig { config, file: file.to_string(), spans, source: source.to_string() }
    });
    if let Some(loaded) = &partial {
        problems.extend(validate::validate(loaded, &reading.left_out));
    }
    // In file order, as a compiler reports.
    problems.sort_by_key(|d| (d.line, d.col));
    Checked { partial, problems, left_out: reading.left_out }
}

/// serde_norway's message without the " at line X column Y" it appends (the position goes in front).
fn without_location(mut message: String) -> String {
    if let Some(i) = message.find(" at line ") {
        message.truncate(i);
    }
    message
}

fn serde_diagnostic(e: &serde_norway::Error, file: &str) -> Diagnostic {
    let (line, col) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
    let message = without_location(e.to_string());
    let hint = Some(hint_for(&message));
    Diagnostic { file: file.to_string(), line, col, message, hint }
}

/// What to do about a message of serde's; with the closest known name when a key or value is misspelt.
fn hint_for(message: &str) -> String {
    match nearest_known(message) {
        Some(name) if message.contains("unknown field") => {
            format!("did you mean `{name}`? Unknown keys are rejected, so a typo never means the default")
        }
        None if message.contains("unknown field") => {
            "check the spelling against docs/configuration.md; unknown keys are rejected".to_string()
        }
        Some(name) if message.contains("unknown variant") => format!("did you mean `{name}`?"),
        None if message.contains("unknown variant") => "use one of the values listed in the message".to_string(),
        _ if message.contains("missing field") => "add the key; docs/configuration.md shows an example".to_string(),
        _ => match message.split_once("invalid type: ").and_then(|(_, rest)| rest.split_once(", expected ")) {
            Some((_, expected)) => {
                format!("write {} here; docs/configuration.md shows the form of every key", in_yaml_terms(expected))
            }
            None => "docs/configuration.md shows the expected form of every key".to_string(),
        },
    }
}

/// serde's name for an expected type, as a YAML file's author knows it.
fn in_yaml_terms(expected: &str) -> &str {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" | "i32" | "i64" => "a whole number",
        "a boolean" => "true or false",
        "a sequence" => "a list (`[a, b]`)",
        "a map" => "a mapping (`{ key: value }`)",
        e if e.starts_with("struct ") => "a mapping of settings (`{ key: value }`)",
        e => e,
    }
}

/// In serde's "unknown field `adress`, expected one of `name`, `address`, ...", the known name nearest the one
/// given, when one is near enough to be what was meant.
fn nearest_known(message: &str) -> Option<&str> {
    let given = message.split('`').nth(1)?;
    let known = message.split_once("expected one of ")?.1;
    known
        .split(", ")
        .map(|name| name.trim_matches('`'))
        .filter(|name| !name.is_empty())
        .map(|name| (edit_distance(given, name), name))
        .filter(|(distance, name)| *distance <= 2.max(name.len() / 3))
        .min()
        .map(|(_, name)| name)
}

/// Levenshtein distance, for suggesting a key close to a misspelt one.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The default location of the configuration file when `-c` is not given.
pub fn default_path() -> PathBuf {
    PathBuf::from("portico.yaml")
}
