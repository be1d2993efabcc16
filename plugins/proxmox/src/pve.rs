//! A small client for the PVE REST API (`/api2/json`): requests with form
//! parameters, the `data` envelope, worker tasks, multipart ISO upload, and
//! the classification of PVE's error answers.
//!
//! PVE reports most failures as HTTP 500, the reason only in the text, so
//! the SDK's status-based class is refined here by matching the text
//! against the ones PVE is known to use ([`Fault`]). The text is in the
//! status line's reason phrase (`HTTP/1.1 500 VM 101 is locked (clone)`)
//! and, from PVE 8.4 (pve-http-server 5.2) on, also in the body
//! (`{"data": null, "message": "VM 101 is locked (clone)\n"}`). The host
//! hands the phrase over in a header and the SDK puts it in the error
//! message, so the matchers see the text on every version.

use std::thread::sleep;
use std::time::{Duration, Instant};

use proxyfleet_sdk::http::{Failure, FailureKind, Method, Request, Response, encode_component};
use proxyfleet_sdk::{ProviderError, Result, log};
use serde_json::Value;

/// A PVE answer recognised by its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `Configuration file 'nodes/pve1/qemu-server/101.conf' does not exist`
    VmMissing,
    /// `storage 'iso' does not exist` (a 400 from parameter verification)
    StorageMissing,
    /// `volume 'local:iso/x.iso' does not exist`
    VolumeMissing,
    /// `no such cluster node 'pve9'`
    NodeMissing,
    /// `VM 101 is locked (clone)`
    Locked,
    /// `can't lock file '/var/lock/qemu-server/lock-101.conf' - got timeout`
    LockTimeout,
    /// `VM 101 already exists on node 'pve1'` (a clone's `newid` is taken)
    VmidTaken,
    /// `VM 101 already running`
    AlreadyRunning,
    /// `VM 101 is not running`
    VmNotRunning,
    /// `QEMU guest agent is not running`
    AgentNotRunning,
    /// `No QEMU guest agent configured`
    AgentNotConfigured,
}

type Matcher = fn(&str) -> bool;

/// Every matcher; `tests::every_matcher_fires_only_on_its_own_texts` runs
/// each against every known text.
pub const MATCHERS: &[(Fault, Matcher)] = &[
    (Fault::VmMissing, |text| {
        text.contains("Configuration file 'nodes/") && text.contains("does not exist")
    }),
    (Fault::StorageMissing, |text| text.contains("storage '") && text.contains("' does not exist")),
    (Fault::VolumeMissing, |text| text.contains("volume '") && text.contains("' does not exist")),
    (Fault::NodeMissing, |text| text.contains("no such cluster node '")),
    (Fault::Locked, |text| text.contains(" is locked (")),
    (Fault::LockTimeout, |text| text.contains("can't lock file") && text.contains("got timeout")),
    (Fault::VmidTaken, |text| text.contains(" already exists")),
    (Fault::AlreadyRunning, |text| text.contains(" already running")),
    (Fault::VmNotRunning, |text| text.contains(" is not running") && !text.contains("agent")),
    (Fault::AgentNotRunning, |text| text.contains("QEMU guest agent is not running")),
    (Fault::AgentNotConfigured, |text| text.contains("No QEMU guest agent configured")),
];

/// The fault a PVE message describes, if it is one we know.
pub fn recognise(text: &str) -> Option<Fault> {
    MATCHERS.iter().find(|(_, matches)| matches(text)).map(|(fault, _)| *fault)
}

/// The SDK's error for a PVE answer, reclassified by the message where PVE's
/// status code says too little. Unauthorized and config errors stay as they
/// are.
pub fn classify(error: ProviderError) -> ProviderError {
    if !matches!(
        error,
        ProviderError::Transient(_) | ProviderError::Permanent(_) | ProviderError::NotFound(_)
    ) {
        return error;
    }
    let message = error.message().to_owned();
    let Some(fault) = recognise(&message) else { return error };
    match fault {
        Fault::VmMissing | Fault::VolumeMissing => ProviderError::NotFound(message),
        Fault::StorageMissing => ProviderError::InvalidConfig(format!(
            "{message} (check config keys `isoStorage` and `targetStorage`: the storage must exist on the node)"
        )),
        Fault::NodeMissing => ProviderError::InvalidConfig(format!(
            "{message} (check config key `nodes` and the Proxy's placement `node`)"
        )),
        Fault::Locked | Fault::LockTimeout | Fault::VmidTaken | Fault::AlreadyRunning => {
            ProviderError::Conflict(message)
        }
        Fault::VmNotRunning | Fault::AgentNotRunning | Fault::AgentNotConfigured => {
            ProviderError::Transient(message)
        }
    }
}

