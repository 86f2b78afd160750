//! URLs as `URL` and `URLSearchParams` keep them (url_class.rs makes the classes): a URL's serialization (`href`)
//! and the offsets of its parts in it, from which every getter slices. The WHATWG URL parser and its setters
//! are the `url` crate's (`url::quirks` is the URL Standard's API on it), the `application/x-www-form-urlencoded`
//! parser and serializer `form_urlencoded`'s.
//!
//! One hand-written piece, for the URL a handler parses on every request (`new URL(request.url)`): an absolute
//! `http:` or `https:` URL that the URL Standard serializes exactly as it is written gets its offsets from one
//! scan (`parse_fast`), without the crate; the unit tests below and fuzz/fuzz_targets/url_fast.rs check that
//! whatever it takes, the crate parses to the same href and offsets. Exactly as written means: the scheme in
//! lowercase followed by `//`; no userinfo; a host of `[a-z0-9.-]` whose labels are not empty (a trailing dot
//! aside) and do not start with `xn--`, which ends in a number only when it is a canonical dotted quad; a port
//! of digits without a leading zero, not the scheme's default; a path that starts with `/` and has no dot
//! segment (`.`, `..`, with `%2e` for a dot in any case); no backslash; and no byte that the path, query or
//! fragment percent-encode sets would encode, nor `^` or a second `#`: only printable ASCII, nothing removed.
//! And a small one for queries (`form_pairs`): a pair that needs no decoding (no `+`, no `%`) is split where it
//! is rather than by `form_urlencoded`, checked against it the same two ways.

use std::borrow::Cow;
use url::{Position, Url};

/// Where a URL's parts are in its serialization, in bytes (a serialized URL is ASCII: bytes are UTF-16 code
/// units too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offsets {
    /// Where the `:` after the scheme is.
    pub after_scheme: u32,
    pub before_username: u32,
    pub after_username: u32,
    pub before_password: u32,
    pub after_password: u32,
    pub before_host: u32,
    pub after_host: u32,
    pub before_port: u32,
    pub after_port: u32,
    pub before_path: u32,
    /// Where the query (its `?`), or else the fragment (its `#`), starts; the end without either.
    pub after_path: u32,
    /// Where the fragment (its `#`) starts; the end without one.
    pub after_query: u32,
}

/// A parsed URL: its serialization and where its parts are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub href: String,
    pub offsets: Offsets,
}

/// The URL Standard's setters, as `Record::set` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Href,
    Protocol,
    Username,
    Password,
    Host,
    Hostname,
    Port,
    Pathname,
    Search,
    Hash,
}

/// Schemes whose origin is `scheme://host[:port]`.
const TUPLE_ORIGIN: [&str; 5] = ["http:", "https:", "ws:", "wss:", "ftp:"];

impl Record {
    /// The record of a URL the crate parsed.
    pub fn of(url: &Url) -> Record {
        let href = url.as_str();
        let at = |position: Position| url[..position].len() as u32;
        // (`Position::BeforePassword` and `AfterPassword` are wrong for a username without a password, and
        // debug builds assert there: the password's place is found from where the host starts.)
        let (before_password, after_password) = match url.password() {
            Some(password) => {
                let end = at(Position::BeforeHost).saturating_sub("@".len() as u32);
                (end.saturating_sub(password.len() as u32), end)
            }
            None => (at(Position::AfterUsername), at(Position::AfterUsername)),
        };
        let offsets = Offsets {
            after_scheme: at(Position::AfterScheme),
            before_username: at(Position::BeforeUsername),
            after_username: at(Position::AfterUsername),
            before_password,
            after_password,
            before_host: at(Position::BeforeHost),
            after_host: at(Position::AfterHost),
            before_port: at(Position::BeforePort),
            after_port: at(Position::AfterPort),
            before_path: at(Position::BeforePath),
            after_path: at(Position::AfterPath),
            after_query: at(Position::AfterQuery),
        };
        Record { href: href.to_string(), offsets }
    }

