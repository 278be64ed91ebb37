//! What a TLS 1.3 handshake costs the gateway's side (`cargo bench -p animal-store-gateway
//! --bench handshake`), by key exchange group and crypto provider, full and resumed: the
//! server's work only (its reads, its processing and its writes are timed; the client's between
//! them are not), in memory, with an ECDSA P-256 certificate as `bench/run.py` uses.
//!
//! Full handshakes on three servers: ring's provider with X25519 (what pingora installs, and
//! what the gateway ran on before aws-lc-rs), aws-lc-rs with X25519 (what a client without
//! post-quantum groups gets now), and aws-lc-rs with X25519MLKEM768 (what current browsers get).
//! Each is rustls's default provider of its kind, as `gateway/src/tls.rs` installs it, narrowed
//! to the one group the client offers, which is the group the gateway would pick for such a
//! client. The aws-lc-rs servers issue session tickets, as the gateway does; resumed handshakes
//! (a ticket from the handshake before, and a fresh key exchange) are measured on those two.

use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use rustls::crypto::{CryptoProvider, SupportedKxGroup, aws_lc_rs, ring};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{
    ClientConfig, ClientConnection, Connection, HandshakeKind, RootCertStore, ServerConfig,
    ServerConnection,
};

/// A self-signed P-256 certificate for `localhost`, and its key.
fn certificate() -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    (cert.der().clone(), key)
}

/// `provider` with only `group` to exchange keys with.
fn only(provider: CryptoProvider, group: &'static dyn SupportedKxGroup) -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        kx_groups: vec![group],
        ..provider
    })
}

/// Moves what `from` has to send into `to`, adding the server's side of it to `server`: its
/// writes when it is `from`, its reads and processing when it is `to`.
fn transfer(from: &mut Connection, to: &mut Connection, server: &mut Duration) {
    let mut wire = Vec::new();
    let started = Instant::now();
    while from.wants_write() {
        from.write_tls(&mut wire).unwrap();
    }
    let written = started.elapsed();
    let started = Instant::now();
    let mut rest = &wire[..];
    while !rest.is_empty() {
        to.read_tls(&mut rest).unwrap();
        to.process_new_packets().unwrap();
    }
    let read = started.elapsed();
    *server += if matches!(from, Connection::Server(_)) {
        written
    } else {
        read
    };
}

/// One handshake, then one byte from the client, then the server's tickets to the client (which
/// keeps them: the next handshake with `client` offers to resume); returns the server's share
/// of the time, and what kind of handshake it was.
fn handshake(client: &Arc<ClientConfig>, server: &Arc<ServerConfig>) -> (Duration, HandshakeKind) {
    let started = Instant::now();
    let mut s = Connection::Server(ServerConnection::new(server.clone()).unwrap());
    let mut spent = started.elapsed();
    let mut c = Connection::Client(
        ClientConnection::new(client.clone(), "localhost".try_into().unwrap()).unwrap(),
    );
    while c.is_handshaking() || s.is_handshaking() {
        transfer(&mut c, &mut s, &mut spent);
        transfer(&mut s, &mut c, &mut spent);
    }
    c.writer().write_all(b"x").unwrap();
    transfer(&mut c, &mut s, &mut spent);
    let mut byte = [0; 1];
    s.reader().read_exact(&mut byte).unwrap();
    black_box(byte);
    transfer(&mut s, &mut c, &mut spent);
    let Connection::Server(s) = s else {
        unreachable!("made a server above")
    };
    (spent, s.handshake_kind().unwrap())
}

fn handshakes(c: &mut Criterion) {
    let (cert, key) = certificate();
    let mut roots = RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    // Deprecated for what this bench compares: ring's has no post-quantum group.
    #[allow(deprecated)]
    let ring_provider = ring::default_provider();
    // Name, provider, group, and whether the server issues tickets.
    let cases: [(&str, CryptoProvider, &'static dyn SupportedKxGroup, bool); 3] = [
        (
            "ring, X25519 (pingora's provider)",
            ring_provider,
            ring::kx_group::X25519,
            false,
        ),
        (
            "aws-lc-rs, X25519",
            aws_lc_rs::default_provider(),
            aws_lc_rs::kx_group::X25519,
            true,
        ),
        (
            "aws-lc-rs, X25519MLKEM768",
            aws_lc_rs::default_provider(),
            aws_lc_rs::kx_group::X25519MLKEM768,
            true,
        ),
    ];
    let pairs: Vec<_> = cases
        .into_iter()
        .map(|(name, provider, kx, tickets)| {
            let mut server = ServerConfig::builder_with_provider(only(provider, kx))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert.clone()], key.clone_key())
                .unwrap();
            if tickets {
                server.ticketer = aws_lc_rs::Ticketer::new().unwrap();
            }
            // The client on aws-lc-rs always, offering only the group measured, so that its
            // key share is the one the server uses (no second ClientHello).
            let client_group = aws_lc_rs::ALL_KX_GROUPS
                .iter()
                .find(|g| g.name() == kx.name())
                .copied()
                .unwrap();
            let client = ClientConfig::builder_with_provider(only(
                aws_lc_rs::default_provider(),
                client_group,
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
            (name, tickets, Arc::new(client), Arc::new(server))
        })
        .collect();

    let mut group =
        c.benchmark_group("TLS 1.3 full handshake, the server's side, P-256 certificate");
    for (name, _, client, server) in &pairs {
        // A client that keeps no session: every handshake is a full one.
        let mut client = ClientConfig::clone(client);
        client.resumption = rustls::client::Resumption::disabled();
        let client = Arc::new(client);
        group.bench_function(*name, |b| {
            b.iter_custom(|n| {
                (0..n)
                    .map(|_| measured(handshake(&client, server), HandshakeKind::Full))
                    .sum()
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group(
        "TLS 1.3 handshake resumed with a session ticket, the server's side, P-256 certificate",
    );
    for (name, _, client, server) in pairs.iter().filter(|(_, tickets, ..)| *tickets) {
        // The first handshake is a full one and leaves the client a ticket; each resumed one
        // leaves it another.
        measured(handshake(client, server), HandshakeKind::Full);
        group.bench_function(*name, |b| {
            b.iter_custom(|n| {
                (0..n)
                    .map(|_| measured(handshake(client, server), HandshakeKind::Resumed))
                    .sum()
            })
        });
    }
    group.finish();
}

/// The time of a handshake that was of the kind `expected`.
fn measured((spent, kind): (Duration, HandshakeKind), expected: HandshakeKind) -> Duration {
    assert_eq!(kind, expected);
    spent
}

criterion_group!(benches, handshakes);
criterion_main!(benches);
