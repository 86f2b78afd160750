//! Persistence: sessions that outlive their connection, their subscriptions, the messages owed to them,
//! the QoS 2 identifiers they have PUBRECed, and retained messages, in one embedded file.
//!
//! # Why redb
//!
//! redb and fjall both build here in seconds and are pure Rust (RocksDB takes 14 minutes). redb is one crate
//! with no background threads of its own, ACID write transactions with a checksummed commit, and crash
//! recovery on open; fjall is an LSM tree, better for write volumes far beyond a broker's session state, with
//! compaction threads and more files to look after. The broker's writes are small records written and soon
//! deleted, committed in batches: a B-tree with copy-on-write commits suits them, and one file is easier to
//! move aside when it is damaged.
//!
//! # The contract, and group commit
//!
//! Every QoS 1 or 2 PUBLISH the broker acknowledges (PUBACK, PUBREC) has, before the acknowledgement is sent,
//! been committed: the message in each persistent subscriber's queue, and for QoS 2 the publisher's Packet
//! Identifier (so a resent PUBLISH after a crash is not routed twice). The PUBCOMP for a PUBREL is sent after
//! the identifier's removal is committed, so an identifier the client reuses is never mistaken for the old one.
//!
//! Writers never wait on the disk: a worker hands operations to the store's thread over a channel
//! ([`Store::submit`], non-blocking) and, where an acknowledgement depends on them, awaits a [`Store::sync`]
//! that completes when everything submitted before it is committed. The store's thread takes everything
//! waiting in the channel as one write transaction, commits it (one fsync for the batch), answers the syncs,
//! and starts over with whatever arrived meanwhile: under load, batches grow by themselves and the fsync cost
//! is shared by all the messages of a batch; idle, a lone message is committed at once.
//! [`PersistenceConfig::commit_delay`] waits a little longer for company (latency for fewer fsyncs), and
//! [`PersistenceConfig::fsync`] `false` drops the fsync (survives kill -9, not power loss).
//!
//! # A damaged file
//!
//! Opening never refuses to start on a damaged file unless told to ([`OnCorruptStore::Fail`]): a file redb
//! cannot open, or whose tables cannot be read, is reported (`error!` with the path and the cause), renamed to
//! `<file>.corrupt-<unix seconds>` beside it, and the broker starts with an empty store. A single record that
//! does not decode is reported and skipped. A file held by another process, or one the broker may not read,
//! is an error, not damage: nothing is moved.

mod record;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytestring::ByteString;
use redb::{Database, Durability, ReadableTable, TableDefinition};
use tokio::sync::oneshot;
use tracing::{error, warn};

use crate::config::{OnCorruptStore, PersistenceConfig};
use crate::message::Message;

pub use record::{PersistedSession, PersistedSubscription, StoredMessage};

const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
const MESSAGES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("messages");
const INBOUND: TableDefinition<(&str, u16), u8> = TableDefinition::new("inbound_qos2");
const RETAINED: TableDefinition<&str, &[u8]> = TableDefinition::new("retained");

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Boxed: redb's error is large and this one travels in every `Result` of the store.
    #[error("store: {0}")]
    Db(Box<redb::Error>),
    #[error("store: {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("store: a record does not decode: {0}")]
    BadRecord(String),
    #[error("store: the store has stopped")]
    Stopped,
    #[error("store: the store file is damaged and on_corrupt_store is fail: {0}")]
    Damaged(String),
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(err: $t) -> Self {
                StoreError::Db(Box::new(err.into()))
            }
        }
    )*};
}
from_redb!(redb::DatabaseError, redb::TransactionError, redb::TableError, redb::StorageError, redb::CommitError);

impl From<postcard::Error> for StoreError {
    fn from(err: postcard::Error) -> Self {
        StoreError::BadRecord(err.to_string())
    }
}

impl From<crate::codec::DecodeError> for StoreError {
    fn from(err: crate::codec::DecodeError) -> Self {
        StoreError::BadRecord(err.to_string())
    }
}

impl From<crate::codec::EncodeError> for StoreError {
    fn from(err: crate::codec::EncodeError) -> Self {
        StoreError::BadRecord(err.to_string())
    }
}

impl StoreError {
    /// Whether another process holds the store open (redb's lock on the file).
    pub fn is_locked(&self) -> bool {
        matches!(self, StoreError::Db(err) if matches!(**err, redb::Error::DatabaseAlreadyOpen))
    }

    /// Whether the error says the file's content is bad (as opposed to the file being locked, missing
    /// permissions, or the disk failing on write).
    fn is_damage(&self) -> bool {
        match self {
            StoreError::BadRecord(_) | StoreError::Damaged(_) => true,
            StoreError::Db(err) => match &**err {
                redb::Error::DatabaseAlreadyOpen => false,
                redb::Error::Io(io) => {
                    !matches!(io.kind(), std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::NotFound)
                }
                _ => true,
            },
            StoreError::Io { .. } | StoreError::Stopped => false,
        }
    }
}

