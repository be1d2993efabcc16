//! The simulated cluster: VMs, worker tasks and ISO storage, and the PVE
//! semantics of each operation (locks, task effects, error texts).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use proxyfleet_sim_support::now_unix;
use serde_json::{Map, Value, json};
use tokio::task::JoinHandle;

use crate::{Faults, SimOptions, vm_address};

/// An error answer as PVE renders it.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub status: u16,
    pub message: String,
    /// Per-parameter reasons of a failed parameter verification.
    pub errors: Option<Map<String, Value>>,
    /// Raised by the node proxying the call (the target node could not be
    /// reached): the text is only in the reason phrase.
    pub from_proxy: bool,
}

impl ApiError {
    /// PVE answers most failures of a handler with 500 and the die text.
    pub fn internal(message: impl Into<String>) -> Self {
        Self { status: 500, message: message.into(), errors: None, from_proxy: false }
    }

    /// 595, what pveproxy answers when the node a call is for cannot be
    /// reached (offline, its pveproxy down).
    pub fn unreachable(message: &str) -> Self {
        Self { status: 595, message: message.to_owned(), errors: None, from_proxy: true }
    }

    /// 400 "Parameter verification failed." with the reason for `param`.
    pub fn parameter(param: &str, reason: impl Into<String>) -> Self {
        let mut errors = Map::new();
        errors.insert(param.to_owned(), Value::String(reason.into()));
        Self {
            status: 400,
            message: "Parameter verification failed.".to_owned(),
            errors: Some(errors),
            from_proxy: false,
        }
    }

    pub fn unauthorized(message: &str) -> Self {
        Self { status: 401, message: message.to_owned(), errors: None, from_proxy: false }
    }
}

pub(crate) type ApiResult = Result<Value, ApiError>;

/// A VM as the test sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmView {
    /// Its ID.
    pub vmid: u32,
    /// The node it lives on.
    pub node: String,
    /// `running` or `stopped`.
    pub status: String,
    /// The `lock` config value, if any.
    pub lock: Option<String>,
    /// The whole config, keys as in `qm config`.
    pub config: BTreeMap<String, String>,
    /// Where its proxy listens while it runs.
    pub proxy: Option<SocketAddr>,
}

#[derive(Debug)]
struct Vm {
    node: String,
    config: BTreeMap<String, String>,
    running: bool,
    started_at: Option<Instant>,
    proxy: Option<(SocketAddr, JoinHandle<()>)>,
}

impl Vm {
    fn lock(&self) -> Option<&str> {
        self.config.get("lock").map(String::as_str)
    }

    fn is_template(&self) -> bool {
        self.config.get("template").is_some_and(|value| value == "1")
    }
}

#[derive(Debug)]
enum Effect {
    /// Finish a clone: the new VM gets its config and loses the lock.
    Clone {
        newid: u32,
        config: BTreeMap<String, String>,
    },
    Start {
        vmid: u32,
    },
    Stop {
        vmid: u32,
    },
    Destroy {
        vmid: u32,
    },
    Resize {
        vmid: u32,
        disk: String,
        gib: u64,
    },
    Nothing,
}

#[derive(Debug)]
struct Task {
    upid: String,
    node: String,
    kind: String,
    id: String,
    user: String,
    pid: u32,
    pstart: u32,
    starttime: u64,
    done_at: Instant,
    /// `OK`, `WARNINGS: n`, or the error; set when the task was started so
    /// that a fault switched off meanwhile does not change its outcome.
    exit: String,
    /// Failed clones either clean up (PVE's default) or leave the VM locked.
    leave_locked: bool,
    effect: Option<Effect>,
    finished: bool,
}

#[derive(Debug, Default)]
struct State {
    vms: BTreeMap<u32, Vm>,
    tasks: HashMap<String, Task>,
    /// (node, storage) -> file name -> content.
    isos: BTreeMap<(String, String), BTreeMap<String, Vec<u8>>>,
    next_pid: u32,
    clones_started: usize,
    requests: Vec<String>,
    /// The config of every VM a destroy was accepted for, in order.
    destroyed: Vec<VmView>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub options: SimOptions,
    pub faults: Mutex<Faults>,
    state: Mutex<State>,
    request_count: Mutex<u64>,
    /// Start of the simulator, for `pstart` (clock ticks since boot in PVE).
    booted: Instant,
}

