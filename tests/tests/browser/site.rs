//! Pages on 127.0.0.1, each answer under the policy the console sends:
//! scripts and styles from the page's own origin only, nothing inline,
//! no `eval`, nothing else at all.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

pub const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'";

/// Serves fixed files by path; everything else is 404.
#[derive(Debug)]
pub struct Site {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Site {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Site {
    /// `files`: each a path (`/index.html`) and its content.
    pub async fn serve(files: &[(&'static str, &'static str)]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let files: Arc<Vec<(&'static str, &'static str)>> = Arc::new(files.to_vec());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let files = Arc::clone(&files);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let files = Arc::clone(&files);
                        async move { Ok::<_, Infallible>(answer(&req, &files)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

fn answer(req: &Request<Incoming>, files: &[(&str, &'static str)]) -> Response<Full<Bytes>> {
    let found = files.iter().find(|(path, _)| *path == req.uri().path());
    let response = Response::builder().header("content-security-policy", POLICY);
    match found {
        Some(&(path, body)) => response
            .header("content-type", content_type(path))
            .body(Full::new(Bytes::from_static(body.as_bytes()))),
        None => response.status(404).body(Full::new(Bytes::new())),
    }
    .expect("valid response")
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("js") => "text/javascript",
        Some("css") => "text/css",
        _ => "text/html; charset=utf-8",
    }
}
