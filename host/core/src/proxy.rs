//! A Proxy as the reconciler sees it, whatever it came from (a Kubernetes
//! object or a standalone file): identity, desired state and status.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::ProxySpec;
use crate::credential::ProxyCredential;
use crate::spec_key::SpecKey;

/// Default proxy port.
pub const DEFAULT_PORT: u16 = 3128;

/// Identity of a Proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyMeta {
    /// Stable unique ID; providers derive instance names from it.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Increases on every spec change.
    pub generation: i64,
}

/// What a Proxy asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyDesired {
    /// Provider entry name.
    pub provider: String,
    /// Virtual CPUs.
    pub cores: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Boot disk in GiB.
    pub disk_gib: u64,
    /// Provider-specific image key.
    pub image: String,
    /// Placement hints.
    pub placement: BTreeMap<String, String>,
    /// 802.1Q VLAN tag.
    pub vlan_tag: Option<u16>,
    /// Proxy port.
    pub port: u16,
    /// cloud-init user-data (already resolved from its Secret or file).
    pub user_data: Vec<u8>,
    /// The credential the proxy asks its clients for (already resolved
    /// from its Secret or file); probes, the gateway and authorized
    /// crawlers send it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_auth: Option<ProxyCredential>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Set (to a new value each time) by an operator who asks for a new
    /// instance in place of the current one: it is part of the spec hash,
    /// so the reconciler replaces the instance as for any spec change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_token: Option<String>,
}

impl ProxyDesired {
    /// Hash of everything whose change needs a new instance. Labels are left
    /// out: they change in place (or not at all) without a replacement. The
    /// credential counts through its HMAC under `key` (see [`SpecKey`]).
    pub fn spec_hash(&self, key: &SpecKey) -> String {
        let mut hasher = Sha256::new();
        let mut field = |name: &str, value: &[u8]| {
            // Length-prefixed so that no two field sequences collide.
            hasher.update((name.len() as u64).to_le_bytes());
            hasher.update(name.as_bytes());
            hasher.update((value.len() as u64).to_le_bytes());
            hasher.update(value);
        };
        field("provider", self.provider.as_bytes());
        field("cores", &self.cores.to_le_bytes());
        field("memoryMiB", &self.memory_mib.to_le_bytes());
        field("diskGiB", &self.disk_gib.to_le_bytes());
        field("image", self.image.as_bytes());
        for (key, value) in &self.placement {
            field("placement.key", key.as_bytes());
            field("placement.value", value.as_bytes());
        }
        field("vlanTag", &self.vlan_tag.map_or([0xff; 3], |t| [0, (t >> 8) as u8, t as u8]));
        field("port", &self.port.to_le_bytes());
        field("userData", &self.user_data);
        // Providers configure the proxies they start with the credential,
        // so a new one needs a new instance. The hash is published in the
        // status: it covers a keyed digest, which no one without the key can
        // test password guesses against. No field at all without one, so a
        // Proxy without a credential keeps the hash it had before digests.
        if let Some(credential) = &self.proxy_auth {
            field("proxyAuth", &key.credential_digest(credential));
        }
        // Likewise absent until an operator first asks for a replacement.
        if let Some(token) = &self.replace_token {
            field("replaceToken", token.as_bytes());
        }
        let digest = hasher.finalize();
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    /// Checks ranges and names; the error names the field (as written in
    /// a manifest) and what is allowed. Both modes run it; in Kubernetes the
    /// CRD schema refuses most of this earlier.
    pub fn validate(&self) -> Result<(), FieldError> {
        let err =
            |field: &str, message: String| Err(FieldError { field: field.to_owned(), message });
        if !is_dns_label(&self.provider) {
            return err(
                "spec.provider",
                format!("{:?} is not a provider entry name (a DNS-1123 label)", self.provider),
            );
        }
        if !(1..=256).contains(&self.cores) {
            return err("spec.cores", format!("{} is out of range; use 1 to 256", self.cores));
        }
        if !(64..=1 << 20).contains(&self.memory_mib) {
            return err(
                "spec.memoryMiB",
                format!("{} is out of range; use 64 to 1048576", self.memory_mib),
            );
        }
        if !(1..=65536).contains(&self.disk_gib) {
            return err(
                "spec.diskGiB",
                format!("{} is out of range; use 1 to 65536", self.disk_gib),
            );
        }
        if self.port == 0 {
            return err("spec.port", "0 is not a port; use 1 to 65535".to_owned());
        }
        if let Some(tag) = self.vlan_tag
            && !(1..=4094).contains(&tag)
        {
            return err("spec.network.vlanTag", format!("{tag} is out of range; use 1 to 4094"));
        }
        Ok(())
    }

    /// The spec handed to the provider.
    pub fn to_spec(&self, meta: &ProxyMeta) -> ProxySpec {
        ProxySpec {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            cores: self.cores,
            memory_mib: self.memory_mib,
            disk_gib: self.disk_gib,
            image: self.image.clone(),
            placement: self.placement.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            vlan_tag: self.vlan_tag,
            port: self.port,
            user_data: self.user_data.clone(),
            labels: self.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            proxy_auth: self.proxy_auth.clone(),
        }
    }
}

/// A field of a Proxy that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// The field's path, e.g. `spec.memoryMiB`.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

/// RFC 1123 label: 1 to 63 lowercase letters, digits and '-', starting and
/// ending with a letter or digit.
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Where a Proxy is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Nothing done yet.
    #[default]
    Pending,
    /// The instance is being created or has no address yet.
    Provisioning,
    /// The instance runs and has an address.
    Running,
    /// Stopped for a reason that needs a spec or config change.
    Failed,
    /// The Proxy is being deleted.
    Deleting,
}

