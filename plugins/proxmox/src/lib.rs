//! The `proxmox` provider: each proxy is a full clone of a template VM on a
//! Proxmox VE 8 or 9 cluster, driven through the REST API only. The host
//! injects the API token (`Authorization: PVEAPIToken=…`) and trusts the
//! cluster's CA; the entry config never holds the token.
//!
//! - The VMID comes from the Proxy UID ([`proxyfleet_sdk::derive_number`]
//!   over `vmidRange`). Before cloning, the plugin claims the VMID in the
//!   entry's key-value store, so concurrent creates never pick the same
//!   one and a VM still being cloned (no name, no mark yet: PVE writes a
//!   temporary config holding only `lock: clone`) can be recognised as ours.
//! - A create first looks for our VM anywhere in the cluster: by its name
//!   and our ownership mark for this UID once cloned, by our claim while
//!   the clone runs. So a retry adopts, also after `vmidRange` was edited.
//!   Only then are the template (its boot disk too) and the ISO storage
//!   checked and a free VMID claimed: adopting needs no template, and a bad
//!   template never leaves a half-made clone.
//! - A hibernated VM of ours (`lock: suspended`) is a permanent error for
//!   create: it was hibernated on purpose, and nothing a retry does would
//!   change it. Delete resumes it first, since PVE destroys no locked VM.
//! - An offline node fails only what needs it: `list` tells our VMs there
//!   (and on a node that does not answer) by the claims on their VMIDs,
//!   which hold the mark, and a delete whose VM is gone skips offline nodes
//!   when looking for the seed.
//! - After the clone: the NoCloud seed ISO is uploaded, cores, memory,
//!   agent, `ide2`, `net0` and the `proxyfleet` tag are set, the boot disk
//!   grows to `diskGiB` (never shrinks), and the VM starts.
//!
//! See `docs/providers/proxmox.md` for the config and the PVE role.

mod claim;
mod config;
mod fanout;
mod pve;
mod vm;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proxyfleet_sdk::http::{Method, encode_component};
use proxyfleet_sdk::{
    CallContext, Capabilities, Health, HealthReason, Instance, InstanceState, OwnershipMark,
    PluginInfo, Provider, ProviderError, ProxySpec, Result, export_provider, iso, log,
};
use serde_json::Value;

use crate::config::{Config, config_schema};
use crate::pve::{Client, Fault};
use crate::vm::{TAG, VmEntry};

/// How many candidate VMIDs a create looks at before giving up.
const PROBES: u32 = 64;
/// How often a create starts over when its VMID was taken or its clone
/// vanished under it.
const ROUNDS: u32 = 3;

/// The provider exported by this plugin.
struct Proxmox;

fn client(ctx: &CallContext, config: &Config) -> Client {
    Client::new(&config.url, Duration::from_millis(config.task_poll_ms), ctx.deadline())
}

fn list_vms(client: &Client) -> Result<BTreeMap<u32, VmEntry>> {
    Ok(vms_from(&client.get("/cluster/resources", &[("type", "vm".to_owned())])?))
}

fn vms_from(resources: &Value) -> BTreeMap<u32, VmEntry> {
    resources
        .as_array()
        .map(|entries| {
            entries.iter().filter_map(VmEntry::from_resource).map(|vm| (vm.vmid, vm)).collect()
        })
        .unwrap_or_default()
}

fn vm_path(node: &str, vmid: u32) -> String {
    format!("/nodes/{}/qemu/{vmid}", encode_component(node))
}

fn vm_config(client: &Client, node: &str, vmid: u32) -> Result<Value> {
    Ok(client.get(&format!("{}/config", vm_path(node, vmid)), &[])?)
}

