//! The access log's writer: one line per request (or per connection, for planes that log those), formatted
//! by the plane that served it (HTTP's JSON and combined formats are in portico-http). Workers format lines into a buffer of
//! their own and hand full buffers (or, every 200 ms, whatever they hold) to a writer thread over a bounded
//! channel; a worker never waits for the disk. When the writer falls behind, whole buffers are dropped and
//! counted (`portico_access_log_dropped_total`) rather than stalling requests. SIGUSR1 reopens the file.

use crate::stats::Global;
use portico_config::{AccessLog, AccessLogFormat, LoadedConfig};
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A worker hands its buffer over once it holds this much.
const BATCH: usize = 32 * 1024;
/// Buffers queued for the writer before new ones are dropped.
const QUEUE: usize = 256;

enum Msg {
    Batch(Vec<u8>),
    /// Wake up (to reopen the file).
    Wake,
    /// Write everything received so far, then acknowledge and stop.
    Finish(SyncSender<()>),
}

pub struct AccessLogSink {
    tx: SyncSender<Msg>,
    pub format: AccessLogFormat,
    reopen: Arc<AtomicBool>,
    counters: Arc<Global>,
}

enum Target {
    Stdout,
    File(PathBuf, File),
}

fn open(path: &PathBuf) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    OpenOptions::new().create(true).append(true).open(path)
}

impl AccessLogSink {
    /// Opens the log (so a bad path fails start-up) and starts the writer thread. A relative path starts at
    /// the directory of `loaded`'s configuration file.
    pub fn start(cfg: &AccessLog, loaded: &LoadedConfig, counters: Arc<Global>) -> io::Result<Arc<AccessLogSink>> {
        let target = if cfg.path == "-" {
            Target::Stdout
        } else {
            let path = loaded.resolve(&cfg.path);
            let file =
                open(&path).map_err(|e| io::Error::new(e.kind(), format!("access log {}: {e}", path.display())))?;
            Target::File(path, file)
        };
        let (tx, rx) = sync_channel(QUEUE);
        let reopen = Arc::new(AtomicBool::new(false));
        let flag = reopen.clone();
        std::thread::Builder::new().name("portico-access-log".into()).spawn(move || write_loop(rx, target, flag))?;
        Ok(Arc::new(AccessLogSink { tx, format: cfg.format, reopen, counters }))
    }

