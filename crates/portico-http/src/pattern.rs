//! Route path patterns (`/users/:id`, `/files/*rest`, `/exact/path`) and the rewrite templates that reuse
//! their parameters (`/v2/users/:id`, `/static/*rest`).
//!
//! A pattern is matched against the already-normalised path (see [`crate::path`]), segment by segment and byte
//! for byte (case-sensitive):
//! - a literal segment matches only itself; the trailing slash matters (`/users/:id` does not match
//!   `/users/1/`, `/users/` does not match `/users`);
//! - `:name` matches one non-empty segment (never a `/`);
//! - `*name`, only as the last segment, matches the rest of the path after its slash, possibly empty:
//!   `/files/*rest` matches `/files/` and `/files/a/b` (rest `a/b`), and also `/files` itself, with rest empty.
//!
//! `:` and `*` are special only at the start of a segment: `/v1/projects:list` is a literal. Parameter names
//! are ASCII letters, digits and `_`.

use memchr::memchr;
use std::fmt;

/// An invalid pattern or template, with a message for config validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError(pub String);

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PatternError {}

fn error(message: impl Into<String>) -> PatternError {
    PatternError(message.into())
}

/// Captured values as byte ranges into the matched path, `(start, end)`, in the order of the pattern's
/// parameter names.
pub type Captures = Vec<(u32, u32)>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(Box<[u8]>),
    /// `:name`; the names are in [`PathPattern::names`], in the order of the segments.
    Param,
}

/// `/users/:id`, `/files/*rest`, `/exact/path`. Parameters match one non-empty segment; a trailing `*name`
/// matches the rest of the path (possibly empty, without its leading slash). `*` only as the last segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    segments: Vec<Segment>,
    /// The pattern ends with `*name` (the last of `names`).
    rest: bool,
    names: Vec<String>,
    literal_len: usize,
}

/// `:name` or `*name` at the start of a segment: the sigil and the name.
fn parameter(segment: &str) -> Option<(char, &str)> {
    let sigil = segment.chars().next().filter(|c| matches!(c, ':' | '*'))?;
    Some((sigil, &segment[1..]))
}

fn check_name(sigil: char, name: &str) -> Result<(), PatternError> {
    if name.is_empty() {
        return Err(error(format!("parameter name missing after `{sigil}`")));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(error(format!("parameter name `{name}` may only hold ASCII letters, digits and `_`")));
    }
    Ok(())
}

fn check_literal(segment: &str) -> Result<(), PatternError> {
    if segment == "." || segment == ".." {
        return Err(error(format!("a `{segment}` segment never matches a normalised path")));
    }
    Ok(())
}

impl PathPattern {
    /// Parses a pattern, which must start with `/`.
    pub fn parse(pattern: &str) -> Result<PathPattern, PatternError> {
        let Some(body) = pattern.strip_prefix('/') else {
            return Err(error(format!("the path pattern `{pattern}` must start with `/`")));
        };
        let mut segments = Vec::new();
        let mut names: Vec<String> = Vec::new();
        let mut rest = false;
        let mut literal_len = pattern.len();
        let mut parts = body.split('/').peekable();
        while let Some(part) = parts.next() {
            let Some((sigil, name)) = parameter(part) else {
                check_literal(part)?;
                segments.push(Segment::Literal(part.as_bytes().into()));
                continue;
            };
            check_name(sigil, name)?;
            if names.iter().any(|n| n == name) {
                return Err(error(format!("parameter `{name}` appears twice")));
            }
            if sigil == '*' {
                if parts.peek().is_some() {
                    return Err(error(format!("`*{name}` must be the last segment")));
                }
                rest = true;
            } else {
                segments.push(Segment::Param);
            }
            names.push(name.to_owned());
            literal_len -= part.len();
        }
        Ok(PathPattern { segments, rest, names, literal_len })
    }

    /// The parameter names, in order (`id`, `rest`).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// False for a plain exact path.
    pub fn has_params(&self) -> bool {
        !self.names.is_empty()
    }

    /// Bytes of literal text (slashes included, parameters not), for ranking: more literal is more specific.
    pub fn literal_len(&self) -> usize {
        self.literal_len
    }

    /// Whether `path` matches. `captures` is cleared first, then holds one `(start, end)` byte range into `path`
    /// per name of [`names`](Self::names), in that order (empty again when there is no match). No allocation
    /// when `captures` has the capacity. A path longer than `u32::MAX` bytes never matches.
    pub fn matches(&self, path: &[u8], captures: &mut Vec<(u32, u32)>) -> bool {
        captures.clear();
        if self.matches_into(path, captures) {
            return true;
        }
        captures.clear();
        false
    }

