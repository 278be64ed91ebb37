//! TLS termination on the public listener (`--tls-listen`, `[gateway.tls]`): keys never cross a
//! network in clear.
//!
//! rustls, through pingora's own TLS listener, rather than OpenSSL: its protocol code is
//! memory-safe, it speaks only TLS 1.2 and 1.3 with AEAD cipher suites and forward secrecy
//! (nothing else to switch off; `gateway.tls.min_version = "1.3"` leaves TLS 1.2 out too), and
//! its certificate resolver lets `SIGHUP` swap the certificate for new handshakes while
//! established connections go on undisturbed.
//!
//! Its cryptography is aws-lc-rs (AWS's BoringSSL descendant, built with the binary: no system
//! library), not the ring that pingora installs: of rustls's two providers only aws-lc-rs has
//! the hybrid post-quantum key exchange X25519MLKEM768, which current browsers and TLS libraries
//! offer first, so that traffic recorded today cannot be read by a quantum computer later.
//! rustls takes the first group of the client's list that it has, so a client that does not
//! offer it gets X25519 or an ECDHE curve, as before, with no extra round trip
//! ([`install_crypto_provider`]).
//!
//! Certificates are checked when loaded, so a bad file is a clear error at start (and in
//! `check-config`) naming the file: missing or unreadable, no PEM certificate or key in it, a
//! key that does not belong to the certificate, or a certificate expired or not yet valid. A key
//! file every user of the machine may read is loaded, with a warning ([`exposed_secrets`]).

use std::any::Any;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::listeners::TlsAccept;
use pingora::listeners::tls::TlsSettings;
use pingora::protocols::tls::TlsRef;
use pingora::tls::sign::CertifiedKey;
use pingora::tls::{CertificateDer, ClientHello, PrivateKeyDer, ResolvesServerCert};
use rustls::crypto::aws_lc_rs::{self, kx_group};
use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::{SupportedProtocolVersion, version};
use rustls_pki_types::pem::{self, PemObject};
use serde::Deserialize;

use crate::metrics;

mod tickets;

/// The files of the TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate, leaf first, intermediates after it.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Session ticket keys shared with other gateways, the first encrypting (none: keys of this
    /// process's own).
    pub ticket_keys: Vec<PathBuf>,
    /// Whether the listener gives session tickets at all.
    pub session_tickets: bool,
    /// The oldest version the listener speaks; fixed while it runs.
    pub min_version: MinVersion,
}

/// The oldest TLS version the listener speaks (`gateway.tls.min_version`): 1.2 by default, as
/// the contract has it and as every client of the last decade speaks; 1.3 for deployments whose
/// policy forbids 1.2 (nginx's `ssl_protocols TLSv1.3`), where a 1.2-only client is refused in
/// the handshake with a `protocol_version` alert.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MinVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    Tls12,
    /// TLS 1.3 alone.
    Tls13,
}

impl<'de> Deserialize<'de> for MinVersion {
    /// `"1.2"` or `"1.3"`; the number `1.3`, which TOML reads as a float, is refused with the
    /// way to write it.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<MinVersion, D::Error> {
        struct Version;
        impl serde::de::Visitor<'_> for Version {
            type Value = MinVersion;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"1.2\" or \"1.3\"")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<MinVersion, E> {
                match v {
                    "1.2" => Ok(MinVersion::Tls12),
                    "1.3" => Ok(MinVersion::Tls13),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }

            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<MinVersion, E> {
                Err(E::custom(format!(
                    "a TLS version is written in quotes: min_version = \"{v}\""
                )))
            }
        }
        deserializer.deserialize_any(Version)
    }
}

static TLS12_AND_13: &[&SupportedProtocolVersion] = &[&version::TLS13, &version::TLS12];
static TLS13_ONLY: &[&SupportedProtocolVersion] = &[&version::TLS13];

impl MinVersion {
    /// The versions the listener offers to negotiate.
    fn versions(self) -> &'static [&'static SupportedProtocolVersion] {
        match self {
            MinVersion::Tls12 => TLS12_AND_13,
            MinVersion::Tls13 => TLS13_ONLY,
        }
    }
}

/// Why a certificate or key cannot be used; always names the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct TlsError {
    path: PathBuf,
    message: String,
}