/// Whether `vm` is our VM for `uid`: it carries our name and, in its
/// config, our mark for that UID. The name is in the cluster listing, so a
/// VM with another name (on an unreachable node too) is settled without
/// reading its config.
fn is_ours(client: &Client, vm: &VmEntry, uid: &str, name: &str) -> Result<bool> {
    if vm.template || vm.name.as_deref() != Some(name) {
        return Ok(false);
    }
    if vm.status == "unknown" {
        return Err(ProviderError::Transient(format!(
            "VM {} with this Proxy's name is on node {}, which is offline; the create carries \
             on once the node is back",
            vm.vmid, vm.node
        )));
    }
    let config = vm_config(client, &vm.node, vm.vmid)?;
    Ok(vm::mark_of(&config).is_some_and(|mark| mark.uid == uid))
}

/// Our VM for a UID, as a create finds it.
struct Found {
    vmid: u32,
    /// Still being cloned: no name and no mark yet.
    cloning: bool,
}

/// Our VM for `uid` wherever it is in the cluster: by its name once cloned,
/// by our claim on its VMID while the clone runs (it has no name yet).
/// Looking beyond the UID's candidates in the current `vmidRange` keeps a
/// VM made before the range was edited from being cloned a second time.
fn find_ours(
    client: &Client,
    uid: &str,
    name: &str,
    vms: &BTreeMap<u32, VmEntry>,
) -> Result<Option<Found>> {
    for vm in vms.values() {
        if vm.lock.as_deref().is_some_and(vm::is_creation_lock) {
            // Clones in flight are few; only they need a look at the claims.
            if !vm.template && claim::get(vm.vmid)?.is_some_and(|claim| claim.uid == uid) {
                return Ok(Some(Found { vmid: vm.vmid, cloning: true }));
            }
        } else if is_ours(client, vm, uid, name)? {
            return Ok(Some(Found { vmid: vm.vmid, cloning: false }));
        }
    }
    Ok(None)
}

/// The first of the UID's candidate VMIDs that holds no VM and that we
/// could claim, with the mark its clone is to carry.
fn claim_free(
    config: &Config,
    mark: &OwnershipMark,
    vms: &BTreeMap<u32, VmEntry>,
) -> Result<(u32, OwnershipMark)> {
    let range = config.vmid_range.first..=config.vmid_range.last;
    for attempt in 0..PROBES {
        let Some(vmid) = proxyfleet_sdk::derive_number(&mark.uid, range.clone(), attempt) else {
            break;
        };
        if vms.contains_key(&vmid) {
            log::debug!("VMID taken by another VM, trying the next", vmid = vmid);
        } else if let Some(mark) = claim::take(vmid, mark)? {
            return Ok((vmid, mark));
        } else {
            log::debug!("VMID claimed by another proxy, trying the next", vmid = vmid);
        }
    }
    Err(ProviderError::QuotaExceeded(format!(
        "no free VMID among the first {PROBES} candidates in vmidRange {}..={}; widen config key `vmidRange`",
        config.vmid_range.first, config.vmid_range.last
    )))
}

/// The template for a new clone, checked before any clone exists: it must
/// be a template on the cluster, and its boot disk must have a size for
/// `diskGiB` to grow. Returns its node.
fn template_for_clone(
    client: &Client,
    config: &Config,
    image: &str,
    template: u32,
    vms: &BTreeMap<u32, VmEntry>,
) -> Result<String> {
    let node = match vms.get(&template) {
        Some(vm) if vm.template => vm.node.clone(),
        _ => {
            return Err(ProviderError::InvalidConfig(format!(
                "config key `templates.{image}`: VM {template} is not a template on the cluster"
            )));
        }
    };
    let template_config = vm_config(client, &node, template)?;
    let boot_disk = template_config.get(&config.boot_disk).and_then(Value::as_str);
    if boot_disk.and_then(vm::disk_size_gib).is_none() {
        return Err(ProviderError::InvalidConfig(format!(
            "config key `bootDisk`: template VM {template} (`templates.{image}`) has no disk `{}` \
             with a size; set `bootDisk` to the template's boot disk (e.g. scsi0, virtio0)",
            config.boot_disk
        )));
    }
    Ok(node)
}

