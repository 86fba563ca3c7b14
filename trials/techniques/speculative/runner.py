"""Speculative decoding, measured: transformers' own assisted generation, instrumented to count.

A cheap proposer guesses ``k`` tokens; the target checks all of them in one forward pass and keeps
the longest prefix it agrees with, plus one token of its own. Decode is memory-bandwidth-bound, so
checking k+1 tokens costs about one ordinary step: if the guesses are often right (acceptance α) and
cheap (a draft step costs c target steps), each target pass emits more than one token.
Leviathan et al. (2023) give, for k proposals per round with independent acceptance α,

    expected tokens per target pass  E = (1 - α^(k+1)) / (1 - α)
    predicted speedup                S = E / (k·c + 1)

(``trials.stats.theory``). Both are logged beside what was measured, from the α and c measured in the
same trial. α here is
the per-token acceptance probability (``alpha``: accepted / (accepted + rounds ending in a
rejection), its maximum-likelihood estimate), not ``acceptance_rate`` = accepted / proposed, which
falls with k by construction because tokens after a rejection are proposed but never tested.
Where prediction and measurement part, the trial logs why: ``verify_cost_ratio`` (a verification
pass / a plain decode step; Leviathan takes it as 1, and on a CPU it is 1.1-1.8 because a pass over
k+1 tokens is partly compute-bound), ``predicted_speedup_measured_verify`` (the prediction with that
measured cost in place of 1), ``tokens_per_pass_vs_theory`` (measured / expected tokens per pass)
and ``speedup_from_counts`` (the formula fed with the measured tokens per pass and pass costs; what
separates it from the measured speedup is generate()'s own per-round bookkeeping).

Two proposers, both from transformers (we do not re-write the algorithm):

* ``draft``: a small model (``assistant_model=``), with a constant k (set on the draft's generation
  config, as transformers reads it there; the adaptive schedule and the confidence early-exit are
  switched off so that k means what the charts say). A draft of the same vocabulary proposes token
  ids; one with another tokenizer (e.g. SmolLM2 drafting for Gemma-3) goes through transformers'
  universal assisted generation, which decodes the draft's tokens to text and re-tokenizes them for
  the target (``speculation_method`` says which; counts are in target tokens);
* ``prompt_lookup``: n-gram matching against the prompt and what was generated so far
  (``prompt_lookup_num_tokens=k``); it costs almost nothing and shines on copy-heavy text.

Instrumentation, without changing the algorithm: inside ``SpeculationProbe`` the target's
``_get_candidate_generator`` is wrapped so that each ``generate()`` call's candidate generator reports
every round: how many tokens it proposed (``get_candidates``, timed: that is the draft's cost) and
how many the target accepted (``update_candidate_strategy`` receives ``n_matches``). One round = one
target forward pass. A forward hook times the target's verification passes.

The no-speculation baseline runs the same prompts through the same loop (``trials.loop.measure``) in
the same worker; it is measured once per worker for a given model and workload and reused by that
worker's other speculative trials for up to ``BASELINE_MAX_AGE_S`` (the tag ``baseline_source`` says
which trial measured it). Every greedy output must equal the baseline's token for token (``lossless``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace

import torch

from trials import engines
from trials.config import Runtime, Stack, TrialConfig
from trials.engines.transformers.speculation import load_draft, same_vocabulary
from trials.loop import Measured, TrialResult, compare_outputs, finish, measure, trial_prompts
from trials.models import loading
from trials.prompts import Prompt
from trials.stats.theory import leviathan
from trials.worker import WORKER

BASELINE_MAX_AGE_S = 15 * 60


def method(config: TrialConfig, target: loading.LoadedModel) -> str:
    """How the stack speculates, for the run's ``speculation_method`` tag."""
    stack = config.stack
    if stack.speculation == "prompt_lookup":
        return "prompt lookup (n-gram match in the prompt and output)"
    if same_vocabulary(load_draft(config, target), target):
        return "assisted generation (draft and target share the vocabulary)"
    return ("universal assisted generation (cross-tokenizer: the draft's tokens are decoded to text and "
            "re-tokenized for the target; counts are in target tokens)")


