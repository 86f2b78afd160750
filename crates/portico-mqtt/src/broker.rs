//! The broker's shared state and the operations connections perform on it: attaching to a session (with
//! takeover), routing a message to every subscriber's session, subscribing (with retained messages),
//! detaching (with wills and session expiry). [`Broker`] is a cheap handle (an `Arc`), `Send + Sync`, shared
//! by every worker.
//!
//! Locks, always taken in this order and never across an `.await`: the session table, then one session's
//! state, then the router or the retained table. Routing takes the router's read lock, collects the routes,
//! releases it, then takes each destination session's lock in turn.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How often a broker waiting for the store tries to open it, and how often it says it still waits.
const STORE_RETRY: Duration = Duration::from_millis(50);
const STORE_WAIT_WARNING: Duration = Duration::from_secs(10);

use bytestring::ByteString;
use tokio::sync::Notify;
use tracing::{debug, info};

use crate::codec::{ProtocolVersion, QoS, RetainHandling, SubscriptionId, SubscriptionOptions};
use crate::config::{BrokerConfig, Limits};
use crate::message::Message;
use crate::metrics::{Counter, Metrics};
use crate::retained::Retained;
use crate::router::{Route, Router};
use crate::session::{Attachment, Dropped, Outgoing, Session, SessionRef, SubscriptionRecord};
use crate::store::{unix_now, PersistedSession, PersistedSubscription, Store, StoreError, StoreOp};
use crate::sys::{is_sys_topic, Figures, SysState};
use crate::timers::Timers;
use crate::topic::FilterRef;

/// Why the broker did not open.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start the broker's timer thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// A handle on the broker.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").field("sessions", &self.session_count()).finish_non_exhaustive()
    }
}

struct Inner {
    config: BrokerConfig,
    /// The limits in force: `config.limits` at first, then whatever [`Broker::set_limits`] gave.
    limits: arc_swap::ArcSwap<Limits>,
    auth: arc_swap::ArcSwap<crate::auth::Auth>,
    router: Router<SessionRef>,
    sessions: Mutex<HashSet<ByTableKey>>,
    retained: Retained,
    /// Set at `open`, or later when the broker waits for another process to release the store.
    store: OnceLock<Store>,
    /// False while the broker waits for the store ([`Broker::ready`]).
    ready: AtomicBool,
    became_ready: Notify,
    timers: Timers<TimerEvent>,
    metrics: Metrics,
    next_key: AtomicU64,
    next_connection: AtomicU64,
    /// Set by [`Broker::drain`]: every connection ends as at a server's shutdown.
    draining: AtomicBool,
    /// Clients past CONNECT now, and the most there have been at once (`$SYS/broker/clients/...`).
    connected: AtomicU64,
    connected_max: AtomicU64,
    /// `$SYS/broker/...`: the retained ones (apart from clients' retained messages, never stored), what was
    /// published last, the interval in milliseconds (0: off) and the generation of the publishing timer
    /// (a changed interval starts a new one; the old one stops at its next turn).
    sys_retained: Retained,
    sys: Mutex<SysState>,
    sys_interval_ms: AtomicU64,
    sys_generation: AtomicU64,
    /// Wakes the connections still before CONNECT when the broker drains (the others have their session's).
    drain: Notify,
}

enum TimerEvent {
    Will {
        session: SessionRef,
        generation: u32,
        will: Box<Message>,
    },
    Expiry {
        session: SessionRef,
        generation: u32,
    },
    /// Time to publish `$SYS` (from the timer of this generation).
    Sys {
        generation: u64,
    },
}

/// A session in the broker's table, found by its client identifier (the session's own: the table keeps no
/// copy of it).
struct ByTableKey(SessionRef);

impl Borrow<str> for ByTableKey {
    fn borrow(&self) -> &str {
        self.0.client_id()
    }
}

impl std::hash::Hash for ByTableKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self.0.client_id()).hash(state)
    }
}

impl PartialEq for ByTableKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.client_id() == other.0.client_id()
    }
}

impl Eq for ByTableKey {}

/// What [`Broker::connect`] is asked for.
#[derive(Clone, Debug)]
pub struct ConnectParams {
    pub client_id: ByteString,
    pub version: ProtocolVersion,
    pub clean_start: bool,
    /// The Session Expiry Interval to apply (already capped), seconds.
    pub expiry: u32,
}