/// One change to the store.
#[derive(Debug)]
pub enum StoreOp {
    PutSession {
        client_id: ByteString,
        session: PersistedSession,
    },
    /// Removes the session and everything it owns.
    DeleteSession {
        client_id: ByteString,
    },
    PutMessage {
        client_id: ByteString,
        seq: u64,
        stored: StoredMessage,
    },
    SetReleased {
        client_id: ByteString,
        seq: u64,
    },
    DeleteMessage {
        client_id: ByteString,
        seq: u64,
    },
    PutInbound {
        client_id: ByteString,
        packet_id: u16,
    },
    DeleteInbound {
        client_id: ByteString,
        packet_id: u16,
    },
    PutRetained {
        message: Arc<Message>,
    },
    DeleteRetained {
        topic: ByteString,
    },
}

enum Request {
    Op(StoreOp),
    Sync(oneshot::Sender<Result<(), Arc<StoreError>>>),
    /// Commit what came before, close the file (releasing its lock) and stop; answered once closed.
    Close(mpsc::Sender<()>),
}

/// What the store held when it was opened.
#[derive(Debug, Default)]
pub struct Loaded {
    pub sessions: Vec<LoadedSession>,
    pub retained: Vec<Message>,
    /// Records skipped because they did not decode.
    pub skipped: usize,
    /// Where a damaged file was moved, if it was.
    pub moved_aside: Option<PathBuf>,
}

#[derive(Debug)]
pub struct LoadedSession {
    pub client_id: ByteString,
    pub session: PersistedSession,
    /// In store-key (queue) order.
    pub messages: Vec<(u64, StoredMessage)>,
    pub inbound_qos2: Vec<u16>,
}

/// Counters the store keeps for the broker's metrics.
#[derive(Debug, Default)]
pub struct StoreStats {
    pub commits: AtomicU64,
    pub operations: AtomicU64,
    pub commit_micros: AtomicU64,
    pub errors: AtomicU64,
}

/// A handle on the store's thread.
#[derive(Debug)]
pub struct Store {
    tx: Option<mpsc::Sender<Request>>,
    next_seq: AtomicU64,
    stats: Arc<StoreStats>,
    path: PathBuf,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Op(op) => op.fmt(f),
            Request::Sync(_) => f.write_str("Sync"),
            Request::Close(_) => f.write_str("Close"),
        }
    }
}

