//! mqtt-load: the load generator of bench/mqtt.py. MQTT 3.1.1 over raw TCP (a minimal codec: CONNECT, SUBSCRIBE,
//! PUBLISH, PUBACK), on tokio, so that the client side costs little next to the broker.
//!
//!   mqtt-load --port 1883 --mode fanin --pubs 50 --subs 1 --qos 1 --size 64 --duration 10
//!   mqtt-load --port 1883 --mode idle --clients 10000
//!
//! Modes: `fanin` (N publishers on topics bench/in/<i>, one subscriber on bench/in/+), `fanout` (one publisher on
//! bench/out, N subscribers), `m2m` (N publishers and N subscribers in `--groups` groups: publisher i sends on
//! bench/m/<i mod groups>, subscriber j listens on bench/m/<j mod groups>), `idle` (N connected clients, each with
//! one subscription, that do nothing).
//!
//! Latency is end to end: every payload starts with the send time (nanoseconds since the start of this process,
//! one clock for publishers and subscribers) and the subscriber takes it from its receive time.
//!
//! Flow control: the publishers keep at most `--window` messages in flight end to end (published and not yet
//! received by every subscriber), and a QoS 1 publisher at most `--inflight` unacknowledged PUBLISHes. So the run
//! measures the broker's throughput without unbounded queues (and without the drops a full queue makes), and the
//! latency is that of a broker kept busy with `--window` messages in flight.
//!
//! Output: `START` and `END` lines at the edges of the measured interval (after `--warmup` seconds), so that the
//! caller reads the broker's CPU time from /proc at the same moments; then one JSON line with the results.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[derive(Clone, Debug)]
struct Args {
    host: String,
    port: u16,
    mode: String,
    pubs: usize,
    subs: usize,
    groups: usize,
    clients: usize,
    qos: u8,
    size: usize,
    duration: f64,
    warmup: f64,
    window: u64,
    inflight: u64,
    threads: usize,
    persistent: bool,
    prefix: String,
}

fn parse_args() -> Args {
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 1883,
        mode: "fanin".into(),
        pubs: 1,
        subs: 1,
        groups: 10,
        clients: 10000,
        qos: 0,
        size: 64,
        duration: 10.0,
        warmup: 2.0,
        window: 0,
        inflight: 64,
        threads: 1,
        persistent: false,
        prefix: "b".into(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let k = argv[i].as_str();
        if k == "--persistent" {
            a.persistent = true;
            i += 1;
            continue;
        }
        let v = argv.get(i + 1).cloned().unwrap_or_else(|| panic!("{k} needs a value"));
        match k {
            "--host" => a.host = v,
            "--port" => a.port = v.parse().unwrap(),
            "--mode" => a.mode = v,
            "--pubs" => a.pubs = v.parse().unwrap(),
            "--subs" => a.subs = v.parse().unwrap(),
            "--groups" => a.groups = v.parse().unwrap(),
            "--clients" => a.clients = v.parse().unwrap(),
            "--qos" => a.qos = v.parse().unwrap(),
            "--size" => a.size = v.parse().unwrap(),
            "--duration" => a.duration = v.parse().unwrap(),
            "--warmup" => a.warmup = v.parse().unwrap(),
            "--window" => a.window = v.parse().unwrap(),
            "--inflight" => a.inflight = v.parse().unwrap(),
            "--threads" => a.threads = v.parse().unwrap(),
            "--prefix" => a.prefix = v,
            _ => panic!("unknown option {k}"),
        }
        i += 2;
    }
    assert!(a.size >= 8, "--size: at least 8 bytes (the timestamp)");
    a
}

// ------------------------------------------------------------------------------------------------ codec
fn put_varint(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            break;
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s);
}

fn connect_packet(client_id: &str, clean: bool) -> Vec<u8> {
    let mut body = Vec::new();
    put_str(&mut body, b"MQTT");
    body.push(4); // 3.1.1
    body.push(if clean { 0x02 } else { 0x00 });
    body.extend_from_slice(&0u16.to_be_bytes()); // keep-alive off
    put_str(&mut body, client_id.as_bytes());
    let mut out = vec![0x10];
    put_varint(&mut out, body.len());
    out.extend_from_slice(&body);
    out
}

fn subscribe_packet(topic: &str, qos: u8) -> Vec<u8> {
    let mut body = 1u16.to_be_bytes().to_vec();
    put_str(&mut body, topic.as_bytes());
    body.push(qos);
    let mut out = vec![0x82];
    put_varint(&mut out, body.len());
    out.extend_from_slice(&body);
    out
}

