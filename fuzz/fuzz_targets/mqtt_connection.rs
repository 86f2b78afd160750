//! Arbitrary bytes from a client into the connection driver (`portico_mqtt::serve`), in the pieces the input
//! says, then end of stream: the broker answers what it answers, closes, and never panics or hangs. One
//! broker for the whole run (as in a server, state left by earlier inputs stays: retained messages, persistent
//! sessions), so inputs also meet each other's state.
//!
//! Input: the first byte's low bits choose how the rest is cut into reads (one piece, pieces of 1..=16
//! bytes, or pieces whose lengths the bytes give), so packets also arrive split across reads.
#![no_main]
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use portico_mqtt::{serve, Broker, BrokerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn broker() -> &'static Broker {
    static BROKER: OnceLock<Broker> = OnceLock::new();
    BROKER.get_or_init(|| {
        let mut config = BrokerConfig::default();
        // Small enough that the fuzzer reaches the packet-too-large refusal and full queues.
        config.limits.max_packet_size = 4096;
        config.limits.max_queued_messages = 8;
        config.sys_interval = Duration::ZERO;
        Broker::open(config).expect("a broker in memory opens")
    })
}

fn pieces(data: &[u8]) -> Vec<&[u8]> {
    let Some((&mode, rest)) = data.split_first() else { return Vec::new() };
    let mut out = Vec::new();
    let mut rest = rest;
    while !rest.is_empty() {
        let n = match mode & 3 {
            0 => rest.len(),
            1 => 1 + usize::from(mode >> 4),
            _ => {
                let n = 1 + usize::from(rest[0] % 64);
                rest = &rest[1..];
                n
            }
        };
        let (piece, tail) = rest.split_at(n.min(rest.len()));
        out.push(piece);
        rest = tail;
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let peer = SocketAddr::from(([127, 0, 0, 1], 1883));
        let served = tokio::task::spawn_local(async move {
            let _ = serve(server, peer, broker(), 0).await;
        });
        let (mut read, mut write) = tokio::io::split(&mut client);
        let writing = async {
            for piece in pieces(data) {
                if write.write_all(piece).await.is_err() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            let _ = write.shutdown().await;
        };
        let reading = async {
            let mut sink = vec![0u8; 16 * 1024];
            while matches!(read.read(&mut sink).await, Ok(n) if n > 0) {}
        };
        // The client's end of stream ends every connection (no timer needs to run out): one that is still
        // there after 10 s hangs.
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(writing, reading);
            served.await
        })
        .await;
        assert!(ended.is_ok(), "the connection did not end after the client's end of stream");
    });
});
