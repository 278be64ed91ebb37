//! Session ticket keys from files (`[gateway.tls] ticket_keys`), so that every gateway of a fleet,
//! and a gateway after a restart, resumes the sessions any of them gave out.
//!
//! A key file holds 80 random bytes (`openssl rand 80 > ticket.key`), laid out as nginx's
//! `ssl_session_ticket_key` files are: 16 bytes naming the key, 32 of HMAC-SHA256 key, 32 of
//! AES-256 key. The first file's key encrypts new tickets; every listed key decrypts, so a fleet
//! rotates without a full handshake for anyone: a new key is added in second place everywhere,
//! then moved first, and the oldest dropped (each step a `SIGHUP`). A ticket is RFC 5077's
//! recommended construction, as rustls's own ticketer makes it: key name, IV, AES-256-CBC of the
//! session state, HMAC-SHA256 over all three and the state's length. With no files listed, the
//! listener's tickets are rustls's own, under keys this process makes and rotates ([`Tickets`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use aws_lc_rs::cipher::{
    AES_256, AES_CBC_IV_LEN, DecryptionContext, PaddedBlockDecryptingKey, PaddedBlockEncryptingKey,
    UnboundCipherKey,
};
use aws_lc_rs::error::Unspecified;
use aws_lc_rs::{hmac, iv};
use rustls::server::ProducesTickets;

use super::{TlsError, error};

/// A key file's size: name, HMAC key, AES key.
const KEY_FILE_BYTES: usize = 80;
const NAME_BYTES: usize = 16;
const HMAC_KEY_BYTES: usize = 32;
/// Tickets longer than this are refused unread: the gateway's are a few hundred bytes.
const MAX_TICKET_BYTES: usize = 16 * 1024;
/// The lifetime clients are told a ticket has, as rustls's own ticketer tells them. With keys
/// from files, what ends a ticket is its key leaving the list.
const LIFETIME_SECONDS: u32 = 12 * 60 * 60;

/// One key of the list.
struct TicketKey {
    name: [u8; NAME_BYTES],
    hmac: hmac::Key,
    encrypt: PaddedBlockEncryptingKey,
    decrypt: PaddedBlockDecryptingKey,
}

/// What the listener's tickets are made with: the keys of the files, in their order (the first
/// encrypts, all decrypt; none: keys of this process's own), or no tickets at all.
pub struct KeyList {
    keys: Vec<TicketKey>,
    /// `gateway.tls.session_tickets`: false, rustls resumes only from its cache of sessions.
    enabled: bool,
}

/// The key list in force, swapped by `SIGHUP` ([`crate::tls::CertResolver::reload`]).
pub type SharedKeys = Arc<ArcSwap<KeyList>>;

/// Reads and checks the key files (none: an empty list); fails naming the file at fault.
/// Tickets are made only if `enabled`.
pub fn read(files: &[PathBuf], enabled: bool) -> Result<KeyList, TlsError> {
    Ok(KeyList {
        keys: read_keys(files)?,
        enabled,
    })
}

/// The listener's ticketer: the files' keys when there are any, else `own`, rustls's ticketer
/// with keys made by this process and rotated every six hours.
pub struct Tickets {
    keys: SharedKeys,
    own: Arc<dyn ProducesTickets>,
}

impl Tickets {
    /// A ticketer following `keys` as they are swapped.
    pub fn new(keys: SharedKeys, own: Arc<dyn ProducesTickets>) -> Tickets {
        Tickets { keys, own }
    }
}

/// Reads and checks the key files: each exactly [`KEY_FILE_BYTES`], no key name twice.
fn read_keys(files: &[PathBuf]) -> Result<Vec<TicketKey>, TlsError> {
    let mut keys: Vec<TicketKey> = Vec::with_capacity(files.len());
    for path in files {
        let key = read_key(path)?;
        if keys.iter().any(|k| k.name == key.name) {
            return Err(error(
                path,
                "a ticket key listed twice (its first 16 bytes name another file's key)",
            ));
        }
        keys.push(key);
    }
    Ok(keys)
}

