//! The broker as a plane of the gateway: the listeners with `protocol: mqtt` are served on every worker
//! thread with [`serve_as`], after the TLS handshake when the listener has `tls:`; the broker's metrics go
//! to the admin server's `/metrics` through [`MqttView`].
//!
//! One [`Broker`] per process, opened at start-up from the `mqtt:` section ([`broker_config`]). The
//! listeners themselves (their TLS acceptor, connection limit and counters) are the running configuration's,
//! which the binary hands over through [`Listeners`]: a reload's new certificates serve new MQTT connections
//! as they do HTTP ones, and the listener counters (`portico_tls_handshakes_total`, `portico_panics_total`)
//! count MQTT connections too. On shutdown every MQTT connection is drained ([`Broker::drain`], see
//! [`crate::serve_until`]), signalled once per worker rather than through a future each connection keeps.

use crate::auth::{Access, Acl, AclEntry, Auth, AuthError, Users};
use crate::broker::Broker;
use crate::config::{BrokerConfig, Limits, OnCorruptStore, PersistenceConfig};
use crate::connection::{serve_as, serve_parking};
use crate::park::Lot;
use futures_util::FutureExt;
use portico_config::LoadedConfig;
use portico_core::stats::{slot, ListenerStats};
use portico_core::tls::TlsTerminator;
use portico_core::view::PlaneView;
use portico_core::worker::{ConnectionGuard, Plane, PlaneWorker, WorkerCore};
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// The store's file inside `mqtt.persistence.path`.
pub const STORE_FILE: &str = "store.redb";

/// One MQTT listener as the running configuration has it.
pub struct MqttListener {
    pub tls: Option<Arc<TlsTerminator>>,
    /// The listener's counters, the ones the listener metrics report.
    pub stats: Arc<ListenerStats>,
    /// Connections open on the listener at most, across all workers.
    pub max_connections: usize,
}

/// Where the plane finds the running configuration's listeners.
pub trait Listeners: Send + Sync {
    /// Listener `name` of the running configuration, if it is `protocol: mqtt`.
    fn mqtt_listener(&self, name: &str) -> Option<MqttListener>;
    /// Worker threads (a listener's connection limit is shared among them).
    fn workers(&self) -> usize;
    /// How long open connections have to finish at shutdown (`shutdown.grace_period`).
    fn shutdown_grace(&self) -> Duration;
    /// The configuration running now.
    fn running_config(&self) -> Arc<LoadedConfig>;
}

/// What the broker is opened with, from the `mqtt:` section of `loaded` (a relative `persistence.path`
/// starts at the configuration file's directory).
pub fn broker_config(loaded: &LoadedConfig) -> BrokerConfig {
    let mqtt = &loaded.config.mqtt;
    BrokerConfig {
        persistence: mqtt.persistence.as_ref().map(|p| PersistenceConfig {
            path: loaded.resolve(&p.path).join(STORE_FILE),
            commit_delay: p.commit_delay.0,
            fsync: p.fsync,
            on_corrupt: match p.on_corrupt_store {
                portico_config::OnCorruptStore::MoveAside => OnCorruptStore::MoveAside,
                portico_config::OnCorruptStore::Fail => OnCorruptStore::Fail,
            },
            wait_if_locked: false,
        }),
        limits: limits(mqtt),
        auth: Auth::default(),
        sys_interval: sys_interval(&loaded.config),
    }
}

/// How often `$SYS` is published: `mqtt.sys_interval` when MQTT clients can connect (an MQTT listener, or a
/// route serving MQTT over WebSocket), otherwise never: nobody could read it, and an HTTP-only process must not
/// wake up to publish it.
pub fn sys_interval(config: &portico_config::Config) -> std::time::Duration {
    let mqtt_listener = config.listeners.iter().any(|l| l.protocol == portico_config::ListenerProtocol::Mqtt);
    if mqtt_listener || config.routes.iter().any(|r| r.mqtt.is_some()) {
        config.mqtt.sys_interval.0
    } else {
        std::time::Duration::ZERO
    }
}

/// Users and ACL from `mqtt.auth` and `mqtt.acl` of `loaded`, reading the password file (a relative path
/// starts at the configuration file's directory). Called at start-up and at every reload, so a changed
/// password file is read again on reload even when the configuration did not change.
pub fn auth(loaded: &LoadedConfig) -> Result<Auth, AuthError> {
    let mqtt = &loaded.config.mqtt;
    let users = match &mqtt.auth.password_file {
        Some(file) => Some(Arc::new(Users::load(&loaded.resolve(file))?)),
        None => None,
    };
    let acl = Acl {
        entries: mqtt
            .acl
            .iter()
            .map(|e| AclEntry {
                topic: e.topic.clone(),
                access: match e.access {
                    portico_config::MqttAccess::Read => Access::Read,
                    portico_config::MqttAccess::Write => Access::Write,
                    portico_config::MqttAccess::Readwrite => Access::ReadWrite,
                    portico_config::MqttAccess::Deny => Access::Deny,
                },
                user: e.user.clone(),
                client_id: e.client_id.clone(),
            })
            .collect(),
    };
    Ok(Auth {
        anonymous: mqtt.auth.anonymous_allowed(),
        users,
        use_certificate_as_username: mqtt.auth.use_certificate_as_username,
        acl,
    })
}