/// Waits until `vmid` loses its lock; `None` when it vanished (a failed
/// clone that PVE cleaned up).
fn wait_unlocked(client: &Client, vmid: u32) -> Result<Option<VmEntry>> {
    loop {
        let vms = list_vms(client)?;
        match vms.get(&vmid) {
            None => return Ok(None),
            Some(vm) if vm.lock.is_none() => return Ok(Some(vm.clone())),
            Some(vm) => {
                if !client.has_time() {
                    return Err(ProviderError::Conflict(format!(
                        "VM {vmid} on {} is still locked ({}); if no task is working on it, \
                         an earlier clone failed: unlock it (`qm unlock {vmid}`) and destroy it",
                        vm.node,
                        vm.lock.as_deref().unwrap_or("")
                    )));
                }
            }
        }
        client.pause();
    }
}

fn pick_node(config: &Config, spec: &ProxySpec) -> Result<String> {
    if let Some((_, node)) = spec.placement.iter().find(|(key, _)| key == "node") {
        return if config.nodes.contains(node) {
            Ok(node.clone())
        } else {
            Err(ProviderError::InvalidSpec(format!(
                "placement.node: `{node}` is not one of the entry's config key `nodes`"
            )))
        };
    }
    let count = u32::try_from(config.nodes.len()).unwrap_or(u32::MAX);
    let index =
        proxyfleet_sdk::derive_number(&spec.uid, 0..=count.saturating_sub(1), 0).unwrap_or(0);
    Ok(config.nodes[usize::try_from(index).unwrap_or(0)].clone())
}

fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
    let config = Config::parse(&ctx.config_json())?;
    let template = config.template_for(&spec.image)?;
    if spec.cores == 0 {
        return Err(ProviderError::InvalidSpec("cores: at least 1".to_owned()));
    }
    if spec.memory_mib < 16 {
        return Err(ProviderError::InvalidSpec("memoryMiB: at least 16".to_owned()));
    }
    let net0 = vm::net0(&config.bridge, spec.network.vlan_tag)?;
    let node = pick_node(&config, spec)?;
    let client = client(ctx, &config);
    let name = vm::vm_name(&spec.uid);

    for _ in 0..ROUNDS {
        let vms = list_vms(&client)?;
        let vmid = match find_ours(&client, &spec.uid, &name, &vms)? {
            Some(Found { vmid, cloning }) => {
                // Adopting needs nothing of the template: it may be gone.
                log::info!("adopting our VM", vmid = vmid, cloning = cloning);
                if cloning && wait_unlocked(&client, vmid)?.is_none() {
                    continue;
                }
                vmid
            }
            None => {
                // What a clone needs is checked before a VMID is claimed or
                // a clone exists: a bad template or a missing ISO storage
                // would otherwise leave a VM that cannot be finished.
                let template_node =
                    template_for_clone(&client, &config, &spec.image, template, &vms)?;
                let storage_path = format!(
                    "/nodes/{}/storage/{}/status",
                    encode_component(&node),
                    encode_component(&config.iso_storage)
                );
                client.get(&storage_path, &[])?;
                let mark = OwnershipMark::for_spec(spec, proxyfleet_sdk::now_unix());
                let (vmid, mark) = claim_free(&config, &mark, &vms)?;
                let mut params = vec![
                    ("newid", vmid.to_string()),
                    ("name", name.clone()),
                    ("description", mark.to_text()),
                    ("full", "1".to_owned()),
                ];
                if node != template_node {
                    params.push(("target", node.clone()));
                }
                if let Some(storage) = &config.target_storage {
                    params.push(("storage", storage.clone()));
                }
                if let Some(pool) = &config.pool {
                    params.push(("pool", pool.clone()));
                }
                log::info!("cloning template", template = template, vmid = vmid, node = node);
                let path = format!("{}/clone", vm_path(&template_node, template));
                match client.run_task(Method::Post, &template_node, &path, &params) {
                    Ok(()) => vmid,
                    Err(error) if pve::recognise(error.message()) == Some(Fault::VmidTaken) => {
                        // Someone outside this entry took it since we looked.
                        claim::release(vmid)?;
                        continue;
                    }
                    Err(error) => return Err(error),
                }
            }
        };
        return finish(&client, &config, spec, vmid, &net0);
    }
    Err(ProviderError::Transient(format!("the VMIDs for {} kept changing hands; retry", spec.uid)))
}

