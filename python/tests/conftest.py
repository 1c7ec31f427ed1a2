"""Shared fixtures: the repository's bundled traces and the `infersched` command built by
`cargo test` (the package's answers are checked against it, byte for byte)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "notebooks-data" / "traces" / "splitwise_code.csv"


def _host() -> str:
    out = subprocess.run(["rustc", "-vV"], check=True, capture_output=True, text=True).stdout
    return next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("host: "))


@pytest.fixture(scope="session")
def cli() -> Path:
    """The command: $INFERSCHED_BIN, else the debug build `cargo test --target HOST` leaves."""
    path = os.environ.get("INFERSCHED_BIN")
    candidates = [Path(path)] if path else [
        ROOT / "target" / _host() / "debug" / "infersched",
        ROOT / "target" / "debug" / "infersched",
    ]
    for c in candidates:
        if c.is_file():
            return c
    pytest.fail(
        "the infersched command is not built: run `cargo build --bin infersched` "
        f"or set INFERSCHED_BIN (looked at {', '.join(map(str, candidates))})"
    )


@pytest.fixture(scope="session")
def trace_head(tmp_path_factory) -> Path:
    """The first 40 Splitwise code requests of at most 4,096 tokens (real lengths and
    arrivals; every policy's default budget holds their prompts)."""
    header, *rows = TRACE.read_text().splitlines()
    short = [r for r in rows if int(r.split(",")[1]) + int(r.split(",")[2]) <= 4096]
    lines = [header, *short[:40]]
    path = tmp_path_factory.mktemp("w") / "head40.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(cli: Path, *args: str) -> str:
    done = subprocess.run([str(cli), *args], capture_output=True, text=True)
    assert done.returncode == 0, f"infersched {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout
