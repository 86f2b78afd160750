//! Request buffering (a route's `request_buffering`): a request body is read whole from the client before an
//! upstream connection is taken, so a client that sends slowly holds its own connection only, never an
//! upstream's (nginx's `proxy_request_buffering`). Up to `memory` bytes stay in memory; a larger body goes to
//! an unnamed temporary file (nothing to clean up, even after a crash), written and read back on tokio's
//! blocking pool so that a worker never waits for the disk. A buffered body has a known length, leaves with a
//! `content-length` whatever framing it came with, and can be sent again when a request is retried.

use crate::codec::{BodyFraming, ChunkedDecoder, Decoded};
use crate::relay::{read_more, write_timed, Pace, RelayError, SourceFault};
use bytes::{Bytes, BytesMut};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// A route's buffering, compiled from its `request_buffering`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferPolicy {
    /// Bodies up to this size stay in memory.
    pub memory: usize,
    /// Larger bodies are refused with 413.
    pub max_size: u64,
    pub temp_dir: PathBuf,
}

impl BufferPolicy {
    pub fn from_config(
        config: &portico_config::RequestBuffering,
        loaded: &portico_config::LoadedConfig,
    ) -> BufferPolicy {
        BufferPolicy {
            memory: config.memory().as_usize(),
            max_size: config.max_size.0,
            temp_dir: config.temp_dir.as_ref().map_or_else(std::env::temp_dir, |dir| loaded.resolve(dir)),
        }
    }

    /// Pieces written to the file at once: the memory setting, within bounds that keep the number of trips to
    /// the blocking pool and the memory held per request both small.
    fn write_batch(&self) -> usize {
        self.memory.clamp(16 * 1024, 256 * 1024)
    }
}

/// A body read whole.
pub(crate) enum Buffered {
    Memory(Bytes),
    File(SpooledBody),
}

/// A body in a temporary file; the file goes when the last clone does.
#[derive(Clone)]
pub(crate) struct SpooledBody {
    file: Arc<std::fs::File>,
    len: u64,
}

/// Why a body could not be buffered.
#[derive(Debug)]
pub(crate) enum BufferFault {
    /// Above the route's `max_size`.
    TooLarge,
    Source(SourceFault),
    /// The temporary file could not be made or written (logged where it happened).
    Disk,
}

impl BufferFault {
    /// The answer to the client; `None` when it left.
    pub fn answer(&self) -> Option<(u16, &'static str)> {
        match self {
            BufferFault::TooLarge => Some((413, "request body larger than the route's request_buffering.max_size")),
            BufferFault::Source(fault) => fault.answer(),
            BufferFault::Disk => Some((500, "request body could not be buffered to a temporary file")),
        }
    }
}

impl From<RelayError> for BufferFault {
    fn from(e: RelayError) -> Self {
        match e {
            RelayError::Source(fault) => BufferFault::Source(fault),
            // Nothing is written while buffering.
            RelayError::Dest => BufferFault::Source(SourceFault::Closed),
        }
    }
}

/// Reads a body with `framing` from `src` (`buf` holds what was read already; bytes after the body stay there)
/// until its end, under `pace`.
pub(crate) async fn read_body<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut BytesMut,
    framing: BodyFraming,
    policy: &BufferPolicy,
    pace: &mut Pace,
) -> Result<Buffered, BufferFault> {
    let mut spool = Spool { mem: BytesMut::new(), file: None, len: 0, policy };
    match framing {
        BodyFraming::None => {}
        BodyFraming::Length(n) => {
            if n > policy.max_size {
                return Err(BufferFault::TooLarge);
            }
            // What arrived with the head, then the rest read straight into the spool (no copy through `buf`),
            // never past the body's end: bytes after it are the next request's.
            let take = n.min(buf.len() as u64) as usize;
            spool.mem.reserve(spool.room().clamp(4096, 256 * 1024));
            pace.inspect(&buf[..take])?;
            spool.push(&buf.split_to(take)).await?;
            let mut left = n - take as u64;
            while left > 0 {
                let room = spool.room().clamp(4096, 256 * 1024);
                spool.mem.reserve(room);
                let mut limited = (&mut *src).take(left.min(room as u64));
                let read = pace.read(limited.read_buf(&mut spool.mem)).await.map_err(BufferFault::Source)?;
                if read == 0 {
                    return Err(BufferFault::Source(SourceFault::Closed));
                }
                pace.inspect(&spool.mem[spool.mem.len() - read..])?;
                spool.len += read as u64;
                left -= read as u64;
                spool.written_to_mem().await?;
            }
        }
        BodyFraming::Chunked => {
            let mut decoder = ChunkedDecoder::default();
            loop {
                match decoder.decode(buf, crate::relay::READ_CHUNK) {
                    Err(reason) => return Err(BufferFault::Source(SourceFault::Malformed(reason))),
                    Ok(Decoded::Data(data)) => {
                        pace.inspect(&data)?;
                        spool.push(&data).await?
                    }
                    Ok(Decoded::NeedMore) => {
                        if read_more(src, buf, pace).await? == 0 {
                            return Err(BufferFault::Source(SourceFault::Closed));
                        }
                    }
                    Ok(Decoded::Done) => break,
                }
            }
        }
        BodyFraming::UntilClose => loop {
            if buf.is_empty() && read_more(src, buf, pace).await? == 0 {
                break;
            }
            pace.inspect(buf)?;
            spool.push(&buf.split()).await?;
        },
    }
    spool.finish().await
}

