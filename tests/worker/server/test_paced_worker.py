"""A worker paced as one of the paper's Macs: it says so everywhere, drafts what it would unpaced,
and the bench counts its passes and refuses a pace its compute cannot hold."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.workers.connection import connect
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from tests.support.credentials import credentials
from tests.support.processes.cli import run_cli
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name
from tests.support.prompts import PROMPTS
from tests.support.remote import generate_remote

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def paced_worker() -> Iterator[WorkerProcess]:
    """A tiny worker emulating the paper's M1 Max (86.6 draft tok/s)."""
    name = unique_name("paced-m1-max")
    with running_worker(
        "--model", "tiny", "--name", name, "--label", "M1 Max", "--pace", "paper:m1-max"
    ) as w:
        yield w


async def test_a_paced_worker_says_so(paced_worker: WorkerProcess) -> None:
    assert paced_worker.ready["pace"] == "paper:m1-max"
    connection = await connect(paced_worker.address, credentials())
    try:
        pace = connection.hello.pace
        assert (pace.profile, pace.machine, pace.machine_name) == ("paper", "m1-max", "M1 Max")
        assert pace.draft_tokens_per_second == pytest.approx(86.6)
        assert 60 < connection.hello.draft_tokens_per_second < 90  # measured through the pacing
        # Its tree passes are measured up to the widest a coordinator may ask for, through the pacing:
        # its 64-row pass takes at least 20.8 ms (64 rows at its 3,080 tok/s prompt rate).
        curve = {p.rows: p.seconds for p in connection.hello.pass_curve}
        assert sorted(curve) == [1, 2, 4, 8, 16, 32, 64]
        assert curve[64] >= 0.99 * 64 / 3079.8
    finally:
        await connection.close()
    # 5 s: a loaded machine has answered Bonjour later than 2 s
    out = run_cli("coordinator", "discover", "--interface", "127.0.0.1", "--discover-timeout", "5", "--json")
    mine = [w for w in json.loads(out.stdout)["workers"] if w["name"] == paced_worker.name]
    assert len(mine) == 1 and mine[0]["pace"] == "paper:m1-max"


@pytest.mark.serial
async def test_a_paced_workers_32_row_pass_is_held_as_long_as_its_16_row_one(
    paced_worker: WorkerProcess,
) -> None:
    # The M1 Max reads its weights whatever the rows until 35: its 32-row pass is held as long as its
    # 16-row one (11.5 ms), not twice as long. Timing: with the other test processes beside it, a busy
    # slow hour's 32-row pass of the tiny draft overran its pace (19.4 ms against 12.4), so it runs alone.
    connection = await connect(paced_worker.address, credentials())
    try:
        curve = {p.rows: p.seconds for p in connection.hello.pass_curve}
        assert curve[32] < 1.5 * curve[16]
    finally:
        await connection.close()


async def test_a_paced_worker_drafts_what_an_unpaced_one_drafts(
    paced_worker: WorkerProcess, tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    prompt = tiny.tokenizer.encode(PROMPTS[0])
    for params in (SamplingParams(), SamplingParams(temperature=0.8, seed=2)):
        (paced,) = await generate_remote(paced_worker.address, tiny, [prompt], 4, 16, params)
        (plain,) = await generate_remote(tiny_worker.address, tiny, [prompt], 4, 16, params)
        assert paced.result.tokens == plain.result.tokens
        assert [r.draft.tokens for r in paced.result.rounds] == [r.draft.tokens for r in plain.result.rounds]
        assert paced.worker_counters.paced_passes == paced.worker_counters.forward_passes > 0
        assert plain.worker_counters.paced_passes == 0


def test_the_bench_shows_paced_rows_and_refuses_a_pace_not_held(
    paced_worker: WorkerProcess, tmp_path: Path
) -> None:
    # A target machine 10,000 times faster than the tiny model can compute: every pass overruns.
    fast = {"name": "impossible", "target_machine": "rocket", "target_tok_s": 1e7, "workers": {"x": 1e7}}
    profile = tmp_path / "impossible.json"
    profile.write_text(json.dumps({**fast, "mean_accepted": 1, "k": 4}))
    common = ["--workers", paced_worker.address, "--target", "tiny", "--local-draft", "none"]
    common += ["--max-tokens", "8"]
    common += [
        "--backend",
        "stream",
        "--prompts",
        str(_one_prompt(tmp_path)),
        "--json",
        str(tmp_path / "b.json"),
    ]
    out = run_cli("coordinator", "bench", *common, "--pace", f"{profile}:rocket")
    error = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and "Traceback" not in out.stderr and error.startswith("error: ")
    assert "AR (target only): pace not held, " in error and " coordinator target passes overran" in error
    assert "[paced paper:m1-max]" in out.stdout and "NOT HELD" in out.stdout
    allowed = run_cli("coordinator", "bench", *common, "--pace", f"{profile}:rocket", "--allow-overruns")
    assert allowed.returncode == 0, allowed.stderr
    rows = {r["kind"]: r for r in json.loads((tmp_path / "b.json").read_text())["rows"]}
    assert rows["ar"]["pace"]["held"] is False and rows["ar"]["pace"]["coordinator"]["target"]["overruns"] > 0
    worker = rows["remote"]["pace"]["workers"]
    assert list(worker) == [paced_worker.name] and worker[paced_worker.name]["passes"] > 0


def _one_prompt(tmp_path: Path) -> Path:
    path = tmp_path / "prompt.txt"
    path.write_text("Say something.\n")
    return path


def test_the_paper_profile_is_checked_against_a_paced_bench(
    paced_worker: WorkerProcess, tmp_path: Path
) -> None:
    bench, plan = tmp_path / "paced.json", tmp_path / "plan.json"
    flags = ["--workers", paced_worker.address, "--target", "tiny", "--local-draft", "tiny-draft"]
    flags += ["--max-tokens", "8", "--backend", "stream", "--prompts", str(_one_prompt(tmp_path))]
    out = run_cli("coordinator", "bench", *flags, "--json", str(bench), "--pace", "paper:m2-ultra")
    assert out.returncode in (0, 1), out.stderr  # 1 only if this loaded machine could not hold the pace
    check = ["plan", "--profile", "paper", "--check-bench", str(bench)]
    checked = run_cli("coordinator", *check, "--json", str(plan))
    assert checked.returncode == 0, checked.stderr
    rows = {r["label"]: r for r in json.loads(plan.read_text())["rows"]}
    assert set(rows) == {"AR (target only)", "local SD", "stream → M1 Max [paced paper:m1-max]"}
    assert rows["local SD"]["paper_tok_s"] == 53.8
    assert rows["AR (target only)"]["predicted_tok_s"] == pytest.approx(42.4)
    data = json.loads(bench.read_text())
    data["settings"]["pace"] = None  # as a coordinator computing at its own speed records it
    bench.write_text(json.dumps(data))
    refused = run_cli("coordinator", *check)
    assert refused.returncode == 1 and "ran at its own speed, not as paper:m2-ultra" in refused.stderr
