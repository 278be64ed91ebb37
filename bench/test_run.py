#!/usr/bin/env python3
"""Unit tests of bench/run.py's decisions that need no load: whether a noisy run stops
(MAX_SPREAD), how the spread of rounds is reckoned, which binaries are measured (GATEWAY_BIN,
PASSTHROUGH_BIN), how a callgrind profile that is not whole is told, taken again and reported,
that the profile-guided build refuses a profile tool rustc cannot use, and that the plot draws
each contender in a colour of its own.
`cargo test` runs them (tests/bench_script.rs); by hand, `python3 -m unittest discover -s
bench`. The benchmark itself is not run by the tests."""

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Imported with a temporary directory of its own, so that anything the import makes there is
# seen, and nothing another process makes in the shared one is mistaken for it.
IMPORT_TMP = tempfile.mkdtemp(prefix="bench-test-")
tempfile.tempdir = IMPORT_TMP
try:
    import run  # noqa: E402
finally:
    tempfile.tempdir = None
MADE_BY_IMPORT = os.listdir(IMPORT_TMP)
if not MADE_BY_IMPORT:
    os.rmdir(IMPORT_TMP)


def rounds(*rps):
    return [{"rps": r} for r in rps]


class ParseMaxSpread(unittest.TestCase):
    def test_unset_or_empty_never_stops(self):
        self.assertIsNone(run.parse_max_spread(None))
        self.assertIsNone(run.parse_max_spread(""))

    def test_a_fraction_is_read(self):
        self.assertEqual(run.parse_max_spread("0.10"), 0.10)
        self.assertEqual(run.parse_max_spread("1"), 1.0)

    def test_anything_else_is_refused_naming_the_value(self):
        for value in ("ten", "10%", "0", "-0.1", "nan", "inf"):
            with self.subTest(value=value):
                with self.assertRaises(ValueError) as caught:
                    run.parse_max_spread(value)
                self.assertIn(repr(value), str(caught.exception))
                self.assertIn("such as 0.10", str(caught.exception))


class ChosenBinary(unittest.TestCase):
    def test_unset_or_empty_is_the_plain_release_build(self):
        for variable, plain in (("GATEWAY_BIN", "animal-store"), ("PASSTHROUGH_BIN", "passthrough")):
            with self.subTest(variable=variable):
                self.assertEqual(run.chosen_binary(variable, None), run.ROOT / "target/release" / plain)
                self.assertEqual(run.chosen_binary(variable, ""), run.ROOT / "target/release" / plain)

    def test_an_executable_file_is_taken(self):
        with tempfile.TemporaryDirectory() as d:
            binary = Path(d) / "animal-store"
            binary.write_text("#!/bin/sh\n")
            binary.chmod(0o755)
            for variable in run.BINARIES:
                with self.subTest(variable=variable):
                    self.assertEqual(run.chosen_binary(variable, str(binary)), binary.resolve())

    def test_a_missing_or_not_executable_path_is_refused_naming_it(self):
        with tempfile.TemporaryDirectory() as d:
            plain = Path(d) / "not-executable"
            plain.write_text("")
            for variable, what in (("GATEWAY_BIN", "animal-store"), ("PASSTHROUGH_BIN", "passthrough")):
                for value in (str(Path(d) / "missing"), str(plain), d):
                    with self.subTest(variable=variable, value=value):
                        with self.assertRaises(ValueError) as caught:
                            run.chosen_binary(variable, value)
                        self.assertIn(f"{variable} must name an executable {what}", str(caught.exception))
                        self.assertIn(repr(value), str(caught.exception))

    def test_the_report_says_which_builds_it_measured(self):
        saved = run.BIN, run.PASS
        try:
            self.assertEqual(run.binaries_measured(), [])
            run.PASS = run.ROOT / "target/pgo/x/release/passthrough"
            line = run.binaries_measured()[0]
            self.assertIn("is the plain release build; the pass-through is "
                          "`target/pgo/x/release/passthrough` (PASSTHROUGH_BIN).", line)
            run.BIN = run.ROOT / "target/pgo/x/release/animal-store"
            line = run.binaries_measured()[0]
            self.assertIn("is `target/pgo/x/release/animal-store` (GATEWAY_BIN);", line)
        finally:
            run.BIN, run.PASS = saved


