//! The benchmark's own decisions (`bench/test_run.py`): whether a noisy run stops (`MAX_SPREAD`),
//! how the spread of rounds is reckoned, which binaries it measures (`GATEWAY_BIN`,
//! `PASSTHROUGH_BIN`), how a callgrind profile that is not whole is told, taken again and
//! reported, that `bench/pgo.sh` refuses an `llvm-profdata` rustc cannot use before it
//! builds, and that the plot draws each contender in a colour of its own. The benchmark itself takes minutes of both cores, so it is not run here; these unit
//! tests need no load and run in a second.

use std::path::Path;
use std::process::Command;

#[test]
fn the_benchmark_script_passes_its_unit_tests() {
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench");
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s"])
        .arg(&bench)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 is needed to test bench/run.py (apt-get install -y python3)");
    assert!(
        out.status.success(),
        "bench/test_run.py failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stderr);
    let ran: usize = report
        .lines()
        .find_map(|line| line.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(ran > 0, "unittest found no test in bench/:\n{report}");
}