fn put_publish(out: &mut Vec<u8>, topic: &[u8], qos: u8, pid: u16, payload_len: usize, stamp: u64) {
    out.push(0x30 | (qos << 1));
    let len = 2 + topic.len() + if qos > 0 { 2 } else { 0 } + payload_len;
    put_varint(out, len);
    put_str(out, topic);
    if qos > 0 {
        out.extend_from_slice(&pid.to_be_bytes());
    }
    out.extend_from_slice(&stamp.to_be_bytes());
    out.resize(out.len() + payload_len - 8, b'x');
}

/// One whole packet at the front of `buf`: (first byte, header length, body length).
fn frame(buf: &[u8]) -> Option<(u8, usize, usize)> {
    let mut len = 0usize;
    let mut mult = 1usize;
    for i in 1..5 {
        let b = *buf.get(i)?;
        len += (b & 0x7f) as usize * mult;
        mult *= 128;
        if b & 0x80 == 0 {
            return if buf.len() >= 1 + i + len { Some((buf[0], 1 + i, len)) } else { None };
        }
    }
    panic!("malformed remaining length")
}

/// Connects and waits for CONNACK (and, with a topic, SUBSCRIBE and SUBACK).
async fn open(a: &Args, id: &str, clean: bool, sub: Option<(&str, u8)>) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect((a.host.as_str(), a.port)).await?;
    s.set_nodelay(true)?;
    let mut out = connect_packet(id, clean);
    if let Some((topic, qos)) = sub {
        out.extend_from_slice(&subscribe_packet(topic, qos));
    }
    s.write_all(&out).await?;
    let want = if sub.is_some() { 2 } else { 1 };
    let mut got = 0;
    let mut buf = Vec::new();
    let mut tmp = [0u8; 256];
    while got < want {
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return Err(std::io::Error::other("closed during CONNECT/SUBSCRIBE"));
        }
        buf.extend_from_slice(&tmp[..n]);
        while let Some((first, h, l)) = frame(&buf) {
            match first >> 4 {
                2 if buf[h + 1] != 0 => return Err(std::io::Error::other(format!("CONNACK {}", buf[h + 1]))),
                9 if buf[h + 2] == 0x80 => return Err(std::io::Error::other("SUBACK failure")),
                _ => {}
            }
            got += 1;
            buf.drain(..h + l);
        }
    }
    Ok(s)
}

// ------------------------------------------------------------------------------------------------ shared state
/// Latency histogram: log buckets, about 2% wide, over microseconds.
struct Hist(Vec<u64>);
const BUCKETS: usize = 1200;
impl Hist {
    fn new() -> Self {
        Hist(vec![0; BUCKETS])
    }
    fn add(&mut self, us: f64) {
        let b = ((us.max(1.0)).ln() * 50.0) as usize;
        self.0[b.min(BUCKETS - 1)] += 1;
    }
    fn merge(&mut self, o: &Hist) {
        for (x, y) in self.0.iter_mut().zip(&o.0) {
            *x += y;
        }
    }
    fn quantile(&self, q: f64) -> f64 {
        let total: u64 = self.0.iter().sum();
        if total == 0 {
            return f64::NAN;
        }
        let want = (total as f64 * q).ceil() as u64;
        let mut acc = 0;
        for (i, c) in self.0.iter().enumerate() {
            acc += c;
            if acc >= want {
                return ((i as f64 + 0.5) / 50.0).exp();
            }
        }
        f64::NAN
    }
}

struct Shared {
    /// Deliveries expected: messages published times the subscribers each reaches.
    expected: AtomicU64,
    delivered: AtomicU64,
    published: AtomicU64,
    measuring: AtomicBool,
    measure_from: AtomicU64,
    stop: AtomicBool,
    progress: Notify,
    hist: Mutex<Hist>,
    stalls: AtomicU64,
}