    fn matches_into(&self, path: &[u8], captures: &mut Vec<(u32, u32)>) -> bool {
        if u32::try_from(path.len()).is_err() {
            return false;
        }
        // Offsets fit in u32 from here on.
        let mut pos = 0;
        for segment in &self.segments {
            if path.get(pos) != Some(&b'/') {
                return false;
            }
            let start = pos + 1;
            let end = memchr(b'/', &path[start..]).map_or(path.len(), |i| start + i);
            match segment {
                Segment::Literal(literal) if path[start..end] == **literal => {}
                Segment::Param if end > start => captures.push((start as u32, end as u32)),
                _ => return false,
            }
            pos = end;
        }
        if !self.rest {
            return pos == path.len();
        }
        let rest_start = match path.get(pos) {
            None => pos,
            Some(b'/') => pos + 1,
            Some(_) => return false,
        };
        captures.push((rest_start as u32, path.len() as u32));
        true
    }
}

#[derive(Debug, Clone)]
enum Part {
    Literal(Box<[u8]>),
    /// An index into the pattern's names and the captures.
    Capture(usize),
}

/// A template such as `/v2/users/:id` or `/static/*rest` (rewrite form): `:name` / `*name` are replaced by
/// captured values. Parse-time validation against a pattern's names.
///
/// As in patterns, `:name` and `*name` are whole segments, and the two sigils mean the same here: the captured
/// value, which for a `*rest` may hold slashes or be empty (`/static/*rest` renders `/static/` then).
#[derive(Debug, Clone)]
pub struct PathTemplate {
    parts: Vec<Part>,
}

impl PathTemplate {
    /// `names`: the parameters the route's pattern defines; an unknown name is an error ("`:user` is not a
    /// parameter of the route's path"). The template must start with `/`.
    pub fn parse(template: &str, names: &[String]) -> Result<PathTemplate, PatternError> {
        let Some(body) = template.strip_prefix('/') else {
            return Err(error(format!("the path template `{template}` must start with `/`")));
        };
        let mut parts = Vec::new();
        let mut literal = Vec::new();
        for segment in body.split('/') {
            literal.push(b'/');
            let Some((sigil, name)) = parameter(segment) else {
                if segment == "." || segment == ".." {
                    return Err(error(format!("a `{segment}` segment in a rewritten path is refused")));
                }
                literal.extend_from_slice(segment.as_bytes());
                continue;
            };
            if name.is_empty() {
                return Err(error(format!("parameter name missing after `{sigil}`")));
            }
            let Some(index) = names.iter().position(|n| n == name) else {
                return Err(error(format!("`{segment}` is not a parameter of the route's path")));
            };
            parts.push(Part::Literal(std::mem::take(&mut literal).into()));
            parts.push(Part::Capture(index));
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal.into()));
        }
        Ok(PathTemplate { parts })
    }

    /// Appends the rendered path to `out`; `captures` index like `names`, values taken from `path`. A capture
    /// missing or out of `path`'s bounds (not from a match of this path) renders as nothing.
    pub fn render(&self, path: &[u8], captures: &[(u32, u32)], out: &mut Vec<u8>) {
        for part in &self.parts {
            match part {
                Part::Literal(literal) => out.extend_from_slice(literal),
                Part::Capture(index) => {
                    let value = captures.get(*index).and_then(|&(start, end)| path.get(start as usize..end as usize));
                    out.extend_from_slice(value.unwrap_or_default());
                }
            }
        }
    }
}

/// The route's path parameters captured from a request, as ranges into `path`.
#[derive(Debug, Default)]
pub struct Captured {
    pub path: Vec<u8>,
    pub ranges: Vec<(u32, u32)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(p: &str) -> PathPattern {
        PathPattern::parse(p).unwrap()
    }

    fn parse_error(p: &str) -> String {
        PathPattern::parse(p).unwrap_err().0
    }

    /// The captured values as strings, or None when `path` does not match.
    fn captured(p: &PathPattern, path: &str) -> Option<Vec<String>> {
        let mut captures = Vec::new();
        if !p.matches(path.as_bytes(), &mut captures) {
            assert!(captures.is_empty());
            return None;
        }
        assert_eq!(captures.len(), p.names().len());
        Some(captures.iter().map(|&(s, e)| path[s as usize..e as usize].to_owned()).collect())
    }

    fn render(p: &PathPattern, template: &str, path: &str) -> String {
        let t = PathTemplate::parse(template, p.names()).unwrap();
        let mut captures = Vec::new();
        assert!(p.matches(path.as_bytes(), &mut captures), "{path}");
        let mut out = b"prefix:".to_vec();
        t.render(path.as_bytes(), &captures, &mut out);
        String::from_utf8(out).unwrap().strip_prefix("prefix:").unwrap().to_owned()
    }

