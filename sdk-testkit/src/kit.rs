//! [`TestKit`]: a provider's functions called as the operator calls them,
//! with the SDK's host calls answered in memory.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;
use std::time::Duration;

use proxyfleet_sdk::kv::{CasOutcome, KvEntry, KvError};
use proxyfleet_sdk::log::Level;
use proxyfleet_sdk::native::{self, ErrorCode, Host, HttpRequest, HttpResponse};
use proxyfleet_sdk::{
    CallContext, Health, HttpDestination, Instance, PluginInfo, Provider, ProviderError, ProxySpec,
};

use crate::exchanges::{Exchange, Exchanges, Reply};
use crate::store::MemoryKv;

/// The entry name calls carry unless [`TestKit::entry`] sets another.
pub const DEFAULT_ENTRY: &str = "test";
/// The deadline calls carry unless [`TestKit::deadline`] sets another.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

/// One log record the plugin sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Its level.
    pub level: Level,
    /// Its message.
    pub message: String,
    /// Its fields, in the order given.
    pub fields: Vec<(String, String)>,
}

impl LogRecord {
    /// The value of field `key`.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, value)| value.as_str())
    }
}

/// What answers the plugin's calls: shared by the kit and, while a call
/// runs, the SDK.
#[derive(Debug)]
struct KitHost {
    kv: MemoryKv,
    http: RefCell<Exchanges>,
    logs: RefCell<Vec<LogRecord>>,
    /// The destinations requests may go to: those the plugin's
    /// `describe` asks for, and those the test grants as an entry would.
    grants: RefCell<Vec<HttpDestination>>,
    /// The entry's config as JSON.
    config: String,
    /// The lookup table the plugin answered for the config; empty while
    /// it validates it.
    table: RefCell<HashMap<String, String>>,
}

impl Host for KitHost {
    fn config_json(&self) -> String {
        self.config.clone()
    }

    fn config_lookup(&self, key: &str) -> Option<String> {
        self.table.borrow().get(key).cloned()
    }

    fn kv_get(&self, key: &str) -> Result<Option<KvEntry>, KvError> {
        self.kv.get(key)
    }

    fn kv_compare_and_swap(
        &self,
        key: &str,
        expected: Option<u64>,
        value: Option<&[u8]>,
    ) -> Result<CasOutcome, KvError> {
        self.kv.compare_and_swap(key, expected, value)
    }

    fn kv_list(&self, prefix: &str) -> Result<Vec<KvEntry>, KvError> {
        self.kv.list(prefix)
    }

    fn http(&self, request: &HttpRequest) -> Result<HttpResponse, ErrorCode> {
        self.http.borrow_mut().answer(request, &self.grants.borrow())
    }

    fn log(&self, level: Level, message: &str, fields: &[(String, String)]) {
        self.logs.borrow_mut().push(LogRecord {
            level,
            message: message.to_owned(),
            fields: fields.to_vec(),
        });
    }
}

/// Calls a [`Provider`]'s functions natively, as the operator would, with
/// an in-memory key-value store, declared HTTP exchanges and captured logs.
///
/// Calls run on the current thread; a kit is not shared between threads
/// (each test makes its own).
pub struct TestKit<P> {
    host: Rc<KitHost>,
    info: PluginInfo,
    entry: String,
    deadline: Duration,
    /// Every secret the plugin was handed: Proxy credentials, alone and as
    /// `user:password`.
    secrets: RefCell<Vec<String>>,
    /// Credentials found where they must not be.
    leaks: RefCell<Vec<String>>,
    provider: PhantomData<fn() -> P>,
}

