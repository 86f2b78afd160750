//! Streaming a body from one socket to another: decode the source framing, re-encode or pass through, hold at
//! most a bounded amount, gather small pieces into one write.

use crate::codec::{self, BodyFraming, ChunkedDecoder, Decoded};
use bytes::{Buf, BytesMut};
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;

/// Read size and the most body data held at once per direction: the memory bound of a streamed body.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

pub(crate) enum RelayError {
    /// Reading the source failed: closed early, timed out or malformed framing.
    Source(SourceFault),
    /// Writing to the destination failed.
    Dest,
}

/// Streams one body from `src` to `dst`, decoding `framing` and, when `out_chunked`, re-encoding it chunked.
///
/// `pending` may hold bytes to send first (the response head): output is gathered there while the source has
/// data buffered and written only before the relay would wait for more, or once `COALESCE` bytes are
/// pending, so a small response goes out in one write with its head. At most `READ_CHUNK` bytes are read
/// ahead and `COALESCE` plus one piece held for writing.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn relay_body<R, W>(
    src: &mut R,
    src_buf: &mut BytesMut,
    framing: BodyFraming,
    dst: &mut W,
    out_chunked: bool,
    read_pace: &mut Pace,
    write_timeout: Duration,
    pending: &mut Vec<u8>,
) -> Result<u64, RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut out = Output { dst, pending, chunked: out_chunked, timeout: write_timeout };
    let mut total = 0u64;
    match framing {
        BodyFraming::None => {}
        BodyFraming::Length(n) => {
            let mut left = n;
            while left > 0 {
                if src_buf.is_empty() {
                    out.flush().await?;
                    if read_more(src, src_buf, read_pace).await? == 0 {
                        return Err(RelayError::Source(SourceFault::Closed));
                    }
                }
                let take = (left.min(src_buf.len() as u64)) as usize;
                read_pace.inspect(&src_buf[..take])?;
                out.piece(&src_buf[..take]).await?;
                src_buf.advance(take);
                left -= take as u64;
                total += take as u64;
            }
        }
        BodyFraming::Chunked => {
            let mut decoder = ChunkedDecoder::default();
            loop {
                match decoder.decode(src_buf, READ_CHUNK).map_err(|e| RelayError::Source(SourceFault::Malformed(e)))? {
                    Decoded::Data(bytes) => {
                        total += bytes.len() as u64;
                        read_pace.inspect(&bytes)?;
                        out.piece(&bytes).await?;
                    }
                    Decoded::NeedMore => {
                        out.flush().await?;
                        if read_more(src, src_buf, read_pace).await? == 0 {
                            return Err(RelayError::Source(SourceFault::Closed));
                        }
                    }
                    Decoded::Done => break,
                }
            }
        }
        BodyFraming::UntilClose => loop {
            if src_buf.is_empty() {
                out.flush().await?;
                if read_more(src, src_buf, read_pace).await? == 0 {
                    break;
                }
            }
            let take = src_buf.len();
            read_pace.inspect(&src_buf[..take])?;
            out.piece(&src_buf[..take]).await?;
            src_buf.advance(take);
            total += take as u64;
        },
    }
    if out_chunked && framing != BodyFraming::None {
        out.pending.extend_from_slice(codec::LAST_CHUNK);
    }
    out.flush().await?;
    Ok(total)
}

/// Most bytes gathered before a write; larger pieces are written on their own, uncopied.
const COALESCE: usize = 16 * 1024;

/// The writing side of a relay: gathers small pieces, frames them when chunked.
struct Output<'a, W> {
    dst: &'a mut W,
    pending: &'a mut Vec<u8>,
    chunked: bool,
    timeout: Duration,
}