class PgoScript(unittest.TestCase):
    """`bench/pgo.sh` refuses, before building anything, an llvm-profdata of another LLVM than
    rustc's, whose profiles rustc could not read."""

    def test_an_llvm_profdata_of_another_llvm_is_refused_before_any_build(self):
        rustc = shutil.which("rustc")
        if rustc is None:
            self.skipTest("no rustc on PATH")
        with tempfile.TemporaryDirectory() as d:
            fake = Path(d) / "rustc"  # rustc as it is, but for an LLVM no tool here is of
            fake.write_text(f"""#!/bin/sh
if [ "$1" = -vV ]; then "{rustc}" -vV | sed 's/^LLVM version: .*/LLVM version: 9999.1.0/'
else exec "{rustc}" "$@"; fi
""")
            fake.chmod(0o755)
            cargo = Path(d) / "cargo"  # a build reached would fail at once, not take minutes
            cargo.write_text("#!/bin/sh\nexit 97\n")
            cargo.chmod(0o755)
            env = {**os.environ, "PATH": f"{d}:{os.environ['PATH']}"}
            done = subprocess.run(["bash", str(run.BENCH / "pgo.sh")], capture_output=True,
                                  text=True, env=env, timeout=60)
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("needs llvm-profdata of LLVM 9999", done.stderr)
        self.assertIn("apt-get install -y llvm-9999", done.stderr)
        self.assertNotIn("== instrumented build", done.stdout)


class RoundSpreads(unittest.TestCase):
    def test_range_over_median(self):
        spreads = run.round_spreads({"a": rounds(90, 100, 110), "b": rounds(50, 50, 50)})
        self.assertAlmostEqual(spreads["a"], 0.20)
        self.assertEqual(spreads["b"], 0.0)

    def test_median_of_an_even_count_is_the_mean_of_the_middle_two(self):
        spreads = run.round_spreads({"a": rounds(100, 90, 110, 100)})
        self.assertAlmostEqual(spreads["a"], 0.20)
        spreads = run.round_spreads({"a": rounds(80, 100, 120, 140)})
        self.assertAlmostEqual(spreads["a"], 60 / 110)


class TooNoisy(unittest.TestCase):
    ROWS = {
        "nginx": rounds(62_000, 60_000, 64_000),      # 6.5% of 62,000
        "gateway (embedded)": rounds(40_000, 44_000, 36_000),  # 20% of 40,000
        "direct": rounds(140_000, 141_000, 142_000),  # 1.4%
    }

    def test_without_max_spread_the_run_goes_on(self):
        self.assertIsNone(run.too_noisy(self.ROWS, None))

    def test_stops_naming_the_widest_contender_and_its_spread(self):
        message = run.too_noisy(self.ROWS, 0.10)
        self.assertEqual(
            message,
            "too noisy to go on: the rounds of gateway (embedded) spread by 20.0% of their median "
            "(MAX_SPREAD=0.1); nothing written")

    def test_goes_on_when_every_contender_is_within(self):
        self.assertIsNone(run.too_noisy(self.ROWS, 0.25))

    def test_a_spread_equal_to_max_spread_stops(self):
        rows = {"a": rounds(95, 100, 105)}  # exactly 10% of 100
        self.assertIsNotNone(run.too_noisy(rows, 0.10))
        self.assertIsNone(run.too_noisy(rows, 0.1000001))

    def test_the_widest_is_found_whatever_its_place(self):
        rows = {"quiet": rounds(100, 100, 100), "noisy": rounds(50, 100, 150)}
        self.assertIn("the rounds of noisy spread by 100.0%", run.too_noisy(rows, 0.10))
        rows = dict(reversed(list(rows.items())))
        self.assertIn("the rounds of noisy spread by 100.0%", run.too_noisy(rows, 0.10))


