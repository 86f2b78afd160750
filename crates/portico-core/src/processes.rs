//! `process_model: multi_process`: a small master that binds the sockets, serves the admin API and starts one
//! worker process per worker, each with its own listening sockets and the running configuration; it restarts a
//! worker process that dies, hands reloads on as the configuration text it validated, and stops them on shutdown.
//!
//! Worker processes are the same binary started again (`/proc/self/exe`, so a binary replaced on disk does not
//! mix versions) rather than `fork()` alone: forking a process that already runs threads (the admin API's, the
//! log writer's) leaves locks held by threads that do not exist in the child.
//!
//! Master and worker talk over a Unix socket pair ("control socket"). The worker's first message says it serves;
//! then the master asks and the worker answers, each message `ID VERB LENGTH\n` (answers: `ID LENGTH\n`) and
//! LENGTH bytes. Answers carry the question's id, so an answer that comes after its question timed out is
//! recognised and skipped. Verbs: `metrics`, `clusters`, `reload` (the body is the configuration text) and
//! `listeners`, which carries listening sockets (SCM_RIGHTS) with a JSON body naming the listener of each passed
//! socket (`add`) and the sockets to stop accepting on (`stop`, by listener and address).
//!
//! Reloads that add, move or remove listeners: the master binds every new socket first (a taken address fails
//! the reload), keeps a table of each worker's sockets (what a restarted worker process and an upgrade get), and
//! brings each worker process to its row of the table: the new configuration first, then the sockets, so a worker
//! never accepts on a listener its configuration does not have. A worker process that cannot be brought to its
//! row is restarted with it.

use crate::listeners::{lock, ListenerPlan};
use crate::stats::Global;
use crate::worker::BoundListener;
use portico_config::LoadedConfig;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, IoSlice, IoSliceMut, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Set for a worker process: `INDEX/COUNT/MASTER_PID`.
const WORKER_ENV: &str = "PORTICO_WORKER_PROCESS";
/// Set for a worker process: the descriptor of its end of the master's control socket.
const CONTROL_FD_ENV: &str = "PORTICO_CONTROL_FD";
/// Set for a worker process: a memory file holding the master's running configuration, and the name of the file
/// it came from (paths in it are relative to that file).
const CONFIG_FD_ENV: &str = "PORTICO_CONFIG_FD";
const CONFIG_NAME_ENV: &str = "PORTICO_CONFIG_NAME";
/// Passed descriptors start at or above this number (above anything the master passes on that it inherited).
const FIRST_FD: RawFd = 1000;
/// How long a worker process may take to answer the master.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a worker process may take to apply a reload (it resolves endpoint names).
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Set for a worker process: the names of the listeners its sockets belong to, in order.
const LISTENERS_ENV: &str = "PORTICO_LISTENERS";
/// How long worker processes may take to start serving before start-up (or an upgrade) is given up.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// At most this many descriptors travel with one sendmsg (the kernel's limit is 253).
const FDS_PER_SEND: usize = 250;
/// The signals a worker process handles, blocked from its start until its handlers are in place (the default
/// action of SIGHUP or SIGUSR1 would end it).
const HANDLED_SIGNALS: [libc::c_int; 5] = [libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2, libc::SIGTERM, libc::SIGINT];

/// Sends one request (`metrics`, `clusters`) to each worker process and returns the answers that came.
pub type GatherFn = Arc<dyn Fn(&str) -> Vec<String> + Send + Sync>;

/// The configuration running now (what a worker process is started with, and given when it catches up).
pub type RunningConfig = Arc<dyn Fn() -> Arc<LoadedConfig> + Send + Sync>;

/// Which worker a worker process is.
#[derive(Clone, Copy, Debug)]
pub struct WorkerIdentity {
    pub index: usize,
    pub count: usize,
    pub master: u32,
}

/// `Some` in a worker process started by a master.
pub fn identity() -> Option<WorkerIdentity> {
    let value = std::env::var(WORKER_ENV).ok()?;
    let mut parts = value.split('/').map(str::parse::<usize>);
    let (index, count, master) = (parts.next()?.ok()?, parts.next()?.ok()?, parts.next()?.ok()?);
    (index < count).then_some(WorkerIdentity { index, count, master: master as u32 })
}

/// In a worker process: the listener names of the sockets its master passed, in order.
pub fn listener_names() -> Vec<String> {
    std::env::var(LISTENERS_ENV).map(|v| v.split(',').map(str::to_string).collect()).unwrap_or_default()
}

