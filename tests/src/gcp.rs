//! A `gcp` provider entry against `tools/gce-sim`, as the tests that run
//! the plugin through the host write it.

use std::path::Path;

/// The providers-file lines of entry `name` on the simulator at
/// `endpoint` (project `project`, one zone), trusting the CA in `ca_file`
/// and signing in with the service-account key in `key_file`.
pub fn sim_entry(
    name: &str,
    endpoint: &str,
    project: &str,
    ca_file: &Path,
    key_file: &Path,
) -> String {
    format!(
        "  - name: {name}
    plugin: gcp
    proxyAddresses: ['127.0.0.0/8']
    config:
      endpoint: {endpoint}
      project: {project}
      zones: [europe-west1-b]
      images: {{ debian-12: projects/debian-cloud/global/images/family/debian-12 }}
      operationPollMs: 50
    grants:
      caFile: {ca}
      http:
        - url: {endpoint}
          allowAddresses: [127.0.0.1, '::1']
          credential: {{ kind: google-service-account, keyFile: {key}, scopes: [https://www.googleapis.com/auth/compute] }}
",
        ca = ca_file.display(),
        key = key_file.display(),
    )
}
