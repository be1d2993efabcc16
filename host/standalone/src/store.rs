//! The embedded database of a standalone installation: every Proxy's
//! record (identity, last desired state, status, finalizer), the plugins'
//! key-value stores and the log of operators' actions, in one redb file so
//! a restart resumes where it stopped.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use proxyfleet_core::kv::{self, CasOutcome, KvEntry, KvError, KvStore};
use proxyfleet_core::proxy::{ProxyDesired, ProxyMeta, ProxyStatus};
use redb::{Database, ReadableDatabase as _, ReadableTable as _, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `namespace/name` → JSON [`ProxyRecord`].
const PROXIES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("proxies");
/// `scope \0 key` → 8-byte little-endian version, then the value.
const KV: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("kv");
/// Counters.
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// Sequence number → JSON [`LoggedAction`]: the state log of operators'
/// actions, the last [`ACTIONS_KEPT`].
const ACTIONS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("actions");

/// Operators' actions the state log keeps; older ones are dropped.
pub const ACTIONS_KEPT: u64 = 10_000;

/// One operator's action in the state log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedAction {
    /// Unix seconds it was done.
    pub at: u64,
    /// What was done.
    #[serde(flatten)]
    pub action: proxyfleet_fleet::action::Action,
}
const KV_VERSION: &str = "kv-version";

/// What the store keeps of one Proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyRecord {
    /// Identity; the UID is made here the first time the Proxy is seen.
    pub meta: ProxyMeta,
    /// The desired state last read from the files (kept after the Proxy
    /// leaves them, so its instance can still be deleted).
    pub desired: ProxyDesired,
    /// Status.
    pub status: ProxyStatus,
    /// Our finalizer is on: an instance may exist.
    pub finalizer: bool,
    /// The Proxy left the files; its instance is being deleted.
    pub deleting: bool,
    /// The ProxyPool (`namespace/name`) the Proxy belongs to.
    #[serde(default)]
    pub pool: Option<String>,
    /// Unix seconds the record was made.
    #[serde(default)]
    pub created_at: u64,
}

impl ProxyRecord {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        record_key(&self.meta.namespace, &self.meta.name)
    }
}

/// The store key of a Proxy.
pub fn record_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The database.
#[derive(Debug)]
pub struct Store {
    /// Shared with the blocking tasks that commit plugin store writes.
    db: Arc<Database>,
    /// Moves on with every committed write of a Proxy record. The store
    /// is this process's alone (redb locks the file), so an unchanged
    /// number means unchanged records.
    record_writes: AtomicU64,
    /// Moves on with every record removed: of all record writes, the only
    /// kind that changes what the manifests' Proxies outside pools need.
    record_removals: AtomicU64,
    /// How many times every record was read ([`Store::records`]): the
    /// cost an idle installation must not keep paying.
    record_scans: AtomicU64,
    /// Keys of the records written since [`Store::take_changed`] last
    /// drained them: what the catalog publisher reads again, instead of
    /// every record.
    changed: Mutex<HashSet<String>>,
}

