//! Listening sockets: binding every worker's socket on each listener (or taking the ones systemd or an upgrade
//! passed), the table of what each worker thread listens on, and what a reload changes in it.

use crate::systemd::Inherited;
use crate::worker::{self, BoundListener};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// The worker threads' listening sockets and where each worker hears of changes to them: shared by the
/// supervisor (which restarts a worker on its current sockets), reloads (which add, move and remove listeners)
/// and upgrades (which hand every socket over).
#[derive(Default)]
pub struct WorkerSockets {
    pub sockets: Vec<Vec<BoundListener>>,
    pub changes: Vec<Option<worker::ListenerChanges>>,
}

/// Locks `m`, whatever a thread that panicked with it held left behind (the tables stay consistent).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a reload does to the listening sockets: listeners to bind (new, or at a new address) and to stop.
#[derive(Default)]
pub struct ListenerPlan {
    pub start: Vec<(Arc<str>, SocketAddr)>,
    pub stop: Vec<(Arc<str>, SocketAddr)>,
    /// Addresses served before the change: a new listener may take one over from a listener that goes.
    pub serving: Vec<SocketAddr>,
}

impl ListenerPlan {
    /// From the listeners (name, address) that run to the ones the next configuration has.
    pub fn between(current: &[(&str, SocketAddr)], next: &[(&str, SocketAddr)]) -> ListenerPlan {
        let find = |list: &[(&str, SocketAddr)], name: &str| list.iter().find(|(n, _)| *n == name).map(|(_, a)| *a);
        let mut plan = ListenerPlan { serving: current.iter().map(|(_, a)| *a).collect(), ..Default::default() };
        for (name, address) in next {
            if find(current, name) != Some(*address) {
                plan.start.push((Arc::from(*name), *address));
            }
        }
        for (name, address) in current {
            if find(next, name) != Some(*address) {
                plan.stop.push((Arc::from(*name), *address));
            }
        }
        plan
    }

    pub fn is_empty(&self) -> bool {
        self.start.is_empty() && self.stop.is_empty()
    }

    /// Binds every new socket, one per worker, before anything changes: a taken address fails the reload.
    pub fn bind(&self, workers: usize) -> Result<Vec<Vec<BoundListener>>, String> {
        let mut per_worker: Vec<Vec<BoundListener>> = (0..workers).map(|_| Vec::new()).collect();
        for (name, address) in &self.start {
            if !self.serving.contains(address) {
                worker::claim(*address).map_err(|e| bind_error(e, *address, name).to_string())?;
            }
            for slot in per_worker.iter_mut() {
                let socket = worker::bind(*address).map_err(|e| bind_error(e, *address, name).to_string())?;
                slot.push(BoundListener { name: name.clone(), socket });
            }
        }
        Ok(per_worker)
    }

    /// Hands the new sockets to the workers and stops the old ones; the table keeps what now serves.
    pub fn apply(self, bound: Vec<Vec<BoundListener>>, table: &mut WorkerSockets) {
        for (w, new) in bound.into_iter().enumerate() {
            table.change(w, &self.stop, new);
        }
    }
}

impl WorkerSockets {
    /// Worker `w` stops accepting on the sockets of `stop` (listener and address) and starts on `add`; the table
    /// keeps what now serves. Stops come first, so that when a socket is replaced by another on the same listener
    /// and address, the old one is the one stopped.
    pub fn change(&mut self, w: usize, stop: &[(Arc<str>, SocketAddr)], add: Vec<BoundListener>) {
        self.sockets[w].retain(|l| {
            let address = l.socket.local_addr().ok();
            !stop.iter().any(|(name, a)| *name == l.name && Some(*a) == address)
        });
        if let Some(changes) = &self.changes[w] {
            for (name, address) in stop {
                let _ = changes.send(worker::ListenerChange::Stop { name: name.clone(), address: *address });
            }
        }
        for l in add {
            if let (Some(changes), Ok(copy)) = (&self.changes[w], l.socket.try_clone()) {
                let _ = changes.send(worker::ListenerChange::Add(BoundListener { name: l.name.clone(), socket: copy }));
            }
            self.sockets[w].push(l);
        }
    }
}

/// Each worker's socket on every listener: the ones passed for its address (systemd, an upgrade), or bound now.
pub fn bind_per_worker(
    listeners: &[(&str, SocketAddr)],
    inherited: &Inherited,
    workers: usize,
) -> io::Result<Vec<Vec<BoundListener>>> {
    let mut per_worker: Vec<Vec<BoundListener>> = (0..workers).map(|_| Vec::new()).collect();
    for &(name, address) in listeners {
        let name: Arc<str> = Arc::from(name);
        let passed = inherited
            .sockets_for(address)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot use the socket passed for {address}: {e}")))?;
        if passed.is_empty() {
            worker::claim(address).map_err(|e| bind_error(e, address, &name))?;
            for slot in per_worker.iter_mut() {
                let socket = worker::bind(address).map_err(|e| bind_error(e, address, &name))?;
                slot.push(BoundListener { name: name.clone(), socket });
            }
            continue;
        }
        // Every passed socket is served (each may hold queued connections): spread over the workers, and a
        // worker without one shares a duplicate.
        let count = passed.len();
        for (i, socket) in passed.iter().enumerate() {
            per_worker[i % workers].push(BoundListener { name: name.clone(), socket: socket.try_clone()? });
        }
        for (w, slot) in per_worker.iter_mut().enumerate().skip(count) {
            slot.push(BoundListener { name: name.clone(), socket: passed[w % count].try_clone()? });
        }
    }
    Ok(per_worker)
}

/// What to do about a listener that cannot bind: the common causes have different fixes.
pub fn bind_error(e: io::Error, address: SocketAddr, listener: &str) -> io::Error {
    let hint = match e.kind() {
        io::ErrorKind::PermissionDenied => {
            "ports below 1024 need CAP_NET_BIND_SERVICE (AmbientCapabilities= in the systemd unit, or `setcap \
             cap_net_bind_service=+ep` on the binary) or a start as root with `user:`; see docs/operations.md"
        }
        io::ErrorKind::AddrInUse => {
            "another process listens there (another Portico too: only Portico's own workers and its upgrade \
             hand-over share a port); `ss -ltnp` shows which"
        }
        io::ErrorKind::AddrNotAvailable => "is the address assigned to an interface of this host?",
        _ => "",
    };
    let hint = if hint.is_empty() { String::new() } else { format!("; {hint}") };
    io::Error::new(e.kind(), format!("cannot listen on {address} (listener {listener:?}): {e}{hint}"))
}
