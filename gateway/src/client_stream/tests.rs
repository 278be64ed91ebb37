//! Unit tests of [`super`] (`client_stream.rs`).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

use super::*;

fn buffered() -> (ClientStream, DuplexStream) {
    let (ours, theirs) = duplex(64 * 1024);
    let stream = ClientStream {
        inner: Box::new(ours),
        buf: Vec::new(),
        written: 0,
        heads: None,
        answering: AtomicU8::new(GATEWAY),
        sent: AtomicBool::new(false),
        retraction: ArcSwapOption::empty(),
        holding: AtomicBool::new(false),
        line: AtomicU8::new(request_line::VALID),
        refusals: None,
    };
    (stream, theirs)
}

/// As [`buffered`], with its reads cut at request heads, as on an HTTP/1 connection.
fn reading() -> (ClientStream, DuplexStream) {
    let (mut stream, peer) = buffered();
    stream.heads = Some(Heads::default());
    (stream, peer)
}

/// What the peer has received so far, without waiting for more.
async fn received(peer: &mut DuplexStream) -> Vec<u8> {
    let mut got = vec![0; 64 * 1024];
    match tokio::time::timeout(Duration::from_millis(50), peer.read(&mut got)).await {
        Ok(n) => got.truncate(n.unwrap()),
        Err(_) => got.clear(),
    }
    got
}

