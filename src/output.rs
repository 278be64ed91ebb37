//! Standard output without `println!`, which panics when stdout is closed or full: `keys list |
//! head -1` ended in a panic and exit code 101, and a key issued where stdout could not take it
//! was stored yet shown to no one.

use std::io::{self, Write};

use animal_store_gateway::{KeyRecord, KeySource};

/// Writes `text` and a newline to stdout and flushes it: a failure is an error, not a panic.
fn write_line(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Prints output a reader may stop reading early (`keys list | head -1`): a reader gone is no
/// error, as it is none for `ls` or `grep`.
pub fn print(text: &str) -> io::Result<()> {
    match write_line(text) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Prints `text`, which holds a key just issued as `record`. A key that could not be printed in
/// full is revoked: no one has it, or someone has part of it, and either way it must not work.
pub fn print_key(store: &KeySource, record: &KeyRecord, text: &str) -> anyhow::Result<()> {
    let Err(error) = write_line(text) else {
        return Ok(());
    };
    let outcome = match store.blocking(store.revoke(&record.id)) {
        Ok(_) => "so it was revoked".to_owned(),
        Err(e) => format!("and revoking it failed too ({e}): revoke it with `keys revoke`"),
    };
    anyhow::bail!(
        "key {} was issued but could not be written to standard output ({error}), {outcome}",
        record.id
    )
}