async fn subscriber(mut s: TcpStream, sh: Arc<Shared>) {
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
    let mut tmp = vec![0u8; 1 << 16];
    let mut acks = Vec::new();
    let mut hist = Hist::new();
    loop {
        let n = match tokio::time::timeout(Duration::from_millis(200), s.read(&mut tmp)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => n,
            Err(_) => {
                if sh.stop.load(Relaxed) {
                    break;
                }
                continue;
            }
        };
        buf.extend_from_slice(&tmp[..n]);
        let now = now_ns();
        let measuring = sh.measuring.load(Relaxed);
        let from = sh.measure_from.load(Relaxed);
        let mut off = 0;
        let mut count = 0;
        while let Some((first, h, l)) = frame(&buf[off..]) {
            if first >> 4 == 3 {
                let p = off + h;
                let tlen = u16::from_be_bytes([buf[p], buf[p + 1]]) as usize;
                let qos = (first >> 1) & 3;
                let mut q = p + 2 + tlen;
                if qos > 0 {
                    acks.extend_from_slice(&[0x40, 2, buf[q], buf[q + 1]]);
                    q += 2;
                }
                let stamp = u64::from_be_bytes(buf[q..q + 8].try_into().unwrap());
                if measuring && stamp >= from {
                    hist.add(now.saturating_sub(stamp) as f64 / 1000.0);
                }
                count += 1;
            }
            off += h + l;
        }
        buf.drain(..off);
        if count > 0 {
            sh.delivered.fetch_add(count, Relaxed);
            sh.progress.notify_waiters();
        }
        if !acks.is_empty() {
            if s.write_all(&acks).await.is_err() {
                break;
            }
            acks.clear();
        }
    }
    sh.hist.lock().unwrap().merge(&hist);
}

async fn publisher(s: TcpStream, topic: String, reach: u64, sh: Arc<Shared>, a: Args) {
    let (mut rd, mut wr) = s.into_split();
    let acked = Arc::new(AtomicU64::new(0));
    let ack_notify = Arc::new(Notify::new());
    if a.qos > 0 {
        let (acked, ack_notify) = (acked.clone(), ack_notify.clone());
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut tmp = vec![0u8; 1 << 14];
            while let Ok(n) = rd.read(&mut tmp).await {
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&tmp[..n]);
                let mut off = 0;
                let mut c = 0;
                while let Some((first, h, l)) = frame(&buf[off..]) {
                    if first >> 4 == 4 {
                        c += 1;
                    }
                    off += h + l;
                }
                buf.drain(..off);
                acked.fetch_add(c, Relaxed);
                ack_notify.notify_waiters();
            }
        });
    }
    let topic = topic.into_bytes();
    let window = a.window * reach;
    let mut sent: u64 = 0;
    let mut pid: u16 = 0;
    let mut out = Vec::with_capacity(64 * (a.size + 32));
    while !sh.stop.load(Relaxed) {
        // End-to-end window: wait while too much is published and not yet delivered.
        loop {
            let wait = sh.progress.notified();
            tokio::pin!(wait);
            wait.as_mut().enable();
            let outstanding = sh.expected.load(Relaxed).saturating_sub(sh.delivered.load(Relaxed));
            if outstanding < window || sh.stop.load(Relaxed) {
                break;
            }
            if tokio::time::timeout(Duration::from_millis(500), wait).await.is_err() {
                sh.stalls.fetch_add(1, Relaxed); // something was lost: go on rather than wedge
                break;
            }
        }
        // QoS 1: at most `inflight` unacknowledged.
        let mut room = 16u64;
        if a.qos > 0 {
            loop {
                let wait = ack_notify.notified();
                tokio::pin!(wait);
                wait.as_mut().enable();
                let free = a.inflight.saturating_sub(sent - acked.load(Relaxed));
                if free > 0 || sh.stop.load(Relaxed) {
                    room = room.min(free.max(1));
                    break;
                }
                let _ = tokio::time::timeout(Duration::from_millis(500), wait).await;
            }
        }
        out.clear();
        let stamp = now_ns();
        for _ in 0..room {
            pid = pid.wrapping_add(1).max(1);
            put_publish(&mut out, &topic, a.qos, pid, a.size, stamp);
        }
        sh.expected.fetch_add(room * reach, Relaxed);
        if wr.write_all(&out).await.is_err() {
            break;
        }
        sent += room;
        sh.published.fetch_add(room, Relaxed);
    }
}

