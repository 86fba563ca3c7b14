"""The decision (dashboard/decision.py) and its two faces: `llm-recommend` and the best-stack card.

A store built for it: stacks of tiny-gqa logged through the real tracking API into a real sqlite
MLflow store, with chosen numbers (nothing is loaded: the numbers are the test's, so each limit's
effect is known in advance), then the command and the card read it back. The per-request latency,
energy and cost pieces are checked where they are made; the session sweep checks that a run logs
them (tests/test_sweep.py).
"""

from __future__ import annotations

import html
import json
import math
from types import SimpleNamespace

import pytest

import tracking
from dashboard import recommend
from dashboard.decision import ROLES, decide
from dashboard.limits import Limits, parse_latency
from trials.config import Stack, TrialConfig, Workload
from trials.loop import TrialResult
from trials.measurement.cost import usd_per_million_tokens
from trials.measurement.energy import measure_energy
from trials.measurement.latency import MIN_SAMPLES_P95, latency_metrics

MODEL = "tiny-gqa"


def _run(name: str, stack: Stack, tok: float, kl: float | None, ttft_p95: float, peak_mb: float,
         ppl_ratio: float | None = None, token_match: float = 1.0) -> TrialResult:
    config = TrialConfig(group="stacks", model=MODEL, stack=stack, workload=Workload("mixed", 4, 16), repeats=3)
    metrics = {"tok_per_s": tok, "tok_per_s_ci_low": tok * 0.95, "tok_per_s_ci_high": tok * 1.05,
               "peak_memory_bytes": peak_mb * 2**20, "fidelity_token_match": token_match,
               "first_divergence_token": 16.0, "latency_samples": 24.0, "ttft_s_p95": ttft_p95,
               "ttft_s_max": ttft_p95 * 1.1, "tpot_s_p95": 1 / tok, "tpot_s_max": 1.1 / tok,
               "speedup_vs_baseline": tok / 100, "memory_vs_baseline": 1.0, "num_prompts": 12.0}
    if kl is not None:
        metrics["kl_divergence"] = kl
    if ppl_ratio is not None:
        metrics["perplexity_ratio"] = ppl_ratio
    tags = {"stack_name": name, "reference_precision": "fp32", "user_code": f"# the code of {name}"}
    return TrialResult(config, "FINISHED", metrics=metrics, tags=tags)


# name -> (stack, tok/s, KL, TTFT p95 s, peak MB, perplexity ratio): what each limit should do is known
STACKS = {
    "bf16": (Stack(precision="bf16"), 100.0, 0.001, 0.05, 50.0, 1.001),
    "kv8": (Stack(precision="bf16", kv_bits=8, kv_backend="hqq"), 120.0, 0.005, 0.10, 45.0, 1.003),
    "spec": (Stack(precision="bf16", speculation="prompt_lookup", num_draft_tokens=3), 130.0, None, 0.25, 51.0, None),
    "nf4": (Stack(precision="nf4"), 150.0, 0.30, 0.06, 30.0, 1.40),
    "b4": (Stack(precision="bf16", batch_size=4), 300.0, 0.001, 0.30, 60.0, 1.001),
    "kv2": (Stack(precision="bf16", kv_bits=2, kv_backend="hqq"), 90.0, 0.01, 0.05, 40.0, 1.08),
}


@pytest.fixture(scope="module")
def decision_store(tmp_path_factory) -> str:
    uri = f"sqlite:///{tmp_path_factory.mktemp('decision-store') / 'mlflow.db'}"
    tracking.prepare_store(uri)
    for name, (stack, tok, kl, ttft, peak, ppl) in STACKS.items():
        tracking.log_trial(uri, _run(name, stack, tok, kl, ttft, peak, ppl))
    failed = TrialResult(TrialConfig(group="stacks", model=MODEL, stack=Stack(precision="int8")), "FAILED",
                         tags={"stack_name": "int8"}, error="oom: the test's failure")
    tracking.log_trial(uri, failed)
    return uri


def _decision(uri: str, **limits):
    [decision] = decide(tracking.runs_frame(uri, "stacks", status=None), Limits(**limits), [MODEL])
    return decision


def _names(decision) -> dict[str, str]:
    return {p.role: p.row["name"] for p in decision.picks}