/// The broker's limits from `mqtt.limits` and `mqtt.response_information` (validated: the narrowing casts
/// cannot truncate).
pub fn limits(mqtt: &portico_config::Mqtt) -> Limits {
    let l = &mqtt.limits;
    let u16_of = |n: u32| u16::try_from(n).unwrap_or(u16::MAX);
    Limits {
        max_packet_size: u32::try_from(l.max_packet_size.0).unwrap_or(u32::MAX),
        receive_maximum: u16_of(l.receive_maximum),
        max_inflight: u16_of(l.max_inflight),
        max_queued_messages: l.max_queued_messages,
        queue_qos0_offline: l.queue_qos0_offline,
        max_keepalive: u16::try_from(l.max_keepalive.0.as_secs()).unwrap_or(u16::MAX),
        max_session_expiry: u32::try_from(l.max_session_expiry.0.as_secs()).unwrap_or(u32::MAX),
        topic_alias_maximum: u16_of(l.topic_alias_maximum),
        topic_aliases_to_clients: u16_of(l.topic_aliases_to_clients),
        response_information: mqtt.response_information.clone(),
        connect_timeout: l.connect_timeout.0,
        park_after: l.park_after.0,
    }
}

/// Applies a reloaded configuration to the running broker: new limits serve new connections (open ones
/// keep what their CONNACK told them; queue limits apply from the next message). A changed `persistence`
/// needs a restart: said in the log, and the broker keeps its store.
///
/// `auth` (from [`auth`], read before the reload is applied so that an unreadable password file fails it)
/// replaces users and ACL: the next CONNECT, PUBLISH and SUBSCRIBE use them; nobody is disconnected.
pub fn reload(broker: &Broker, before: &portico_config::Config, after: &portico_config::Config, auth: Auth) {
    let (sys_before, sys_after) = (sys_interval(before), sys_interval(after));
    let (before, after) = (&before.mqtt, &after.mqtt);
    let users = auth.users.as_ref().map_or(0, |u| u.len());
    let (anonymous, rules) = (auth.anonymous, auth.acl.entries.len());
    broker.set_auth(auth);
    tracing::info!(users, anonymous, acl_entries = rules, "MQTT users and ACL reloaded: they apply to new operations");
    if before.limits != after.limits || before.response_information != after.response_information {
        broker.set_limits(limits(after));
        tracing::info!("MQTT limits reloaded: new connections get them");
    }
    if sys_before != sys_after {
        broker.set_sys_interval(sys_after);
        tracing::info!(sys_interval = ?sys_after, "MQTT $SYS interval reloaded");
    }
    if before.persistence != after.persistence {
        tracing::warn!("`mqtt.persistence` is applied at start-up; restart to change it");
    }
}

/// The MQTT plane.
pub struct MqttPlane {
    pub broker: Broker,
    pub listeners: Arc<dyn Listeners>,
}

impl Plane for MqttPlane {
    fn start_worker(&self, core: &Rc<WorkerCore>) -> Rc<dyn PlaneWorker> {
        // The drain reaches every connection through its session's wake-up (`Broker::drain`), rather than
        // through a shutdown future kept by each idle connection. Every worker asks; the first one drains.
        let (broker, mut shutdown) = (self.broker.clone(), core.shutdown.clone());
        tokio::task::spawn_local(async move {
            let _ = shutdown.wait_for(|down| *down).await;
            broker.drain();
        });
        Rc::new(MqttWorker {
            core: core.clone(),
            broker: self.broker.clone(),
            listeners: self.listeners.clone(),
            lot: start_lot(core, &self.broker),
        })
    }
}

struct MqttWorker {
    core: Rc<WorkerCore>,
    broker: Broker,
    listeners: Arc<dyn Listeners>,
    /// Where this worker's idle plain-TCP connections wait (`None`: the poller could not be made; they keep
    /// their tasks).
    lot: Option<Rc<Lot<ConnectionGuard>>>,
}

/// The worker's [`Lot`]: a parked connection stays counted on the worker, and comes back on a task that
/// catches a panic as the accept loop's do.
fn start_lot(core: &Rc<WorkerCore>, broker: &Broker) -> Option<Rc<Lot<ConnectionGuard>>> {
    let index = core.index;
    let spawn = move |served: Pin<Box<dyn Future<Output = ()>>>, guard: ConnectionGuard| {
        tokio::task::spawn_local(async move {
            if let Err(panic) = AssertUnwindSafe(served).catch_unwind().await {
                let message = portico_core::panic::panic_message(panic.as_ref());
                let at = portico_core::panic::last_panic_location();
                tracing::error!(worker = index, "MQTT connection panicked at {at}: {message}");
            }
            drop(guard);
        });
    };
    let core = core.clone();
    let hold = move || core.hold_connection();
    match Lot::start(broker.clone(), index, hold, spawn) {
        Ok(lot) => Some(lot),
        Err(err) => {
            tracing::warn!(worker = index, error = %err, "cannot make the poller for idle MQTT connections");
            None
        }
    }
}

