//! portico-h2's server against the `h2` crate's client, over real TCP connections: requests and bodies in
//! both directions, trailers, flow control with small windows on either side, many concurrent streams,
//! resets, large header blocks and graceful shutdown.

use bytes::Bytes;
use h2::client;
use http::{HeaderMap, Request, Response, StatusCode};
use portico_h2::{RecvStream, RequestHead, SendResponse, Server, Settings};
use std::future::poll_fn;
use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};

/// What the test server does with a request, by path.
async fn handle(head: RequestHead, mut body: RecvStream, mut respond: SendResponse) {
    let path = String::from_utf8(head.path().unwrap().to_vec()).unwrap();
    match path.as_str() {
        // Echoes the body, and the request's trailers as the response's.
        "/echo" => {
            let mut send = respond.send_response(Response::new(()), false).unwrap();
            while let Some(data) = poll_fn(|cx| body.poll_data(cx)).await {
                let Ok(data) = data else { return };
                poll_fn(|cx| send.poll_capacity(cx)).await.unwrap();
                send.send_data(data, false).unwrap();
            }
            match poll_fn(|cx| body.poll_trailers(cx)).await.unwrap() {
                Some(trailers) => send.send_trailers(trailers).unwrap(),
                None => send.send_data(Bytes::new(), true).unwrap(),
            }
        }
        // `n` bytes of a repeating pattern.
        path if path.starts_with("/bytes/") => {
            let n: usize = path[7..].parse().unwrap();
            let pattern: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            let mut pattern = Bytes::from(pattern);
            let mut send = respond.send_response(Response::new(()), n == 0).unwrap();
            while !pattern.is_empty() {
                let Ok(room) = poll_fn(|cx| send.poll_capacity(cx)).await else { return };
                let piece = pattern.split_to(room.min(pattern.len()).min(10_000));
                send.send_data(piece, pattern.is_empty()).unwrap();
            }
        }
        // A head with `n` bytes of fields.
        path if path.starts_with("/fields/") => {
            let n: usize = path[8..].parse().unwrap();
            let mut response = Response::new(());
            for i in 0..n / 1000 {
                response.headers_mut().insert(
                    format!("x-field-{i}").parse::<http::HeaderName>().unwrap(),
                    "v".repeat(990).parse().unwrap(),
                );
            }
            respond.send_response(response, true).unwrap();
        }
        // Never answers until the client resets the stream, then says so on a side channel (the status).
        "/wait" => {
            let reason = poll_fn(|cx| respond.poll_reset(cx)).await.unwrap();
            assert_eq!(reason, portico_h2::Reason::CANCEL);
        }
        _ => {
            let mut response = Response::new(());
            *response.status_mut() = StatusCode::NOT_FOUND;
            respond.send_response(response, true).unwrap();
        }
    }
}

/// Runs `serve` with a listener on a local port, on a thread of its own with a one-thread runtime and its
/// tasks, as Portico's workers run connections.
fn spawn_server<F, Fut>(serve: F) -> SocketAddr
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let std = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            std.set_nonblocking(true).unwrap();
            serve(TcpListener::from_std(std).unwrap()).await;
        });
    });
    addr
}

/// A server on a local port that answers every connection's requests with `handle`.
fn start(settings: Settings) -> SocketAddr {
    spawn_server(|listener| async move {
        loop {
            let (io, _) = listener.accept().await.unwrap();
            let settings = settings.clone();
            tokio::task::spawn_local(async move {
                let mut server = Server::new(io, Bytes::new(), settings);
                while let Some(Ok((head, body, respond))) = poll_fn(|cx| server.poll_accept(cx)).await {
                    tokio::task::spawn_local(handle(head, body, respond));
                }
            });
        }
    })
}

async fn connect(addr: SocketAddr, builder: client::Builder) -> client::SendRequest<Bytes> {
    let io = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = builder.handshake(io).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send.ready().await.unwrap()
}

fn get(path: &str) -> Request<()> {
    Request::get(format!("http://test{path}")).body(()).unwrap()
}

