"""The capacity decision (dashboard/capacity.py) and its faces: `llm-recommend` and the best-stack card.

A store built for it: capacity runs of two models logged through the real tracking API into a real
sqlite MLflow store, following the capacity contract (metrics capacity_rps[_low/_high], the SLO they
were searched under, the single-stream p95s; tags capacity_status, capacity_note, user_code), beside
the in-process llama_cpp runs that score each GGUF and cache. Nothing is served: the numbers are the
test's, so the pick under each SLO and quality budget is known in advance.
"""

from __future__ import annotations

import json
import math

import pytest

import tracking
from dashboard import capacity, recommend
from dashboard.limits import Limits
from trials.config import Load, Stack, TrialConfig, Workload
from trials.loop import TrialResult
from trials.stats.serving import Slo

SMOL, GEMMA = "smollm2-135m-instruct", "gemma-3-270m"
NEW_TOKENS = 64
SLO = (0.5, 0.05)


def _capacity_run(model: str, stack: Stack, status: str, rps: float, low: float, high: float,
                  slo: tuple[float, float] = SLO, c1: tuple[float, float] = (0.2, 0.02), note: str = "") -> TrialResult:
    config = TrialConfig("capacity", model, stack, Workload("mixed", 1, NEW_TOKENS), repeats=1,
                         load=Load(requests=20, warmup=2, ttft_slo_s=slo[0], tpot_slo_s=slo[1]))
    metrics = {"capacity_rps": rps, "capacity_rps_low": low, "capacity_rps_high": high,
               "attainment_target": 0.9, "ttft_slo_s": slo[0], "tpot_slo_s": slo[1], "cores_held": 2.0,
               "capacity_output_tok_per_s": rps * NEW_TOKENS}
    if status != "skipped":
        metrics.update(c1_ttft_s_p95=c1[0], c1_tpot_s_p95=c1[1], single_stream_rps=0.9,
                       slo_margin=rps if rps > 0 else 1 - max(c1[0] / slo[0], c1[1] / slo[1]))
    command = (f"llama-server --model '<{model}>.{stack.precision}.gguf' --parallel {stack.batch_size}"
               + (f" --batch-size {stack.step_tokens}" if stack.step_tokens else ""))
    tags = {"capacity_status": status, "capacity_note": note or f"{status} (the test's)",
            "user_code": command, "server_command": command, "env.device_name": "Test CPU"}
    return TrialResult(config, "FINISHED", metrics=metrics, tags=tags)


def _served(precision: str, slots: int, kv_bits: int = 16, step: int = 0) -> Stack:
    cache = {"kv_bits": kv_bits, "kv_backend": "ggml"} if kv_bits < 16 else {}
    return Stack(engine="llama_server", precision=precision, batch_size=slots, step_tokens=step, **cache)


def _quality_run(model: str, precision: str, kv_bits: int, kl: float) -> TrialResult:
    cache = {"kv_bits": kv_bits, "kv_backend": "ggml"} if kv_bits < 16 else {}
    stack = Stack(engine="llama_cpp", precision=precision, **cache)
    config = TrialConfig("engines", model, stack, Workload("mixed", 1, 16), repeats=1)
    return TrialResult(config, "FINISHED", metrics={"tok_per_s": 50.0, "kl_divergence": kl,
                                                    "perplexity_ratio": 1 + kl / 2},
                       tags={"stack_name": stack.label})


def _stacks_run(model: str) -> TrialResult:
    """One whole-stack run: the best-stack card (where the capacity block is drawn) needs one."""
    config = TrialConfig("stacks", model, Stack(precision="bf16"), Workload("mixed", 1, 16), repeats=3)
    metrics = {"tok_per_s": 100.0, "tok_per_s_ci_low": 95.0, "tok_per_s_ci_high": 105.0,
               "peak_memory_bytes": 300 * 2**20, "fidelity_token_match": 1.0, "first_divergence_token": 16.0,
               "kl_divergence": 0.001, "perplexity_ratio": 1.001, "speedup_vs_baseline": 1.0,
               "memory_vs_baseline": 1.0, "latency_samples": 24.0, "ttft_s_p95": 0.05, "tpot_s_p95": 0.01}
    return TrialResult(config, "FINISHED", metrics=metrics,
                       tags={"stack_name": "bf16", "reference_precision": "fp32", "user_code": "# bf16"})


