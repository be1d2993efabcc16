//! `cargo xtask demo`, the README's first command: the standalone mode on
//! the static plugin against two real tinyproxy instances on loopback,
//! probed by the health engine, handed out by the discovery API and
//! reached through the gateway.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::process::{self, elapsed, step};
use crate::{Repo, apt, cargo, packages, plugins};

/// The README's first command: the standalone mode on the static plugin
/// against two real tinyproxy instances on loopback, then a request through
/// each proxy it reports.
pub fn run(repo: &Repo, keep: bool) -> Result<()> {
    step("debian packages", || apt::ensure(&packages::demo()))?;
    step("plugins", || plugins::build(repo))?;
    step("proxyfleet binary", || {
        process::run(cargo().args(["build", "-p", "proxyfleet-operator"]).current_dir(&repo.root))
    })?;
    let work = repo.root.join("target/demo");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("clearing {}", work.display()))?;
    }
    fs::create_dir_all(work.join("www"))?;
    fs::write(work.join("www/hello.txt"), "hello from the origin, through a proxyfleet proxy\n")?;
    let mut services = Services::default();
    step("origin and proxies on loopback", || {
        services.start(
            "origin",
            Command::new("python3")
                .args(["-m", "http.server", DEMO_ORIGIN_PORT, "--bind", "127.0.0.1"])
                .current_dir(work.join("www")),
            &work,
        )?;
        for port in DEMO_PROXY_PORTS {
            let config = work.join(format!("tinyproxy-{port}.conf"));
            fs::write(
                &config,
                format!(
                    "User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nTimeout 60\n\
                     MaxClients 50\nAllow 127.0.0.1\nLogLevel Warning\n"
                ),
            )?;
            services.start(
                &format!("tinyproxy-{port}"),
                Command::new("tinyproxy").arg("-d").arg("-c").arg(&config),
                &work,
            )?;
        }
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    })?;
    let binary = repo.root.join("target/debug/proxyfleet");
    step("proxyfleet standalone (reconciler, health engine, discovery API)", || {
        services.start(
            "proxyfleet",
            Command::new(&binary)
                .args(["--log-format", "text", "standalone", "--providers"])
                .arg(repo.root.join("deploy/standalone/providers.yaml"))
                .arg("--proxies")
                .arg(repo.root.join("deploy/standalone/proxies"))
                .arg("--state")
                .arg(work.join("state.redb"))
                .arg("--plugin-dir")
                .arg(repo.plugin_outputs())
                .arg("--cache-dir")
                .arg(repo.root.join("target/plugin-cache"))
                .args(["--api-addr", DEMO_API, "--metrics-addr", "127.0.0.1:0"])
                // The demo takes a lease and uses the gateway without
                // tokens; both listen on loopback only.
                .arg("--api-open-writes")
                .args(["--gateway-addr", DEMO_GATEWAY, "--gateway-open"])
                // The demo's origin is on loopback, which crawlers may not
                // reach through the gateway unless allowed.
                .args(["--gateway-allow-targets", "127.0.0.0/8"])
                .args(["--health-interval", "2s", "--health-timeout", "2s"]),
            &work,
        )?;
        eprintln!("xtask: its log is {}", work.join("proxyfleet.log").display());
        Ok(())
    })?;
    let api = format!("http://{DEMO_API}");
    step("the health engine probes both proxies through their ports", || {
        let started = Instant::now();
        let mut last = String::new();
        loop {
            let healthy = process::output(Command::new("curl").args([
                "-sS",
                "--max-time",
                "5",
                &format!("{api}/v1/proxies?healthy=true"),
            ]))
            .unwrap_or_default();
            let count = healthy.matches("\"healthy\":true").count();
            let progress = format!("{count} of {} healthy", DEMO_PROXY_PORTS.len());
            if progress != last {
                eprintln!("xtask: {progress} after {}", elapsed(started));
                last = progress;
            }
            if count == DEMO_PROXY_PORTS.len() {
                return Ok(());
            }
            ensure!(
                started.elapsed() < Duration::from_secs(120),
                "the proxies did not turn healthy within 2 min; see {}",
                work.join("proxyfleet.log").display()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    })?;
    step("a crawler asks the discovery API for proxies and fetches through them", || {
        let mut handed = Vec::new();
        for _ in DEMO_PROXY_PORTS {
            let next = format!("{api}/v1/proxies/next?format=url");
            eprintln!("xtask: $ curl -s '{next}'");
            let proxy = process::output(Command::new("curl").args(["-sS", &next]))?;
            let proxy = proxy.trim().to_owned();
            eprintln!("{proxy}");
            let url = format!("http://127.0.0.1:{DEMO_ORIGIN_PORT}/hello.txt");
            process::run(Command::new("curl").args([
                "-sS",
                "--max-time",
                "10",
                "-x",
                &proxy,
                &url,
            ]))?;
            handed.push(proxy);
        }
        handed.sort();
        handed.dedup();
        ensure!(
            handed.len() == DEMO_PROXY_PORTS.len(),
            "round robin should hand out each proxy once, got {handed:?}"
        );
        Ok(())
    })?;
    step("a crawler sends requests through the gateway, one endpoint for the fleet", || {
        let url = format!("http://127.0.0.1:{DEMO_ORIGIN_PORT}/hello.txt");
        let through = |user: &str| -> Result<String> {
            eprintln!("xtask: $ curl -sS -x 'http://{user}@{DEMO_GATEWAY}' {url}");
            let answer = process::output(Command::new("curl").args([
                "-sS",
                "--max-time",
                "10",
                "-i",
                "-x",
                &format!("http://{DEMO_GATEWAY}"),
                "--proxy-user",
                user,
                &url,
            ]))?;
            ensure!(
                answer.contains("hello from the origin"),
                "no answer through the gateway: {answer}"
            );
            let proxy = answer
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase()
                        .strip_prefix("x-proxyfleet-proxy:")
                        .map(|id| id.trim().to_owned())
                })
                .context("the answer names no proxy")?;
            eprintln!("xtask: through proxy {proxy}");
            Ok(proxy)
        };
        let spread = [through(":")?, through(":")?];
        ensure!(spread[0] != spread[1], "round robin should use both proxies, got {spread:?}");
        let sticky = [through("session=demo:")?, through("session=demo:")?];
        ensure!(sticky[0] == sticky[1], "a session should keep its proxy, got {sticky:?}");
        Ok(())
    })?;
    step("a sticky session: an exclusive lease for 60 s", || {
        process::run(Command::new("curl").args([
            "-sS",
            "-X",
            "POST",
            "-d",
            "{\"ttlSeconds\":60}",
            &format!("{api}/v1/leases"),
        ]))?;
        eprintln!();
        Ok(())
    })?;
    step("the web console shows the fleet", || {
        let page =
            process::output(Command::new("curl").args(["-sS", &format!("{api}/ui/proxies")]))?;
        let rows = page.matches("<tr data-proxy=").count();
        ensure!(
            rows == DEMO_PROXY_PORTS.len(),
            "the console's Proxies page lists {rows} proxies, not {}",
            DEMO_PROXY_PORTS.len()
        );
        eprintln!("xtask: the console is at {api}/ui/ ({rows} proxies listed)");
        Ok(())
    })?;
    if keep {
        eprintln!("xtask: open the console at {api}/ui/");
        eprintln!(
            "xtask: the demo keeps running; try `curl -s {api}/v1/proxies` or \
             `curl -x \"$(curl -s '{api}/v1/proxies/next?format=url')\" http://127.0.0.1:{DEMO_ORIGIN_PORT}/hello.txt` \
             or, through the gateway, `curl -x http://{DEMO_GATEWAY} http://127.0.0.1:{DEMO_ORIGIN_PORT}/hello.txt`. \
             Ctrl-C stops it."
        );
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    Ok(())
}

/// Where the demo serves the discovery API.
const DEMO_API: &str = "127.0.0.1:8480";

/// Where the demo serves the gateway.
const DEMO_GATEWAY: &str = "127.0.0.1:8481";

/// Must match the endpoints in deploy/standalone/providers.yaml.
const DEMO_PROXY_PORTS: [u16; 2] = [8888, 8889];
const DEMO_ORIGIN_PORT: &str = "18080";

/// Background processes the demo started; stopped when dropped.
#[derive(Default)]
struct Services {
    children: Vec<(String, std::process::Child)>,
}

impl Services {
    fn start(&mut self, name: &str, command: &mut Command, logs: &Path) -> Result<()> {
        let log = fs::File::create(logs.join(format!("{name}.log")))?;
        let child = command
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {name}: `{}`", process::show(command)))?;
        eprintln!("xtask: started {name} (pid {})", child.id());
        self.children.push((name.to_owned(), child));
        Ok(())
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        for (name, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("xtask: stopped {name}");
        }
    }
}
