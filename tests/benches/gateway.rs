//! The gateway against going straight to the proxies: throughput and
//! latency of the same load through real tinyproxy upstreams, once
//! directly (each connection to one upstream, in turn) and once through
//! the gateway (which spreads over the same upstreams), for plain HTTP
//! (absolute-form GETs on kept-alive connections where the proxy keeps
//! them), for CONNECT (a tunnel per request, one GET through it: the cost
//! of opening tunnels) and for tunnels kept open (a CONNECT per connection,
//! then GETs one after another through it, as an HTTPS client that keeps
//! its connection alive sends them).
//!
//! ```text
//! cargo bench -p proxyfleet-tests --bench gateway -- \
//!     [--connections 64] [--secs 10] [--upstreams 4] [--kinds http,connect,tunnel]
//! ```
//!
//! Each kind runs three loads: saturated (`--connections` connections,
//! each sending its next request as soon as the last is answered), paced
//! (the same connections offered half the lower of the two saturated
//! rates, open loop: a latency counts from when the request was due, so a
//! slow path cannot hide its queue) and one request at a time. Every
//! latency includes the connection to the proxy (or the gateway), when one
//! was made for the request. Added latency is the difference of the
//! medians: saturated it is mostly queueing for a core, paced and one at a
//! time it is the path's own cost. The load
//! generator, the gateway, the upstreams and the origin share this
//! machine's cores, so the loaded figures say how the two paths compare
//! here; the CPU each request costs the gateway (its own runtime's threads)
//! and the upstreams (the tinyproxy processes) says what the gateway adds
//! wherever it runs. A figure, not a test.

#![allow(clippy::print_stdout, reason = "a bench binary prints its figures")]

use std::convert::Infallible;
use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use proxyfleet_core::proxy::Phase;
use proxyfleet_fleet::auth::ApiAuth;
use proxyfleet_fleet::gateway::{self, Gateway, GatewaySettings};
use proxyfleet_fleet::probe::ProbePass;
use proxyfleet_fleet::{Endpoint, Fleet, FleetSettings, Member};
use proxyfleet_metrics::Metrics;
use proxyfleet_tests::procfs;
use proxyfleet_tests::proxies::Tinyproxy;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

const TOKEN: &str = "bench";

#[derive(Debug)]
struct Options {
    connections: usize,
    duration: Duration,
    upstreams: usize,
    kinds: Vec<Kind>,
}

impl Options {
    fn parse() -> Result<Self, Box<dyn Error>> {
        let mut options = Self {
            connections: 64,
            duration: Duration::from_secs(10),
            upstreams: 4,
            kinds: Kind::ALL.to_vec(),
        };
        let mut args = std::env::args().skip(1).filter(|arg| arg != "--bench");
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--connections" => options.connections = value()?.parse()?,
                "--secs" => options.duration = Duration::from_secs(value()?.parse()?),
                "--upstreams" => options.upstreams = value()?.parse()?,
                "--kinds" => {
                    options.kinds =
                        value()?.split(',').map(Kind::parse).collect::<Result<_, _>>()?;
                }
                other => return Err(format!("unknown flag {other}").into()),
            }
        }
        Ok(options)
    }
}

/// Where the load goes.
#[derive(Debug, Clone)]
enum Path {
    /// Connection `i` to upstream `i % n`.
    Direct(Vec<SocketAddr>),
    /// Every connection to the gateway, with credentials.
    Gateway(SocketAddr),
}

impl Path {
    fn proxy(&self, connection: usize) -> SocketAddr {
        match self {
            Path::Direct(upstreams) => upstreams[connection % upstreams.len()],
            Path::Gateway(addr) => *addr,
        }
    }

    fn credentials(&self) -> Option<String> {
        match self {
            Path::Direct(_) => None,
            Path::Gateway(_) => {
                use base64::Engine as _;
                let encoded = base64::engine::general_purpose::STANDARD.encode(format!(":{TOKEN}"));
                Some(format!("Basic {encoded}"))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Http,
    Connect,
    Tunnel,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Http, Kind::Connect, Kind::Tunnel];

    fn parse(name: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|kind| kind.name() == name).ok_or_else(|| {
            let known: Vec<&str> = Self::ALL.iter().map(|kind| kind.name()).collect();
            format!("--kinds: unknown kind {name:?}; the kinds are {}", known.join(", "))
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Http => "http",
            Kind::Connect => "connect",
            Kind::Tunnel => "tunnel",
        }
    }
}

#[derive(Debug, Default)]
struct Figures {
    latencies: Vec<Duration>,
    errors: u64,
}

impl Figures {
    fn per_second(&self, duration: Duration) -> f64 {
        self.latencies.len() as f64 / duration.as_secs_f64()
    }

    fn percentile(&mut self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        self.latencies.sort_unstable();
        let index = ((self.latencies.len() - 1) as f64 * p).round() as usize;
        self.latencies[index]
    }
}

/// CPU seconds of this process's threads named `gateway`.
fn gateway_cpu() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).unwrap_or_default().trim()
                == "gateway"
        })
        .map(|task| {
            std::fs::read_to_string(task.path().join("stat"))
                .map_or(0.0, |stat| procfs::cpu_seconds_of(&stat))
        })
        .sum()
}

