//! The simulated cloud: instances, zone operations and request IDs, and the
//! Compute Engine semantics of each call (validation, error texts, how an
//! operation's outcome changes the instance).

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::task::JoinHandle;

use crate::oauth::Oauth;
use crate::time::{now_unix, rfc3339};
use crate::{Faults, PORT_METADATA_KEY, SimOptions};

/// Self links use the real API's host: they are identifiers, and the
/// plugin never follows them.
const LINK_BASE: &str = "https://www.googleapis.com/compute/v1";
/// Largest page `list` returns (`maxResults` may ask for less).
const MAX_PAGE: usize = 500;
/// Compute Engine's cap on one metadata value.
const MAX_METADATA_VALUE: usize = 256 * 1024;

/// An error answer, rendered in Google's JSON error format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub code: u16,
    /// `errors[0].reason`: `notFound`, `alreadyExists`, `invalid`, ...
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into() }
    }

    fn not_found(resource: &str) -> Self {
        Self::new(404, "notFound", format!("The resource '{resource}' was not found"))
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::new(400, "invalid", message)
    }

    /// The `status` of the error body for its code.
    pub fn status(&self) -> &'static str {
        match self.code {
            400 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            409 => "ALREADY_EXISTS",
            412 => "FAILED_PRECONDITION",
            429 => "RESOURCE_EXHAUSTED",
            503 => "UNAVAILABLE",
            _ => "INTERNAL",
        }
    }
}

pub(crate) type ApiResult = Result<Value, ApiError>;

/// An instance as a test sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceView {
    /// Its project.
    pub project: String,
    /// Its zone.
    pub zone: String,
    /// Its name.
    pub name: String,
    /// Its numeric ID.
    pub id: u64,
    /// `PROVISIONING`, `STAGING`, `RUNNING`, `STOPPING`, ...
    pub status: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its metadata items.
    pub metadata: BTreeMap<String, String>,
    /// Its network tags.
    pub tags: Vec<String>,
    /// Its machine type's name (`e2-custom-2-2048`).
    pub machine_type: String,
    /// Where its proxy listens while it runs.
    pub proxy: Option<SocketAddr>,
}

/// An operation as a test sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationView {
    /// Its name.
    pub name: String,
    /// `insert` or `delete`.
    pub operation_type: String,
    /// The instance it works on.
    pub target: String,
    /// The zone.
    pub zone: String,
    /// The `requestId` it was made with, if any.
    pub request_id: Option<String>,
    /// `PENDING`, `RUNNING` or `DONE`.
    pub status: String,
    /// The error code it ended with, if it failed.
    pub error: Option<String>,
}

#[derive(Debug)]
struct Instance {
    project: String,
    zone: String,
    name: String,
    id: u64,
    status: &'static str,
    created: u64,
    machine_type: String,
    labels: BTreeMap<String, String>,
    label_fingerprint: u64,
    tags: Vec<String>,
    metadata: Vec<(String, String)>,
    network: String,
    external: bool,
    disks: Vec<Value>,
    staged_at: Option<Instant>,
    proxy: Option<(SocketAddr, JoinHandle<()>)>,
}

impl Instance {
    fn self_link(&self) -> String {
        format!("{LINK_BASE}/projects/{}/zones/{}/instances/{}", self.project, self.zone, self.name)
    }

    fn view(&self) -> InstanceView {
        InstanceView {
            project: self.project.clone(),
            zone: self.zone.clone(),
            name: self.name.clone(),
            id: self.id,
            status: self.status.to_owned(),
            labels: self.labels.clone(),
            metadata: self.metadata.iter().cloned().collect(),
            tags: self.tags.clone(),
            machine_type: self.machine_type.clone(),
            proxy: self.proxy.as_ref().map(|(addr, _)| *addr),
        }
    }

    fn to_json(&self) -> Value {
        let running = self.status == "RUNNING";
        let mut access_configs = Vec::new();
        if self.external {
            let mut config = json!({"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT",
                                    "name": "External NAT", "networkTier": "PREMIUM"});
            if running {
                config["natIP"] = json!(Ipv4Addr::LOCALHOST.to_string());
            }
            access_configs.push(config);
        }
        let mut interface = json!({
            "kind": "compute#networkInterface",
            "name": "nic0",
            "network": self.network,
            "accessConfigs": access_configs,
            "stackType": "IPV4_ONLY",
        });
        // An internal address is assigned when the instance is scheduled.
        if self.status != "PROVISIONING" {
            interface["networkIP"] = json!(Ipv4Addr::LOCALHOST.to_string());
        }
        let mut metadata_items: Vec<Value> =
            self.metadata.iter().map(|(key, value)| json!({"key": key, "value": value})).collect();
        if let Some((addr, _)) = &self.proxy {
            metadata_items
                .push(json!({"key": PORT_METADATA_KEY, "value": addr.port().to_string()}));
        }
        let mut instance = json!({
            "kind": "compute#instance",
            "id": self.id.to_string(),
            "creationTimestamp": rfc3339(self.created),
            "name": self.name,
            "machineType": format!("{LINK_BASE}/projects/{}/zones/{}/machineTypes/{}", self.project, self.zone, self.machine_type),
            "status": self.status,
            "zone": format!("{LINK_BASE}/projects/{}/zones/{}", self.project, self.zone),
            "networkInterfaces": [interface],
            "disks": self.disks,
            "metadata": {"kind": "compute#metadata", "fingerprint": "c2ltLW1ldGE=", "items": metadata_items},
            "tags": {"items": self.tags, "fingerprint": "c2ltLXRhZ3M="},
            "labelFingerprint": format!("{:016x}", self.label_fingerprint),
            "selfLink": self.self_link(),
        });
        if !self.labels.is_empty() {
            instance["labels"] = json!(self.labels);
        }
        instance
    }
}

