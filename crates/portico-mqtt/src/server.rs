//! A small multi-worker TCP server around [`serve`]: N worker threads, each a current-thread tokio runtime
//! with a `LocalSet` (as Portico's workers are), and one thread accepting connections and handing them to
//! the workers in turn. It is what the tests, the examples and a standalone broker use; the gateway uses its
//! own listeners and workers and calls [`serve`] directly (see the crate's "Wiring" section).

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::mpsc;
use tracing::warn;

use crate::broker::Broker;
use crate::connection::{serve, serve_parking};
use crate::park::Lot;

/// A running server. Dropping it stops accepting (connections already accepted run on).
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves `listener` with `workers` worker threads.
    pub fn start(broker: Broker, listener: TcpListener, workers: usize) -> std::io::Result<Server> {
        let addr = listener.local_addr()?;
        let mut senders = Vec::new();
        for index in 0..workers.max(1) {
            let (tx, mut rx) = mpsc::unbounded_channel::<(std::net::TcpStream, SocketAddr)>();
            senders.push(tx);
            let broker = broker.clone();
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            std::thread::Builder::new().name(format!("portico-mqtt-worker-{index}")).spawn(move || {
                let local = tokio::task::LocalSet::new();
                local.block_on(&runtime, async move {
                    // Idle connections park as in the gateway (see `crate::park`).
                    let spawn = |served, ()| drop(tokio::task::spawn_local(served));
                    let lot = match Lot::start(broker.clone(), index, || (), spawn) {
                        Ok(lot) => Some(lot),
                        Err(err) => {
                            warn!(error = %err, "cannot make the poller for idle connections");
                            None
                        }
                    };
                    while let Some((stream, peer)) = rx.recv().await {
                        let broker = broker.clone();
                        let stream =
                            match stream.set_nonblocking(true).and_then(|()| tokio::net::TcpStream::from_std(stream)) {
                                Ok(stream) => stream,
                                Err(err) => {
                                    warn!(error = %err, "cannot register an accepted connection");
                                    continue;
                                }
                            };
                        let _ = stream.set_nodelay(true);
                        match &lot {
                            Some(lot) => {
                                drop(tokio::task::spawn_local(serve_parking(stream, peer, &broker, index, lot.clone())))
                            }
                            None => drop(tokio::task::spawn_local(async move {
                                let _ = serve(stream, peer, &broker, index).await;
                            })),
                        }
                    }
                });
            })?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let acceptor = std::thread::Builder::new().name("portico-mqtt-accept".into()).spawn(move || {
            let mut next = 0;
            for stream in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let Ok(peer) = stream.peer_addr() else { continue };
                let _ = senders[next % senders.len()].send((stream, peer));
                next += 1;
            }
        })?;
        Ok(Server { addr, stop, acceptor: Some(acceptor) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the blocking accept.
        let _ = std::net::TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}