    fn slice(&self, from: u32, to: u32) -> &str {
        self.href.get(from as usize..to as usize).unwrap_or("")
    }

    pub fn href(&self) -> &str {
        &self.href
    }

    /// `protocol`: the scheme and its `:`.
    pub fn protocol(&self) -> &str {
        self.slice(0, self.offsets.after_scheme + 1)
    }

    pub fn username(&self) -> &str {
        self.slice(self.offsets.before_username, self.offsets.after_username)
    }

    pub fn password(&self) -> &str {
        self.slice(self.offsets.before_password, self.offsets.after_password)
    }

    /// `host`: the host and its port.
    pub fn host(&self) -> &str {
        self.slice(self.offsets.before_host, self.offsets.after_port)
    }

    pub fn hostname(&self) -> &str {
        self.slice(self.offsets.before_host, self.offsets.after_host)
    }

    pub fn port(&self) -> &str {
        self.slice(self.offsets.before_port, self.offsets.after_port)
    }

    pub fn pathname(&self) -> &str {
        self.slice(self.offsets.before_path, self.offsets.after_path)
    }

    /// `search`: the query with its `?`, empty for no query and for an empty one.
    pub fn search(&self) -> &str {
        let s = self.slice(self.offsets.after_path, self.offsets.after_query);
        if s.len() == 1 {
            ""
        } else {
            s
        }
    }

    /// The query without its `?` (empty when there is none): what searchParams parses.
    pub fn query(&self) -> &str {
        self.search().get(1..).unwrap_or("")
    }

    /// `hash`: the fragment with its `#`, empty for no fragment and for an empty one.
    pub fn hash(&self) -> &str {
        let s = self.href.get(self.offsets.after_query as usize..).unwrap_or("");
        if s.len() == 1 {
            ""
        } else {
            s
        }
    }

    /// `origin`, serialized: `scheme://host[:port]` for the schemes that have one, a `blob:` URL's inner URL's
    /// when that is http(s), else `null`.
    pub fn origin(&self) -> String {
        let protocol = self.protocol();
        if TUPLE_ORIGIN.contains(&protocol) {
            return format!("{protocol}//{}", self.host());
        }
        if protocol == "blob:" {
            if let Some(inner) = parse(self.pathname(), None) {
                if matches!(inner.protocol(), "http:" | "https:") {
                    return inner.origin();
                }
            }
        }
        "null".to_string()
    }

    /// The URL with `part` set to `value` as the URL Standard's setter for it does. A value the setter refuses
    /// leaves the URL as it was (the standard's setters return silently); `None` only for an `href` that is no
    /// URL (or should the crate panic).
    pub fn set(&self, part: Part, value: &str) -> Option<Record> {
        catch(|| {
            let mut url = Url::parse(&self.href).ok()?;
            use url::quirks;
            let _ = match part {
                Part::Href => {
                    url = Url::parse(value).ok()?;
                    Ok(())
                }
                Part::Protocol => quirks::set_protocol(&mut url, value),
                Part::Username => quirks::set_username(&mut url, value),
                Part::Password => quirks::set_password(&mut url, value),
                Part::Host => quirks::set_host(&mut url, value),
                Part::Hostname => quirks::set_hostname(&mut url, value),
                Part::Port => quirks::set_port(&mut url, value),
                Part::Pathname => {
                    quirks::set_pathname(&mut url, value);
                    Ok(())
                }
                Part::Search => {
                    quirks::set_search(&mut url, value);
                    Ok(())
                }
                Part::Hash => {
                    quirks::set_hash(&mut url, value);
                    Ok(())
                }
            };
            Some(Record::of(&url))
        })
    }
}

/// `body`'s answer, `None` should it panic (a bug in a crate, whatever the input): a URL that does not parse
/// rather than a panic carried through QuickJS into the worker.
fn catch<T>(body: impl FnOnce() -> Option<T>) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).ok().flatten()
}