/// Brings our cloned VM `vmid` to running; every step is safe to repeat.
fn finish(
    client: &Client,
    config: &Config,
    spec: &ProxySpec,
    vmid: u32,
    net0: &str,
) -> Result<Instance> {
    let vms = list_vms(client)?;
    let vm = vms.get(&vmid).ok_or_else(|| {
        ProviderError::Transient(format!("VM {vmid} vanished while it was being set up"))
    })?;
    let node = vm.node.clone();
    if let Some(lock) = vm.lock.as_deref()
        && vm::is_hibernation_lock(lock)
    {
        return Err(ProviderError::Permanent(format!(
            "VM {vmid} on {node} is hibernated (lock `{lock}`) and is left as it is: start it \
             in PVE to resume it (`qm start {vmid}`), or delete the Proxy (its VM is then \
             resumed, stopped and destroyed)"
        )));
    }
    let path = vm_path(&node, vmid);
    let current = client.get(&format!("{path}/status/current"), &[])?;
    if current.get("status").and_then(Value::as_str) != Some("running") {
        let name = vm::vm_name(&spec.uid);
        let user_data =
            proxyfleet_sdk::cloud_init::user_data(&spec.user_data, spec.proxy_auth.as_ref())?;
        let seed = iso::nocloud_seed(
            &user_data,
            vm::meta_data(&name).as_bytes(),
            Some(vm::NETWORK_CONFIG.as_bytes()),
        )?;
        let seed_name = vm::seed_name(vmid);
        client.upload_iso(&node, &config.iso_storage, &seed_name, &seed)?;
        let vm_config = vm_config(client, &node, vmid)?;
        let params = vec![
            ("cores", spec.cores.to_string()),
            ("memory", spec.memory_mib.to_string()),
            ("agent", "1".to_owned()),
            ("ide2", format!("{}:iso/{seed_name},media=cdrom", config.iso_storage)),
            ("net0", net0.to_owned()),
            ("tags", TAG.to_owned()),
        ];
        client.call(Method::Put, &format!("{path}/config"), &params)?;
        let current_gib =
            vm_config.get(&config.boot_disk).and_then(Value::as_str).and_then(vm::disk_size_gib);
        match current_gib {
            Some(current) if spec.disk_gib > current => {
                let params =
                    [("disk", config.boot_disk.clone()), ("size", format!("{}G", spec.disk_gib))];
                client.run_task(Method::Put, &node, &format!("{path}/resize"), &params)?;
            }
            Some(_) => {}
            None => {
                return Err(ProviderError::InvalidConfig(format!(
                    "config key `bootDisk`: VM {vmid} has no disk `{}` with a size",
                    config.boot_disk
                )));
            }
        }
        match client.run_task(Method::Post, &node, &format!("{path}/status/start"), &[]) {
            Err(error) if pve::recognise(error.message()) == Some(Fault::AlreadyRunning) => {}
            other => other?,
        }
        log::info!("started", vmid = vmid, node = node);
    }
    loop {
        let current = client.get(&format!("{path}/status/current"), &[])?;
        if current.get("status").and_then(Value::as_str) == Some("running") {
            break;
        }
        if !client.has_time() {
            return Err(ProviderError::Transient(format!(
                "VM {vmid} did not reach running in time"
            )));
        }
        client.pause();
    }
    get_instance(client, vmid)
}

