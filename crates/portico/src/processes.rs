//! `process_model: multi_process`: a small master that binds the sockets, serves the admin API and starts one
//! worker process per worker, each with its own listening sockets; it restarts a worker process that dies, passes
//! reloads and log reopening on, and stops them on shutdown.
//!
//! Worker processes are the same binary started again (`/proc/self/exe`, so a binary replaced on disk does not
//! mix versions) rather than `fork()` alone: forking a process that already runs threads (the admin API's, the
//! log writer's) leaves locks held by threads that do not exist in the child.

use portico_http::worker::BoundListener;
use portico_http::Registry;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Set for a worker process: `INDEX/COUNT`.
const WORKER_ENV: &str = "PORTICO_WORKER_PROCESS";
/// Set for a worker process: the descriptor of its end of the master's control socket.
const CONTROL_FD_ENV: &str = "PORTICO_CONTROL_FD";
/// Set for a worker process: a memory file holding the master's running configuration, and the name of the file
/// it came from (paths in it are relative to that file).
const CONFIG_FD_ENV: &str = "PORTICO_CONFIG_FD";
const CONFIG_NAME_ENV: &str = "PORTICO_CONFIG_NAME";
/// Passed descriptors start at or above this number (above anything the master passes on that it inherited).
const FIRST_FD: RawFd = 1000;
/// How long a worker process may take to answer the master's `/metrics` or `/admin/clusters` request.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// Which worker a worker process is.
#[derive(Clone, Copy, Debug)]
pub struct WorkerIdentity {
    pub index: usize,
    pub count: usize,
}

/// `Some` in a worker process started by a master.
pub fn identity() -> Option<WorkerIdentity> {
    let value = std::env::var(WORKER_ENV).ok()?;
    let (index, count) = value.split_once('/')?;
    let (index, count) = (index.parse().ok()?, count.parse().ok()?);
    (index < count).then_some(WorkerIdentity { index, count })
}