/// A connection attached to its session.
#[derive(Debug)]
pub struct Attached {
    pub session: SessionRef,
    pub connection: u64,
    pub session_present: bool,
}

/// What publishing a message did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Published {
    /// Subscribers it was routed to.
    pub matched: usize,
    /// Whether it was handed to the store (a persistent subscriber, or retained): the publisher's
    /// acknowledgement waits for [`Broker::sync`].
    pub persisted: bool,
}

impl Broker {
    /// Opens the broker: the store if configured, with the sessions and retained messages it holds.
    pub fn open(config: BrokerConfig) -> Result<Broker, BrokerError> {
        let (store, loaded, waiting) = match &config.persistence {
            Some(persistence) => match Store::open(persistence) {
                Ok((store, loaded)) => (Some(store), Some(loaded), None),
                Err(err) if persistence.wait_if_locked && err.is_locked() => {
                    info!(path = %persistence.path.display(), "the MQTT store is held by the process being replaced; MQTT clients wait until it is released");
                    (None, None, Some(persistence.clone()))
                }
                Err(err) => return Err(err.into()),
            },
            None => (None, None, None),
        };
        let slots = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        // The timer thread reaches the broker through a weak reference set once the broker exists.
        let slot: Arc<OnceLock<Weak<Inner>>> = Arc::new(OnceLock::new());
        let timer_slot = slot.clone();
        let timers = Timers::start("portico-mqtt-timers", move |event| {
            if let Some(inner) = timer_slot.get().and_then(Weak::upgrade) {
                Broker { inner }.fire(event);
            }
        })?;
        let inner = Arc::new(Inner {
            limits: arc_swap::ArcSwap::from_pointee(config.limits.clone()),
            auth: arc_swap::ArcSwap::from_pointee(config.auth.clone()),
            config,
            router: Router::new(),
            sessions: Mutex::new(HashSet::new()),
            retained: Retained::new(),
            store: store.map(OnceLock::from).unwrap_or_default(),
            ready: AtomicBool::new(waiting.is_none()),
            became_ready: Notify::new(),
            timers,
            metrics: Metrics::new(slots),
            next_key: AtomicU64::new(1),
            next_connection: AtomicU64::new(1),
            draining: AtomicBool::new(false),
            drain: Notify::new(),
            connected: AtomicU64::new(0),
            connected_max: AtomicU64::new(0),
            sys_retained: Retained::new(),
            sys: Mutex::new(SysState::new(Instant::now())),
            sys_interval_ms: AtomicU64::new(0),
            sys_generation: AtomicU64::new(0),
        });
        let _ = slot.set(Arc::downgrade(&inner));
        let broker = Broker { inner };
        if let Some(loaded) = loaded {
            broker.restore(loaded);
        }
        broker.set_sys_interval(broker.inner.config.sys_interval);
        if let Some(persistence) = waiting {
            let waiter = broker.clone();
            std::thread::Builder::new()
                .name("portico-mqtt-store-wait".into())
                .spawn(move || waiter.wait_for_store(&persistence))
                .map_err(BrokerError::Thread)?;
        }
        Ok(broker)
    }

    /// Opens the store once the process holding it lets it go, then restores what it holds and lets the
    /// waiting connections in.
    fn wait_for_store(&self, persistence: &crate::config::PersistenceConfig) {
        let started = Instant::now();
        let mut said = started;
        loop {
            std::thread::sleep(STORE_RETRY);
            match Store::open(persistence) {
                Ok((store, loaded)) => {
                    let _ = self.inner.store.set(store);
                    self.restore(loaded);
                    self.inner.ready.store(true, Ordering::Release);
                    self.inner.became_ready.notify_waiters();
                    info!(
                        waited_ms = started.elapsed().as_millis() as u64,
                        "MQTT store opened: MQTT clients are served"
                    );
                    return;
                }
                Err(err) if err.is_locked() => {
                    if said.elapsed() >= STORE_WAIT_WARNING {
                        said = Instant::now();
                        tracing::warn!(path = %persistence.path.display(), waited_s = started.elapsed().as_secs(), "the MQTT store is still held by another process; MQTT clients wait");
                    }
                }
                Err(err) => {
                    tracing::error!(path = %persistence.path.display(), error = %err, "cannot open the MQTT store; MQTT clients are not served (restart to try again)");
                    return;
                }
            }
        }
    }