    /// Asks the writer to reopen the file before its next write (log rotation).
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::SeqCst);
        // Wake the writer even when no request is logged.
        let _ = self.tx.try_send(Msg::Wake);
    }

    /// Writes what the workers handed over and stops the writer; waits at most `within`. Call after the
    /// workers have flushed.
    pub fn finish(&self, within: std::time::Duration) {
        let (ack_tx, ack_rx) = sync_channel(1);
        if self.tx.send_timeout_compat(Msg::Finish(ack_tx), within) {
            let _ = ack_rx.recv_timeout(within);
        }
    }

    fn send(&self, batch: Vec<u8>) {
        match self.tx.try_send(Msg::Batch(batch)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.access_log_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// `SyncSender::send` with a deadline (std has none): retries `try_send` until the queue has room.
trait SendTimeout {
    fn send_timeout_compat(&self, msg: Msg, within: std::time::Duration) -> bool;
}

impl SendTimeout for SyncSender<Msg> {
    fn send_timeout_compat(&self, mut msg: Msg, within: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        loop {
            match self.try_send(msg) {
                Ok(()) => return true,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(m)) => {
                    if std::time::Instant::now() >= deadline {
                        return false;
                    }
                    msg = m;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
        }
    }
}

fn write_loop(rx: Receiver<Msg>, mut target: Target, reopen: Arc<AtomicBool>) {
    while let Ok(msg) = rx.recv() {
        let batch = match msg {
            Msg::Batch(b) => b,
            Msg::Wake => Vec::new(),
            Msg::Finish(ack) => {
                if let Target::File(_, file) = &mut target {
                    let _ = file.flush();
                }
                let _ = io::stdout().flush();
                let _ = ack.send(());
                return;
            }
        };
        if reopen.swap(false, Ordering::SeqCst) {
            if let Target::File(path, file) = &mut target {
                let _ = file.flush();
                match open(path) {
                    Ok(new) => *file = new,
                    Err(e) => tracing::error!("cannot reopen the access log {}: {e}", path.display()),
                }
            }
        }
        if batch.is_empty() {
            continue;
        }
        let written = match &mut target {
            Target::Stdout => write_lines_atomically(&mut io::stdout().lock(), &batch),
            Target::File(_, file) => file.write_all(&batch),
        };
        if let Err(e) = written {
            tracing::error!("access log write failed: {e}");
        }
    }
}

/// Writes to a pipe are atomic up to PIPE_BUF (4 KiB on Linux): writing whole lines in pieces no larger keeps
/// them from mixing with another process's (worker processes share standard output). A file opened for
/// appending needs nothing of the kind: each write lands whole at the end.
fn write_lines_atomically(out: &mut impl Write, batch: &[u8]) -> io::Result<()> {
    const PIPE_BUF: usize = 4096;
    let mut rest = batch;
    while !rest.is_empty() {
        let window = &rest[..rest.len().min(PIPE_BUF)];
        let end = match window.iter().rposition(|&b| b == b'\n') {
            Some(i) if rest.len() > PIPE_BUF => i + 1,
            // A line longer than PIPE_BUF goes whole (it cannot be atomic anyway).
            None if rest.len() > PIPE_BUF => rest.iter().position(|&b| b == b'\n').map_or(rest.len(), |i| i + 1),
            _ => rest.len(),
        };
        out.write_all(&rest[..end])?;
        out.flush()?;
        rest = &rest[end..];
    }
    Ok(())
}
/// The time a line is logged at, formatted once per second.
pub struct LineTime<'a> {
    /// `2026-11-24T18:00:00` (UTC, without the fraction).
    pub iso8601: &'a str,
    /// The milliseconds of the second.
    pub millis: u32,
    /// `24/Nov/2026:18:00:00 +0000`, as the combined log format writes it.
    pub clf: &'a str,
}

/// A worker's side of the log.
pub struct LocalLog {
    sink: Arc<AccessLogSink>,
    buf: RefCell<Vec<u8>>,
    /// The current second, formatted (ISO 8601 and combined-log style), to format it once per second.
    clock: RefCell<(u64, String, String)>,
    /// The worker's flushing task, waiting while the buffer is empty: the next line wakes it.
    flusher: std::cell::Cell<Option<std::task::Waker>>,
}

impl LocalLog {
    pub fn new(sink: Arc<AccessLogSink>) -> LocalLog {
        LocalLog {
            sink,
            buf: RefCell::new(Vec::with_capacity(BATCH * 2)),
            clock: RefCell::new((0, String::new(), String::new())),
            flusher: Default::default(),
        }
    }

    /// Ready when lines wait in the buffer; otherwise the next line wakes `cx`'s task.
    pub fn poll_buffered(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if self.buf.borrow().is_empty() {
            self.flusher.set(Some(cx.waker().clone()));
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(())
    }

    /// The format lines are to be written in.
    pub fn format(&self) -> AccessLogFormat {
        self.sink.format
    }

    /// Appends one line (`write` ends it with `\n`) to this worker's buffer, handing the buffer to the writer
    /// when it is full.
    pub fn line(&self, write: impl FnOnce(&mut Vec<u8>, &LineTime<'_>)) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let mut clock = self.clock.borrow_mut();
        if clock.0 != now.as_secs() || clock.1.is_empty() {
            *clock = (now.as_secs(), iso8601(now.as_secs()), clf_time(now.as_secs()));
        }
        let mut buf = self.buf.borrow_mut();
        write(&mut buf, &LineTime { iso8601: &clock.1, millis: now.subsec_millis(), clf: &clock.2 });
        if buf.len() >= BATCH {
            let full = std::mem::replace(&mut *buf, Vec::with_capacity(BATCH * 2));
            self.sink.send(full);
        }
        drop(buf);
        if let Some(flusher) = self.flusher.take() {
            flusher.wake();
        }
    }

    pub fn flush(&self) {
        let mut buf = self.buf.borrow_mut();
        if !buf.is_empty() {
            let full = std::mem::replace(&mut *buf, Vec::with_capacity(BATCH * 2));
            self.sink.send(full);
        }
    }
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's civil_from_days).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn split(secs: u64) -> ((i64, u32, u32), u64, u64, u64) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    (civil(days), rem / 3600, rem % 3600 / 60, rem % 60)
}

pub fn iso8601(secs: u64) -> String {
    let ((y, mo, d), h, mi, s) = split(secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}")
}

fn clf_time(secs: u64) -> String {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let ((y, mo, d), h, mi, s) = split(secs);
    format!("{d:02}/{}/{y:04}:{h:02}:{mi:02}:{s:02} +0000", MONTHS[(mo - 1) as usize])
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00");
        assert_eq!(iso8601(1_795_305_600), "2026-11-22T00:00:00");
        assert_eq!(clf_time(951_782_400), "29/Feb/2000:00:00:00 +0000");
    }

    /// Records each write separately.
    struct Writes(Vec<Vec<u8>>);

    impl std::io::Write for Writes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn stdout_batches_are_written_in_whole_lines_of_at_most_pipe_buf() {
        let line = |n: usize| format!("{}\n", "x".repeat(n - 1)).into_bytes();
        let batch: Vec<u8> = [line(3000), line(3000), line(100), line(5000), line(10)].concat();
        let mut out = Writes(Vec::new());
        super::write_lines_atomically(&mut out, &batch).unwrap();
        let sizes: Vec<usize> = out.0.iter().map(Vec::len).collect();
        assert_eq!(sizes, [3000, 3100, 5000, 10]);
        assert_eq!(out.0.concat(), batch);
    }
}
