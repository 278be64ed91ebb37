//! Upstreams for the gateway to proxy to: one that echoes what it was sent after a set delay, and
//! one that reads requests and never answers.

use super::*;

/// A tiny upstream for routing tests: answers every request with 200 and a JSON echo of its
/// path and headers, after an optional delay; counts the requests it saw and the connections
/// they came on.
pub struct TestUpstream {
    pub addr: SocketAddr,
    pub hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The key exchange group and handshake kind of each TLS connection accepted, in order.
    groups: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: tokio::sync::watch::Sender<bool>,
    /// Ends (`recv` gives `None`) when the listener and every connection are closed: each task
    /// holds a sender.
    running: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<()>>,
}

impl TestUpstream {
    pub async fn start(delay: Duration) -> TestUpstream {
        Self::start_with(delay, None).await
    }

    /// An upstream that speaks HTTPS with `tls` (see [`tls::TestCa::acceptor`]).
    pub async fn start_tls(tls: tokio_rustls::TlsAcceptor) -> TestUpstream {
        Self::start_with(Duration::ZERO, Some(tls)).await
    }

    async fn start_with(delay: Duration, tls: Option<tokio_rustls::TlsAcceptor>) -> TestUpstream {
        Self::serve("127.0.0.1:0".parse().unwrap(), delay, tls).await
    }

    /// An upstream on `addr` (to bring one back where it was).
    pub async fn start_at(addr: SocketAddr) -> TestUpstream {
        Self::serve(addr, Duration::ZERO, None).await
    }

    /// Closes the listener and every connection, and returns when they are closed: the
    /// instance is gone, and cannot answer a request sent after this.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let _ = self.running.lock().await.recv().await;
    }

    async fn serve(
        addr: SocketAddr,
        delay: Duration,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> TestUpstream {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepts = connections.clone();
        let groups = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let agreed = groups.clone();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut accept_stopped = stopped.clone();
        let (alive, running) = tokio::sync::mpsc::channel::<()>(1);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = accept_stopped.changed() => break,
                };
                let Ok((stream, _)) = accepted else {
                    break;
                };
                accepts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (counter, tls, agreed) = (counter.clone(), tls.clone(), agreed.clone());
                let mut conn_stopped = stopped.clone();
                let alive = alive.clone();
                tokio::spawn(async move {
                    let serve = async move {
                        match tls {
                            None => echo(stream, counter, delay).await,
                            Some(tls) => {
                                if let Ok(stream) = tls.accept(stream).await {
                                    let tls = stream.get_ref().1;
                                    let group = tls.negotiated_key_exchange_group();
                                    agreed.lock().unwrap().push(format!(
                                        "{:?} {:?}",
                                        group.map(|g| g.name()),
                                        tls.handshake_kind()
                                    ));
                                    echo(stream, counter, delay).await;
                                }
                            }
                        }
                    };
                    tokio::select! {
                        () = serve => {}
                        _ = conn_stopped.changed() => {}
                    }
                    drop(alive);
                });
            }
            drop(listener);
            drop(alive);
        });
        TestUpstream {
            addr,
            hits,
            connections,
            groups,
            stop,
            running: tokio::sync::Mutex::new(running),
        }
    }

    /// The key exchange group each TLS connection agreed on and how its handshake went, as
    /// `Some(GROUP) Some(KIND)`, in order.
    pub fn key_exchange_groups(&self) -> Vec<String> {
        self.groups.lock().unwrap().clone()
    }

    pub fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many connections it has accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Answers each request on `stream` with 200 and a JSON echo of its path and headers (`HEAD`
/// with the head alone).
async fn echo<S>(
    stream: S,
    counter: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    delay: Duration,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let mut stream = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if stream.read_line(&mut request_line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut headers = serde_json::Map::new();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((n, v)) = line.split_once(':') {
                let n = n.trim().to_ascii_lowercase();
                if n == "content-length" {
                    length = v.trim().parse().unwrap_or(0);
                }
                headers.insert(n, serde_json::Value::String(v.trim().to_owned()));
            }
        }
        let mut body = vec![0u8; length];
        if stream.read_exact(&mut body).await.is_err() {
            return;
        }
        counter.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(delay).await;
        let path = request_line.split(' ').nth(1).unwrap_or("").to_owned();
        let echo = serde_json::json!({"path": path, "headers": headers}).to_string();
        // The answer to HEAD is GET's head alone (RFC 9110, section 9.3.2).
        let body = if request_line.starts_with("HEAD ") {
            ""
        } else {
            &echo
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            echo.len()
        );
        if stream
            .get_mut()
            .write_all(response.as_bytes())
            .await
            .is_err()
        {
            return;
        }
        let _ = stream.get_mut().flush().await;
    }
}

/// A request head read from `stream` a byte at a time (so that nothing after it is read), up to
/// and with its blank line; `None` if the stream ends or fails first.
pub fn read_request_head(stream: &mut impl std::io::Read) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).unwrap_or(0) == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(head)
}

/// An upstream that reads one request head and never answers. The first receiver gets a message
/// when the head has arrived; the second says what became of the connection within 10 s after
/// it: `"closed"` (the gateway closed it), `"more bytes"` or `"still open after 10 s"`.
pub fn silent_upstream() -> (
    SocketAddr,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Receiver<&'static str>,
) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived, head_read) = std::sync::mpsc::channel();
    let (saw, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        if read_request_head(&mut stream).is_none() {
            return;
        }
        let _ = arrived.send(());
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let _ = saw.send(match stream.read(&mut [0u8; 1]) {
            Ok(0) => "closed",
            Ok(_) => "more bytes",
            Err(_) => "still open after 10 s",
        });
    });
    (addr, head_read, seen)
}
