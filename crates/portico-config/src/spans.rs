//! Where each value of the YAML file sits, so that errors found after deserialising (an unknown cluster, a bad
//! address) still point at `file:line:col`. serde_norway reports positions only for its own errors, so the
//! document is walked once more with yaml-rust2's marked events and every node's position is recorded under a
//! dotted path such as `clusters.app.endpoints[1].address`.

use std::collections::HashMap;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub col: usize,
}

#[derive(Debug, Default, Clone)]
pub struct SpanIndex {
    positions: HashMap<String, Position>,
    /// Where each mapping key is written (an unknown key is reported there, not at its value).
    keys: HashMap<String, Position>,
    /// Lists some of whose items were left out of the configuration (see `read.rs`): by the list's path in the
    /// file, the file's indices of the items still there, so a path into the configuration still finds its
    /// place in the file.
    renumbered: HashMap<String, Vec<usize>>,
}

impl SpanIndex {
    pub fn build(source: &str) -> SpanIndex {
        let mut builder = Builder::default();
        let mut parser = Parser::new_from_str(source);
        // A syntax error is reported by serde_norway with its own position; the index is only a best effort.
        let _ = parser.load(&mut builder, false);
        SpanIndex { positions: builder.positions, keys: builder.keys, renumbered: HashMap::new() }
    }

    pub(crate) fn renumber(&mut self, renumbered: HashMap<String, Vec<usize>>) {
        self.renumbered = renumbered;
    }

    /// The path in the file of `path` in the configuration (they differ once list items were left out).
    fn in_file(&self, path: &str) -> String {
        if self.renumbered.is_empty() {
            return path.to_string();
        }
        let mut out = String::with_capacity(path.len());
        let mut rest = path;
        while let Some(open) = rest.find('[') {
            out += &rest[..open];
            let Some(close) = rest[open..].find(']').map(|c| open + c) else { break };
            let index = rest[open + 1..close].parse::<usize>().ok();
            let in_file = index.map(|i| self.renumbered.get(&out).and_then(|kept| kept.get(i)).copied().unwrap_or(i));
            match in_file {
                Some(i) => out += &format!("[{i}]"),
                None => out += &rest[open..=close],
            }
            rest = &rest[close + 1..];
        }
        out + rest
    }

    /// Whether the file writes `path` (a top-level section such as `mqtt`, a key, a list item).
    pub fn written(&self, path: &str) -> bool {
        let path = self.in_file(path);
        self.keys.contains_key(&path) || self.positions.contains_key(&path)
    }

    /// The position of the key that ends `path` (`listeners[0].adress`), else as `locate`.
    pub fn locate_key(&self, path: &str) -> Position {
        match self.keys.get(&self.in_file(path)) {
            Some(pos) => *pos,
            None => self.locate(path),
        }
    }

    /// The position of `path`, or of its closest recorded ancestor.
    pub fn locate(&self, path: &str) -> Position {
        let path = self.in_file(path);
        let mut p = path.as_str();
        loop {
            if let Some(pos) = self.positions.get(p) {
                return *pos;
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => return Position { line: 1, col: 1 },
            }
        }
    }
}

enum Frame {
    Map { path: String, pending_key: Option<String> },
    Seq { path: String, next: usize },
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    positions: HashMap<String, Position>,
    keys: HashMap<String, Position>,
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

impl Builder {
    /// The path of the node that starts now, or `None` when the event is a mapping key.
    fn next_value_path(&mut self, scalar: Option<&str>) -> Option<String> {
        match self.stack.last_mut() {
            None => Some(String::new()),
            Some(Frame::Seq { path, next }) => {
                let p = format!("{path}[{next}]");
                *next += 1;
                Some(p)
            }
            Some(Frame::Map { path, pending_key }) => match pending_key.take() {
                Some(key) => Some(join(path, &key)),
                None => {
                    *pending_key = Some(scalar.unwrap_or("?").to_string());
                    None
                }
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let pos = Position { line: mark.line(), col: mark.col() + 1 };
        match ev {
            Event::Scalar(ref value, ..) => {
                if let Some(path) = self.next_value_path(Some(value)) {
                    // A scalar's error is about the value itself: point at it rather than at its key.
                    self.positions.insert(path, pos);
                } else if let Some(Frame::Map { path, pending_key: Some(key) }) = self.stack.last() {
                    // Record the key's own position too: an error about a whole entry points at its name. A
                    // mapping without a key of its own (a list item, the root) is located at its first key,
                    // since yaml-rust2 marks a block mapping's start after that key.
                    let key_path = join(path, key);
                    self.positions.entry(path.clone()).or_insert(pos);
                    self.positions.entry(key_path.clone()).or_insert(pos);
                    self.keys.entry(key_path).or_insert(pos);
                }
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let path = self.next_value_path(None).unwrap_or_default();
                if matches!(ev, Event::MappingStart(..)) {
                    self.stack.push(Frame::Map { path, pending_key: None });
                } else {
                    self.positions.entry(path.clone()).or_insert(pos);
                    self.stack.push(Frame::Seq { path, next: 0 });
                }
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            Event::Alias(_) => {
                let _ = self.next_value_path(None);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_paths() {
        let src = "a: 1\nclusters:\n  app:\n    endpoints:\n      - address: x\n      - address: y\n";
        let idx = SpanIndex::build(src);
        assert_eq!(idx.locate("clusters.app.endpoints[1].address"), Position { line: 6, col: 18 });
        assert_eq!(idx.locate("clusters.app"), Position { line: 3, col: 3 });
        assert_eq!(idx.locate("clusters.app.endpoints[1].missing"), Position { line: 6, col: 9 });
        assert_eq!(idx.locate_key("clusters.app.endpoints[1].address"), Position { line: 6, col: 9 });
    }

    #[test]
    fn renumbered_lists_point_at_the_items_left() {
        let src = "routes:\n  - a: 1\n  - a: 2\n  - a: 3\n";
        let mut idx = SpanIndex::build(src);
        idx.renumber(HashMap::from([("routes".to_string(), vec![0, 2])]));
        assert_eq!(idx.locate("routes[1].a"), Position { line: 4, col: 8 });
        assert_eq!(idx.locate("routes[0].a"), Position { line: 2, col: 8 });
    }
}
