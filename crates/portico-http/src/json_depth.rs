//! How deeply a JSON text nests arrays and objects, found as its bytes stream past in pieces of any size,
//! holding nothing but the open brackets (at most the limit's worth). It tells strings apart (a `[` inside
//! `"..."`, or after an escaped quote, is text) and refuses a closing bracket that does not match the open
//! one; it is not a validator: anything else that is not JSON passes (the target parses the body anyway).
//!
//! Hand-written (serde_json parses whole documents, not pieces, and would build what it reads): fuzzed by
//! fuzz/fuzz_targets/json_depth.rs against serde_json.

/// Why a JSON text was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonFault {
    /// Arrays and objects nest deeper than the limit.
    TooDeep,
    /// A `]` or `}` closes nothing, or closes the other kind.
    Unbalanced,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lexical {
    /// Between values: brackets count.
    Outside,
    InString,
    /// Just after a backslash in a string.
    Escape,
}

#[derive(Debug, Clone)]
pub struct DepthScanner {
    max_depth: u32,
    /// The open brackets, innermost last: `true` for `[`.
    open: Vec<bool>,
    lexical: Lexical,
    /// Once refused, it stays refused.
    fault: Option<JsonFault>,
}

impl DepthScanner {
    pub fn new(max_depth: u32) -> DepthScanner {
        DepthScanner { max_depth, open: Vec::new(), lexical: Lexical::Outside, fault: None }
    }

    /// The deepest nesting a text may have: `max_depth` open brackets at once.
    pub fn max_depth(&self) -> u32 {
        self.max_depth
    }

    /// Reads the next piece of the text.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), JsonFault> {
        if let Some(fault) = self.fault {
            return Err(fault);
        }
        while !data.is_empty() {
            match self.lexical {
                Lexical::InString => match memchr::memchr2(b'"', b'\\', data) {
                    None => return Ok(()),
                    Some(at) => {
                        self.lexical = if data[at] == b'"' { Lexical::Outside } else { Lexical::Escape };
                        data = &data[at + 1..];
                    }
                },
                Lexical::Escape => {
                    // Whatever follows a backslash is part of the string (`\"` does not end it).
                    self.lexical = Lexical::InString;
                    data = &data[1..];
                }
                Lexical::Outside => {
                    let Some(at) = data.iter().position(|b| matches!(b, b'"' | b'[' | b'{' | b']' | b'}')) else {
                        return Ok(());
                    };
                    match data[at] {
                        b'"' => self.lexical = Lexical::InString,
                        open @ (b'[' | b'{') => {
                            if self.open.len() as u32 >= self.max_depth {
                                return Err(*self.fault.insert(JsonFault::TooDeep));
                            }
                            self.open.push(open == b'[');
                        }
                        close => {
                            if self.open.pop() != Some(close == b']') {
                                return Err(*self.fault.insert(JsonFault::Unbalanced));
                            }
                        }
                    }
                    data = &data[at + 1..];
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str, max: u32) -> Result<(), JsonFault> {
        let mut s = DepthScanner::new(max);
        s.feed(text.as_bytes())
    }

    #[test]
    fn depth_counts_open_brackets() {
        assert_eq!(scan(r#"{"a": [1, {"b": []}]}"#, 4), Ok(()));
        assert_eq!(scan(r#"{"a": [1, {"b": []}]}"#, 3), Err(JsonFault::TooDeep));
        assert_eq!(scan("[[[]]] [[[]]]", 3), Ok(()), "siblings do not add up");
        assert_eq!(scan("42", 1), Ok(()));
        assert_eq!(scan("[]", 1), Ok(()));
        assert_eq!(scan(&"[".repeat(100_000), 64), Err(JsonFault::TooDeep));
    }

    #[test]
    fn strings_hide_brackets() {
        assert_eq!(scan(r#"["[[[[", "}}}", "a\"[[[", "\\", "[["]"#, 1), Ok(()));
        assert_eq!(scan(r#"{"k\\": [[]]}"#, 2), Err(JsonFault::TooDeep), "an escaped backslash ends no string");
        assert_eq!(scan(r#"{"\u005b": 1}"#, 1), Ok(()));
    }

    #[test]
    fn closing_brackets_must_match() {
        assert_eq!(scan("]", 8), Err(JsonFault::Unbalanced));
        assert_eq!(scan("[}", 8), Err(JsonFault::Unbalanced));
        assert_eq!(scan("{]", 8), Err(JsonFault::Unbalanced));
        assert_eq!(scan("[[]]]", 8), Err(JsonFault::Unbalanced));
    }

    /// A random JSON value nesting at most `depth` deep, with strings that hold brackets, quotes and escapes.
    fn random_json(rng: &mut fastrand::Rng, depth: u32) -> serde_json::Value {
        use serde_json::Value;
        let strings = ["[", "]}", "\\", "\"[", "{\"a\": [", "plain", "é\u{5b}"];
        match (depth, rng.u8(0..6)) {
            (0, _) | (_, 0) => Value::String(strings[rng.usize(0..strings.len())].to_string()),
            (_, 1) => Value::from(rng.i64(-1000..1000)),
            (_, 2 | 3) => Value::Array((0..rng.usize(0..4)).map(|_| random_json(rng, depth - 1)).collect()),
            _ => Value::Object(
                (0..rng.usize(0..4))
                    .map(|i| (format!("k{i}{}", strings[i % 7]), random_json(rng, depth - 1)))
                    .collect(),
            ),
        }
    }

    fn depth_of(v: &serde_json::Value) -> u32 {
        match v {
            serde_json::Value::Array(a) => 1 + a.iter().map(depth_of).max().unwrap_or(0),
            serde_json::Value::Object(o) => 1 + o.values().map(depth_of).max().unwrap_or(0),
            _ => 0,
        }
    }

    #[test]
    fn agrees_with_serde_json_on_random_documents() {
        let mut rng = fastrand::Rng::with_seed(17);
        for _ in 0..2000 {
            let depth = rng.u32(0..12);
            let value = random_json(&mut rng, depth);
            let text = serde_json::to_vec_pretty(&value).unwrap();
            let d = depth_of(&value);
            let step = rng.usize(1..9);
            let run = |max: u32| {
                let mut s = DepthScanner::new(max);
                text.chunks(step).try_for_each(|c| s.feed(c))
            };
            assert_eq!(run(d.max(1)), Ok(()), "refused at its own depth {d}: {}", String::from_utf8_lossy(&text));
            if d > 1 {
                assert_eq!(run(d - 1), Err(JsonFault::TooDeep), "accepted below its depth {d}");
            }
        }
    }

    #[test]
    fn pieces_of_any_size_give_the_same_answer() {
        let texts = [
            r#"{"a": "x\"[", "b": [[{"c": "\\"}]], "d": "\u005d"}"#,
            r#"[[["deep", {"k": [1, 2, [3]]}]]]"#,
            r#"["]", "\\\"", {"}": "{"}]"#,
        ];
        for text in texts {
            for max in 1..8 {
                let whole = scan(text, max);
                for size in 1..6 {
                    let mut s = DepthScanner::new(max);
                    let pieces = text.as_bytes().chunks(size).map(|c| s.feed(c)).find(|r| r.is_err());
                    assert_eq!(pieces.unwrap_or(Ok(())), whole, "{text} max {max} size {size}");
                }
            }
        }
    }
}
