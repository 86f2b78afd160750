//! Reads the YAML into `Config`, reporting every key and value the schema refuses rather than only the first.
//! serde stops at its first error, so a file that does not read is read again, each time without what was
//! refused, until it reads:
//!
//! - an unknown key is dropped (nothing depended on it) and the rest of its item is checked as usual;
//! - a value of the wrong type is dropped too, and the item it belongs to (a listener, route, filter or cluster,
//!   or a top-level setting) is left out of the result once its other keys were read: the checks that follow
//!   (validate.rs, building the snapshot) see only items that read cleanly, so they report nothing that is only
//!   a consequence of a value they never saw. `LeftOut` tells them what is missing, so that a route naming a
//!   cluster left out is not also said to name an unknown one.
//!
//! Positions come from the `SpanIndex` of the original text (the text read again is the tree written back as
//! YAML, whose positions mean nothing to the user), through the path serde_norway puts in front of its messages.

use crate::schema::Config;
use crate::spans::SpanIndex;
use crate::Diagnostic;
use serde_norway::Value;
use std::collections::{BTreeSet, HashMap};

/// Top-level lists whose entries are items of their own.
const LISTS: [&str; 3] = ["listeners", "routes", "filters"];

/// A file with more problems than this is not worth reading further.
const MAX_PROBLEMS: usize = 500;

/// What was left out of the configuration because the schema refused some of its values.
#[derive(Debug, Clone, Default)]
pub struct LeftOut {
    /// Items by their path in the file: `listeners[2]`, `clusters.app`, `admin`, or a whole section.
    items: BTreeSet<String>,
}

impl LeftOut {
    /// A listener, or the whole `listeners:` section.
    pub fn any_listener(&self) -> bool {
        self.items.iter().any(|i| i == "listeners" || i.starts_with("listeners["))
    }

    pub fn cluster(&self, name: &str) -> bool {
        self.items.contains("clusters") || self.items.contains(&format!("clusters.{name}"))
    }

    /// A top-level setting such as `user`.
    pub fn setting(&self, key: &str) -> bool {
        self.items.contains(key)
    }
}

pub(crate) struct Reading {
    /// `None` when the file is not YAML, or not a mapping of settings.
    pub config: Option<Config>,
    pub problems: Vec<Diagnostic>,
    pub left_out: LeftOut,
    /// For the `SpanIndex`: the lists some of whose items were left out, with the file's indices of the others.
    pub renumbered: HashMap<String, Vec<usize>>,
}

pub(crate) fn read(source: &str, file: &str, spans: &SpanIndex) -> Reading {
    let mut reading =
        Reading { config: None, problems: Vec::new(), left_out: LeftOut::default(), renumbered: HashMap::new() };
    let first = match serde_norway::from_str::<Config>(source) {
        Ok(config) => {
            reading.config = Some(config);
            return reading;
        }
        Err(e) => e,
    };
    let root = match serde_norway::from_str::<Value>(source) {
        Ok(root @ Value::Mapping(_)) => root,
        // Not YAML, or not a mapping: nothing to go on but serde's own error.
        _ => {
            reading.problems.push(crate::serde_diagnostic(&first, file));
            return reading;
        }
    };
    let mut reader = Reader {
        root,
        spans,
        file,
        renumbered: HashMap::new(),
        refused: Vec::new(),
        left_out: BTreeSet::new(),
        problems: Vec::new(),
    };
    let mut readable = false;
    while reader.problems.len() < MAX_PROBLEMS {
        let Ok(text) = serde_norway::to_string(&reader.root) else { break };
        match serde_norway::from_str::<Config>(&text) {
            Ok(_) => {
                readable = true;
                break;
            }
            Err(e) if reader.take(&e) => {}
            Err(_) => break,
        }
    }
    if readable {
        reader.leave_out_items();
        reading.config = serde_norway::to_string(&reader.root).ok().and_then(|t| serde_norway::from_str(&t).ok());
    }
    if reader.problems.is_empty() {
        // Nothing could be located (this reader's bug, not the user's): serde's first error at least.
        reader.problems.push(crate::serde_diagnostic(&first, file));
    }
    reading.problems = reader.problems;
    reading.left_out = LeftOut { items: reader.left_out };
    reading.renumbered = reader.renumbered;
    reading
}