/// A body being buffered: in `mem` until it outgrows the policy's memory, then in `file`, with `mem` holding
/// what has not been written yet.
struct Spool<'p> {
    mem: BytesMut,
    file: Option<Arc<std::fs::File>>,
    len: u64,
    policy: &'p BufferPolicy,
}

impl Spool<'_> {
    async fn push(&mut self, data: &[u8]) -> Result<(), BufferFault> {
        self.len += data.len() as u64;
        if self.len > self.policy.max_size {
            return Err(BufferFault::TooLarge);
        }
        self.mem.extend_from_slice(data);
        self.written_to_mem().await
    }

    /// How much more `mem` takes before it is written out.
    fn room(&self) -> usize {
        let limit = match self.file {
            None => self.policy.memory + 1,
            Some(_) => self.policy.write_batch(),
        };
        limit.saturating_sub(self.mem.len())
    }

    /// After bytes went into `mem` (and `len`): writes it out when it is full.
    async fn written_to_mem(&mut self) -> Result<(), BufferFault> {
        if self.room() == 0 {
            self.write_out().await.map_err(|_| BufferFault::Disk)?;
        }
        Ok(())
    }

    /// Moves what is in memory to the file, making the file first; a failure is logged (`disk_trouble`),
    /// whichever protocol the client speaks.
    async fn write_out(&mut self) -> io::Result<()> {
        let written = self.write_out_once().await;
        if let Err(e) = &written {
            disk_trouble(e);
        }
        written
    }

    async fn write_out_once(&mut self) -> io::Result<()> {
        let file = match &self.file {
            Some(file) => file.clone(),
            None => {
                let dir = self.policy.temp_dir.clone();
                let file = Arc::new(blocking(move || tempfile::tempfile_in(dir)).await?);
                self.file = Some(file.clone());
                file
            }
        };
        let data = std::mem::take(&mut self.mem);
        let (mut data, written) = tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let written = (&*file).write_all(&data);
            (data, written)
        })
        .await
        .map_err(io::Error::other)?;
        written?;
        data.clear();
        self.mem = data;
        Ok(())
    }

    async fn finish(mut self) -> Result<Buffered, BufferFault> {
        if self.file.is_none() {
            return Ok(Buffered::Memory(self.mem.freeze()));
        }
        if !self.mem.is_empty() {
            self.write_out().await.map_err(|_| BufferFault::Disk)?;
        }
        let file = self.file.take().ok_or(BufferFault::Disk)?;
        Ok(Buffered::File(SpooledBody { file, len: self.len }))
    }
}

/// Says in the log that request bodies cannot be buffered, at most once a minute per worker: a full disk
/// fails every buffered request.
fn disk_trouble(e: &std::io::Error) {
    thread_local! {
        static LAST: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
    }
    let now = std::time::Instant::now();
    if LAST.get().is_some_and(|last| now < last + Duration::from_secs(60)) {
        return;
    }
    LAST.set(Some(now));
    tracing::warn!("a request body could not be buffered to a temporary file (answered 500): {e}");
}

/// Most of a spooled body read back at once.
const READ_BACK: usize = 256 * 1024;

/// Read-back buffers a worker keeps for the next requests (at most this many times `READ_BACK` bytes).
const SPARE_BUFFERS: usize = 16;

impl SpooledBody {
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Writes the whole body to `dst`, each write within `write_timeout`. A failure to read the file back is a
    /// `SourceFault::Unreadable`.
    pub async fn send_to<W: AsyncWrite + Unpin>(
        &self,
        dst: &mut W,
        write_timeout: Duration,
    ) -> Result<u64, RelayError> {
        // Read-back buffers are kept by the worker (a few, one per request sending a file at once): a new one
        // is zeroed before its first read, which would otherwise cost as much as the copy itself.
        thread_local! {
            static SPARE: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let mut chunk = SPARE.with_borrow_mut(Vec::pop).unwrap_or_default();
        let mut offset = 0u64;
        let sent = async {
            while offset < self.len {
                let n = (self.len - offset).min(READ_BACK as u64) as usize;
                let file = self.file.clone();
                let mut buffer = std::mem::take(&mut chunk);
                let (back, read) = tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    if buffer.len() < n {
                        buffer.resize(n, 0);
                    }
                    let read = file.read_exact_at(&mut buffer[..n], offset);
                    (buffer, read)
                })
                .await
                .map_err(|_| RelayError::Source(SourceFault::Unreadable))?;
                chunk = back;
                read.map_err(|_| RelayError::Source(SourceFault::Unreadable))?;
                write_timed(dst, &chunk[..n], write_timeout).await.map_err(|_| RelayError::Dest)?;
                offset += n as u64;
            }
            Ok(self.len)
        }
        .await;
        SPARE.with_borrow_mut(|spare| {
            if spare.len() < SPARE_BUFFERS {
                spare.push(chunk);
            }
        });
        sent
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(io::Error::other)?
}