/// The `data` of an API answer, or the failure with PVE's faults
/// recognised ([`classify`]): what every request of the plugin reads.
pub fn data_of(answer: Result<Response, Failure>) -> Result<Value, Failure> {
    let response = answer.map_err(|failure| failure.map_error(classify))?;
    let envelope: Value =
        response.json().map_err(|error| Failure::new(FailureKind::Body, error))?;
    Ok(envelope.get("data").cloned().unwrap_or(Value::Null))
}

/// Whether `error` says the guest agent cannot answer yet: the VM still
/// boots, which is provisioning rather than failure.
pub fn agent_not_ready(error: &ProviderError) -> bool {
    matches!(
        recognise(error.message()),
        Some(Fault::VmNotRunning | Fault::AgentNotRunning | Fault::AgentNotConfigured)
    )
}

fn form(params: &[(&str, String)]) -> String {
    params
        .iter()
        .map(|(key, value)| format!("{}={}", encode_component(key), encode_component(value)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The outcome of a finished task by its `exitstatus`: `OK` and
/// `WARNINGS: <n>` succeed.
pub fn task_succeeded(exitstatus: &str) -> bool {
    exitstatus == "OK" || exitstatus.starts_with("WARNINGS: ")
}

/// The API of one cluster, within one call's deadline.
#[derive(Debug)]
pub struct Client {
    base: String,
    poll: Duration,
    deadline: Instant,
}

impl Client {
    /// `url` is the config's base URL; waits end before `time_left` runs
    /// out, leaving a margin to answer.
    pub fn new(url: &str, poll: Duration, time_left: Duration) -> Self {
        let margin = (time_left / 10).min(Duration::from_secs(3));
        Self {
            base: format!("{url}/api2/json"),
            poll,
            deadline: Instant::now() + time_left.saturating_sub(margin),
        }
    }

    /// `https://host:port/api2/json`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether there is time left for another poll.
    pub fn has_time(&self) -> bool {
        Instant::now() + self.poll < self.deadline
    }

    /// Sleeps one poll interval.
    pub fn pause(&self) {
        sleep(self.poll);
    }

    /// Performs `method path` with `params` (query for GET and DELETE, form
    /// body otherwise) and returns the `data` of the answer.
    pub fn call(
        &self,
        method: Method,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<Value, Failure> {
        let mut url = format!("{}{path}", self.base);
        let request = match method {
            Method::Get | Method::Delete | Method::Head => {
                if !params.is_empty() {
                    url = format!("{url}?{}", form(params));
                }
                Request::new(method, url)
            }
            _ => Request::new(method, url).body("application/x-www-form-urlencoded", form(params)),
        };
        data_of(request.send())
    }

    pub fn get(&self, path: &str, params: &[(&str, String)]) -> Result<Value, Failure> {
        self.call(Method::Get, path, params)
    }

    /// Uploads `content` as ISO `filename` to `storage` on `node` (PVE
    /// replaces a file of the same name) and waits for the copy task.
    pub fn upload_iso(
        &self,
        node: &str,
        storage: &str,
        filename: &str,
        content: &[u8],
    ) -> Result<()> {
        // The boundary only has to be absent from the content; a fixed
        // prefix with the content's length and a scan keeps it stable.
        let mut boundary = format!("proxyfleet-boundary-{}", content.len());
        while content.windows(boundary.len()).any(|window| window == boundary.as_bytes()) {
            boundary.push('x');
        }
        let mut body = Vec::with_capacity(content.len() + 512);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"content\"\r\n\r\niso\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"filename\"; filename=\"{filename}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(content);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let url = format!(
            "{}/nodes/{}/storage/{}/upload",
            self.base,
            encode_component(node),
            encode_component(storage)
        );
        let answer =
            Request::post(url).body(&format!("multipart/form-data; boundary={boundary}"), body);
        match data_of(answer.send())?.as_str() {
            Some(upid) => self.wait_task(node, upid),
            None => Ok(()),
        }
    }

    /// Polls task `upid` on `node` until it stops; `OK` and `WARNINGS: n`
    /// succeed, anything else fails with its exit status (logged). A task
    /// still running at the deadline is a transient error: the next call
    /// finds its effect (or its lock) and carries on.
    pub fn wait_task(&self, node: &str, upid: &str) -> Result<()> {
        let path =
            format!("/nodes/{}/tasks/{}/status", encode_component(node), encode_component(upid));
        loop {
            let status = self.get(&path, &[])?;
            if status.get("status").and_then(Value::as_str) == Some("stopped") {
                let exit = status.get("exitstatus").and_then(Value::as_str).unwrap_or("unknown");
                if task_succeeded(exit) {
                    if exit != "OK" {
                        log::warn!("task finished with warnings", upid = upid, exitstatus = exit);
                    }
                    return Ok(());
                }
                log::error!("task failed", upid = upid, node = node, exitstatus = exit);
                let error = ProviderError::Transient(format!("PVE task {upid} failed: {exit}"));
                return Err(classify(error));
            }
            if !self.has_time() {
                return Err(ProviderError::Transient(format!(
                    "PVE task {upid} is still running at the call's deadline"
                )));
            }
            self.pause();
        }
    }

    /// Runs an API call that answers with a task UPID (or, for some calls
    /// on older versions, `null` when done synchronously) and waits for it.
    pub fn run_task(
        &self,
        method: Method,
        node: &str,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<()> {
        match self.call(method, path, params)? {
            Value::String(upid) => self.wait_task(node, &upid),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Texts PVE 8/9 answer with (and the simulator copies), each with the
    /// one fault it must be recognised as, or none.
    const TEXTS: &[(&str, Option<Fault>)] = &[
        (
            "Configuration file 'nodes/pve1/qemu-server/101.conf' does not exist",
            Some(Fault::VmMissing),
        ),
        (
            "Parameter verification failed. storage: storage 'isos' does not exist",
            Some(Fault::StorageMissing),
        ),
        ("volume 'local:iso/proxyfleet-101-cidata.iso' does not exist", Some(Fault::VolumeMissing)),
        ("no such cluster node 'pve9'", Some(Fault::NodeMissing)),
        ("VM 101 is locked (clone)", Some(Fault::Locked)),
        ("VM 101 is locked (backup)", Some(Fault::Locked)),
        (
            "can't lock file '/var/lock/qemu-server/lock-101.conf' - got timeout",
            Some(Fault::LockTimeout),
        ),
        ("VM 101 already exists on node 'pve1'", Some(Fault::VmidTaken)),
        ("VM 101 already running", Some(Fault::AlreadyRunning)),
        ("VM 101 is not running", Some(Fault::VmNotRunning)),
        ("QEMU guest agent is not running", Some(Fault::AgentNotRunning)),
        ("No QEMU guest agent configured", Some(Fault::AgentNotConfigured)),
        ("VM 101 is running - destroy failed", None),
        ("shrinking disks is not supported", None),
        ("no such task 'UPID:pve1:00001001:00000001:65A1B2C3:qmclone:9000:root@pam!pf:'", None),
        ("clone failed: copy failed: storage write error on VM 9000", None),
        ("proxy handler failed: internal error", None),
        ("invalid token value!", None),
        ("Permission check failed (/vms/101, VM.Allocate)", None),
    ];

    #[test]
    fn every_matcher_fires_only_on_its_own_texts() {
        for (text, expected) in TEXTS {
            // Also as the SDK quotes it: method, URL, status, reason phrase
            // and JSON body, from PVE 8.4 on and before.
            let url = "PUT https://pve.lan:8006/api2/json/nodes/pve1/storage/local/content/x";
            let quoted =
                format!("{url}: HTTP 500 {text}: {{\"data\":null,\"message\":\"{text}\\n\"}}");
            let before_8_4 = format!("{url}: HTTP 500 {text}: {{\"data\":null}}");
            for candidate in [text.to_string(), quoted, before_8_4] {
                let firing: Vec<Fault> = MATCHERS
                    .iter()
                    .filter(|(_, matches)| matches(&candidate))
                    .map(|(fault, _)| *fault)
                    .collect();
                let expected: Vec<Fault> = expected.iter().copied().collect();
                assert_eq!(firing, expected, "{candidate}");
            }
        }
    }

    #[test]
    fn classes_follow_what_the_reconciler_should_do() {
        let class = |text: &str| classify(ProviderError::Transient(text.to_owned()));
        assert!(matches!(class(TEXTS[0].0), ProviderError::NotFound(_)));
        assert!(
            matches!(class(TEXTS[1].0), ProviderError::InvalidConfig(m) if m.contains("isoStorage"))
        );
        assert!(matches!(class(TEXTS[4].0), ProviderError::Conflict(_)));
        assert!(matches!(class(TEXTS[6].0), ProviderError::Conflict(_)));
        assert!(matches!(class(TEXTS[7].0), ProviderError::Conflict(_)));
        assert!(matches!(class("proxy handler failed"), ProviderError::Transient(_)));
        // Authorization failures keep their class whatever the text says.
        let denied = ProviderError::Unauthorized("VM 101 is locked (clone)".into());
        assert_eq!(classify(denied.clone()), denied);
        assert!(agent_not_ready(&ProviderError::Transient(TEXTS[10].0.into())));
        assert!(!agent_not_ready(&ProviderError::Transient(TEXTS[4].0.into())));
    }

    #[test]
    fn task_exit_statuses() {
        assert!(task_succeeded("OK"));
        assert!(task_succeeded("WARNINGS: 3"));
        assert!(!task_succeeded("clone failed: no space left"));
        assert!(!task_succeeded("unexpected status"));
    }

    #[test]
    fn encoding_keeps_only_unreserved_characters() {
        assert_eq!(
            encode_component("UPID:pve1:0A:root@pam!pf:"),
            "UPID%3Apve1%3A0A%3Aroot%40pam%21pf%3A"
        );
        assert_eq!(form(&[("net0", "virtio,bridge=vmbr0".into())]), "net0=virtio%2Cbridge%3Dvmbr0");
    }
}
