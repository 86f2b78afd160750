//! One thread that fires events at deadlines: will delays and session expiries, which outlive the
//! connection (and the worker) that set them. Events are few (one per disconnection at most), so a heap and
//! a channel serve; nothing here is on a message's path.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::mpsc;
use std::time::Instant;

/// A handle on the timer thread. Dropping it stops the thread (pending events are dropped).
#[derive(Debug)]
pub struct Timers<E> {
    tx: mpsc::Sender<(Instant, E)>,
}

impl<E: Send + 'static> Timers<E> {
    /// Starts the thread; `fire` runs on it for each event whose deadline has passed.
    pub fn start(name: &str, mut fire: impl FnMut(E) + Send + 'static) -> std::io::Result<Timers<E>> {
        let (tx, rx) = mpsc::channel::<(Instant, E)>();
        std::thread::Builder::new().name(name.into()).spawn(move || {
            let mut heap: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
            let mut events: HashMap<u64, E> = HashMap::new();
            let mut next_id = 0u64;
            loop {
                let now = Instant::now();
                while let Some(Reverse((at, id))) = heap.peek().copied() {
                    if at > now {
                        break;
                    }
                    heap.pop();
                    if let Some(event) = events.remove(&id) {
                        fire(event);
                    }
                }
                let received = match heap.peek() {
                    Some(Reverse((at, _))) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
                    None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                };
                match received {
                    Ok((at, event)) => {
                        heap.push(Reverse((at, next_id)));
                        events.insert(next_id, event);
                        next_id += 1;
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        })?;
        Ok(Timers { tx })
    }

    pub fn schedule(&self, at: Instant, event: E) {
        let _ = self.tx.send((at, event));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn events_fire_in_deadline_order() {
        let (tx, rx) = mpsc::channel();
        let timers = Timers::start("test-timers", move |e: u32| tx.send(e).unwrap()).unwrap();
        let now = Instant::now();
        timers.schedule(now + Duration::from_millis(60), 2);
        timers.schedule(now + Duration::from_millis(20), 1);
        assert_eq!(rx.recv_timeout(Duration::from_secs(2)).unwrap(), 1);
        assert_eq!(rx.recv_timeout(Duration::from_secs(2)).unwrap(), 2);
    }
}
