//! Shared helpers for the end-to-end tests: start the real `portico` binary on a free port with a given
//! configuration, talk to it over real sockets.
#![allow(dead_code)]

pub mod echo;
pub mod pki;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

pub fn temp_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    // Directories of test runs that have ended are removed, once per test binary (they hold configurations,
    // certificates and logs, and would pile up over many runs).
    SWEPT.call_once(|| {
        for entry in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name.strip_prefix("portico-test-").and_then(|rest| rest.split('-').next());
            if pid
                .and_then(|p| p.parse::<u32>().ok())
                .is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
    let dir =
        std::env::temp_dir().join(format!("portico-test-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

pub fn portico_bin() -> &'static str {
    env!("CARGO_BIN_EXE_portico")
}

pub struct Portico {
    pub child: Child,
    pub addr: SocketAddr,
    /// Where `{admin}` in the configuration pointed.
    pub admin: SocketAddr,
    /// Where `{mqtt}` in the configuration pointed (a second free port, for an MQTT listener).
    pub mqtt: SocketAddr,
    pub config: PathBuf,
}

impl Portico {
    /// Starts `portico run` with `yaml`, where `{listen}` and `{admin}` stand for free loopback addresses.
    pub fn start(yaml: &str) -> Portico {
        Portico::start_in(&temp_dir(), yaml)
    }

    /// Like `start`, with the configuration file written in `dir` (for files named relative to it).
    ///
    /// A port found free can be taken by another test's outgoing connection before Portico binds it: when the
    /// process exits before it listens, it is started again on other ports.
    pub fn start_in(dir: &std::path::Path, yaml: &str) -> Portico {
        Portico::start_binary_in(std::path::Path::new(portico_bin()), dir, yaml)
    }

    /// Like `start_in`, running the binary at `bin` (another build) instead of this build's.
    pub fn start_binary_in(bin: &std::path::Path, dir: &std::path::Path, yaml: &str) -> Portico {
        Portico::launch(bin, dir, None, yaml)
    }

    /// Like `start_in`, with the process started in `working_dir` (which relative paths must not depend on).
    pub fn start_in_from(dir: &std::path::Path, working_dir: &std::path::Path, yaml: &str) -> Portico {
        Portico::launch(std::path::Path::new(portico_bin()), dir, Some(working_dir), yaml)
    }

    fn launch(
        bin: &std::path::Path,
        dir: &std::path::Path,
        working_dir: Option<&std::path::Path>,
        yaml: &str,
    ) -> Portico {
        for _ in 0..5 {
            let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let mqtt: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let config = dir.join("portico.yaml");
            std::fs::write(&config, fill(yaml, addr, admin, mqtt)).unwrap();
            let mut command = Command::new(bin);
            if let Some(working_dir) = working_dir {
                command.current_dir(working_dir);
            }
            let child = command
                .args(["run", "-c"])
                .arg(&config)
                .env("RUST_LOG", "warn")
                // Debug builds panic on requests for this path (the crash-containment tests use it).
                .env("PORTICO_DEBUG_PANIC_PATH", "/__panic")
                .env("PORTICO_DEBUG_KILL_WORKER_PATH", "/__kill_worker")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start portico");
            let mut p = Portico { child, addr, admin, mqtt, config };
            if p.wait_ready() {
                return p;
            }
        }
        panic!("{} did not start (see its error above)", bin.display());
    }

    /// A configuration with one listener, one catch-all route and one cluster over `endpoints`.
    pub fn simple(balancer: &str, endpoints: &[SocketAddr], extra_cluster: &str) -> Portico {
        Portico::start(&simple_yaml(balancer, endpoints, extra_cluster))
    }

    /// True once it listens; false when the process ended first.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(15);
        // The listening socket accepts from the moment it is bound; with an admin API, `/ready` says when the
        // workers run (and privileges are dropped).
        let has_admin = std::fs::read_to_string(&self.config).is_ok_and(|c| c.contains(&self.admin.to_string()));
        while Instant::now() < deadline {
            if TcpStream::connect(self.addr).is_ok() && (!has_admin || answers_ready(self.admin)) {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("portico did not start listening on {}", self.addr);
    }

    /// Replaces the configuration file (for a reload), with `{listen}`, `{admin}` and `{mqtt}` as at start.
    pub fn rewrite_config(&self, yaml: &str) {
        std::fs::write(&self.config, fill(yaml, self.addr, self.admin, self.mqtt)).unwrap();
    }

    /// GET on the admin server.
    pub fn admin_get(&self, path: &str) -> Resp {
        Conn::open(self.admin).get(path, "")
    }

    /// The value of one Prometheus sample, by its full name and labels as rendered
    /// (`portico_requests_total{route="r",cluster="c",status_class="2xx"}`); 0 when absent.
    pub fn metric(&self, sample: &str) -> f64 {
        let text = self.admin_get("/metrics").text();
        text.lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// The `/admin/clusters` JSON.
    pub fn clusters(&self) -> serde_json::Value {
        serde_json::from_slice(&self.admin_get("/admin/clusters").body).expect("clusters JSON")
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// A memory figure of the process in KiB from /proc (`VmRSS`, or `VmHWM` for the peak).
    pub fn memory_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

/// `GET /ready` answered 200, without panicking on a refused or cut connection.
pub fn answers_ready(admin: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect(admin) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = [0u8; 12];
    stream.write_all(b"GET /ready HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").is_ok()
        && stream.read_exact(&mut head).is_ok()
        && &head == b"HTTP/1.1 200"
}

fn fill(yaml: &str, listen: SocketAddr, admin: SocketAddr, mqtt: SocketAddr) -> String {
    yaml.replace("{listen}", &listen.to_string())
        .replace("{admin}", &admin.to_string())
        .replace("{mqtt}", &mqtt.to_string())
}

impl Drop for Portico {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn simple_yaml(balancer: &str, endpoints: &[SocketAddr], extra_cluster: &str) -> String {
    let eps: String = endpoints.iter().map(|a| format!("      - address: \"{a}\"\n")).collect();
    format!(
        "workers: 1\nadmin: {{ address: \"{{admin}}\" }}\nlisteners:\n  - name: web\n    address: \"{{listen}}\"\nroutes:\n  - match: {{ path_prefix: / }}\n    cluster: app\nclusters:\n  app:\n    balancer: {balancer}\n{extra_cluster}    endpoints:\n{eps}"
    )
}

/// Sends raw bytes, returns everything the server sent until it closed (or 5 s passed) and whether it closed.
pub fn raw_exchange(addr: SocketAddr, request: &[u8]) -> (String, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// A minimal blocking HTTP/1.1 client over one keep-alive connection, for tests that need to control the
/// connection (pipelining, reuse). Reads Content-Length or chunked responses.
pub struct Conn<S: Read + Write = TcpStream> {
    pub stream: S,
    buf: Vec<u8>,
}

pub struct Resp {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Conn { stream, buf: Vec::new() }
    }

    /// True when the server has closed the connection (reads EOF within a second).
    pub fn is_closed(&mut self) -> bool {
        self.stream.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut b = [0u8; 1];
        match self.stream.read(&mut b) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    }
}

impl<S: Read + Write> Conn<S> {
    pub fn from_stream(stream: S) -> Conn<S> {
        Conn { stream, buf: Vec::new() }
    }

    pub fn send(&mut self, raw: &[u8]) {
        self.stream.write_all(raw).unwrap();
    }

    pub fn get(&mut self, path: &str, extra_headers: &str) -> Resp {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: test.local\r\n{extra_headers}\r\n").as_bytes());
        self.read_response(false)
    }

    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 65536];
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                self.buf.drain(..i + 2);
                return line;
            }
            assert!(self.fill(), "connection closed while reading a line");
        }
    }

    fn exact(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(self.fill(), "connection closed inside a body");
        }
        self.buf.drain(..n).collect()
    }

    pub fn read_response(&mut self, head_request: bool) -> Resp {
        let mut head = String::new();
        loop {
            let line = self.line();
            if line.is_empty() {
                break;
            }
            head.push_str(&line);
            head.push('\n');
        }
        let status: u16 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status");
        let mut resp = Resp { status, head, body: Vec::new() };
        if head_request || status == 204 || status == 304 || status < 200 {
            return resp;
        }
        if resp.header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().ends_with("chunked")) {
            loop {
                let size = usize::from_str_radix(self.line().split(';').next().unwrap().trim(), 16).unwrap();
                if size == 0 {
                    while !self.line().is_empty() {}
                    break;
                }
                let data = self.exact(size);
                resp.body.extend_from_slice(&data);
                self.exact(2);
            }
        } else if let Some(len) = resp.header("content-length") {
            resp.body = self.exact(len.parse().unwrap());
        } else {
            while self.fill() {}
            resp.body = std::mem::take(&mut self.buf);
        }
        resp
    }
}

/// Runs curl with `args`; returns (exit ok, stdout).
pub fn curl(args: &[&str]) -> (bool, String) {
    let out = Command::new("curl").args(["-sS", "--max-time", "20"]).args(args).output().expect("curl is installed");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `x-backend` header of a GET through `conn`.
pub fn backend_of(conn: &mut Conn, path: &str, extra: &str) -> String {
    let r = conn.get(path, extra);
    assert_eq!(r.status, 200, "{}", r.head);
    r.header("x-backend").expect("x-backend header")
}

/// Polls `f` until it holds, failing the test after `within`.
pub fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Keep-alive GET loops on several connections, until `finish`: a steady load for failure and reload tests.
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<(usize, Vec<String>)>>,
}

impl Load {
    pub fn start(addr: SocketAddr, connections: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..connections)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut conn = Conn::open(addr);
                    let (mut ok, mut failed) = (0, Vec::new());
                    while !stop.load(Ordering::SeqCst) {
                        let r = conn.get("/", "");
                        if r.status == 200 {
                            ok += 1;
                        } else {
                            failed.push(format!("{} {}", r.status, r.text().trim()));
                        }
                        if r.header("connection").is_some_and(|v| v == "close") {
                            conn = Conn::open(addr);
                        }
                    }
                    (ok, failed)
                })
            })
            .collect();
        Load { stop, threads }
    }

    /// Like `start`, with `client_loop`'s clients: a keep-alive connection the server closes while idle is opened
    /// again (for restarts and upgrades, where idle connections are closed on purpose).
    pub fn reconnecting(addr: SocketAddr, connections: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..connections)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || client_loop(addr, stop))
            })
            .collect();
        Load { stop, threads }
    }

    /// Stops the load: the requests that succeeded, and what the others answered.
    pub fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        let (mut ok, mut failed) = (0, Vec::new());
        for t in self.threads {
            let (o, f) = t.join().expect("load thread");
            ok += o;
            failed.extend(f);
        }
        (ok, failed)
    }
}