# ------------------------------------------------------------------------------ counting

@dataclass
class Round:
    call: int              # which generate() call (prompt) of the probe
    proposed: int          # candidate tokens the proposer offered
    accepted: int          # of which the target accepted (a prefix)
    propose_s: float       # wall time of get_candidates (the draft's whole cost for this round)
    first: bool            # the round that also pre-filled the prompt


@dataclass
class SpeculationProbe:
    """Counts proposals and acceptances of every round of every ``generate()`` while entered."""

    model: torch.nn.Module
    rounds: list[Round] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)   # target forward passes after prefill
    calls: int = 0

    def __enter__(self) -> "SpeculationProbe":
        original = self.model._get_candidate_generator

        def instrumented(*args, **kwargs):
            generator = original(*args, **kwargs)
            self._instrument(generator, self.calls)
            self.calls += 1
            return generator

        self.model._get_candidate_generator = instrumented
        self._hooks = [self.model.register_forward_pre_hook(self._pass_started),
                       self.model.register_forward_hook(self._pass_ended)]
        return self

    def __exit__(self, *exc) -> None:
        del self.model._get_candidate_generator   # back to the class's method
        for hook in self._hooks:
            hook.remove()

    def _sync(self) -> None:
        if next(self.model.parameters()).is_cuda:
            torch.cuda.synchronize()

    def _pass_started(self, module, args) -> None:
        self._sync()
        self._pass_t0 = time.perf_counter()

    def _pass_ended(self, module, args, output) -> None:
        self._sync()
        if self.rounds and not self.rounds[-1].first:   # the first round's pass is the prefill
            self.verify_s.append(time.perf_counter() - self._pass_t0)

    def _instrument(self, generator, call: int) -> None:
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy
        first = [True]

        def timed_get_candidates(input_ids, *args, **kwargs):
            self._sync()
            t0 = time.perf_counter()
            candidates, logits = get_candidates(input_ids, *args, **kwargs)
            self._sync()
            self.rounds.append(Round(call, candidates.shape[1] - input_ids.shape[1], 0,
                                     time.perf_counter() - t0, first[0]))
            first[0] = False
            return candidates, logits

        def counted_update(input_ids, scores, num_matches):
            self.rounds[-1].accepted = int(num_matches)
            return update(input_ids, scores, num_matches)

        generator.get_candidates = timed_get_candidates
        generator.update_candidate_strategy = counted_update