fn error(path: &Path, message: impl Into<String>) -> TlsError {
    TlsError {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// Checks session ticket key files as a start would (`check-config`).
pub fn check_ticket_keys(files: &[PathBuf]) -> Result<(), TlsError> {
    tickets::read(files, true).map(|_| ())
}

/// Reads and checks the certificate and key, for use at `now`.
pub fn load(files: &TlsFiles, now: SystemTime) -> Result<Arc<CertifiedKey>, TlsError> {
    let read =
        |path: &Path| std::fs::read(path).map_err(|e| error(path, format!("cannot read it: {e}")));
    let cert_pem = read(&files.cert)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            error(
                &files.cert,
                format!("not a PEM certificate: {}", pem_problem(e)),
            )
        })?;
    let Some(leaf) = chain.first() else {
        return Err(error(
            &files.cert,
            "no certificate in it (expected -----BEGIN CERTIFICATE-----)",
        ));
    };
    check_validity(&files.cert, leaf, now)?;
    let key_pem = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        error(
            &files.key,
            format!("no PEM private key in it: {}", pem_problem(e)),
        )
    })?;
    install_crypto_provider();
    let provider = CryptoProvider::get_default().expect("installed just above");
    let signer = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| error(&files.key, format!("unusable private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|_| {
        error(
            &files.key,
            format!(
                "this key does not belong to the certificate in {}",
                files.cert.display()
            ),
        )
    })?;
    Ok(Arc::new(certified))
}

/// The key exchange groups offered, in order: the hybrid post-quantum one, then the classic
/// ones in browsers' order. As a server, the gateway takes the first of the *client's* list that
/// it has, so this order matters when it is the client (of its upstreams and of Redis): a
/// client sends key shares for the first group and, since it is a hybrid, for X25519 too, and a
/// server that chooses by the client's list (rustls does) must then find X25519 next, or it asks
/// for a second ClientHello. rustls's own default puts SECP384R1 second.
const KEY_EXCHANGE_GROUPS: [&dyn SupportedKxGroup; 4] = [
    kx_group::X25519MLKEM768,
    kx_group::X25519,
    kx_group::SECP256R1,
    kx_group::SECP384R1,
];

/// Makes rustls on aws-lc-rs the process's TLS cryptography, offering X25519MLKEM768, X25519,
/// P-256 and P-384, in that order (`KEY_EXCHANGE_GROUPS` says why).
/// pingora builds the listener's configuration, and its upstream connector, from the process's
/// provider, and installs ring's only if none is installed yet, so this must run before pingora
/// does: the binary calls it first in `main`, and [`load`] calls it before it reads a key.
///
/// Does nothing if a provider is installed already (this one, or one a program embedding the
/// gateway chose).
pub fn install_crypto_provider() {
    let provider = CryptoProvider {
        kx_groups: KEY_EXCHANGE_GROUPS.to_vec(),
        ..aws_lc_rs::default_provider()
    };
    // An error only says that a provider was installed first.
    let _ = provider.install_default();
}

/// What is wrong with a PEM file, in words: rustls-pki-types shows the lines it quotes as lists
/// of byte values.
fn pem_problem(e: pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "it is cut off: no -----END {}----- line",
            String::from_utf8_lossy(&end_marker)
        ),
        pem::Error::IllegalSectionStart { line } => format!(
            "a malformed -----BEGIN line: {}",
            String::from_utf8_lossy(&line).trim_end()
        ),
        other => other.to_string(),
    }
}

fn check_validity(path: &Path, leaf: &CertificateDer<'_>, now: SystemTime) -> Result<(), TlsError> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| error(path, format!("the first certificate does not parse: {e}")))?;
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let validity = cert.validity();
    if now > validity.not_after.timestamp() {
        return Err(error(
            path,
            format!("the certificate expired on {}", validity.not_after),
        ));
    }
    if now < validity.not_before.timestamp() {
        return Err(error(
            path,
            format!(
                "the certificate is not valid before {}",
                validity.not_before
            ),
        ));
    }
    Ok(())
}

/// The CA certificates in a PEM file, for verifying a route's upstream.
pub fn load_ca(path: &Path) -> Result<Vec<pingora::utils::tls::WrappedX509>, TlsError> {
    Ok(read_ca(path)?
        .1
        .into_iter()
        .map(|der| {
            pingora::utils::tls::WrappedX509::new(der.to_vec(), pingora::utils::tls::parse_x509)
        })
        .collect())
}

/// A PEM file of CA certificates, checked, as the file's bytes (for a client that reads PEM).
pub fn ca_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    Ok(read_ca(path)?.0)
}

/// A PEM file of CA certificates: its bytes, and the certificates, each checked to parse.
fn read_ca(path: &Path) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), TlsError> {
    let pem = std::fs::read(path).map_err(|e| error(path, format!("cannot read it: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(path, format!("not a PEM certificate: {}", pem_problem(e))))?;
    if certs.is_empty() {
        return Err(error(path, "no certificate in it"));
    }
    for der in &certs {
        x509_parser::parse_x509_certificate(der)
            .map_err(|e| error(path, format!("a certificate does not parse: {e}")))?;
    }
    Ok((pem, certs))
}

/// The certificate the TLS listener presents and the keys of its session tickets, both
/// swappable while it runs.
pub struct CertResolver {
    current: ArcSwap<CertifiedKey>,
    ticket_keys: tickets::SharedKeys,
}

impl TlsFiles {
    /// Warnings for the secret files among these that every user of the machine may read or
    /// write ([`exposed_secrets`]).
    pub fn exposed(&self) -> Vec<String> {
        exposed_secrets(Some(&self.key), &self.ticket_keys)
    }
}

/// The warnings for `key` (the listener's private key, if any) and `ticket_keys`: one for each
/// file that users other than its owner and group may read or write
/// ([`secret_files`](crate::secret_files)).
pub fn exposed_secrets(key: Option<&Path>, ticket_keys: &[PathBuf]) -> Vec<String> {
    let key = key.map(|path| (path, "the TLS private key"));
    let tickets = ticket_keys
        .iter()
        .map(|path| (path.as_path(), "a session ticket key"));
    key.into_iter()
        .chain(tickets)
        .filter_map(|(path, what)| crate::secret_files::open_to_others(path, what))
        .collect()
}

impl CertResolver {
    /// Loads the certificate and the ticket keys now; fails with the file at fault.
    pub fn load(files: &TlsFiles) -> Result<Arc<CertResolver>, TlsError> {
        let current = load(files, SystemTime::now())?;
        let ticket_keys = tickets::read(&files.ticket_keys, files.session_tickets)?;
        Ok(Arc::new(CertResolver {
            current: ArcSwap::new(current),
            ticket_keys: Arc::new(ArcSwap::from_pointee(ticket_keys)),
        }))
    }

    /// Reads `files` (the configuration's as it now stands); new handshakes get the new
    /// certificate and tickets made and opened with the new keys, open connections keep their
    /// certificate. A file with an error changes nothing, neither certificate nor keys.
    pub fn reload(&self, files: &TlsFiles) -> Result<(), TlsError> {
        let fresh = load(files, SystemTime::now())?;
        let ticket_keys = tickets::read(&files.ticket_keys, files.session_tickets)?;
        self.current.store(fresh);
        self.ticket_keys.store(Arc::new(ticket_keys));
        Ok(())
    }

    /// pingora's listener settings: the versions from `min_version` on, this resolver, HTTP/2
    /// offered before HTTP/1.1, and session tickets, so that a returning client resumes its
    /// session however many others came in between: rustls's stateful cache, the only
    /// resumption without a ticketer, holds the last 256 sessions. Tickets are RFC 5077's construction (AES-256-CBC and HMAC-SHA256) under the
    /// keys of `gateway.tls.ticket_keys`, shared by a fleet (`tls/tickets.rs`); without them, under
    /// [`aws_lc_rs::Ticketer`]'s, which makes a key from the system's random numbers every six
    /// hours and keeps the one before to decrypt, so a ticket serves 12 hours at most, never
    /// written anywhere: a ticket from another gateway, or from before a restart, gets a full
    /// handshake. A TLS 1.3 resumption still agrees a fresh key (rustls accepts only
    /// `psk_dhe_ke`), so the ticket key alone does not open its traffic; a TLS 1.2 ticket holds
    /// its session's secret, which is why keys are rotated.
    ///
    /// Each completed handshake is counted in [`metrics::TLS_HANDSHAKES`].
    pub fn listener_settings(
        self: &Arc<Self>,
        min_version: MinVersion,
    ) -> Result<TlsSettings, rustls::Error> {
        let mut settings = TlsSettings::with_callbacks(Box::new(HandshakeCounter))
            .expect("settings without files cannot fail");
        settings.set_protocol_versions(min_version.versions());
        settings.set_cert_resolver(self.clone());
        settings.enable_h2();
        settings.set_ticketer(Arc::new(tickets::Tickets::new(
            self.ticket_keys.clone(),
            aws_lc_rs::Ticketer::new()?,
        )));
        Ok(settings)
    }
}

/// Counts each handshake the listener completes, by version and by whether it resumed.
struct HandshakeCounter;

#[async_trait]
impl TlsAccept for HandshakeCounter {
    async fn handshake_complete_callback(
        &self,
        tls: &TlsRef,
    ) -> Option<Arc<dyn Any + Send + Sync>> {
        let session = if tls.session_reused() {
            "resumed"
        } else {
            "full"
        };
        // rustls names versions as its enum's variants ("TLSv1_3"); written as OpenSSL and
        // nginx write them.
        let version = match tls.version() {
            Some("TLSv1_3") => "TLSv1.3",
            Some("TLSv1_2") => "TLSv1.2",
            Some(other) => other,
            None => "unknown",
        };
        metrics::TLS_HANDSHAKES
            .with_label_values(&[version, session])
            .inc();
        None
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl fmt::Debug for CertResolver {
    /// Neither the certificate's key nor the ticket keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertResolver").finish_non_exhaustive()
    }
}