/// Requests in a loop on keep-alive connections, as an HTTP client library sends them: a connection closed
/// before any byte of its response is opened again and the request sent again (what clients do for idempotent
/// requests); anything else that is not a 200 is a failure, and so is a refused connection (`connect: ...`).
pub fn client_loop(addr: SocketAddr, stop: Arc<AtomicBool>) -> (usize, Vec<String>) {
    let (mut ok, mut failed) = (0usize, Vec::new());
    let mut stream: Option<TcpStream> = None;
    // Whether the connection has answered before: a server may close an idle keep-alive connection, never a new one
    // without an answer.
    let mut answered = false;
    while !stop.load(Ordering::SeqCst) {
        let s = match &mut stream {
            Some(s) => s,
            None => match TcpStream::connect(addr) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    answered = false;
                    stream.insert(s)
                }
                Err(e) => {
                    failed.push(format!("connect: {e}"));
                    continue;
                }
            },
        };
        let mut response = Vec::new();
        let sent = s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").is_ok();
        let mut buf = [0u8; 4096];
        while sent && !(response.windows(4).any(|w| w == b"\r\n\r\n") && response.ends_with(b"\n")) {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => response.extend_from_slice(&buf[..n]),
            }
        }
        let text = String::from_utf8_lossy(&response).to_string();
        if response.is_empty() {
            if !answered {
                failed.push("a new connection was closed without an answer".to_string());
            }
            stream = None; // closed while idle: send again on a new connection
            continue;
        }
        answered = true;
        if text.starts_with("HTTP/1.1 200") {
            ok += 1;
        } else {
            failed.push(text.lines().next().unwrap_or("").to_string());
        }
        if text.to_ascii_lowercase().contains("connection: close") {
            stream = None;
        }
    }
    (ok, failed)
}