/// CPU seconds of the processes `pids`, their threads included.
fn processes_cpu(pids: &[u32]) -> f64 {
    pids.iter().copied().map(procfs::cpu_seconds).sum()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let options = Options::parse()?;
    let origin = origin().await?;
    let upstreams: Vec<Tinyproxy> =
        (0..options.upstreams).map(|_| Tinyproxy::start_with("MaxClients 512\n")).collect();
    let addrs: Vec<SocketAddr> = upstreams.iter().map(Tinyproxy::addr).collect();
    // The gateway runs on threads of its own, so its CPU can be told apart
    // from the load generator's.
    let gateway_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("gateway")
        .enable_all()
        .build()?;
    let (gateway, _tokens) = start_gateway(&addrs, gateway_runtime.handle()).await?;
    println!(
        "gateway bench: {} connections, {:?} per run, {} tinyproxy upstreams, origin {origin}",
        options.connections, options.duration, options.upstreams
    );
    println!(
        "{:<8} {:<9} {:<8} {:>5} {:>10} {:>9} {:>9} {:>9} {:>7} {:>13} {:>13}",
        "kind",
        "load",
        "path",
        "conns",
        "req/s",
        "p50",
        "p90",
        "p99",
        "errors",
        "gateway CPU",
        "upstream CPU"
    );
    let pids: Vec<u32> = upstreams.iter().filter_map(Tinyproxy::pid).collect();
    let bench = Bench { origin, duration: options.duration, pids };
    let paths = [("direct", Path::Direct(addrs.clone())), ("gateway", Path::Gateway(gateway))];
    for kind in options.kinds.iter().copied() {
        // The most each path carries with every connection busy.
        let saturated = bench.compare(&paths, kind, options.connections, Offer::Saturate).await;
        println!(
            "{:<8} saturated: gateway/direct throughput {:.2}x, added median latency {:.3} ms",
            kind.name(),
            saturated[1].rate / saturated[0].rate.max(f64::MIN_POSITIVE),
            added_ms(&saturated)
        );
        // Half the lower of the two saturated rates, which both paths
        // carry: latency without the queueing that saturation adds.
        let rate = saturated[0].rate.min(saturated[1].rate) / 2.0;
        let half = bench.compare(&paths, kind, options.connections, Offer::Rate(rate)).await;
        println!(
            "{:<8} at {rate:.0} req/s: added median latency {:.3} ms",
            kind.name(),
            added_ms(&half)
        );
        let single = bench.compare(&paths, kind, 1, Offer::Saturate).await;
        println!(
            "{:<8} one at a time: gateway/direct throughput {:.2}x, added median latency {:.3} ms",
            kind.name(),
            single[1].rate / single[0].rate.max(f64::MIN_POSITIVE),
            added_ms(&single)
        );
    }
    gateway_runtime.shutdown_background();
    Ok(())
}

/// The figures of one run that the comparison needs.
#[derive(Debug, Clone, Copy)]
struct Run {
    rate: f64,
    p50: Duration,
}

/// The gateway's median minus the direct one, in milliseconds.
fn added_ms(runs: &[Run; 2]) -> f64 {
    (runs[1].p50.as_secs_f64() - runs[0].p50.as_secs_f64()) * 1000.0
}

/// What every run shares.
struct Bench {
    origin: SocketAddr,
    duration: Duration,
    /// The upstreams' processes, whose CPU each run reports.
    pids: Vec<u32>,
}