/// PVE config file path in its error texts.
fn config_missing(node: &str, vmid: u32) -> ApiError {
    ApiError::internal(format!(
        "Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist"
    ))
}

fn lock_timeout(vmid: u32) -> ApiError {
    ApiError::internal(format!(
        "can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"
    ))
}

/// PVE tags: `[a-z0-9_][a-z0-9_\-+.]*` (case-insensitive before 8.1; PVE
/// lowercases them on write since).
fn valid_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+' | '.'))
}

/// `size=32G` in a drive string, in GiB.
fn drive_size_gib(drive: &str) -> Option<u64> {
    drive.split(',').find_map(|part| part.strip_prefix("size=")).and_then(|size| {
        let (number, unit) = size.split_at(size.len().saturating_sub(1));
        match unit {
            "G" => number.parse().ok(),
            "T" => number.parse::<u64>().ok().map(|tib| tib * 1024),
            _ => size.parse::<u64>().ok().map(|bytes| bytes >> 30),
        }
    })
}

fn with_drive_size(drive: &str, gib: u64) -> String {
    let mut parts: Vec<String> =
        drive.split(',').filter(|part| !part.starts_with("size=")).map(str::to_owned).collect();
    parts.push(format!("size={gib}G"));
    parts.join(",")
}

impl Shared {
    pub fn new(options: SimOptions) -> Self {
        let mut state = State { next_pid: 0x1000, ..State::default() };
        for node in &options.nodes {
            for storage in &options.iso_storages {
                state.isos.insert((node.clone(), storage.clone()), BTreeMap::new());
            }
        }
        Self {
            options,
            faults: Mutex::new(Faults::default()),
            state: Mutex::new(state),
            request_count: Mutex::new(0),
            booted: Instant::now(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("simulator state lock")
    }

    pub fn faults(&self) -> Faults {
        self.faults.lock().expect("faults lock").clone()
    }

    /// Counts a request; true when the 5xx fault picks it.
    pub fn record_request(&self, line: String) -> bool {
        self.state().requests.push(line);
        let every = self.faults().server_error_every;
        let mut count = self.request_count.lock().expect("request count lock");
        *count += 1;
        every != 0 && (*count).is_multiple_of(u64::from(every))
    }

    pub fn requests(&self) -> Vec<String> {
        self.state().requests.clone()
    }

    pub fn destroyed(&self) -> Vec<VmView> {
        self.state().destroyed.clone()
    }

    pub fn clones_started(&self) -> usize {
        self.state().clones_started
    }

    pub fn has_node(&self, node: &str) -> bool {
        self.options.nodes.iter().any(|known| known == node)
    }

    /// Whether `node` is switched off by [`Faults::offline_nodes`].
    pub fn is_offline(&self, node: &str) -> bool {
        self.faults().offline_nodes.iter().any(|offline| offline == node)
    }

    /// `online` or `offline`, as `/nodes` and `/cluster/resources` say.
    pub fn node_status(&self, node: &str) -> &'static str {
        if self.is_offline(node) { "offline" } else { "online" }
    }

    /// The user part of the token (`USER@REALM!TOKENID`), for UPIDs.
    fn token_user(&self) -> String {
        self.options.token.split_once('=').map_or("", |(user, _)| user).to_owned()
    }

    #[allow(clippy::too_many_arguments, reason = "a flat test fixture constructor")]
    pub fn add_vm(
        &self,
        node: &str,
        vmid: u32,
        name: &str,
        description: &str,
        tags: &str,
        template: bool,
        disk_gib: u64,
    ) {
        let mut config = BTreeMap::new();
        config.insert("name".to_owned(), name.to_owned());
        config.insert("cores".to_owned(), "1".to_owned());
        config.insert("memory".to_owned(), "2048".to_owned());
        config.insert("scsi0".to_owned(), format!("local-lvm:vm-{vmid}-disk-0,size={disk_gib}G"));
        config.insert("net0".to_owned(), "virtio=BC:24:11:00:00:01,bridge=vmbr0".to_owned());
        if !description.is_empty() {
            config.insert("description".to_owned(), description.to_owned());
        }
        if !tags.is_empty() {
            config.insert("tags".to_owned(), tags.to_owned());
        }
        if template {
            config.insert("template".to_owned(), "1".to_owned());
        }
        self.state().vms.insert(
            vmid,
            Vm { node: node.to_owned(), config, running: false, started_at: None, proxy: None },
        );
    }

    pub fn set_lock(&self, vmid: u32, lock: Option<&str>) {
        if let Some(vm) = self.state().vms.get_mut(&vmid) {
            match lock {
                Some(lock) => vm.config.insert("lock".to_owned(), lock.to_owned()),
                None => vm.config.remove("lock"),
            };
        }
    }

    pub fn hibernate(&self, vmid: u32) {
        if let Some(vm) = self.state().vms.get_mut(&vmid) {
            vm.running = false;
            vm.started_at = None;
            if let Some((_, proxy)) = vm.proxy.take() {
                proxy.abort();
            }
            vm.config.insert("lock".to_owned(), "suspended".to_owned());
            vm.config.insert("vmstate".to_owned(), format!("local-lvm:vm-{vmid}-state-suspend"));
        }
    }

    pub fn remove_vm(&self, vmid: u32) {
        if let Some(vm) = self.state().vms.remove(&vmid)
            && let Some((_, proxy)) = vm.proxy
        {
            proxy.abort();
        }
    }

    pub fn stop_all_proxies(&self) {
        for vm in self.state().vms.values_mut() {
            if let Some((_, proxy)) = vm.proxy.take() {
                proxy.abort();
            }
        }
    }

    pub fn vms(&self) -> Vec<VmView> {
        self.state()
            .vms
            .iter()
            .map(|(vmid, vm)| VmView {
                vmid: *vmid,
                node: vm.node.clone(),
                status: if vm.running { "running" } else { "stopped" }.to_owned(),
                lock: vm.lock().map(str::to_owned),
                config: vm.config.clone(),
                proxy: vm.proxy.as_ref().map(|(addr, _)| *addr),
            })
            .collect()
    }

    pub fn isos(&self, node: &str, storage: &str) -> Vec<String> {
        self.state()
            .isos
            .get(&(node.to_owned(), storage.to_owned()))
            .map(|files| files.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub fn iso(&self, node: &str, storage: &str, name: &str) -> Option<Vec<u8>> {
        self.state().isos.get(&(node.to_owned(), storage.to_owned()))?.get(name).cloned()
    }

    /// Finishes every task whose time has come and applies its effect.
    pub fn advance(&self) {
        let now = Instant::now();
        let mut state = self.state();
        let due: Vec<String> = state
            .tasks
            .values()
            .filter(|task| !task.finished && task.done_at <= now)
            .map(|task| task.upid.clone())
            .collect();
        for upid in due {
            let Some(task) = state.tasks.get_mut(&upid) else { continue };
            task.finished = true;
            let succeeded = task.exit == "OK" || task.exit.starts_with("WARNINGS: ");
            let leave_locked = task.leave_locked;
            let Some(effect) = task.effect.take() else { continue };
            apply(&mut state, effect, succeeded, leave_locked, self.options.proxy_port);
        }
    }

    fn start_task(
        &self,
        state: &mut State,
        node: &str,
        kind: &str,
        id: &str,
        duration: Duration,
        effect: Effect,
    ) -> String {
        let faults = self.faults();
        state.next_pid += 1;
        let pid = state.next_pid;
        let starttime = now_unix();
        let pstart = u32::try_from(self.booted.elapsed().as_millis() / 10).unwrap_or(u32::MAX);
        let user = self.token_user();
        let upid =
            format!("UPID:{node}:{pid:08X}:{pstart:08X}:{starttime:08X}:{kind}:{id}:{user}:");
        let exit = if faults.failing_tasks || faults.clone_leaves_locked_vm && kind == "qmclone" {
            match kind {
                "qmclone" => format!("clone failed: copy failed: storage write error on VM {id}"),
                "qmstart" => format!("start failed: QEMU exited with code 1 (VM {id})"),
                _ => format!("command '{kind} {id}' failed: exit code 1"),
            }
        } else if faults.task_warnings > 0 {
            format!("WARNINGS: {}", faults.task_warnings)
        } else {
            "OK".to_owned()
        };
        state.tasks.insert(
            upid.clone(),
            Task {
                upid: upid.clone(),
                node: node.to_owned(),
                kind: kind.to_owned(),
                id: id.to_owned(),
                user,
                pid,
                pstart,
                starttime,
                done_at: Instant::now() + duration,
                exit,
                leave_locked: faults.clone_leaves_locked_vm,
                effect: Some(effect),
                finished: false,
            },
        );
        upid
    }

    pub fn task_status(&self, node: &str, upid: &str) -> ApiResult {
        self.advance();
        let state = self.state();
        let task = state
            .tasks
            .get(upid)
            .filter(|task| task.node == node)
            .ok_or_else(|| ApiError::internal(format!("no such task '{upid}'")))?;
        let mut status = json!({
            "upid": task.upid,
            "node": task.node,
            "pid": task.pid,
            "pstart": task.pstart,
            "starttime": task.starttime,
            "type": task.kind,
            "id": task.id,
            "user": task.user,
            "status": if task.finished { "stopped" } else { "running" },
        });
        if task.finished {
            status["exitstatus"] = Value::String(task.exit.clone());
        }
        Ok(status)
    }

    pub fn resources(&self, kind: Option<&str>) -> ApiResult {
        self.advance();
        let state = self.state();
        let mut out = Vec::new();
        if kind.is_none() || kind == Some("vm") {
            for (vmid, vm) in &state.vms {
                let mut entry = json!({
                    "id": format!("qemu/{vmid}"),
                    "type": "qemu",
                    "vmid": vmid,
                    "node": vm.node,
                    // The cluster knows an offline node's VMs from its
                    // shared config, but not what they are doing.
                    "status": if self.is_offline(&vm.node) {
                        "unknown"
                    } else if vm.running {
                        "running"
                    } else {
                        "stopped"
                    },
                    "template": u8::from(vm.is_template()),
                    "maxcpu": vm.config.get("cores").and_then(|c| c.parse::<u64>().ok()).unwrap_or(1),
                    "maxmem": vm.config.get("memory").and_then(|m| m.parse::<u64>().ok()).unwrap_or(512) << 20,
                });
                // A VM being cloned has neither a name nor tags yet.
                for key in ["name", "tags", "lock"] {
                    if let Some(value) = vm.config.get(key) {
                        entry[key] = Value::String(value.clone());
                    }
                }
                out.push(entry);
            }
        }
        if kind.is_none() || kind == Some("node") {
            for node in &self.options.nodes {
                out.push(json!({"id": format!("node/{node}"), "type": "node", "node": node, "status": self.node_status(node)}));
            }
        }
        if kind.is_none() || kind == Some("storage") {
            for (node, storage) in state.isos.keys() {
                out.push(json!({
                    "id": format!("storage/{node}/{storage}"),
                    "type": "storage", "node": node, "storage": storage, "status": "available",
                    "content": "iso,vztmpl,backup", "plugintype": "dir",
                }));
            }
        }
        Ok(Value::Array(out))
    }

    pub fn nextid(&self, wanted: Option<&str>) -> ApiResult {
        let state = self.state();
        if let Some(wanted) = wanted {
            let vmid: u32 = wanted
                .parse()
                .map_err(|_| ApiError::parameter("vmid", "type check ('integer') failed"))?;
            if state.vms.contains_key(&vmid) {
                return Err(ApiError::parameter("vmid", format!("VM {vmid} already exists")));
            }
            return Ok(Value::String(vmid.to_string()));
        }
        let free = (100u32..).find(|vmid| !state.vms.contains_key(vmid)).unwrap_or(100);
        // PVE returns the ID as a string.
        Ok(Value::String(free.to_string()))
    }

    fn vm_on<'a>(state: &'a mut State, node: &str, vmid: u32) -> Result<&'a mut Vm, ApiError> {
        match state.vms.get_mut(&vmid) {
            Some(vm) if vm.node == node => Ok(vm),
            _ => Err(config_missing(node, vmid)),
        }
    }

    /// Fails as PVE does for a VM whose config carries a lock.
    fn check_unlocked(vm: &Vm, vmid: u32) -> Result<(), ApiError> {
        match vm.lock() {
            Some(lock) => Err(ApiError::internal(format!("VM {vmid} is locked ({lock})"))),
            None => Ok(()),
        }
    }

    fn check_lock_fault(&self, vmid: u32) -> Result<(), ApiError> {
        if self.faults().lock_timeout { Err(lock_timeout(vmid)) } else { Ok(()) }
    }

    pub fn get_config(&self, node: &str, vmid: u32) -> ApiResult {
        self.advance();
        let mut state = self.state();
        let vm = Self::vm_on(&mut state, node, vmid)?;
        let mut config = Map::new();
        for (key, value) in &vm.config {
            // Numbers come back as numbers, as in PVE's schema.
            let value = match key.as_str() {
                "cores" | "memory" | "template" | "sockets" => {
                    value.parse::<u64>().map_or_else(|_| Value::String(value.clone()), Value::from)
                }
                _ => Value::String(value.clone()),
            };
            config.insert(key.clone(), value);
        }
        config.insert("digest".to_owned(), Value::String(format!("{:040x}", vm.config.len())));
        Ok(Value::Object(config))
    }

    pub fn put_config(
        &self,
        node: &str,
        vmid: u32,
        params: &BTreeMap<String, String>,
    ) -> ApiResult {
        self.check_lock_fault(vmid)?;
        let mut state = self.state();
        let vm = Self::vm_on(&mut state, node, vmid)?;
        Self::check_unlocked(vm, vmid)?;
        for (key, value) in params {
            match key.as_str() {
                "cores" | "memory" if value.parse::<u64>().is_err() => {
                    return Err(ApiError::parameter(key, "type check ('integer') failed"));
                }
                "tags" if value.split([';', ',', ' ']).any(|tag| !valid_tag(tag)) => {
                    let bad =
                        value.split([';', ',', ' ']).find(|tag| !valid_tag(tag)).unwrap_or("");
                    return Err(ApiError::parameter(
                        "tags",
                        format!("invalid format - invalid tag '{bad}'"),
                    ));
                }
                "net0" if !value.contains("bridge=") => {
                    return Err(ApiError::parameter("net0", "invalid format - missing bridge"));
                }
                "ide2" if value != "none" && !value.contains(":iso/") => {
                    return Err(ApiError::parameter("ide2", "invalid format - not an ISO volume"));
                }
                _ => {}
            }
        }
        if let Some(ide2) = params.get("ide2")
            && let Some((storage, file)) = ide2.split(',').next().unwrap_or("").split_once(":iso/")
            && !state
                .isos
                .get(&(node.to_owned(), storage.to_owned()))
                .is_some_and(|files| files.contains_key(file))
        {
            return Err(ApiError::internal(format!(
                "volume '{storage}:iso/{file}' does not exist"
            )));
        }
        let vm = Self::vm_on(&mut state, node, vmid)?;
        for (key, value) in params {
            match key.as_str() {
                "delete" => {
                    for key in value.split([',', ';']) {
                        vm.config.remove(key);
                    }
                }
                "digest" | "skiplock" => {}
                "tags" => {
                    vm.config.insert(key.clone(), value.to_ascii_lowercase());
                }
                _ => {
                    vm.config.insert(key.clone(), value.clone());
                }
            }
        }
        Ok(Value::Null)
    }

    pub fn resize(&self, node: &str, vmid: u32, params: &BTreeMap<String, String>) -> ApiResult {
        self.check_lock_fault(vmid)?;
        let mut state = self.state();
        let vm = Self::vm_on(&mut state, node, vmid)?;
        Self::check_unlocked(vm, vmid)?;
        let disk = params.get("disk").ok_or_else(|| {
            ApiError::parameter("disk", "property is missing and it is not optional")
        })?;
        let size = params.get("size").ok_or_else(|| {
            ApiError::parameter("size", "property is missing and it is not optional")
        })?;
        let drive = vm
            .config
            .get(disk)
            .ok_or_else(|| ApiError::internal(format!("disk '{disk}' does not exist")))?;
        let current = drive_size_gib(drive).unwrap_or(0);
        let (grow, number) = match size.strip_prefix('+') {
            Some(rest) => (true, rest),
            None => (false, size.as_str()),
        };
        let gib: u64 = number
            .strip_suffix('G')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| ApiError::parameter("size", "value does not match the regex pattern"))?;
        let target = if grow { current + gib } else { gib };
        if target < current {
            return Err(ApiError::internal("shrinking disks is not supported"));
        }
        let effect = Effect::Resize { vmid, disk: disk.clone(), gib: target };
        let upid = self.start_task(
            &mut state,
            node,
            "resize",
            &vmid.to_string(),
            self.options.task_duration,
            effect,
        );
        Ok(Value::String(upid))
    }

