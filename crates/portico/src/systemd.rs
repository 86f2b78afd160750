//! systemd's `Type=notify` protocol (READY once listening, RELOADING around a reload, STOPPING on shutdown) and
//! socket activation (listening sockets passed in `LISTEN_FDS`). Without systemd, both do nothing.

use sd_notify::NotifyState;
use std::net::{SocketAddr, TcpListener};

/// Listening sockets passed by systemd (or `systemd-socket-activate`), by the address they are bound to.
pub struct Inherited(Vec<(SocketAddr, TcpListener)>);

impl Inherited {
    pub fn from_env() -> Inherited {
        let mut fds = listenfd::ListenFd::from_env();
        let mut sockets = Vec::new();
        for i in 0..fds.len() {
            match fds.take_tcp_listener(i) {
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
        self.0
            .iter()
            .filter(|(a, _)| *a == addr)
            .map(|(_, listener)| {
                let socket = listener.try_clone()?;
                socket.set_nonblocking(true)?;
                socket2::SockRef::from(&socket).set_tcp_nodelay(true)?;
                Ok(socket)
            })
            .collect()
    }

    /// Warns about passed sockets no listener uses.
    pub fn warn_unused(&self, used: &[SocketAddr]) {
        for (addr, _) in self.0.iter().filter(|(a, _)| !used.contains(a)) {
            tracing::warn!("systemd passed a socket for {addr}, which no listener has as its address; it is ignored");
        }
    }
}

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!("cannot notify systemd: {e}");
    }
}

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Before a reload. systemd 253 and later want the monotonic time with it.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}