async fn idle(a: Args) {
    let sem = Arc::new(tokio::sync::Semaphore::new(200));
    let mut tasks = Vec::new();
    let conns = Arc::new(Mutex::new(Vec::with_capacity(a.clients)));
    let t0 = Instant::now();
    for i in 0..a.clients {
        let (a, sem, conns) = (a.clone(), sem.clone(), conns.clone());
        tasks.push(tokio::spawn(async move {
            let _p = sem.acquire().await.unwrap();
            let id = format!("{}-idle-{i}", a.prefix);
            let topic = format!("idle/{i}");
            match open(&a, &id, true, Some((&topic, 0))).await {
                Ok(s) => conns.lock().unwrap().push(s),
                Err(e) => eprintln!("idle client {i}: {e}"),
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let n = conns.lock().unwrap().len();
    println!("READY {n} {:.1}", t0.elapsed().as_secs_f64());
    std::io::stdout().flush().unwrap();
    // Until stdin closes (the caller is done measuring).
    let _ = tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        while std::io::stdin().read_line(&mut s).map(|n| n > 0).unwrap_or(false) {}
    })
    .await;
    drop(conns);
}

async fn traffic(a: Args) {
    let sh = Arc::new(Shared {
        expected: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        published: AtomicU64::new(0),
        measuring: AtomicBool::new(false),
        measure_from: AtomicU64::new(u64::MAX),
        stop: AtomicBool::new(false),
        progress: Notify::new(),
        hist: Mutex::new(Hist::new()),
        stalls: AtomicU64::new(0),
    });
    let sub_qos = a.qos;
    let clean = !a.persistent;
    // (publisher topic, subscribers it reaches), and subscriber topics.
    let (pubs, subs): (Vec<(String, u64)>, Vec<String>) = match a.mode.as_str() {
        "fanin" => (
            (0..a.pubs).map(|i| (format!("bench/in/{i}"), a.subs as u64)).collect(),
            (0..a.subs).map(|_| "bench/in/+".to_string()).collect(),
        ),
        "fanout" => (vec![("bench/out".to_string(), a.subs as u64)], (0..a.subs).map(|_| "bench/out".into()).collect()),
        "m2m" => {
            let g = a.groups;
            let per_group = |k: usize| (0..a.subs).filter(|j| j % g == k).count() as u64;
            (
                (0..a.pubs).map(|i| (format!("bench/m/{}", i % g), per_group(i % g))).collect(),
                (0..a.subs).map(|j| format!("bench/m/{}", j % g)).collect(),
            )
        }
        m => panic!("unknown mode {m}"),
    };
    let default_window = match a.mode.as_str() {
        "fanout" => 10,
        _ => 200,
    };
    let a = Args { window: if a.window == 0 { default_window } else { a.window }, ..a };
    let mut sub_tasks = Vec::new();
    for (j, topic) in subs.iter().enumerate() {
        let s = open(&a, &format!("{}-sub-{j}", a.prefix), clean, Some((topic, sub_qos))).await.expect("subscriber");
        sub_tasks.push(tokio::spawn(subscriber(s, sh.clone())));
    }
    let mut pub_tasks = Vec::new();
    for (i, (topic, reach)) in pubs.into_iter().enumerate() {
        let s = open(&a, &format!("{}-pub-{i}", a.prefix), true, None).await.expect("publisher");
        // The window is shared: every publisher checks the total in flight.
        pub_tasks.push(tokio::spawn(publisher(s, topic, reach, sh.clone(), a.clone())));
    }
    tokio::time::sleep(Duration::from_secs_f64(a.warmup)).await;
    sh.measure_from.store(now_ns(), Relaxed);
    sh.measuring.store(true, Relaxed);
    let d0 = sh.delivered.load(Relaxed);
    let p0 = sh.published.load(Relaxed);
    let t0 = Instant::now();
    println!("START");
    std::io::stdout().flush().unwrap();
    tokio::time::sleep(Duration::from_secs_f64(a.duration)).await;
    let d1 = sh.delivered.load(Relaxed);
    let p1 = sh.published.load(Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    sh.measuring.store(false, Relaxed);
    println!("END");
    std::io::stdout().flush().unwrap();
    sh.stop.store(true, Relaxed);
    for t in pub_tasks {
        let _ = t.await;
    }
    // Let what is in flight arrive, then stop the subscribers.
    let deadline = Instant::now() + Duration::from_secs(3);
    while sh.delivered.load(Relaxed) < sh.expected.load(Relaxed) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for t in sub_tasks {
        let _ = t.await;
    }
    let h = sh.hist.lock().unwrap();
    println!(
        "{{\"delivered\": {}, \"published\": {}, \"seconds\": {:.3}, \"delivered_per_s\": {:.0}, \"published_per_s\": {:.0}, \
         \"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"p999_ms\": {:.3}, \"lost\": {}, \"stalls\": {}}}",
        d1 - d0,
        p1 - p0,
        secs,
        (d1 - d0) as f64 / secs,
        (p1 - p0) as f64 / secs,
        h.quantile(0.5) / 1000.0,
        h.quantile(0.99) / 1000.0,
        h.quantile(0.999) / 1000.0,
        sh.expected.load(Relaxed).saturating_sub(sh.delivered.load(Relaxed)),
        sh.stalls.load(Relaxed),
    );
}

fn main() {
    let a = parse_args();
    now_ns();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(a.threads).enable_all().build().unwrap();
    if a.mode == "idle" {
        rt.block_on(idle(a));
    } else {
        rt.block_on(traffic(a));
    }
}
