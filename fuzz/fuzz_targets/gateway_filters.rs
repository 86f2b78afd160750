//! The `jwt` and `rate_limit` filters on requests whose `Authorization` header is any bytes (tokens that are
//! not JWTs, JWTs with broken headers, claims or signatures), and `rate_limit`'s rates written any way:
//! nothing panics, and a refusal is one of the statuses the filters document.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use portico_http::codec::{self, HeadLimits, Parsed};
use portico_http::filters::{self, Denials, RequestCx, Step};
use std::sync::{Arc, OnceLock};

const LIMITS: HeadLimits = HeadLimits { max_request_line: 8192, max_header_bytes: 32768, max_headers: 100 };

const CONFIG: &str = "listeners: [ { name: web, address: 127.0.0.1:8080 } ]
routes:
  - static: { status: 200 }
    filters:
      - jwt:
          keys: [ { algorithm: HS256, secret: \"0123456789abcdef0123456789abcdef\" } ]
          claims: { scope: read }
          forward_claims: { sub: x-user, roles: x-roles }
      - rate_limit: { rate: 5/s, burst: 2, key: { claim: sub } }
";

fn chain() -> &'static [Arc<dyn filters::Filter>] {
    static CHAIN: OnceLock<Vec<Arc<dyn filters::Filter>>> = OnceLock::new();
    CHAIN.get_or_init(|| {
        let loaded = portico_config::load_str(CONFIG, "fuzz.yaml").expect("the fuzz configuration loads");
        let route = &loaded.config.routes[0];
        route.filters.iter().map(|f| filters::compile(f, &[], Some("fuzz"), &loaded).expect("it compiles")).collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    if selector & 1 == 0 {
        let _ = portico_config::parse_rate(&String::from_utf8_lossy(rest));
        return;
    }
    let mut raw = b"GET / HTTP/1.1\r\nhost: x\r\nauthorization: ".to_vec();
    raw.extend_from_slice(rest);
    raw.extend_from_slice(b"\r\n\r\n");
    let mut buf = BytesMut::from(&raw[..]);
    let Ok(Parsed::Complete(head, used)) = codec::parse_request(&buf, &LIMITS) else { return };
    let mut head = codec::take_request(&mut buf, head, used);
    let denials = Denials::new("fuzz");
    let cx = RequestCx { matched_path: b"/", captures: &[], prefix: None, peer: [127, 0, 0, 1].into(), denials: &denials };
    for f in chain() {
        match f.on_request(&mut head, &cx) {
            Step::Continue => {}
            Step::Respond(r) => {
                assert!(matches!(r.status, 400 | 401 | 403 | 429), "{}", r.status);
                break;
            }
            Step::Wait(_) => panic!("with no JWKS URL there is nothing to wait for"),
        }
    }
});
