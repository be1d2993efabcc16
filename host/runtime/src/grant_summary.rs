//! An entry's grants as people read them on the console's Providers page
//! and in `GET /v1/providers`: one line per destination, hypervisor or
//! store, with where a credential comes from and never the credential.

use proxyfleet_core::revisions::GrantSummary;

use crate::capabilities::http::config::Credential;
use crate::config::EntryConfig;

/// What `entry` grants its plugin, in the order the providers file lists
/// it, then the store, the log and the proxies' address ranges.
pub(crate) fn grant_summaries(entry: &EntryConfig) -> Vec<GrantSummary> {
    let line = |capability: &str, detail: String| GrantSummary {
        capability: capability.to_owned(),
        detail,
    };
    let mut lines = Vec::new();
    for grant in &entry.grants.http {
        let mut detail = grant.destination.to_string();
        if !grant.allow_addresses.is_empty() {
            let ranges: Vec<String> =
                grant.allow_addresses.iter().map(ToString::to_string).collect();
            detail.push_str(&format!(", which may resolve to {}", ranges.join(", ")));
        }
        match &grant.credential {
            Some(Credential::Header(header)) => detail.push_str(&format!(
                "; the host adds the {} header from {}",
                header.header, header.secret
            )),
            Some(Credential::GoogleServiceAccount(google)) => detail.push_str(&format!(
                "; the host adds Google access tokens of the key in {}",
                google.key
            )),
            Some(Credential::GoogleMetadata(google)) => detail.push_str(&format!(
                "; the host adds Google access tokens of the service account {} from the \
                 metadata server {}",
                google.service_account, google.metadata_host
            )),
            None => {}
        }
        lines.push(line("http", detail));
    }
    if let Some(ca) = &entry.grants.ca_file {
        lines.push(line("tls", format!("also trusts the CA certificates in {}", ca.display())));
    }
    for grant in &entry.grants.libvirt {
        let mut detail = format!("{}@{}:{} over SSH", grant.user, grant.host, grant.port);
        for (kind, names) in
            [("pools", &grant.pools), ("networks", &grant.networks), ("bridges", &grant.bridges)]
        {
            if !names.is_empty() {
                detail.push_str(&format!("; {kind} {}", names.join(", ")));
            }
        }
        lines.push(line("libvirt", detail));
    }
    let limits = &entry.limits;
    lines.push(line(
        "kv",
        format!(
            "{} keys, {} KiB in all, {} writes a call",
            limits.kv_keys,
            limits.kv_total_bytes / 1024,
            limits.kv_writes_per_call
        ),
    ));
    lines.push(line("log", "lines into the operator's log, marked as the plugin's".to_owned()));
    let ranges = if entry.proxy_addresses.is_empty() {
        "public and private addresses (other special-purpose ones are dropped)".to_owned()
    } else {
        entry.proxy_addresses.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    };
    lines.push(line("proxy addresses", ranges));
    lines
}
