//! The forward proxy a simulated machine runs (a Proxmox VM once started, a
//! Compute Engine instance once `RUNNING`), so that health checks and demos
//! reach a real proxy at the address and port the simulator reports.
//!
//! It understands `CONNECT host:port` (tunnels) and absolute-form requests
//! (`GET http://host/path HTTP/1.1`), which is what HTTP clients send to a
//! forward proxy. It is deliberately small: one request per connection for
//! plain HTTP, no authentication.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Longest request head accepted before the connection is dropped.
const MAX_HEAD: usize = 16 * 1024;

/// Binds `addr` and serves proxy connections until the handle is aborted.
pub fn spawn(addr: SocketAddr) -> std::io::Result<JoinHandle<()>> {
    serve_on(std::net::TcpListener::bind(addr)?)
}

/// Serves proxy connections on `listener` until the handle is aborted.
pub fn serve_on(listener: std::net::TcpListener) -> std::io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                // A failed client or upstream only ends this connection.
                let _ = serve(client).await;
            });
        }
    }))
}

async fn serve(mut client: TcpStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let read = client.read(&mut buf).await?;
        if read == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..read]);
        if let Some(end) = find(&head, b"\r\n\r\n") {
            break end + 4;
        }
        if head.len() > MAX_HEAD {
            return client.write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\n\r\n").await;
        }
    };
    let text = String::from_utf8_lossy(&head[..head_end]).into_owned();
    let request_line = text.lines().next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let (method, target, version) =
        (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));

    if method.eq_ignore_ascii_case("CONNECT") {
        let Ok(mut upstream) = TcpStream::connect(target).await else {
            return client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        };
        client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
        upstream.write_all(&head[head_end..]).await?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        return Ok(());
    }

    let Some(rest) = target.strip_prefix("http://") else {
        return client
            .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nabsolute-form URL expected\n")
            .await;
    };
    let (authority, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    };
    let upstream_addr =
        if authority.contains(':') { authority.to_owned() } else { format!("{authority}:80") };
    let Ok(mut upstream) = TcpStream::connect(upstream_addr).await else {
        return client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
    };
    // Origin-form towards the server, and one request per connection so the
    // tunnel below can simply copy until either side closes.
    let mut forwarded = format!("{method} {path} {version}\r\n");
    for line in text.lines().skip(1).filter(|line| !line.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
        if name != "proxy-connection" && name != "connection" {
            forwarded.push_str(line);
            forwarded.push_str("\r\n");
        }
    }
    forwarded.push_str("Connection: close\r\n\r\n");
    upstream.write_all(forwarded.as_bytes()).await?;
    upstream.write_all(&head[head_end..]).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An origin that answers every connection with a fixed response.
    async fn origin() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut head = [0u8; 1024];
                    let _ = stream.read(&mut head).await;
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\norigin")
                        .await;
                });
            }
        });
        addr
    }

    async fn exchange(proxy: SocketAddr, request: String) -> String {
        let mut stream = TcpStream::connect(proxy).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn absolute_form_requests_and_connect_tunnels_reach_the_origin() {
        let origin = origin().await;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = listener.local_addr().unwrap();
        let task = serve_on(listener).unwrap();
        let plain =
            exchange(proxy, format!("GET http://{origin}/x HTTP/1.1\r\nHost: {origin}\r\n\r\n"))
                .await;
        assert!(plain.starts_with("HTTP/1.1 200") && plain.ends_with("origin"), "{plain}");
        let tunnelled = exchange(
            proxy,
            format!("CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n\r\nGET /x HTTP/1.1\r\nHost: {origin}\r\n\r\n"),
        )
        .await;
        assert!(tunnelled.contains("200") && tunnelled.ends_with("origin"), "{tunnelled}");
        task.abort();
    }
}