async fn read_all(mut body: h2::RecvStream) -> (Vec<u8>, Option<HeaderMap>) {
    let mut all = Vec::new();
    while let Some(data) = body.data().await {
        let data = data.unwrap();
        let _ = body.flow_control().release_capacity(data.len());
        all.extend_from_slice(&data);
    }
    (all, body.trailers().await.unwrap())
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn answers_a_get() {
    let addr = start(Settings::default());
    let mut send = connect(addr, client::Builder::new()).await;
    let (resp, _) = send.send_request(get("/bytes/5"), true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(read_all(resp.into_body()).await.0, pattern(5));
    let (resp, _) = send.send_request(get("/nothing"), true).unwrap();
    assert_eq!(resp.await.unwrap().status(), 404);
}

#[tokio::test]
async fn echoes_a_large_body_with_trailers_through_small_windows() {
    // Small windows on both sides: every byte waits for WINDOW_UPDATEs in both directions.
    let settings = Settings { initial_stream_window: 16_384, initial_connection_window: 65_535, ..Settings::default() };
    let addr = start(settings);
    let mut builder = client::Builder::new();
    builder.initial_window_size(5_000).initial_connection_window_size(20_000);
    let mut send = connect(addr, builder).await;
    let req = Request::post("http://test/echo").body(()).unwrap();
    let (resp, mut up) = send.send_request(req, false).unwrap();
    let body = pattern(1 << 20);
    let writer = tokio::spawn(async move {
        let mut rest = Bytes::from(body);
        while !rest.is_empty() {
            up.reserve_capacity(rest.len().min(50_000));
            let n = poll_fn(|cx| up.poll_capacity(cx)).await.unwrap().unwrap();
            up.send_data(rest.split_to(n.min(rest.len())), false).unwrap();
        }
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        up.send_trailers(trailers).unwrap();
    });
    let resp = resp.await.unwrap();
    let (echoed, trailers) = read_all(resp.into_body()).await;
    writer.await.unwrap();
    assert_eq!(echoed.len(), 1 << 20);
    assert!(echoed == pattern(1 << 20), "the echoed body differs");
    assert_eq!(trailers.unwrap()["grpc-status"], "0");
}

#[tokio::test]
async fn serves_many_streams_at_once() {
    let addr = start(Settings::default());
    let mut send = connect(addr, client::Builder::new()).await;
    // One request first: by its answer the client has the server's SETTINGS (100 streams at most), and
    // queues what is over the limit instead of having it refused.
    let (resp, _) = send.send_request(get("/bytes/1"), true).unwrap();
    resp.await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..200usize {
        let send = send.clone();
        tasks.push(tokio::spawn(async move {
            let mut send = send.ready().await.unwrap();
            let n = (i * 997) % 70_000;
            let (resp, _) = send.send_request(get(&format!("/bytes/{n}")), true).unwrap();
            let resp = resp.await.unwrap();
            assert_eq!(read_all(resp.into_body()).await.0, pattern(n));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn a_large_head_goes_out_in_continuation_frames() {
    let addr = start(Settings::default());
    let mut builder = client::Builder::new();
    builder.max_header_list_size(1 << 20);
    let mut send = connect(addr, builder).await;
    let (resp, _) = send.send_request(get("/fields/40000"), true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.headers().len(), 40);
    assert_eq!(resp.headers()["x-field-39"].len(), 990);
}

#[tokio::test]
async fn a_reset_reaches_the_handler() {
    let addr = start(Settings::default());
    let mut send = connect(addr, client::Builder::new()).await;
    let (resp, mut stream) = send.send_request(get("/wait"), false).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    stream.send_reset(h2::Reason::CANCEL);
    drop(resp);
    // The connection still serves.
    let (resp, _) = send.send_request(get("/bytes/3"), true).unwrap();
    assert_eq!(resp.await.unwrap().status(), 200);
}

/// Raw frames, for what a well-behaved client library cannot be made to send.
mod raw {
    use super::*;
    use bytes::{BufMut, BytesMut};
    use std::io::{Read, Write};

    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        let len = (payload.len() as u32).to_be_bytes();
        out.put_slice(&[len[1], len[2], len[3], kind, flags]);
        out.put_u32(stream);
        out.put_slice(payload);
        out.to_vec()
    }

    pub fn get_block() -> Vec<u8> {
        let mut e = portico_h2::hpack::Encoder::new();
        let mut block = BytesMut::new();
        for (n, v) in [(":method", "GET"), (":scheme", "http"), (":path", "/bytes/1"), (":authority", "t")] {
            e.field(n.as_bytes(), v.as_bytes(), false, &mut block);
        }
        block.to_vec()
    }

    /// Reads frames until the server closes; returns the GOAWAY's error code if one came.
    pub fn goaway_code(s: &mut std::net::TcpStream) -> Option<u32> {
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mut code = None;
        loop {
            let mut head = [0u8; 9];
            if s.read_exact(&mut head).is_err() {
                return code;
            }
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0; len];
            if s.read_exact(&mut payload).is_err() {
                return code;
            }
            if head[3] == 7 {
                code = Some(u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]));
            }
        }
    }

    pub fn open(addr: SocketAddr) -> std::net::TcpStream {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(portico_h2::PREFACE).unwrap();
        s.write_all(&frame(4, 0, 0, &[])).unwrap();
        s
    }

    /// Streams the client makes the server reset (here with WINDOW_UPDATEs of 0) count against the same
    /// budget as streams it resets itself (CVE-2025-8671): the connection ends with ENHANCE_YOUR_CALM.
    #[test]
    fn streams_reset_for_the_clients_errors_are_limited() {
        let addr = start(Settings::default());
        let mut s = open(addr);
        let block = get_block();
        let mut burst = Vec::new();
        for i in 0..1000u32 {
            let id = 2 * i + 1;
            burst.extend(frame(1, 0x4, id, &block)); // HEADERS, END_HEADERS, no END_STREAM
            burst.extend(frame(8, 0, id, &[0, 0, 0, 0])); // WINDOW_UPDATE 0: a stream error
        }
        let _ = s.write_all(&burst);
        assert_eq!(goaway_code(&mut s), Some(0xb), "no ENHANCE_YOUR_CALM");
    }

    /// After the server's GOAWAY, frames the client had in flight for streams above its last id are ignored:
    /// the streams below it finish, and the connection is not failed.
    #[test]
    fn frames_after_a_goaway_for_unprocessed_streams_are_ignored() {
        let addr = spawn_server(|listener| async move {
            let (io, _) = listener.accept().await.unwrap();
            let mut server = Server::new(io, Bytes::new(), Settings::default());
            // The first request is accepted, then the server shuts down gracefully before answering it.
            let Some(Ok((head, body, respond))) = poll_fn(|cx| server.poll_accept(cx)).await else { return };
            server.graceful_shutdown();
            tokio::task::spawn_local(async move {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                handle(head, body, respond).await;
            });
            while let Some(Ok(_)) = poll_fn(|cx| server.poll_accept(cx)).await {}
        });
        let mut s = open(addr);
        s.write_all(&frame(1, 0x5, 1, &get_block())).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Stream 3, sent as if before the GOAWAY arrived: HEADERS then DATA.
        let mut late = frame(1, 0x4, 3, &get_block());
        late.extend(frame(0, 0x1, 3, b"late"));
        s.write_all(&late).unwrap();
        // The connection ends cleanly (GOAWAY NO_ERROR only) once stream 1 is answered.
        assert_eq!(goaway_code(&mut s), Some(0));
    }
}

mod floods {
    use super::raw::*;
    use super::*;
    use std::io::Write;

    /// A client that sends only frames that do nothing (here PINGs) is disconnected with ENHANCE_YOUR_CALM
    /// (CVE-2019-9518).
    #[test]
    fn frames_that_do_nothing_are_limited() {
        let addr = start(Settings::default());
        let mut s = open(addr);
        let mut burst = Vec::new();
        for i in 0..10_050u64 {
            burst.extend(frame(6, 0, 0, &i.to_be_bytes()));
        }
        let _ = s.write_all(&burst);
        assert_eq!(goaway_code(&mut s), Some(0xb), "no ENHANCE_YOUR_CALM");
    }

    /// Even stream ids are the server's, which opens none: DATA on one is a connection error.
    #[test]
    fn data_on_an_even_stream_is_a_protocol_error() {
        let addr = start(Settings::default());
        let mut s = open(addr);
        // Streams 1 and 3 first, so that 2 is below the last stream the client opened.
        let mut frames = frame(1, 0x5, 1, &get_block());
        frames.extend(frame(1, 0x5, 3, &get_block()));
        frames.extend(frame(0, 0, 2, b"x"));
        s.write_all(&frames).unwrap();
        assert_eq!(goaway_code(&mut s), Some(0x1));
    }
}

mod half_close {
    use super::raw::*;
    use super::*;
    use std::io::{Read, Write};

    /// A client that sends its request and then closes its sending side still gets the answer, then the
    /// connection ends.
    #[test]
    fn a_request_sent_before_a_half_close_is_answered() {
        let addr = start(Settings::default());
        let mut s = open(addr);
        s.write_all(&frame(1, 0x5, 1, &get_block())).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        // Frames: SETTINGS..., then HEADERS and DATA with END_STREAM for stream 1.
        let (mut at, mut ended) = (0, false);
        while at + 9 <= all.len() {
            let len = u32::from_be_bytes([0, all[at], all[at + 1], all[at + 2]]) as usize;
            let (kind, flags) = (all[at + 3], all[at + 4]);
            let stream = u32::from_be_bytes([all[at + 5], all[at + 6], all[at + 7], all[at + 8]]);
            if kind == 0 && stream == 1 && flags & 1 != 0 {
                ended = true;
            }
            at += 9 + len;
        }
        assert!(ended, "no complete answer before the close: {all:?}");
    }
}
