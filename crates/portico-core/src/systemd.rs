//! systemd's `Type=notify` protocol (READY once listening, RELOADING around a reload, STOPPING on shutdown) and
//! socket activation (listening sockets passed in `LISTEN_FDS`). Without systemd, both do nothing.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixDatagram;
use std::sync::{Mutex, OnceLock};

/// Listening sockets passed by systemd (or `systemd-socket-activate`), by the address they are bound to.
pub struct Inherited(Vec<(SocketAddr, TcpListener)>);

impl Inherited {
    pub fn from_env() -> Inherited {
        let mut fds = listenfd::ListenFd::from_env();
        let mut sockets = Vec::new();
        for i in 0..fds.len() {
            let taken = fds.take_tcp_listener(i);
            // Inherited descriptors are open across exec: keep them out of the processes Portico starts (worker
            // processes, an upgrade), which get exactly the sockets meant for them.
            if let Ok(Some(listener)) = &taken {
                if let Err(e) = set_cloexec(listener) {
                    tracing::warn!("cannot mark passed socket {i} close-on-exec: {e}");
                }
            }
            match taken {
                Ok(Some(listener)) => match listener.local_addr() {
                    Ok(addr) => sockets.push((addr, listener)),
                    Err(e) => tracing::warn!("socket {i} passed by systemd has no address: {e}"),
                },
                Ok(None) => {}
                Err(e) => tracing::warn!("socket {i} passed by systemd is not a TCP listener: {e}"),
            }
        }
        Inherited(sockets)
    }

    /// The sockets passed for `addr` (one from systemd; one per worker of the process being upgraded), ready for
    /// a worker: non-blocking, with TCP_NODELAY for the connections they accept.
    pub fn sockets_for(&self, addr: SocketAddr) -> std::io::Result<Vec<TcpListener>> {
        self.0.iter().filter(|(a, _)| *a == addr).map(|(_, listener)| ready_for_a_worker(listener)).collect()
    }

    /// Every passed socket, in the order passed, ready for a worker (as `sockets_for`).
    pub fn all(&self) -> std::io::Result<Vec<TcpListener>> {
        self.0.iter().map(|(_, listener)| ready_for_a_worker(listener)).collect()
    }

    /// Warns about passed sockets no listener uses.
    pub fn warn_unused(&self, used: &[SocketAddr]) {
        for (addr, _) in self.0.iter().filter(|(a, _)| !used.contains(a)) {
            tracing::warn!("systemd passed a socket for {addr}, which no listener has as its address; it is ignored");
        }
    }
}

fn ready_for_a_worker(listener: &TcpListener) -> std::io::Result<TcpListener> {
    let socket = listener.try_clone()?;
    socket.set_nonblocking(true)?;
    socket2::SockRef::from(&socket).set_tcp_nodelay(true)?;
    Ok(socket)
}

fn set_cloexec(socket: &TcpListener) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor `socket` owns.
    match unsafe { libc::fcntl(socket.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Where notifications go. After a zero-downtime upgrade the first READY goes to the old process's private socket
/// (it waits for it before draining); everything after that goes to systemd's socket, which the old process passes
/// on in `PORTICO_SYSTEMD_NOTIFY_SOCKET`. sd-notify only writes to `NOTIFY_SOCKET`, hence this small sender.
struct Targets {
    /// The socket the next READY goes to, once (the upgrading process's).
    upgrade: Option<String>,
    /// systemd's socket, if Portico runs under systemd.
    systemd: Option<String>,
}

fn targets() -> &'static Mutex<Targets> {
    static TARGETS: OnceLock<Mutex<Targets>> = OnceLock::new();
    TARGETS.get_or_init(|| {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        Mutex::new(match std::env::var_os(UPGRADE_FROM_ENV) {
            // Started by an upgrading Portico: NOTIFY_SOCKET is that process's private socket.
            Some(_) => Targets { upgrade: var("NOTIFY_SOCKET"), systemd: var(SYSTEMD_SOCKET_ENV) },
            None => Targets { upgrade: None, systemd: var("NOTIFY_SOCKET") },
        })
    })
}

/// Set by an upgrading Portico for the process it starts: the old pid.
pub const UPGRADE_FROM_ENV: &str = "PORTICO_UPGRADE_FROM";
/// Set by an upgrading Portico for the process it starts: systemd's notify socket (empty without systemd).
pub const SYSTEMD_SOCKET_ENV: &str = "PORTICO_SYSTEMD_NOTIFY_SOCKET";

/// systemd's notify socket, if any (to pass on to the process an upgrade starts).
pub fn systemd_socket() -> Option<String> {
    targets().lock().unwrap_or_else(|p| p.into_inner()).systemd.clone()
}

fn send_to(path: &str, message: &str) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    // systemd may name an abstract socket ("@name").
    match path.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(message.as_bytes(), &addr)?;
        }
        None => {
            socket.send_to(message.as_bytes(), path)?;
        }
    }
    Ok(())
}

fn send(message: &str) {
    let target = {
        let mut targets = targets().lock().unwrap_or_else(|p| p.into_inner());
        match message.starts_with("READY=1") {
            true => targets.upgrade.take().or_else(|| targets.systemd.clone()),
            false => targets.systemd.clone(),
        }
    };
    if let Some(path) = target {
        if let Err(e) = send_to(&path, message) {
            tracing::warn!("cannot notify systemd at {path}: {e}");
        }
    }
}

pub fn ready(status: &str) {
    send(&format!("READY=1\nSTATUS={status}\n"));
}

/// Before a reload. systemd 253 and later want the monotonic time with it.
pub fn reloading() {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    let usec = match unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) } {
        0 => format!("MONOTONIC_USEC={}\n", now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000),
        _ => String::new(),
    };
    send(&format!("RELOADING=1\n{usec}"));
}

pub fn stopping() {
    send("STOPPING=1\nSTATUS=draining\n");
}

/// After an upgrade: the new process (`pid`) is systemd's main process from now on, so `systemctl reload` and
/// `stop` reach it and this process's exit is not taken for the service's.
pub fn main_pid_is(pid: u32) {
    send(&format!("MAINPID={pid}\nSTATUS=upgraded to pid {pid}\n"));
}