/// SIGKILLs every process whose command line contains `needle` (a test's unique configuration path): for the
/// processes an upgrade started, which are not the test's children.
/// Kills, when dropped (also when the test fails), every process started with this configuration file: the
/// processes an upgrade starts are not the test's children.
pub struct KillOnDrop(pub PathBuf);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        kill_processes_with_arg(&self.0.display().to_string());
    }
}

pub fn kill_processes_with_arg(needle: &str) {
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            if let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// An HTTP/2 connection by prior knowledge (h2c) to `addr`, driven on the current runtime.
pub async fn h2c<B>(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

/// Whether `tool` can be run here. When it cannot, a test that needs it is skipped with a line saying so,
/// except under CI (`CI=true`), where the tools are installed by `.ci/install-test-deps` and a missing one is a
/// failure rather than a silent skip.
pub fn have_tool(tool: &str, test: &str) -> bool {
    let found = tool_exists(tool);
    if !found {
        skip_outside_ci(test, &format!("`{tool}` is not installed (`bash .ci/test` installs it)"));
    }
    found
}

/// For a test that cannot run here: says `SKIPPED test: why`, or fails it when `CI` is set (CI provides
/// everything, so a skip there would hide a test that never runs).
pub fn skip_outside_ci(test: &str, why: &str) {
    assert!(std::env::var_os("CI").is_none(), "{test} cannot run under CI: {why}");
    // Past the test harness's capture, so a plain `cargo test` shows what it skipped.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// Whether `tool` is on the PATH.
pub fn tool_exists(tool: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Deno from the PATH or where `.ci/install-test-deps` puts it (the functions tests' reference runtime).
pub fn deno() -> Option<PathBuf> {
    let local = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-tools/node_modules/.bin/deno");
    if local.exists() {
        return Some(local);
    }
    tool_exists("deno").then(|| "deno".into())
}

/// A handler's JSON answer to `path` over HTTP/1.1 (a POST of `body` when there is one); anything but a 200
/// with JSON fails the test.
pub fn ask_json(addr: SocketAddr, path: &str, body: Option<&[u8]>) -> serde_json::Value {
    let mut conn = Conn::open(addr);
    conn.stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let request = match body {
        Some(body) => {
            let mut r =
                format!("POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
            r.extend_from_slice(body);
            r
        }
        None => format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").into_bytes(),
    };
    conn.send(&request);
    let r = conn.read_response(false);
    assert_eq!(r.status, 200, "{addr}{path}: {}", r.text());
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{addr}{path}: {e}: {}", r.text()))
}

/// `data` gunzipped by Python's gzip module (a decoder that is not Portico's).
pub fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut child = Command::new("python3")
        .args(["-c", "import gzip,sys; sys.stdout.buffer.write(gzip.decompress(sys.stdin.buffer.read()))"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdin = child.stdin.take().unwrap();
    let input = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "not gzip ({} bytes)", data.len());
    out.stdout
}
