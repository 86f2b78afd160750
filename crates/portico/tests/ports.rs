//! A listening address belongs to one Portico: a second one (or a reload, or the demo) on an address that
//! anything else listens on fails with a clear error instead of sharing the port through SO_REUSEPORT and
//! taking part of its traffic. Only Portico's own workers and its upgrade hand-over share a socket.

mod common;
use common::*;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

fn answering(text: &str, address: SocketAddr) -> String {
    format!(
        "workers: 2\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: web\n    address: \"{address}\"\n\
         routes:\n  - match: {{ path_prefix: / }}\n    static: {{ body: \"{text}\" }}\n"
    )
}

/// Runs `portico ARGS`; its exit code and stderr, within 20 s.
fn run_to_exit(args: &[&str]) -> (Option<i32>, String) {
    let mut child =
        Command::new(portico_bin()).args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status.code(), err);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("portico {args:?} is still running: it should have refused the address");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every one of `n` requests to `addr` is answered by the first Portico.
fn all_from_first(addr: SocketAddr, n: usize) {
    for i in 0..n {
        let r = Conn::open(addr).get("/", "");
        assert_eq!(r.text(), "first", "request {i} was answered by someone else");
    }
}

#[test]
fn a_second_portico_on_a_taken_address_refuses_to_start_and_takes_no_traffic() {
    let first = Portico::start(&answering("first", "127.0.0.1:0".parse().unwrap()).replace("127.0.0.1:0", "{listen}"));
    let file = temp_dir().join("second.yaml");
    let admin = format!("127.0.0.1:{}", free_port());
    std::fs::write(&file, answering("second", first.addr).replace("{admin}", &admin)).unwrap();
    let (code, err) = run_to_exit(&["run", "-c", file.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&format!("cannot listen on {}", first.addr)), "{err}");
    assert!(err.contains("another process listens there"), "{err}");
    all_from_first(first.addr, 40);
}

#[test]
fn a_port_shared_with_so_reuseport_by_another_program_is_refused() {
    // A server that itself sets SO_REUSEPORT (nginx `listen ... reuseport`, another Portico) would otherwise
    // accept a second member in its group.
    use socket2::{Domain, Socket, Type};
    let other = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    other.set_reuse_port(true).unwrap();
    other.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
    other.listen(16).unwrap();
    let taken = other.local_addr().unwrap().as_socket().unwrap();
    let file = temp_dir().join("portico.yaml");
    std::fs::write(&file, format!("listeners:\n  - {{ name: web, address: \"{taken}\" }}\n")).unwrap();
    let (code, err) = run_to_exit(&["run", "-c", file.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("Address already in use"), "{err}");
}

#[test]
fn a_reload_that_adds_a_listener_on_another_porticos_address_is_refused() {
    let first = Portico::start(&answering("first", "127.0.0.1:0".parse().unwrap()).replace("127.0.0.1:0", "{listen}"));
    let second =
        Portico::start(&answering("second", "127.0.0.1:0".parse().unwrap()).replace("127.0.0.1:0", "{listen}"));
    let config = std::fs::read_to_string(&second.config).unwrap();
    let admin = second.admin;
    let with_clash =
        format!("{}  - name: clash\n    address: \"{}\"\n", config.split("routes:").next().unwrap(), first.addr)
            + "routes:"
            + config.split("routes:").nth(1).unwrap();
    std::fs::write(&second.config, with_clash.replace("{admin}", &admin.to_string())).unwrap();
    second.signal(libc::SIGHUP);
    wait_until("the reload failed", Duration::from_secs(10), || second.metric("portico_reload_failures_total") == 1.0);
    let reload = second.admin_get("/admin/reload");
    assert!(reload.text().contains(&format!("cannot listen on {}", first.addr)), "{}", reload.text());
    all_from_first(first.addr, 40);
    assert_eq!(Conn::open(second.addr).get("/", "").text(), "second", "the running configuration stays");
}

#[test]
fn the_demo_refuses_a_taken_address() {
    let first = Portico::start(&answering("first", "127.0.0.1:0".parse().unwrap()).replace("127.0.0.1:0", "{listen}"));
    let listen = first.addr.to_string();
    let (code, err) = run_to_exit(&["demo", "--listen", &listen]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("another process listens there"), "{err}");
    all_from_first(first.addr, 20);
}