impl PlaneWorker for MqttWorker {
    fn serves(&self, listener: &str) -> bool {
        self.listeners.mqtt_listener(listener).is_some()
    }

    fn serve(self: Rc<Self>, io: TcpStream, peer: SocketAddr, listener: Arc<str>) -> Pin<Box<dyn Future<Output = ()>>> {
        let Some(settings) = self.listeners.mqtt_listener(&listener) else { return Box::pin(async {}) };
        let index = self.core.index;
        // Two futures rather than one with a branch, which would make every plain connection's as large as a
        // TLS one's (the TLS stream and its handshake: kilobytes per idle client). No shutdown future: the
        // drain comes through the broker (see `start_worker`).
        match settings.tls {
            None => match &self.lot {
                Some(lot) => Box::pin(serve_parking(io, peer, &self.broker, index, lot.clone())),
                None => Box::pin(serve_as(io, peer, None, &self.broker, index, std::future::pending()).map(drop)),
            },
            Some(tls) => Box::pin(async move {
                let Some(stream) = tls.handshake(io, &settings.stats, index).await else { return };
                // A certificate is there only if the listener asked for one and it was verified.
                let name = portico_core::tls::client_identity(stream.get_ref().1);
                let _ = serve_as(stream, peer, name, &self.broker, index, std::future::pending()).await;
            }),
        }
    }

    fn connection_limit(&self, listener: &str) -> usize {
        let total = self.listeners.mqtt_listener(listener).map_or(usize::MAX, |l| l.max_connections);
        total.div_ceil(self.listeners.workers().max(1))
    }

    fn shutdown_grace(&self) -> Duration {
        self.listeners.shutdown_grace()
    }

    fn connection_panicked(&self, listener: &str) {
        if let Some(l) = self.listeners.mqtt_listener(listener) {
            slot(&l.stats.slots, self.core.index).panics.inc();
        }
    }

    fn connection_evicted(&self, listener: &str) {
        if let Some(l) = self.listeners.mqtt_listener(listener) {
            slot(&l.stats.slots, self.core.index).evictions.inc();
        }
    }
}

/// What the MQTT plane shows the admin server: the broker's metrics and `/admin/mqtt`.
pub struct MqttView {
    pub broker: Broker,
    pub listeners: Arc<dyn Listeners>,
}

impl PlaneView for MqttView {
    fn render_metrics(&self, out: &mut String) {
        self.broker.render_metrics(out);
    }

    fn admin_view(&self, name: &str) -> Option<serde_json::Value> {
        (name == "mqtt").then(|| {
            let m = self.broker.metrics();
            serde_json::json!({
                "connections": m.get(crate::metrics::Counter::Connections),
                "sessions": self.broker.session_count(),
                "subscriptions": self.broker.subscription_count(),
                "retained_messages": self.broker.retained_count(),
                "persistence": self.broker.store().map(|s| s.path().display().to_string()),
            })
        })
    }

    fn running_config(&self) -> Arc<LoadedConfig> {
        self.listeners.running_config()
    }

    /// Messages received from clients (`requests`) and dropped (`errors`), and messages sent, for the dashboard.
    fn sample(&self, out: &mut Vec<portico_core::view::SeriesSample>) {
        use crate::metrics::Counter::*;
        let m = self.broker.metrics();
        let sum = |counters: &[crate::metrics::Counter]| counters.iter().map(|&c| m.get(c).max(0) as u64).sum::<u64>();
        let dropped = sum(&[DroppedQueueFull, DroppedOffline, DroppedTooLarge]);
        let sample = |name: &str, requests, errors| portico_core::view::SeriesSample {
            kind: "mqtt",
            name: name.into(),
            requests,
            errors,
            latency: None,
        };
        out.push(sample("received", sum(&[ReceivedQos0, ReceivedQos1, ReceivedQos2]), dropped));
        out.push(sample("sent", sum(&[SentQos0, SentQos1, SentQos2]), 0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration layer's defaults are the broker's own.
    #[test]
    fn the_configuration_defaults_are_the_brokers() {
        let loaded = portico_config::load_str(
            "listeners: [ { name: m, address: 127.0.0.1:1883, protocol: mqtt } ]\nmqtt: { persistence: { path: data } }\n",
            "/etc/portico/portico.yaml",
        )
        .expect("valid");
        let config = broker_config(&loaded);
        assert_eq!(format!("{:?}", config.limits), format!("{:?}", Limits::default()));
        assert_eq!(config.sys_interval, crate::config::DEFAULT_SYS_INTERVAL);
        let persistence = config.persistence.expect("persistence");
        let expected = PersistenceConfig::new("/etc/portico/data/store.redb");
        assert_eq!(format!("{persistence:?}"), format!("{expected:?}"));
    }
}
