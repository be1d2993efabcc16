//! The cases, in the order they run. Later cases use what earlier ones
//! made (the instance `create` returned), and are skipped when it is
//! missing; every instance made is deleted at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_core::credential::ProxyCredential;
use proxyfleet_core::{
    ErrorClass, Instance, InstanceState, PluginInfo, Provider, ProviderError, ProxySpec,
};
use serde_json::Value;

use crate::report::{Case, Outcome, Report};
use crate::{Binder, Options};

/// A case's name and the rule it holds the plugin to.
type Rule = (&'static str, &'static str);

const DESCRIBE: Rule = (
    "describe is well formed",
    "describe names the plugin, its version and the contract version of its export, and gives \
     the JSON schema of its config",
);
const VALIDATE: Rule = (
    "validate-config refuses an unknown key, naming it",
    "validate-config MUST refuse a key it does not know as invalid-config, naming the key",
);
const REQUIRED: Rule = (
    "validate-config refuses a config without a required key, naming it",
    "validate-config MUST refuse a config that lacks a key its schema requires as \
     invalid-config, naming the key",
);
const CHECK: Rule = (
    "check answers within its deadline",
    "check MUST answer within its deadline, healthy, or with an issue and its reason",
);
const CREATE: Rule = (
    "create writes the mark",
    "create MUST write the ownership mark with the instance, carrying spec.installation \
     unchanged, and return it in instance.mark",
);
const CONCURRENT: Rule = (
    "creates at once give each Proxy its own instance",
    "create MUST give each Proxy an instance of its own when creates for different Proxies run \
     at once: no two share an id, nor an address and port",
);
const IDEMPOTENT: Rule = (
    "create is idempotent per UID",
    "create MUST be idempotent per spec.uid: a second create adopts the first one's instance",
);
const GET: Rule = ("get reads the mark back", "get MUST read the mark back from the backend");
const UNKNOWN: Rule = (
    "get of an unknown id is not-found",
    "get MUST answer not-found when there is no such instance",
);
const LIST: Rule = (
    "list returns the marked instances",
    "list MUST return every instance that carries the plugin's mark for this installation, with \
     the mark as read back, and no other",
);
const ELSEWHERE: Rule = (
    "a delete from another installation leaves the instance",
    "a delete of an instance another installation made MUST leave it: the host answers \
     not-found to an installation whose mark it is not",
);
const CANCEL: Rule = (
    "a cancelled create ends at once and its retry adopts",
    "a call MUST end promptly when the host stops it, and create MUST adopt what an \
     interrupted attempt left",
);
const DELETE: Rule = (
    "delete is idempotent and the instance goes",
    "delete MUST be idempotent, and get then answers not-found",
);
const SECRETS: Rule = (
    "nothing returned holds the credential",
    "no instance, error or health message may hold the Proxy's credential",
);

/// How many creates the concurrent case runs at once.
const AT_ONCE: usize = 4;
/// A key no plugin's config has.
const UNKNOWN_KEY: &str = "conformanceUnknownKey";
/// How long a stopped call may take to end.
const CANCEL_BOUND: Duration = Duration::from_secs(1);
/// What the host's redaction leaves where a secret was.
const REDACTED: &str = "[redacted]";

/// One run of the suite.
pub(crate) struct Run<'a> {
    provider: Arc<dyn Provider>,
    binder: &'a dyn Binder,
    options: &'a Options,
    /// The installation the host puts into every spec.
    installation: String,
    /// The credential of the suite's Proxies.
    credential: ProxyCredential,
    /// The text of every answer, searched for the credential at the end.
    answers: Vec<String>,
    /// Every instance made, deleted at the end.
    made: Vec<String>,
    cases: Vec<Case>,
}

impl<'a> Run<'a> {
    pub(crate) fn new(
        provider: Arc<dyn Provider>,
        binder: &'a dyn Binder,
        options: &'a Options,
    ) -> Self {
        let password = uuid::Uuid::new_v4().simple().to_string();
        let credential = ProxyCredential::new("conformance".to_owned(), password)
            .unwrap_or_else(|_| unreachable!("hex digits make a valid password"));
        Self {
            provider,
            installation: binder.installation(),
            binder,
            options,
            credential,
            answers: Vec::new(),
            made: Vec::new(),
            cases: Vec::new(),
        }
    }

