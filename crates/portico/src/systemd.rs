//! systemd's `Type=notify` protocol: READY once listening, RELOADING around a reload, STOPPING on shutdown.
//! Without `$NOTIFY_SOCKET` (not started by systemd) every call does nothing.

use sd_notify::NotifyState;

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