/// `input` parsed as the URL Standard does, against `base` (itself parsed first) when there is one; `None`
/// when either is not a URL.
pub fn parse(input: &str, base: Option<&str>) -> Option<Record> {
    match base {
        None => parse_fast(input).or_else(|| catch(|| Url::parse(input).ok().map(|url| Record::of(&url)))),
        Some(base) => catch(|| Url::parse(base).ok()?.join(input).ok().map(|url| Record::of(&url))),
    }
}

/// The record of `input` when it is an absolute http(s) URL that the URL Standard serializes exactly as it is
/// written (the module's comment says what that takes), found in one scan; `None` for anything else, which
/// the crate then parses. Public for the fuzz target.
pub fn parse_fast(input: &str) -> Option<Record> {
    let b = input.as_bytes();
    let (after_scheme, default_port) = if b.starts_with(b"http://") {
        (4, b"80".as_slice())
    } else if b.starts_with(b"https://") {
        (5, b"443".as_slice())
    } else {
        return None;
    };
    // (Offsets are u32: a JavaScript string is shorter than 2^30 code units anyway.)
    if b.len() > u32::MAX as usize {
        return None;
    }
    let before_host = after_scheme + "://".len();
    let mut i = before_host;
    while i < b.len() && is(b[i], HOST) {
        i += 1;
    }
    let after_host = i;
    if !host_as_written(&b[before_host..after_host]) {
        return None;
    }
    let (before_port, after_port) = match b.get(i) {
        Some(b':') => {
            let start = i + 1;
            i = start;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let port = &b[start..i];
            // (At most 65535; "0" itself is a port.)
            let canonical = match port {
                [] => false,
                [b'0'] => true,
                [b'0', ..] => false,
                _ => port.len() < 5 || (port.len() == 5 && port <= b"65535".as_slice()),
            };
            if !canonical || port == default_port {
                return None;
            }
            (start, i)
        }
        _ => (after_host, after_host),
    };
    if b.get(i) != Some(&b'/') {
        return None;
    }
    let before_path = i;
    // Segment by segment, each after its `/`.
    loop {
        let segment = i + 1;
        i = segment;
        while i < b.len() && is(b[i], PATH) {
            i += 1;
        }
        if dot_segment(&b[segment..i]) {
            return None;
        }
        match b.get(i) {
            Some(b'/') => {}
            None | Some(b'?' | b'#') => break,
            Some(_) => return None,
        }
    }
    let after_path = i;
    if b.get(i) == Some(&b'?') {
        i += 1;
        while i < b.len() && is(b[i], QUERY) {
            i += 1;
        }
        if i < b.len() && b[i] != b'#' {
            return None;
        }
    }
    let after_query = i;
    if i < b.len() {
        // The fragment, after its `#`.
        if !b[i + 1..].iter().all(|&c| is(c, FRAGMENT)) {
            return None;
        }
    }
    let at = |n: usize| n as u32;
    let after_username = at(before_host);
    Some(Record {
        href: input.to_string(),
        offsets: Offsets {
            after_scheme: at(after_scheme),
            before_username: at(before_host),
            after_username,
            before_password: after_username,
            after_password: after_username,
            before_host: at(before_host),
            after_host: at(after_host),
            before_port: at(before_port),
            after_port: at(after_port),
            before_path: at(before_path),
            after_path: at(after_path),
            after_query: at(after_query),
        },
    })
}

/// A host of `[a-z0-9.-]` that the host parser gives back as it is: labels not empty (one trailing dot
/// aside), none starting with `xn--` (Punycode, decoded and checked), and either not ending in a number or a
/// canonical dotted quad (an IPv4 address written as it serializes).
fn host_as_written(host: &[u8]) -> bool {
    let labels = host.strip_suffix(b".").unwrap_or(host);
    if labels.is_empty() {
        return false;
    }
    let mut count = 0;
    let mut last: &[u8] = &[];
    for label in labels.split(|&c| c == b'.') {
        if label.is_empty() || label.starts_with(b"xn--") {
            return false;
        }
        count += 1;
        last = label;
    }
    // The standard's "ends in a number": the last label is digits, or 0x and hex digits (the others in
    // `[a-z0-9-]` that the IPv4 number parser takes are digits as well).
    let number = last.iter().all(u8::is_ascii_digit)
        || last.strip_prefix(b"0x").is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit));
    if !number {
        return true;
    }
    labels.len() == host.len()
        && count == 4
        && labels.split(|&c| c == b'.').all(|part| match part {
            [b'0'] => true,
            [b'0', ..] => false,
            _ => {
                part.len() <= 3 && part.iter().all(u8::is_ascii_digit) && (part.len() < 3 || part <= b"255".as_slice())
            }
        })
}