impl Store {
    /// Opens (or creates) the store and reads what it holds. See the module documentation for damage.
    pub fn open(config: &PersistenceConfig) -> Result<(Store, Loaded), StoreError> {
        let path = config.path.clone();
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Io { path: dir.to_path_buf(), source })?;
        }
        let (db, mut loaded, moved_aside) = match open_and_load(&path) {
            Ok((db, loaded)) => (db, loaded, None),
            Err(err) if err.is_damage() && config.on_corrupt == OnCorruptStore::MoveAside => {
                let aside = aside_path(&path);
                error!(
                    path = %path.display(), error = %err, moved_to = %aside.display(),
                    "the MQTT store is damaged: moved aside, starting with an empty store"
                );
                std::fs::rename(&path, &aside).map_err(|source| StoreError::Io { path: path.clone(), source })?;
                let (db, loaded) = open_and_load(&path)?;
                (db, loaded, Some(aside))
            }
            Err(err) if err.is_damage() => return Err(StoreError::Damaged(err.to_string())),
            Err(err) => return Err(err),
        };
        loaded.moved_aside = moved_aside;
        let max_seq = loaded.sessions.iter().flat_map(|s| s.messages.iter().map(|(seq, _)| *seq)).max().unwrap_or(0);
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(StoreStats::default());
        let writer = Writer {
            db,
            rx,
            commit_delay: config.commit_delay,
            durability: if config.fsync { Durability::Immediate } else { Durability::Eventual },
            stats: stats.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("portico-mqtt-store".into())
            .spawn(move || writer.run())
            .map_err(|source| StoreError::Io { path: path.clone(), source })?;
        let store = Store { tx: Some(tx), next_seq: AtomicU64::new(max_seq + 1), stats, path, thread: Some(thread) };
        Ok((store, loaded))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// A new message key: increasing, so a session's messages read back in queue order.
    pub fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Hands `op` to the store's thread without waiting.
    pub fn submit(&self, op: StoreOp) {
        if let Some(tx) = &self.tx {
            if tx.send(Request::Op(op)).is_err() {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Commits what was submitted, closes the file, releasing its lock for another process (the new one of
    /// an upgrade), and stops the store: later writes fail (counted as errors) and [`Store::sync`] answers
    /// [`StoreError::Stopped`]. Waits up to `timeout`; whether the file was closed.
    pub fn close(&self, timeout: Duration) -> bool {
        let (done, closed) = mpsc::channel();
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(Request::Close(done)).is_ok());
        sent && closed.recv_timeout(timeout).is_ok()
    }

    /// Completes when everything submitted before it is committed (or the commit failed).
    pub fn sync(&self) -> impl std::future::Future<Output = Result<(), Arc<StoreError>>> + Send + 'static {
        let (done, wait) = oneshot::channel();
        let sent = self.tx.as_ref().is_some_and(|tx| tx.send(Request::Sync(done)).is_ok());
        async move {
            if !sent {
                return Err(Arc::new(StoreError::Stopped));
            }
            wait.await.unwrap_or_else(|_| Err(Arc::new(StoreError::Stopped)))
        }
    }
}

impl Drop for Store {
    /// Lets the writer commit what it has and stop.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn aside_path(path: &Path) -> PathBuf {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".corrupt-{secs}"));
    path.with_file_name(name)
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Opens the file and reads everything, catching a panic inside redb on a damaged file as damage.
fn open_and_load(path: &Path) -> Result<(Database, Loaded), StoreError> {
    let path = path.to_path_buf();
    std::panic::catch_unwind(move || -> Result<(Database, Loaded), StoreError> {
        let db = Database::create(&path)?;
        let txn = db.begin_write()?;
        txn.open_table(SESSIONS)?;
        txn.open_table(MESSAGES)?;
        txn.open_table(INBOUND)?;
        txn.open_table(RETAINED)?;
        txn.commit()?;
        let loaded = load(&db)?;
        Ok((db, loaded))
    })
    .unwrap_or_else(|_| Err(StoreError::Damaged("the store panicked while reading the file".into())))
}

fn load(db: &Database) -> Result<Loaded, StoreError> {
    let txn = db.begin_read()?;
    let mut loaded = Loaded::default();
    let sessions = txn.open_table(SESSIONS)?;
    let messages = txn.open_table(MESSAGES)?;
    let inbound = txn.open_table(INBOUND)?;
    for row in sessions.iter()? {
        let (key, value) = row?;
        let client_id = key.value();
        let session = match record::decode_session(value.value()) {
            Ok(session) => session,
            Err(err) => {
                warn!(client_id, error = %err, "MQTT store: session record skipped");
                loaded.skipped += 1;
                continue;
            }
        };
        let mut owed = Vec::new();
        for row in messages.range((client_id, 0)..=(client_id, u64::MAX))? {
            let (key, value) = row?;
            match record::decode_stored(value.value()) {
                Ok(stored) => owed.push((key.value().1, stored)),
                Err(err) => {
                    warn!(client_id, error = %err, "MQTT store: message record skipped");
                    loaded.skipped += 1;
                }
            }
        }
        let mut inbound_qos2 = Vec::new();
        for row in inbound.range((client_id, 0)..=(client_id, u16::MAX))? {
            inbound_qos2.push(row?.0.value().1);
        }
        loaded.sessions.push(LoadedSession { client_id: client_id.into(), session, messages: owed, inbound_qos2 });
    }
    for row in txn.open_table(RETAINED)?.iter()? {
        let (key, value) = row?;
        match record::decode_message(value.value()) {
            Ok(message) => loaded.retained.push(message),
            Err(err) => {
                warn!(topic = key.value(), error = %err, "MQTT store: retained record skipped");
                loaded.skipped += 1;
            }
        }
    }
    Ok(loaded)
}

/// The store's thread: batches requests into write transactions.
struct Writer {
    db: Database,
    rx: mpsc::Receiver<Request>,
    commit_delay: Duration,
    durability: Durability,
    stats: Arc<StoreStats>,
}

/// The largest batch: bounds one transaction's memory and the latency of the first request in it.
const MAX_BATCH: usize = 16 * 1024;

impl Writer {
    fn run(self) {
        let mut batch = Vec::new();
        let mut closing = None;
        // A close ends the batch it comes in: what came before it is committed, nothing after it is read.
        let mut take = |request: Request, batch: &mut Vec<Request>| match request {
            Request::Close(done) => {
                closing = Some(done);
                false
            }
            request => {
                batch.push(request);
                true
            }
        };
        'serving: while let Ok(first) = self.rx.recv() {
            let mut open = take(first, &mut batch);
            if open && !self.commit_delay.is_zero() {
                let deadline = Instant::now() + self.commit_delay;
                while open && batch.len() < MAX_BATCH {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.rx.recv_timeout(left) {
                        Ok(request) => open = take(request, &mut batch),
                        Err(_) => break,
                    }
                }
            }
            while open && batch.len() < MAX_BATCH {
                match self.rx.try_recv() {
                    Ok(request) => open = take(request, &mut batch),
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                self.commit(&mut batch);
            }
            if !open {
                break 'serving;
            }
        }
        drop(self);
        if let Some(done) = closing {
            let _ = done.send(());
        }
    }

    fn commit(&self, batch: &mut Vec<Request>) {
        let start = Instant::now();
        let mut syncs = Vec::new();
        let mut ops = 0u64;
        let result = self.apply(batch, &mut syncs, &mut ops);
        let result = match result {
            Ok(()) => Ok(()),
            Err(err) => {
                error!(error = %err, "MQTT store: commit failed; its acknowledgements are not sent");
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                Err(Arc::new(err))
            }
        };
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.stats.operations.fetch_add(ops, Ordering::Relaxed);
        self.stats.commit_micros.fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
        for sync in syncs {
            let _ = sync.send(result.clone());
        }
    }

    fn apply(
        &self,
        batch: &mut Vec<Request>,
        syncs: &mut Vec<oneshot::Sender<Result<(), Arc<StoreError>>>>,
        ops: &mut u64,
    ) -> Result<(), StoreError> {
        if batch.iter().all(|request| matches!(request, Request::Sync(_))) {
            // Nothing to write: everything before these syncs is in earlier, committed batches.
            syncs.extend(batch.drain(..).filter_map(|request| match request {
                Request::Sync(done) => Some(done),
                // `run` keeps closes out of batches.
                Request::Op(_) | Request::Close(_) => None,
            }));
            return Ok(());
        }
        let mut txn = self.db.begin_write()?;
        txn.set_durability(self.durability);
        let mut failed = None;
        {
            let mut sessions = txn.open_table(SESSIONS)?;
            let mut messages = txn.open_table(MESSAGES)?;
            let mut inbound = txn.open_table(INBOUND)?;
            let mut retained = txn.open_table(RETAINED)?;
            for request in batch.drain(..) {
                let op = match request {
                    Request::Op(op) => op,
                    Request::Sync(done) => {
                        syncs.push(done);
                        continue;
                    }
                    Request::Close(_) => continue,
                };
                *ops += 1;
                let outcome: Result<(), StoreError> = (|| {
                    match op {
                        StoreOp::PutSession { client_id, session } => {
                            sessions.insert(&*client_id, &record::encode_session(&session)?[..])?;
                        }
                        StoreOp::DeleteSession { client_id } => {
                            sessions.remove(&*client_id)?;
                            let id = &*client_id;
                            messages.retain_in((id, 0)..=(id, u64::MAX), |_, _| false)?;
                            inbound.retain_in((id, 0)..=(id, u16::MAX), |_, _| false)?;
                        }
                        StoreOp::PutMessage { client_id, seq, stored } => {
                            messages.insert((&*client_id, seq), &record::encode_stored(&stored)?[..])?;
                        }
                        StoreOp::SetReleased { client_id, seq } => {
                            let updated = match messages.get((&*client_id, seq))? {
                                Some(value) => Some(record::mark_released(value.value())?),
                                None => None,
                            };
                            if let Some(updated) = updated {
                                messages.insert((&*client_id, seq), &updated[..])?;
                            }
                        }
                        StoreOp::DeleteMessage { client_id, seq } => {
                            messages.remove((&*client_id, seq))?;
                        }
                        StoreOp::PutInbound { client_id, packet_id } => {
                            inbound.insert((&*client_id, packet_id), 0)?;
                        }
                        StoreOp::DeleteInbound { client_id, packet_id } => {
                            inbound.remove((&*client_id, packet_id))?;
                        }
                        StoreOp::PutRetained { message } => {
                            retained.insert(&*message.topic, &record::encode_message(&message)?[..])?;
                        }
                        StoreOp::DeleteRetained { topic } => {
                            retained.remove(&*topic)?;
                        }
                    }
                    Ok(())
                })();
                if let Err(err) = outcome {
                    // A record that cannot be encoded fails alone; a storage error fails the batch.
                    match err {
                        StoreError::BadRecord(what) => warn!(error = %what, "MQTT store: record not written"),
                        other => {
                            failed = Some(other);
                            break;
                        }
                    }
                }
            }
        }
        // Syncs left in the batch after a failure are answered with it too.
        for request in batch.drain(..) {
            if let Request::Sync(done) = request {
                syncs.push(done);
            }
        }
        if let Some(err) = failed {
            txn.abort()?;
            return Err(err);
        }
        txn.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