class Gated(unittest.TestCase):
    ALL = {name: rounds(100) for name in [
        "direct", "nginx", "haproxy", "pingora pass-through", "pass-through, kept upstreams",
        "gateway (embedded)", "gateway (redis)", "gateway (header_case = lower)",
        "2 gateways (redis)"]}

    def test_keeps_the_rows_the_targets_are_read_from(self):
        self.assertEqual(
            list(run.gated(self.ALL)),
            ["nginx", "pingora pass-through", "pass-through, kept upstreams", "gateway (embedded)"])

    def test_a_noisy_redis_row_does_not_stop_a_run_a_noisy_target_row_does(self):
        rows = dict(self.ALL, **{"gateway (redis)": rounds(80, 100, 120)})
        self.assertIsNotNone(run.too_noisy(rows, 0.10))
        self.assertIsNone(run.too_noisy(run.gated(rows), 0.10))
        self.assertIsNone(run.bound_to_be_too_noisy(run.gated(rows), 0.10))
        rows["gateway (embedded)"] = rounds(80, 100, 120)
        self.assertIn("gateway (embedded)", run.too_noisy(run.gated(rows), 0.10))
        self.assertIn("gateway (embedded)", run.bound_to_be_too_noisy(run.gated(rows), 0.10))

    def test_the_report_names_the_widest_judged_row_and_the_widest_other(self):
        rows = dict(self.ALL, **{"gateway (redis)": rounds(84, 100, 100),
                                 "pingora pass-through": rounds(97, 100, 102),
                                 "nginx": rounds(99, 100, 100)})
        sentence = run.quietness(rows)
        self.assertIn("spread by at most **5.0%** of their median throughput "
                      "(pingora pass-through; nginx 1.0%)", sentence)
        self.assertIn("Of the other contenders, gateway (redis) spread the most, by 16.0%.",
                      sentence)


class FellBehind(unittest.TestCase):
    def test_counts_runs_below_99_percent_of_the_offered_rate(self):
        runs = [{"rps": 38_106}, {"rps": 37_825}, {"rps": 37_700}, {"rps": 34_501}]
        self.assertEqual([r["rps"] for r in run.fell_behind(runs, 38_114)], [37_700, 34_501])
        self.assertEqual(run.fell_behind(runs, 30_000), [])


class BoundToBeTooNoisy(unittest.TestCase):
    def test_without_max_spread_or_rounds_the_run_goes_on(self):
        self.assertIsNone(run.bound_to_be_too_noisy({"a": rounds(50, 100)}, None))
        self.assertIsNone(run.bound_to_be_too_noisy({"a": [], "b": []}, 0.10))

    def test_one_round_never_stops(self):
        self.assertIsNone(run.bound_to_be_too_noisy({"a": rounds(100), "b": []}, 0.10))

    def test_stops_when_the_range_reaches_max_spread_of_the_fastest(self):
        rows = {"nginx": rounds(62_000, 61_000), "gateway (embedded)": rounds(44_000, 39_600)}
        self.assertEqual(
            run.bound_to_be_too_noisy(rows, 0.10),
            "too noisy to go on: the rounds of gateway (embedded) already spread by 10.0% of "
            "their fastest, so their spread of the median cannot end below MAX_SPREAD=0.1; "
            "nothing written")
        rows["gateway (embedded)"] = rounds(44_000, 39_650)  # 9.9% of the fastest
        self.assertIsNone(run.bound_to_be_too_noisy(rows, 0.10))

    def test_goes_on_whenever_a_later_round_could_still_pass(self):
        # 9.9% of the fastest: a third round at the fastest makes it the median, and the run passes.
        rows = {"a": rounds(90.1, 100)}
        self.assertIsNone(run.bound_to_be_too_noisy(rows, 0.10))
        self.assertIsNone(run.too_noisy({"a": rounds(90.1, 100, 100)}, 0.10))

    def test_a_stop_it_calls_certain_is_certain(self):
        # Every pair of first rounds it stops on stops `too_noisy` too, whatever the third and
        # fourth rounds are (the stop is not tied to three rounds).
        later = [1, 50, 80, 89, 90, 95, 99, 100, 101, 105, 110, 120, 200, 10_000]
        stopped = 0
        for first in range(80, 101):
            pair = rounds(first, 100)
            if run.bound_to_be_too_noisy({"a": pair}, 0.10) is None:
                continue
            stopped += 1
            for third in later:
                self.assertIsNotNone(run.too_noisy({"a": pair + rounds(third)}, 0.10), third)
                for fourth in later:
                    self.assertIsNotNone(
                        run.too_noisy({"a": pair + rounds(third, fourth)}, 0.10), (third, fourth))
        self.assertEqual(stopped, 11)  # 80 to 90: 20% down to 10% of the fastest