/// One step down the tree: a mapping's key or a list's index.
#[derive(Clone, Debug)]
enum Step {
    Key(Value),
    Index(usize),
}

struct Reader<'a> {
    /// The document, less what was refused so far.
    root: Value,
    spans: &'a SpanIndex,
    file: &'a str,
    /// By a list's path in the file, the file's indices of the items still in the tree.
    renumbered: HashMap<String, Vec<usize>>,
    /// Paths in the file of the values dropped for their type, to recognise what follows from dropping them.
    refused: Vec<String>,
    /// Paths in the file of the items to leave out.
    left_out: BTreeSet<String>,
    problems: Vec<Diagnostic>,
}

impl Reader<'_> {
    /// Reports `error` and drops what it is about; false when there is nothing that could be dropped.
    fn take(&mut self, error: &serde_norway::Error) -> bool {
        let message = crate::without_location(error.to_string());
        let (steps, detail) = self.locate(&message);
        let at = self.in_file(&steps);
        if let Some(key) = quoted_after(&detail, "unknown field `") {
            let key_at = join(&at, key);
            let pos = self.spans.locate_key(&key_at);
            self.report(pos, &at, &detail);
            // `adress` for `address`: the hint says so, and that `address` is then missing is no news.
            if let Some(meant) = crate::nearest_known(&detail) {
                self.refused.push(join(&at, meant));
            }
            return self.remove_key(&steps, key);
        }
        let consequence = match quoted_after(&detail, "missing field `") {
            Some(key) => self.refused.contains(&join(&at, key)),
            None => self.refused.iter().any(|r| r != &at && within(r, &at)),
        };
        if !consequence {
            let pos = self.spans.locate(&at);
            self.report(pos, &at, &detail);
        }
        let item = match steps.as_slice() {
            [Step::Key(k), Step::Index(_), ..] if LISTS.contains(&key_text(k).as_str()) => 2,
            [Step::Key(k), Step::Key(_), ..] if matches!(key_text(k).as_str(), "clusters" | "functions") => 2,
            [_, ..] => 1,
            [] => 0,
        };
        if item > 0 {
            self.left_out.insert(self.in_file(&steps[..item]));
            self.refused.push(at);
            return self.remove(&steps);
        }
        // The only error about the document itself that reading on can get past: the required list is missing
        // (or was dropped for its type). Go on with none, and let nothing complain that there are none.
        if quoted_after(&detail, "missing field `") == Some("listeners") {
            if let Value::Mapping(root) = &mut self.root {
                root.insert(Value::String("listeners".into()), Value::Sequence(Vec::new()));
                self.left_out.insert("listeners".into());
                return true;
            }
        }
        false
    }

    fn report(&mut self, pos: crate::Position, at: &str, detail: &str) {
        let message = if at.is_empty() { detail.to_string() } else { format!("{at}: {detail}") };
        let hint = Some(crate::hint_for(detail));
        self.problems.push(Diagnostic { file: self.file.to_string(), line: pos.line, col: pos.col, message, hint });
    }

    /// Splits serde_norway's `path: message` into the path's steps in the tree and the message. The path is
    /// matched against the tree, since keys may hold dots or `: ` themselves.
    fn locate(&self, message: &str) -> (Vec<Step>, String) {
        for (i, _) in message.match_indices(": ") {
            if let Some(steps) = resolve(&self.root, &message[..i]) {
                return (steps, message[i + 2..].to_string());
            }
        }
        (Vec::new(), message.to_string())
    }

    /// The path in the file of the node at `steps`.
    fn in_file(&self, steps: &[Step]) -> String {
        let mut path = String::new();
        for step in steps {
            match step {
                Step::Key(k) => path = join(&path, &key_text(k)),
                Step::Index(i) => {
                    let index = self.renumbered.get(&path).and_then(|kept| kept.get(*i)).copied().unwrap_or(*i);
                    path += &format!("[{index}]");
                }
            }
        }
        path
    }

    fn node_mut(&mut self, steps: &[Step]) -> Option<&mut Value> {
        let mut node = &mut self.root;
        for step in steps {
            node = untag_mut(node);
            node = match (step, node) {
                (Step::Key(k), Value::Mapping(map)) => map.get_mut(k)?,
                (Step::Index(i), Value::Sequence(seq)) => seq.get_mut(*i)?,
                _ => return None,
            };
        }
        Some(untag_mut(node))
    }

    /// Drops the node at `steps` from the tree; false when there is none (or it is the root).
    fn remove(&mut self, steps: &[Step]) -> bool {
        let Some((last, parent)) = steps.split_last() else { return false };
        let parent_in_file = self.in_file(parent);
        match (last, self.node_mut(parent)) {
            (Step::Key(k), Some(Value::Mapping(map))) => map.remove(k).is_some(),
            (Step::Index(i), Some(Value::Sequence(seq))) if *i < seq.len() => {
                let len = seq.len();
                seq.remove(*i);
                self.renumbered.entry(parent_in_file).or_insert_with(|| (0..len).collect()).remove(*i);
                true
            }
            _ => false,
        }
    }

    /// Drops the key written `key` from the mapping at `steps`.
    fn remove_key(&mut self, steps: &[Step], key: &str) -> bool {
        match self.node_mut(steps) {
            Some(Value::Mapping(map)) => {
                let found = map.keys().find(|k| key_text(k) == key).cloned();
                found.is_some_and(|k| map.remove(&k).is_some())
            }
            _ => false,
        }
    }

    /// Takes the items that had a value refused out of the tree, so the configuration holds only clean ones.
    fn leave_out_items(&mut self) {
        for list in LISTS {
            let key = Step::Key(Value::String(list.into()));
            let len = match self.node_mut(std::slice::from_ref(&key)) {
                Some(Value::Sequence(seq)) => seq.len(),
                _ => continue,
            };
            // From the end, so the indices still to look at do not move.
            for i in (0..len).rev() {
                let steps = [key.clone(), Step::Index(i)];
                if self.left_out.contains(&self.in_file(&steps)) {
                    self.remove(&steps);
                }
            }
        }
        let clusters = Step::Key(Value::String("clusters".into()));
        if let Some(Value::Mapping(map)) = self.node_mut(std::slice::from_ref(&clusters)) {
            let names: Vec<Value> = map.keys().cloned().collect();
            for name in names {
                if self.left_out.contains(&format!("clusters.{}", key_text(&name))) {
                    self.remove(&[clusters.clone(), Step::Key(name)]);
                }
            }
        }
        if let Value::Mapping(root) = &mut self.root {
            // `listeners` left out whole was replaced by an empty list already.
            root.retain(|k, _| key_text(k) == "listeners" || !self.left_out.contains(&key_text(k)));
        }
    }
}

