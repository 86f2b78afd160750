//! Human-friendly durations (`"250ms"`, `"5s"`) and sizes (`"64KiB"`) for the YAML file.

use serde::{de, Deserialize, Deserializer};
use std::fmt;
use std::time::Duration;

/// A duration written as `"250ms"`, `"5s"`, `"1m 30s"`. A bare number is rejected: units are mandatory so that
/// nobody has to guess whether `30` means seconds or milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const fn secs(s: u64) -> Self {
        HumanDuration(Duration::from_secs(s))
    }
    pub const fn millis(ms: u64) -> Self {
        HumanDuration(Duration::from_millis(ms))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

// The parsing errors are raised inside the visitors, not after deserialising a string: serde_norway then
// reports them at the value's own position and path, and the configuration reader can drop just that value.
impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration with a unit, like \"250ms\", \"5s\" or \"2m\"")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<HumanDuration, E> {
                humantime::parse_duration(text.trim()).map(HumanDuration).map_err(|e| {
                    E::custom(format!(
                        "invalid duration {text:?} ({e}); write it with a unit, like \"250ms\", \"5s\" or \"2m\""
                    ))
                })
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<HumanDuration, E> {
                self.visit_str(&n.to_string())
            }
        }
        d.deserialize_str(Visitor)
    }
}

/// A byte size written as `"64KiB"`, `"1MiB"`, `"512"` (bytes), or `"10kB"` (decimal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn kib(n: u64) -> Self {
        ByteSize(n * 1024)
    }
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0)
    }
}

/// Parses `"64KiB"` and friends. Hand-written: the grammar is ten lines and the crates for it bring opinions
/// (decimal vs binary defaults) that would surprise users.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(format!("invalid size {text:?}: expected a number with an optional unit, like \"64KiB\""));
    }
    let n: u64 = digits.parse().map_err(|_| format!("size {text:?} is too large"))?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" | "k" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {text:?}: use B, KiB, MiB, GiB (binary) or kB, MB, GB (decimal)"
            ))
        }
    };
    n.checked_mul(multiplier).ok_or_else(|| format!("size {text:?} is too large"))
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: bytes, or a number with a unit like \"64KiB\"")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(n))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<ByteSize, E> {
                parse_size(text).map(ByteSize).map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("1 MiB"), Ok(1 << 20));
        assert_eq!(parse_size("10kB"), Ok(10_000));
        assert!(parse_size("KiB").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("99999999999999999999GiB").is_err());
    }
}