/// How an operation ends.
#[derive(Debug, Clone)]
enum Outcome {
    Success,
    /// `error.errors[0].code`, its message, and the HTTP status Compute
    /// Engine puts in `httpErrorStatusCode`.
    Error {
        code: &'static str,
        message: String,
        http: u16,
    },
}

#[derive(Debug)]
struct Operation {
    name: String,
    id: u64,
    project: String,
    zone: String,
    kind: &'static str,
    target: String,
    target_id: u64,
    user: String,
    request_id: Option<String>,
    inserted: u64,
    started: Instant,
    duration: Duration,
    outcome: Outcome,
    applied: bool,
}

impl Operation {
    fn status(&self, now: Instant) -> &'static str {
        let elapsed = now.saturating_duration_since(self.started);
        if self.applied || elapsed >= self.duration {
            "DONE"
        } else if elapsed >= self.duration / 4 {
            "RUNNING"
        } else {
            "PENDING"
        }
    }

    fn view(&self, now: Instant) -> OperationView {
        OperationView {
            name: self.name.clone(),
            operation_type: self.kind.to_owned(),
            target: self.target.clone(),
            zone: self.zone.clone(),
            request_id: self.request_id.clone(),
            status: self.status(now).to_owned(),
            error: match &self.outcome {
                Outcome::Error { code, .. } if self.applied => Some((*code).to_owned()),
                _ => None,
            },
        }
    }

    fn to_json(&self, now: Instant) -> Value {
        let status = self.status(now);
        let zone_link = format!("{LINK_BASE}/projects/{}/zones/{}", self.project, self.zone);
        let progress = match status {
            "PENDING" => 0,
            "RUNNING" => 50,
            _ => 100,
        };
        let mut operation = json!({
            "kind": "compute#operation",
            "id": self.id.to_string(),
            "name": self.name,
            "zone": zone_link,
            "operationType": self.kind,
            "targetLink": format!("{zone_link}/instances/{}", self.target),
            "targetId": self.target_id.to_string(),
            "status": status,
            "user": self.user,
            "progress": progress,
            "insertTime": rfc3339(self.inserted),
            "selfLink": format!("{zone_link}/operations/{}", self.name),
        });
        if status != "PENDING" {
            operation["startTime"] = json!(rfc3339(self.inserted));
        }
        if status == "DONE" {
            let took = self.duration.as_secs();
            operation["endTime"] = json!(rfc3339(self.inserted + took));
            if let Outcome::Error { code, message, http } = &self.outcome {
                operation["error"] = json!({"errors": [{"code": code, "message": message}]});
                operation["httpErrorStatusCode"] = json!(http);
                operation["httpErrorMessage"] =
                    json!(if *http == 403 { "FORBIDDEN" } else { "SERVICE UNAVAILABLE" });
            }
        }
        operation
    }
}

#[derive(Debug, Default)]
struct State {
    instances: BTreeMap<(String, String, String), Instance>,
    operations: Vec<Operation>,
    /// requestId -> index into `operations`.
    request_ids: HashMap<String, usize>,
    /// (project, zone, name) -> index into `operations`.
    operation_names: HashMap<(String, String, String), usize>,
    /// Indices of the operations that have not taken effect yet, and the
    /// instances booting: what [`Sim::advance`] looks at, so a request
    /// costs the same however many instances and operations there are.
    unapplied: Vec<usize>,
    staging: Vec<(String, String, String)>,
    next_id: u64,
    requests: Vec<String>,
    /// Every accepted `instances.delete`, in order.
    deletions: Vec<Deletion>,
}

/// An accepted `instances.delete`: what was asked to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    /// Its zone.
    pub zone: String,
    /// Its name.
    pub name: String,
    /// Its labels when the delete was accepted.
    pub labels: BTreeMap<String, String>,
}

impl State {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        // Compute Engine IDs are large unsigned numbers; keep the shape.
        4_000_000_000_000_000_000 + self.next_id
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub options: SimOptions,
    pub faults: Mutex<Faults>,
    pub oauth: Oauth,
    state: Mutex<State>,
    request_count: Mutex<u64>,
}

/// RFC 1035 names, as Compute Engine requires for instances:
/// `[a-z]([-a-z0-9]{0,61}[a-z0-9])?`.
pub(crate) fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && !name.ends_with('-')
}