    pub fn clone_vm(&self, node: &str, vmid: u32, params: &BTreeMap<String, String>) -> ApiResult {
        self.check_lock_fault(vmid)?;
        let mut state = self.state();
        let source = Self::vm_on(&mut state, node, vmid)?;
        // Cloning a template takes no lock on it; cloning a VM that is
        // locked fails.
        if !source.is_template() {
            Self::check_unlocked(source, vmid)?;
        }
        let source_config = source.config.clone();
        let newid: u32 = params
            .get("newid")
            .ok_or_else(|| {
                ApiError::parameter("newid", "property is missing and it is not optional")
            })?
            .parse()
            .map_err(|_| ApiError::parameter("newid", "type check ('integer') failed"))?;
        if !(100..=999_999_999).contains(&newid) {
            return Err(ApiError::parameter("newid", "value must have a minimum value of 100"));
        }
        if let Some(existing) = state.vms.get(&newid) {
            return Err(ApiError::internal(format!(
                "VM {newid} already exists on node '{}'",
                existing.node
            )));
        }
        let target = params.get("target").cloned().unwrap_or_else(|| node.to_owned());
        if !self.has_node(&target) {
            return Err(ApiError::parameter("target", format!("no such cluster node '{target}'")));
        }
        if let Some(name) = params.get("name")
            && (name.is_empty()
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.')))
        {
            return Err(ApiError::parameter(
                "name",
                "invalid format - value does not look like a valid DNS name",
            ));
        }
        // What the finished clone will hold; until then the config is PVE's
        // temporary one: a comment (read back as the description) and the lock.
        let mut config: BTreeMap<String, String> = source_config
            .into_iter()
            .filter(|(key, _)| {
                !matches!(key.as_str(), "template" | "name" | "description" | "tags" | "lock")
            })
            .collect();
        if let Some(drive) = config.get("scsi0").cloned() {
            let gib = drive_size_gib(&drive).unwrap_or(8);
            let storage = params.get("storage").map_or("local-lvm", String::as_str);
            config.insert("scsi0".to_owned(), format!("{storage}:vm-{newid}-disk-0,size={gib}G"));
        }
        let source_name =
            state.vms.get(&vmid).and_then(|vm| vm.config.get("name")).cloned().unwrap_or_default();
        config.insert(
            "name".to_owned(),
            params.get("name").cloned().unwrap_or_else(|| format!("Copy-of-VM-{source_name}")),
        );
        if let Some(description) = params.get("description") {
            config.insert("description".to_owned(), description.clone());
        }
        let mut temporary = BTreeMap::new();
        temporary.insert("description".to_owned(), "qmclone temporary file".to_owned());
        temporary.insert("lock".to_owned(), "clone".to_owned());
        state.vms.insert(
            newid,
            Vm { node: target, config: temporary, running: false, started_at: None, proxy: None },
        );
        state.clones_started += 1;
        let upid = self.start_task(
            &mut state,
            node,
            "qmclone",
            &vmid.to_string(),
            self.options.clone_duration,
            Effect::Clone { newid, config },
        );
        Ok(Value::String(upid))
    }

    pub fn current_status(&self, node: &str, vmid: u32) -> ApiResult {
        self.advance();
        let mut state = self.state();
        let vm = Self::vm_on(&mut state, node, vmid)?;
        let mut status = json!({
            "vmid": vmid,
            "status": if vm.running { "running" } else { "stopped" },
            "qmpstatus": if vm.running { "running" } else { "stopped" },
            "uptime": vm.started_at.map_or(0, |started| started.elapsed().as_secs()),
            "cpus": vm.config.get("cores").and_then(|c| c.parse::<u64>().ok()).unwrap_or(1),
        });
        if vm
            .config
            .get("agent")
            .is_some_and(|agent| agent.starts_with('1') || agent.contains("enabled=1"))
        {
            status["agent"] = Value::from(1);
        }
        for key in ["name", "lock", "tags"] {
            if let Some(value) = vm.config.get(key) {
                status[key] = Value::String(value.clone());
            }
        }
        Ok(status)
    }

    pub fn start(&self, node: &str, vmid: u32) -> ApiResult {
        self.check_lock_fault(vmid)?;
        let mut state = self.state();
        let vm = Self::vm_on(&mut state, node, vmid)?;
        // Starting a hibernated VM resumes it: its lock is no obstacle.
        if vm.lock() != Some("suspended") {
            Self::check_unlocked(vm, vmid)?;
        }
        if vm.is_template() {
            return Err(ApiError::internal(format!("VM {vmid} is a template")));
        }
        if vm.running {
            return Err(ApiError::internal(format!("VM {vmid} already running")));
        }
        let upid = self.start_task(
            &mut state,
            node,
            "qmstart",
            &vmid.to_string(),
            self.options.task_duration,
            Effect::Start { vmid },
        );
        Ok(Value::String(upid))
    }

    pub fn stop(&self, node: &str, vmid: u32) -> ApiResult {
        self.check_lock_fault(vmid)?;
        let mut state = self.state();
        let vm = Self::vm_on(&mut state, node, vmid)?;
        Self::check_unlocked(vm, vmid)?;
        let upid = self.start_task(
            &mut state,
            node,
            "qmstop",
            &vmid.to_string(),
            self.options.task_duration,
            Effect::Stop { vmid },
        );
        Ok(Value::String(upid))
    }

    pub fn destroy(&self, node: &str, vmid: u32) -> ApiResult {
        self.check_lock_fault(vmid)?;
        let mut state = self.state();
        let vm = Self::vm_on(&mut state, node, vmid)?;
        Self::check_unlocked(vm, vmid)?;
        if vm.running {
            return Err(ApiError::internal(format!("VM {vmid} is running - destroy failed")));
        }
        let view = VmView {
            vmid,
            node: vm.node.clone(),
            status: "stopped".to_owned(),
            lock: vm.config.get("lock").cloned(),
            config: vm.config.clone(),
            proxy: None,
        };
        state.destroyed.push(view);
        let upid = self.start_task(
            &mut state,
            node,
            "qmdestroy",
            &vmid.to_string(),
            self.options.task_duration,
            Effect::Destroy { vmid },
        );
        Ok(Value::String(upid))
    }

    pub fn agent_interfaces(&self, node: &str, vmid: u32) -> ApiResult {
        self.advance();
        let mut state = self.state();
        let vm = Self::vm_on(&mut state, node, vmid)?;
        if !vm.running {
            return Err(ApiError::internal(format!("VM {vmid} is not running")));
        }
        if !vm
            .config
            .get("agent")
            .is_some_and(|agent| agent.starts_with('1') || agent.contains("enabled=1"))
        {
            return Err(ApiError::internal("No QEMU guest agent configured"));
        }
        if vm.started_at.is_none_or(|started| started.elapsed() < self.options.agent_delay) {
            return Err(ApiError::internal("QEMU guest agent is not running"));
        }
        Ok(json!({"result": [
            {"name": "lo", "hardware-address": "00:00:00:00:00:00", "ip-addresses": [
                {"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
                {"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128}]},
            {"name": "eth0", "hardware-address": "bc:24:11:00:00:01", "ip-addresses": [
                {"ip-address": vm_address(vmid).to_string(), "ip-address-type": "ipv4", "prefix": 8},
                {"ip-address": "fe80::be24:11ff:fe00:1", "ip-address-type": "ipv6", "prefix": 64}]},
        ]}))
    }

    fn check_storage(&self, state: &State, node: &str, storage: &str) -> Result<(), ApiError> {
        if state.isos.contains_key(&(node.to_owned(), storage.to_owned())) {
            Ok(())
        } else {
            Err(ApiError::parameter("storage", format!("storage '{storage}' does not exist")))
        }
    }

    pub fn storage_status(&self, node: &str, storage: &str) -> ApiResult {
        let state = self.state();
        self.check_storage(&state, node, storage)?;
        Ok(
            json!({"storage": storage, "type": "dir", "content": "iso,vztmpl,backup", "active": 1, "enabled": 1,
                  "total": 100u64 << 30, "used": 1u64 << 30, "avail": 99u64 << 30}),
        )
    }

    pub fn storage_content(&self, node: &str, storage: &str, content: Option<&str>) -> ApiResult {
        let state = self.state();
        self.check_storage(&state, node, storage)?;
        if content.is_some_and(|content| content != "iso") {
            return Ok(Value::Array(Vec::new()));
        }
        let files = &state.isos[&(node.to_owned(), storage.to_owned())];
        Ok(Value::Array(
            files
                .iter()
                .map(|(name, data)| json!({"volid": format!("{storage}:iso/{name}"), "format": "iso", "content": "iso", "size": data.len(), "ctime": now_unix()}))
                .collect(),
        ))
    }

    pub fn upload(
        &self,
        node: &str,
        storage: &str,
        content: &str,
        filename: &str,
        data: Vec<u8>,
    ) -> ApiResult {
        let mut state = self.state();
        self.check_storage(&state, node, storage)?;
        if content != "iso" {
            return Err(ApiError::parameter(
                "content",
                format!("content type '{content}' is not allowed"),
            ));
        }
        if !(filename.ends_with(".iso") || filename.ends_with(".img")) {
            return Err(ApiError::internal(format!("wrong file extension in '{filename}'")));
        }
        if filename.contains('/') {
            return Err(ApiError::parameter("filename", "invalid file name"));
        }
        // The temporary upload is renamed over any file of the same name.
        if let Some(files) = state.isos.get_mut(&(node.to_owned(), storage.to_owned())) {
            files.insert(filename.to_owned(), data);
        }
        let upid = self.start_task(
            &mut state,
            node,
            "imgcopy",
            "",
            self.options.task_duration,
            Effect::Nothing,
        );
        Ok(Value::String(upid))
    }

    pub fn delete_volume(&self, node: &str, storage: &str, volume: &str) -> ApiResult {
        let mut state = self.state();
        self.check_storage(&state, node, storage)?;
        if self.faults().failing_volume_deletes {
            return Err(ApiError::internal(format!(
                "unable to delete '{volume}': unlink failed - Input/output error"
            )));
        }
        let file = volume.strip_prefix(&format!("{storage}:")).unwrap_or(volume);
        let Some(name) = file.strip_prefix("iso/") else {
            return Err(ApiError::internal(format!("unable to parse volume ID '{volume}'")));
        };
        let files =
            state.isos.get_mut(&(node.to_owned(), storage.to_owned())).expect("checked above");
        if files.remove(name).is_none() {
            return Err(ApiError::internal(format!(
                "volume '{storage}:iso/{name}' does not exist"
            )));
        }
        let upid = self.start_task(
            &mut state,
            node,
            "imgdel",
            &format!("{storage}:iso/{name}"),
            self.options.task_duration,
            Effect::Nothing,
        );
        Ok(Value::String(upid))
    }
}

fn apply(state: &mut State, effect: Effect, succeeded: bool, leave_locked: bool, proxy_port: u16) {
    match effect {
        Effect::Clone { newid, config } => {
            if succeeded {
                if let Some(vm) = state.vms.get_mut(&newid) {
                    vm.config = config;
                }
            } else if !leave_locked {
                // PVE removes what a failed clone created.
                state.vms.remove(&newid);
            }
        }
        Effect::Start { vmid } if succeeded => {
            if let Some(vm) = state.vms.get_mut(&vmid) {
                let addr = SocketAddr::new(vm_address(vmid).into(), proxy_port);
                vm.running = true;
                vm.started_at = Some(Instant::now());
                if vm.lock() == Some("suspended") {
                    vm.config.remove("lock");
                    vm.config.remove("vmstate");
                }
                // A port that cannot be bound leaves the VM running without a
                // proxy, which health checks then report.
                vm.proxy =
                    proxyfleet_sim_support::proxy::spawn(addr).ok().map(|handle| (addr, handle));
            }
        }
        Effect::Stop { vmid } if succeeded => {
            if let Some(vm) = state.vms.get_mut(&vmid) {
                vm.running = false;
                vm.started_at = None;
                if let Some((_, proxy)) = vm.proxy.take() {
                    proxy.abort();
                }
            }
        }
        Effect::Destroy { vmid } if succeeded => {
            state.vms.remove(&vmid);
        }
        Effect::Resize { vmid, disk, gib } if succeeded => {
            if let Some(drive) = state.vms.get_mut(&vmid).and_then(|vm| vm.config.get_mut(&disk)) {
                *drive = with_drive_size(drive, gib);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_follow_the_pve_tag_format() {
        for good in ["proxyfleet", "a_b", "9-x", "_x", "v1.2+b"] {
            assert!(valid_tag(good), "{good}");
        }
        for bad in ["", "-x", "a b", "a/b", "ä", "+x"] {
            assert!(!valid_tag(bad), "{bad}");
        }
    }

    #[test]
    fn drive_sizes_are_read_and_replaced() {
        let drive = "local-lvm:vm-100-disk-0,iothread=1,size=32G";
        assert_eq!(drive_size_gib(drive), Some(32));
        assert_eq!(drive_size_gib("local:vm-1-disk-0,size=2T"), Some(2048));
        assert_eq!(with_drive_size(drive, 40), "local-lvm:vm-100-disk-0,iothread=1,size=40G");
    }
}
