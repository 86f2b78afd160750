use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::codec::{ProtocolVersion, QoS};

fn config(dir: &tempfile::TempDir) -> PersistenceConfig {
    PersistenceConfig::new(dir.path().join("mqtt.redb"))
}

fn message(topic: &str, payload: &'static [u8], qos: QoS) -> Arc<Message> {
    Arc::new(Message::new(topic.into(), Bytes::from_static(payload), qos, false))
}

fn session() -> PersistedSession {
    PersistedSession { version: ProtocolVersion::V5, expiry: 60, disconnected_at: None, subscriptions: Vec::new() }
}

fn stored(packet_id: u16, message: Arc<Message>) -> StoredMessage {
    StoredMessage { packet_id, qos: message.qos, retain: false, subscription_ids: Vec::new(), released: false, message }
}

#[tokio::test]
async fn what_is_synced_is_there_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, loaded) = Store::open(&config(&dir)).unwrap();
        assert!(loaded.sessions.is_empty());
        let cid: ByteString = "c".into();
        store.submit(StoreOp::PutSession { client_id: cid.clone(), session: session() });
        for seq in 1..=3 {
            let op = StoreOp::PutMessage {
                client_id: cid.clone(),
                seq,
                stored: stored(seq as u16, message("t", b"m", QoS::ExactlyOnce)),
            };
            store.submit(op);
        }
        store.submit(StoreOp::DeleteMessage { client_id: cid.clone(), seq: 2 });
        store.submit(StoreOp::SetReleased { client_id: cid.clone(), seq: 3 });
        store.submit(StoreOp::PutInbound { client_id: cid.clone(), packet_id: 7 });
        store.submit(StoreOp::PutRetained { message: message("r", b"kept", QoS::AtLeastOnce) });
        store.sync().await.unwrap();
    }
    let (store, loaded) = Store::open(&config(&dir)).unwrap();
    assert_eq!(loaded.sessions.len(), 1);
    let s = &loaded.sessions[0];
    assert_eq!(s.session, session());
    assert_eq!(s.messages.iter().map(|(seq, m)| (*seq, m.released)).collect::<Vec<_>>(), [(1, false), (3, true)]);
    assert_eq!(s.inbound_qos2, [7]);
    assert_eq!(&loaded.retained[0].payload[..], b"kept");
    assert!(store.next_seq() > 3, "keys keep increasing across restarts");
    store.submit(StoreOp::DeleteSession { client_id: "c".into() });
    store.sync().await.unwrap();
    drop(store);
    let (_, loaded) = Store::open(&config(&dir)).unwrap();
    assert!(loaded.sessions.is_empty());
}

#[test]
fn a_garbage_file_is_moved_aside_and_the_store_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(&dir);
    std::fs::write(&config.path, vec![0xA5u8; 64 * 1024]).unwrap();
    let (_store, loaded) = Store::open(&config).unwrap();
    let aside = loaded.moved_aside.expect("moved aside");
    assert!(aside.exists() && aside.to_string_lossy().contains(".corrupt-"));
    assert!(loaded.sessions.is_empty());
}

#[tokio::test]
async fn a_truncated_file_does_not_stop_the_store_from_opening() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(&dir);
    {
        let (store, _) = Store::open(&config).unwrap();
        for seq in 0..200 {
            let op = StoreOp::PutMessage {
                client_id: "c".into(),
                seq,
                stored: stored(1 + seq as u16, message("t", b"payload", QoS::AtLeastOnce)),
            };
            store.submit(op);
        }
        store.sync().await.unwrap();
    }
    let len = std::fs::metadata(&config.path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&config.path).unwrap();
    file.set_len(len / 3).unwrap();
    drop(file);
    // Damaged or repaired, it opens.
    let (_store, loaded) = Store::open(&config).unwrap();
    if loaded.moved_aside.is_none() {
        assert!(loaded.sessions.len() <= 1);
    }
}

#[test]
fn on_corrupt_fail_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&dir);
    config.on_corrupt = OnCorruptStore::Fail;
    std::fs::write(&config.path, b"not a database at all").unwrap();
    assert!(matches!(Store::open(&config), Err(StoreError::Damaged(_))));
    assert!(config.path.exists(), "left where it was");
}