/// Label keys: 1-63 of `[a-z0-9_-]` (international letters too, which the
/// simulator does not model), starting with a letter.
pub(crate) fn valid_label_key(key: &str) -> bool {
    key.len() <= 63
        && key.starts_with(|c: char| c.is_ascii_lowercase())
        && key.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Label values: 0-63 of `[a-z0-9_-]`.
pub(crate) fn valid_label_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Predefined shapes the simulator knows; custom ones are checked by rule.
const MACHINE_TYPES: &[&str] = &[
    "e2-micro",
    "e2-small",
    "e2-medium",
    "e2-standard-2",
    "e2-standard-4",
    "e2-standard-8",
    "e2-standard-16",
    "e2-standard-32",
    "e2-highcpu-2",
    "e2-highcpu-4",
    "e2-highcpu-8",
    "e2-highmem-2",
    "e2-highmem-4",
    "e2-highmem-8",
    "n2-standard-2",
    "n2-standard-4",
];

/// Whether `name` is a machine type the simulator accepts: a predefined one,
/// or `e2-custom-N-M`/`n2-custom-N-M` (N even from 2 to 32, M a multiple of
/// 256 MiB, 512 MiB to 8 GiB per vCPU).
pub(crate) fn valid_machine_type(name: &str) -> bool {
    if MACHINE_TYPES.contains(&name) {
        return true;
    }
    let Some(rest) = name.strip_prefix("e2-custom-").or_else(|| name.strip_prefix("n2-custom-"))
    else {
        return false;
    };
    let Some((cpus, memory)) = rest.split_once('-') else { return false };
    let (Ok(cpus), Ok(memory)) = (cpus.parse::<u64>(), memory.parse::<u64>()) else {
        return false;
    };
    (2..=32).contains(&cpus)
        && cpus % 2 == 0
        && memory % 256 == 0
        && memory >= 512 * cpus
        && memory <= 8192 * cpus
}

/// The last path segment of a URL or partial URL.
fn last_segment(link: &str) -> &str {
    link.rsplit('/').next().unwrap_or(link)
}

impl Shared {
    pub fn new(options: SimOptions, token_uri: String) -> Self {
        let oauth = Oauth::new(token_uri, options.token_lifetime);
        Self {
            options,
            faults: Mutex::new(Faults::default()),
            oauth,
            state: Mutex::new(State::default()),
            request_count: Mutex::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn faults(&self) -> Faults {
        self.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Every accepted delete so far.
    pub fn deletions(&self) -> Vec<Deletion> {
        self.state().deletions.clone()
    }

    /// Takes one lost delete response from the faults, if any is left.
    pub fn take_lost_delete(&self) -> bool {
        let mut faults = self.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if faults.lose_delete_responses > 0 {
            faults.lose_delete_responses -= 1;
            true
        } else {
            false
        }
    }

    /// Takes one lost insert response from the faults, if any is left.
    pub fn take_lost_insert(&self) -> bool {
        let mut faults = self.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if faults.lose_insert_responses > 0 {
            faults.lose_insert_responses -= 1;
            true
        } else {
            false
        }
    }

    /// Records a request; returns the fault it should answer with, if any.
    pub fn record_request(&self, line: String, is_api: bool) -> Option<ApiError> {
        self.state().requests.push(line);
        if !is_api {
            return None;
        }
        let faults = self.faults();
        let mut count =
            self.request_count.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *count += 1;
        let every = |n: u32| n > 0 && (*count).is_multiple_of(u64::from(n));
        if every(faults.server_error_every) {
            Some(ApiError::new(503, "backendError", "Internal error. Please try again."))
        } else if every(faults.rate_limit_every) {
            Some(ApiError::new(
                429,
                "rateLimitExceeded",
                "Rate Limit Exceeded: too many requests for this project; retry later.",
            ))
        } else {
            None
        }
    }

    pub fn requests(&self) -> Vec<String> {
        self.state().requests.clone()
    }

    pub fn instances(&self) -> Vec<InstanceView> {
        self.state().instances.values().map(Instance::view).collect()
    }

    pub fn operations(&self) -> Vec<OperationView> {
        let now = Instant::now();
        self.state().operations.iter().map(|op| op.view(now)).collect()
    }

    pub fn stop_all_proxies(&self) {
        for instance in self.state().instances.values_mut() {
            if let Some((_, task)) = instance.proxy.take() {
                task.abort();
            }
        }
    }

    pub fn add_foreign_instance(
        &self,
        project: &str,
        zone: &str,
        name: &str,
        labels: &[(&str, &str)],
    ) {
        let mut state = self.state();
        let id = state.next_id();
        let instance = Instance {
            project: project.to_owned(),
            zone: zone.to_owned(),
            name: name.to_owned(),
            id,
            status: "RUNNING",
            created: now_unix(),
            machine_type: "e2-small".to_owned(),
            labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            label_fingerprint: id,
            tags: Vec::new(),
            metadata: Vec::new(),
            network: format!("{LINK_BASE}/projects/{project}/global/networks/default"),
            external: false,
            disks: Vec::new(),
            staged_at: None,
            proxy: None,
        };
        state.instances.insert((project.to_owned(), zone.to_owned(), name.to_owned()), instance);
    }

    /// Applies what time has done: finished operations take effect, booted
    /// instances run (and open their proxy).
    pub fn advance(&self) {
        let now = Instant::now();
        let mut state = self.state();
        let State { operations, instances, unapplied, staging, .. } = &mut *state;
        unapplied.retain(|&index| {
            let op = &mut operations[index];
            if op.status(now) != "DONE" {
                return true;
            }
            op.applied = true;
            let key = (op.project.clone(), op.zone.clone(), op.target.clone());
            match (op.kind, &op.outcome) {
                ("insert", Outcome::Success) => {
                    if let Some(instance) = instances.get_mut(&key)
                        && instance.id == op.target_id
                    {
                        instance.status = "STAGING";
                        instance.staged_at = Some(now);
                        staging.push(key);
                    }
                }
                ("insert", Outcome::Error { .. }) | ("delete", Outcome::Success) => {
                    if instances.get(&key).is_some_and(|i| i.id == op.target_id)
                        && let Some(mut instance) = instances.remove(&key)
                        && let Some((_, task)) = instance.proxy.take()
                    {
                        task.abort();
                    }
                }
                _ => {}
            }
            false
        });
        staging.retain(|key| {
            // Gone, or on its way out (a delete while it booted).
            let Some(instance) = instances.get_mut(key).filter(|i| i.status == "STAGING") else {
                return false;
            };
            if instance.staged_at.is_some_and(|at| now >= at + self.options.boot_duration) {
                instance.status = "RUNNING";
                // A proxy that cannot bind leaves the instance without a
                // port, which the test then notices.
                if let Ok(listener) = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                    && let Ok(addr) = listener.local_addr()
                    && let Ok(task) = proxyfleet_sim_support::proxy::serve_on(listener)
                {
                    instance.proxy = Some((addr, task));
                }
            }
            instance.status == "STAGING"
        });
    }

    fn check_project(&self, project: &str) -> Result<(), ApiError> {
        if self.options.projects.iter().any(|p| p == project) {
            Ok(())
        } else {
            Err(ApiError::not_found(&format!("projects/{project}")))
        }
    }

    fn check_zone(&self, project: &str, zone: &str) -> Result<(), ApiError> {
        self.check_project(project)?;
        if self.options.zones.iter().any(|z| z == zone) {
            Ok(())
        } else {
            Err(ApiError::not_found(&format!("projects/{project}/zones/{zone}")))
        }
    }

    pub fn project(&self, project: &str) -> ApiResult {
        self.check_project(project)?;
        Ok(json!({
            "kind": "compute#project",
            "id": "1000000000001",
            "name": project,
            "selfLink": format!("{LINK_BASE}/projects/{project}"),
            "quotas": [{"metric": "CPUS_ALL_REGIONS", "limit": 32.0, "usage": 0.0}],
        }))
    }

    pub fn zone(&self, project: &str, zone: &str) -> ApiResult {
        self.check_zone(project, zone)?;
        let region = zone.rsplit_once('-').map_or(zone, |(region, _)| region);
        Ok(json!({
            "kind": "compute#zone",
            "name": zone,
            "status": "UP",
            "region": format!("{LINK_BASE}/projects/{project}/regions/{region}"),
            "selfLink": format!("{LINK_BASE}/projects/{project}/zones/{zone}"),
        }))
    }

    /// An image by name or `family/{family}` in any project, as public
    /// images are readable by everyone.
    pub fn image(&self, project: &str, name: &str, by_family: bool) -> ApiResult {
        let found = self.options.images.iter().find(|image| {
            image.project == project
                && if by_family {
                    image.family.as_deref() == Some(name)
                } else {
                    image.name == name
                }
        });
        match found {
            Some(image) => Ok(json!({
                "kind": "compute#image",
                "name": image.name,
                "family": image.family,
                "status": "READY",
                "selfLink": format!("{LINK_BASE}/projects/{}/global/images/{}", image.project, image.name),
            })),
            None if by_family => {
                Err(ApiError::not_found(&format!("projects/{project}/global/images/family/{name}")))
            }
            None => Err(ApiError::not_found(&format!("projects/{project}/global/images/{name}"))),
        }
    }

    pub fn instance_template(&self, project: &str, name: &str) -> ApiResult {
        if self.options.instance_templates.iter().any(|(p, n)| p == project && n == name) {
            Ok(json!({
                "kind": "compute#instanceTemplate",
                "name": name,
                "selfLink": format!("{LINK_BASE}/projects/{project}/global/instanceTemplates/{name}"),
                "properties": {"machineType": "e2-small"},
            }))
        } else {
            Err(ApiError::not_found(&format!("projects/{project}/global/instanceTemplates/{name}")))
        }
    }

    /// Resolves a `sourceImage` or `sourceInstanceTemplate` reference:
    /// `projects/P/global/images/N`, `.../images/family/F`, or a full URL of
    /// either; a template as `projects/P/global/instanceTemplates/N` or
    /// `global/instanceTemplates/N` (in the request's project).
    fn resolve_source(&self, project: &str, link: &str) -> Result<(), ApiError> {
        let path = link.split("/compute/v1/").last().unwrap_or(link);
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match segments.as_slice() {
            ["projects", p, "global", "images", "family", family] => {
                self.image(p, family, true).map(drop)
            }
            ["projects", p, "global", "images", name] => self.image(p, name, false).map(drop),
            ["global", "images", "family", family] => self.image(project, family, true).map(drop),
            ["global", "images", name] => self.image(project, name, false).map(drop),
            ["projects", p, "global", "instanceTemplates", name] => {
                self.instance_template(p, name).map(drop)
            }
            ["global", "instanceTemplates", name] => {
                self.instance_template(project, name).map(drop)
            }
            _ => Err(ApiError::invalid(format!(
                "Invalid value for field 'resource.disks[0].initializeParams.sourceImage': '{link}'. \
                 The URL is malformed."
            ))),
        }
    }

    pub fn get_instance(&self, project: &str, zone: &str, name: &str) -> ApiResult {
        self.check_zone(project, zone)?;
        self.advance();
        let state = self.state();
        state
            .instances
            .get(&(project.to_owned(), zone.to_owned(), name.to_owned()))
            .map(Instance::to_json)
            .ok_or_else(|| {
                ApiError::not_found(&format!("projects/{project}/zones/{zone}/instances/{name}"))
            })
    }

    /// `instances.list` with a filter, `maxResults` and `pageToken`.
    pub fn list_instances(
        &self,
        project: &str,
        zone: &str,
        filter: Option<&str>,
        max_results: Option<&str>,
        page_token: Option<&str>,
    ) -> ApiResult {
        self.check_zone(project, zone)?;
        let filter = match filter {
            Some(text) if !text.trim().is_empty() => Some(Filter::parse(text)?),
            _ => None,
        };
        let page_size = match max_results {
            None => MAX_PAGE,
            Some(text) => match text.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
                _ => {
                    return Err(ApiError::invalid(format!(
                        "Invalid value for field 'maxResults': '{text}'. Must be less than or equal to 500"
                    )));
                }
            },
        };
        let start = match page_token {
            None | Some("") => 0,
            Some(token) => token
                .strip_prefix("sim-page-")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| ApiError::invalid("Invalid value for field 'pageToken'"))?,
        };
        self.advance();
        let state = self.state();
        let matching: Vec<&Instance> = state
            .instances
            .values()
            .filter(|i| i.project == project && i.zone == zone)
            .filter(|i| filter.as_ref().is_none_or(|f| f.matches(i)))
            .collect();
        let page: Vec<Value> =
            matching.iter().skip(start).take(page_size).map(|i| i.to_json()).collect();
        let mut answer = json!({
            "kind": "compute#instanceList",
            "id": format!("projects/{project}/zones/{zone}/instances"),
            "selfLink": format!("{LINK_BASE}/projects/{project}/zones/{zone}/instances"),
        });
        if !page.is_empty() {
            answer["items"] = Value::Array(page);
        }
        if start + page_size < matching.len() {
            answer["nextPageToken"] = json!(format!("sim-page-{}", start + page_size));
        }
        Ok(answer)
    }

    /// The operation an earlier request with `request_id` made, if any.
    fn replayed(&self, state: &State, request_id: Option<&str>) -> Option<Value> {
        let index = *state.request_ids.get(request_id?)?;
        Some(state.operations[index].to_json(Instant::now()))
    }

    fn check_request_id(request_id: Option<&str>) -> Result<(), ApiError> {
        let Some(id) = request_id else { return Ok(()) };
        let hex: String = id.chars().filter(|c| *c != '-').collect();
        let shaped = id.len() == 36
            && [8, 13, 18, 23].iter().all(|&i| id.as_bytes()[i] == b'-')
            && hex.len() == 32
            && hex.chars().all(|c| c.is_ascii_hexdigit());
        if !shaped || hex.chars().all(|c| c == '0') {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'requestId': '{id}'. The request id must be a valid \
                 UUID with the exception that zero UUID is not supported \
                 (00000000-0000-0000-0000-000000000000)."
            )));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments, reason = "mirrors the API call's parameters")]
    fn new_operation(
        &self,
        state: &mut State,
        project: &str,
        zone: &str,
        kind: &'static str,
        target: &str,
        target_id: u64,
        user: &str,
        request_id: Option<&str>,
        outcome: Outcome,
    ) -> Value {
        let id = state.next_id();
        let operation = Operation {
            name: format!("operation-{}-{:013x}", now_unix() * 1000, id & 0xf_ffff_ffff_ffff),
            id,
            project: project.to_owned(),
            zone: zone.to_owned(),
            kind,
            target: target.to_owned(),
            target_id,
            user: user.to_owned(),
            request_id: request_id.map(str::to_owned),
            inserted: now_unix(),
            started: Instant::now(),
            duration: self.options.operation_duration,
            outcome,
            applied: false,
        };
        let value = operation.to_json(Instant::now());
        let index = state.operations.len();
        state
            .operation_names
            .insert((project.to_owned(), zone.to_owned(), operation.name.clone()), index);
        state.operations.push(operation);
        state.unapplied.push(index);
        if let Some(request_id) = request_id {
            state.request_ids.insert(request_id.to_owned(), index);
        }
        value
    }

    /// `instances.insert`: validates the body, makes the instance
    /// (`PROVISIONING`) and its operation, whose outcome the faults decide.
    pub fn insert_instance(
        &self,
        project: &str,
        zone: &str,
        body: &Value,
        request_id: Option<&str>,
        template: Option<&str>,
        user: &str,
    ) -> ApiResult {
        self.check_zone(project, zone)?;
        Self::check_request_id(request_id)?;
        self.advance();
        // Held to the end, so that two requests with one requestId make
        // one operation.
        let mut state = self.state();
        if let Some(replayed) = self.replayed(&state, request_id) {
            return Ok(replayed);
        }
        let name = body["name"].as_str().unwrap_or_default();
        if !valid_name(name) {
            return Err(ApiError::invalid(format!(
                "Invalid value for field 'resource.name': '{name}'. Must be a match of regex \
                 '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'"
            )));
        }
        if let Some(template) = template {
            self.resolve_source(project, template)?;
        }
        let machine_type = match body["machineType"].as_str() {
            Some(link) => {
                let name = last_segment(link);
                if !valid_machine_type(name) {
                    return Err(ApiError::invalid(format!(
                        "Invalid value for field 'resource.machineType': '{link}'. Machine type \
                         with name '{name}' does not exist in zone '{zone}'."
                    )));
                }
                name.to_owned()
            }
            None if template.is_some() => "e2-small".to_owned(),
            None => {
                return Err(ApiError::invalid(
                    "Invalid value for field 'resource.machineType': ''. Machine type must be specified.",
                ));
            }
        };
        let disks = body["disks"].as_array().cloned().unwrap_or_default();
        if template.is_none() {
            let boot = disks.iter().find(|disk| disk["boot"] == true);
            let Some(source) =
                boot.and_then(|disk| disk["initializeParams"]["sourceImage"].as_str())
            else {
                return Err(ApiError::invalid(
                    "Invalid value for field 'resource.disks': ''. Boot disk must be specified.",
                ));
            };
            self.resolve_source(project, source)?;
        }
        let mut labels = BTreeMap::new();
        if let Some(object) = body["labels"].as_object() {
            if object.len() > 64 {
                return Err(ApiError::invalid(
                    "Invalid value for field 'resource.labels': at most 64 labels",
                ));
            }
            for (key, value) in object {
                let value = value.as_str().unwrap_or_default();
                if !valid_label_key(key) || !valid_label_value(value) {
                    return Err(ApiError::invalid(format!(
                        "Invalid value for field 'resource.labels': '{key}' = '{value}'. Label keys \
                         and values can only contain lowercase letters, numeric characters, \
                         underscores and dashes, 63 characters at most; keys start with a letter."
                    )));
                }
                labels.insert(key.clone(), value.to_owned());
            }
        }
        let mut metadata = Vec::new();
        for item in body["metadata"]["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let key = item["key"].as_str().unwrap_or_default().to_owned();
            let value = item["value"].as_str().unwrap_or_default().to_owned();
            if metadata.iter().any(|(k, _)| *k == key) {
                return Err(ApiError::invalid(format!(
                    "Invalid value for field 'resource.metadata': duplicate key '{key}'"
                )));
            }
            if value.len() > MAX_METADATA_VALUE {
                return Err(ApiError::invalid(format!(
                    "Invalid value for field 'resource.metadata': the value of '{key}' is over 256 KiB"
                )));
            }
            metadata.push((key, value));
        }
        let tags = body["tags"]["items"]
            .as_array()
            .map(|items| items.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default();
        let interface = &body["networkInterfaces"][0];
        let network = interface["network"]
            .as_str()
            .map_or_else(|| format!("projects/{project}/global/networks/default"), str::to_owned);
        let external =
            interface["accessConfigs"].as_array().is_some_and(|configs| !configs.is_empty());

        let faults = self.faults();
        let outcome = if faults.quota_exceeded {
            Outcome::Error {
                code: "QUOTA_EXCEEDED",
                message: format!(
                    "Quota 'CPUS' exceeded.  Limit: 8.0 in region {}.",
                    zone.rsplit_once('-').map_or(zone, |(region, _)| region)
                ),
                http: 403,
            }
        } else if faults.exhausted_zones.iter().any(|z| z == zone) {
            Outcome::Error {
                code: "ZONE_RESOURCE_POOL_EXHAUSTED",
                message: format!(
                    "The zone 'projects/{project}/zones/{zone}' does not have enough resources \
                     available to fulfill the request.  Try a different zone, or try again later."
                ),
                http: 503,
            }
        } else {
            Outcome::Success
        };
        let key = (project.to_owned(), zone.to_owned(), name.to_owned());
        if state.instances.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "alreadyExists",
                format!(
                    "The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"
                ),
            ));
        }
        let id = state.next_id();
        state.instances.insert(
            key,
            Instance {
                project: project.to_owned(),
                zone: zone.to_owned(),
                name: name.to_owned(),
                id,
                status: "PROVISIONING",
                created: now_unix(),
                machine_type,
                labels,
                label_fingerprint: id,
                tags,
                metadata,
                network,
                external,
                disks,
                staged_at: None,
                proxy: None,
            },
        );
        Ok(self.new_operation(
            &mut state, project, zone, "insert", name, id, user, request_id, outcome,
        ))
    }

    /// `instances.delete`: the instance stops and is gone when the
    /// operation is done.
    pub fn delete_instance(
        &self,
        project: &str,
        zone: &str,
        name: &str,
        request_id: Option<&str>,
        user: &str,
    ) -> ApiResult {
        self.check_zone(project, zone)?;
        Self::check_request_id(request_id)?;
        self.advance();
        let mut state = self.state();
        if let Some(replayed) = self.replayed(&state, request_id) {
            return Ok(replayed);
        }
        let key = (project.to_owned(), zone.to_owned(), name.to_owned());
        let Some(instance) = state.instances.get_mut(&key) else {
            return Err(ApiError::not_found(&format!(
                "projects/{project}/zones/{zone}/instances/{name}"
            )));
        };
        instance.status = "STOPPING";
        if let Some((_, task)) = instance.proxy.take() {
            task.abort();
        }
        let id = instance.id;
        let deletion = Deletion {
            zone: zone.to_owned(),
            name: name.to_owned(),
            labels: instance.labels.clone(),
        };
        state.deletions.push(deletion);
        Ok(self.new_operation(
            &mut state,
            project,
            zone,
            "delete",
            name,
            id,
            user,
            request_id,
            Outcome::Success,
        ))
    }

    /// `zoneOperations.get`; `wait` answers the same once the operation is
    /// done (the caller waits).
    pub fn get_operation(&self, project: &str, zone: &str, name: &str) -> ApiResult {
        self.check_zone(project, zone)?;
        self.advance();
        let state = self.state();
        state
            .operation_names
            .get(&(project.to_owned(), zone.to_owned(), name.to_owned()))
            .map(|&index| state.operations[index].to_json(Instant::now()))
            .ok_or_else(|| {
                ApiError::not_found(&format!("projects/{project}/zones/{zone}/operations/{name}"))
            })
    }
}