# A whole callgrind profile as callgrind writes one: header, one function, totals last.
WHOLE_PROFILE = """# callgrind format
version: 1
creator: callgrind-3.19.0
cmd:  nginx
part: 1

positions: line
events: Ir
summary: 7

fn=main
0 7

totals: 7
"""


class Profiles(unittest.TestCase):
    def setUp(self):
        self.dir = Path(tempfile.mkdtemp(prefix="bench-test-"))
        self.addCleanup(shutil.rmtree, self.dir)

    def profile(self, text):
        path = self.dir / "callgrind-0.out"
        path.write_text(text)
        return path

    def test_a_whole_profile_is_whole(self):
        self.assertIsNone(run.unfinished_profile(self.profile(WHOLE_PROFILE)))

    def test_an_empty_profile_is_one_callgrind_never_wrote(self):
        # What a proxy killed under callgrind leaves: the file made at start, empty.
        self.assertEqual(run.unfinished_profile(self.profile("")),
                         "it is empty: callgrind never wrote the profile (it writes at exit)")

    def test_a_profile_cut_off_is_told_from_a_whole_one(self):
        for cut in ("\ntotals: 7\n", "totals: 7\n", "7\n"):
            with self.subTest(cut=cut):
                text = WHOLE_PROFILE[:-len(cut)]
                self.assertEqual(run.unfinished_profile(self.profile(text)),
                                 f"its {len(text):,} bytes end before the totals line: cut off while being written")
        header = WHOLE_PROFILE.split("events:")[0]
        self.assertEqual(run.unfinished_profile(self.profile(header)),
                         f"its {len(header):,} bytes have no events line in their header")

    def test_reading_an_unfinished_profile_raises_naming_it_and_why(self):
        with self.assertRaises(run.UnreadableProfile) as caught:
            run.callgrind_functions(self.profile(""), False)
        self.assertEqual(str(caught.exception), "callgrind-0.out is not a whole profile: it is empty: "
                         "callgrind never wrote the profile (it writes at exit)")


class Retaken(unittest.TestCase):
    def test_a_profile_refused_once_is_taken_again_and_the_refusal_logged(self):
        tries = []

        def take():
            tries.append(1)
            if len(tries) == 1:
                raise run.UnreadableProfile("it is empty")
            return "counts"

        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(run.retaken("nginx, 6,000 requests", take), "counts")
        self.assertEqual(len(tries), 2)
        self.assertEqual(out.getvalue(), "  nginx, 6,000 requests: it is empty; taking it again\n")

    def test_a_profile_refused_every_time_fails_the_part_with_every_reason(self):
        reasons = iter(["it is empty", "cut off"])

        def take():
            raise run.UnreadableProfile(next(reasons))

        with contextlib.redirect_stdout(io.StringIO()) as out, self.assertRaises(run.PartFailed) as caught:
            run.retaken("nginx, 6,000 requests", take, tries=2)
        self.assertEqual(str(caught.exception), "instr: no readable profile of nginx, 6,000 requests "
                         "in 2 tries: it is empty / cut off")
        self.assertEqual(out.getvalue().count("\n"), 2)

    def test_anything_else_is_not_retried(self):
        def take():
            raise OSError("no such file")

        with self.assertRaises(OSError):
            run.retaken("nginx, 6,000 requests", take)


