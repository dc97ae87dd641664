//! The plain-HTTP/1.x server iPXE talks to: GET (and HEAD) only, one
//! request per connection, bounded in header size, time and connections.
//! It takes its listener and shutdown from the caller and asks
//! [`Site::respond`] what to answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use super::image::Served;
use super::service::{Response, Site};

/// The longest request head read.
const MAX_HEAD: usize = 8 * 1024;
/// How long a client has to send its request.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a single write may stall (a slow firmware's TCP stack).
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 64;
const CHUNK: usize = 64 * 1024;

/// Serves until `shutdown` changes.
pub async fn serve(listener: TcpListener, site: Arc<Site>, mut shutdown: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let site = site.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, peer, &site).await {
                tracing::debug!(peer = %peer, error = %e, "connection ended");
            }
            drop(permit);
        });
    }
}

async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    site: &Arc<Site>,
) -> std::io::Result<()> {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) => {
            reply(&mut stream, 431, "request head too large\n", false).await?;
            return linger(&mut stream).await;
        }
        Ok(Err(e)) => return Err(e),
        Err(_) => return Ok(()),
    };
    let Some((method, target)) = request_line(&head) else {
        return reply(&mut stream, 400, "bad request\n", false).await;
    };
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return reply(&mut stream, 405, "GET only\n", false).await;
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match site.respond(path, query, peer.ip()).await {
        Response::Script(text) => reply(&mut stream, 200, &text, head_only).await,
        Response::NotFound => reply(&mut stream, 404, "not found\n", head_only).await,
        Response::File(served) => send_file(&mut stream, &served, head_only).await,
    }
}

/// Reads (and drops) what the client still sends, briefly, so that closing
/// with unread bytes does not reset the connection before it read our answer.
async fn linger(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut sink = [0u8; 4096];
    let drain = async {
        let mut total = 0usize;
        while total < 64 * 1024 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
    Ok(())
}

/// Reads up to the blank line; None when it is longer than [`MAX_HEAD`].
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            if end > MAX_HEAD {
                return Ok(None);
            }
            buf.truncate(end);
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `GET /path?query HTTP/1.1` → (method, target).
fn request_line(head: &str) -> Option<(&str, &str)> {
    let line = head.lines().next()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none() && version.starts_with("HTTP/1.") && target.starts_with('/'))
        .then_some((method, target))
}

fn status_text(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    }
}

async fn write(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(bytes))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

async fn reply(
    stream: &mut TcpStream,
    code: u16,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        status_text(code),
        body.len()
    );
    write(stream, head.as_bytes()).await?;
    if !head_only {
        write(stream, body.as_bytes()).await?;
    }
    stream.shutdown().await
}

/// The file's first `len` bytes, then its suffix.
async fn send_file(
    stream: &mut TcpStream,
    served: &Served,
    head_only: bool,
) -> std::io::Result<()> {
    let mut file = match tokio::fs::File::open(&served.path).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %served.path.display(), error = %e, "cannot open a ramdisk file");
            return reply(stream, 404, "not found\n", head_only).await;
        }
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        served.total()
    );
    write(stream, head.as_bytes()).await?;
    if head_only {
        return stream.shutdown().await;
    }
    let mut left = served.len;
    let mut buf = vec![0u8; CHUNK];
    while left > 0 {
        let want = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
        let n = file.read(&mut buf[..want]).await?;
        if n == 0 {
            // Shorter than at start: the client sees a short body.
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        write(stream, &buf[..n]).await?;
        left -= n as u64;
    }
    write(stream, &served.suffix).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::request_line;

    #[test]
    fn only_origin_form_http1_request_lines() {
        assert_eq!(
            request_line("GET /boot.ipxe?mac=x HTTP/1.1\r\nHost: a"),
            Some(("GET", "/boot.ipxe?mac=x"))
        );
        assert_eq!(request_line("GET http://a/ HTTP/1.1"), None);
        assert_eq!(request_line("GET / HTTP/2"), None);
        assert_eq!(request_line("GET  / HTTP/1.1"), None);
    }
}