#[tokio::test]
async fn the_wait_for_a_request_holds_what_arrives_for_the_requests_reads() {
    /// Whether the wait for a request is still waiting after a while.
    async fn waits(stream: &mut ClientStream) -> bool {
        let wait = stream.read(&mut []);
        tokio::time::timeout(Duration::from_millis(50), wait)
            .await
            .is_err()
    }
    let (mut stream, mut peer) = reading();
    // Nothing has arrived: the wait waits (and, given up, loses nothing).
    assert!(waits(&mut stream).await);
    peer.write_all(b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(stream.read(&mut []).await.unwrap(), 0);
    // What the wait read is the requests' reads, a head at a time.
    let mut head = [0; 64];
    let n = stream.read(&mut head).await.unwrap();
    assert_eq!(&head[..n], b"GET /a HTTP/1.1\r\n\r\n");
    assert_eq!(stream.read(&mut []).await.unwrap(), 0);
    let n = stream.read(&mut head).await.unwrap();
    assert_eq!(&head[..n], b"GET /b HTTP/1.1\r\n\r\n");
    // All of it taken: the next wait waits for the client again.
    assert!(waits(&mut stream).await);
    peer.write_all(b"GET /c HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(stream.read(&mut []).await.unwrap(), 0);
    let n = stream.read(&mut head).await.unwrap();
    assert_eq!(&head[..n], b"GET /c HTTP/1.1\r\n\r\n");
}

#[tokio::test]
async fn each_request_line_is_checked_in_the_bytes_the_client_sent() {
    /// The next request head read on `stream`, and whether its line failed the check.
    async fn next_head(stream: &mut Stream) -> (String, bool) {
        ClientStream::expect_request(stream);
        let mut head = [0; 64];
        let n = stream.read(&mut head).await.unwrap();
        let head = String::from_utf8_lossy(&head[..n]).into_owned();
        (head, ClientStream::request_line_invalid(stream))
    }
    let (stream, mut peer) = reading();
    let mut stream: Stream = Box::new(stream);
    let post = "POST /a HTTP/1.1\r\nContent-Length: 6\r\n\r\n";
    peer.write_all(post.as_bytes()).await.unwrap();
    assert_eq!(next_head(&mut stream).await, (post.to_owned(), false));
    // A body is not a request line, whatever its bytes.
    peer.write_all(b"a b\x01\r\n").await.unwrap();
    stream.read_exact(&mut [0; 6]).await.unwrap();
    assert!(!ClientStream::request_line_invalid(&stream));
    // Two requests in one read: each line is checked on its own.
    peer.write_all(b"GET /a b HTTP/1.1\r\n\r\nGET /c HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let invalid = "GET /a b HTTP/1.1\r\n\r\n".to_owned();
    assert_eq!(next_head(&mut stream).await, (invalid, true));
    let valid = "GET /c HTTP/1.1\r\n\r\n".to_owned();
    assert_eq!(next_head(&mut stream).await, (valid, false));
}

#[tokio::test]
async fn a_response_leaves_whole_at_its_flush_and_the_buffer_goes_with_it() {
    let (mut stream, mut peer) = buffered();
    stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
    stream.write_all(b"[]").await.unwrap();
    assert_eq!(received(&mut peer).await, b"");
    assert_eq!(stream.buf.capacity(), CAPACITY);

    stream.flush().await.unwrap();
    assert_eq!(received(&mut peer).await, b"HTTP/1.1 200 OK\r\n\r\n[]");
    assert_eq!(
        stream.buf.capacity(),
        0,
        "an idle connection holds no buffer"
    );
}

#[tokio::test]
async fn a_large_write_goes_straight_through_after_what_was_gathered() {
    let (mut stream, mut peer) = buffered();
    let body = vec![b'x'; CAPACITY + 1];
    stream.write_all(b"head").await.unwrap();
    stream.write_all(&body).await.unwrap();
    stream.write_all(b"tail").await.unwrap();
    stream.flush().await.unwrap();

    let mut got = Vec::new();
    while got.len() < 4 + body.len() + 4 {
        got.extend(received(&mut peer).await);
    }
    assert_eq!(&got[..4], b"head");
    assert_eq!(&got[4..4 + body.len()], &body[..]);
    assert_eq!(&got[4 + body.len()..], b"tail");
}

/// Refusals as the public listener's, with a budget of 60 failed authentications a minute.
fn refusals() -> Arc<EarlyRefusals> {
    let config: crate::config::GatewayConfig = toml::from_str("").unwrap();
    let settings = crate::settings::Settings::new(&config, "127.0.0.1:8081".parse().unwrap());
    let live = Arc::new(arc_swap::ArcSwap::from_pointee(settings.unwrap()));
    let failures = Arc::new(crate::auth::FailureBudget::new(60));
    Arc::new(EarlyRefusals::new(
        live,
        failures,
        crate::rate_headers::address_policy(60),
    ))
}

#[tokio::test]
async fn pingora_refusals_are_replaced_until_the_proxy_has_the_request() {
    let (mut stream, mut peer) = buffered();
    stream.refusals = Some(refusals());
    *stream.answering.get_mut() = PINGORA;
    stream
        .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        .await
        .unwrap();
    stream.flush().await.unwrap();
    let got = String::from_utf8(received(&mut peer).await).unwrap();
    assert!(got.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{got}");
    assert!(got.contains("\r\nX-RateLimit-Limit: 60\r\n"), "{got}");
    assert!(got.contains("\r\nX-RateLimit-Remaining: 60\r\n"), "{got}");
    assert!(got.contains("\r\nConnection: close\r\n"), "{got}");
    assert!(got.ends_with(r#""code":"invalid_request","message":"the request is not valid HTTP/1.1: its request line or a header cannot be parsed, its Host is given twice or differs from the host in its target, or its headers are too large","status":400}"#), "{got}");

    // Once the proxy has the request, its 400 is its own.
    let (mut stream, mut peer) = buffered();
    *stream.answering.get_mut() = PINGORA;
    let own = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}";
    let boxed: Stream = Box::new(stream);
    ClientStream::mark_answering(&boxed);
    let mut stream = boxed;
    stream.write_all(own).await.unwrap();
    stream.flush().await.unwrap();
    assert_eq!(received(&mut peer).await, own);
}

#[tokio::test]
async fn a_response_is_taken_back_until_some_of_it_has_left() {
    let (mut stream, mut peer) = buffered();
    stream.heads = Some(Heads::default());
    let mut stream: Stream = Box::new(stream);
    stream
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n")
        .await
        .unwrap();
    stream.write_all(b"[1,").await.unwrap();
    assert!(ClientStream::retract(
        &stream,
        b"HTTP/1.1 502 Bad Gateway\r\n\r\n".to_vec()
    ));
    // What pingora writes after it is dropped.
    stream.write_all(b"2]").await.unwrap();
    Shutdown::shutdown(&mut *stream).await;
    assert_eq!(
        received(&mut peer).await,
        b"HTTP/1.1 502 Bad Gateway\r\n\r\n"
    );

    let (mut stream, mut peer) = buffered();
    stream.heads = Some(Heads::default());
    let mut stream: Stream = Box::new(stream);
    stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
    stream.flush().await.unwrap();
    assert!(!ClientStream::retract(
        &stream,
        b"HTTP/1.1 502 Bad Gateway\r\n\r\n".to_vec()
    ));
    stream.write_all(b"[]").await.unwrap();
    stream.flush().await.unwrap();
    assert_eq!(received(&mut peer).await, b"HTTP/1.1 200 OK\r\n\r\n[]");
    // The next request's response can be taken back again.
    ClientStream::mark_answering(&stream);
    assert!(ClientStream::unsent(&stream));
}

#[tokio::test]
async fn shutting_down_writes_what_is_gathered_first() {
    let (mut stream, mut peer) = buffered();
    stream.write_all(b"last words").await.unwrap();
    Shutdown::shutdown(&mut stream).await;
    assert_eq!(received(&mut peer).await, b"last words");
}
