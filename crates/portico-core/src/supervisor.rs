//! Keeping worker threads running: one that died is started again on the same sockets.

use crate::access_log::AccessLogSink;
use crate::listeners::{lock, WorkerSockets};
use crate::stats::Global;
use crate::worker::{self, BoundListener, Planes};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Keeps the workers running: a worker thread whose runtime died (a bug outside any connection's task) is
/// started again on the same listening sockets, after a back-off that grows with repeated deaths.
pub struct Supervisor {
    /// The worker index of the first thread (a worker process runs one thread, with its own index).
    pub first_index: usize,
    pub threads: Vec<Option<std::thread::JoinHandle<()>>>,
    /// Each worker's listening sockets, kept so a new thread gets duplicates of the same sockets (connections
    /// wait in their queues meanwhile, none is refused); reloads change them.
    pub sockets: Arc<Mutex<WorkerSockets>>,
    /// Per worker: deaths in a row, when it was last started, when it is due to start again.
    pub deaths: Vec<(u32, std::time::Instant, Option<std::time::Instant>)>,
    /// The planes each worker runs.
    pub planes: Planes,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    pub access_log: Option<Arc<AccessLogSink>>,
    pub global: Arc<Global>,
    /// Per worker: set by its thread as it ends (before `JoinHandle::is_finished` says so).
    pub ended: Vec<Arc<AtomicBool>>,
    /// Notified by a worker thread as it ends: what wakes the supervisor (no periodic check).
    pub exited: Arc<tokio::sync::Notify>,
}

impl Supervisor {
    /// Starts worker `index` on duplicates of its sockets.
    pub fn spawn(&mut self, index: usize) -> std::io::Result<std::thread::JoinHandle<()>> {
        let mut table = lock(&self.sockets);
        let listeners = table.sockets[index]
            .iter()
            .map(|l| Ok(BoundListener { name: l.name.clone(), socket: l.socket.try_clone()? }))
            .collect::<std::io::Result<Vec<_>>>()?;
        let (changes, receiver) = tokio::sync::mpsc::unbounded_channel();
        table.changes[index] = Some(changes);
        drop(table);
        self.deaths[index].1 = std::time::Instant::now();
        let (ended, exited) = (Arc::new(AtomicBool::new(false)), self.exited.clone());
        self.ended[index] = ended.clone();
        worker::spawn(
            self.first_index + index,
            listeners,
            receiver,
            self.planes.clone(),
            self.shutdown.clone(),
            self.access_log.clone(),
            Box::new(move || {
                ended.store(true, Ordering::Release);
                exited.notify_one();
            }),
        )
    }

    /// When a worker thread is due to start again (after its back-off), if one is.
    pub fn next_due(&self) -> Option<Instant> {
        let waiting = self.threads.iter().zip(&self.deaths).filter(|(t, _)| t.is_none());
        waiting.filter_map(|(_, d)| d.2).min()
    }

    /// Notes the workers that died and starts the ones whose back-off is over.
    pub fn check(&mut self) {
        if *self.shutdown.borrow() {
            return;
        }
        let now = std::time::Instant::now();
        for index in 0..self.threads.len() {
            // A thread that said it ended is joined at once (it is past everything but its last instructions).
            let ended = self.ended.get(index).is_some_and(|e| e.load(Ordering::Acquire));
            if self.threads[index].as_ref().is_some_and(|t| ended || t.is_finished()) {
                let why = match self.threads[index].take().map(|t| t.join()) {
                    Some(Err(panic)) => crate::panic::panic_message(panic.as_ref()).to_string(),
                    _ => "its runtime stopped".to_string(),
                };
                let (in_a_row, started, _) = self.deaths[index];
                // A worker that ran for a minute starts the count again.
                let in_a_row = if started.elapsed() > Duration::from_secs(60) { 1 } else { in_a_row + 1 };
                let backoff = Duration::from_millis(100 << in_a_row.min(6)).min(Duration::from_secs(5));
                self.deaths[index] = (in_a_row, started, Some(now + backoff));
                self.global.worker_restarts.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    worker = self.first_index + index,
                    "worker died ({why}); starting it again in {backoff:?}"
                );
            }
            if self.threads[index].is_none() && self.deaths[index].2.is_some_and(|due| due <= now) {
                match self.spawn(index) {
                    Ok(thread) => {
                        self.threads[index] = Some(thread);
                        self.deaths[index].2 = None;
                    }
                    Err(e) => {
                        tracing::error!(worker = self.first_index + index, "cannot start the worker again: {e}");
                        self.deaths[index].2 = Some(now + Duration::from_secs(5));
                    }
                }
            }
        }
    }
}

/// The workers: threads of this process, or (`process_model: multi_process`) processes this master started.
pub enum Workers {
    Threads(Supervisor),
    Processes(crate::processes::Master),
}

impl Workers {
    /// Copies of every worker's listening sockets (for an upgrade to inherit).
    pub fn sockets(&self) -> Vec<std::net::TcpListener> {
        match self {
            Workers::Threads(s) => {
                lock(&s.sockets).sockets.iter().flatten().filter_map(|l| l.socket.try_clone().ok()).collect()
            }
            Workers::Processes(m) => m.sockets(),
        }
    }

    pub fn check(&mut self) {
        match self {
            Workers::Threads(s) => s.check(),
            Workers::Processes(m) => m.check(),
        }
    }

    /// When a worker that died is due to start again, if one is: `check` then starts it.
    pub fn next_due(&self) -> Option<Instant> {
        match self {
            Workers::Threads(s) => s.next_due(),
            Workers::Processes(m) => m.next_due(),
        }
    }
}