fn provisioning(vmid: u32) -> Instance {
    Instance {
        provider_id: vmid.to_string(),
        name: String::new(),
        state: InstanceState::Provisioning,
        addresses: Vec::new(),
        port: None,
        created_at: None,
        mark: None,
    }
}

fn get_instance(client: &Client, vmid: u32) -> Result<Instance> {
    let vms = list_vms(client)?;
    let vm = vms
        .get(&vmid)
        .ok_or_else(|| ProviderError::NotFound(format!("VM {vmid} does not exist")))?;
    // Lock and unknown status before the name: a VM being cloned has no
    // name yet, and a node that is down reports nothing reliable.
    if let Some(lock) = &vm.lock
        && vm::is_creation_lock(lock)
    {
        return Ok(provisioning(vmid));
    }
    if vm.status == "unknown" {
        return Err(ProviderError::Transient(format!(
            "VM {vmid}: node {} reports status unknown (node offline?)",
            vm.node
        )));
    }
    let path = vm_path(&vm.node, vmid);
    let config = vm_config(client, &vm.node, vmid)?;
    let Some(mark) = vm::mark_of(&config) else {
        return Err(ProviderError::NotFound(format!(
            "VM {vmid} no longer carries our mark: the VMID now holds someone else's VM"
        )));
    };
    let current = client.get(&format!("{path}/status/current"), &[])?;
    let mut state = vm::state_of(&current);
    let mut addresses = Vec::new();
    if state == InstanceState::Running {
        match client.get(&format!("{path}/agent/network-get-interfaces"), &[]) {
            Ok(agent) => addresses = vm::addresses_of(&agent),
            Err(failure) if pve::agent_not_ready(failure.error()) => {}
            Err(failure) => return Err(failure.into()),
        }
        if addresses.is_empty() {
            state = InstanceState::Provisioning;
        }
    }
    Ok(Instance {
        provider_id: vmid.to_string(),
        name: config.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
        state,
        addresses,
        port: None,
        created_at: Some(mark.created_at),
        mark: Some(mark),
    })
}

/// Deletes the seed ISO of `vmid` on `node` when it is there.
fn delete_seed(client: &Client, config: &Config, node: &str, vmid: u32) -> Result<()> {
    let storage = &config.iso_storage;
    let content_path =
        format!("/nodes/{}/storage/{}/content", encode_component(node), encode_component(storage));
    let volid = format!("{storage}:iso/{}", vm::seed_name(vmid));
    let listing = client.get(&content_path, &[("content", "iso".to_owned())])?;
    let present = listing.as_array().is_some_and(|files| {
        files.iter().any(|file| file.get("volid").and_then(Value::as_str) == Some(&volid))
    });
    if !present {
        return Ok(());
    }
    match client.run_task(
        Method::Delete,
        node,
        &format!("{content_path}/{}", encode_component(&volid)),
        &[],
    ) {
        Err(ProviderError::NotFound(_)) => Ok(()),
        other => other,
    }
}