def speculation_metrics(probe: SpeculationProbe, prompts: list[Prompt], k: int, repeats: int,
                        target_step_s: float) -> dict[str, float]:
    """Acceptance, tokens per pass, token sources, cost ratio and the theory beside them."""
    rounds = probe.rounds
    proposed = sum(r.proposed for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    emitted = sum(r.accepted + 1 for r in rounds)
    # Leviathan's α is the chance that a draft token is accepted once every token before it was;
    # accepted / proposed is not it (tokens after the first rejection are proposed but never
    # tested, so accepted / proposed falls with k even when α does not). Under the model each
    # tested token is a Bernoulli(α) trial and testing stops at the first rejection, so the
    # maximum-likelihood α is accepted / (accepted + rounds that ended in a rejection).
    rejected = sum(1 for r in rounds if r.accepted < r.proposed)
    alpha = accepted / (accepted + rejected) if accepted + rejected else 0.0
    draft_steps = [r.propose_s / r.proposed for r in rounds if r.proposed and not r.first]
    draft_step_s = statistics.median(draft_steps) if draft_steps else 0.0
    cost_ratio = draft_step_s / target_step_s
    expected, predicted = leviathan(alpha, k, cost_ratio)
    metrics = {
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "alpha": alpha,
        "rejected_rounds": rejected / repeats,
        "draft_tokens_proposed": proposed / repeats,
        "draft_tokens_accepted": accepted / repeats,
        "target_passes": len(rounds) / repeats,
        "tokens_per_target_pass": emitted / len(rounds),
        "tokens_from_draft": accepted / repeats,
        "tokens_from_target": len(rounds) / repeats,     # each pass adds one token of its own
        "rounds_without_proposal": sum(1 for r in rounds if not r.proposed) / repeats,
        "draft_step_s": draft_step_s,
        "target_step_s": target_step_s,
        "draft_cost_ratio": cost_ratio,
        "expected_tokens_per_target_pass": expected,
        "predicted_speedup": predicted,
    }
    metrics["tokens_per_pass_vs_theory"] = metrics["tokens_per_target_pass"] / expected
    if probe.verify_s:
        # Leviathan assumes a verification pass of k+1 tokens costs one decode step; measure it.
        metrics["verify_pass_s"] = statistics.median(probe.verify_s)
        metrics["verify_cost_ratio"] = metrics["verify_pass_s"] / target_step_s
        metrics["speedup_from_counts"] = metrics["tokens_per_target_pass"] / (
            metrics["verify_cost_ratio"] + k * cost_ratio)
        metrics["predicted_speedup_measured_verify"] = expected / (metrics["verify_cost_ratio"]
                                                                   + k * cost_ratio)
    for i in range(1, k + 1):
        offered = [r for r in rounds if r.proposed >= i]
        if offered:
            metrics[f"accepted_per_position_{i}"] = sum(r.accepted >= i for r in offered) / len(offered)
    for type_ in sorted({p.type for p in prompts}):
        calls = {c for c in range(probe.calls) if prompts[c % len(prompts)].type == type_}
        typed = [r for r in rounds if r.call in calls]
        offered = sum(r.proposed for r in typed)
        if offered:
            metrics[f"acceptance_rate_{type_}"] = sum(r.accepted for r in typed) / offered
    return metrics


# ------------------------------------------------------------------------------ the trial

@dataclass
class _Baseline:
    measured: Measured
    tok_per_s: float
    step_s: float


def _baseline(config: TrialConfig, loaded: loading.LoadedModel, prompts: list[Prompt]) -> tuple[_Baseline, str]:
    """The no-speculation run of the same prompts in this worker (measured, or reused if recent)."""
    plain = replace(config, group="baseline", stack=Stack(precision=config.stack.precision))

    def make() -> _Baseline:
        measured = measure(plain, loaded, prompts, generate_kwargs={})
        throughput = [sum(b.decode_tokens for b in rep) / sum(b.decode_s for b in rep)
                      for rep in measured.repeats]
        steps = [b.decode_s / b.decode_tokens for rep in measured.repeats for b in rep]
        return _Baseline(measured, statistics.median(throughput), statistics.median(steps))

    memo = WORKER.memo("speculative.baseline", max_age_s=BASELINE_MAX_AGE_S)
    return memo.get(plain.config_hash, config.config_hash, make)


def run_speculative(config: TrialConfig, runtime: Runtime) -> TrialResult:
    """Baseline and speculative decoding of the same prompts, counted and compared token for token."""
    stack = config.stack                 # speculation on, batch 1, full cache: the group's guard
    loaded = loading.load(config.entry(), stack.precision, config.device)
    prompts = trial_prompts(config, loaded)
    baseline, source = _baseline(config, loaded, prompts)
    prepared = engines.backend(config.stack).prepare(config, loaded, prompts)
    probe = SpeculationProbe(loaded.model)
    measured = measure(config, loaded, prompts, generate_kwargs=prepared.kwargs, probe=probe)
    result = finish(config, runtime, loaded, measured,
                    tags={"baseline_source": source, "proposer": stack.draft_model or "prompt lookup",
                          "speculation_method": method(config, loaded), "user_code": prepared.code})
    metrics = speculation_metrics(probe, prompts, stack.num_draft_tokens, config.repeats,
                                  baseline.step_s)
    metrics.update(compare_outputs(measured.outputs(), baseline.measured.outputs()))
    metrics["baseline_tok_per_s"] = baseline.tok_per_s
    metrics["speedup"] = result.metrics["tok_per_s"] / baseline.tok_per_s
    metrics["speedup_vs_predicted"] = metrics["speedup"] / metrics["predicted_speedup"]
    result.metrics.update(metrics)
    result.raw["rounds"] = [r.__dict__ for r in probe.rounds[: len(probe.rounds) // config.repeats]]
    return result
