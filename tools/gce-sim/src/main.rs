//! `gce-sim`: runs the Compute Engine API simulator for demos and manual
//! tests.
//!
//! ```text
//! gce-sim [--project NAME] [--zone NAME]... [--account EMAIL] [--key-out FILE]
//!         [--ca-out FILE] [--token-lifetime SECS]
//! ```
//!
//! It serves HTTPS for `localhost` with a certificate it makes up at start,
//! writes that certificate to `--ca-out` (default `gce-sim-ca.pem`) for the
//! entry's `caFile`, makes a service-account key for `--account` (default
//! `proxyfleet@<project>.iam.gserviceaccount.com`) whose `token_uri` is the
//! simulator, writes it to `--key-out` (default `gce-sim-key.json`) for the
//! grant's `keyFile`, and prints the endpoint. Ctrl-C stops it.

use std::time::Duration;

use anyhow::{Context, bail};
use proxyfleet_gce_sim::{SimOptions, Simulator};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut options = SimOptions {
        operation_duration: Duration::from_secs(3),
        boot_duration: Duration::from_secs(2),
        ..SimOptions::default()
    };
    let mut zones = Vec::new();
    let mut account = None;
    let mut key_out = "gce-sim-key.json".to_owned();
    let mut ca_out = "gce-sim-ca.pem".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--project" => options.projects = vec![value()?],
            "--zone" => zones.push(value()?),
            "--account" => account = Some(value()?),
            "--key-out" => key_out = value()?,
            "--ca-out" => ca_out = value()?,
            "--token-lifetime" => {
                let secs = value()?.parse().context("--token-lifetime takes seconds")?;
                options.token_lifetime = Duration::from_secs(secs);
            }
            other => bail!("unknown argument {other}; see the crate docs for the usage"),
        }
    }
    if !zones.is_empty() {
        options.zones = zones;
    }
    let project = options.projects[0].clone();
    let account =
        account.unwrap_or_else(|| format!("proxyfleet@{project}.iam.gserviceaccount.com"));

    let key = rcgen::KeyPair::generate().context("generating a TLS key")?;
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .context("certificate parameters")?
        .self_signed(&key)
        .context("self-signing the certificate")?;
    std::fs::write(&ca_out, cert.pem()).with_context(|| format!("writing {ca_out}"))?;

    let zones = options.zones.join(", ");
    let simulator = Simulator::start(options, &cert.pem(), &key.serialize_pem()).await?;
    let sa_key = simulator.create_key(&account)?;
    std::fs::write(&key_out, &sa_key.json).with_context(|| format!("writing {key_out}"))?;
    let mut out = std::io::stderr();
    use std::io::Write;
    writeln!(
        out,
        "gce-sim: {} (project {project}, zones {zones}; certificate in {ca_out}, \
         key of {account} in {key_out})",
        simulator.endpoint(),
    )?;
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    Ok(())
}