    #[test]
    fn parse_and_describe() {
        let p = pattern("/users/:id");
        assert_eq!(p.names(), ["id"]);
        assert!(p.has_params());
        assert_eq!(p.literal_len(), "/users/".len());
        let p = pattern("/files/*rest");
        assert_eq!(p.names(), ["rest"]);
        assert!(p.has_params());
        assert_eq!(p.literal_len(), "/files/".len());
        let p = pattern("/exact/path");
        assert!(p.names().is_empty());
        assert!(!p.has_params());
        assert_eq!(p.literal_len(), "/exact/path".len());
        let p = pattern("/a/:b/c/:d_2/*Rest9");
        assert_eq!(p.names(), ["b", "d_2", "Rest9"]);
        assert_eq!(p.literal_len(), "/a//c//".len());
        assert!(pattern("/users/:id/posts").literal_len() > pattern("/users/:id").literal_len());
        // `:` and `*` inside a segment are literal.
        let p = pattern("/v1/projects:list/a*b");
        assert!(!p.has_params());
        assert_eq!(captured(&p, "/v1/projects:list/a*b"), Some(vec![]));
    }

    #[test]
    fn parse_errors() {
        assert_eq!(parse_error("/files/*rest/more"), "`*rest` must be the last segment");
        assert_eq!(parse_error("/files/*rest/"), "`*rest` must be the last segment");
        assert_eq!(parse_error("/users/:"), "parameter name missing after `:`");
        assert_eq!(parse_error("/users/:/x"), "parameter name missing after `:`");
        assert_eq!(parse_error("/files/*"), "parameter name missing after `*`");
        assert_eq!(parse_error("/a/:id/b/:id"), "parameter `id` appears twice");
        assert_eq!(parse_error("/a/:id/*id"), "parameter `id` appears twice");
        assert_eq!(parse_error("/a/:user-id"), "parameter name `user-id` may only hold ASCII letters, digits and `_`");
        assert_eq!(parse_error("users/:id"), "the path pattern `users/:id` must start with `/`");
        assert_eq!(parse_error(""), "the path pattern `` must start with `/`");
        assert_eq!(parse_error("/a/../b"), "a `..` segment never matches a normalised path");
        assert_eq!(parse_error("/a/."), "a `.` segment never matches a normalised path");
    }

    #[test]
    fn literal_segments_match_exactly() {
        let p = pattern("/exact/path");
        assert_eq!(captured(&p, "/exact/path"), Some(vec![]));
        for other in ["/exact/path/", "/exact/pat", "/exact/paths", "/Exact/path", "/exact", "/exact/path/x", "", "*"] {
            assert_eq!(captured(&p, other), None, "{other}");
        }
        let p = pattern("/");
        assert_eq!(captured(&p, "/"), Some(vec![]));
        assert_eq!(captured(&p, "/a"), None);
        assert_eq!(captured(&p, ""), None);
        let p = pattern("/users/");
        assert_eq!(captured(&p, "/users/"), Some(vec![]));
        assert_eq!(captured(&p, "/users"), None);
        // Byte for byte: an encoding is not its decoded form.
        assert_eq!(captured(&pattern("/a%20b"), "/a%20b"), Some(vec![]));
        assert_eq!(captured(&pattern("/a%20b"), "/a b"), None);
    }

    #[test]
    fn parameters_match_one_non_empty_segment() {
        let p = pattern("/users/:id");
        assert_eq!(captured(&p, "/users/1"), Some(vec!["1".into()]));
        assert_eq!(captured(&p, "/users/a%2Fb"), Some(vec!["a%2Fb".into()]));
        assert_eq!(captured(&p, "/users/1/"), None);
        assert_eq!(captured(&p, "/users/"), None);
        assert_eq!(captured(&p, "/users"), None);
        assert_eq!(captured(&p, "/users/1/2"), None);
        assert_eq!(captured(&p, "/Users/1"), None);
        let p = pattern("/users/:id/posts/:post");
        assert_eq!(captured(&p, "/users/42/posts/7"), Some(vec!["42".into(), "7".into()]));
        assert_eq!(captured(&p, "/users/42/posts/"), None);
        assert_eq!(captured(&p, "/users//posts/7"), None);
        let p = pattern("/:a/:b/");
        assert_eq!(captured(&p, "/x/y/"), Some(vec!["x".into(), "y".into()]));
        assert_eq!(captured(&p, "/x/y"), None);
    }