/// In a worker process: names it `portico-w<INDEX>` for `ps`, `top` and `pgrep`.
pub fn name_process(identity: WorkerIdentity) {
    let name = format!("portico-w{}\0", identity.index);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes (longer names are cut).
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

struct Slot {
    child: Option<Child>,
    /// Deaths in a row, when it last started, when it is due to start again.
    deaths: u32,
    started: Instant,
    due: Option<Instant>,
}

/// Each worker process's control socket, replaced when the process is.
type Controls = Arc<Vec<Mutex<Option<UnixStream>>>>;

pub struct Master {
    slots: Vec<Slot>,
    /// Each worker's listening sockets, kept for restarts and for an upgrade.
    pub sockets: Vec<Vec<BoundListener>>,
    controls: Controls,
    /// Worker pids, for passing signals on from other threads (a reload through the admin API).
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    registry: Arc<Registry>,
    /// The running configuration, handed to each worker process as it starts.
    snapshot: Arc<arc_swap::ArcSwap<portico_http::Snapshot>>,
}

impl Master {
    pub fn new(
        sockets: Vec<Vec<BoundListener>>,
        registry: Arc<Registry>,
        snapshot: Arc<arc_swap::ArcSwap<portico_http::Snapshot>>,
    ) -> Master {
        let count = sockets.len();
        Master {
            slots: (0..count).map(|_| Slot { child: None, deaths: 0, started: Instant::now(), due: None }).collect(),
            controls: Arc::new((0..count).map(|_| Mutex::new(None)).collect()),
            pids: Arc::new(Mutex::new(vec![None; count])),
            sockets,
            registry,
            snapshot,
        }
    }

    pub fn start_all(&mut self) -> std::io::Result<()> {
        (0..self.slots.len()).try_for_each(|index| self.spawn(index))
    }

    fn spawn(&mut self, index: usize) -> std::io::Result<()> {
        let (ours, theirs) = UnixStream::pair()?;
        ours.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        ours.set_write_timeout(Some(CONTROL_TIMEOUT))?;
        let running = self.snapshot.load();
        let config = running_configuration(&running.source)?;
        let mut passed: Vec<RawFd> = self.sockets[index].iter().map(|l| l.socket.as_raw_fd()).collect();
        passed.push(theirs.as_raw_fd());
        passed.push(config.as_raw_fd());
        // Above every descriptor being passed, so placing one never overwrites another not yet placed.
        let first = passed.iter().copied().max().map_or(FIRST_FD, |m| (m + 1).max(FIRST_FD));
        let listeners = passed.len() - 2;
        let master = std::process::id() as libc::pid_t;
        let mut command = Command::new("/proc/self/exe");
        // `ps` shows the command line Portico was started with; the process name says which worker it is.
        if let Some(arg0) = std::env::args_os().next() {
            command.arg0(arg0);
        }
        command
            .args(std::env::args_os().skip(1))
            .env(WORKER_ENV, format!("{index}/{}", self.slots.len()))
            .env("LISTEN_FDS", listeners.to_string())
            .env("LISTEN_FDS_FIRST_FD", first.to_string())
            .env(CONTROL_FD_ENV, (first + listeners as RawFd).to_string())
            .env(CONFIG_FD_ENV, (first + listeners as RawFd + 1).to_string())
            .env(CONFIG_NAME_ENV, &running.source.file)
            .env_remove("LISTEN_PID")
            .env_remove("NOTIFY_SOCKET")
            .env_remove(crate::systemd::UPGRADE_FROM_ENV)
            .env_remove(crate::systemd::SYSTEMD_SOCKET_ENV);
        // SAFETY: between fork and exec only async-signal-safe calls (dup2, prctl, getppid, _exit).
        unsafe {
            command.pre_exec(move || {
                for (i, fd) in passed.iter().enumerate() {
                    if libc::dup2(*fd, first + i as RawFd) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // The worker goes (draining) when the master does, even on kill -9.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if libc::getppid() != master {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        drop((theirs, config));
        if let Ok(mut pids) = self.pids.lock() {
            pids[index] = Some(child.id());
        }
        *self.controls[index].lock().unwrap_or_else(|p| p.into_inner()) = Some(ours);
        let slot = &mut self.slots[index];
        slot.child = Some(child);
        slot.started = Instant::now();
        slot.due = None;
        Ok(())
    }

    /// Restarts worker processes that exited, with a back-off that grows with repeated deaths.
    pub fn check(&mut self) {
        let now = Instant::now();
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            if let Some(status) = slot.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                slot.child = None;
                if let Ok(mut pids) = self.pids.lock() {
                    pids[index] = None; // the pid may be reused by an unrelated process
                }
                // A worker that ran for a minute starts the count again.
                slot.deaths = if slot.started.elapsed() > Duration::from_secs(60) { 1 } else { slot.deaths + 1 };
                let backoff = Duration::from_millis(100 << slot.deaths.min(6)).min(Duration::from_secs(5));
                slot.due = Some(now + backoff);
                self.registry.global.worker_restarts.fetch_add(1, Ordering::Relaxed);
                tracing::error!(worker = index, "worker process exited ({status}); starting it again in {backoff:?}");
            }
            if self.slots[index].child.is_none() && self.slots[index].due.is_some_and(|due| due <= now) {
                if let Err(e) = self.spawn(index) {
                    tracing::error!(worker = index, "cannot start the worker process again: {e}");
                    self.slots[index].due = Some(now + Duration::from_secs(5));
                }
            }
        }
    }

    /// A function that sends `signal` to every worker process (for reloads from any thread).
    pub fn signaller(&self) -> impl Fn(i32) + Send + Sync + 'static {
        let pids = self.pids.clone();
        move |signal| {
            for pid in pids.lock().unwrap_or_else(|p| p.into_inner()).iter().flatten() {
                // SAFETY: kill(2) on a child of this process.
                unsafe { libc::kill(*pid as libc::pid_t, signal) };
            }
        }
    }

    /// For the admin API: asks each worker process for `what` and returns the answers.
    pub fn gatherer(&self) -> portico_admin::GatherFn {
        let controls = self.controls.clone();
        Arc::new(move |what: &str| {
            controls
                .iter()
                .filter_map(|control| {
                    let mut guard = control.lock().unwrap_or_else(|p| p.into_inner());
                    let answer = ask(guard.as_mut()?, what);
                    if answer.is_err() {
                        *guard = None; // out of step or gone: wait for the next process
                    }
                    answer.ok()
                })
                .collect()
        })
    }

    /// Shutdown: every worker process drains (SIGTERM) within `grace`; any still running after it is killed.
    pub fn stop(mut self, grace: Duration) {
        (self.signaller())(libc::SIGTERM);
        drop(std::mem::take(&mut self.sockets));
        let deadline = Instant::now() + grace + Duration::from_secs(1);
        for slot in &mut self.slots {
            let Some(child) = slot.child.as_mut() else { continue };
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if matches!(child.try_wait(), Ok(None)) {
                tracing::warn!(pid = child.id(), "worker process still running after the grace period: killed");
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The running configuration's text in a memory file (which a worker process reads whatever it may not open).
fn running_configuration(loaded: &portico_config::LoadedConfig) -> std::io::Result<std::fs::File> {
    // SAFETY: memfd_create with a NUL-terminated name; the new descriptor is owned by the returned File.
    let fd = unsafe { libc::memfd_create(c"portico-config".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(loaded.source.as_bytes())?;
    Ok(file)
}

/// In a worker process: the configuration its master passed (with the master's file name, for the paths in it
/// that are relative to the file). `None` when this is not a worker process.
pub fn masters_configuration() -> Option<anyhow::Result<portico_config::LoadedConfig>> {
    identity()?;
    let fd: RawFd = std::env::var(CONFIG_FD_ENV).ok()?.parse().ok()?;
    // SAFETY: the master placed the memory file at this descriptor, and nothing else owns it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut source = String::new();
    let read =
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0)).and_then(|_| file.read_to_string(&mut source));
    if let Err(e) = read {
        return Some(Err(anyhow::anyhow!("cannot read the configuration passed by the master: {e}")));
    }
    let name = std::env::var(CONFIG_NAME_ENV).unwrap_or_else(|_| "portico.yaml".into());
    Some(portico_config::load_str(&source, &name).map_err(|e| anyhow::anyhow!("invalid configuration\n{e}")))
}

/// One request on a control socket: `what\n`, answered by `LENGTH\n` and that many bytes.
fn ask(stream: &mut UnixStream, what: &str) -> std::io::Result<String> {
    stream.write_all(format!("{what}\n").as_bytes())?;
    let mut length = Vec::with_capacity(12);
    let mut byte = [0u8; 1];
    while length.len() < 20 {
        stream.read_exact(&mut byte)?;
        if byte[0] == b'\n' {
            break;
        }
        length.push(byte[0]);
    }
    let length: usize = std::str::from_utf8(&length)
        .ok()
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad control answer"))?;
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body)?;
    String::from_utf8(body).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// In a worker process: answers the master's requests on the control socket until the master goes.
pub fn serve_control(
    registry: Arc<Registry>,
    snapshot: Arc<arc_swap::ArcSwap<portico_http::Snapshot>>,
) -> std::io::Result<()> {
    let fd: RawFd = std::env::var(CONTROL_FD_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("{CONTROL_FD_ENV} is not set")))?;
    // SAFETY: the master placed our end of the control socket at this descriptor, and nothing else owns it.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // SAFETY: fcntl on the descriptor just taken: not inherited by anything this process starts.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let mut writer = stream.try_clone()?;
    std::thread::Builder::new().name("portico-control".into()).spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { return };
            let answer = match line.trim() {
                "metrics" => portico_admin::render_metrics(&registry, &snapshot.load(), true),
                "clusters" => portico_admin::clusters(&snapshot.load_full()).to_string(),
                _ => String::new(),
            };
            if writer.write_all(format!("{}\n{answer}", answer.len()).as_bytes()).is_err() {
                return;
            }
        }
    })?;
    Ok(())
}