impl Bench {
    /// The same load down both paths, direct first; prints a row for each.
    async fn compare(
        &self,
        paths: &[(&str, Path); 2],
        kind: Kind,
        connections: usize,
        offer: Offer,
    ) -> [Run; 2] {
        let mut runs = [Run { rate: 0.0, p50: Duration::ZERO }; 2];
        for (run, (name, path)) in runs.iter_mut().zip(paths) {
            // A short warm-up, then the measured run.
            load(path, kind, self.origin, connections, Duration::from_secs(1), offer).await;
            let cpu_before = (gateway_cpu(), processes_cpu(&self.pids));
            let mut figures =
                load(path, kind, self.origin, connections, self.duration, offer).await;
            let cpu = (gateway_cpu() - cpu_before.0, processes_cpu(&self.pids) - cpu_before.1);
            let count = figures.latencies.len().max(1) as f64;
            let rate = figures.per_second(self.duration);
            let (p50, p90, p99) =
                (figures.percentile(0.5), figures.percentile(0.9), figures.percentile(0.99));
            let load = match offer {
                Offer::Saturate => "saturated",
                Offer::Rate(_) => "paced",
            };
            println!(
                "{:<8} {load:<9} {name:<8} {connections:>5} {rate:>10.0} {p50:>9.3?} {p90:>9.3?} {p99:>9.3?} {:>7} {:>10.1} µs {:>10.1} µs",
                kind.name(),
                figures.errors,
                cpu.0 / count * 1e6,
                cpu.1 / count * 1e6,
            );
            *run = Run { rate, p50 };
        }
        runs
    }
}

/// A plain origin answering `ok` on loopback, keeping connections alive.
async fn origin() -> Result<SocketAddr, Box<dyn Error>> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// The gateway over a catalog of `upstreams`, all healthy.
async fn start_gateway(
    upstreams: &[SocketAddr],
    runtime: &tokio::runtime::Handle,
) -> Result<(SocketAddr, tempfile::TempDir), Box<dyn Error>> {
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    fleet.publish(
        upstreams
            .iter()
            .enumerate()
            .map(|(i, addr)| Member {
                id: format!("upstream-{i}"),
                namespace: "bench".into(),
                name: format!("upstream-{i}"),
                pool: Some("bench/pool".into()),
                provider: "static".into(),
                labels: Default::default(),
                phase: Phase::Running,
                endpoint: Some(Endpoint::new(addr.ip(), addr.port())),
                created_at: None,
                conditions: Vec::new(),
            })
            .collect(),
    );
    let passed = ProbePass { latency: Duration::from_millis(1), exit_ip: None };
    let results = fleet
        .probe_targets()
        .into_iter()
        .map(|(id, endpoint)| (id, endpoint, Ok(passed.clone())))
        .collect();
    fleet.record_probes(results, 1, 1);
    fleet.set_ready(true);
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n"))?;
    let auth = Arc::new(ApiAuth::from_file(tokens, false)?);
    // The origin is on loopback; the bench's connections are many.
    let mut settings = GatewaySettings::default();
    settings.targets.allow.push("127.0.0.0/8".parse()?);
    settings.connections.max_connections = 4096;
    settings.max_per_client = 4096;
    let gateway = Arc::new(Gateway::new(fleet, auth, settings));
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    runtime.spawn(async move {
        let listener = TcpListener::from_std(listener).expect("a listener on this runtime");
        gateway::serve(listener, gateway, std::future::pending()).await;
    });
    Ok((addr, dir))
}

/// How a run offers its load.
#[derive(Debug, Clone, Copy)]
enum Offer {
    /// Every client sends its next request as soon as the last is
    /// answered: the most the path carries.
    Saturate,
    /// The clients together send this many requests a second, evenly
    /// spaced, whatever the answers take; a request's latency counts from
    /// when it was due, so a late answer also delays the requests behind it
    /// in the figures rather than hiding them.
    Rate(f64),
}