    #[test]
    fn rest_matches_the_remainder() {
        let p = pattern("/files/*rest");
        assert_eq!(captured(&p, "/files/"), Some(vec!["".into()]));
        assert_eq!(captured(&p, "/files/a"), Some(vec!["a".into()]));
        assert_eq!(captured(&p, "/files/a/b"), Some(vec!["a/b".into()]));
        assert_eq!(captured(&p, "/files/a/b/"), Some(vec!["a/b/".into()]));
        assert_eq!(captured(&p, "/files"), Some(vec!["".into()]));
        assert_eq!(captured(&p, "/filesx"), None);
        assert_eq!(captured(&p, "/file"), None);
        assert_eq!(captured(&p, "/other/a"), None);
        let p = pattern("/*all");
        assert_eq!(captured(&p, "/"), Some(vec!["".into()]));
        assert_eq!(captured(&p, "/a/b"), Some(vec!["a/b".into()]));
        assert_eq!(captured(&p, "*"), None);
        let p = pattern("/u/:id/*rest");
        assert_eq!(captured(&p, "/u/7/x/y"), Some(vec!["7".into(), "x/y".into()]));
        assert_eq!(captured(&p, "/u/7"), Some(vec!["7".into(), "".into()]));
        assert_eq!(captured(&p, "/u/"), None);
        // The offsets point at the path.
        let mut captures = Vec::new();
        assert!(p.matches(b"/u/7/x/y", &mut captures));
        assert_eq!(captures, [(3, 4), (5, 8)]);
        assert!(p.matches(b"/u/7", &mut captures));
        assert_eq!(captures, [(3, 4), (4, 4)]);
    }

    #[test]
    fn matching_does_not_allocate_with_capacity() {
        let p = pattern("/a/:b/:c/*d");
        let mut captures = Vec::with_capacity(3);
        captures.push((9, 9));
        let buffer = captures.as_ptr();
        assert!(p.matches(b"/a/1/2/3/4", &mut captures));
        assert_eq!(captures, [(3, 4), (5, 6), (7, 10)]);
        assert!(!p.matches(b"/a/1", &mut captures));
        assert!(captures.is_empty());
        assert!(p.matches(b"/a/x/y", &mut captures));
        assert_eq!(captures.as_ptr(), buffer);
        assert_eq!(captures.capacity(), 3);
    }

    #[test]
    fn templates_render_captures() {
        let p = pattern("/users/:id");
        assert_eq!(render(&p, "/v2/users/:id", "/users/42"), "/v2/users/42");
        assert_eq!(render(&p, "/v2/users/*id", "/users/42"), "/v2/users/42");
        assert_eq!(render(&p, "/:id/:id/x", "/users/42"), "/42/42/x");
        assert_eq!(render(&p, "/fixed", "/users/42"), "/fixed");
        assert_eq!(render(&p, "/", "/users/42"), "/");
        let p = pattern("/static/*rest");
        assert_eq!(render(&p, "/assets/*rest", "/static/css/site.css"), "/assets/css/site.css");
        assert_eq!(render(&p, "/assets/*rest", "/static/"), "/assets/");
        assert_eq!(render(&p, "/assets/*rest", "/static"), "/assets/");
        assert_eq!(render(&p, "/*rest", "/static/a/b"), "/a/b");
        let p = pattern("/u/:user/f/*path");
        assert_eq!(render(&p, "/files/*path/owner/:user", "/u/ann/f/a/b"), "/files/a/b/owner/ann");
        // Literal `:` inside a segment stays.
        assert_eq!(render(&p, "/x:user/:user", "/u/ann/f/"), "/x:user/ann");
    }

    #[test]
    fn template_errors() {
        let names = pattern("/users/:id").names().to_vec();
        let parse = |t: &str| PathTemplate::parse(t, &names).map(|_| ()).map_err(|e| e.0);
        assert_eq!(parse("/v2/:user"), Err("`:user` is not a parameter of the route's path".to_owned()));
        assert_eq!(parse("/v2/*rest"), Err("`*rest` is not a parameter of the route's path".to_owned()));
        assert_eq!(parse("/v2/:"), Err("parameter name missing after `:`".to_owned()));
        assert_eq!(parse("v2/:id"), Err("the path template `v2/:id` must start with `/`".to_owned()));
        assert_eq!(parse("/v2/../:id"), Err("a `..` segment in a rewritten path is refused".to_owned()));
        assert_eq!(parse("/v2/:id"), Ok(()));
        assert!(PathTemplate::parse("/:id", &[]).is_err());
    }

    #[test]
    fn render_tolerates_foreign_captures() {
        let t = PathTemplate::parse("/a/:x/b", &["x".to_owned()]).unwrap();
        let mut out = Vec::new();
        t.render(b"/p", &[], &mut out);
        assert_eq!(out, b"/a//b");
        out.clear();
        t.render(b"/p", &[(1, 99)], &mut out);
        assert_eq!(out, b"/a//b");
    }
}