impl<P> fmt::Debug for TestKit<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestKit")
            .field("plugin", &self.info.name)
            .field("entry", &self.entry)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<P: Provider> TestKit<P> {
    /// A kit for an entry with `config`, which the plugin's
    /// `validate_config` must accept, as the operator requires before any
    /// other call. Its `lookup_table` is then kept for the calls'
    /// [`CallContext::lookup`], held to the operator's rules.
    ///
    /// # Errors
    ///
    /// What `validate_config` or `lookup_table` returned.
    ///
    /// # Panics
    ///
    /// When the lookup table breaks the operator's rules (a key twice, or
    /// more than four times the config's size plus 64 KiB), which the
    /// operator would refuse as a plugin fault.
    pub fn new(config: &serde_json::Value) -> Result<Self, ProviderError> {
        let config = config.to_string();
        let info = P::describe();
        let host = Rc::new(KitHost {
            kv: MemoryKv::default(),
            http: RefCell::new(Exchanges::default()),
            logs: RefCell::new(Vec::new()),
            grants: RefCell::new(info.capabilities.http.clone()),
            config: config.clone(),
            table: RefCell::default(),
        });
        let kit = Self {
            host,
            info,
            entry: DEFAULT_ENTRY.to_owned(),
            deadline: DEFAULT_DEADLINE,
            secrets: RefCell::new(Vec::new()),
            leaks: RefCell::new(Vec::new()),
            provider: PhantomData,
        };
        kit.run("validate-config", || P::validate_config(&config))?;
        let pairs = kit.run("validate-config", || P::lookup_table(&config))?;
        *kit.host.table.borrow_mut() = checked_table(pairs, config.len());
        Ok(kit)
    }

    /// Calls carry entry name `entry` from now on.
    #[must_use]
    pub fn entry(mut self, entry: &str) -> Self {
        entry.clone_into(&mut self.entry);
        self
    }

    /// Calls carry `deadline` as the time they have left from now on.
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// What the plugin's `describe` returned.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// Lets requests go to `destination` as well as to what the plugin's
    /// `describe` names, as an entry's `grants.http` does for a backend
    /// whose address is config.
    pub fn grant(&self, destination: HttpDestination) -> &Self {
        self.host.grants.borrow_mut().push(destination);
        self
    }

    /// Declares an HTTP exchange; exchanges are tried in the order declared.
    pub fn expect(&self, exchange: Exchange) -> &Self {
        self.host.http.borrow_mut().declare(exchange);
        self
    }

    /// Answers the requests no declared exchange answers (`None` leaves
    /// the request unanswered): a small simulator with state of its own.
    pub fn route(&self, route: impl FnMut(&HttpRequest) -> Option<Reply> + 'static) -> &Self {
        self.host.http.borrow_mut().set_route(Box::new(route));
        self
    }

    /// The entry's key-value store.
    pub fn kv(&self) -> &MemoryKv {
        &self.host.kv
    }

    /// Every HTTP request the plugin made so far, in order.
    pub fn requests(&self) -> Vec<HttpRequest> {
        self.host.http.borrow().seen.clone()
    }

    /// Every log record the plugin sent so far, in order.
    pub fn logs(&self) -> Vec<LogRecord> {
        self.host.logs.borrow().clone()
    }

    /// `create`, as the operator calls it for `spec`.
    ///
    /// # Errors
    ///
    /// The plugin's.
    pub fn create(&self, spec: &ProxySpec) -> Result<Instance, ProviderError> {
        // An empty password is no secret to look for: every text holds it.
        if let Some(auth) = spec.proxy_auth.as_ref().filter(|auth| !auth.password.is_empty()) {
            let mut secrets = self.secrets.borrow_mut();
            secrets.push(auth.password.clone());
            secrets.push(format!("{}:{}", auth.username, auth.password));
        }
        let ctx = self.context();
        self.run("create", || P::create(&ctx, spec))
    }

    /// `get` of `provider_id`.
    ///
    /// # Errors
    ///
    /// The plugin's.
    pub fn get(&self, provider_id: &str) -> Result<Instance, ProviderError> {
        let ctx = self.context();
        self.run("get", || P::get(&ctx, provider_id))
    }

    /// `delete` of `provider_id`.
    ///
    /// # Errors
    ///
    /// The plugin's.
    pub fn delete(&self, provider_id: &str) -> Result<(), ProviderError> {
        let ctx = self.context();
        self.run("delete", || P::delete(&ctx, provider_id))
    }

    /// `list`.
    ///
    /// # Errors
    ///
    /// The plugin's.
    pub fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let ctx = self.context();
        self.run("list", || P::list(&ctx))
    }

    /// `check`.
    pub fn check(&self) -> Health {
        let ctx = self.context();
        self.run("check", || P::check(&ctx))
    }

    /// Fails the test when something went unnoticed: a request no exchange
    /// or route answered, a declared exchange used fewer times than
    /// declared, or a Proxy credential in a log record, an error or an
    /// instance the plugin returned.
    ///
    /// # Panics
    ///
    /// Listing every problem, when there is one.
    pub fn verify(&self) {
        let mut problems = Vec::new();
        let http = self.host.http.borrow();
        problems.extend(http.unanswered.iter().map(|label| format!("unanswered request: {label}")));
        problems.extend(http.unused().into_iter().map(|line| format!("unused exchange: {line}")));
        drop(http);
        problems.extend(self.leaks.borrow().iter().cloned());
        problems.extend(self.log_leaks());
        assert!(problems.is_empty(), "the test kit found problems:\n  {}", problems.join("\n  "));
    }

    fn context(&self) -> CallContext {
        CallContext {
            entry: self.entry.clone(),
            deadline_ms: u64::try_from(self.deadline.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Runs one call with this kit's host, and notes a credential in what
    /// it returned.
    fn run<R: fmt::Debug>(&self, call: &str, f: impl FnOnce() -> R) -> R {
        let host: Rc<dyn Host> = self.host.clone();
        let result = native::with_host(host, f);
        let shown = format!("{result:?}");
        for secret in self.secrets.borrow().iter() {
            if shown.contains(secret.as_str()) {
                self.leaks.borrow_mut().push(format!("a Proxy credential in what {call} returned"));
            }
        }
        result
    }

    /// The log records that hold a Proxy credential, as problems.
    fn log_leaks(&self) -> Vec<String> {
        let secrets = self.secrets.borrow();
        let mut leaks = Vec::new();
        for (index, record) in self.host.logs.borrow().iter().enumerate() {
            let fields = record.fields.iter().flat_map(|(key, value)| [key, value]);
            let leaked = std::iter::once(&record.message)
                .chain(fields)
                .any(|text| secrets.iter().any(|secret| text.contains(secret.as_str())));
            if leaked {
                leaks
                    .push(format!("a Proxy credential in log record {index} ({:?})", record.level));
            }
        }
        leaks
    }
}

/// A lookup table held to the operator's rules: unique keys, and at most
/// four times the config's size plus 64 KiB.
fn checked_table(pairs: Vec<(String, String)>, config_len: usize) -> HashMap<String, String> {
    let limit = config_len.saturating_mul(4).saturating_add(64 << 10);
    let bytes: usize = pairs.iter().map(|(key, value)| key.len() + value.len()).sum();
    assert!(
        bytes <= limit,
        "lookup_table answered {bytes} bytes; the operator keeps at most {limit} for this config \
         (four times its size plus 64 KiB) and refuses the entry"
    );
    let mut table = HashMap::with_capacity(pairs.len());
    for (key, value) in pairs {
        assert!(
            !table.contains_key(&key),
            "lookup_table answered the key {key:?} twice; the operator refuses the entry"
        );
        table.insert(key, value);
    }
    table
}