/// A conjunction of the filter terms the simulator understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Filter(Vec<Term>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    /// `labels.KEY:*`
    HasLabel(String),
    /// `labels.KEY = "VALUE"` (quotes optional)
    LabelIs(String, String),
    /// `name = "NAME"`
    NameIs(String),
}

impl Filter {
    /// Parses terms joined by `AND` or whitespace, each optionally in
    /// parentheses.
    pub(crate) fn parse(text: &str) -> Result<Self, ApiError> {
        let invalid = || {
            ApiError::invalid(format!(
                "Invalid value for field 'filter': '{text}'. Invalid list filter expression."
            ))
        };
        // Glue `key = value` back into one token before splitting.
        let normalised = text.replace(" = ", "=").replace("= ", "=").replace(" =", "=");
        let mut terms = Vec::new();
        for token in normalised.split_whitespace() {
            if token == "AND" {
                continue;
            }
            let token = token.trim_start_matches('(').trim_end_matches(')');
            if let Some(key) = token.strip_prefix("labels.").and_then(|t| t.strip_suffix(":*")) {
                terms.push(Term::HasLabel(key.to_owned()));
            } else if let Some((left, right)) = token.split_once('=') {
                let value = right.trim_matches('"').to_owned();
                match left.strip_prefix("labels.") {
                    Some(key) => terms.push(Term::LabelIs(key.to_owned(), value)),
                    None if left == "name" => terms.push(Term::NameIs(value)),
                    None => return Err(invalid()),
                }
            } else {
                return Err(invalid());
            }
        }
        if terms.is_empty() { Err(invalid()) } else { Ok(Self(terms)) }
    }

