//! `pve-sim`: runs the Proxmox VE API simulator for demos and manual tests.
//!
//! ```text
//! pve-sim [--token USER@REALM!TOKENID=SECRET] [--node NAME]... [--template VMID]
//!         [--iso-storage NAME] [--version X.Y.Z] [--ca-out FILE]
//! ```
//!
//! It serves HTTPS for `localhost` with a certificate it makes up at start,
//! writes that certificate to `--ca-out` (default `pve-sim-ca.pem`) for the
//! entry's `caFile`, adds a template VM (default 9000, `debian-12`) on the
//! first node, and prints the URL. `--version` (default 8.4.1) is what
//! `/version` reports and decides where error texts go: before 8.4 only in
//! the reason phrase. Ctrl-C stops it.

use std::time::Duration;

use anyhow::{Context, bail};
use proxyfleet_pve_sim::{SimOptions, Simulator};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut options = SimOptions {
        clone_duration: Duration::from_secs(3),
        task_duration: Duration::from_millis(500),
        agent_delay: Duration::from_secs(2),
        ..SimOptions::default()
    };
    let mut nodes = Vec::new();
    let mut template = 9000;
    let mut ca_out = "pve-sim-ca.pem".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--token" => options.token = value()?,
            "--node" => nodes.push(value()?),
            "--template" => template = value()?.parse().context("--template takes a VMID")?,
            "--iso-storage" => options.iso_storages = vec![value()?],
            "--version" => options.version = value()?,
            "--ca-out" => ca_out = value()?,
            other => bail!("unknown argument {other}; see the crate docs for the usage"),
        }
    }
    if !nodes.is_empty() {
        options.nodes = nodes;
    }
    let first_node = options.nodes[0].clone();

    let key = rcgen::KeyPair::generate().context("generating a key")?;
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .context("certificate parameters")?
        .self_signed(&key)
        .context("self-signing the certificate")?;
    std::fs::write(&ca_out, cert.pem()).with_context(|| format!("writing {ca_out}"))?;

    let simulator = Simulator::start(options, &cert.pem(), &key.serialize_pem()).await?;
    simulator.add_template(&first_node, template, "debian-12", 8);
    let mut out = std::io::stderr();
    use std::io::Write;
    writeln!(
        out,
        "pve-sim: {} (certificate in {ca_out}, template {template} on {first_node}, VM proxies on port {})",
        simulator.base_url(),
        simulator.proxy_port()
    )?;
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    Ok(())
}
