//! The reload history for the dashboard and `GET /admin/reloads`: the last `KEPT` attempts from any trigger,
//! each with its time, trigger and result, the changes it made (listeners, routes, clusters, endpoints) and the
//! difference between the two configuration texts (secrets masked), or why it was refused.

use std::collections::VecDeque;

/// Attempts kept.
pub const KEPT: usize = 50;
/// A diff longer than this is cut (a whole new file is not worth shipping to every page).
const MAX_DIFF: usize = 64 * 1024;

/// One reload attempt, as the reloader reports it.
#[derive(Debug, Clone, Default)]
pub struct Attempt {
    /// `SIGHUP`, `admin API`, `file change`, ...
    pub trigger: String,
    /// The configuration text before and after (before masking); `after` is the file that was tried.
    pub before: Option<String>,
    pub after: Option<String>,
    /// What the reload changed, one line each (`+ cluster web`, `~ route rest: settings changed`).
    pub changes: Vec<String>,
    /// Why it was refused (`FILE:LINE:COL: ...` lines); `None` when it was applied.
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Record {
    pub id: u64,
    pub at_ms: u64,
    pub trigger: String,
    pub ok: bool,
    pub error: Option<String>,
    pub changes: Vec<String>,
    /// A unified diff of the running configuration's text, secrets masked; empty when the text did not change.
    pub diff: String,
}

#[derive(Debug, Default)]
pub struct History {
    next_id: u64,
    records: VecDeque<Record>,
}

impl History {
    pub fn add(&mut self, at_ms: u64, attempt: Attempt) {
        let diff = match (&attempt.before, &attempt.after) {
            (Some(before), Some(after)) => diff(before, after),
            _ => String::new(),
        };
        self.next_id += 1;
        if self.records.len() == KEPT {
            self.records.pop_front();
        }
        self.records.push_back(Record {
            id: self.next_id,
            at_ms,
            trigger: attempt.trigger,
            ok: attempt.error.is_none(),
            error: attempt.error,
            changes: attempt.changes,
            diff,
        });
    }

    /// The id of the last attempt (0 before the first): a page fetches the history again when it changes.
    pub fn last_id(&self) -> u64 {
        self.next_id
    }

    pub fn to_json(&self) -> serde_json::Value {
        let list: Vec<serde_json::Value> = self
            .records
            .iter()
            .rev()
            .map(|r| {
                serde_json::json!({
                    "id": r.id,
                    "at_ms": r.at_ms,
                    "trigger": r.trigger,
                    "ok": r.ok,
                    "error": r.error,
                    "changes": r.changes,
                    "diff": r.diff,
                })
            })
            .collect();
        serde_json::json!({ "reloads": list })
    }
}

/// A unified diff of two configuration texts, secrets masked in both.
pub fn diff(before: &str, after: &str) -> String {
    // Masking works line by line and drops a final newline: put it back, so a diff does not report it.
    let masked = |text: &str| {
        let mut m = crate::mask_secrets(text);
        if text.ends_with('\n') {
            m.push('\n');
        }
        m
    };
    let (before, after) = (masked(before), masked(after));
    if before == after {
        return String::new();
    }
    let mut text = similar::TextDiff::from_lines(&before, &after)
        .unified_diff()
        .context_radius(2)
        .header("running", "reloaded")
        .to_string();
    if text.len() > MAX_DIFF {
        let mut cut = MAX_DIFF;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("\n... (cut)\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_mask_secrets_and_history_is_bounded() {
        let d = diff("a: 1\ntoken: hunter2\n", "a: 2\ntoken: swordfish\n");
        assert!(d.contains("-a: 1\n+a: 2\n"), "{d}");
        assert!(!d.contains("hunter2") && !d.contains("swordfish") && !d.contains("No newline"), "{d}");
        let mut h = History::default();
        for i in 0..(KEPT + 5) {
            h.add(i as u64, Attempt { trigger: "SIGHUP".into(), ..Attempt::default() });
        }
        let json = h.to_json();
        assert_eq!(json["reloads"].as_array().map(Vec::len), Some(KEPT));
        assert_eq!(json["reloads"][0]["id"], (KEPT + 5) as u64);
        assert_eq!(h.last_id(), (KEPT + 5) as u64);
    }
}