    fn matches(&self, instance: &Instance) -> bool {
        self.0.iter().all(|term| match term {
            Term::HasLabel(key) => instance.labels.contains_key(key),
            Term::LabelIs(key, value) => instance.labels.get(key) == Some(value),
            Term::NameIs(name) => instance.name == *name,
        })
    }
}

/// The JSON body of an error answer.
pub(crate) fn error_body(error: &ApiError) -> Value {
    let mut detail = Map::new();
    detail.insert("message".to_owned(), json!(error.message));
    detail.insert(
        "domain".to_owned(),
        json!(if error.code == 429 { "usageLimits" } else { "global" }),
    );
    detail.insert("reason".to_owned(), json!(error.reason));
    json!({"error": {"code": error.code, "message": error.message, "errors": [detail], "status": error.status()}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_labels_and_machine_types_follow_compute_engine() {
        assert!(valid_name("pf-0123abc"));
        assert!(!valid_name("0pf") && !valid_name("pf-") && !valid_name("Pf") && !valid_name(""));
        assert!(!valid_name(&"a".repeat(64)));
        assert!(valid_label_key("proxyfleet-uid") && !valid_label_key("1abc"));
        assert!(valid_label_value("") && !valid_label_value("Upper"));
        assert!(valid_machine_type("e2-small") && valid_machine_type("e2-custom-2-4096"));
        assert!(!valid_machine_type("e2-custom-3-4096"), "odd vCPU counts are refused");
        assert!(!valid_machine_type("e2-custom-2-1000"), "memory in 256 MiB steps");
        assert!(!valid_machine_type("e2-custom-2-20480"), "at most 8 GiB per vCPU");
    }

    #[test]
    fn filters_parse_the_forms_the_plugin_sends() {
        let filter = Filter::parse("labels.proxyfleet:*").unwrap();
        assert_eq!(filter.0, vec![Term::HasLabel("proxyfleet".into())]);
        let filter = Filter::parse("(labels.proxyfleet = \"pve\") AND (name = \"pf-1\")").unwrap();
        assert_eq!(
            filter.0,
            vec![Term::LabelIs("proxyfleet".into(), "pve".into()), Term::NameIs("pf-1".into())]
        );
        assert!(Filter::parse("status != RUNNING").is_err());
    }

    #[test]
    fn request_ids_must_be_non_zero_uuids() {
        assert!(Shared::check_request_id(Some("1b4e28ba-2fa1-41d2-883f-0016d3cca427")).is_ok());
        assert!(Shared::check_request_id(Some("00000000-0000-0000-0000-000000000000")).is_err());
        assert!(Shared::check_request_id(Some("not-a-uuid")).is_err());
        assert!(Shared::check_request_id(None).is_ok());
    }

    fn shared(faults: Faults) -> Shared {
        let options = SimOptions {
            operation_duration: Duration::from_millis(80),
            boot_duration: Duration::from_millis(20),
            ..SimOptions::default()
        };
        let shared = Shared::new(options, "https://localhost:1/token".into());
        *shared.faults.lock().unwrap() = faults;
        shared
    }

    fn body(name: &str) -> Value {
        json!({"name": name, "machineType": "zones/europe-west1-b/machineTypes/e2-small",
               "labels": {"proxyfleet": "lab"},
            "networkInterfaces": [{"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}],
               "disks": [{"boot": true, "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}]})
    }

    const ZONE: &str = "europe-west1-b";
    const RID: &str = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";

    #[tokio::test]
    async fn a_repeated_request_id_gets_the_first_operation_and_nothing_else() {
        let sim = shared(Faults::default());
        let first = sim
            .insert_instance("proxyfleet-test", ZONE, &body("pf-1"), Some(RID), None, "sa")
            .unwrap();
        assert_eq!(first["status"], "PENDING");
        let again = sim
            .insert_instance("proxyfleet-test", ZONE, &body("pf-1"), Some(RID), None, "sa")
            .unwrap();
        assert_eq!(again["name"], first["name"]);
        assert_eq!(sim.instances().len(), 1);
        assert_eq!(sim.operations().len(), 1);
        let other = "2b4e28ba-2fa1-41d2-883f-0016d3cca427";
        let conflict =
            sim.insert_instance("proxyfleet-test", ZONE, &body("pf-1"), Some(other), None, "sa");
        assert_eq!(conflict.unwrap_err().reason, "alreadyExists");
    }

    #[tokio::test]
    async fn operations_progress_and_instances_boot_with_a_proxy() {
        let sim = shared(Faults::default());
        let op =
            sim.insert_instance("proxyfleet-test", ZONE, &body("pf-2"), None, None, "sa").unwrap();
        let name = op["name"].as_str().unwrap().to_owned();
        assert_eq!(sim.instances()[0].status, "PROVISIONING");
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(sim.get_operation("proxyfleet-test", ZONE, &name).unwrap()["status"], "RUNNING");
        tokio::time::sleep(Duration::from_millis(60)).await;
        let done = sim.get_operation("proxyfleet-test", ZONE, &name).unwrap();
        assert_eq!((done["status"].as_str(), done["progress"].as_u64()), (Some("DONE"), Some(100)));
        assert!(done.get("error").is_none());
        tokio::time::sleep(Duration::from_millis(30)).await;
        sim.advance();
        let instance = sim.get_instance("proxyfleet-test", ZONE, "pf-2").unwrap();
        assert_eq!(instance["status"], "RUNNING");
        assert_eq!(instance["networkInterfaces"][0]["accessConfigs"][0]["natIP"], "127.0.0.1");
        let port = sim.instances()[0].proxy.expect("a proxy").port();
        assert_eq!(instance["metadata"]["items"][0]["value"], port.to_string());
        let listed = sim
            .list_instances("proxyfleet-test", ZONE, Some("labels.proxyfleet:*"), Some("1"), None)
            .unwrap();
        assert_eq!(listed["items"].as_array().unwrap().len(), 1);
        let none = sim
            .list_instances("proxyfleet-test", ZONE, Some("labels.other:*"), None, None)
            .unwrap();
        assert!(none.get("items").is_none());
    }

    #[tokio::test]
    async fn an_instance_deleted_while_it_boots_never_runs_and_leaves_when_its_delete_is_done() {
        let sim = shared(Faults::default());
        let op =
            sim.insert_instance("proxyfleet-test", ZONE, &body("pf-3"), None, None, "sa").unwrap();
        let name = op["name"].as_str().unwrap().to_owned();
        while sim.get_operation("proxyfleet-test", ZONE, &name).unwrap()["status"] != "DONE" {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(sim.instances()[0].status, "STAGING");
        let delete = sim.delete_instance("proxyfleet-test", ZONE, "pf-3", None, "sa").unwrap();
        let delete = delete["name"].as_str().unwrap().to_owned();
        // Past the boot: the instance stays on its way out, with no proxy.
        tokio::time::sleep(Duration::from_millis(40)).await;
        sim.advance();
        let instance = &sim.instances()[0];
        assert_eq!((instance.status.as_str(), instance.proxy), ("STOPPING", None));
        while sim.get_operation("proxyfleet-test", ZONE, &delete).unwrap()["status"] != "DONE" {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(sim.instances().is_empty());
        // Both operations stay where `zoneOperations.get` finds them.
        for name in [&name, &delete] {
            assert_eq!(sim.get_operation("proxyfleet-test", ZONE, name).unwrap()["status"], "DONE");
        }
    }

    #[tokio::test]
    async fn failed_inserts_end_with_their_code_and_leave_no_instance() {
        for (faults, code) in [
            (Faults { quota_exceeded: true, ..Faults::default() }, "QUOTA_EXCEEDED"),
            (
                Faults { exhausted_zones: vec![ZONE.into()], ..Faults::default() },
                "ZONE_RESOURCE_POOL_EXHAUSTED",
            ),
        ] {
            let sim = shared(faults);
            let op = sim
                .insert_instance("proxyfleet-test", ZONE, &body("pf-3"), None, None, "sa")
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let done =
                sim.get_operation("proxyfleet-test", ZONE, op["name"].as_str().unwrap()).unwrap();
            assert_eq!(done["error"]["errors"][0]["code"], code);
            assert!(sim.instances().is_empty(), "{code}");
        }
    }

    #[test]
    fn errors_render_in_google_format() {
        let body = error_body(&ApiError::not_found("projects/p/zones/z/instances/i"));
        assert_eq!(body["error"]["code"], 404);
        assert_eq!(body["error"]["status"], "NOT_FOUND");
        assert_eq!(body["error"]["errors"][0]["reason"], "notFound");
        assert_eq!(body["error"]["errors"][0]["domain"], "global");
    }
}