# SmolLM2: label -> (stack, status, capacity, low, high, SLO, KL of its GGUF+cache or None: not scored)
SMOL_CONFIGS = {
    "within": (_served("q4_0", 4, step=128), "measured", 1.8, 1.6, 2.0, SLO, 0.004),
    "harmful": (_served("q4_0", 4, kv_bits=4, step=256), "measured", 2.4, 2.1, 2.7, SLO, 0.05),
    "unscored": (_served("q4_1", 2), "measured", 3.0, 2.7, 3.3, SLO, None),
    "infeasible": (_served("f16", 1), "infeasible", 0.0, 0.0, math.nan, SLO, 0.0001),
    "skipped": (_served("q4_0", 8, step=2048), "skipped", 0.0, 0.0, math.nan, SLO, 0.004),
    "bound": (_served("q8_0", 4), "lower_bound", 1.2, 1.0, math.nan, SLO, 0.001),
    "loose": (_served("q4_k_m", 4), "measured", 9.0, 8.0, 10.0, (1.0, 0.1), 0.01),
}


def _label(name: str) -> str:
    return SMOL_CONFIGS[name][0].label


@pytest.fixture(scope="module")
def capacity_store(tmp_path_factory) -> str:
    uri = f"sqlite:///{tmp_path_factory.mktemp('capacity-store') / 'mlflow.db'}"
    tracking.prepare_store(uri)
    # an older run of the picked configuration: the latest run per configuration replaces it
    tracking.log_trial(uri, _capacity_run(SMOL, SMOL_CONFIGS["within"][0], "measured", 5.0, 4.5, 5.5))
    scored = set()
    for name, (stack, status, rps, low, high, slo, kl) in SMOL_CONFIGS.items():
        tracking.log_trial(uri, _capacity_run(SMOL, stack, status, rps, low, high, slo))
        if kl is not None and (stack.precision, stack.kv_bits) not in scored:
            tracking.log_trial(uri, _quality_run(SMOL, stack.precision, stack.kv_bits, kl))
            scored.add((stack.precision, stack.kv_bits))
    # Gemma: nothing feasible; the closer of the two single streams is x1.44 the SLO
    for stack, c1 in ((_served("f16", 1), (0.9, 0.09)), (_served("q4_0", 1), (0.72, 0.061))):
        tracking.log_trial(uri, _capacity_run(GEMMA, stack, "infeasible", 0.0, 0.0, math.nan, c1=c1,
                                              note=f"one request at a time already misses the SLO: p95 TTFT "
                                                   f"{1000 * c1[0]:.0f} ms (limit 500)"))
        tracking.log_trial(uri, _quality_run(GEMMA, stack.precision, 16, 0.001))
    tracking.log_trial(uri, _stacks_run(SMOL))
    return uri


def _decide(uri: str, model: str = SMOL, rate: float | None = None, **limits) -> capacity.CapacityDecision:
    _, in_process = recommend.served.read(uri)
    [decision] = capacity.decide_capacity(capacity.read(uri), in_process, Limits(**limits), [model], rate)
    return decision


def test_the_pick_is_the_highest_capacity_within_the_slo_and_the_quality_budget(capacity_store):
    decision = _decide(capacity_store, max_ttft_s=0.5, max_tpot_s=0.05)
    assert decision.pick.label == _label("within")
    assert decision.pick.rps == 1.8 and decision.pick.interval() == "1.80 req/s [1.60, 2.00]"   # the latest run
    assert decision.pick.status == "measured" and not decision.pick.lower_bound
    assert decision.pick.command.startswith("llama-server --model '<smollm2-135m-instruct>.q4_0.gguf'")
    by_label = {c.label: c for c in decision.configs}
    assert len(by_label) == len(SMOL_CONFIGS)                    # one per configuration, the older run gone
    # higher capacities excluded by quality, said with the number; an unscored GGUF is not passed
    assert by_label[_label("harmful")].misses == ["KL 0.0500 > 0.02", "perplexity +2.5 % > +2 %"]
    assert by_label[_label("unscored")].misses == ["quality not measured (no teacher-forced scores)"]
    assert f"{_label('unscored')}: 3.00 req/s [2.70, 3.30] but quality not measured" in decision.why
    assert f"{_label('harmful')}: 2.40 req/s [2.10, 2.70] but KL 0.0500 > 0.02 and perplexity" in decision.why
    # a run searched under a looser SLO does not count, and what it measured is said
    assert not by_label[_label("loose")].counts
    assert any("9.00 req/s [8.00, 10.00] under p95 TTFT <= 1000 ms, TPOT <= 100 ms" in n for n in decision.notes)
    # without the quality budget the unscored one wins; the looser-SLO one still does not count
    free = _decide(capacity_store, max_ttft_s=0.5, max_tpot_s=0.05, max_kl=None, max_perplexity_increase=None)
    assert free.pick.label == _label("unscored")
    # the served ladder's pick does not read capacity runs (a label like a served stack's would replace it)
    serving, _ = recommend.served.read(capacity_store)
    assert serving.empty


