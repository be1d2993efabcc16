//! An in-memory [`Provider`] for tests of anything that drives providers:
//! it keeps the contract (idempotent create by UID, marks, not-found) and
//! can be told to fail, lag or flap.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use async_trait::async_trait;

use crate::{
    Capabilities, Health, Instance, InstanceState, OwnershipMark, PluginInfo, Provider,
    ProviderError, ProxySpec, Result,
};

/// The installation the fake marks its instances with, as a runtime
/// given that ID would.
pub const INSTALLATION: &str = "test";

/// Which call a scripted failure applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// `create`.
    Create,
    /// `get`.
    Get,
    /// `delete`.
    Delete,
    /// `list`.
    List,
}

/// A fake backend.
#[derive(Debug)]
pub struct FakeProvider {
    entry: String,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    instances: BTreeMap<String, Instance>,
    failures: BTreeMap<Op, VecDeque<ProviderError>>,
    calls: Vec<(Op, String)>,
    created: u32,
    start_provisioning: bool,
    slow_deletes: bool,
    lists_unmarked: bool,
    checks_hang: bool,
}

impl FakeProvider {
    /// An empty backend for entry `entry`; instances start running.
    pub fn new(entry: &str) -> Self {
        Self { entry: entry.to_owned(), inner: Mutex::new(Inner::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// New instances start `provisioning` with no address.
    pub fn start_provisioning(self) -> Self {
        self.lock().start_provisioning = true;
        self
    }

    /// A delete first moves the instance to `deleting`; the next delete
    /// removes it.
    pub fn slow_deletes(self) -> Self {
        self.lock().slow_deletes = true;
        self
    }

    /// `list` also returns instances without a mark, as a buggy plugin
    /// might.
    pub fn lists_unmarked(self) -> Self {
        self.lock().lists_unmarked = true;
        self
    }

    /// `check` never answers, as a backend that hangs.
    pub fn checks_hang(self) -> Self {
        self.lock().checks_hang = true;
        self
    }

    /// The next call of `op` fails with `err` (queued in order).
    pub fn fail_next(&self, op: Op, err: ProviderError) {
        self.lock().failures.entry(op).or_default().push_back(err);
    }

    /// Sets an instance's state and addresses, as the backend would.
    pub fn set_state(&self, id: &str, state: InstanceState, addresses: &[&str]) {
        if let Some(instance) = self.lock().instances.get_mut(id) {
            instance.state = state;
            instance.addresses = addresses.iter().map(|a| (*a).to_owned()).collect();
        }
    }

    /// Puts an instance into the backend directly (someone else's, or one
    /// a crashed create left).
    pub fn insert(&self, instance: Instance) {
        self.lock().instances.insert(instance.provider_id.clone(), instance);
    }

    /// Removes an instance behind the host's back.
    pub fn vanish(&self, id: &str) {
        self.lock().instances.remove(id);
    }

    /// Every instance, by ID.
    pub fn instances(&self) -> BTreeMap<String, Instance> {
        self.lock().instances.clone()
    }

    /// Every call so far, with its argument (UID for create, ID otherwise).
    pub fn calls(&self) -> Vec<(Op, String)> {
        self.lock().calls.clone()
    }

    fn enter(&self, op: Op, arg: &str) -> Result<()> {
        let mut inner = self.lock();
        inner.calls.push((op, arg.to_owned()));
        match inner.failures.get_mut(&op).and_then(VecDeque::pop_front) {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Provider for FakeProvider {
    fn entry(&self) -> &str {
        &self.entry
    }

    fn info(&self) -> PluginInfo {
        PluginInfo {
            name: "fake".into(),
            version: "1.0.0".into(),
            contract_version: "0.5.0".into(),
            config_schema: "{}".into(),
            capabilities: Capabilities::default(),
        }
    }

    async fn create(&self, spec: &ProxySpec) -> Result<Instance> {
        self.enter(Op::Create, &spec.uid)?;
        let mut inner = self.lock();
        let adopted = inner
            .instances
            .values()
            .find(|i| i.mark.as_ref().is_some_and(|m| m.uid == spec.uid))
            .cloned();
        if let Some(instance) = adopted {
            return Ok(instance);
        }
        inner.created += 1;
        let n = inner.created;
        let (state, addresses) = if inner.start_provisioning {
            (InstanceState::Provisioning, Vec::new())
        } else {
            (InstanceState::Running, vec![format!("198.51.100.{n}")])
        };
        let instance = Instance {
            provider_id: format!("fake-{n}"),
            name: spec.name.clone(),
            state,
            addresses,
            port: None,
            created_at: Some(1_000 + u64::from(n)),
            mark: Some(OwnershipMark {
                installation: INSTALLATION.to_owned(),
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                name: spec.name.clone(),
                created_at: 1_000 + u64::from(n),
            }),
        };
        inner.instances.insert(instance.provider_id.clone(), instance.clone());
        Ok(instance)
    }

    async fn get(&self, provider_id: &str) -> Result<Instance> {
        self.enter(Op::Get, provider_id)?;
        self.lock()
            .instances
            .get(provider_id)
            .cloned()
            .ok_or_else(|| ProviderError::not_found(format!("no instance {provider_id}")))
    }

    async fn delete(&self, provider_id: &str) -> Result<()> {
        self.enter(Op::Delete, provider_id)?;
        let mut inner = self.lock();
        let slow = inner.slow_deletes;
        match inner.instances.get_mut(provider_id) {
            Some(instance) if slow && instance.state != InstanceState::Deleting => {
                instance.state = InstanceState::Deleting;
            }
            Some(_) => {
                inner.instances.remove(provider_id);
            }
            None => {}
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<Instance>> {
        self.enter(Op::List, "")?;
        let inner = self.lock();
        Ok(inner
            .instances
            .values()
            .filter(|i| inner.lists_unmarked || i.mark.is_some())
            .cloned()
            .collect())
    }

    async fn check(&self) -> Health {
        if self.lock().checks_hang {
            std::future::pending::<()>().await;
        }
        Health::ok()
    }
}