impl Phase {
    /// The phase as statuses, the API and metrics spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Provisioning => "Provisioning",
            Phase::Running => "Running",
            Phase::Failed => "Failed",
            Phase::Deleting => "Deleting",
        }
    }
}

/// Condition types a Proxy reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConditionType {
    /// The instance exists, runs and has an address.
    Provisioned,
    /// Health probes through the proxy succeed (set by the health engine).
    Healthy,
    /// Provisioned and not known to be unhealthy: may be handed out.
    Ready,
}

/// Condition status, as in Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConditionStatus {
    /// Holds.
    True,
    /// Does not hold.
    False,
    /// Not known.
    Unknown,
}

/// One condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Which condition.
    #[serde(rename = "type")]
    pub kind: ConditionType,
    /// Whether it holds.
    pub status: ConditionStatus,
    /// Machine-readable reason, CamelCase.
    pub reason: String,
    /// For people.
    pub message: String,
    /// Unix seconds of the last change of `status`.
    pub last_transition_time: u64,
}

/// What the reconciler records about a Proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// Phase.
    pub phase: Phase,
    /// The provider's ID of the instance, written as soon as it is known.
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
    /// Address of the instance.
    pub ip: Option<String>,
    /// Proxy port when the provider decides it.
    pub port: Option<u16>,
    /// Conditions.
    pub conditions: Vec<Condition>,
    /// Generation the status describes.
    pub observed_generation: i64,
    /// Spec hash of the instance that exists (or is being created).
    pub spec_hash: Option<String>,
    /// Plugin serving the Proxy's provider entry.
    pub plugin: Option<String>,
    /// Its version.
    pub plugin_version: Option<String>,
    /// Failed attempts in a row, for backoff.
    pub attempts: u32,
    /// Spec hash a final failure was latched for: no provider calls until the
    /// spec changes.
    pub failed_spec_hash: Option<String>,
    /// Polls in a row that saw the running instance flap to provisioning.
    pub flaps: u32,
}

