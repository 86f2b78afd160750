//! The MQTT plane's wiring: its listeners are the running snapshot's (TLS acceptor, connection limit and
//! counters built with the HTTP listeners'), and the broker is opened once per process.

use anyhow::anyhow;
use arc_swap::ArcSwap;
use portico_config::{ListenerProtocol, LoadedConfig};
use portico_http::Snapshot;
use portico_mqtt::plane::{Listeners, MqttListener};
use std::sync::Arc;
use std::time::Duration;

/// The running snapshot's listeners, as the MQTT plane asks for them.
pub struct SnapshotListeners(pub Arc<ArcSwap<Snapshot>>);

impl Listeners for SnapshotListeners {
    fn mqtt_listener(&self, name: &str) -> Option<MqttListener> {
        let snapshot = self.0.load();
        let listener = snapshot.listener(name)?;
        protocol(&snapshot.source, name).filter(|p| *p == ListenerProtocol::Mqtt)?;
        Some(MqttListener {
            tls: listener.tls.clone(),
            stats: listener.stats.clone(),
            max_connections: listener.max_connections,
        })
    }

    fn workers(&self) -> usize {
        // With worker processes, the first one alone serves the MQTT listeners: the whole connection limit.
        let snapshot = self.0.load();
        match snapshot.source.config.process_model {
            portico_config::ProcessModel::MultiProcess => 1,
            portico_config::ProcessModel::Threads => snapshot.workers,
        }
    }

    fn shutdown_grace(&self) -> Duration {
        self.0.load().shutdown_grace
    }

    fn running_config(&self) -> Arc<LoadedConfig> {
        self.0.load().source.clone()
    }
}

/// The `protocol` of listener `name` in `loaded`.
pub fn protocol(loaded: &LoadedConfig, name: &str) -> Option<ListenerProtocol> {
    loaded.config.listeners.iter().find(|l| l.name == name).map(|l| l.protocol)
}

/// Opens the broker the configuration describes (reading its store back, if it has one).
pub fn open(loaded: &LoadedConfig) -> anyhow::Result<portico_mqtt::Broker> {
    let mut config = portico_mqtt::plane::broker_config(loaded);
    if let Some(persistence) = &mut config.persistence {
        // Started by an upgrade: the process being replaced holds the store until it has drained its MQTT
        // connections; MQTT clients wait for it, HTTP is served at once.
        // A worker process too: the one it replaces (a restart, an upgrade's old master's) may still hold it.
        persistence.wait_if_locked = std::env::var_os(portico_core::systemd::UPGRADE_FROM_ENV).is_some()
            || portico_core::processes::identity().is_some();
    }
    config.auth = portico_mqtt::plane::auth(loaded).map_err(|e| anyhow!("MQTT authentication: {e}"))?;
    let store = config.persistence.as_ref().map(|p| (p.path.display().to_string(), p.on_corrupt));
    portico_mqtt::Broker::open(config).map_err(|e| match store {
        Some((file, portico_mqtt::OnCorruptStore::Fail)) => anyhow!(
            "cannot open the MQTT store {file}: {e}\n  hint: `mqtt.persistence.on_corrupt_store: move_aside` moves a damaged store aside and starts empty"
        ),
        Some((file, _)) => anyhow!("cannot open the MQTT store {file}: {e}"),
        None => anyhow!("cannot start the MQTT broker: {e}"),
    })
}

/// Whether the configuration has a `protocol: mqtt` listener.
pub fn has_mqtt_listener(loaded: &LoadedConfig) -> bool {
    loaded.config.listeners.iter().any(|l| l.protocol == ListenerProtocol::Mqtt)
}

/// With worker processes, one broker serves MQTT: the first worker process's. So only it gets the MQTT
/// listeners' sockets (it runs them on its worker thread), and the other worker processes serve HTTP only.
/// A socket bound for another worker is closed here, before anything is accepted on it; one passed by an
/// upgrade is a duplicate of the first worker's.
pub fn only_first_worker_serves_mqtt(
    loaded: &LoadedConfig,
    per_worker: &mut [Vec<portico_core::worker::BoundListener>],
) {
    for sockets in per_worker.iter_mut().skip(1) {
        sockets.retain(|l| protocol(loaded, &l.name) != Some(ListenerProtocol::Mqtt));
    }
}