fn read_key(path: &Path) -> Result<TicketKey, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| error(path, format!("cannot read it: {e}")))?;
    if bytes.len() != KEY_FILE_BYTES {
        return Err(error(
            path,
            format!(
                "a ticket key file holds exactly {KEY_FILE_BYTES} random bytes (`openssl rand \
                 {KEY_FILE_BYTES}`); this one holds {}",
                bytes.len()
            ),
        ));
    }
    let (name, secrets) = bytes.split_at(NAME_BYTES);
    let (hmac_key, aes_key) = secrets.split_at(HMAC_KEY_BYTES);
    let unusable = |_: Unspecified| error(path, "not a usable AES-256 key");
    let cipher = || UnboundCipherKey::new(&AES_256, aes_key).map_err(unusable);
    Ok(TicketKey {
        name: name.try_into().expect("16 bytes"),
        hmac: hmac::Key::new(hmac::HMAC_SHA256, hmac_key),
        encrypt: PaddedBlockEncryptingKey::cbc_pkcs7(cipher()?).map_err(unusable)?,
        decrypt: PaddedBlockDecryptingKey::cbc_pkcs7(cipher()?).map_err(unusable)?,
    })
}

/// What the MAC covers: key name, IV, the encrypted state's length (2 bytes) and the state.
fn mac_input(name: &[u8], iv: &[u8], state: &[u8]) -> Option<Vec<u8>> {
    let length = u16::try_from(state.len()).ok()?.to_be_bytes();
    Some([name, iv, &length, state].concat())
}

impl ProducesTickets for Tickets {
    /// Asked by rustls at each handshake: false, it sends no ticket, and resumes (TLS 1.2 session
    /// ids, TLS 1.3 tickets that only name a session) from its cache of the last 256 sessions.
    fn enabled(&self) -> bool {
        self.keys.load().enabled
    }

    fn lifetime(&self) -> u32 {
        if self.keys.load().keys.is_empty() {
            self.own.lifetime()
        } else {
            LIFETIME_SECONDS
        }
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let keys = self.keys.load();
        let Some(key) = keys.keys.first() else {
            return self.own.encrypt(plain);
        };
        let mut state = plain.to_vec();
        let context = key.encrypt.encrypt(&mut state).ok()?;
        let iv: &[u8] = (&context).try_into().ok()?;
        let tag = hmac::sign(&key.hmac, &mac_input(&key.name, iv, &state)?);
        Some([&key.name[..], iv, &state, tag.as_ref()].concat())
    }

    /// `ticket` comes from the client: every length is checked before it is split, and the MAC
    /// (compared in constant time) before anything is decrypted.
    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        let keys = self.keys.load();
        if keys.keys.is_empty() {
            return self.own.decrypt(ticket);
        }
        if ticket.len() > MAX_TICKET_BYTES {
            return None;
        }
        let (name, rest) = ticket.split_at_checked(NAME_BYTES)?;
        let (iv, rest) = rest.split_at_checked(AES_CBC_IV_LEN)?;
        let tag_bytes = hmac::HMAC_SHA256.digest_algorithm().output_len();
        let (state, tag) = rest.split_at_checked(rest.len().checked_sub(tag_bytes)?)?;
        let key = keys.keys.iter().find(|k| k.name == name)?;
        hmac::verify(&key.hmac, &mac_input(name, iv, state)?, tag).ok()?;
        let iv = iv::FixedLength::try_from(iv).ok()?;
        let mut buffer = state.to_vec();
        let plain = key
            .decrypt
            .decrypt(&mut buffer, DecryptionContext::Iv128(iv))
            .ok()?;
        Some(plain.to_vec())
    }
}

impl fmt::Debug for Tickets {
    /// How many keys, never the keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tickets")
            .field("keys_from_files", &self.keys.load().keys.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