def test_the_default_budget_refuses_harm_and_keeps_the_near_lossless(decision_store):
    decision = _decision(decision_store)
    # nf4 is the fastest batch-1 stack but KL 0.30; kv2's KL 0.01 passes, its perplexity +8 % does not
    assert _names(decision) == {"speed": "spec", "throughput": "b4", "memory": "kv8"}
    speed = decision.pick("speed")
    assert speed.excluded == "nf4 (KL 0.3000 > 0.02; perplexity +40.0 % > +2 %)"
    assert "kv8 at 120.0 tok/s" in speed.runner_up and "overlap" in speed.runner_up
    memory = decision.pick("memory")
    assert "nf4" in memory.excluded and "kv2" not in _names(decision).values()
    # speculation's quality is its sibling's without speculation, said so
    from dashboard.decision import facts
    assert any("bf16's scores (speculation does not change the distribution)" in f
               for f in facts(speed.row, decision.rows, decision.limits))
    assert [str(r["tags.stack_name"]) for _, r in decision.failed.iterrows()] == ["int8"]


def test_latency_and_quality_limits_exclude_what_they_should(decision_store):
    tight = _decision(decision_store, max_ttft_s=parse_latency("200ms"))
    assert _names(tight) == {"speed": "kv8", "memory": "kv8"}          # spec (250 ms) and b4 (300 ms) out
    assert tight.pick("speed").excluded == ("nf4 (KL 0.3000 > 0.02; perplexity +40.0 % > +2 %); "
                                            "spec (TTFT 250 ms (p95 of 24 requests) > 200 ms)")
    assert "none within the limits" in tight.note
    strict = _decision(decision_store, max_kl=0.003)
    assert _names(strict) == {"speed": "spec", "throughput": "b4", "memory": "bf16"}   # kv8 (0.005) out
    loose = _decision(decision_store, max_kl=None, max_perplexity_increase=None)
    assert _names(loose)["speed"] == "nf4" and _names(loose)["memory"] == "nf4"


def test_nothing_within_the_limits_names_the_closest_and_what_it_misses(decision_store):
    decision = _decision(decision_store, max_ttft_s=0.01)
    assert decision.picks == [] and decision.closest is not None
    row, missed = decision.closest
    assert row["name"] == "bf16" and missed == ["TTFT 50 ms (p95 of 24 requests) > 10 ms"]


def test_a_price_gives_the_cheapest_stack_and_its_cost(decision_store):
    decision = _decision(decision_store, price_per_hour_usd=2.0)
    cheapest = decision.pick("cost")
    assert cheapest.row["name"] == "b4"
    from dashboard.stack_facts import cost
    assert cost(cheapest.row, decision.limits) == pytest.approx(2.0 / (300 * 3600) * 1e6)


def _shown(cell: str) -> str:
    """A card cell's text as it was before the card wrapped and escaped it."""
    return html.unescape(cell.replace("<br>", " "))


def _card_rows(page) -> list[dict]:
    """The card's table as the rows ``llm-recommend --json`` prints under "table"."""
    card = page.table("stacks-best")
    return [dict(zip(card["header"], (_shown(cell) for cell in row))) for row in zip(*card["columns"])]


def test_recommend_prints_the_decision_and_the_card_shows_the_same(decision_store, capsys):
    """One decision, two faces: the command's table (in its JSON) and the card's table hold the same
    rows, one per distinct stack naming every pick it wins, for the defaults and for a tight latency
    limit with a price; the text fits 25 lines with every pick, and --details gives each in full."""
    from page import Page

    from dashboard.decision_table import SHORT

    page = Page(decision_store)
    for argv, boxes in (([], {}), (["--max-ttft", "200ms", "--price-per-hour", "2"],
                                   {"max_ttft_ms": 200, "price_per_hour": 2})):
        assert recommend.main(["--tracking-uri", decision_store, "--json", *argv]) == 0
        [printed] = json.loads(capsys.readouterr().out)
        page.select_model("stacks", MODEL, **boxes)
        card = _card_rows(page)            # the card leaves out a column empty on every row (no price: no $/1M)
        assert [{k: " ".join(v.split()) for k, v in row.items()} for row in card] == \
            [{k: " ".join(row[k].split()) for k in card[0]} for row in printed["table"]]
        assert ("$/1M tokens" in card[0]) == ("price_per_hour" in boxes)
        won = [pick for row in printed["table"] for pick in row["pick"].split(", ")]
        assert sorted(won) == sorted(SHORT[role] for role in printed["picks"])       # each pick once
        assert len({row["stack"] for row in printed["table"]}) == len(printed["table"])  # each stack once
        assert printed["limits"] in page.table("stacks-best")["title"]
        assert "why not the runner-up, fastest: " in page.text("stacks-best-more")
    argv = ["--tracking-uri", decision_store, "--max-ttft", "200ms", "--price-per-hour", "2"]
    assert recommend.main(argv) == 0
    text = capsys.readouterr().out
    model_lines = text.split("\n\n")[1].splitlines()
    assert model_lines[0].startswith(f"{MODEL}: recommended for speed: kv8") and len(model_lines) <= 25, text
    assert "fastest, smallest, cheapest  kv8" in text and "why the runner-up lost:" in text
    assert "turn it on in your code" not in text and "--details" in text
    assert recommend.main([*argv, "--details"]) == 0
    details = capsys.readouterr().out
    assert f"recommended: {ROLES['speed']}: kv8" in details and "turn it on in your code:" in details
    assert "# the code of kv8" in details and "python -m trials.run --config" in details
    fold = page.element("stacks-best-more-fold-0")          # the card: code and command behind a click
    assert type(fold).__name__ == "Details" and "python -m trials.run --config" in page.text("stacks-best-more-fold-0")
    assert sum(type(c).__name__ == "Clipboard" for c in _walk_components(fold)) == 2


