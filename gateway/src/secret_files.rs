//! Files holding secrets that every user of the machine may open: the TLS private key, the
//! session ticket keys, and a configuration file with a Redis password in it. Their mode should
//! keep them to their owner (and, where a group such as Debian's `ssl-cert` is given them, to
//! that group).
//!
//! A warning, not a refusal: nginx and rustls do not look at modes, so a key installed for them
//! may well be readable by all, and refusing a start over it would turn a working deployment
//! into an outage at its next restart. OpenSSH and PostgreSQL refuse such a key; the gateway
//! says so at each start, at each `SIGHUP` and in `check-config`, naming the file, what others
//! may do with it and the `chmod` that stops them.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The warning for `path`, which holds `what` ("the TLS private key"), when users other than
/// its owner and group may read or write it; None when they may not, or when the file cannot be
/// read (loading it fails with its own error).
pub fn open_to_others(path: &Path, what: &str) -> Option<String> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    warning(path, what, mode)
}

/// The warning for `path`, which holds `what`, when `mode` lets others read or write it.
fn warning(path: &Path, what: &str, mode: u32) -> Option<String> {
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
                warning(path, "the TLS private key", closed),
                None,
                "{closed:o}"
            );
        }
        let read = warning(path, "the TLS private key", 0o100644).unwrap();
        assert_eq!(
            read,
            "/etc/gateway/key.pem holds the TLS private key, and every user of this machine may \
             read it (mode 0644): `chmod o-rwx /etc/gateway/key.pem` keeps it to its owner and \
             group"
        );
        let both = warning(path, "a session ticket key", 0o666).unwrap();
        assert!(
            both.contains("may read and replace it (mode 0666)"),
            "{both}"
        );
        let write = warning(path, "a session ticket key", 0o602).unwrap();
        assert!(write.contains("may replace it (mode 0602)"), "{write}");
    }

    #[test]
    fn a_file_is_judged_by_its_own_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        std::fs::write(&path, b"secret").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let warning = open_to_others(&path, "the TLS private key").unwrap();
        assert!(warning.starts_with(&format!("{} holds the TLS private key", path.display())));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(open_to_others(&path, "the TLS private key"), None);
        assert_eq!(open_to_others(&dir.path().join("missing"), "a key"), None);
    }
}