/// With worker processes, a reload may not add, move or remove MQTT listeners: their sockets belong to the
/// first worker process alone, which a reload's new sockets (one per worker process) would not respect.
pub fn mqtt_listeners_kept_with_worker_processes(before: &LoadedConfig, after: &LoadedConfig) -> Result<(), String> {
    if after.config.process_model != portico_config::ProcessModel::MultiProcess {
        return Ok(());
    }
    let mqtt = |loaded: &LoadedConfig| -> Vec<(String, String)> {
        let mut set: Vec<(String, String)> = loaded
            .config
            .listeners
            .iter()
            .filter(|l| l.protocol == ListenerProtocol::Mqtt)
            .map(|l| (l.name.clone(), l.address.clone()))
            .collect();
        set.sort();
        set
    };
    if mqtt(before) != mqtt(after) {
        return Err("with `process_model: multi_process`, MQTT listeners cannot be added, moved or removed by a reload: restart".into());
    }
    Ok(())
}

/// A reload may not change the protocol of a listener that stays where it is: its sockets keep serving the
/// plane they started with.
pub fn protocol_changes(before: &LoadedConfig, after: &LoadedConfig) -> Result<(), String> {
    for l in &after.config.listeners {
        let kept = before.config.listeners.iter().find(|b| b.name == l.name && b.address == l.address);
        if let Some(b) = kept.filter(|b| b.protocol != l.protocol) {
            return Err(format!(
                "listener {:?} changes its protocol from {:?} to {:?}: give it a new name or address, or restart",
                l.name, b.protocol, l.protocol
            ));
        }
    }
    Ok(())
}

/// The broker as the HTTP plane's `mqtt_publish:` routes publish to it.
pub struct BridgePublisher(pub portico_mqtt::Broker);

impl portico_http::mqtt_publish::MqttPublisher for BridgePublisher {
    fn publish(
        &self,
        topic: String,
        payload: bytes::Bytes,
        qos: u8,
        retain: bool,
    ) -> portico_http::mqtt_publish::PublishFuture {
        use portico_http::mqtt_publish::PublishError;
        let qos = portico_mqtt::codec::QoS::from_bits(qos).unwrap_or(portico_mqtt::codec::QoS::AtMostOnce);
        if !self.0.is_ready() {
            let why = "the MQTT store is still held by the process this one replaces".to_string();
            return Box::pin(async move { Err(PublishError::Unavailable(why)) });
        }
        let published = self.0.publish_external(&topic, payload, qos, retain);
        Box::pin(async move {
            match published {
                Err(why) => Err(PublishError::InvalidTopic(why)),
                Ok(None) => Ok(()),
                Ok(Some(commit)) => commit.await.map_err(|e| PublishError::Unavailable(e.to_string())),
            }
        })
    }
}

/// The broker as the HTTP plane's `mqtt: websocket` routes hand it their upgraded connections: served like a
/// TCP client's (counted in the MQTT metrics, drained on shutdown), over the WebSocket's byte stream.
pub struct WebSocketBroker(pub portico_mqtt::Broker);

impl portico_http::websocket::WebSocketService for WebSocketBroker {
    fn max_message_size(&self) -> usize {
        // A message may carry several packets: room for two of the largest, and never less than 64 KiB.
        let packet = usize::try_from(self.0.limits().max_packet_size).unwrap_or(usize::MAX);
        packet.saturating_mul(2).max(64 * 1024)
    }

    fn serve<'a>(
        &'a self,
        stream: portico_http::websocket::WebSocketBytes<'a>,
        client: portico_http::websocket::Upgraded,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>> {
        Box::pin(async move {
            let mut shutdown = client.shutdown;
            let draining = async move {
                let _ = shutdown.wait_for(|down| *down).await;
            };
            let (peer, user, worker) = (client.peer, client.certificate_user, client.worker);
            if let Err(e) = portico_mqtt::serve_as(stream, peer, user, &self.0, worker, draining).await {
                tracing::debug!(client = %peer, "MQTT over WebSocket connection ended: {e}");
            }
        })
    }
}
