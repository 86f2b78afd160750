//! `query`: set, add and remove query parameters of the request sent to the target. Within one filter:
//! `remove`, then `set`, then `add` (as `headers` does). Parameters are matched by their decoded names
//! (`a%62=1` is `ab`, `+` a space); a parameter the filter does not touch keeps its bytes exactly as the client
//! wrote them, and so does the order of the ones left. Values written by the filter are percent-encoded as a
//! form encodes them (`application/x-www-form-urlencoded`: a space is `+`).

use super::filter::{Filter, RequestCx, Step};
use crate::codec::RequestHead;
use portico_config::QueryFilter;

#[derive(Debug)]
pub struct Query {
    remove: Vec<String>,
    /// (name, the encoded `name=value`).
    set: Vec<(String, String)>,
    add: Vec<String>,
}

fn pair(name: &str, value: &str) -> String {
    form_urlencoded::Serializer::new(String::new()).append_pair(name, value).finish()
}

/// The decoded name of one `name=value` piece of a query.
fn name_of(piece: &[u8]) -> std::borrow::Cow<'_, str> {
    let raw = piece.split(|&b| b == b'=').next().unwrap_or_default();
    form_urlencoded::parse(raw).next().map_or(std::borrow::Cow::Borrowed(""), |(n, _)| n)
}

impl Query {
    pub fn new(c: &QueryFilter) -> Query {
        Query {
            remove: c.remove.clone(),
            set: c.set.iter().map(|(n, v)| (n.clone(), pair(n, v))).collect(),
            add: c.add.iter().map(|(n, v)| pair(n, v)).collect(),
        }
    }

    /// The new query (without `?`), or `None` when it is left as it was.
    fn edit(&self, query: Option<&[u8]>) -> Option<Vec<u8>> {
        let mut pieces: Vec<std::borrow::Cow<'_, [u8]>> = query
            .unwrap_or_default()
            .split(|&b| b == b'&')
            .filter(|p| !p.is_empty())
            .map(std::borrow::Cow::Borrowed)
            .collect();
        let before = pieces.len();
        let mut changed = false;
        if !self.remove.is_empty() {
            pieces.retain(|p| !self.remove.iter().any(|r| name_of(p) == r.as_str()));
            changed |= pieces.len() != before;
        }
        for (name, encoded) in &self.set {
            let mut first = None;
            let mut j = 0;
            pieces.retain(|p| {
                let keep = if name_of(p) == name.as_str() {
                    let is_first = first.is_none();
                    first.get_or_insert(j);
                    is_first
                } else {
                    true
                };
                j += usize::from(keep);
                keep
            });
            match first {
                Some(at) => pieces[at] = std::borrow::Cow::Owned(encoded.as_bytes().to_vec()),
                None => pieces.push(std::borrow::Cow::Owned(encoded.as_bytes().to_vec())),
            }
            changed = true;
        }
        for encoded in &self.add {
            pieces.push(std::borrow::Cow::Owned(encoded.as_bytes().to_vec()));
            changed = true;
        }
        if !changed {
            return None;
        }
        Some(pieces.join(&b'&'))
    }
}

impl Filter for Query {
    fn on_request(&self, head: &mut RequestHead, _cx: &RequestCx<'_>) -> Step {
        if let Some(query) = self.edit(head.query()) {
            let path = head.path();
            let mut target = Vec::with_capacity(path.len() + query.len() + 1);
            target.extend_from_slice(path);
            let path_len = target.len();
            if !query.is_empty() {
                target.push(b'?');
                target.extend_from_slice(&query);
            }
            head.edits_mut().target = Some((target, path_len));
        }
        Step::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(set: &[(&str, &str)], add: &[(&str, &str)], remove: &[&str]) -> Query {
        let map = |l: &[(&str, &str)]| l.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        Query::new(&QueryFilter {
            set: map(set),
            add: map(add),
            remove: remove.iter().map(|s| s.to_string()).collect(),
        })
    }

    fn edit(q: &Query, target: &str) -> String {
        let mut head = crate::filters::coding::tests::head_with("").clone();
        head.set_path_with(|_, out| {
            out.extend_from_slice(target.split('?').next().unwrap().as_bytes());
            true
        });
        if let Some((_, query)) = target.split_once('?') {
            let path = head.path().to_vec();
            let mut t = path.clone();
            t.push(b'?');
            t.extend_from_slice(query.as_bytes());
            head.edits_mut().target = Some((t, path.len()));
        }
        let denials = crate::filters::Denials::new("r");
        let cx = RequestCx {
            matched_path: b"/",
            captures: &[],
            prefix: None,
            peer: std::net::IpAddr::from([127, 0, 0, 1]),
            denials: &denials,
        };
        assert!(matches!(q.on_request(&mut head, &cx), Step::Continue));
        String::from_utf8(head.origin_form().to_vec()).unwrap()
    }

    #[test]
    fn untouched_parameters_keep_their_bytes_and_order() {
        let q = query(&[("v", "2")], &[("tag", "a b&c")], &["debug"]);
        assert_eq!(edit(&q, "/x?b=%2F%2f&debug=1&v=1&c=d+e&de%62ug=2&v=3&z"), "/x?b=%2F%2f&v=2&c=d+e&z&tag=a+b%26c");
        assert_eq!(edit(&q, "/x"), "/x?v=2&tag=a+b%26c", "no query: set and add append");
        let only_remove = query(&[], &[], &["token", "x y"]);
        assert_eq!(edit(&only_remove, "/x?token=s&keep=%41"), "/x?keep=%41");
        assert_eq!(edit(&only_remove, "/x?token=s&x+y=1&x%20y=2"), "/x", "the last parameter gone, so is the `?`");
        assert_eq!(edit(&only_remove, "/x?a=1&&b=2"), "/x?a=1&&b=2", "nothing removed: the target as it was");
        let add = query(&[], &[("a", "1")], &[]);
        assert_eq!(edit(&add, "/p?a=0"), "/p?a=0&a=1", "add keeps what is there");
        let set_unicode = query(&[("名", "値")], &[], &[]);
        assert_eq!(edit(&set_unicode, "/p?%E5%90%8D=old"), "/p?%E5%90%8D=%E5%80%A4");
    }
}