    pub(crate) async fn all(mut self) -> Report {
        let info = self.provider.info();
        let started = Instant::now();
        self.record(DESCRIBE, started, describe(&info));
        let started = Instant::now();
        let result = self.validate_config().await;
        self.record(VALIDATE, started, result);
        let started = Instant::now();
        match self.required_keys(&info).await {
            Ok(None) => self.record(REQUIRED, started, Ok(())),
            Ok(Some(why)) => self.skip(REQUIRED, &why),
            Err(why) => self.record(REQUIRED, started, Err(why)),
        }
        let started = Instant::now();
        let result = self.check().await;
        self.record(CHECK, started, result);

        let spec = self.spec("a");
        let started = Instant::now();
        let created = self.create(&spec).await;
        self.record(CREATE, started, created.as_ref().map(|_| ()).map_err(Clone::clone));
        match created {
            Ok(instance) => self.with_instance(&spec, &instance).await,
            Err(_) => {
                for rule in [IDEMPOTENT, GET, LIST, ELSEWHERE, DELETE] {
                    self.skip(rule, "create failed");
                }
            }
        }
        let started = Instant::now();
        match self.concurrent_creates().await {
            Ok(None) => self.record(CONCURRENT, started, Ok(())),
            Ok(Some(why)) => self.skip(CONCURRENT, &why),
            Err(why) => self.record(CONCURRENT, started, Err(why)),
        }
        // What it made goes before the cases that follow need the backend.
        self.clean_up().await;
        let started = Instant::now();
        let result = self.unknown_id().await;
        self.record(UNKNOWN, started, result);
        let started = Instant::now();
        let result = self.cancelled_create().await;
        self.record(CANCEL, started, result);
        self.clean_up().await;
        let started = Instant::now();
        let result = self.no_secret();
        self.record(SECRETS, started, result);

        Report {
            plugin: format!("{} {} (contract {})", info.name, info.version, info.contract_version),
            entry: self.provider.entry().to_owned(),
            cases: self.cases,
        }
    }

    async fn with_instance(&mut self, spec: &ProxySpec, first: &Instance) {
        let started = Instant::now();
        let result = match self.create(spec).await {
            Ok(again) if again.provider_id == first.provider_id => Ok(()),
            Ok(again) => Err(format!(
                "a second create for UID {} returned {}, not {}: two instances for one Proxy",
                spec.uid, again.provider_id, first.provider_id
            )),
            Err(err) => Err(format!("a second create failed: {err}")),
        };
        self.record(IDEMPOTENT, started, result);

        let started = Instant::now();
        let result = match self.get(&first.provider_id).await {
            Ok(read) if read.provider_id != first.provider_id => {
                Err(format!("get {} answered {}", first.provider_id, read.provider_id))
            }
            Ok(read) => self.check_mark(spec, &read),
            Err(err) => Err(format!("get {} failed: {err}", first.provider_id)),
        };
        self.record(GET, started, result);

        let started = Instant::now();
        let result = self.list_holds(spec, &first.provider_id).await;
        self.record(LIST, started, result);

        let started = Instant::now();
        match self.delete_elsewhere(&first.provider_id).await {
            Ok(None) => self.record(ELSEWHERE, started, Ok(())),
            Ok(Some(why)) => self.skip(ELSEWHERE, &why),
            Err(why) => self.record(ELSEWHERE, started, Err(why)),
        }

        let started = Instant::now();
        let result = self.delete(&first.provider_id).await;
        self.record(DELETE, started, result);
    }

    /// A spec of the suite's: the entry's template, under a name and a UID
    /// of its own, with the suite's credential.
    fn spec(&self, suffix: &str) -> ProxySpec {
        let mut spec = self.options.spec.clone();
        spec.name = format!("conformance-{suffix}");
        spec.namespace = "conformance".to_owned();
        spec.uid = format!("conformance-{}", uuid::Uuid::new_v4().simple());
        spec.proxy_auth = Some(self.credential.clone());
        spec
    }

