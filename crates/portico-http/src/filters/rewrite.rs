//! `rewrite`: the path sent upstream. The query is kept; the path Portico routed on is what the
//! rewrite starts from (normalised), and the result is what the upstream and later filters see.

use super::filter::{Filter, RequestCx, Step};
use crate::codec::RequestHead;
use crate::pattern::PathTemplate;
use portico_config::RewriteFilter;

#[derive(Debug)]
enum How {
    /// A template with the route's parameters.
    Path(PathTemplate),
    /// Remove this prefix (no trailing slash) when the path starts with it on a segment boundary.
    StripPrefix(Vec<u8>),
    /// Replace the route's `path_prefix` with this (no trailing slash, or "/").
    ReplacePrefix(Vec<u8>),
    Regex(regex::bytes::Regex, String),
}

#[derive(Debug)]
pub struct Rewrite(How);

/// `/api/` and `/api` mean the same prefix.
pub(crate) fn trim_prefix(p: &str) -> &[u8] {
    let t = p.trim_end_matches('/');
    if t.is_empty() {
        b"/"
    } else {
        t.as_bytes()
    }
}

/// The rest of `path` after `prefix` when the prefix ends on a segment boundary.
pub(crate) fn after_prefix<'a>(path: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    if prefix == b"/" {
        return Some(path);
    }
    let rest = path.strip_prefix(prefix)?;
    (rest.is_empty() || rest[0] == b'/').then_some(rest)
}

impl Rewrite {
    /// Errors are (key below the filter, message).
    pub fn new(config: &RewriteFilter, names: &[String]) -> Result<Rewrite, (String, String)> {
        if let Some(template) = &config.path {
            let t = PathTemplate::parse(template, names).map_err(|e| ("rewrite.path".to_string(), e.0))?;
            return Ok(Rewrite(How::Path(t)));
        }
        if let Some(prefix) = &config.strip_prefix {
            return Ok(Rewrite(How::StripPrefix(trim_prefix(prefix).to_vec())));
        }
        if let Some(prefix) = &config.replace_prefix {
            return Ok(Rewrite(How::ReplacePrefix(trim_prefix(prefix).to_vec())));
        }
        let (Some(regex), Some(replacement)) = (&config.regex, &config.replacement) else {
            return Err((
                "rewrite".into(),
                "a rewrite needs `path`, `strip_prefix`, `replace_prefix` or `regex`".into(),
            ));
        };
        let compiled = regex::bytes::Regex::new(regex)
            .map_err(|e| ("rewrite.regex".to_string(), format!("invalid regex: {e}")))?;
        Ok(Rewrite(How::Regex(compiled, replacement.clone())))
    }

    /// Writes the new path for `path` into `out` (empty); false to leave the path as it is.
    fn rewrite(&self, path: &[u8], cx: &RequestCx<'_>, out: &mut Vec<u8>) -> bool {
        match &self.0 {
            How::Path(t) => t.render(cx.matched_path, cx.captures, out),
            How::StripPrefix(prefix) => {
                let Some(rest) = after_prefix(path, prefix).filter(|_| prefix != b"/") else { return false };
                out.extend_from_slice(if rest.is_empty() { b"/" } else { rest });
            }
            How::ReplacePrefix(new) => {
                // `rest` is empty or starts with '/'.
                let Some(rest) = cx.prefix.and_then(|p| after_prefix(path, p)) else { return false };
                let rest = if cx.prefix == Some(b"/") { path } else { rest };
                if new != b"/" {
                    out.extend_from_slice(new);
                }
                out.extend_from_slice(rest);
            }
            How::Regex(re, replacement) => out.extend_from_slice(&re.replace(path, replacement.as_bytes())),
        }
        if out.first() != Some(&b'/') {
            out.insert(0, b'/');
        }
        true
    }
}

impl Filter for Rewrite {
    fn on_request(&self, head: &mut RequestHead, cx: &RequestCx<'_>) -> Step {
        head.set_path_with(|path, out| self.rewrite(path, cx, out));
        Step::Continue
    }
}