def _walk_components(component):
    from page import _walk

    return list(_walk(component))


def test_recommend_and_the_card_agree_on_every_model_of_a_sweep_store(stacks_store, capsys):
    """The stacks design of a real sweep's runs (tiny-gqa, every cell run): same table both ways."""
    from page import Page

    frame = tracking.runs_frame(stacks_store, "stacks")
    page = Page(stacks_store)
    assert recommend.main(["--tracking-uri", stacks_store, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {d["model"] for d in printed} == set(frame["model"])
    for decision in printed:
        assert decision["picks"], decision          # every model gets a recommendation by default
        page.select_model("stacks", decision["model"])
        assert [row["stack"] for row in _card_rows(page)] == [row["stack"] for row in decision["table"]]


def test_per_request_latency_has_a_p95_only_over_enough_requests():
    def records(n: int, batch: int = 1):
        return [SimpleNamespace(ttft_s=0.01 * (i + 1), decode_s=1.0, decode_tokens=10, prompt_ids=["p"] * batch)
                for i in range(n)]

    few = latency_metrics(records(MIN_SAMPLES_P95 - 1))
    assert "ttft_s_p95" not in few and few["latency_samples"] == MIN_SAMPLES_P95 - 1
    many = latency_metrics(records(40))
    assert many["ttft_s_p95"] == pytest.approx(0.38) and many["ttft_s_p50"] == pytest.approx(0.20)
    assert many["tpot_s_p95"] == pytest.approx(0.1)
    batched = latency_metrics(records(5, batch=4))      # every request of a batch counts, with its batch's times
    assert batched["latency_samples"] == 20 and batched["ttft_s_p95"] == pytest.approx(0.05)


def test_energy_only_where_a_counter_measures_it(tmp_path):
    """A RAPL folder laid out as the kernel's (a stand-in: this machine has no readable counter, so
    the reading code is exercised on files, not on hardware), wrapping once; and no folder at all."""
    package = tmp_path / "intel-rapl:0"
    (package / "intel-rapl:0:0").mkdir(parents=True)       # a sub-domain: must not count twice
    (package / "energy_uj").write_text("999000000\n")
    (package / "max_energy_range_uj").write_text("999999999\n")
    (package / "intel-rapl:0:0" / "energy_uj").write_text("5\n")
    (tmp_path / "intel-rapl:0:0").mkdir()                  # the kernel lists sub-domains at the top too
    (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text("5\n")
    with measure_energy("cpu", root=tmp_path) as energy:
        (package / "energy_uj").write_text("1000000\n")     # wrapped: 999999999 - 999000000 + 1 + 1000000
    assert energy.joules == pytest.approx(2.0) and energy.method.startswith("rapl package counters (1 package")
    with measure_energy("cpu", root=tmp_path / "nothing") as none:
        pass
    assert none.joules is None and none.method.startswith("not measured")


def test_cost_per_million_tokens():
    assert usd_per_million_tokens(3.6, 1000.0) == pytest.approx(1.0)
    assert math.isclose(usd_per_million_tokens(1.5, 50.0), 1.5 / (50 * 3600) * 1e6)


def test_recommend_for_a_model_the_store_lacks_is_one_line(decision_store, capsys):
    assert recommend.main(["--tracking-uri", decision_store, "--model", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no stacks runs for 'nosuch'" in err[0] and "models with stacks runs: tiny-gqa" in err[0]