    async fn validate_config(&mut self) -> Result<(), String> {
        let Value::Object(config) = &self.options.config else {
            return Err("the entry's config is not an object: no key can be added".to_owned());
        };
        let mut config = config.clone();
        config.insert(UNKNOWN_KEY.to_owned(), Value::Bool(true));
        match self.binder.bind(&Value::Object(config)).await {
            Ok(_) => Err(format!("a config with the key `{UNKNOWN_KEY}` was accepted")),
            Err(err) => {
                self.answers.push(err.message.clone());
                if err.class != ErrorClass::InvalidConfig {
                    Err(format!("refused as {:?}, not invalid-config: {err}", err.class))
                } else if !err.message.contains(UNKNOWN_KEY) {
                    Err(format!("the refusal does not name `{UNKNOWN_KEY}`: {err}"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// The entry's config without each key the schema's top level
    /// requires, one at a time: each must be refused, naming the key.
    /// `Ok(Some(why))` skips the case: a schema that requires nothing.
    async fn required_keys(&mut self, info: &PluginInfo) -> Result<Option<String>, String> {
        let schema: Value = serde_json::from_str(&info.config_schema)
            .map_err(|err| format!("the config schema is no JSON: {err}"))?;
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if required.is_empty() {
            return Ok(Some("the config schema requires no key".to_owned()));
        }
        let Value::Object(config) = &self.options.config else {
            return Err("the entry's config is not an object: no key can be left out".to_owned());
        };
        let mut wrong = Vec::new();
        for key in required {
            let mut without = config.clone();
            if without.remove(key).is_none() {
                wrong.push(format!(
                    "the entry's own config lacks `{key}`, which the schema requires"
                ));
                continue;
            }
            match self.binder.bind(&Value::Object(without)).await {
                Ok(_) => wrong.push(format!("a config without `{key}` was accepted")),
                Err(err) => {
                    self.answers.push(err.message.clone());
                    if err.class != ErrorClass::InvalidConfig {
                        wrong.push(format!(
                            "without `{key}`: refused as {:?}, not invalid-config: {err}",
                            err.class
                        ));
                    } else if !err.message.contains(key) {
                        wrong.push(format!(
                            "the refusal of a config without `{key}` does not name it: {err}"
                        ));
                    }
                }
            }
        }
        if wrong.is_empty() { Ok(None) } else { Err(wrong.join("; ")) }
    }

    async fn check(&mut self) -> Result<(), String> {
        // A little over the deadline: the host's own timeout ends the call
        // at the deadline, and that answer counts.
        let deadline = self.options.call_timeout;
        let bound = deadline + deadline.min(Duration::from_secs(5));
        let health = tokio::time::timeout(bound, self.provider.check())
            .await
            .map_err(|_| format!("no answer within {bound:?}"))?;
        for issue in &health.issues {
            self.answers.push(issue.message.clone());
        }
        if health.healthy {
            return Ok(());
        }
        if health.issues.is_empty() {
            return Err("unhealthy with no issue saying why".to_owned());
        }
        let issues: Vec<String> = health
            .issues
            .iter()
            .map(|issue| format!("{:?}: {}", issue.reason, issue.message))
            .collect();
        Err(format!("unhealthy (the suite needs a backend that serves): {}", issues.join("; ")))
    }

    async fn create(&mut self, spec: &ProxySpec) -> Result<Instance, String> {
        match self.provider.create(spec).await {
            Ok(instance) => self.created(spec, instance),
            Err(err) => {
                self.answers.push(err.message.clone());
                Err(format!("create failed: {err}"))
            }
        }
    }

    /// Takes note of an instance a create answered, and checks its mark.
    fn created(&mut self, spec: &ProxySpec, instance: Instance) -> Result<Instance, String> {
        self.remember_instance(&instance);
        if !self.made.contains(&instance.provider_id) {
            self.made.push(instance.provider_id.clone());
        }
        self.check_mark(spec, &instance)?;
        Ok(instance)
    }

    /// [`AT_ONCE`] creates for different Proxies at once: each answers an
    /// instance of its own, as `get` reads it back too. A backend that takes
    /// fewer than two at once (a quota, a static list of endpoints) leaves
    /// nothing to compare: `Ok(Some(why))` skips the case.
    async fn concurrent_creates(&mut self) -> Result<Option<String>, String> {
        let specs: Vec<ProxySpec> =
            (0..AT_ONCE).map(|n| self.spec(&format!("at-once-{n}"))).collect();
        // A `transient` answer is retried, as the host would, for as long
        // as a lock a concurrent call holds may last.
        let until = Instant::now() + self.options.call_timeout + Duration::from_secs(5);
        let pause = self.options.poll.max(Duration::from_millis(500));
        let provider = Arc::clone(&self.provider);
        let create = |spec: &ProxySpec| {
            let provider = Arc::clone(&provider);
            let spec = spec.clone();
            async move {
                let mut transient = Vec::new();
                loop {
                    match provider.create(&spec).await {
                        Err(err)
                            if err.class == ErrorClass::Transient && Instant::now() < until =>
                        {
                            transient.push(err.message);
                            tokio::time::sleep(pause).await;
                        }
                        answer => return (answer, transient),
                    }
                }
            }
        };
        let answers = futures::future::join_all(specs.iter().map(create)).await;
        let mut made = Vec::new();
        let mut wrong = Vec::new();
        for (spec, (answer, transient)) in specs.iter().zip(answers) {
            self.answers.extend(transient);
            match answer {
                Ok(instance) => match self.created(spec, instance) {
                    Ok(instance) => made.push((spec, instance)),
                    Err(why) => wrong.push(why),
                },
                Err(err) if err.class == ErrorClass::QuotaExceeded => {
                    self.answers.push(err.message.clone());
                }
                Err(err) => {
                    self.answers.push(err.message.clone());
                    wrong.push(format!("a create for {} failed: {err}", spec.name));
                }
            }
        }
        if !wrong.is_empty() {
            return Err(wrong.join("; "));
        }
        if made.len() < 2 {
            return Ok(Some(format!(
                "the backend took {} of {AT_ONCE} Proxies at once (quota): nothing to compare",
                made.len()
            )));
        }
        let mut seen: Vec<(String, String, Option<String>)> = Vec::new();
        for (spec, created) in made {
            let read = self
                .get(&created.provider_id)
                .await
                .map_err(|err| format!("get {} failed: {err}", created.provider_id))?;
            let port = read.port.or(created.port).unwrap_or(spec.port);
            let address = read.addresses.first().or(created.addresses.first());
            let endpoint = address.map(|address| format!("{address} port {port}"));
            for (name, id, other) in &seen {
                if *id == created.provider_id {
                    return Err(format!("{name} and {} were both given {id}", spec.name));
                }
                if endpoint.is_some() && *other == endpoint {
                    return Err(format!(
                        "{name} and {} were both given {}",
                        spec.name,
                        endpoint.as_deref().unwrap_or_default()
                    ));
                }
            }
            seen.push((spec.name.clone(), created.provider_id.clone(), endpoint));
        }
        Ok(None)
    }

    fn check_mark(&self, spec: &ProxySpec, instance: &Instance) -> Result<(), String> {
        check_mark(spec, instance, &self.installation)
    }

    async fn list_holds(&mut self, spec: &ProxySpec, id: &str) -> Result<(), String> {
        let listed = self.list().await?;
        if let Some(unmarked) = listed.iter().find(|instance| instance.mark.is_none()) {
            return Err(format!("listed {} without a mark", unmarked.provider_id));
        }
        let foreign = listed.iter().find_map(|instance| {
            let mark = instance.mark.as_ref()?;
            (mark.installation != self.installation).then_some((instance, mark))
        });
        if let Some((instance, mark)) = foreign {
            return Err(format!(
                "listed {}, marked by installation {:?}, not this one ({:?})",
                instance.provider_id, mark.installation, self.installation
            ));
        }
        match marked_for(&listed, &spec.uid).as_slice() {
            [one] if one.provider_id == id => self.check_mark(spec, one),
            [] => Err(format!("{id} (UID {}) is missing from the list", spec.uid)),
            [one] => Err(format!("UID {} is listed as {}, not {id}", spec.uid, one.provider_id)),
            many => Err(format!("UID {} is listed {} times", spec.uid, many.len())),
        }
    }

    /// Deletes `id` twice and waits for `get` to answer `not-found`; the
    /// delete case, and the clean-up of what other cases made.
    async fn delete(&mut self, id: &str) -> Result<(), String> {
        for attempt in ["a delete", "a second delete"] {
            self.provider.delete(id).await.map_err(|err| {
                self.answers.push(err.message.clone());
                format!("{attempt} of {id} failed: {err}")
            })?;
        }
        let deadline = Instant::now() + self.options.delete_wait;
        loop {
            match self.get(id).await {
                Err(err) if err.class == ErrorClass::NotFound => {
                    self.made.retain(|made| made != id);
                    return Ok(());
                }
                Err(err) => return Err(format!("get after delete failed: {err}")),
                Ok(instance) => {
                    if Instant::now() >= deadline {
                        return Err(format!(
                            "{id} is still there ({:?}) {:?} after its delete",
                            instance.state, self.options.delete_wait
                        ));
                    }
                }
            }
            tokio::time::sleep(self.options.poll).await;
        }
    }

    /// The entry bound under another installation deletes `id`: the
    /// answer is success (nothing of its own was there) or not-found, and
    /// the instance stays. `Ok(Some(why))`: skipped.
    async fn delete_elsewhere(&mut self, id: &str) -> Result<Option<String>, String> {
        let Some(other) = self.binder.bind_elsewhere(&self.options.config).await else {
            return Ok(Some("this binder binds the entry under one installation only".to_owned()));
        };
        let other = other.map_err(|err| format!("the entry under another installation: {err}"))?;
        match other.delete(id).await {
            Ok(()) => {}
            Err(err) if err.class == ErrorClass::NotFound => self.answers.push(err.message),
            Err(err) => {
                self.answers.push(err.message.clone());
                return Err(format!("another installation's delete of {id} failed: {err}"));
            }
        }
        match self.get(id).await {
            Ok(read) if read.state == InstanceState::Deleting => {
                Err(format!("another installation's delete of {id} set it deleting"))
            }
            Ok(_) => Ok(None),
            Err(err) => Err(format!("{id} is gone after another installation's delete: {err}")),
        }
    }

    async fn unknown_id(&mut self) -> Result<(), String> {
        let id = format!("conformance-unknown-{}", uuid::Uuid::new_v4().simple());
        match self.get(&id).await {
            Err(err) if err.class == ErrorClass::NotFound => Ok(()),
            Err(err) => Err(format!("get {id} answered {:?}, not not-found: {err}", err.class)),
            Ok(instance) => Err(format!("get {id} found {}", instance.provider_id)),
        }
    }

    /// A create stopped moments after it began (the host's timeout, or a
    /// Proxy deleted meanwhile), then retried: the stop takes effect at
    /// once, and the retry leaves one instance for the UID.
    async fn cancelled_create(&mut self) -> Result<(), String> {
        let spec = self.spec("b");
        let stopped = Instant::now();
        let first = tokio::time::timeout(Duration::from_millis(5), self.provider.create(&spec));
        if let Ok(Ok(instance)) = first.await {
            // Fast enough to finish: it counts as made.
            self.made.push(instance.provider_id);
        }
        let took = stopped.elapsed();
        if took > CANCEL_BOUND {
            return Err(format!("a create stopped after 5 ms ended only after {took:?}"));
        }
        // A lock the stopped call took holds until that call's deadline
        // would have passed: `transient` until then, as the host retries.
        let until = Instant::now() + self.options.call_timeout + Duration::from_secs(5);
        let instance = loop {
            match self.provider.create(&spec).await {
                Ok(instance) => break self.created(&spec, instance)?,
                Err(err) => {
                    self.answers.push(err.message.clone());
                    if err.class != ErrorClass::Transient || Instant::now() >= until {
                        return Err(format!("the retry failed: {err}"));
                    }
                    tokio::time::sleep(self.options.poll.max(Duration::from_millis(500))).await;
                }
            }
        };
        let listed = self.list().await?;
        let count = marked_for(&listed, &spec.uid).len();
        if count != 1 {
            return Err(format!(
                "UID {} has {count} instances after the retry (the retry returned {})",
                spec.uid, instance.provider_id
            ));
        }
        Ok(())
    }

    /// Deletes what the run made and did not delete itself, and waits for
    /// it to go. Best effort: a failure here is no case's.
    async fn clean_up(&mut self) {
        for id in self.made.clone() {
            let _ = self.delete(&id).await;
        }
    }

    /// `get`, its answer kept for the credential check.
    async fn get(&mut self, id: &str) -> Result<Instance, ProviderError> {
        let answer = self.provider.get(id).await;
        match &answer {
            Ok(instance) => self.remember_instance(instance),
            Err(err) => self.answers.push(err.message.clone()),
        }
        answer
    }

    /// `list`, its answer kept for the credential check.
    async fn list(&mut self) -> Result<Vec<Instance>, String> {
        match self.provider.list().await {
            Ok(listed) => {
                for instance in &listed {
                    self.remember_instance(instance);
                }
                Ok(listed)
            }
            Err(err) => {
                self.answers.push(err.message.clone());
                Err(format!("list failed: {err}"))
            }
        }
    }

    fn no_secret(&self) -> Result<(), String> {
        let password = self.credential.password();
        match self.answers.iter().find(|text| text.contains(password) || text.contains(REDACTED)) {
            None => Ok(()),
            // The host's redaction catches what a plugin hands back; a
            // plugin that keeps the rule never makes it work.
            Some(text) => Err(format!("an answer held the credential: {text}")),
        }
    }

    fn remember_instance(&mut self, instance: &Instance) {
        self.answers.push(instance.provider_id.clone());
        self.answers.push(instance.name.clone());
        self.answers.extend(instance.addresses.iter().cloned());
        if let Some(mark) = &instance.mark {
            self.answers.extend([mark.uid.clone(), mark.namespace.clone(), mark.name.clone()]);
        }
    }

    fn record(&mut self, (name, rule): Rule, started: Instant, result: Result<(), String>) {
        let outcome = match result {
            Ok(()) => Outcome::Passed,
            Err(why) => Outcome::Failed(why),
        };
        self.cases.push(Case { name, rule, outcome, took: started.elapsed() });
    }

    fn skip(&mut self, (name, rule): Rule, why: &str) {
        let outcome = Outcome::Skipped(why.to_owned());
        self.cases.push(Case { name, rule, outcome, took: Duration::ZERO });
    }
}

fn describe(info: &PluginInfo) -> Result<(), String> {
    if info.name.is_empty() {
        return Err("describe gave no name".to_owned());
    }
    let numbers = |version: &str| {
        let parts: Vec<&str> = version.split(['-', '+']).next().unwrap_or("").split('.').collect();
        parts.len() == 3 && parts.iter().all(|part| part.parse::<u64>().is_ok())
    };
    if !numbers(&info.version) {
        return Err(format!("version {:?} is not a semantic version", info.version));
    }
    if !numbers(&info.contract_version) {
        return Err(format!("contract version {:?} is not a version", info.contract_version));
    }
    match serde_json::from_str::<Value>(&info.config_schema) {
        Ok(Value::Object(_)) => Ok(()),
        Ok(_) => Err("the config schema is not a JSON object".to_owned()),
        Err(err) => Err(format!("the config schema is not JSON: {err}")),
    }
}

/// The listed instances whose mark names the Proxy `uid`.
fn marked_for<'a>(listed: &'a [Instance], uid: &str) -> Vec<&'a Instance> {
    listed
        .iter()
        .filter(|instance| instance.mark.as_ref().is_some_and(|mark| mark.uid == uid))
        .collect()
}

/// The mark of `instance` is the one `spec` asks for.
fn check_mark(spec: &ProxySpec, instance: &Instance, installation: &str) -> Result<(), String> {
    let id = &instance.provider_id;
    let Some(mark) = &instance.mark else {
        return Err(format!("{id} carries no mark"));
    };
    if mark.uid != spec.uid || mark.namespace != spec.namespace || mark.name != spec.name {
        return Err(format!(
            "{id} is marked {}/{} (UID {}), not {}/{} (UID {})",
            mark.namespace, mark.name, mark.uid, spec.namespace, spec.name, spec.uid
        ));
    }
    if mark.installation != installation {
        return Err(format!(
            "{id}'s mark names installation {:?}, not the spec's {installation:?}",
            mark.installation
        ));
    }
    if instance.state == InstanceState::Failed {
        return Err(format!("{id} is failed"));
    }
    Ok(())
}