/// The steps to the node `path` names (`listeners[0].tls`), as serde_norway writes paths.
fn resolve(node: &Value, path: &str) -> Option<Vec<Step>> {
    if path.is_empty() {
        return Some(Vec::new());
    }
    match untag(node) {
        Value::Sequence(seq) => {
            let rest = path.strip_prefix('[')?;
            let close = rest.find(']')?;
            let index: usize = rest[..close].parse().ok()?;
            let after = &rest[close + 1..];
            let mut steps = resolve(seq.get(index)?, after.strip_prefix('.').unwrap_or(after))?;
            steps.insert(0, Step::Index(index));
            Some(steps)
        }
        Value::Mapping(map) => {
            // The longest key first: `a.b` may be a key, or `b` in `a`.
            let mut keys: Vec<(&Value, String)> =
                map.keys().map(|k| (k, key_text(k))).filter(|(_, text)| path.starts_with(text.as_str())).collect();
            keys.sort_by_key(|(_, text)| std::cmp::Reverse(text.len()));
            keys.into_iter().find_map(|(key, text)| {
                let after = &path[text.len()..];
                let after = match after.strip_prefix('.') {
                    Some(rest) => rest,
                    None if after.is_empty() || after.starts_with('[') => after,
                    None => return None,
                };
                let mut steps = resolve(map.get(key)?, after)?;
                steps.insert(0, Step::Key(key.clone()));
                Some(steps)
            })
        }
        _ => None,
    }
}

fn untag(node: &Value) -> &Value {
    match node {
        Value::Tagged(tagged) => untag(&tagged.value),
        other => other,
    }
}

fn untag_mut(node: &mut Value) -> &mut Value {
    match node {
        Value::Tagged(tagged) => untag_mut(&mut tagged.value),
        other => other,
    }
}