/// `.` or `..`, each dot perhaps written `%2e` or `%2E`.
fn dot_segment(segment: &[u8]) -> bool {
    let mut dots = 0;
    let mut rest = segment;
    loop {
        match rest {
            [] => return dots == 1 || dots == 2,
            [b'.', tail @ ..] => rest = tail,
            [b'%', b'2', b'e' | b'E', tail @ ..] => rest = tail,
            _ => return false,
        }
        dots += 1;
    }
}

/// Byte classes of the fast path, as bits: in a host it takes (`[a-z0-9.-]`), and the printable ASCII that a
/// path segment, a special URL's query and a fragment keep as they are (their percent-encode sets, `^` in a
/// path, a backslash, and the bytes that end each: `/`, `?` and `#` in a path, `#` in a query and a fragment).
const HOST: u8 = 1;
const PATH: u8 = 2;
const QUERY: u8 = 4;
const FRAGMENT: u8 = 8;

static CLASSES: [u8; 256] = {
    let mut classes = [0u8; 256];
    let mut c = 0x21;
    while c <= 0x7e {
        let b = c as u8;
        let mut class = 0;
        if b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-' {
            class |= HOST;
        }
        if !matches!(b, b'"' | b'<' | b'>' | b'`' | b'{' | b'}' | b'^' | b'\\' | b'/' | b'?' | b'#') {
            class |= PATH;
        }
        if !matches!(b, b'"' | b'<' | b'>' | b'\'' | b'\\' | b'#') {
            class |= QUERY;
        }
        if !matches!(b, b'"' | b'<' | b'>' | b'`' | b'\\' | b'#') {
            class |= FRAGMENT;
        }
        classes[c] = class;
        c += 1;
    }
    classes
};

fn is(c: u8, class: u8) -> bool {
    CLASSES[usize::from(c)] & class != 0
}

/// `application/x-www-form-urlencoded` text as its name-value pairs (invalid UTF-8 after percent-decoding is
/// U+FFFD, as the standard's parser does).
pub fn form_parse(text: &str) -> Vec<(String, String)> {
    form_pairs(text).map(|(name, value)| (name.into_owned(), value.into_owned())).collect()
}

/// The pairs of `application/x-www-form-urlencoded` text, as `form_urlencoded::parse` gives them, borrowed
/// from the text where they need no decoding: a sequence without `+` or `%` is split on its first `=` here,
/// any other decoded by the crate.
pub fn form_pairs(text: &str) -> impl Iterator<Item = (Cow<'_, str>, Cow<'_, str>)> {
    text.split('&').filter(|sequence| !sequence.is_empty()).map(|sequence| {
        if sequence.bytes().any(|b| b == b'+' || b == b'%') {
            // (One pair: the sequence is not empty and has no `&`.)
            form_urlencoded::parse(sequence.as_bytes()).next().unwrap_or_default()
        } else {
            let (name, value) = sequence.split_once('=').unwrap_or((sequence, ""));
            (Cow::Borrowed(name), Cow::Borrowed(value))
        }
    })
}

/// Pairs serialized as `application/x-www-form-urlencoded`.
pub fn form_serialize(list: &[(String, String)]) -> String {
    let mut serializer = form_urlencoded::Serializer::new(String::new());
    for (name, value) in list {
        serializer.append_pair(name, value);
    }
    serializer.finish()
}

