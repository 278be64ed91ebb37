//! Secret files every user of the machine may open: the TLS private key and the session ticket
//! keys, whose mode should keep them to their owner (and, where a group such as Debian's
//! `ssl-cert` is given them, to that group).
//!
//! A warning, not a refusal: nginx and rustls do not look at modes, so a key installed for them
//! may well be readable by all, and refusing a start over it would turn a working deployment
//! into an outage at its next restart. OpenSSH and PostgreSQL refuse such a key; the gateway
//! says so at each start, at each `SIGHUP` and in `check-config`, naming the file, what others may
//! do with it and the `chmod` that stops them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The warnings for `key` (the listener's private key, if any) and `ticket_keys`: one for each
/// file that users other than its owner and group may read or write. A file that cannot be
/// read is not judged here: loading it fails with its own error.
pub fn exposed_secrets(key: Option<&Path>, ticket_keys: &[PathBuf]) -> Vec<String> {
    let key = key.map(|path| (path, "the TLS private key"));
    let tickets = ticket_keys
        .iter()
        .map(|path| (path.as_path(), "a session ticket key"));
    key.into_iter()
        .chain(tickets)
        .filter_map(|(path, what)| {
            let mode = std::fs::metadata(path).ok()?.permissions().mode();
            open_to_others(path, what, mode)
        })
        .collect()
}

/// The warning for `path`, which holds `what`, when `mode` lets others read or write it.
fn open_to_others(path: &Path, what: &str, mode: u32) -> Option<String> {
    let may = match (mode & 0o004 != 0, mode & 0o002 != 0) {
        (true, true) => "read and replace",
        (true, false) => "read",
        (false, true) => "replace",
        (false, false) => return None,
    };
    let path = path.display();
    Some(format!(
        "{path} holds {what}, and every user of this machine may {may} it (mode {:04o}): \
         `chmod o-rwx {path}` keeps it to its owner and group",
        mode & 0o7777
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_others_may_read_or_write_is_named() {
        let path = Path::new("/etc/gateway/key.pem");
        for closed in [0o600, 0o640, 0o660, 0o400, 0o100600, 0o601] {
            assert_eq!(
                open_to_others(path, "the TLS private key", closed),
                None,
                "{closed:o}"
            );
        }
        let read = open_to_others(path, "the TLS private key", 0o100644).unwrap();
        assert_eq!(
            read,
            "/etc/gateway/key.pem holds the TLS private key, and every user of this machine may \
             read it (mode 0644): `chmod o-rwx /etc/gateway/key.pem` keeps it to its owner and \
             group"
        );
        let both = open_to_others(path, "a session ticket key", 0o666).unwrap();
        assert!(
            both.contains("may read and replace it (mode 0666)"),
            "{both}"
        );
        let write = open_to_others(path, "a session ticket key", 0o602).unwrap();
        assert!(write.contains("may replace it (mode 0602)"), "{write}");
    }

    #[test]
    fn each_file_is_judged_by_its_own_mode() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, b"secret").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        };
        let key = file("key.pem", 0o644);
        let tickets = [file("t1.key", 0o600), file("t2.key", 0o604)];
        let missing = dir.path().join("missing.key");
        let warnings = exposed_secrets(
            Some(&key),
            &[tickets[0].clone(), tickets[1].clone(), missing],
        );
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with(&format!("{} holds the TLS private key", key.display())));
        assert!(warnings[1].starts_with(&format!(
            "{} holds a session ticket key",
            tickets[1].display()
        )));
        assert!(exposed_secrets(None, &tickets[..1]).is_empty());
    }
}