/// A mapping key as paths write it.
fn key_text(key: &Value) -> String {
    match untag(key) {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".into(),
        _ => "?".into(),
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// `path` is `within` or below it.
fn within(path: &str, within: &str) -> bool {
    within.is_empty() || path.strip_prefix(within).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// The name between backquotes after `prefix` at the start of `message`: serde's "unknown field `x`, ...".
fn quoted_after<'m>(message: &'m str, prefix: &str) -> Option<&'m str> {
    let rest = message.strip_prefix(prefix)?;
    rest.find('`').map(|end| &rest[..end])
}

#[cfg(test)]
mod tests {
    use crate::load_str;

    /// Every problem as `line:col message`.
    fn problems(yaml: &str) -> Vec<String> {
        match load_str(yaml, "t.yaml") {
            Ok(_) => vec![],
            Err(e) => e.0.iter().map(|d| format!("{}:{} {}", d.line, d.col, d.message)).collect(),
        }
    }

    #[test]
    fn every_refused_key_and_value_is_reported_at_once() {
        let yaml = "\
workers: many
listeners:
  - name: web
    adress: 127.0.0.1:1
    address: 127.0.0.1:8080
    limits: { max_headers: lots, max_header: 3 }
  - name: other
    address: nowhere
routes:
  - { match: { path: /a, methods: [GET, [x]] }, cluster: gone }
  - { cluster: app, filters: [ { rewrite: 5 } ] }
  - { cluster: missing }
clusters:
  app:
    balancer: fastest
    timeouts: { connect: 5x }
    endpoints: [ { address: 127.0.0.1:1, weight: heavy } ]
";
        let p = problems(yaml);
        let expected = [
            "1:10 workers: workers must be `auto` or a number",
            "4:5 listeners[0]: unknown field `adress`",
            "6:28 listeners[0].limits.max_headers: invalid type",
            "6:34 listeners[0].limits: unknown field `max_header`",
            "8:14 invalid listener address \"nowhere\"",
            "10:41 routes[0].match.methods[1]: invalid type: sequence",
            "11:43 routes[1].filters[0].rewrite: invalid type: integer `5`",
            "12:16 route refers to unknown cluster \"missing\"",
            "15:15 clusters.app.balancer: unknown variant `fastest`",
            "16:26 clusters.app.timeouts.connect: invalid duration \"5x\"",
            "17:50 clusters.app.endpoints[0].weight: invalid type: string \"heavy\"",
        ];
        assert_eq!(p.len(), expected.len(), "{p:#?}");
        for (got, want) in p.iter().zip(expected) {
            assert!(got.starts_with(want), "{got:?} is not {want:?}:\n{p:#?}");
        }
    }

    #[test]
    fn what_follows_from_a_dropped_value_is_not_reported() {
        // The filter's only key is refused: that it then has no kind is not news.
        let p = problems("listeners: [ { name: web, address: 127.0.0.1:1 } ]\nfilters: [ { rewrite: 5 } ]\n");
        assert_eq!(p.len(), 1, "{p:#?}");
        // A listener's certificate pair without a key says so, and nothing about the listener's other keys.
        let p = problems(
            "listeners:\n  - name: web\n    address: 127.0.0.1:1\n    tls: { certificates: [ { cert: a } ] }\n",
        );
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].contains("missing field `key`"), "{p:#?}");
        // The only listener refused: no complaint that there are none.
        let p = problems("listeners: [ { name: web, address: 127.0.0.1:1, limits: { max_headers: x } } ]\n");
        assert_eq!(p.len(), 1, "{p:#?}");
        let p = problems("listeners: 5\n");
        assert_eq!(p.len(), 1, "{p:#?}");
        let p = problems("routes: []\n");
        assert!(p.len() == 1 && p[0].contains("missing field `listeners`"), "{p:#?}");
    }

    #[test]
    fn items_left_out_keep_the_positions_of_those_after_them() {
        let p = problems(
            "listeners:\n  - { name: a, address: 127.0.0.1:1, limits: { max_headers: x } }\n  - { name: b, address: bad }\n",
        );
        assert_eq!(p.len(), 2, "{p:#?}");
        assert!(p[1].starts_with("3:25 invalid listener address"), "{p:#?}");
    }

    #[test]
    fn text_that_is_not_a_mapping_is_one_problem() {
        assert_eq!(problems("listeners: [\n").len(), 1);
        assert_eq!(problems("").len(), 1);
        assert_eq!(problems("- a\n- b\n").len(), 1);
    }
}