/// In a worker process, first thing: names it `portico-w<INDEX>` for `ps`, `top` and `pgrep`, and makes sure it
/// goes when its master does. The parent-death signal set before exec is cleared when the binary has file
/// capabilities (`setcap`), so it is set again here, and a master already gone is noticed.
pub fn become_worker(identity: WorkerIdentity) {
    let name = format!("portico-w{}\0", identity.index);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes (longer names are cut);
    // PR_SET_PDEATHSIG takes a signal number; getppid and kill have no preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        if libc::getppid() as u32 != identity.master {
            libc::kill(libc::getpid(), libc::SIGTERM);
        }
    }
}

/// In a worker process, once its signal handlers are installed: lets the signals blocked since its start (and
/// any that arrived meanwhile) through.
pub fn unblock_signals() {
    // SAFETY: a sigset_t built with sigemptyset/sigaddset, passed to sigprocmask for this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in HANDLED_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

struct Slot {
    child: Option<Child>,
    /// Deaths in a row, when it last started, when it is due to start again.
    deaths: u32,
    started: Instant,
    due: Option<Instant>,
}

/// One worker process's control socket, with the generation of the process it talks to (answers from a process
/// already replaced are not counted), and the sockets it accepts on.
struct Control {
    generation: u64,
    stream: UnixStream,
    serving: Serving,
}

/// A worker's listening socket in the master's table, with an id that tells it from a later socket bound for the
/// same listener and address (a listener moved away and back).
struct Held {
    id: u64,
    address: Option<SocketAddr>,
    listener: BoundListener,
}

/// The sockets a worker process accepts on (as far as the master told it): id, listener and address of each.
type Serving = Vec<(u64, Arc<str>, Option<SocketAddr>)>;

/// Sockets to stop accepting on, by listener and address.
pub type Stops = Vec<(Arc<str>, SocketAddr)>;

/// A listener change a reload hands to the worker processes: the plan and, per worker, the sockets it bound.
pub type ListenerUpdate = (ListenerPlan, Vec<Vec<BoundListener>>);

/// What `/metrics` remembers: each worker's last answer (for one that does not answer in time, and to go on from
/// when it is replaced) with its generation, and the counters of worker processes that are gone.
#[derive(Default)]
struct MetricsMemory {
    last: Vec<Option<(u64, String)>>,
    retired: String,
}

/// The master's side of the control sockets, shared with the admin API's thread and reloads.
struct Controls {
    slots: Vec<Mutex<Option<Control>>>,
    next_id: AtomicU64,
    next_generation: AtomicU64,
    metrics: Mutex<MetricsMemory>,
    /// Each worker's listening sockets: what a worker process started (again) gets, what an upgrade hands over,
    /// what reloads change. Locked after a slot, never before.
    sockets: Mutex<Vec<Vec<Held>>>,
    next_socket: AtomicU64,
    /// Held while worker processes are brought to the running configuration and sockets (a reload, a worker
    /// process that starts serving), so that each sees them change in the order they changed.
    changing: Mutex<()>,
}

impl Controls {
    /// Runs `f` on every worker process's control at once (with a fresh question id); the results in worker
    /// order, `None` where `f` panicked.
    fn each<R: Send>(&self, f: impl Fn(usize, &mut Option<Control>, u64) -> R + Sync) -> Vec<Option<R>> {
        std::thread::scope(|scope| {
            let f = &f;
            let runs: Vec<_> = self
                .slots
                .iter()
                .enumerate()
                .map(|(index, slot)| {
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    scope.spawn(move || f(index, &mut lock(slot), id))
                })
                .collect();
            runs.into_iter().map(|r| r.join().ok()).collect()
        })
    }

    /// Asks every worker process at once (`timeout` for each); per worker, in worker order, the generation asked
    /// and the answer (or error).
    fn ask_all(&self, verb: &str, body: &str, timeout: Duration) -> Vec<(u64, std::io::Result<String>)> {
        self.each(|_, guard, id| {
            let Some(control) = guard.as_mut() else {
                return (0, Err(std::io::Error::new(std::io::ErrorKind::NotFound, "not running")));
            };
            let generation = control.generation;
            let answer = ask(&mut control.stream, id, verb, body, &[], timeout);
            // A clean timeout leaves the stream in step (the late answer is skipped by its id); any other error
            // leaves it out of step or closed: drop it, and the worker process, seeing its end closed, drains
            // and is started again.
            if matches!(&answer, Err(e) if e.kind() != std::io::ErrorKind::TimedOut) {
                *guard = None;
            }
            (generation, answer)
        })
        .into_iter()
        .map(|r| r.unwrap_or_else(|| (0, Err(std::io::Error::other("panicked")))))
        .collect()
    }

    /// Puts a worker process's control socket in place once it serves, with the sockets it was started with. The
    /// process this one replaces: its counters go on in the retired total (under the same lock as scrapes, so no
    /// scrape sees them twice or not at all).
    fn install(&self, index: usize, stream: UnixStream, serving: Serving) {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let mut memory = lock(&self.metrics);
        if let Some((_, previous)) = memory.last[index].take() {
            let retired = std::mem::take(&mut memory.retired);
            memory.retired = crate::metrics_merge::merge_metrics("", &[retired, counters_only(&previous)]);
        }
        *lock(&self.slots[index]) = Some(Control { generation, stream, serving });
    }

    /// Copies of worker `index`'s sockets, and what they are.
    fn current(&self, index: usize) -> std::io::Result<(Vec<BoundListener>, Serving)> {
        let table = lock(&self.sockets);
        let copies = table[index]
            .iter()
            .map(|h| Ok(BoundListener { name: h.listener.name.clone(), socket: h.listener.socket.try_clone()? }))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok((copies, serving(&table[index])))
    }

    /// The table after a reload's listener change: the stopped sockets go, the new ones come.
    fn change(&self, (plan, bound): ListenerUpdate) {
        let mut table = lock(&self.sockets);
        for (row, new) in table.iter_mut().zip(bound) {
            row.retain(|h| !plan.stop.iter().any(|(name, a)| *name == h.listener.name && Some(*a) == h.address));
            for listener in new {
                let id = self.next_socket.fetch_add(1, Ordering::Relaxed);
                row.push(Held { id, address: listener.socket.local_addr().ok(), listener });
            }
        }
    }

    /// Brings worker process `index` to its row of the table: passes the sockets it lacks and stops the ones it
    /// should no longer accept on.
    fn sync(&self, index: usize, control: &mut Control, id: u64) -> Result<(), String> {
        let (stop, add, now) = {
            let table = lock(&self.sockets);
            let row = &table[index];
            let stop: Vec<_> = control
                .serving
                .iter()
                .filter(|(id, ..)| !row.iter().any(|h| h.id == *id))
                .filter_map(|(_, name, address)| Some(serde_json::json!([&**name, address.as_ref()?.to_string()])))
                .collect();
            let add: Vec<&Held> = row.iter().filter(|h| !control.serving.iter().any(|(id, ..)| *id == h.id)).collect();
            let add = add
                .into_iter()
                .map(|h| Ok((h.listener.name.clone(), OwnedFd::from(h.listener.socket.try_clone()?))))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| format!("cannot copy a socket: {e}"))?;
            (stop, add, serving(row))
        };
        if stop.is_empty() && add.is_empty() {
            control.serving = now;
            return Ok(());
        }
        let body = serde_json::json!({ "stop": stop, "add": add.iter().map(|(name, _)| &**name).collect::<Vec<_>>() });
        let fds: Vec<RawFd> = add.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
        match ask(&mut control.stream, id, "listeners", &body.to_string(), &fds, CONTROL_TIMEOUT) {
            Ok(answer) if answer == "ok" => {
                control.serving = now;
                Ok(())
            }
            Ok(error) => Err(error),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Whether worker process `index` accepts on its row of the table.
    fn in_step(&self, index: usize, control: &Control) -> bool {
        let table = lock(&self.sockets);
        let ids = |s: &Serving| s.iter().map(|(id, ..)| *id).collect::<Vec<_>>();
        ids(&control.serving) == ids(&serving(&table[index]))
    }
}

/// What a row of the table holds, by id, listener and address.
fn serving(row: &[Held]) -> Serving {
    row.iter().map(|h| (h.id, h.listener.name.clone(), h.address)).collect()
}

/// A worker process just started: its control socket (installed once it serves), the configuration and the
/// sockets it was given.
struct Starting {
    stream: UnixStream,
    config: Arc<LoadedConfig>,
    serving: Serving,
}

pub struct Master {
    slots: Vec<Slot>,
    controls: Arc<Controls>,
    global: Arc<Global>,
    /// The running configuration, handed to each worker process as it starts.
    running: RunningConfig,
}

impl Master {
    pub fn new(sockets: Vec<Vec<BoundListener>>, global: Arc<Global>, running: RunningConfig) -> Master {
        let count = sockets.len();
        let next_socket = AtomicU64::new(1);
        let sockets = sockets
            .into_iter()
            .map(|row| {
                let held = |listener: BoundListener| Held {
                    id: next_socket.fetch_add(1, Ordering::Relaxed),
                    address: listener.socket.local_addr().ok(),
                    listener,
                };
                row.into_iter().map(held).collect()
            })
            .collect();
        Master {
            slots: (0..count).map(|_| Slot { child: None, deaths: 0, started: Instant::now(), due: None }).collect(),
            controls: Arc::new(Controls {
                slots: (0..count).map(|_| Mutex::new(None)).collect(),
                next_id: AtomicU64::new(1),
                next_generation: AtomicU64::new(1),
                metrics: Mutex::new(MetricsMemory { last: vec![None; count], retired: String::new() }),
                sockets: Mutex::new(sockets),
                next_socket,
                changing: Mutex::new(()),
            }),
            global,
            running,
        }
    }

    /// Starts every worker process and waits until each serves: start-up (and an upgrade, which waits for this
    /// process's READY) fails when one cannot, rather than reporting ready while nothing answers.
    pub fn start_all(&mut self) -> std::io::Result<()> {
        let mut starting = Vec::with_capacity(self.slots.len());
        for index in 0..self.slots.len() {
            starting.push(self.spawn(index)?);
        }
        let deadline = Instant::now() + START_TIMEOUT;
        for (index, mut started) in starting.into_iter().enumerate() {
            if let Err(e) = wait_ready(&mut started.stream, deadline) {
                let status = match e.kind() {
                    std::io::ErrorKind::TimedOut => format!("not serving within {START_TIMEOUT:?}"),
                    _ => {
                        let status = self.slots[index].child.as_mut().and_then(|c| c.wait().ok());
                        format!("exited before it served ({})", status.map_or("ended".into(), |s| s.to_string()))
                    }
                };
                return Err(std::io::Error::other(format!("worker process {index} {status}; see its error above")));
            }
            self.controls.install(index, started.stream, started.serving);
            catch_up(&self.controls, &self.running, index, &started.config);
        }
        Ok(())
    }

    /// Starts worker process `index` with its current sockets and the running configuration.
    fn spawn(&mut self, index: usize) -> std::io::Result<Starting> {
        let (ours, theirs) = UnixStream::pair()?;
        ours.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        ours.set_write_timeout(Some(CONTROL_TIMEOUT))?;
        // The sockets before the configuration: a reload stores its configuration before it changes the table,
        // so a worker process never gets a socket whose listener its configuration does not have.
        let (sockets, serving) = self.controls.current(index)?;
        let running = (self.running)();
        let config = running_configuration(&running)?;
        let mut passed: Vec<RawFd> = sockets.iter().map(|l| l.socket.as_raw_fd()).collect();
        passed.push(theirs.as_raw_fd());
        passed.push(config.as_raw_fd());
        // The rate-limit table every worker process maps (made before the first worker started).
        let table = crate::rate_table::made().map(|t| t.fd());
        passed.extend(table);
        // Above every descriptor being passed, so placing one never overwrites another not yet placed.
        let first = passed.iter().copied().max().map_or(FIRST_FD, |m| (m + 1).max(FIRST_FD));
        let listeners = passed.len() - 2 - usize::from(table.is_some());
        let master = std::process::id();
        let mut command = Command::new("/proc/self/exe");
        // `ps` shows the command line Portico was started with; the process name says which worker it is.
        if let Some(arg0) = std::env::args_os().next() {
            command.arg0(arg0);
        }
        command
            .args(std::env::args_os().skip(1))
            .env(WORKER_ENV, format!("{index}/{}/{master}", self.slots.len()))
            .env("LISTEN_FDS", listeners.to_string())
            .env("LISTEN_FDS_FIRST_FD", first.to_string())
            .env(CONTROL_FD_ENV, (first + listeners as RawFd).to_string())
            .env(CONFIG_FD_ENV, (first + listeners as RawFd + 1).to_string())
            .env(CONFIG_NAME_ENV, &running.file)
            .env(crate::rate_table::TABLE_FD_ENV, (first + listeners as RawFd + 2).to_string())
            .env(LISTENERS_ENV, sockets.iter().map(|l| &*l.name).collect::<Vec<_>>().join(","))
            .env_remove("LISTEN_PID")
            .env_remove("NOTIFY_SOCKET")
            .env_remove(crate::systemd::UPGRADE_FROM_ENV)
            .env_remove(crate::systemd::SYSTEMD_SOCKET_ENV);
        // SAFETY: between fork and exec only async-signal-safe calls (dup2, sigprocmask, prctl, getppid, _exit).
        unsafe {
            command.pre_exec(move || {
                for (i, fd) in passed.iter().enumerate() {
                    if libc::dup2(*fd, first + i as RawFd) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // Signals wait until the worker's handlers exist (the mask survives exec).
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                for signal in HANDLED_SIGNALS {
                    libc::sigaddset(&mut set, signal);
                }
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                // The worker goes (draining) when the master does, even on kill -9.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if libc::getppid() as u32 != master {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        drop((theirs, config, sockets));
        let slot = &mut self.slots[index];
        slot.child = Some(child);
        slot.started = Instant::now();
        slot.due = None;
        Ok(Starting { stream: ours, config: running, serving })
    }

    /// When a worker process that exited is due to start again, if one is.
    pub fn next_due(&self) -> Option<Instant> {
        self.slots.iter().filter(|s| s.child.is_none()).filter_map(|s| s.due).min()
    }

    /// Restarts worker processes that exited, with a back-off that grows with repeated deaths. Called when a
    /// child exits (SIGCHLD) and when a restart is due.
    pub fn check(&mut self) {
        let now = Instant::now();
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            if let Some(status) = slot.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                slot.child = None;
                // A worker that ran for a minute starts the count again.
                slot.deaths = if slot.started.elapsed() > Duration::from_secs(60) { 1 } else { slot.deaths + 1 };
                let backoff = Duration::from_millis(100 << slot.deaths.min(6)).min(Duration::from_secs(5));
                slot.due = Some(now + backoff);
                self.global.worker_restarts.fetch_add(1, Ordering::Relaxed);
                tracing::error!(worker = index, "worker process exited ({status}); starting it again in {backoff:?}");
            }
            if self.slots[index].child.is_none() && self.slots[index].due.is_some_and(|due| due <= now) {
                match self.spawn(index) {
                    Ok(mut started) => {
                        // Installed once it serves, off this thread (it also handles signals).
                        let (controls, running) = (self.controls.clone(), self.running.clone());
                        let waiting = std::thread::Builder::new().name("portico-restart".into()).spawn(move || {
                            if wait_ready(&mut started.stream, Instant::now() + START_TIMEOUT).is_ok() {
                                controls.install(index, started.stream, started.serving);
                                catch_up(&controls, &running, index, &started.config);
                            }
                        });
                        if let Err(e) = waiting {
                            tracing::error!(worker = index, "cannot wait for the worker process: {e}");
                        }
                    }
                    Err(e) => {
                        tracing::error!(worker = index, "cannot start the worker process again: {e}");
                        self.slots[index].due = Some(now + Duration::from_secs(5));
                    }
                }
            }
        }
    }

    /// Sends `signal` to every running worker process.
    pub fn signal_all(&self, signal: i32) {
        for child in self.slots.iter().filter_map(|s| s.child.as_ref()) {
            // SAFETY: kill(2) on a child of this process that has not been reaped (its pid cannot be reused).
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }

    /// How many worker processes there are (each with its own socket on every listener).
    pub fn count(&self) -> usize {
        self.slots.len()
    }

    /// For reloads: gives every worker process the configuration text the master validated and applied, then
    /// (when the reload adds, moves or removes listeners) its new sockets, and stops the old ones; `Err` names the
    /// worker processes that did not apply it. One that does not take its sockets is restarted with them.
    pub fn reloader(&self) -> impl Fn(&str, Option<ListenerUpdate>) -> Result<(), String> + Send + Sync + 'static {
        let controls = self.controls.clone();
        move |source: &str, update: Option<ListenerUpdate>| {
            let _changing = lock(&controls.changing);
            if let Some(update) = update {
                controls.change(update);
            }
            let refusals: Vec<String> = controls
                .each(|index, guard, id| {
                    // Starting (or about to be started again): it catches up with the running configuration and
                    // sockets once it serves.
                    let control = guard.as_mut()?;
                    let answer = ask(&mut control.stream, id, "reload", source, &[], RELOAD_TIMEOUT);
                    let mut refusal = match &answer {
                        Ok(ok) if ok == "ok" => None,
                        Ok(error) => Some(format!("worker process {index}: {error}")),
                        Err(e) => Some(format!("worker process {index} did not answer: {e}")),
                    };
                    // Its new sockets only once it runs the configuration that has their listeners.
                    if refusal.is_none() {
                        let id = controls.next_id.fetch_add(1, Ordering::Relaxed);
                        if let Err(e) = controls.sync(index, control, id) {
                            refusal = Some(format!("worker process {index} did not take its listening sockets: {e}"));
                        }
                    }
                    // A clean timeout leaves the stream in step (the late answer is skipped by its id); any other
                    // error leaves it out of step or closed. And a worker process must accept on every socket the
                    // master keeps for it (connections queued on one it does not would wait for nothing). Either
                    // way its control socket is dropped: seeing its end closed, it drains and is started again,
                    // with the running configuration and its sockets.
                    let broken = matches!(&answer, Err(e) if e.kind() != std::io::ErrorKind::TimedOut);
                    if broken || !controls.in_step(index, control) {
                        *guard = None;
                        refusal = refusal.map(|r| format!("{r}; it is started again with the running listeners"));
                    }
                    refusal
                })
                .into_iter()
                .enumerate()
                .filter_map(|(index, r)| r.unwrap_or_else(|| Some(format!("worker process {index}: panicked"))))
                .collect();
            match refusals.is_empty() {
                true => Ok(()),
                false => {
                    Err(format!("the master applied it, but not every worker process did:\n{}", refusals.join("\n")))
                }
            }
        }
    }

    /// For the admin API: asks each worker process for `what` (`metrics`, `clusters`). For metrics, a worker
    /// that does not answer in time counts with its last answer, and replaced ones with their last counters, so
    /// counters never go down.
    pub fn gatherer(&self) -> GatherFn {
        let controls = self.controls.clone();
        Arc::new(move |what: &str| {
            let answers = controls.ask_all(what, "", CONTROL_TIMEOUT);
            if what != "metrics" {
                return answers.into_iter().filter_map(|(_, answer)| answer.ok()).collect();
            }
            let mut memory = controls.metrics.lock().unwrap_or_else(|p| p.into_inner());
            let mut texts = Vec::with_capacity(answers.len() + 1);
            for (index, (generation, answer)) in answers.into_iter().enumerate() {
                let current =
                    controls.slots[index].lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|c| c.generation);
                match answer {
                    // From the process now in the slot: remembered.
                    Ok(text) if current == Some(generation) => memory.last[index] = Some((generation, text)),
                    // From a process replaced meanwhile (already counted in the retired total), or none.
                    _ => {}
                }
                texts.extend(memory.last[index].as_ref().map(|(_, text)| text.clone()));
            }
            texts.push(memory.retired.clone());
            texts
        })
    }

    /// Copies of every worker's listening sockets, as they are now (for an upgrade to inherit).
    pub fn sockets(&self) -> Vec<std::net::TcpListener> {
        let table = lock(&self.controls.sockets);
        table.iter().flatten().filter_map(|h| h.listener.socket.try_clone().ok()).collect()
    }

    /// Shutdown: every worker process drains (SIGTERM) within `grace`; any still running after it is killed.
    pub fn stop(mut self, grace: Duration) {
        self.signal_all(libc::SIGTERM);
        drop(std::mem::take(&mut *lock(&self.controls.sockets)));
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

/// The counter and histogram families of an exposition (what must keep adding up after its process is gone).
fn counters_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut keep = false;
    let mut help = "";
    for line in text.lines() {
        if line.starts_with("# HELP ") {
            help = line;
            continue;
        }
        if let Some(kind) = line.strip_prefix("# TYPE ").and_then(|t| t.split(' ').nth(1)) {
            keep = matches!(kind, "counter" | "histogram");
            if keep {
                out.push_str(help);
                out.push('\n');
            }
        }
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
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
pub fn masters_configuration() -> Option<Result<LoadedConfig, String>> {
    identity()?;
    let fd: RawFd = std::env::var(CONFIG_FD_ENV).ok()?.parse().ok()?;
    // SAFETY: the master placed the memory file at this descriptor, and nothing else owns it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut source = String::new();
    let read =
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0)).and_then(|_| file.read_to_string(&mut source));
    if let Err(e) = read {
        return Some(Err(format!("cannot read the configuration passed by the master: {e}")));
    }
    let name = std::env::var(CONFIG_NAME_ENV).unwrap_or_else(|_| "portico.yaml".into());
    Some(portico_config::load_str(&source, &name).map_err(|e| format!("invalid configuration\n{e}")))
}

/// Waits for a worker process's first message, which says it serves.
fn wait_ready(stream: &mut UnixStream, deadline: Instant) -> std::io::Result<()> {
    loop {
        match read_message(stream) {
            Ok((0, _)) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut && Instant::now() < deadline => {}
            Err(e) => return Err(e),
        }
    }
}

/// A worker process that starts serving, started with a configuration or sockets that a reload has replaced
/// since: gives it the running configuration, then its current sockets (or starts it again when it cannot take
/// them).
fn catch_up(controls: &Controls, running: &RunningConfig, index: usize, started_with: &Arc<LoadedConfig>) {
    let _changing = lock(&controls.changing);
    let running = running();
    let mut guard = lock(&controls.slots[index]);
    let Some(control) = guard.as_mut() else { return };
    let mut configured = true;
    if !Arc::ptr_eq(&running, started_with) {
        let id = controls.next_id.fetch_add(1, Ordering::Relaxed);
        match ask(&mut control.stream, id, "reload", &running.source, &[], RELOAD_TIMEOUT) {
            Ok(answer) if answer == "ok" => {}
            answer => {
                configured = false;
                tracing::error!(
                    worker = index,
                    "the restarted worker process did not take the running configuration: {answer:?}"
                );
            }
        }
    }
    let id = controls.next_id.fetch_add(1, Ordering::Relaxed);
    let taken = match configured {
        true => controls.sync(index, control, id),
        false => Err("it did not take the configuration".into()),
    };
    // A worker process must accept on every socket the master keeps for it: started again, it gets them all.
    match taken {
        Err(e) if !controls.in_step(index, control) => {
            tracing::error!(
                worker = index,
                "the worker process did not take its listening sockets ({e}); starting it again"
            );
            *guard = None;
        }
        _ => {}
    }
}

/// Reads one answer: `ID LENGTH\n` and LENGTH bytes. A timeout before its first byte is `TimedOut` (the stream
/// is still in step); one inside the message is `InvalidData` (it is not).
fn read_message(stream: &mut UnixStream) -> std::io::Result<(u64, String)> {
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut header = Vec::with_capacity(32);
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        match stream.read_exact(&mut byte) {
            Ok(()) => {}
            Err(e)
                if header.is_empty()
                    && matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
            {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"))
            }
            Err(e) if header.is_empty() => return Err(e),
            Err(e) => return Err(invalid(&format!("cut inside a control message: {e}"))),
        }
        header.push(byte[0]);
        if header.len() > 64 {
            return Err(invalid("control header too long"));
        }
    }
    let header = std::str::from_utf8(&header).map_err(|_| invalid("control header not UTF-8"))?;
    let (id, length) = header.trim_end().split_once(' ').ok_or_else(|| invalid("bad control header"))?;
    let id: u64 = id.parse().map_err(|_| invalid("bad control id"))?;
    let length: usize = length.parse().map_err(|_| invalid("bad control length"))?;
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).map_err(|e| invalid(&format!("cut inside a control message: {e}")))?;
    Ok((id, String::from_utf8(body).map_err(|_| invalid("control body not UTF-8"))?))
}

/// One question on a control socket, with `fds` passed along, and its answer within `timeout` (older answers,
/// to questions that timed out, are skipped). A question not written whole is a `BrokenPipe`: the stream is out
/// of step.
fn ask(
    stream: &mut UnixStream,
    id: u64,
    verb: &str,
    body: &str,
    fds: &[RawFd],
    timeout: Duration,
) -> std::io::Result<String> {
    stream.set_read_timeout(Some(timeout.min(CONTROL_TIMEOUT)))?;
    stream.set_write_timeout(Some(timeout))?;
    send_message(stream, format!("{id} {verb} {}\n{body}", body.len()).as_bytes(), fds)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::BrokenPipe, e))?;
    let deadline = Instant::now() + timeout;
    loop {
        match read_message(stream) {
            Ok((answer_id, answer)) if answer_id == id => return Ok(answer),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut && Instant::now() < deadline => {}
            Err(e) => return Err(e),
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"));
        }
    }
}

