"""Speculative decoding (trials/techniques/speculative/runner.py, the ``speculative`` space and dashboard section).

Real models from the tiny zoo, transformers' own assisted generation, a real MLflow store and the
real dashboard's page (tests/page.py; Chromium draws it in tests/test_every_chart.py). The counting is checked where the answer is known without
trusting the code under test: a target used as its own draft must have every proposal accepted and
emit exactly k+1 tokens per target pass; and in every trial the tokens counted per round must add
up to the tokens actually generated.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tracking
from sweeps.spaces import PROFILES
from trials.config import ConfigError, Stack, TrialConfig, Workload
from trials.loop import failed_result
from trials.models import loading
from trials.models.registry import get_model
from trials.run import run_trial
from trials.stats.theory import expected_tokens_per_pass, leviathan
from trials.techniques.speculative.space import plan as speculative

TOKENS = 24          # a multiple of k+1 for k in {1, 2, 3, 5}: no round is cut short by the limit


def _config(model: str = "tiny-mha", speculation: str = "draft", k: int = 3, draft: str | None = "tiny-draft",
            per_type: int = 1, tokens: int = TOKENS, repeats: int = 1) -> TrialConfig:
    return TrialConfig(group="speculative", model=model, device="cpu",
                       stack=Stack(precision="fp32", speculation=speculation,
                                   draft_model=draft if speculation == "draft" else None,
                                   num_draft_tokens=k),
                       workload=Workload("mixed", per_type, tokens), repeats=repeats)


def _generated(result) -> int:
    """New tokens per workload pass, from the outputs themselves (not from the probe's counts)."""
    return sum(len(o["token_ids"]) for o in result.raw["outputs"])      # outputs of the first repeat


def _check_accounting(result) -> None:
    m = result.metrics
    assert m["tokens_from_draft"] + m["tokens_from_target"] == _generated(result)
    assert m["tokens_from_draft"] == m["draft_tokens_accepted"]
    assert m["tokens_per_target_pass"] == pytest.approx(_generated(result) / m["target_passes"])
    assert m["acceptance_rate"] == pytest.approx(m["draft_tokens_accepted"] / m["draft_tokens_proposed"])
    assert m["lossless"] == 1


@pytest.mark.parametrize("k", [1, 3])
def test_a_target_as_its_own_draft_accepts_everything_and_emits_k_plus_1_per_pass(tiny_zoo, k):
    result = run_trial(_config(k=k, draft="tiny-mha"))
    assert result.status == "FINISHED", result.error
    m = result.metrics
    assert m["acceptance_rate"] == 1.0 and m["alpha"] == 1.0 and m["rejected_rounds"] == 0
    assert m["tokens_per_target_pass"] == k + 1
    assert m["expected_tokens_per_target_pass"] == k + 1
    assert all(m[f"accepted_per_position_{i}"] == 1.0 for i in range(1, k + 1))
    assert m["target_passes"] == TOKENS * 4 / (k + 1)      # 4 prompt types x 1 prompt
    _check_accounting(result)


def test_draft_speculation_is_lossless_and_counts_add_up(tiny_zoo):
    result = run_trial(_config(model="tiny-gqa", k=2, per_type=2, repeats=2))
    assert result.status == "FINISHED", result.error
    m = result.metrics
    _check_accounting(result)
    assert 0 < m["acceptance_rate"] < 1
    assert m["baseline_tok_per_s"] > 0 and m["speedup"] == pytest.approx(m["tok_per_s"] / m["baseline_tok_per_s"])
    # α is per token: accepted over tested (accepted + the rejection that ends a round)
    assert m["alpha"] == pytest.approx(m["draft_tokens_accepted"]
                                       / (m["draft_tokens_accepted"] + m["rejected_rounds"]))
    assert m["alpha"] >= m["acceptance_rate"]
    expected, predicted = leviathan(m["alpha"], 2, m["draft_cost_ratio"])
    assert m["expected_tokens_per_target_pass"] == pytest.approx(expected)
    assert m["predicted_speedup"] == pytest.approx(predicted)
    assert m["draft_cost_ratio"] == pytest.approx(m["draft_step_s"] / m["target_step_s"])
    assert {f"acceptance_rate_{t}" for t in ("code", "prose", "structured", "repetitive")} <= set(m)
    assert m["accepted_per_position_1"] >= m["accepted_per_position_2"]
    assert result.tags["proposer"] == "tiny-draft"
    assert len(result.raw["rounds"]) == m["target_passes"]


def test_prompt_lookup_is_lossless_and_counts_add_up(tiny_zoo):
    result = run_trial(_config(speculation="prompt_lookup", k=4, per_type=2))
    assert result.status == "FINISHED", result.error
    _check_accounting(result)
    assert result.tags["proposer"] == "prompt lookup"
    # Copy-heavy prompts are where n-gram lookup finds something to propose.
    assert result.metrics["acceptance_rate_repetitive"] > 0


def test_leviathan_formula():
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert leviathan(0.5, 2, 0.25) == pytest.approx((1.75, 1.75 / 1.5))


# ------------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("stack, message", [
    (dict(speculation="draft", draft_model="tiny-draft", num_draft_tokens=0), "num_draft_tokens (k) >= 1"),
    (dict(speculation="prompt_lookup", num_draft_tokens=-2), "num_draft_tokens (k) >= 1"),
    (dict(speculation="draft", draft_model="tiny-draft", num_draft_tokens=2, batch_size=4), "batch_size 1 only"),
    (dict(speculation="draft", num_draft_tokens=2), "needs a draft_model"),
])
def test_bad_speculation_stacks_are_config_errors(stack, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrialConfig(group="speculative", model="tiny-mha", stack=Stack(**stack))


def test_a_draft_of_another_vocabulary_but_the_same_size_is_a_failed_run(tiny_zoo, tmp_path):
    """Different tokens, same vocab_size: transformers could not tell, so it is refused in one line
    (drafts of another vocabulary size draft across tokenizers: tests/test_real_models.py)."""
    loaded = loading.load("tiny-mha", "fp32", "cpu")
    folder = tmp_path / "other-vocab"
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.add_tokens(["<not-in-the-draft>"])
    loaded.tokenizer.save_pretrained(folder)
    config = _config(model=str(folder), k=2)
    with pytest.raises(ConfigError, match="different tokenizer") as caught:
        run_trial(config)
    failed = failed_result(config, caught.value)       # what the sweep's trainable records
    assert failed.status == "FAILED" and failed.error.startswith("draft 'tiny-draft' has a different")
    assert "\n" not in failed.error


def test_a_target_without_a_draft_gets_prompt_lookup_only(tiny_zoo):
    folder = str(Path(loading.load("tiny-mha", "fp32", "cpu").model.config._name_or_path))
    planned = speculative([folder], PROFILES["quick"], "cpu")
    assert planned and {c.stack.speculation for c in planned} == {"prompt_lookup"}



def test_space_plans_every_k_and_prompt_lookup_for_targets_only():
    for profile in ("quick", "full"):
        configs = speculative(["tiny-mha", "tiny-draft"], PROFILES[profile], "cpu")
        sizing = PROFILES[profile].settings("speculative", get_model("tiny-mha"), "cpu")
        assert {c.model for c in configs} == {"tiny-mha"}
        assert [c.stack.num_draft_tokens for c in configs if c.stack.speculation == "draft"] == list(sizing["draft_k"])
        assert [c.stack.num_draft_tokens for c in configs if c.stack.speculation == "prompt_lookup"] \
            == list(sizing["lookup_k"])
        assert all(c.stack.batch_size == 1 and c.stack.draft_model in (None, "tiny-draft") for c in configs)


# ------------------------------------------------------------------------------------ sweep + charts

def test_sweep_fills_the_experiment_and_all_six_charts_plot(quick_sweep):
    """The session's sweep (quick profile, tiny targets) read back through the dashboard's page."""
    from page import Page

    speculative_store = quick_sweep.uri
    planned = len(speculative(["tiny-mha", "tiny-gqa"], PROFILES["quick"], "cpu"))
    assert quick_sweep.counts("speculative") == (planned, 0, 0), quick_sweep.log()
    frame = tracking.runs_frame(speculative_store, "speculative")
    assert set(frame["lossless"]) == {1.0}
    assert frame["baseline_tok_per_s"].gt(0).all() and frame["acceptance_rate"].between(0, 1).all()
    page = Page(speculative_store)
    throughput = page.figure("speculative-throughput")
    acceptance = page.figure("speculative-acceptance")
    caption = page.text("speculative-caption")
    deep = {}
    for model in ("tiny-gqa", "tiny-mha"):            # the selector starts at the first
        if model != "tiny-gqa":
            page.select_model("speculative", model)
        assert page.figure("speculative-acceptance-vs-k")["title"].startswith(f"{model}:")
        deep[model] = {i: page.figure(i) for i in (
            "speculative-acceptance-vs-k", "speculative-throughput-vs-k",
            "speculative-token-source", "speculative-acceptance-by-type")}
    best = frame.loc[frame.groupby(["model", "speculation"])["tok_per_s"].idxmax()]
    traces = {t["name"]: t for t in throughput["traces"]}
    for name, speculation in (("draft model (best k)", "draft"), ("prompt lookup (best k)", "prompt_lookup")):
        part = best[best["speculation"] == speculation].sort_values("model")
        assert traces[name]["x"] == list(part["model"])
        assert traces[name]["y"] == pytest.approx(list(part["tok_per_s"]))
    assert traces["no speculation"]["y"] and throughput["bars_drawn"] == 6
    assert acceptance["bars_drawn"] == 4
    for model, charts in deep.items():
        rows = frame[(frame["model"] == model) & (frame["speculation"] == "draft")].sort_values("num_draft_tokens")
        by_name = {t["name"]: t for t in charts["speculative-throughput-vs-k"]["traces"]}
        assert by_name["draft model (measured)"]["x"] == list(rows["num_draft_tokens"])
        assert by_name["draft model (measured)"]["y"] == pytest.approx(list(rows["tok_per_s"]))
        assert charts["speculative-throughput-vs-k"]["shapes"] == 1          # the baseline line
        per_pass = {t["name"]: t for t in charts["speculative-acceptance-vs-k"]["traces"]}
        assert per_pass["draft model: tokens per target pass"]["y"] == pytest.approx(
            list(rows["tokens_per_target_pass"]))
        assert any(n.startswith("draft model: theory (1-α^(k+1))/(1-α)") for n in per_pass)
        assert charts["speculative-token-source"]["bars_drawn"] == 4         # 2 proposers x 2 sources
        assert charts["speculative-acceptance-by-type"]["bars_drawn"] >= 7   # 4 types, lookup may miss one
        for chart in charts.values():
            assert chart["points_drawn"] or chart["lines_drawn"]
    assert "Lossless" in caption and f"{len(frame)} of {len(frame)} trials" in caption