/// Nodes the cluster reports as not online (`/cluster/resources`): their
/// API cannot be reached through the node we ask.
fn offline_nodes(client: &Client) -> Result<BTreeSet<String>> {
    let nodes = client.get("/cluster/resources", &[("type", "node".to_owned())])?;
    Ok(nodes
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .filter(|entry| entry.get("status").and_then(Value::as_str) != Some("online"))
                .filter_map(|entry| entry.get("node").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default())
}

/// Deletes the seed of a VM that is gone, on every node it may be on. An
/// offline node is skipped (with a warning naming the file): failing here
/// would keep a deleted Proxy waiting for a node that may never return,
/// for a file of a few KiB.
fn delete_seed_everywhere(client: &Client, config: &Config, vmid: u32) -> Result<()> {
    let offline = offline_nodes(client)?;
    for node in &config.nodes {
        if offline.contains(node) {
            log::warn!(
                "node offline: its seed ISO for the VM, if any, is left; remove it once the node is back",
                node = node,
                volume = format!("{}:iso/{}", config.iso_storage, vm::seed_name(vmid))
            );
            continue;
        }
        delete_seed(client, config, node, vmid)?;
    }
    Ok(())
}

fn delete(ctx: &CallContext, provider_id: &str) -> Result<()> {
    let config = Config::parse(&ctx.config_json())?;
    let Some(vmid) = vm::parse_vmid(provider_id) else {
        // Not an ID this plugin hands out: nothing of ours to delete.
        return Ok(());
    };
    let client = client(ctx, &config);
    let vms = list_vms(&client)?;
    let Some(vm) = vms.get(&vmid) else {
        delete_seed_everywhere(&client, &config, vmid)?;
        return claim::release(vmid);
    };
    if let Some(lock) = &vm.lock
        && vm::is_creation_lock(lock)
    {
        if claim::get(vmid)?.is_some() {
            return Err(ProviderError::Conflict(format!(
                "VM {vmid} is still being cloned; it is deleted once the clone task ends"
            )));
        }
        // Someone else's VM being made at a VMID that was ours.
        delete_seed_everywhere(&client, &config, vmid)?;
        return Ok(());
    }
    if vm.status == "unknown" {
        return Err(ProviderError::Transient(format!(
            "VM {vmid} is on node {}, which is offline; it is deleted once the node is back",
            vm.node
        )));
    }
    let path = vm_path(&vm.node, vmid);
    let vm_config = vm_config(&client, &vm.node, vmid)?;
    if vm::mark_of(&vm_config).is_none() {
        log::info!("VMID holds a VM that is not ours; leaving it alone", vmid = vmid);
        delete_seed_everywhere(&client, &config, vmid)?;
        return Ok(());
    }
    // PVE destroys no hibernated VM (its lock) without `skiplock`, which
    // only root@pam may pass: starting it resumes it, and then it is
    // stopped and destroyed as any other.
    let hibernated = vm.lock.as_deref().is_some_and(vm::is_hibernation_lock);
    if hibernated {
        log::info!("resuming our hibernated VM to destroy it", vmid = vmid);
        match client.run_task(Method::Post, &vm.node, &format!("{path}/status/start"), &[]) {
            Err(error) if pve::recognise(error.message()) == Some(Fault::AlreadyRunning) => {}
            other => other?,
        }
    }
    if hibernated || vm.status == "running" {
        client.run_task(Method::Post, &vm.node, &format!("{path}/status/stop"), &[])?;
    }
    // The seed goes before the VM: if deleting it fails, the VM stays and
    // the next delete finds both again instead of losing track of the ISO.
    delete_seed(&client, &config, &vm.node, vmid)?;
    let params = [("purge", "1".to_owned()), ("destroy-unreferenced-disks", "1".to_owned())];
    match client.run_task(Method::Delete, &vm.node, &path, &params) {
        Err(ProviderError::NotFound(_)) => {}
        other => other?,
    }
    log::info!("destroyed", vmid = vmid, node = vm.node);
    claim::release(vmid)
}

fn listed(vm: &VmEntry, mark: OwnershipMark, state: InstanceState) -> Instance {
    Instance {
        provider_id: vm.vmid.to_string(),
        name: vm.name.clone().unwrap_or_default(),
        state,
        addresses: Vec::new(),
        port: None,
        created_at: Some(mark.created_at),
        mark: Some(mark),
    }
}

fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
    let config = Config::parse(&ctx.config_json())?;
    let client = client(ctx, &config);
    let range = config.vmid_range.first..=config.vmid_range.last;
    let mut instances = Vec::new();
    for vm in list_vms(&client)?.values() {
        // The tag is set after the clone; a VM whose setup was cut short
        // only has the mark (and our name), so VMs in our range or with a
        // name like ours are looked at too: after a `vmidRange` edit, ours
        // may be outside it.
        let candidate = vm.has_tag()
            || range.contains(&vm.vmid)
            || vm.name.as_deref().is_some_and(vm::has_our_name);
        if !candidate || vm.template || vm.lock.as_deref().is_some_and(vm::is_creation_lock) {
            continue;
        }
        let config = if vm.status == "unknown" {
            // Its node is offline (the cluster says so).
            None
        } else {
            match vm_config(&client, &vm.node, vm.vmid) {
                Ok(config) => Some(config),
                Err(ProviderError::NotFound(_)) => continue,
                // Its node does not answer now (pveproxy down, a split the
                // cluster has not noticed yet).
                Err(ProviderError::Transient(_)) => None,
                Err(error) => return Err(error),
            }
        };
        match config {
            Some(config) => {
                if let Some(mark) = vm::mark_of(&config) {
                    let state = if vm.status == "running" {
                        InstanceState::Running
                    } else {
                        InstanceState::Stopped
                    };
                    instances.push(listed(vm, mark, state));
                }
            }
            None => instances.extend(listed_by_claim(vm)?),
        }
    }
    Ok(instances)
}

