//! Arbitrary bytes as what a client sends on an HTTP/2 connection (after a valid preface and SETTINGS, so the
//! fuzzer spends its time on frames), delivered in pieces whose sizes come from the input: the server
//! (`portico_h2::Server`) never panics, every request it accepts is answered (a head, a body, trailers) and
//! its body read, and whatever it writes is a sequence of well-formed frames.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use portico_h2::{Server, Settings};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection in memory: reads come from the input in pieces, writes are collected.
struct Mem {
    input: Vec<Bytes>,
    written: Vec<u8>,
}

impl AsyncRead for Mem {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(mut piece) = this.input.pop() {
            let n = piece.len().min(buf.remaining());
            buf.put_slice(&piece.split_to(n));
            if !piece.is_empty() {
                this.input.push(piece);
            }
        }
        // An empty read is the end of the input: the client closed the connection.
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Mem {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        // At most 1000 bytes a write: the server must cope with short writes.
        let n = buf.len().min(1000);
        self.get_mut().written.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fuzz_target!(|data: &[u8]| {
    // The first byte sizes the pieces the rest arrives in.
    let Some((&size, frames)) = data.split_first() else { return };
    let size = usize::from(size % 64) + 1;
    let mut stream = portico_h2::PREFACE.to_vec();
    stream.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    stream.extend_from_slice(frames);
    let mut input: Vec<Bytes> = Bytes::from(stream).chunks(size).map(Bytes::copy_from_slice).collect();
    input.reverse();
    let io = Mem { input, written: Vec::new() };
    let settings = Settings { max_concurrent_streams: 8, max_header_list_size: 4096, ..Settings::default() };
    let mut server = Server::new(io, Bytes::new(), settings);
    let mut cx = Context::from_waker(Waker::noop());
    let mut streams = Vec::new();
    for _ in 0..10_000 {
        match server.poll_accept(&mut cx) {
            Poll::Ready(Some(Ok((head, mut body, mut respond)))) => {
                let _ = head.into_parts();
                while let Poll::Ready(Some(Ok(_))) = body.poll_data(&mut cx) {}
                let _ = body.poll_trailers(&mut cx);
                if let Ok(mut send) = respond.send_response(http::Response::new(()), false) {
                    if let Poll::Ready(Ok(_)) = send.poll_capacity(&mut cx) {
                        let _ = send.send_data(Bytes::from_static(b"hello"), false);
                    }
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("x-done", http::HeaderValue::from_static("1"));
                    let _ = send.send_trailers(trailers);
                }
                streams.push((body, respond));
            }
            Poll::Ready(_) | Poll::Pending => break,
        }
    }
    drop(streams);
    let _ = server.poll_accept(&mut cx);
    well_formed(&server.get_mut().written);
});

/// The server's output is frames, each under the default maximum size, and starts with SETTINGS. (The last
/// may be cut short: output pending when the client closed is dropped.)
fn well_formed(mut out: &[u8]) {
    assert!(out.len() >= 9 && out[3] == 4, "the server's first frame is not SETTINGS");
    while out.len() >= 9 {
        let length = u32::from_be_bytes([0, out[0], out[1], out[2]]) as usize;
        assert!(length <= 16_384, "a frame over the client's maximum size");
        if out.len() < 9 + length {
            break;
        }
        out = &out[9 + length..];
    }
}