/// Writes `message` with `fds` attached to its first bytes (SCM_RIGHTS, at most `FDS_PER_SEND` with each byte:
/// every descriptor has its listener's name in the message, so there are bytes enough).
fn send_message(stream: &mut UnixStream, message: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
    let mut sent = 0;
    for chunk in fds.chunks(FDS_PER_SEND) {
        if sent >= message.len() {
            return Err(std::io::Error::other("more descriptors than message bytes"));
        }
        let piece = [IoSlice::new(&message[sent..sent + 1])];
        let rights = [ControlMessage::ScmRights(chunk)];
        loop {
            match sendmsg::<UnixAddr>(stream.as_raw_fd(), &piece, &rights, MsgFlags::MSG_NOSIGNAL, None) {
                Ok(n) => {
                    sent += n;
                    break;
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    stream.write_all(&message[sent..])
}

/// The worker process's end of the control socket, read with recvmsg so that descriptors passed with a message
/// are kept (in the order they came) rather than lost.
struct ControlReader {
    stream: UnixStream,
    fds: VecDeque<OwnedFd>,
}

impl Read for ControlReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        let mut space = nix::cmsg_space!([RawFd; 253]);
        let mut iov = [IoSliceMut::new(buf)];
        let message = recvmsg::<()>(self.stream.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(std::io::Error::from)?;
        // A truncated set (never, with room for the kernel's maximum) leaves the stream's descriptors out of step.
        let messages = message.cmsgs().map_err(|e| std::io::Error::other(format!("passed descriptors cut: {e}")))?;
        for received in messages {
            if let ControlMessageOwned::ScmRights(fds) = received {
                // SAFETY: the kernel just installed these descriptors in this process for this message; nothing
                // else owns them.
                self.fds.extend(fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        Ok(message.bytes)
    }
}

/// In a worker process: the `listeners` message's body and the descriptors passed with it, as the sockets to
/// start accepting on and the ones to stop.
fn passed_listeners(body: &str, fds: &mut VecDeque<OwnedFd>) -> Result<(Vec<BoundListener>, Stops), String> {
    let json: serde_json::Value = serde_json::from_str(body).map_err(|e| format!("bad listeners message: {e}"))?;
    let names: Vec<&str> = json["add"].as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect();
    let mut stop = Vec::new();
    for pair in json["stop"].as_array().into_iter().flatten() {
        let (Some(name), Some(address)) = (pair[0].as_str(), pair[1].as_str().and_then(|a| a.parse().ok())) else {
            return Err(format!("bad listener to stop: {pair}"));
        };
        stop.push((Arc::from(name), address));
    }
    if fds.len() < names.len() {
        return Err(format!("the master passed {} sockets for {} listeners", fds.len(), names.len()));
    }
    let add = names
        .into_iter()
        .map(|name| BoundListener {
            name: Arc::from(name),
            socket: std::net::TcpListener::from(fds.pop_front().expect("counted")),
        })
        .collect();
    Ok((add, stop))
}

/// In a worker process, once it serves: tells the master so, then answers its questions until the master goes
/// (then this process drains, as on SIGTERM). `view` answers `metrics`, `clusters`, `sample` and `errors` (the
/// plane's exposition and view, the dashboard's counters and recent errors); `apply` applies a configuration text
/// for a reload; `listen` starts accepting on the sockets passed (by listener) and stops the ones named (by
/// listener and address).
pub fn serve_control(
    view: impl Fn(&str) -> String + Send + 'static,
    apply: impl Fn(&str) -> Result<(), String> + Send + 'static,
    listen: impl Fn(Vec<BoundListener>, Stops) -> Result<(), String> + Send + 'static,
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
    writer.write_all(b"0 0\n")?;
    std::thread::Builder::new().name("portico-control".into()).spawn(move || {
        let mut reader = BufReader::new(ControlReader { stream, fds: VecDeque::new() });
        loop {
            let mut header = String::new();
            if !matches!(reader.read_line(&mut header), Ok(n) if n > 0) {
                break;
            }
            let fields: Vec<&str> = header.split_whitespace().collect();
            let [id, verb, length] = fields[..] else { break };
            let mut body = vec![0u8; length.parse().unwrap_or(0)];
            if reader.read_exact(&mut body).is_err() {
                break;
            }
            let answer = match verb {
                "metrics" | "clusters" | "sample" | "errors" => view(verb),
                "reload" => match apply(&String::from_utf8_lossy(&body)) {
                    Ok(()) => "ok".to_string(),
                    Err(e) => e,
                },
                "listeners" => {
                    let passed = passed_listeners(&String::from_utf8_lossy(&body), &mut reader.get_mut().fds);
                    // Whatever came with this message is used or dropped now: the next starts in step.
                    reader.get_mut().fds.clear();
                    match passed.and_then(|(add, stop)| listen(add, stop)) {
                        Ok(()) => "ok".to_string(),
                        Err(e) => e,
                    }
                }
                _ => String::new(),
            };
            if writer.write_all(format!("{id} {}\n{answer}", answer.len()).as_bytes()).is_err() {
                break;
            }
        }
        // The master is gone (its end closed): drain and exit like on SIGTERM.
        // SAFETY: kill(2) on our own pid with a signal this process handles.
        unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    })?;
    Ok(())
}

/// In a worker process: every socket its master passed, under the listener name it was bound for. After a reload
/// that moved or removed a listener, the socket still has connections waiting (as a worker thread keeps its
/// socket).
pub fn sockets_from_master(inherited: &crate::systemd::Inherited) -> std::io::Result<Vec<BoundListener>> {
    let names = listener_names();
    let sockets = inherited
        .all()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot use the sockets passed by the master: {e}")))?;
    if names.len() != sockets.len() {
        let (s, n) = (sockets.len(), names.len());
        return Err(std::io::Error::other(format!("the master passed {s} sockets for {n} listeners")));
    }
    Ok(names.into_iter().zip(sockets).map(|(name, socket)| BoundListener { name: Arc::from(name), socket }).collect())
}

/// In a worker process: a signal meant for the whole Portico goes to the master.
pub fn forward_to_master(worker: Option<WorkerIdentity>, signal: i32) {
    if let Some(w) = worker {
        // SAFETY: kill(2) on the master's pid, which is this process's parent (checked at start).
        unsafe { libc::kill(w.master as libc::pid_t, signal) };
    }
}
