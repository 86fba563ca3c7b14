"""llama-server's step time against its tokens (trials.stats.step_time): the fit, the predicted p95 ITL
per -b, the TPOT skip rule; the curve's cache (trials.engines.llama_server.step_curve) with a stand-in
measurement; and one real curve measured with llama-bench, where the tools are built."""

import json
import math

import pytest

from trials.engines.llama_cpp import tools
from trials.engines.llama_server import step_curve
from trials.errors import ConfigError
from trials.models import pypi
from trials.stats.step_time import (StepCurve, effective_step_tokens, predict_itl, predict_itl_p95,
                                    prompt_chunks, tpot_cannot_meet)

LINE = StepCurve(fixed_s=0.005, per_token_s=0.0015)        # 6.5 ms to decode one token, 1.5 ms a prompt token


def test_the_fit_is_exact_on_a_line_and_keeps_its_samples():
    samples = [(n, 0.004 + 0.0017 * n) for n in (1, 8, 32, 64, 128, 256)]
    curve = StepCurve.fit(samples)
    assert curve.fixed_s == pytest.approx(0.004) and curve.per_token_s == pytest.approx(0.0017)
    assert curve.residual == pytest.approx(0, abs=1e-12)
    assert curve.samples == tuple(samples) and curve.seconds(100) == pytest.approx(0.174)
    noisy = StepCurve.fit([(1, 0.006), (8, 0.02), (32, 0.06), (64, 0.13)])
    assert noisy.residual > 0 and noisy.per_token_s > 0


def test_the_fit_refuses_what_is_no_curve():
    with pytest.raises(ValueError, match="two token counts"):
        StepCurve.fit([(8, 0.01), (8, 0.011)])
    with pytest.raises(ValueError, match="positive"):
        StepCurve.fit([(1, 0.01), (8, 0.0)])
    flat = StepCurve.fit([(1, 0.012), (8, 0.010)])          # noise: a step never gets cheaper with more tokens
    assert flat.per_token_s == 0 and flat.seconds(1) == flat.seconds(256)


def test_the_step_tokens_in_effect():
    assert effective_step_tokens(0) == 2048
    assert effective_step_tokens(32) == 64 and effective_step_tokens(64) == 64 and effective_step_tokens(300) == 300
    with pytest.raises(ValueError):
        effective_step_tokens(-1)
    assert prompt_chunks(150, 64) == [64, 64, 22] and prompt_chunks(150, 0) == [150] and prompt_chunks(64, 64) == [64]


def test_at_a_low_rate_the_p95_is_the_decode_step():
    p95 = predict_itl_p95(LINE, 0, slots=4, prompt_tokens=120, new_tokens=32, rate_rps=0.01)
    assert p95 == pytest.approx(LINE.seconds(1), rel=0.01)


def test_at_a_high_rate_the_p95_is_the_mixed_step():
    detail = predict_itl(LINE, 0, slots=4, prompt_tokens=120, new_tokens=32, rate_rps=4.0)
    assert detail.mixed_share >= 0.05 and 1 < detail.active <= 4
    assert detail.itl_s_p95 == pytest.approx(LINE.seconds(detail.active + 120))
    saturated = predict_itl(LINE, 0, slots=4, prompt_tokens=120, new_tokens=32, rate_rps=50.0)
    assert saturated.mixed_share == 1.0 and saturated.active == 4


def test_a_smaller_b_predicts_a_smaller_p95_at_the_same_rate():
    p95 = {b: predict_itl_p95(LINE, b, slots=4, prompt_tokens=150, new_tokens=32, rate_rps=4.0) for b in (64, 128, 0)}
    assert p95[64] < p95[128] < p95[0]
    # the floor: a -b of 32 is run as 64
    assert predict_itl_p95(LINE, 32, 4, 150, 32, 4.0) == p95[64]
    # the price: three stalls per prompt instead of one reach 5 % of the gaps at a lower rate
    small, default = (predict_itl(LINE, b, 4, 150, 32, 2.0) for b in (64, 0))
    assert small.mixed_share >= 0.05 > default.mixed_share
    assert small.itl_s_p95 == small.mixed_step_s and default.itl_s_p95 == default.decode_step_s