/// Runs a native's body; a panic in it (a bug in a crate, whatever the input) is a `TypeError` for the
/// script, not a panic carried through QuickJS into the worker. (For the natives made with rquickjs's `Func`:
/// encoding.rs and crypto.rs use it.)
pub(crate) fn guarded<T>(what: &'static str, body: impl FnOnce() -> rquickjs::Result<T>) -> rquickjs::Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or_else(|_| {
        Err(rquickjs::Error::new_from_js_message("value", what, format!("the {what} failed on this input")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_crate(input: &str) -> Option<Record> {
        Url::parse(input).ok().map(|url| Record::of(&url))
    }

    /// Inputs the fast path must take, each the same as the crate's parse.
    const TAKEN: &[&str] = &[
        "http://example.com/",
        "https://example.com/",
        "http://127.0.0.1:8080/hello?name=world",
        "http://localhost:3000/hello",
        "http://0.0.0.0/",
        "http://255.255.255.255/",
        "http://10.0.0.1:1/",
        "http://a/",
        "http://a.b.c.d.e/",
        "http://example.com./",
        "http://ex-ample.com/",
        "http://-a-.com/",
        "http://ab--cd.com/",
        "http://1.example.com/",
        "http://example.1a/",
        "http://example.0xg/",
        "http://a.0x1g/",
        "http://example.com:0/",
        "http://example.com:443/",
        "https://example.com:80/",
        "http://example.com:65535/",
        "http://example.com:8080/a/b/c",
        "http://example.com/a//b///",
        "http://example.com/a/b.c/.d/..e/...",
        "http://example.com/%2e%2e%2e/%2ex/x%2e/%2",
        "http://example.com/%zz/%/%%",
        "http://example.com/!$&'()*+,-.;=:@[]_~|",
        "http://example.com/path?",
        "http://example.com/path?#",
        "http://example.com/path#",
        "http://example.com/?a=1&b=2&c",
        "http://example.com/?q=`{}^|~!$&()*+,-./:;=?@[]_",
        "http://example.com/?q=%zz%",
        "http://example.com/#frag",
        "http://example.com/#f?/{}^|~!$&'()*+,-./:;=?@[]_",
        "http://example.com/p?q#f",
        "https://api.example.com:8443/v1/items/42?expand=true&limit=10#top",
        "http://example.com/a?b?c",
        "http://example.com/.a/a./..a",
    ];

    /// Inputs it must leave to the crate (each with the reason).
    const LEFT: &[&str] = &[
        "HTTP://example.com/",           // uppercase scheme
        "Http://example.com/",           // uppercase scheme
        "http://Example.com/",           // uppercase host
        "http:/example.com/",            // one slash
        "http:///example.com/",          // three slashes
        "http:example.com/",             // no slashes
        "http://example.com",            // no path
        "http://example.com?q",          // no path before the query
        "http://example.com#f",          // no path before the fragment
        "http://user@example.com/",      // userinfo
        "http://user:pw@example.com/",   // userinfo
        "http://@example.com/",          // empty userinfo
        "http://example.com:80/",        // the default port
        "https://example.com:443/",      // the default port
        "http://example.com:/",          // an empty port
        "http://example.com:080/",       // a leading zero
        "http://example.com:00/",        // a leading zero
        "http://example.com:65536/",     // too big
        "http://example.com:99999/",     // too big
        "http://example.com:123456/",    // too big
        "http://example.com:8a/",        // not digits
        "http://[::1]/",                 // IPv6
        "http://1.2.3/",                 // IPv4, not a dotted quad
        "http://1.2.3.4.5/",             // ends in a number, not IPv4
        "http://01.2.3.4/",              // octal
        "http://1.2.3.256/",             // too big
        "http://1.2.3.4./",              // a trailing dot on an address
        "http://0x7f.1/",                // hex
        "http://example.0x/",            // ends in a number (0x)
        "http://example.0xff/",          // ends in a number (hex)
        "http://example.123/",           // ends in a number
        "http://123/",                   // a number
        "http://xn--mnchen-3ya.de/",     // Punycode
        "http://xn--a.com/",             // Punycode
        "http://a..b/",                  // an empty label
        "http://.a/",                    // an empty label
        "http://./",                     // an empty label
        "http://a../",                   // an empty label
        "http:///",                      // no host
        "http://ex%41mple.com/",         // percent-encoded host
        "http://ex_ample.com/",          // not [a-z0-9.-]
        "http://münchen.de/",            // non-ASCII host
        "http://example.com/./a",        // dot segment
        "http://example.com/../a",       // dot segment
        "http://example.com/a/.",        // dot segment
        "http://example.com/a/..",       // dot segment
        "http://example.com/a/%2e/b",    // dot segment
        "http://example.com/a/%2E%2e/b", // dot segment
        "http://example.com/a/.%2E?q",   // dot segment
        "http://example.com/a/%2e.#f",   // dot segment
        "http://example.com/a\\b",       // backslash
        "http://example.com/a b",        // space
        "http://example.com/a\tb",       // tab
        "http://example.com/a\nb",       // newline
        " http://example.com/",          // leading space
        "http://example.com/ ",          // trailing space
        "http://example.com/\u{7f}",     // DEL
        "http://example.com/\u{0}",      // NUL
        "http://example.com/é",          // non-ASCII
        "http://example.com/\"",         // path set
        "http://example.com/<>",         // path set
        "http://example.com/`",          // path set
        "http://example.com/{}",         // path set
        "http://example.com/^",          // ^ (the standard's newer path set)
        "http://example.com/?'",         // special-query set
        "http://example.com/?\"",        // query set
        "http://example.com/?<",         // query set
        "http://example.com/?a b",       // query set
        "http://example.com/?\\",        // backslash
        "http://example.com/?é",         // non-ASCII
        "http://example.com/#`",         // fragment set
        "http://example.com/#a b",       // fragment set
        "http://example.com/#<",         // fragment set
        "http://example.com/#a#b",       // a second #
        "http://example.com/#é",         // non-ASCII
        "ws://example.com/",             // another scheme
        "ftp://example.com/",            // another scheme
        "httpx://example.com/",          // another scheme
        "",
        "http://",
    ];

    #[test]
    fn the_fast_path_takes_the_common_urls_and_agrees_with_the_crate() {
        for input in TAKEN {
            let fast = parse_fast(input).unwrap_or_else(|| panic!("the fast path left {input:?}"));
            assert_eq!(Some(&fast), by_crate(input).as_ref(), "{input:?}");
            assert_eq!(fast.href, *input);
        }
    }

    #[test]
    fn the_fast_path_leaves_what_the_standard_would_change() {
        for input in LEFT {
            assert_eq!(parse_fast(input), None, "the fast path took {input:?}");
        }
    }

    /// Every variant of a few templates (each character of an alphabet at each marked place), through both
    /// parsers: whenever the fast path takes one, the crate gives the same record.
    #[test]
    fn the_fast_path_agrees_with_the_crate_on_generated_urls() {
        let alphabet: Vec<char> = (0u8..=0x7f).map(char::from).chain(['é', '\u{ff}', '\u{2028}']).collect();
        let templates = [
            "http://a@b.c/d?e#f",
            "https://1.2.3.4:5/6?7#8",
            "http://x.0x1@:9/a/.@/b?c=d&e@#g@",
            "http://h/%2@/x",
            "https://@@.com/",
            "http://a.@@/",
            "http://h:@@/",
            "http://h/@@@",
        ];
        let (mut taken, mut total) = (0, 0);
        for template in templates {
            let holes: Vec<usize> = template.match_indices('@').map(|(i, _)| i).collect();
            for &hole in &holes {
                for c in &alphabet {
                    for c2 in ['a', '.', '/', '%', c.to_owned()] {
                        let mut input = String::new();
                        for (i, ch) in template.char_indices() {
                            if i == hole {
                                input.push(*c);
                            } else if ch == '@' {
                                input.push(c2);
                            } else {
                                input.push(ch);
                            }
                        }
                        total += 1;
                        if let Some(fast) = parse_fast(&input) {
                            taken += 1;
                            assert_eq!(Some(fast), by_crate(&input), "{input:?}");
                        }
                    }
                }
            }
        }
        assert!(taken > total / 10, "the fast path took only {taken} of {total}");
    }

    #[test]
    fn numeric_hosts_are_taken_only_as_dotted_quads() {
        for a in [
            "0", "1", "9", "10", "99", "100", "199", "200", "249", "250", "255", "256", "300", "999", "00", "01",
            "010", "0x", "0x1", "1000",
        ] {
            for input in [
                format!("http://{a}.2.3.4/"),
                format!("http://1.2.3.{a}/"),
                format!("http://{a}/"),
                format!("http://x.{a}/"),
                format!("http://{a}.x/"),
            ] {
                if let Some(fast) = parse_fast(&input) {
                    assert_eq!(Some(fast), by_crate(&input), "{input:?}");
                }
            }
        }
        assert!(parse_fast("http://1.2.3.255/").is_some());
        assert!(parse_fast("http://1.2.3.250/").is_some());
    }

    #[test]
    fn every_part_slices_as_the_crate_gives_it() {
        for input in
            TAKEN.iter().chain(["http://u:p@h:1/p?q#f", "mailto:a@b?c", "blob:https://a.b:1/x", "sc://h"].iter())
        {
            let record = parse(input, None).unwrap();
            let url = Url::parse(input).unwrap();
            assert_eq!(record.protocol(), url::quirks::protocol(&url), "{input}");
            assert_eq!(record.username(), url::quirks::username(&url), "{input}");
            assert_eq!(record.password(), url::quirks::password(&url), "{input}");
            assert_eq!(record.host(), url::quirks::host(&url), "{input}");
            assert_eq!(record.hostname(), url::quirks::hostname(&url), "{input}");
            assert_eq!(record.port(), url::quirks::port(&url), "{input}");
            assert_eq!(record.pathname(), url::quirks::pathname(&url), "{input}");
            assert_eq!(record.search(), url::quirks::search(&url), "{input}");
            assert_eq!(record.hash(), url::quirks::hash(&url), "{input}");
        }
        assert_eq!(parse("blob:https://a.b:1/x", None).unwrap().origin(), "https://a.b:1");
        assert_eq!(parse("blob:ftp://a.b/x", None).unwrap().origin(), "null");
        assert_eq!(parse("ws://a.b:1/x", None).unwrap().origin(), "ws://a.b:1");
        assert_eq!(parse("sc://a.b/x", None).unwrap().origin(), "null");
    }

    #[test]
    fn form_pairs_are_the_crates() {
        let data = include_str!("../../portico/tests/data/urlencoded-parser-data.json");
        let mut inputs: Vec<String> = data
            .lines()
            .filter_map(|line| line.trim().strip_prefix("{ \"input\": \""))
            .filter_map(|rest| rest.split('"').next())
            .map(str::to_string)
            .collect();
        assert!(inputs.len() > 20, "{} inputs read from the test data", inputs.len());
        let pieces = ["", "a", "=", "&", "+", "%", "%2", "%41", "%zz", "%C3%A9", "é", "b=c", "&&", "==", "+%2B"];
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    inputs.push(format!("{a}{b}{c}"));
                }
            }
        }
        for input in &inputs {
            let ours: Vec<_> = form_pairs(input).collect();
            let theirs: Vec<_> = form_urlencoded::parse(input.as_bytes()).collect();
            assert_eq!(ours, theirs, "{input:?}");
        }
    }

    #[test]
    fn setters_and_relative_urls_go_through_the_crate() {
        let record = parse("http://example.com/a?b#c", None).unwrap();
        assert_eq!(record.set(Part::Search, "").unwrap().href, "http://example.com/a#c");
        assert_eq!(record.set(Part::Port, "8080x").unwrap().href, "http://example.com:8080/a?b#c");
        assert_eq!(record.set(Part::Href, "not a url"), None);
        assert_eq!(parse("../x", Some("http://h/a/b/c")).unwrap().href, "http://h/a/x");
        assert_eq!(parse("x", Some("not a url")), None);
    }
}