impl ProxyStatus {
    /// The condition of `kind`, if set.
    pub fn condition(&self, kind: ConditionType) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    /// Sets a condition, keeping its transition time when the status stays.
    pub fn set_condition(
        &mut self,
        kind: ConditionType,
        status: ConditionStatus,
        reason: &str,
        message: impl Into<String>,
        now: u64,
    ) {
        let message = message.into();
        match self.conditions.iter_mut().find(|c| c.kind == kind) {
            Some(existing) => {
                if existing.status != status {
                    existing.last_transition_time = now;
                }
                existing.status = status;
                existing.reason = reason.to_owned();
                existing.message = message;
            }
            None => self.conditions.push(Condition {
                kind,
                status,
                reason: reason.to_owned(),
                message,
                last_transition_time: now,
            }),
        }
    }

    /// Ready = provisioned and not known to be unhealthy. Both writers of
    /// conditions (the reconciler and the health engine) derive it here, so
    /// neither can leave it stale after changing the other two.
    pub fn refresh_ready(&mut self, now: u64) {
        let provisioned = self.condition(ConditionType::Provisioned).map(|c| c.status)
            == Some(ConditionStatus::True);
        let unhealthy = self.condition(ConditionType::Healthy).map(|c| c.status)
            == Some(ConditionStatus::False);
        let (value, reason, message) = match (provisioned, unhealthy) {
            (true, false) => {
                (ConditionStatus::True, "Ready", "provisioned and not failing health checks")
            }
            (true, true) => {
                (ConditionStatus::False, "Unhealthy", "health checks through the proxy fail")
            }
            (false, _) => {
                (ConditionStatus::False, "NotProvisioned", "the instance is not running yet")
            }
        };
        self.set_condition(ConditionType::Ready, value, reason, message, now);
    }

    /// Records a health verdict: `Healthy` from the probes, then `Ready`.
    /// Returns whether anything changed, so callers write only changes.
    pub fn set_health(&mut self, healthy: bool, message: &str, now: u64) -> bool {
        let before = self.conditions.clone();
        let (status, reason) = if healthy {
            (ConditionStatus::True, "ProbesPass")
        } else {
            (ConditionStatus::False, "ProbesFail")
        };
        self.set_condition(ConditionType::Healthy, status, reason, message, now);
        self.refresh_ready(now);
        before != self.conditions
    }