def test_the_prediction_refuses_nonsense():
    with pytest.raises(ValueError, match="slots"):
        predict_itl_p95(LINE, 0, slots=0, prompt_tokens=100, new_tokens=32, rate_rps=1)
    with pytest.raises(ValueError, match="rate_rps"):
        predict_itl_p95(LINE, 0, slots=4, prompt_tokens=100, new_tokens=32, rate_rps=math.nan)


def test_the_tpot_skip_rule_names_its_numbers():
    assert tpot_cannot_meet(LINE, 0, slots=4, prompt_tokens=150, new_tokens=32, tpot_limit_s=0.05) is None
    # 4 new tokens: 3 gaps of t(2) = 8 ms, plus one 150-token stall of t(151) - t(2) = 223.5 ms -> 82.5 ms
    line = tpot_cannot_meet(LINE, 0, slots=4, prompt_tokens=150, new_tokens=4, tpot_limit_s=0.05)
    assert line == ("-b 2048: one 150-token prompt arriving during a 4-token decode adds 223.5 ms over 1 mixed "
                    "step(s) to 3 gaps of 8.0 ms: TPOT 82.5 ms > the 50 ms limit")
    chunked = tpot_cannot_meet(LINE, 64, slots=4, prompt_tokens=150, new_tokens=4, tpot_limit_s=0.05)
    assert "over 3 mixed step(s)" in chunked and "TPOT 81.5 ms" in chunked
    # one slot: a prompt never joins a decode, only the decode step itself can miss
    assert tpot_cannot_meet(LINE, 0, slots=1, prompt_tokens=150, new_tokens=4, tpot_limit_s=0.05) is None
    assert "1 slot: a decode step alone takes 6.5 ms" in tpot_cannot_meet(LINE, 0, 1, 150, 4, 0.005)
    assert tpot_cannot_meet(LINE, 0, 4, 150, 1, 0.001) is None


# ------------------------------------------------------------------ the cache, with a stand-in measurement

@pytest.fixture
def fake_measure(tmp_path, monkeypatch):
    """``step_curve.measure`` replaced by a line, counting its calls; the cache in a temporary folder."""
    monkeypatch.setenv(step_curve.CACHE_ENV_VAR, str(tmp_path / "curves"))
    calls = []

    def measure(gguf_path, cache_type, threads, folder=None, timeout_s=600):
        calls.append((gguf_path, cache_type, threads))
        samples = [(1, 0.007), (8, 0.02), (64, 0.11)] if cache_type != "noisy" else [(1, 0.007), (8, 0.09), (64, 0.11)]
        spread = {"pp8": 0.4, "pp64": 0.3, "tg16": 0.02} if cache_type == "spread" else {"pp8": 0.01}
        return StepCurve.fit(samples), {"command": ["llama-bench"], "relative_stddev": spread}

    monkeypatch.setattr(step_curve, "measure", measure)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"weights")
    return calls, gguf, tmp_path / "0.3.36-build"


def test_a_curve_is_measured_once_per_model_and_configuration(fake_measure):
    calls, gguf, folder = fake_measure
    first, record = step_curve.step_curve(gguf, "q8_0", 2, folder=folder)
    assert not record["cached"] and len(calls) == 1
    again, record = step_curve.step_curve(gguf, "q8_0", 2, folder=folder)
    assert record["cached"] and again == first and len(calls) == 1
    step_curve.step_curve(gguf, "q8_0", 1, folder=folder)                  # other threads
    step_curve.step_curve(gguf, "f16", 2, folder=folder)                   # another cache type
    step_curve.step_curve(gguf, "q8_0", 2, folder=folder.with_name("other-build"))
    assert len(calls) == 4
    gguf.write_bytes(b"other weights")                                      # the GGUF rebuilt
    step_curve.step_curve(gguf, "q8_0", 2, folder=folder)
    assert len(calls) == 5


