//! Routing, forwarding, deprecation, upstream failures, path safety and connection handling,
//! through the real binary: one test binary, a module per concern.

#[path = "../common/mod.rs"]
mod common;

mod bodies;
mod connections;
mod forwarding;
mod listeners;
mod parser_refusals;
mod refusals;
mod routing;

use std::time::{Duration, Instant};

use common::{
    PETS_ROUTE, Stack, TestUpstream, assert_error, client, header, key_id, links, metric, raw_http,
    wait_metric,
};
use serde_json::{Value, json};

fn orders_route(upstream: &TestUpstream, extra: &str) -> String {
    format!(
        "{PETS_ROUTE}\n[[gateway.routes]]\nprefix = \"/v1/store/orders\"\nupstream = \"{}\"\n{extra}\n",
        upstream.addr
    )
}

/// The answer to `request` on a new connection, and whether the gateway closed the connection
/// after it (rather than leaving it open for 20 s).
fn answer_and_close(addr: std::net::SocketAddr, request: &str) -> (String, bool) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let closed = stream.read_to_end(&mut answer).is_ok();
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

/// A response head read from `s` up to its blank line, byte by byte so nothing after it is
/// consumed.
fn read_head(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            other => panic!(
                "connection ended after {:?}: {other:?}",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    String::from_utf8(head).unwrap()
}

/// A response read from `s`: its head and its body (of the length the head declares).
fn read_response(s: &mut std::net::TcpStream) -> (String, String) {
    let head = read_head(s);
    let body = read_body(s, &head);
    (head, body)
}

/// The body of the response whose `head` was read from `s`.
fn read_body(s: &mut std::net::TcpStream, head: &str) -> String {
    use std::io::Read;
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .expect("content-length")
        .parse()
        .unwrap();
    let mut body = vec![0; length];
    s.read_exact(&mut body).unwrap();
    String::from_utf8(body).unwrap()
}

/// The connection `s` serves a next request with `key`.
fn assert_next_request_served(s: &mut std::net::TcpStream, key: &str) {
    use std::io::Write;
    write!(
        s,
        "GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    )
    .unwrap();
    let listed = read_head(s);
    assert!(listed.starts_with("HTTP/1.1 200 "), "{listed}");
}

/// An upstream that answers every request with a header in mixed case and hands back the head
/// of each request it received, as the bytes that arrived.
fn raw_upstream() -> (std::net::SocketAddr, std::sync::mpsc::Receiver<String>) {
    scripted_upstream(|_| {
        (
            // Two of the gateway's own names, in another case, that it must replace.
            b"HTTP/1.1 200 Fine Thanks\r\nX-Upstream-Thing: Yes\r\nx-ratelimit-limit: 5\r\nX-REQUEST-ID: from-the-upstream\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]".to_vec(),
            Duration::ZERO,
        )
    })
}

/// An upstream that writes `answer(head)` for each request head it reads (given as the bytes
/// that arrived), waits as long as that says, then closes the connection; it hands back each
/// head too.
fn scripted_upstream(
    answer: fn(&str) -> (Vec<u8>, Duration),
) -> (std::net::SocketAddr, std::sync::mpsc::Receiver<String>) {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (heads, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let heads = heads.clone();
            std::thread::spawn(move || {
                let Some(head) = common::read_request_head(&mut stream) else {
                    return;
                };
                let head = String::from_utf8_lossy(&head).into_owned();
                let (bytes, hold) = answer(&head);
                let _ = heads.send(head);
                let _ = stream.write_all(&bytes);
                std::thread::sleep(hold);
            });
        }
    });
    (addr, received)
}

/// How many header lines of `head` are named `name`, in any case.
fn lines_named(head: &str, name: &str) -> usize {
    head.lines()
        .filter(|line| {
            line.split_once(':')
                .is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
        })
        .count()
}

/// The status codes of the responses in `answers`, in order.
fn statuses(answers: &str) -> Vec<&str> {
    answers
        .match_indices("HTTP/1.1 ")
        .map(|(at, _)| &answers[at + 9..at + 12])
        .collect()
}

/// The whole answer to `request` on a fresh connection, as text.
fn raw_answer(addr: std::net::SocketAddr, request: &str) -> String {
    answer_and_close(addr, request).0
}
