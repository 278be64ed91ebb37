//! Ticket keys from files: what one gateway encrypts another with the same file decrypts, a
//! rotation keeps old tickets until their key leaves the list, and nothing a client sends (cut
//! short, altered, random) is decrypted or panics.

use super::*;

/// A key file of 80 random bytes in `dir`.
fn key_file(dir: &Path, name: &str) -> PathBuf {
    let mut bytes = [0u8; KEY_FILE_BYTES];
    getrandom::fill(&mut bytes).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The keys of `files`, checked.
fn list(files: &[&PathBuf]) -> KeyList {
    read(
        &files.iter().map(|f| (*f).clone()).collect::<Vec<_>>(),
        true,
    )
    .unwrap()
}

/// A gateway's ticketer over the keys of `files`, and its handle to swap them as `SIGHUP` does.
fn tickets(files: &[&PathBuf]) -> (Tickets, SharedKeys) {
    let keys: SharedKeys = Arc::new(ArcSwap::from_pointee(list(files)));
    let own = rustls::crypto::aws_lc_rs::Ticketer::new().unwrap();
    (Tickets::new(keys.clone(), own), keys)
}

fn keys(files: &[&PathBuf]) -> Tickets {
    tickets(files).0
}

const STATE: &[u8] = b"a session's state, as rustls hands it over to be encrypted";

#[test]
fn another_gateway_with_the_same_file_decrypts_what_one_encrypted() {
    let dir = tempfile::tempdir().unwrap();
    let file = key_file(dir.path(), "a.key");
    let (one, other) = (keys(&[&file]), keys(&[&file]));
    let ticket = one.encrypt(STATE).unwrap();
    assert_eq!(other.decrypt(&ticket).as_deref(), Some(STATE));
    assert_eq!(one.decrypt(&ticket).as_deref(), Some(STATE));
    // A fresh IV each time: the same state never gives the same ticket.
    assert_ne!(one.encrypt(STATE).unwrap(), ticket);
    // Another file's keys decrypt nothing of it.
    let stranger = keys(&[&key_file(dir.path(), "b.key")]);
    assert_eq!(stranger.decrypt(&ticket), None);
    assert_eq!(one.lifetime(), 12 * 60 * 60);
    assert!(one.enabled());
}

#[test]
fn a_rotation_keeps_tickets_until_their_key_leaves_the_list() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (
        key_file(dir.path(), "old.key"),
        key_file(dir.path(), "new.key"),
    );
    let (gateway, swap) = tickets(&[&old]);
    let before = gateway.encrypt(STATE).unwrap();
    // Step 1 everywhere: the new key decrypts only.
    swap.store(Arc::new(list(&[&old, &new])));
    assert_eq!(gateway.decrypt(&before).as_deref(), Some(STATE));
    assert_eq!(&gateway.encrypt(STATE).unwrap()[..16], &before[..16]);
    // Step 2: the new key first; old tickets still open, and a gateway still at step 1 opens
    // the new ones.
    swap.store(Arc::new(list(&[&new, &old])));
    let after = gateway.encrypt(STATE).unwrap();
    assert_ne!(&after[..16], &before[..16], "named by the new key");
    assert_eq!(gateway.decrypt(&before).as_deref(), Some(STATE));
    assert_eq!(keys(&[&old, &new]).decrypt(&after).as_deref(), Some(STATE));
    // Step 3: the old key dropped, and its tickets with it.
    swap.store(Arc::new(list(&[&new])));
    assert_eq!(gateway.decrypt(&before), None);
    assert_eq!(gateway.decrypt(&after).as_deref(), Some(STATE));
}