@pytest.mark.parametrize("damage", ["{not json", '{"format_version": 1}', "[]", "key", "samples"])
def test_a_damaged_cache_file_is_measured_again(fake_measure, damage):
    calls, gguf, folder = fake_measure
    step_curve.step_curve(gguf, "q8_0", 2, folder=folder)
    path = step_curve.cache_file(step_curve.curve_key(gguf, "q8_0", 2, folder.name))
    data = json.loads(path.read_text())
    if damage == "key":
        data["key"]["threads"] = 8
        text = json.dumps(data)
    elif damage == "samples":
        data["samples"] = [[1, -0.5], [8, "x"]]
        text = json.dumps(data)
    else:
        text = damage
    path.write_text(text)
    curve, record = step_curve.step_curve(gguf, "q8_0", 2, folder=folder)
    assert not record["cached"] and record["remeasured"] and len(calls) == 2
    assert step_curve.step_curve(gguf, "q8_0", 2, folder=folder)[1]["cached"]


def test_a_curve_measured_while_something_else_ran_is_not_kept(fake_measure):
    calls, gguf, folder = fake_measure
    curve, record = step_curve.step_curve(gguf, "noisy", 2, folder=folder)
    assert curve.residual > step_curve.MAX_KEPT_RESIDUAL and "the fit strays" in record["noisy"]
    assert not step_curve.step_curve(gguf, "noisy", 2, folder=folder)[1]["cached"] and len(calls) == 2
    record = step_curve.step_curve(gguf, "spread", 2, folder=folder)[1]
    assert record["noisy"] == "llama-bench's repeats spread 30 % (median; more than 15 %): not kept"
    assert not step_curve.step_curve(gguf, "spread", 2, folder=folder)[1]["cached"] and len(calls) == 4


def test_llama_bench_rows_become_one_step_each():
    rows = [{"n_prompt": 8, "n_gen": 0, "avg_ns": 20e6, "samples_ns": [21e6, 19e6]},
            {"n_prompt": 64, "n_gen": 0, "avg_ns": 110e6},
            {"n_prompt": 0, "n_gen": 16, "avg_ns": 16 * 7e6, "samples_ns": [16 * 7e6, 16 * 8e6]}]
    samples = step_curve.samples_from_rows(rows, (8, 64), 16)
    assert samples == [(8, pytest.approx(0.019)), (64, pytest.approx(0.11)), (1, pytest.approx(0.007))]
    with pytest.raises(tools.ToolError, match="no pp32 row"):
        step_curve.samples_from_rows(rows, (8, 32), 16)


# ------------------------------------------------------------------ a real curve

@pytest.fixture(scope="module")
def built():
    """The tools `make setup` built; the test skips, saying why, where they are not."""
    try:
        return tools.tools_dir(build=False)
    except ConfigError as exc:
        pytest.skip(f"llama.cpp's tools are not built here: {exc}")


@pytest.fixture(scope="module")
def smollm2_gguf():
    """The smallest real GGUF on the machine: SmolLM2-135M's Q4_1, inside its PyPI package."""
    try:
        return pypi.gguf_chunks("smollm2-135m-instruct")[0]
    except (ConfigError, OSError) as exc:
        pytest.skip(f"SmolLM2's GGUF is not installed: {exc}")


def test_a_real_curve_grows_with_the_tokens_in_a_step(built, smollm2_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv(step_curve.CACHE_ENV_VAR, str(tmp_path))
    monkeypatch.setattr(step_curve, "PROMPT_SIZES", (8, 32, 128))      # a few seconds on one thread
    monkeypatch.setattr(step_curve, "REPEATS", 2)
    curve, record = step_curve.step_curve(smollm2_gguf, "f16", threads=1, folder=built, timeout_s=120)
    assert not record["cached"] and "-b 128 -ub 128" in " ".join(record["command"])
    tokens = [n for n, _ in curve.samples]
    seconds = [s for _, s in curve.samples]
    assert tokens == [1, *step_curve.PROMPT_SIZES]
    assert all(a < b for a, b in zip(seconds, seconds[1:])), curve.samples
    assert curve.per_token_s > 0 and curve.seconds(256) > curve.seconds(1)
    if "noisy" not in record:                   # kept: read back, not measured again
        again, record = step_curve.step_curve(smollm2_gguf, "f16", threads=1, folder=built)
        assert record["cached"] and again == curve