    /// Forgets the health verdict (the instance lost its address).
    pub fn clear_health(&mut self, now: u64) -> bool {
        let before = self.conditions.len();
        self.conditions.retain(|c| c.kind != ConditionType::Healthy);
        if before == self.conditions.len() {
            return false;
        }
        self.refresh_ready(now);
        true
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_phase_is_spelled_as_it_serializes() {
        for phase in
            [Phase::Pending, Phase::Provisioning, Phase::Running, Phase::Failed, Phase::Deleting]
        {
            assert_eq!(serde_json::to_value(phase).unwrap(), phase.as_str());
        }
    }

    /// A valid desired state on provider entry `lab`.
    pub(crate) fn desired() -> ProxyDesired {
        ProxyDesired {
            provider: "lab".into(),
            cores: 1,
            memory_mib: 512,
            disk_gib: 4,
            image: "debian-12".into(),
            placement: BTreeMap::new(),
            vlan_tag: None,
            port: DEFAULT_PORT,
            user_data: Vec::new(),
            proxy_auth: None,
            labels: BTreeMap::new(),
            replace_token: None,
        }
    }

    /// Proxies without a credential keep the hash they had before the
    /// hash covered credentials (a new hash would replace every instance).
    #[test]
    fn regression_a_proxy_without_a_credential_keeps_its_hash() {
        assert_eq!(desired().spec_hash(&SpecKey::generate()), "fd8eafab875e09ff");
    }

    /// The hash is published in the status: a plain hash of the proxy's
    /// password would let anyone who reads it test guesses. It covers a
    /// digest under the installation's key, so it changes with the
    /// credential (the proxy must be configured anew) and with the key,
    /// and no one without the key can compute it from a guess.
    #[test]
    fn regression_the_hash_covers_the_credential_only_through_the_keyed_digest() {
        let key = SpecKey::generate();
        let mut with = desired();
        with.proxy_auth = Some(ProxyCredential::parse("crawler:pw").unwrap());
        let hash = with.spec_hash(&key);
        assert_ne!(hash, desired().spec_hash(&key));
        assert_eq!(hash, with.spec_hash(&SpecKey::from_bytes("k", key.as_bytes()).unwrap()));
        assert_ne!(hash, with.spec_hash(&SpecKey::generate()), "another key, another hash");
        let mut changed = with.clone();
        changed.proxy_auth = Some(ProxyCredential::parse("crawler:pw2").unwrap());
        assert_ne!(hash, changed.spec_hash(&key));
    }

    #[test]
    fn the_hash_covers_what_needs_a_new_instance_and_not_labels() {
        let base = desired();
        let mut labelled = base.clone();
        labelled.labels.insert("team".into(), "crawl".into());
        let key = SpecKey::generate();
        assert_eq!(base.spec_hash(&key), labelled.spec_hash(&key));
        let changes: [fn(&mut ProxyDesired); 9] = [
            |d| d.replace_token = Some("asked-1".into()),
            |d| d.provider = "other".into(),
            |d| d.cores = 2,
            |d| d.memory_mib = 1024,
            |d| d.disk_gib = 8,
            |d| d.image = "debian-13".into(),
            |d| d.vlan_tag = Some(0),
            |d| d.port = 8080,
            |d| d.user_data = b"#cloud-config".to_vec(),
        ];
        for change in changes {
            let mut changed = base.clone();
            change(&mut changed);
            assert_ne!(base.spec_hash(&key), changed.spec_hash(&key), "{changed:?}");
        }
    }

    #[test]
    fn validation_names_the_field_and_the_range() {
        let mut d = desired();
        assert_eq!(d.validate(), Ok(()));
        d.memory_mib = 16;
        let err = d.validate().unwrap_err();
        assert_eq!(err.field, "spec.memoryMiB");
        assert!(err.message.contains("64 to 1048576"), "{err}");
        let mut d = desired();
        d.vlan_tag = Some(4095);
        assert_eq!(d.validate().unwrap_err().field, "spec.network.vlanTag");
        let mut d = desired();
        d.provider = "Not_A_Label".into();
        assert_eq!(d.validate().unwrap_err().field, "spec.provider");
    }

    #[test]
    fn condition_transition_time_moves_only_on_a_status_change() {
        let mut status = ProxyStatus::default();
        status.set_condition(ConditionType::Ready, ConditionStatus::False, "A", "", 10);
        status.set_condition(ConditionType::Ready, ConditionStatus::False, "B", "", 20);
        assert_eq!(status.condition(ConditionType::Ready).unwrap().last_transition_time, 10);
        status.set_condition(ConditionType::Ready, ConditionStatus::True, "C", "", 30);
        assert_eq!(status.condition(ConditionType::Ready).unwrap().last_transition_time, 30);
    }

    #[test]
    fn a_health_verdict_moves_ready_and_reports_only_changes() {
        let mut status = ProxyStatus::default();
        status.set_condition(ConditionType::Provisioned, ConditionStatus::True, "Running", "", 1);
        status.refresh_ready(1);
        assert_eq!(status.condition(ConditionType::Ready).unwrap().status, ConditionStatus::True);
        assert!(status.set_health(false, "3 probes failed", 2));
        assert_eq!(status.condition(ConditionType::Ready).unwrap().status, ConditionStatus::False);
        assert!(!status.set_health(false, "3 probes failed", 3));
        assert!(status.set_health(true, "2 probes passed", 4));
        assert_eq!(status.condition(ConditionType::Ready).unwrap().status, ConditionStatus::True);
        assert!(status.clear_health(5));
        assert!(!status.clear_health(6));
        assert!(status.condition(ConditionType::Healthy).is_none());
    }
}