#[test]
fn without_files_tickets_are_the_process_own_and_files_can_come_and_go() {
    let dir = tempfile::tempdir().unwrap();
    let file = key_file(dir.path(), "a.key");
    let (gateway, swap) = tickets(&[]);
    let own = gateway.encrypt(STATE).unwrap();
    assert_eq!(gateway.decrypt(&own).as_deref(), Some(STATE));
    assert_eq!(keys(&[&file]).decrypt(&own), None, "no file key opens it");
    assert_eq!(
        keys(&[]).decrypt(&own),
        None,
        "nor another process's own keys"
    );
    swap.store(Arc::new(list(&[&file])));
    let shared = gateway.encrypt(STATE).unwrap();
    assert_eq!(keys(&[&file]).decrypt(&shared).as_deref(), Some(STATE));
    assert_eq!(gateway.decrypt(&own), None, "the files' keys alone decrypt");
    swap.store(Arc::new(list(&[])));
    assert_eq!(
        gateway.decrypt(&own).as_deref(),
        Some(STATE),
        "the own keys are kept"
    );
    assert_eq!(gateway.decrypt(&shared), None);
}

#[test]
fn a_ticket_cut_short_or_altered_anywhere_is_not_decrypted() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = keys(&[&key_file(dir.path(), "a.key")]);
    let ticket = gateway.encrypt(STATE).unwrap();
    // Name, IV, two blocks of state, tag.
    assert_eq!(ticket.len(), 16 + 16 + 64 + 32);
    for length in 0..ticket.len() {
        assert_eq!(gateway.decrypt(&ticket[..length]), None, "cut to {length}");
    }
    for at in 0..ticket.len() {
        let mut altered = ticket.clone();
        altered[at] ^= 0x01;
        assert_eq!(gateway.decrypt(&altered), None, "byte {at} altered");
    }
    let mut longer = ticket.clone();
    longer.push(0);
    assert_eq!(gateway.decrypt(&longer), None);
    assert_eq!(gateway.decrypt(&vec![0; MAX_TICKET_BYTES + 1]), None);
    let mut random = [0u8; 256];
    for _ in 0..1_000 {
        getrandom::fill(&mut random).unwrap();
        let length = usize::from(random[0]);
        assert_eq!(gateway.decrypt(&random[..length]), None);
    }
    // Under the key's own name, garbage still fails its MAC.
    let mut named = ticket[..16].to_vec();
    named.extend_from_slice(&[7; 16 + 16 + 32]);
    assert_eq!(gateway.decrypt(&named), None);
}

#[test]
fn files_that_are_no_key_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let message = |files: Vec<PathBuf>| read(&files, true).map(|_| ()).unwrap_err().to_string();
    for size in [0, 48, 79, 81] {
        let path = dir.path().join(format!("{size}.key"));
        std::fs::write(&path, vec![1u8; size]).unwrap();
        let text = message(vec![path.clone()]);
        assert!(text.starts_with(&path.display().to_string()), "{text}");
        assert!(
            text.contains(&format!(
                "exactly 80 random bytes (`openssl rand 80`); this one holds {size}"
            )),
            "{text}"
        );
    }
    let missing = dir.path().join("missing.key");
    let text = message(vec![missing.clone()]);
    assert!(
        text.starts_with(&format!("{}: cannot read it", missing.display())),
        "{text}"
    );
    let first = key_file(dir.path(), "first.key");
    let copy = dir.path().join("copy.key");
    std::fs::copy(&first, &copy).unwrap();
    let text = message(vec![first, copy.clone()]);
    assert!(
        text.starts_with(&format!("{}: a ticket key listed twice", copy.display())),
        "{text}"
    );
}

#[test]
fn tickets_switched_off_and_on_again() {
    let (gateway, swap) = tickets(&[]);
    assert!(gateway.enabled());
    swap.store(Arc::new(read(&[], false).unwrap()));
    assert!(!gateway.enabled(), "rustls then sends no ticket");
    swap.store(Arc::new(read(&[], true).unwrap()));
    assert!(gateway.enabled());
}

#[test]
fn the_debug_form_counts_the_keys_and_shows_none() {
    let dir = tempfile::tempdir().unwrap();
    let file = key_file(dir.path(), "a.key");
    let text = format!("{:?}", keys(&[&file]));
    assert_eq!(text, "Tickets { keys_from_files: 1, .. }");
}
