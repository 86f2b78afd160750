//! Zero-downtime binary upgrade (SIGUSR2): the binary now at this process's path is started with the listening
//! sockets (the systemd socket-passing convention, `LISTEN_FDS`, which Portico reads at start), and this process
//! waits until the new one reports READY on a notify socket of its own. The sockets are the same kernel objects,
//! so their accept queues carry over and no connection is refused; the old process then drains. Under systemd,
//! the old process names the new one as the service's main process (`MAINPID=`) before it goes.

use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

/// Where the passed sockets start in the new process (far from anything it opens itself before reading them).
const FIRST_FD: i32 = 1000;
/// How long the new process may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts the new binary on `sockets`; returns its pid once it is ready.
pub fn hand_over(sockets: &[&TcpListener]) -> std::io::Result<u32> {
    let exe = std::env::current_exe().map_err(|e| context(e, "cannot find this process's binary"))?;
    // A binary replaced on disk (the usual upgrade) shows as "... (deleted)": start the file now at that path.
    let exe = match exe.to_str().and_then(|p| p.strip_suffix(" (deleted)")) {
        Some(path) => std::path::PathBuf::from(path),
        None => exe,
    };
    let notify_path = std::env::temp_dir().join(format!("portico-upgrade-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&notify_path);
    let notify =
        UnixDatagram::bind(&notify_path).map_err(|e| context(e, "cannot create the upgrade's notify socket"))?;
    let (first, passed) = place(sockets)?;
    let mut child = Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env("LISTEN_FDS", sockets.len().to_string())
        .env("LISTEN_FDS_FIRST_FD", first.to_string())
        .env_remove("LISTEN_PID")
        .env("NOTIFY_SOCKET", &notify_path)
        .env(crate::systemd::UPGRADE_FROM_ENV, std::process::id().to_string())
        .env(crate::systemd::SYSTEMD_SOCKET_ENV, crate::systemd::systemd_socket().unwrap_or_default())
        .spawn()
        .map_err(|e| context(e, &format!("cannot start {}", exe.display())))?;
    drop(passed); // the child has its copies
    let deadline = Instant::now() + READY_TIMEOUT;
    let result = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Err(std::io::Error::other(format!("the new process exited before it was ready ({status})")));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break Err(std::io::Error::other(format!(
                "the new process was not ready within {READY_TIMEOUT:?}; it was stopped"
            )));
        }
        notify.set_read_timeout(Some(Duration::from_millis(100)))?;
        let mut buf = [0u8; 1024];
        if let Ok(n) = notify.recv(&mut buf) {
            if String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == "READY=1") {
                break Ok(child.id());
            }
        }
    };
    let _ = std::fs::remove_file(&notify_path);
    if let Ok(pid) = result {
        crate::systemd::main_pid_is(pid);
    }
    result
}

/// Duplicates `sockets` to consecutive descriptors from `FIRST_FD` or above every open descriptor (a process
/// started by an upgrade still holds the ones it inherited there), without close-on-exec, so the new process
/// inherits exactly those. Returned so the caller closes its copies once the child has started.
fn place(sockets: &[&TcpListener]) -> std::io::Result<(i32, Vec<OwnedFd>)> {
    let highest_open = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| context(e, "cannot list this process's descriptors"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .max()
        .unwrap_or(0);
    let first = FIRST_FD.max(highest_open + 1);
    let mut placed = Vec::with_capacity(sockets.len());
    for (i, socket) in sockets.iter().enumerate() {
        let target = first + i as i32;
        // SAFETY: F_DUPFD on a valid open descriptor makes a new one, the lowest free at or above `target`:
        // unlike dup2 it never replaces an open descriptor. Owned (and closed) by the returned OwnedFd.
        let fd = unsafe { libc::fcntl(socket.as_raw_fd(), libc::F_DUPFD, target) };
        if fd < 0 {
            return Err(std::io::Error::other(format!("cannot pass socket {i}: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: `fd` was just created by fcntl and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        if fd.as_raw_fd() != target {
            return Err(std::io::Error::other(format!(
                "cannot pass socket {i}: descriptor {target} was taken meanwhile; try again"
            )));
        }
        placed.push(fd);
    }
    Ok((first, placed))
}

/// `e`, saying what was being done.
fn context(e: std::io::Error, what: &str) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}