impl Store {
    /// Opens (or creates) the database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)
                .map_err(|err| Error::Store(format!("cannot create {}: {err}", dir.display())))?;
        }
        let db = Database::create(path).map_err(|err| {
            Error::Store(format!("cannot open state database {}: {err}", path.display()))
        })?;
        let txn = db.begin_write().map_err(store_err)?;
        txn.open_table(PROXIES).map_err(store_err)?;
        txn.open_table(KV).map_err(store_err)?;
        txn.open_table(META).map_err(store_err)?;
        txn.open_table(ACTIONS).map_err(store_err)?;
        txn.commit().map_err(store_err)?;
        Ok(Self {
            db: Arc::new(db),
            record_writes: AtomicU64::new(0),
            record_removals: AtomicU64::new(0),
            record_scans: AtomicU64::new(0),
            changed: Mutex::default(),
        })
    }

    /// Every Proxy record, by key.
    pub fn records(&self) -> Result<Vec<ProxyRecord>> {
        self.record_scans.fetch_add(1, Ordering::Relaxed);
        let txn = self.db.begin_read().map_err(store_err)?;
        let table = txn.open_table(PROXIES).map_err(store_err)?;
        let mut records = Vec::new();
        for item in table.iter().map_err(store_err)? {
            let (_, value) = item.map_err(store_err)?;
            records.push(decode(value.value())?);
        }
        Ok(records)
    }

    /// One record.
    pub fn record(&self, key: &str) -> Result<Option<ProxyRecord>> {
        let txn = self.db.begin_read().map_err(store_err)?;
        let table = txn.open_table(PROXIES).map_err(store_err)?;
        table.get(key).map_err(store_err)?.map(|v| decode(v.value())).transpose()
    }

    /// Writes a record.
    pub fn put_record(&self, record: &ProxyRecord) -> Result<()> {
        let bytes = serde_json::to_vec(record).map_err(|err| Error::Store(err.to_string()))?;
        let txn = self.db.begin_write().map_err(store_err)?;
        txn.open_table(PROXIES)
            .map_err(store_err)?
            .insert(record.key().as_str(), bytes.as_slice())
            .map_err(store_err)?;
        txn.commit().map_err(store_err)?;
        self.committed([record.key()]);
        Ok(())
    }

    /// Writes `records` in one commit: a sync that finds many new Proxies
    /// (a first start with thousands) pays for one, not one each.
    pub fn put_records(&self, records: &[ProxyRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let txn = self.db.begin_write().map_err(store_err)?;
        {
            let mut table = txn.open_table(PROXIES).map_err(store_err)?;
            for record in records {
                let bytes =
                    serde_json::to_vec(record).map_err(|err| Error::Store(err.to_string()))?;
                table.insert(record.key().as_str(), bytes.as_slice()).map_err(store_err)?;
            }
        }
        txn.commit().map_err(store_err)?;
        self.committed(records.iter().map(ProxyRecord::key));
        Ok(())
    }

    /// Changes the record at `key` in one write transaction: writers that
    /// each change only their own fields (the reconciler the status and
    /// finalizer, the manifest sync the desired state) never undo each
    /// other's writes. `change` returns whether it changed anything; only
    /// then is the record written. Returns the record as it is now, `None`
    /// when there is none.
    pub fn update_record(
        &self,
        key: &str,
        change: impl FnOnce(&mut ProxyRecord) -> bool,
    ) -> Result<Option<ProxyRecord>> {
        let txn = self.db.begin_write().map_err(store_err)?;
        let updated = {
            let mut table = txn.open_table(PROXIES).map_err(store_err)?;
            let found =
                table.get(key).map_err(store_err)?.map(|v| decode(v.value())).transpose()?;
            let Some(mut record) = found else { return Ok(None) };
            if !change(&mut record) {
                return Ok(Some(record));
            }
            let bytes = serde_json::to_vec(&record).map_err(|err| Error::Store(err.to_string()))?;
            table.insert(key, bytes.as_slice()).map_err(store_err)?;
            record
        };
        txn.commit().map_err(store_err)?;
        self.committed([key.to_owned()]);
        Ok(Some(updated))
    }

    /// Removes a record.
    pub fn remove_record(&self, key: &str) -> Result<()> {
        let txn = self.db.begin_write().map_err(store_err)?;
        txn.open_table(PROXIES).map_err(store_err)?.remove(key).map_err(store_err)?;
        txn.commit().map_err(store_err)?;
        self.record_removals.fetch_add(1, Ordering::AcqRel);
        self.committed([key.to_owned()]);
        Ok(())
    }

    /// Notes committed writes of the records at `keys`. The keys go in
    /// before the count moves: whoever sees the new count and then drains
    /// the keys finds them.
    fn committed(&self, keys: impl IntoIterator<Item = String>) {
        self.changed.lock().unwrap_or_else(PoisonError::into_inner).extend(keys);
        self.record_writes.fetch_add(1, Ordering::AcqRel);
    }

    /// The keys of the records written (changed, added or removed) since
    /// the last call, and forgets them. A key written again while its
    /// record is being read comes back next time.
    pub fn take_changed(&self) -> HashSet<String> {
        std::mem::take(&mut *self.changed.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How many record writes this store has committed: read it before
    /// [`Store::records`], and the same number later means nothing changed.
    pub fn record_writes(&self) -> u64 {
        self.record_writes.load(Ordering::Acquire)
    }

    /// How many records were removed; read it as [`Store::record_writes`].
    pub fn record_removals(&self) -> u64 {
        self.record_removals.load(Ordering::Acquire)
    }

    /// How many times every record was read.
    pub fn record_scans(&self) -> u64 {
        self.record_scans.load(Ordering::Relaxed)
    }

    /// Appends `action` to the state log, dropping the oldest beyond
    /// [`ACTIONS_KEPT`].
    pub fn log_action(&self, action: &LoggedAction) -> Result<()> {
        self.log_action_keeping(action, ACTIONS_KEPT)
    }

    fn log_action_keeping(&self, action: &LoggedAction, kept: u64) -> Result<()> {
        let bytes = serde_json::to_vec(action).map_err(|err| Error::Store(err.to_string()))?;
        let txn = self.db.begin_write().map_err(store_err)?;
        {
            let mut table = txn.open_table(ACTIONS).map_err(store_err)?;
            let next = table.last().map_err(store_err)?.map_or(0, |(seq, _)| seq.value() + 1);
            table.insert(next, bytes.as_slice()).map_err(store_err)?;
            if next >= kept {
                table.retain_in(..=next - kept, |_, _| false).map_err(store_err)?;
            }
        }
        txn.commit().map_err(store_err)
    }

    /// The last `limit` actions of the state log, oldest first.
    pub fn logged_actions(&self, limit: usize) -> Result<Vec<LoggedAction>> {
        let txn = self.db.begin_read().map_err(store_err)?;
        let table = txn.open_table(ACTIONS).map_err(store_err)?;
        let mut actions = table
            .iter()
            .map_err(store_err)?
            .rev()
            .take(limit)
            .map(|row| {
                let (_, value) = row.map_err(store_err)?;
                serde_json::from_slice(value.value()).map_err(|err| {
                    Error::Store(format!("a logged operator's action is unreadable: {err}"))
                })
            })
            .collect::<Result<Vec<LoggedAction>>>()?;
        actions.reverse();
        Ok(actions)
    }

    fn kv_get(&self, scope: &str, key: &str) -> Result<Option<KvEntry>, KvError> {
        kv::validate_request(key, None)?;
        let txn = self.db.begin_read().map_err(kv_err)?;
        let table = txn.open_table(KV).map_err(kv_err)?;
        let found = table.get(kv_key(scope, key).as_str()).map_err(kv_err)?;
        Ok(found.map(|v| kv::decode_versioned(key, v.value())))
    }

    fn kv_cas(
        db: &Database,
        scope: &str,
        key: &str,
        expected: Option<u64>,
        value: Option<&[u8]>,
    ) -> Result<CasOutcome, KvError> {
        kv::validate_request(key, value)?;
        let map_key = kv_key(scope, key);
        // One write transaction: the compare and the swap are atomic, and
        // redb admits one writer at a time.
        let txn = db.begin_write().map_err(kv_err)?;
        let outcome = {
            let mut table = txn.open_table(KV).map_err(kv_err)?;
            let current = table
                .get(map_key.as_str())
                .map_err(kv_err)?
                .map(|v| kv::decode_versioned(key, v.value()));
            if current.as_ref().map(|e| e.version) != expected {
                return Ok(CasOutcome::Conflict(current));
            }
            match value {
                Some(value) => {
                    let mut meta = txn.open_table(META).map_err(kv_err)?;
                    // Versions come from one counter so a deleted and
                    // re-created key never repeats a version.
                    let version =
                        meta.get(KV_VERSION).map_err(kv_err)?.map_or(0, |v| v.value()) + 1;
                    meta.insert(KV_VERSION, version).map_err(kv_err)?;
                    let bytes = kv::encode_versioned(version, value);
                    table.insert(map_key.as_str(), bytes.as_slice()).map_err(kv_err)?;
                    CasOutcome::Applied(version)
                }
                None => {
                    table.remove(map_key.as_str()).map_err(kv_err)?;
                    CasOutcome::Applied(0)
                }
            }
        };
        txn.commit().map_err(kv_err)?;
        Ok(outcome)
    }

    fn kv_list(&self, scope: &str, prefix: &str) -> Result<Vec<KvEntry>, KvError> {
        let txn = self.db.begin_read().map_err(kv_err)?;
        let table = txn.open_table(KV).map_err(kv_err)?;
        let start = kv_key(scope, prefix);
        let mut entries = Vec::new();
        for item in table.range(start.as_str()..).map_err(kv_err)? {
            let (k, v) = item.map_err(kv_err)?;
            let Some(key) = k.value().strip_prefix(&format!("{scope}\0")).map(str::to_owned) else {
                break;
            };
            if !key.starts_with(prefix) {
                break;
            }
            entries.push(kv::decode_versioned(&key, v.value()));
        }
        Ok(entries)
    }
}

fn kv_key(scope: &str, key: &str) -> String {
    format!("{scope}\0{key}")
}

fn decode(bytes: &[u8]) -> Result<ProxyRecord> {
    serde_json::from_slice(bytes)
        .map_err(|err| Error::Store(format!("a stored Proxy record is unreadable: {err}")))
}

fn store_err(err: impl std::fmt::Display) -> Error {
    Error::Store(err.to_string())
}

fn kv_err(err: impl std::fmt::Display) -> KvError {
    KvError::Unavailable(err.to_string())
}

// Reads are short and local and run inline. A write commits to disk (an
// fsync), so it runs on the blocking pool, off the async workers; the
// plugin waits for it, so its store calls keep the order it made them in.
#[async_trait]
impl KvStore for Store {
    async fn get(&self, scope: &str, key: &str) -> Result<Option<KvEntry>, KvError> {
        self.kv_get(scope, key)
    }

    async fn compare_and_swap(
        &self,
        scope: &str,
        key: &str,
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<CasOutcome, KvError> {
        let db = Arc::clone(&self.db);
        let (scope, key) = (scope.to_owned(), key.to_owned());
        tokio::task::spawn_blocking(move || {
            Self::kv_cas(&db, &scope, &key, expected, value.as_deref())
        })
        .await
        .map_err(|err| KvError::Unavailable(format!("the store write did not finish: {err}")))?
    }

    async fn list(&self, scope: &str, prefix: &str) -> Result<Vec<KvEntry>, KvError> {
        self.kv_list(scope, prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_action_log_keeps_the_last_actions_across_a_reopen() {
        use proxyfleet_fleet::action::Action;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let rollback = |n: u64| LoggedAction {
            at: 1_700_000_000 + n,
            action: Action::Rollback { entry: format!("entry-{n}") },
        };
        {
            let store = Store::open(&path).unwrap();
            assert_eq!(store.logged_actions(10).unwrap(), []);
            for n in 0..5 {
                store.log_action_keeping(&rollback(n), 3).unwrap();
            }
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.logged_actions(10).unwrap(), [rollback(2), rollback(3), rollback(4)]);
        assert_eq!(store.logged_actions(1).unwrap(), [rollback(4)], "the newest");
        store.log_action(&rollback(5)).unwrap();
        assert_eq!(store.logged_actions(2).unwrap(), [rollback(4), rollback(5)]);
    }

    #[test]
    fn every_committed_record_write_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.redb")).unwrap();
        assert_eq!(store.record_writes(), 0);
        store.remove_record("default/gone").unwrap();
        assert_eq!(store.record_writes(), 1, "a removal commits, found or not");
        let _ = store.records().unwrap();
        assert_eq!(store.record_writes(), 1, "reads are not writes");
        assert_eq!(store.record_scans(), 1);
    }

    #[test]
    fn an_update_writes_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.redb")).unwrap();
        assert_eq!(store.update_record("default/none", |_| true).unwrap(), None);
        let record = ProxyRecord {
            meta: ProxyMeta {
                uid: "u".into(),
                namespace: "default".into(),
                name: "a".into(),
                generation: 1,
            },
            desired: ProxyDesired {
                provider: "local".into(),
                cores: 1,
                memory_mib: 512,
                disk_gib: 4,
                image: String::new(),
                placement: Default::default(),
                vlan_tag: None,
                port: 3128,
                user_data: Vec::new(),
                proxy_auth: None,
                labels: Default::default(),
                replace_token: None,
            },
            status: ProxyStatus::default(),
            finalizer: false,
            deleting: false,
            pool: None,
            created_at: 0,
        };
        store.put_record(&record).unwrap();
        let writes = store.record_writes();
        let same = store.update_record("default/a", |_| false).unwrap().unwrap();
        assert_eq!((same, store.record_writes()), (record.clone(), writes), "nothing to write");
        let changed = store
            .update_record("default/a", |r| {
                r.finalizer = true;
                true
            })
            .unwrap()
            .unwrap();
        assert!(changed.finalizer);
        assert_eq!(store.record("default/a").unwrap(), Some(changed));
        assert_eq!(store.record_writes(), writes + 1);
    }

    #[tokio::test]
    async fn cas_semantics_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let version = {
            let store = Store::open(&path).unwrap();
            let CasOutcome::Applied(v) = store
                .compare_and_swap("e", "endpoint/a", None, Some(b"uid-1".to_vec()))
                .await
                .unwrap()
            else {
                panic!("first write applies")
            };
            let again = store
                .compare_and_swap("e", "endpoint/a", None, Some(b"uid-2".to_vec()))
                .await
                .unwrap();
            assert!(matches!(again, CasOutcome::Conflict(Some(ref e)) if e.value == b"uid-1"));
            v
        };
        let store = Store::open(&path).unwrap();
        let entry = store.get("e", "endpoint/a").await.unwrap().unwrap();
        assert_eq!((entry.value.as_slice(), entry.version), (b"uid-1".as_slice(), version));
        store.compare_and_swap("e", "endpoint/a", Some(version), None).await.unwrap();
        store.compare_and_swap("e", "endpoint/a", None, Some(vec![])).await.unwrap();
        let stale = store.compare_and_swap("e", "endpoint/a", Some(version), None).await.unwrap();
        assert!(matches!(stale, CasOutcome::Conflict(_)), "versions never repeat");
    }

    #[tokio::test]
    async fn list_stays_inside_its_scope_and_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.redb")).unwrap();
        for (scope, key) in [("a", "x/1"), ("a", "x/2"), ("a", "y/1"), ("ab", "x/3")] {
            store.compare_and_swap(scope, key, None, Some(vec![])).await.unwrap();
        }
        let keys: Vec<_> =
            store.list("a", "x/").await.unwrap().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["x/1", "x/2"]);
        assert_eq!(store.list("a", "").await.unwrap().len(), 3);
    }
}