class Report(unittest.TestCase):
    def test_a_failed_part_is_reported_with_what_was_measured_before_it(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "results.md"
            results = {"exactness": [(5000, 61_000, 5000)], "failed": "instr: no readable profile"}
            with contextlib.redirect_stdout(io.StringIO()):
                run.report(results, path)
            text = path.read_text()
        self.assertIn("| 1 | 61,000 | 5,000 | 5,000 |", text)
        self.assertTrue(text.rstrip().endswith(
            "## Not measured\n\nThe run stopped here, having measured the parts above: instr: no "
            "readable profile. The parts after it did not run."), text[-300:])


class Plot(unittest.TestCase):
    def test_each_contender_has_a_colour_of_its_own(self):
        # The open loop measures eight contenders; with seven colours the eighth was drawn in
        # the first one's (2026-12-07: `direct` and `gateway (header_case = lower)` alike).
        names = [f"contender {i}" for i in range(10)]
        rows = {n: [{"rate": r, "p99": 1.0 + i + r / 1000} for r in (100, 200)]
                for i, n in enumerate(names)}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "latency.svg"
            run.plot({"rates": [100, 200], "rows": rows}, path)
            svg = path.read_text()
        strokes = re.findall(r'<polyline [^>]*stroke="(#[0-9a-f]{6})"', svg)
        self.assertEqual(len(strokes), len(names))
        self.assertEqual(len(set(strokes)), len(names), strokes)
        for name, colour in zip(names, strokes):
            self.assertIn(f'fill="{colour}">&#9632; {name}</text>', svg)


class Main(unittest.TestCase):
    def test_a_bad_max_spread_stops_the_run_before_it_starts_anything(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run([sys.executable, str(Path(run.__file__))],
                                 env={**os.environ, "MAX_SPREAD": "ten", "TMPDIR": tmp},
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 1)
            self.assertEqual(out.stderr.strip(),
                             "MAX_SPREAD must be a fraction above 0 such as 0.10, not 'ten'")
            self.assertEqual(out.stdout, "")
            self.assertEqual(os.listdir(tmp), [])

    def test_a_binary_that_is_not_there_stops_the_run_before_it_starts_anything(self):
        for variable, what in (("GATEWAY_BIN", "animal-store"), ("PASSTHROUGH_BIN", "passthrough")):
            with self.subTest(variable=variable), tempfile.TemporaryDirectory() as tmp:
                missing = str(Path(tmp) / "missing")
                # IDLE beyond any open-file limit: were the variable not read, the run would
                # stop there, saying so, rather than start a benchmark.
                env = {**os.environ, variable: missing, "TMPDIR": tmp, "IDLE": str(10**12)}
                out = subprocess.run([sys.executable, str(Path(run.__file__))], env=env,
                                     capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 1)
                self.assertEqual(out.stderr.strip(),
                                 f"{variable} must name an executable {what}, not {missing!r}")
                self.assertEqual(os.listdir(tmp), [])


class Import(unittest.TestCase):
    def test_importing_makes_no_temporary_directory(self):
        self.assertEqual(MADE_BY_IMPORT, [], f"left in {IMPORT_TMP}")
        self.assertIsNone(run.WORK)


if __name__ == "__main__":
    unittest.main()