def test_replicas_and_the_cost_per_million_tokens_at_the_rate(capacity_store):
    decision = _decide(capacity_store, rate=2.0, max_ttft_s=0.5, max_tpot_s=0.05, price_per_hour_usd=0.1)
    r = decision.replicas
    assert r.servers == 2 and r.usd_per_hour == pytest.approx(0.2)          # ceil(2 / 1.8) servers
    assert r.output_tokens_per_request == NEW_TOKENS
    assert r.usd_per_million_output_tokens == pytest.approx(0.2 / (2.0 * NEW_TOKENS * 3600) * 1e6)
    assert r.machine == "Test CPU, 2 cores"
    exact = _decide(capacity_store, rate=3.6, max_ttft_s=0.5, max_tpot_s=0.05, price_per_hour_usd=0.1)
    assert exact.replicas.servers == 2                                       # 3.6 / 1.8: exactly two
    unpriced = _decide(capacity_store, rate=2.0, max_ttft_s=0.5, max_tpot_s=0.05)
    assert unpriced.replicas.servers == 2 and unpriced.replicas.usd_per_hour is None
    assert "give --price-per-hour" in unpriced.replicas.describe()


def test_a_lower_bound_is_said(capacity_store):
    """The search cut short (status lower_bound), and a capacity measured under a stricter SLO."""
    cut = _decide(capacity_store, max_ttft_s=0.5, max_tpot_s=0.05, max_kl=0.002)
    assert cut.pick.label == _label("bound") and cut.pick.lower_bound
    assert "1.20 req/s [1.00, ?], a lower bound (the search was cut short)" in capacity.pick_line(cut)
    looser = _decide(capacity_store, max_ttft_s=2.0, max_tpot_s=0.2)       # every run searched stricter
    assert looser.pick.label == _label("loose") and looser.pick.lower_bound
    assert "measured under a stricter SLO (p95 TTFT <= 1000 ms, TPOT <= 100 ms): a lower bound" in \
        capacity.pick_line(looser)


def test_the_slo_must_match_what_the_runs_were_searched_under(capacity_store):
    # the looser run's own SLO: it counts as measured, the stricter-searched ones as lower bounds
    same = _decide(capacity_store, max_ttft_s=1.0, max_tpot_s=0.1)
    assert same.pick.label == _label("loose") and not same.pick.lower_bound
    within = next(c for c in same.configs if c.label == _label("within"))
    assert within.fit == "stricter" and within.lower_bound
    # an infeasible under a stricter SLO says nothing about a looser one
    infeasible = next(c for c in same.configs if c.label == _label("infeasible"))
    assert "says nothing about this one" in infeasible.standing()
    # stricter than every run: nothing counts, and it says what to do
    strict = _decide(capacity_store, max_ttft_s=0.3, max_tpot_s=0.05)
    assert strict.pick is None and strict.why.startswith("every configuration was measured under a looser SLO")
    # no SLO given: the one the model's latest run was searched under
    default = _decide(capacity_store)
    assert default.slo == Slo(1.0, 0.1)          # "loose" is SmolLM2's last capacity run in the store


def test_nothing_feasible_says_why_with_the_single_stream_numbers(capacity_store):
    decision = _decide(capacity_store, GEMMA, max_ttft_s=0.5, max_tpot_s=0.05)
    assert decision.pick is None
    closest, factor = decision.closest
    assert closest.label == _served("q4_0", 1).label and factor == pytest.approx(1.44)
    assert ("nothing sustains p95 TTFT <= 500 ms, TPOT <= 50 ms: the closest, llama_server:q4_0, one request at a "
            "time: p95 TTFT 720 ms (limit 500 ms), p95 TPOT 61 ms (limit 50 ms), x1.44 the SLO") in decision.why
    assert "already misses the SLO: p95 TTFT 720 ms" in decision.why          # the run's own note