    /// Whether the broker serves: false only while it waits for another process to release the store.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    /// Completes once the broker serves (at once, unless it waits for the store).
    pub async fn ready(&self) {
        loop {
            let notified = self.inner.became_ready.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.is_ready() {
                return;
            }
            notified.await;
        }
    }

    /// Closes the store (see [`Store::close`]) once no MQTT connection is left, or after `timeout`: for the
    /// process an upgrade replaces, so that the new one opens the store while this one drains its HTTP
    /// connections. Whether it closed.
    pub fn close_store_when_drained(&self, timeout: Duration) -> bool {
        let Some(store) = self.store() else { return false };
        let deadline = Instant::now() + timeout;
        while self.inner.metrics.get(Counter::Connections) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        store.close(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1)))
    }

    fn restore(&self, loaded: crate::store::Loaded) {
        let now = unix_now();
        let (mut sessions, mut messages) = (0, 0);
        for message in loaded.retained {
            self.inner.retained.restore(message);
        }
        for stored in loaded.sessions {
            let since = stored.session.disconnected_at.unwrap_or(now);
            let left = (since + u64::from(stored.session.expiry)).saturating_sub(now);
            if left == 0 {
                self.submit(StoreOp::DeleteSession { client_id: stored.client_id });
                continue;
            }
            let key = self.inner.next_key.fetch_add(1, Ordering::Relaxed);
            let session = SessionRef(Arc::new(Session::new(
                key,
                stored.client_id.clone(),
                stored.session.version,
                stored.session.expiry,
            )));
            {
                let mut state = session.lock();
                for sub in &stored.session.subscriptions {
                    self.inner.router.subscribe(&sub.filter, session.clone(), sub.options, sub.id);
                    state.subscriptions.insert(&sub.filter, SubscriptionRecord { options: sub.options, id: sub.id });
                }
                state.inbound_qos2.extend(stored.inbound_qos2);
            }
            messages += stored.messages.len();
            for (seq, message) in stored.messages {
                session.restore(seq, message);
            }
            self.schedule_expiry(&session, 0, Duration::from_secs(left));
            self.sessions().replace(ByTableKey(session));
            sessions += 1;
        }
        info!(sessions, messages, retained = self.inner.retained.len(), skipped = loaded.skipped, "MQTT store loaded");
    }

    /// The configuration the broker was opened with (its `limits` as they were then; see [`Broker::limits`]).
    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    /// The limits in force now. A connection reads them when it is accepted and keeps them; the queue limits
    /// (`max_queued_messages`, `queue_qos0_offline`) are read at each delivery.
    pub fn limits(&self) -> Arc<Limits> {
        self.inner.limits.load_full()
    }

    /// Replaces the limits (a configuration reload): new connections get them, open ones keep theirs
    /// (what a client was told in CONNACK stays true), queues apply them from the next delivery.
    pub fn set_limits(&self, limits: Limits) {
        self.inner.limits.store(Arc::new(limits));
    }

    /// Who may connect and what they may do, now. Connections read it at each CONNECT, PUBLISH and
    /// SUBSCRIBE.
    pub fn auth(&self) -> Arc<crate::auth::Auth> {
        self.inner.auth.load_full()
    }

    /// Replaces users and ACL (a reload): applies to the next CONNECT, PUBLISH and SUBSCRIBE; nobody is
    /// disconnected, and subscriptions already granted stay.
    pub fn set_auth(&self, auth: crate::auth::Auth) {
        self.inner.auth.store(Arc::new(auth));
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub fn store(&self) -> Option<&Store> {
        self.inner.store.get()
    }

    fn submit(&self, op: StoreOp) {
        if let Some(store) = self.inner.store.get() {
            store.submit(op);
        }
    }

    /// Completes when everything handed to the store so far is committed.
    pub fn sync(&self) -> Option<impl std::future::Future<Output = Result<(), Arc<StoreError>>> + Send + 'static> {
        self.inner.store.get().map(Store::sync)
    }

    fn sessions(&self) -> MutexGuard<'_, HashSet<ByTableKey>> {
        self.inner.sessions.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn session_count(&self) -> usize {
        self.sessions().len()
    }

    pub fn subscription_count(&self) -> usize {
        self.inner.router.len()
    }

    pub fn retained_count(&self) -> usize {
        self.inner.retained.len()
    }

    /// Drains every connection, as the shutdown future of [`crate::serve_until`] does one: what the store
    /// commits in time is acknowledged, v5 clients get DISCONNECT Server shutting down (0x8B), connections
    /// close. For the gateway's shutdown: one signal reaches every connection through what it already waits
    /// on (its session's wake-up), instead of a shutdown future kept by each idle connection. Connections
    /// made afterwards close at once.
    pub fn drain(&self) {
        self.inner.draining.store(true, Ordering::Release);
        self.inner.drain.notify_waiters();
        for ByTableKey(session) in self.sessions().iter() {
            if let Some(attachment) = &mut session.lock().attachment {
                attachment.wake();
            }
        }
    }

    /// Whether [`Broker::drain`] was called.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    /// Completes once [`Broker::drain`] is called.
    pub async fn drained(&self) {
        loop {
            let notified = self.inner.drain.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the flag is read, so a drain in between is not missed.
            notified.as_mut().enable();
            if self.is_draining() {
                return;
            }
            notified.await;
        }
    }

    /// Attaches a new connection to the session of `params.client_id`: resumes it unless `clean_start` or
    /// there is none, and takes it over from a connection still attached [MQTT-3.1.4-3].
    pub fn connect(&self, params: ConnectParams) -> Attached {
        let ConnectParams { client_id, version, clean_start, expiry } = params;
        let connection = self.inner.next_connection.fetch_add(1, Ordering::Relaxed);
        let connected = self.inner.connected.fetch_add(1, Ordering::Relaxed) + 1;
        self.inner.connected_max.fetch_max(connected, Ordering::Relaxed);
        let mut table = self.sessions();
        let existing = table.get(&*client_id).map(|s| s.0.clone());
        let resumed = match existing {
            Some(session) if !clean_start && !session.lock().ended => Some(session),
            Some(session) => {
                self.end_session(&session);
                table.remove(&*client_id);
                None
            }
            None => None,
        };
        let session_present = resumed.is_some();
        let session = match resumed {
            Some(session) => session,
            None => {
                let key = self.inner.next_key.fetch_add(1, Ordering::Relaxed);
                // The identifier moves into the session: one allocation, shared by nothing else.
                let session = SessionRef(Arc::new(Session::new(key, client_id, version, 0)));
                table.replace(ByTableKey(session.clone()));
                session
            }
        };
        drop(table);
        let mut state = session.lock();
        if let Some(old) = state.attachment.take() {
            debug!(client_id = %session.client_id(), "session taken over");
            old.detached();
        }
        let was_persistent = state.is_persistent();
        state.prepare_redelivery();
        state.generation = state.generation.wrapping_add(1);
        state.expiry = expiry;
        state.version = version;
        // Nothing to wake: the connection's loop starts by sending what the session holds.
        state.attachment = Some(Attachment::new(connection));
        if state.is_persistent() {
            self.submit(StoreOp::PutSession {
                client_id: session.client_id().clone(),
                session: persisted(&state, None),
            });
        } else if was_persistent {
            self.submit(StoreOp::DeleteSession { client_id: session.client_id().clone() });
        }
        drop(state);
        session.set_online(true);
        Attached { session, connection, session_present }
    }

    /// Ends a session: no more deliveries, its subscriptions out of the router, its records out of the store.
    /// The caller removes it from the table.
    fn end_session(&self, session: &SessionRef) {
        let mut state = session.lock();
        if state.ended {
            return;
        }
        state.ended = true;
        if let Some(attachment) = state.attachment.take() {
            attachment.detached();
        }
        session.set_online(false);
        for filter in state.subscriptions.keys() {
            self.inner.router.unsubscribe(filter, session.key());
        }
        if state.is_persistent() {
            self.submit(StoreOp::DeleteSession { client_id: session.client_id().clone() });
        }
    }

    /// Detaches `connection` from its session when the connection ends. `will` is the will to publish (an
    /// abnormal end, or DISCONNECT with 0x04) with its Will Delay Interval in seconds.
    pub fn disconnect(&self, session: &SessionRef, connection: u64, will: Option<(Message, u32)>) {
        self.inner.connected.fetch_sub(1, Ordering::Relaxed);
        let mut state = session.lock();
        let mine = state.attachment.as_ref().is_some_and(|a| a.connection == connection);
        if mine {
            state.attachment = None;
            session.set_online(false);
        }
        let (generation, expiry, ended) = (state.generation, state.expiry, state.ended);
        if mine && !ended && expiry > 0 {
            self.submit(StoreOp::PutSession {
                client_id: session.client_id().clone(),
                session: persisted(&state, Some(unix_now())),
            });
        }
        drop(state);
        if let Some((will, delay)) = will {
            // The will goes when the delay is over or the session ends, whichever is first (3.1.3.2.2); a
            // connection taking the session over before that cancels it.
            let delay = delay.min(if mine { expiry } else { delay });
            if delay == 0 {
                self.publish_will(will);
            } else if mine {
                let at = Instant::now() + Duration::from_secs(delay.into());
                self.inner
                    .timers
                    .schedule(at, TimerEvent::Will { session: session.clone(), generation, will: Box::new(will) });
            }
        }
        if mine && !ended {
            if expiry == 0 {
                let mut table = self.sessions();
                if table.get(&**session.client_id()).is_some_and(|s| Arc::ptr_eq(&s.0 .0, &session.0)) {
                    table.remove(&**session.client_id());
                }
                self.end_session(session);
            } else {
                self.schedule_expiry(session, generation, Duration::from_secs(expiry.into()));
            }
        }
    }

    fn schedule_expiry(&self, session: &SessionRef, generation: u32, after: Duration) {
        // Interval caps keep this far below Instant's range; a saturating add guards the rest.
        let at = Instant::now().checked_add(after).unwrap_or_else(|| Instant::now() + Duration::from_secs(1 << 32));
        self.inner.timers.schedule(at, TimerEvent::Expiry { session: session.clone(), generation });
    }

    fn fire(&self, event: TimerEvent) {
        match event {
            TimerEvent::Will { session, generation, will } => {
                let state = session.lock();
                let due = state.generation == generation && state.attachment.is_none();
                drop(state);
                if due {
                    self.publish_will(*will);
                }
            }
            TimerEvent::Expiry { session, generation } => {
                let mut table = self.sessions();
                let state = session.lock();
                let due = state.generation == generation && state.attachment.is_none() && !state.ended;
                drop(state);
                if due {
                    debug!(client_id = %session.client_id(), "session expired");
                    table.remove(&**session.client_id());
                    self.end_session(&session);
                    self.inner.metrics.inc(0, Counter::SessionsExpired);
                }
            }
            TimerEvent::Sys { generation } => {
                if generation != self.inner.sys_generation.load(Ordering::Relaxed) {
                    return; // an older timer: the interval changed since
                }
                let interval = self.inner.sys_interval_ms.load(Ordering::Relaxed);
                if interval > 0 {
                    self.publish_sys(generation);
                    let at = Instant::now() + Duration::from_millis(interval);
                    self.inner.timers.schedule(at, TimerEvent::Sys { generation });
                }
            }
        }
    }

    /// Sets how often `$SYS/broker/...` is published (a reload): `0` stops it and removes the retained `$SYS`
    /// messages (stale figures would mislead); otherwise they are published now and then at each interval.
    pub fn set_sys_interval(&self, interval: Duration) {
        let ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        self.inner.sys_interval_ms.store(ms, Ordering::Relaxed);
        let generation = self.inner.sys_generation.fetch_add(1, Ordering::Relaxed) + 1;
        if ms == 0 {
            // Under the state's lock, which a publication in progress holds: it ends before this clears.
            let mut sys = self.sys_state();
            self.inner.sys_retained.clear();
            sys.reset();
        } else {
            self.inner.timers.schedule(Instant::now(), TimerEvent::Sys { generation });
        }
    }

    fn sys_state(&self) -> MutexGuard<'_, SysState> {
        self.inner.sys.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The figures `$SYS` publishes, read now.
    pub fn sys_figures(&self) -> Figures {
        let m = &self.inner.metrics;
        let get = |counters: &[Counter]| counters.iter().map(|&c| m.get(c).max(0) as u64).sum::<u64>();
        let retained = self.retained_count() as u64;
        let (mut sessions, mut held) = (0, 0);
        for ByTableKey(session) in self.sessions().iter() {
            let state = session.lock();
            sessions += 1;
            held += (state.inflight() + state.queued()) as u64;
        }
        Figures {
            connected: self.inner.connected.load(Ordering::Relaxed),
            connected_max: self.inner.connected_max.load(Ordering::Relaxed),
            sessions,
            expired: get(&[Counter::SessionsExpired]),
            packets_received: get(&[Counter::PacketsReceived]),
            packets_sent: get(&[Counter::PacketsSent]),
            publish_received: get(&[Counter::ReceivedQos0, Counter::ReceivedQos1, Counter::ReceivedQos2]),
            publish_sent: get(&[Counter::SentQos0, Counter::SentQos1, Counter::SentQos2]),
            publish_dropped: get(&[Counter::DroppedQueueFull, Counter::DroppedOffline, Counter::DroppedTooLarge]),
            bytes_received: get(&[Counter::BytesReceived]),
            bytes_sent: get(&[Counter::BytesSent]),
            sockets: get(&[Counter::ConnectionsAccepted]),
            connects: get(&[Counter::Connects]),
            subscriptions: self.subscription_count() as u64,
            retained,
            stored: retained + held,
        }
    }

    /// Publishes the `$SYS` topics whose value changed, retained (in their own table), at QoS 0; unless the
    /// interval changed since the timer of `generation` fired (it might have turned `$SYS` off).
    fn publish_sys(&self, generation: u64) {
        let figures = self.sys_figures();
        let mut sys = self.sys_state();
        if generation != self.inner.sys_generation.load(Ordering::Relaxed) {
            return;
        }
        let changed = sys.update(&figures, Instant::now());
        for (topic, value) in changed {
            let message = Arc::new(Message::new(ByteString::from(topic), value.into(), QoS::AtMostOnce, true));
            self.inner.sys_retained.set(message.clone(), None);
            self.route(message, 0);
        }
    }

    fn publish_will(&self, will: Message) {
        self.inner.metrics.inc(0, Counter::WillsPublished);
        self.publish(Arc::new(will), 0);
    }

    /// Routes `message` to every matching subscriber's session (and sets the topic's retained message when
    /// RETAIN is set). `worker` picks the metrics slot.
    pub fn publish(&self, message: Arc<Message>, worker: usize) -> Published {
        let store = self.inner.store.get();
        let mut retained = false;
        if message.retain {
            self.inner.retained.set(message.clone(), store);
            retained = store.is_some();
        }
        let mut published = self.route(message, worker);
        published.persisted |= retained;
        published
    }

    /// Delivers `message` to the session of every matching subscription.
    fn route(&self, message: Arc<Message>, worker: usize) -> Published {
        let store = self.inner.store.get();
        let mut published = Published::default();
        let mut routes: Vec<Route<SessionRef>> = Vec::new();
        self.inner.router.route(&message.topic, message.publisher, &mut routes);
        published.matched = routes.len();
        let limits = self.inner.limits.load();
        for route in routes {
            let qos = message.qos.min(route.max_qos);
            let persistent = qos != QoS::AtMostOnce && store.is_some();
            let out = Outgoing {
                qos,
                retain: message.retain && route.retain_as_published,
                subscription_ids: route.subscription_ids,
                message: message.clone(),
            };
            match route.subscriber.deliver(out, &limits, store) {
                Ok(()) => published.persisted |= persistent,
                Err(Dropped::QueueFull) => self.inner.metrics.inc(worker, Counter::DroppedQueueFull),
                Err(Dropped::Offline) => self.inner.metrics.inc(worker, Counter::DroppedOffline),
                Err(Dropped::Gone) => {}
            }
        }
        published
    }

    /// Publishes a message from outside MQTT (the HTTP publish bridge): `Err` for an invalid topic name;
    /// `Ok(Some(wait))` when the store was written (a persistent subscriber, or retained), which completes
    /// once it is committed; `Ok(None)` when nothing was written. Subject to `max_packet_size` as a client's
    /// PUBLISH is (the caller limits the payload).
    #[allow(clippy::type_complexity)]
    pub fn publish_external(
        &self,
        topic: &str,
        payload: bytes::Bytes,
        qos: QoS,
        retain: bool,
    ) -> Result<Option<impl std::future::Future<Output = Result<(), Arc<StoreError>>> + Send + 'static>, String> {
        if !crate::topic::is_valid_topic_name(topic) || topic.len() > usize::from(u16::MAX) || topic.contains('\0') {
            return Err(format!("{topic:?} is not a valid topic name"));
        }
        if is_sys_topic(topic) {
            return Err(format!("{topic:?} is the broker's own ($SYS)"));
        }
        let received = match qos {
            QoS::AtMostOnce => Counter::ReceivedQos0,
            QoS::AtLeastOnce => Counter::ReceivedQos1,
            QoS::ExactlyOnce => Counter::ReceivedQos2,
        };
        self.inner.metrics.inc(0, received);
        let message = Arc::new(Message::new(ByteString::from(topic), payload, qos, retain));
        let published = self.publish(message, 0);
        Ok(if published.persisted { self.sync() } else { None })
    }

    /// Adds (or replaces) the session's subscription to `filter` and queues the retained messages its
    /// Retain Handling asks for (none for a shared subscription, 4.8.2). Returns whether the store was
    /// written (the SUBACK waits for [`Broker::sync`]).
    pub fn subscribe(
        &self,
        session: &SessionRef,
        filter: &ByteString,
        options: SubscriptionOptions,
        id: Option<SubscriptionId>,
    ) -> bool {
        let mut state = session.lock();
        let existed = self.inner.router.subscribe(filter, session.clone(), options, id);
        state.subscriptions.insert(filter, SubscriptionRecord { options, id });
        let persist = state.is_persistent() && self.inner.store.get().is_some();
        if persist {
            self.submit(StoreOp::PutSession {
                client_id: session.client_id().clone(),
                session: persisted(&state, None),
            });
        }
        drop(state);
        let parsed = FilterRef::parse(filter);
        let send_retained = match options.retain_handling {
            RetainHandling::OnSubscribe => true,
            RetainHandling::OnNewSubscription => !existed,
            RetainHandling::Never => false,
        };
        if send_retained && !parsed.is_shared() {
            let store = self.inner.store.get();
            let sys = self.inner.sys_retained.matching(parsed.filter);
            for message in sys.into_iter().chain(self.inner.retained.matching(parsed.filter)) {
                let out = Outgoing {
                    qos: message.qos.min(options.qos),
                    retain: true, // [MQTT-3.3.1-8]
                    subscription_ids: id.into_iter().collect(),
                    message,
                };
                let _ = session.deliver(out, &self.inner.limits.load(), store);
            }
        }
        persist
    }

    /// Removes the session's subscription to `filter`; returns (whether there was one, whether the store was
    /// written).
    pub fn unsubscribe(&self, session: &SessionRef, filter: &ByteString) -> (bool, bool) {
        let mut state = session.lock();
        let existed = state.subscriptions.remove(filter).is_some();
        self.inner.router.unsubscribe(filter, session.key());
        let persist = existed && state.is_persistent() && self.inner.store.get().is_some();
        if persist {
            self.submit(StoreOp::PutSession {
                client_id: session.client_id().clone(),
                session: persisted(&state, None),
            });
        }
        (existed, persist)
    }

    /// Appends the broker's metrics in the Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        let m = &self.inner.metrics;
        let mut line = |name: &str, kind: &str, help: &str, samples: &[(&str, i64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        line(
            "portico_mqtt_connections_total",
            "counter",
            "MQTT connections accepted.",
            &[("", m.get(Counter::ConnectionsAccepted))],
        );
        line(
            "portico_mqtt_connections",
            "gauge",
            "MQTT connections past CONNECT.",
            &[("", m.get(Counter::Connections))],
        );
        line(
            "portico_mqtt_connections_parked",
            "gauge",
            "MQTT connections parked while idle: no task, no registration with the runtime.",
            &[("", m.get(Counter::Parked))],
        );
        line(
            "portico_mqtt_connect_refused_total",
            "counter",
            "CONNECTs refused.",
            &[("", m.get(Counter::ConnectRefused))],
        );
        line("portico_mqtt_sessions", "gauge", "Sessions, connected or not.", &[("", self.session_count() as i64)]);
        line(
            "portico_mqtt_subscriptions",
            "gauge",
            "Subscriptions in the router.",
            &[("", self.subscription_count() as i64)],
        );
        line("portico_mqtt_retained_messages", "gauge", "Retained messages.", &[("", self.retained_count() as i64)]);
        line(
            "portico_mqtt_messages_received_total",
            "counter",
            "PUBLISH packets received from clients, by QoS.",
            &[
                ("{qos=\"0\"}", m.get(Counter::ReceivedQos0)),
                ("{qos=\"1\"}", m.get(Counter::ReceivedQos1)),
                ("{qos=\"2\"}", m.get(Counter::ReceivedQos2)),
            ],
        );
        line(
            "portico_mqtt_messages_sent_total",
            "counter",
            "PUBLISH packets sent to clients, by QoS (redeliveries included).",
            &[
                ("{qos=\"0\"}", m.get(Counter::SentQos0)),
                ("{qos=\"1\"}", m.get(Counter::SentQos1)),
                ("{qos=\"2\"}", m.get(Counter::SentQos2)),
            ],
        );
        line(
            "portico_mqtt_messages_dropped_total",
            "counter",
            "Messages not delivered to a subscriber, by reason.",
            &[
                ("{reason=\"queue_full\"}", m.get(Counter::DroppedQueueFull)),
                ("{reason=\"offline_qos0\"}", m.get(Counter::DroppedOffline)),
                ("{reason=\"too_large\"}", m.get(Counter::DroppedTooLarge)),
            ],
        );
        line(
            "portico_mqtt_auth_failures_total",
            "counter",
            "CONNECTs refused for a bad user name or password, or for missing credentials.",
            &[("", m.get(Counter::AuthFailures))],
        );
        line(
            "portico_mqtt_acl_denied_total",
            "counter",
            "Operations the ACL refused, by operation.",
            &[
                ("{operation=\"publish\"}", m.get(Counter::AclDeniedPublish)),
                ("{operation=\"subscribe\"}", m.get(Counter::AclDeniedSubscribe)),
            ],
        );
        line(
            "portico_mqtt_protocol_errors_total",
            "counter",
            "Connections closed for a protocol violation or malformed packet.",
            &[("", m.get(Counter::ProtocolErrors))],
        );
        line(
            "portico_mqtt_keepalive_timeouts_total",
            "counter",
            "Connections closed by keep-alive.",
            &[("", m.get(Counter::KeepAliveTimeouts))],
        );
        line(
            "portico_mqtt_takeovers_total",
            "counter",
            "Connections closed by a session takeover.",
            &[("", m.get(Counter::TakenOver))],
        );
        line(
            "portico_mqtt_wills_published_total",
            "counter",
            "Will messages published.",
            &[("", m.get(Counter::WillsPublished))],
        );
        let (mut inflight, mut queued) = (0, 0);
        for ByTableKey(session) in self.sessions().iter() {
            let state = session.lock();
            inflight += state.inflight() as i64;
            queued += state.queued() as i64;
        }
        line(
            "portico_mqtt_inflight_messages",
            "gauge",
            "QoS 1/2 messages sent and not yet acknowledged.",
            &[("", inflight)],
        );
        line("portico_mqtt_queued_messages", "gauge", "Messages waiting in session queues.", &[("", queued)]);
        if let Some(store) = self.inner.store.get() {
            let s = store.stats();
            line(
                "portico_mqtt_store_commits_total",
                "counter",
                "Store write transactions committed.",
                &[("", s.commits.load(Ordering::Relaxed) as i64)],
            );
            line(
                "portico_mqtt_store_operations_total",
                "counter",
                "Store writes, batched into commits.",
                &[("", s.operations.load(Ordering::Relaxed) as i64)],
            );
            line(
                "portico_mqtt_store_errors_total",
                "counter",
                "Failed store commits.",
                &[("", s.errors.load(Ordering::Relaxed) as i64)],
            );
            let size = std::fs::metadata(store.path()).map(|m| m.len() as i64).unwrap_or(0);
            line("portico_mqtt_store_bytes", "gauge", "Size of the store file.", &[("", size)]);
            let seconds = s.commit_micros.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(out, "# HELP portico_mqtt_store_commit_seconds_total Time spent committing.\n# TYPE portico_mqtt_store_commit_seconds_total counter\nportico_mqtt_store_commit_seconds_total {seconds}");
        }
    }
}

/// The persisted form of a session's state.
fn persisted(state: &crate::session::SessionState, disconnected_at: Option<u64>) -> PersistedSession {
    PersistedSession {
        version: state.version,
        expiry: state.expiry,
        disconnected_at,
        subscriptions: state
            .subscriptions
            .iter()
            .map(|(filter, record)| PersistedSubscription {
                filter: ByteString::from(filter),
                options: record.options,
                id: record.id,
            })
            .collect(),
    }
}