/// A VM whose config cannot be read now, as `list` reports it: our claim on
/// its VMID holds its mark, so the VM is neither lost to a delete that
/// looks for it by mark nor failing the whole list. Its state is unknown; it
/// serves nothing we can vouch for, so it is `stopped`. A VM that looks like
/// ours (our tag or our kind of name) with no claim to tell fails the list
/// as transient rather than go missing from it.
fn listed_by_claim(vm: &VmEntry) -> Result<Option<Instance>> {
    match claim::get(vm.vmid)?.and_then(|claim| claim.mark) {
        // Some listings leave out the name of a VM on an offline node.
        Some(mark) if vm.name.as_deref().is_none_or(|name| name == vm::vm_name(&mark.uid)) => {
            Ok(Some(listed(vm, mark, InstanceState::Stopped)))
        }
        // The VMID holds another VM than the one claimed.
        Some(_) => Ok(None),
        None if vm.has_tag() || vm.name.as_deref().is_some_and(vm::has_our_name) => {
            Err(ProviderError::Transient(format!(
                "VM {} on node {} looks like one of ours, but its config cannot be read (the \
                 node is offline or does not answer) and no claim names its owner; the list \
                 waits for the node",
                vm.vmid, vm.node
            )))
        }
        None => Ok(None),
    }
}

fn check(ctx: &CallContext) -> Health {
    let config = match Config::parse(&ctx.config_json()) {
        Ok(config) => config,
        Err(error) => return Health::unhealthy(HealthReason::Misconfigured, error.message()),
    };
    let client = client(ctx, &config);
    // One request first: when it fails (TLS, token, network) every other
    // one would fail the same way.
    let version = match client.get("/version", &[]) {
        Ok(version) => version,
        Err(failure) => {
            return Health::unhealthy(failure.health_reason(), failure.error().message());
        }
    };
    log::debug!(
        "cluster reachable",
        version = version.get("version").and_then(Value::as_str).unwrap_or("unknown")
    );
    // Every node's questions and the template lookup go out at once.
    let mut paths = Vec::new();
    for node in &config.nodes {
        paths.push(format!("/nodes/{}/status", encode_component(node)));
        paths.push(format!(
            "/nodes/{}/storage/{}/status",
            encode_component(node),
            encode_component(&config.iso_storage)
        ));
    }
    paths.push("/cluster/resources?type=vm".to_owned());
    let mut answers = fanout::get_all(client.base(), &paths).into_iter();
    let mut issues = Vec::new();
    for node in &config.nodes {
        let (node_status, storage) = (answers.next(), answers.next());
        if let Some(Err(failure)) = node_status {
            let message = format!("node {node}: {}", failure.error().message());
            issues.push((failure.health_reason(), message));
        }
        if let Some(Err(failure)) = storage {
            let reason = match pve::recognise(failure.error().message()) {
                Some(Fault::StorageMissing) => HealthReason::StorageNotFound,
                _ => failure.health_reason(),
            };
            let error = failure.error();
            issues.push((
                reason,
                format!(
                    "node {node}: ISO storage `{}` (config key `isoStorage`): {}",
                    config.iso_storage,
                    error.message()
                ),
            ));
        }
    }
    match answers.next() {
        Some(Ok(resources)) => {
            let vms = vms_from(&resources);
            for (image, vmid) in &config.templates {
                if !vms.get(vmid).is_some_and(|vm| vm.template) {
                    issues.push((
                        HealthReason::TemplateNotFound,
                        format!(
                            "config key `templates.{image}`: VM {vmid} is not a template on the cluster"
                        ),
                    ));
                }
            }
        }
        Some(Err(failure)) => {
            issues.push((failure.health_reason(), failure.error().message().to_owned()));
        }
        None => {}
    }
    issues.into_iter().fold(Health::healthy(), |health, (reason, message)| Health {
        healthy: false,
        ..health.with_issue(reason, message)
    })
}