def test_recommend_prints_the_capacity_pick_and_its_json(capacity_store, capsys):
    argv = ["--tracking-uri", capacity_store, "--max-ttft", "500ms", "--max-tpot", "50ms", "--rate", "2",
            "--price-per-hour", "0.1"]
    assert recommend.main(argv) == 0
    out = capsys.readouterr().out
    assert f"pick: {_label('within')}: 1.80 req/s [1.60, 2.00], measured" in out
    assert "serve it: llama-server --model '<smollm2-135m-instruct>.q4_0.gguf' --parallel 4 --batch-size 128" in out
    assert "for 2 req/s: 2 server(s) like this one (Test CPU, 2 cores), $0.20/h at $0.1/h each, $0.434 per 1M" in out
    assert f"{GEMMA}: capacity" in out and "x1.44 the SLO" in out
    assert f"{SMOL}: recommended for speed: bf16" in out                       # today's table is still there
    assert recommend.main([*argv, "--json"]) == 0
    printed = {d["model"]: d for d in json.loads(capsys.readouterr().out)}
    pick = printed[SMOL]["capacity_decision"]["pick"]
    assert pick["configuration"] == _label("within") and pick["status"] == "measured"
    assert [pick["capacity_rps"], pick["capacity_rps_low"], pick["capacity_rps_high"]] == [1.8, 1.6, 2.0]
    assert pick["server_command"].startswith("llama-server") and pick["lower_bound"] is False
    assert pick["replicas"]["servers"] == 2 and pick["replicas"]["usd_per_hour"] == pytest.approx(0.2)
    assert pick["replicas"]["usd_per_million_output_tokens"] == pytest.approx(0.2 / (2 * NEW_TOKENS * 3600) * 1e6)
    assert printed[SMOL]["capacity_decision"]["slo"] == {"ttft_s": 0.5, "tpot_s": 0.05, "attainment": 0.9}
    assert len(printed[SMOL]["capacity_decision"]["configurations"]) == len(SMOL_CONFIGS)
    gemma = printed[GEMMA]["capacity_decision"]
    assert gemma["pick"] is None and gemma["closest"]["times_the_slo"] == pytest.approx(1.44)
    assert printed[GEMMA]["table"] == []                                     # capacity runs only
    assert recommend.main([*argv, "--details"]) == 0
    assert f"pick: {_label('within')}" in capsys.readouterr().out


@pytest.mark.parametrize("bad, needle", [("abc", "'abc' is not a rate in requests per second"),
                                         ("0", "a rate must be a finite number of requests per second above 0"),
                                         ("-2", "above 0"), ("inf", "above 0")])
def test_a_bad_rate_is_one_error_line(capacity_store, capsys, bad, needle):
    with pytest.raises(SystemExit) as exit_:
        recommend.main(["--tracking-uri", capacity_store, f"--rate={bad}"])
    assert exit_.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("usage:")
           and not line.startswith(" ")]
    assert len(err) == 1 and needle in err[0] and "--rate" in err[0], err
    assert capacity.parse_rate("2req/s") == 2.0 and capacity.parse_rate(" 0.5 ") == 0.5


def test_the_card_shows_the_capacity_pick_and_works_without_capacity_runs(capacity_store, tmp_path, capsys):
    from page import Page

    page = Page(capacity_store)
    page.select_model("stacks", SMOL, max_ttft_ms=500, max_tpot_ms=50, price_per_hour=0.1, rate_rps=2)
    text = page.text("stacks-best-more")
    assert f"capacity pick: {_label('within')}: 1.80 req/s [1.60, 2.00], measured" in text
    assert "capacity for 2 req/s: 2 server(s) like this one" in text and "$0.434 per 1M" in text
    # the folds: the table's one stack (bf16) first, then the capacity pick's command line
    assert "--parallel 4 --batch-size 128" in page.text("stacks-best-more-fold-1")
    # a store without capacity runs: the card as before, and the command says what to run
    bare = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.prepare_store(bare)
    tracking.log_trial(bare, _stacks_run(SMOL))
    page = Page(bare)
    page.select_model("stacks", SMOL)
    assert "capacity" not in page.text("stacks-best-more") and page.table("stacks-best")["header"]
    assert recommend.main(["--tracking-uri", bare]) == 0
    out = capsys.readouterr().out
    assert capacity.NO_RUNS in out and f"{SMOL}: recommended for speed: bf16" in out