impl<W: AsyncWrite + Unpin> Output<'_, W> {
    async fn piece(&mut self, data: &[u8]) -> Result<(), RelayError> {
        if data.is_empty() {
            return Ok(());
        }
        if self.pending.len() + data.len() > COALESCE {
            self.flush().await?;
            if !self.chunked {
                return write_timed(self.dst, data, self.timeout).await.map_err(|_| RelayError::Dest);
            }
        }
        if self.chunked {
            codec::chunk_header(self.pending, data.len());
            self.pending.extend_from_slice(data);
            self.pending.extend_from_slice(b"\r\n");
        } else {
            self.pending.extend_from_slice(data);
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), RelayError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let result = write_timed(self.dst, self.pending, self.timeout).await;
        self.pending.clear();
        result.map_err(|_| RelayError::Dest)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SourceFault {
    Closed,
    /// Nothing arrived for the whole idle timeout.
    TimedOut,
    /// The body came slower on average than the listener's `limits.min_body_rate`.
    TooSlow,
    Malformed(&'static str),
    /// A buffered body's temporary file could not be read back.
    Unreadable,
    /// A `limits` filter refused the body as it arrived.
    Refused(crate::body_check::Refusal),
}

impl SourceFault {
    /// The answer to a client whose request body failed this way; `None` when it left.
    pub fn answer(self) -> Option<(u16, &'static str)> {
        match self {
            SourceFault::Closed => None,
            SourceFault::TimedOut => Some((408, "request body not received in time")),
            SourceFault::TooSlow => Some((408, "request body arrived slower than the listener's min_body_rate")),
            SourceFault::Malformed(reason) => Some((400, reason)),
            SourceFault::Unreadable => Some((500, "request body could not be read back from its temporary file")),
            SourceFault::Refused(r) => Some((r.status, r.reason)),
        }
    }
}

/// How a body must keep arriving: no wait for bytes longer than `idle`, and, for a request body, on average
/// at least `min_rate` bytes a second of waiting once `grace` of waiting has passed (Kestrel's
/// MinRequestBodyDataRate). Only time spent waiting for the source counts: a relay that waits for its
/// destination to take the bytes is not the client's fault. Copied per body; it keeps that body's tally.
/// It also carries what a `limits` filter checks of a request body (`checked`), fed the decoded bytes.
#[derive(Debug, Clone)]
pub(crate) struct Pace {
    idle: Duration,
    /// Bytes a second; 0: no rate.
    min_rate: u64,
    grace: Duration,
    waited: Duration,
    received: u64,
    check: Option<std::sync::Arc<crate::body_check::BodyCheck>>,
}

impl Pace {
    /// Only the idle timeout (response bodies, and request bodies with the rate turned off).
    pub fn idle(idle: Duration) -> Pace {
        Pace { idle, min_rate: 0, grace: Duration::ZERO, waited: Duration::ZERO, received: 0, check: None }
    }

    /// This pace, for the body of `head`: with the check a `limits` filter put on it, if one did.
    pub fn checked(&self, head: &crate::codec::RequestHead) -> Pace {
        Pace { check: crate::body_check::BodyCheck::of(head), ..self.clone() }
    }

    /// Feeds decoded body bytes to the body's check.
    pub fn inspect(&self, data: &[u8]) -> Result<(), RelayError> {
        match &self.check {
            None => Ok(()),
            Some(check) => check.feed(data).map_err(|r| RelayError::Source(SourceFault::Refused(r))),
        }
    }

    pub fn request(idle: Duration, min_rate: u64, grace: Duration) -> Pace {
        Pace { min_rate, grace, ..Pace::idle(idle) }
    }

    /// How long the next wait may last, and what it is when it runs out.
    fn allowance(&self) -> (Duration, SourceFault) {
        if self.min_rate == 0 {
            return (self.idle, SourceFault::TimedOut);
        }
        // The waiting that `received` bytes pay for at the minimum rate, and never less than the grace.
        let earned = Duration::from_secs_f64(self.received as f64 / self.min_rate as f64).max(self.grace);
        let left = earned.saturating_sub(self.waited);
        if left < self.idle {
            (left, SourceFault::TooSlow)
        } else {
            (self.idle, SourceFault::TimedOut)
        }
    }

    /// Waits for `read` within the allowance and keeps the tally.
    pub async fn read<F: std::future::Future<Output = io::Result<usize>>>(
        &mut self,
        read: F,
    ) -> Result<usize, SourceFault> {
        let (allowed, fault) = self.allowance();
        let started = tokio::time::Instant::now();
        let result = timeout(allowed, read).await;
        self.waited += started.elapsed();
        match result {
            Ok(Ok(n)) => {
                self.received += n as u64;
                Ok(n)
            }
            Ok(Err(_)) => Err(SourceFault::Closed),
            Err(_) => Err(fault),
        }
    }
}

pub(crate) async fn read_more<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut BytesMut,
    pace: &mut Pace,
) -> Result<usize, RelayError> {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
    pace.read(src.read_buf(buf)).await.map_err(RelayError::Source)
}

pub(crate) async fn write_timed<W: AsyncWrite + Unpin>(dst: &mut W, data: &[u8], t: Duration) -> io::Result<()> {
    // The flush matters for TLS: a record left in the session would otherwise wait for the next write.
    let write = async {
        dst.write_all(data).await?;
        dst.flush().await
    };
    match timeout(t, write).await {
        Ok(r) => r,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}