/// `connections` clients sending requests for `duration`.
async fn load(
    path: &Path,
    kind: Kind,
    origin: SocketAddr,
    connections: usize,
    duration: Duration,
    offer: Offer,
) -> Figures {
    let start = Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = (0..connections)
        .map(|i| {
            let mut client = Client {
                kind,
                proxy: path.proxy(i),
                credentials: path.credentials(),
                origin,
                sender: None,
            };
            let schedule = match offer {
                Offer::Saturate => None,
                Offer::Rate(rate) => {
                    let interval = Duration::from_secs_f64(connections as f64 / rate);
                    Some((start + interval.mul_f64(i as f64 / connections as f64), interval))
                }
            };
            tokio::spawn(async move { client.run(end, schedule).await })
        })
        .collect();
    let mut all = Figures::default();
    for task in tasks {
        if let Ok(figures) = task.await {
            all.latencies.extend(figures.latencies);
            all.errors += figures.errors;
        }
    }
    all
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// What one request came to.
enum Outcome {
    Answered,
    Failed,
    /// A kept-alive connection the proxy closed meanwhile: what any client
    /// does is send the request again on a new one.
    Again,
}

/// One load generator's connection.
struct Client {
    kind: Kind,
    proxy: SocketAddr,
    credentials: Option<String>,
    origin: SocketAddr,
    /// The connection kept for the next request, for the kinds that keep one.
    sender: Option<Sender>,
}

impl Client {
    /// Requests until `end`: back to back, or at `(first, interval)`.
    async fn run(&mut self, end: Instant, mut schedule: Option<(Instant, Duration)>) -> Figures {
        let mut figures = Figures::default();
        loop {
            let started = match &mut schedule {
                None => Instant::now(),
                Some((due, interval)) => {
                    let this = *due;
                    *due += *interval;
                    tokio::time::sleep_until(this.into()).await;
                    this
                }
            };
            if started >= end {
                break;
            }
            loop {
                match self.request().await {
                    Outcome::Answered => figures.latencies.push(started.elapsed()),
                    Outcome::Failed => figures.errors += 1,
                    Outcome::Again => continue,
                }
                break;
            }
        }
        figures
    }

    async fn request(&mut self) -> Outcome {
        match self.kind {
            Kind::Http => self.forwarded_get().await,
            Kind::Connect => {
                // A tunnel per request, one GET through it.
                let Some(mut sender) =
                    tunnel(self.proxy, self.credentials.as_deref(), self.origin).await
                else {
                    return Outcome::Failed;
                };
                get(&mut sender, self.origin).await
            }
            Kind::Tunnel => {
                // A tunnel kept for as long as the proxy keeps it.
                let mut current = match self.sender.take().filter(|s| !s.is_closed()) {
                    Some(current) => current,
                    None => {
                        match tunnel(self.proxy, self.credentials.as_deref(), self.origin).await {
                            Some(current) => current,
                            None => return Outcome::Failed,
                        }
                    }
                };
                let outcome = get(&mut current, self.origin).await;
                if matches!(outcome, Outcome::Answered) {
                    self.sender = Some(current);
                }
                outcome
            }
        }
    }

    /// An absolute-form GET, on the connection kept from the last one
    /// when the proxy kept it.
    async fn forwarded_get(&mut self) -> Outcome {
        let current = match self.sender.take().filter(|s| !s.is_closed()) {
            Some(current) => Some(current),
            None => match dial(self.proxy).await {
                Some(stream) => http1(stream).await,
                None => None,
            },
        };
        let Some(mut current) = current else { return Outcome::Failed };
        let origin = self.origin;
        let mut request =
            Request::get(format!("http://{origin}/")).header("host", origin.to_string());
        if let Some(credentials) = &self.credentials {
            request = request.header("proxy-authorization", credentials);
        }
        let request = request.body(Empty::new()).expect("a valid request");
        if current.ready().await.is_err() {
            return Outcome::Failed;
        }
        match current.send_request(request).await {
            Ok(response) => {
                let close = response
                    .headers()
                    .get("connection")
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
                let ok = response.status().is_success();
                let read = response.into_body().collect().await.is_ok();
                if !close {
                    self.sender = Some(current);
                }
                if read && ok { Outcome::Answered } else { Outcome::Failed }
            }
            Err(err) if err.is_canceled() || err.is_incomplete_message() => Outcome::Again,
            Err(_) => Outcome::Failed,
        }
    }
}

/// A new connection to `proxy`.
async fn dial(proxy: SocketAddr) -> Option<TcpStream> {
    let stream = TcpStream::connect(proxy).await.ok()?;
    let _ = stream.set_nodelay(true);
    Some(stream)
}

/// HTTP/1.1 on `stream`, its connection driven in the background.
async fn http1(stream: TcpStream) -> Option<Sender> {
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// An HTTP/1.1 connection to `origin` through a tunnel `proxy` opened.
async fn tunnel(
    proxy: SocketAddr,
    credentials: Option<&str>,
    origin: SocketAddr,
) -> Option<Sender> {
    let mut stream = dial(proxy).await?;
    let auth = credentials.map(|c| format!("Proxy-Authorization: {c}\r\n")).unwrap_or_default();
    let head = format!("CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n{auth}\r\n");
    stream.write_all(head.as_bytes()).await.ok()?;
    // Neither proxy sends anything after its answer head until the tunnel
    // carries a request, so reading in chunks takes the head alone.
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.ends_with(b"\r\n\r\n") {
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        answer.extend_from_slice(&chunk[..read]);
    }
    if !answer.starts_with(b"HTTP/1.1 200") && !answer.starts_with(b"HTTP/1.0 200") {
        return None;
    }
    http1(stream).await
}

/// An origin-form GET on `sender`, its answer read to the end.
async fn get(sender: &mut Sender, origin: SocketAddr) -> Outcome {
    if sender.ready().await.is_err() {
        return Outcome::Failed;
    }
    let Ok(request) = Request::get("/").header("host", origin.to_string()).body(Empty::new())
    else {
        return Outcome::Failed;
    };
    let Ok(response) = sender.send_request(request).await else { return Outcome::Failed };
    let ok = response.status().is_success();
    if response.into_body().collect().await.is_ok() && ok {
        Outcome::Answered
    } else {
        Outcome::Failed
    }
}