impl Provider for Proxmox {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            "proxmox",
            env!("CARGO_PKG_VERSION"),
            config_schema(),
            Capabilities::default(),
        )
    }

    fn validate_config(config: &str) -> Result<()> {
        Config::parse(config).map(drop)
    }

    fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
        create(ctx, spec)
    }

    fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
        let config = Config::parse(&ctx.config_json())?;
        let vmid = vm::parse_vmid(provider_id)
            .ok_or_else(|| ProviderError::NotFound(format!("`{provider_id}` is not a VMID")))?;
        get_instance(&client(ctx, &config), vmid)
    }

    fn delete(ctx: &CallContext, provider_id: &str) -> Result<()> {
        delete(ctx, provider_id)
    }

    fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
        list(ctx)
    }

    fn check(ctx: &CallContext) -> Health {
        check(ctx)
    }
}

export_provider!(Proxmox);

#[cfg(test)]
mod tests {
    use proxyfleet_sdk::http::{Failure, FailureKind};

    use super::*;

    #[test]
    fn vmid_candidates_stay_in_range_and_do_not_repeat() {
        let range = 100_000..=100_099;
        let candidates: Vec<u32> = (0..PROBES)
            .filter_map(|attempt| proxyfleet_sdk::derive_number("uid-a", range.clone(), attempt))
            .collect();
        assert_eq!(candidates.len(), usize::try_from(PROBES).expect("fits"));
        assert!(candidates.iter().all(|vmid| range.contains(vmid)));
        let mut unique = candidates.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), candidates.len());
        let again: Vec<u32> = (0..PROBES)
            .filter_map(|attempt| proxyfleet_sdk::derive_number("uid-a", range.clone(), attempt))
            .collect();
        assert_eq!(candidates, again, "a retried create walks the same sequence");
    }

    #[test]
    fn a_pve_fault_reclassifies_the_error_and_keeps_the_failure_kind() {
        let answer = Failure::new(
            FailureKind::Status(500),
            ProviderError::Transient(
                "GET x: HTTP 500: Configuration file 'nodes/pve1/qemu-server/101.conf' does not exist"
                    .into(),
            ),
        );
        let failure = answer.map_error(pve::classify);
        assert!(matches!(failure.error(), ProviderError::NotFound(_)), "{failure}");
        assert_eq!(failure.kind(), FailureKind::Status(500));
        assert_eq!(failure.health_reason(), HealthReason::Unreachable);

        let timed_out = Failure::new(FailureKind::Timeout, ProviderError::Transient("x".into()))
            .map_error(pve::classify);
        assert_eq!(timed_out.health_reason(), HealthReason::Timeout);
    }
}
