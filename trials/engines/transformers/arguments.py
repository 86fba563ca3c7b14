"""A stack as transformers' own arguments: what ``from_pretrained`` and ``generate()`` get. Torch-free.

One description serves two readers. The engine materializes it into the objects a trial runs with
(``trials.engines.transformers.generation.prepare``), and ``as_code`` renders it as the code a user
pastes to turn the same stack on (the best-stack card, the run's ``user_code`` tag). Because both
come from ``stack_arguments``, the card cannot show arguments the trial did not use.

Values are plain data:

* ``Literal``: passed as it is (a number, a string, a dict such as the quantized cache's config);
* ``Dtype``: a torch dtype by precision name (``torch.bfloat16``);
* ``Call``: an object built from keyword arguments, plus attributes set after construction
  (``BitsAndBytesConfig(...)``, ``CompileConfig(...)``);
* ``Supplied``: made by the engine from the trial (the draft model, a cache object, the longest
  prompt's length), rendered as a name with the lines that make it.

What the model is, where it changes the arguments, is a ``ModelTraits`` value: a model with
sliding-window layers (Gemma-3) gets a hand-built hybrid cache instead of ``cache_implementation=
"quantized"``, which transformers refuses for it; a draft of another tokenizer drafts through
universal assisted generation (``tokenizer`` and ``assistant_tokenizer``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from trials.config import Stack
from trials.engines.transformers.spec import QUANTIZED

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Literal:
    value: object


@dataclass(frozen=True)
class Dtype:
    precision: str


@dataclass(frozen=True)
class Call:
    name: str
    kwargs: tuple[tuple[str, object], ...] = ()
    attributes: tuple[tuple[str, object], ...] = ()     # set after construction
    variable: str = ""                                   # the name the code gives it, where it has one


@dataclass(frozen=True)
class Supplied:
    name: str                     # what the engine makes ("draft", "hybrid_cache", "max_cache_len")
    code: tuple[str, ...] = ()    # the lines that make it, in a user's code


@dataclass(frozen=True)
class ModelTraits:
    sliding_window: bool = False      # some layers attend to a window (Gemma-3)
    cross_tokenizer: bool = False     # the draft tokenizes differently from the target
    cache_argument: str = "cache"     # generate()'s name for a cache object (older: past_key_values)


@dataclass(frozen=True)
class StackArguments:
    load: dict[str, object] = field(default_factory=dict)       # from_pretrained(...) keywords
    generate: dict[str, object] = field(default_factory=dict)   # generate(...) keywords
    notes: tuple[str, ...] = ()                                  # what the code cannot say by itself
    batch_size: int = 1                                          # prompts per generate() call


def compute_precision(precision: str, reference: str) -> str:
    """The precision quantized weights compute in: the model's reference precision."""
    return reference if precision in QUANTIZED else precision


def load_arguments(precision: str, reference: str) -> dict[str, object]:
    """``from_pretrained`` keywords for a weight precision (``reference``: the precision quantized
    weights compute in, ``trials.models.registry.reference_precision``)."""
    if precision == "int8":
        return {"quantization_config": Call("BitsAndBytesConfig", (("load_in_8bit", True),)),
                "dtype": Dtype(reference)}
    if precision == "nf4":
        return {"quantization_config": Call("BitsAndBytesConfig", (
                    ("load_in_4bit", True), ("bnb_4bit_quant_type", "nf4"),
                    ("bnb_4bit_compute_dtype", Dtype(reference)))),
                "dtype": Dtype(reference)}
    if precision == "gptq":
        return {"dtype": Dtype(reference)}
    return {"dtype": Dtype(precision)}


def cache_config(stack: Stack) -> dict:
    """transformers' ``cache_config`` for the stack's quantized cache."""
    return {"backend": stack.kv_backend, "nbits": stack.kv_bits, "q_group_size": stack.kv_group_size,
            "residual_length": stack.kv_residual_length}


# transformers auto-compiles only on CUDA unless told: the flag makes CPU runs compile the same path
COMPILE = Call("CompileConfig", (("fullgraph", False), ("dynamic", None), ("backend", "inductor"),
                                 ("mode", "default")), (("_compile_all_devices", True),), "compile_config")

DRAFT_SETUP = ("draft = AutoModelForCausalLM.from_pretrained(draft_path)  # in the target's dtype",)


def generate_arguments(stack: Stack, traits: ModelTraits = ModelTraits()) -> dict[str, object]:
    """``generate()`` keywords for the stack, beside greedy decoding of a fixed length."""
    kwargs: dict[str, object] = {}
    if stack.kv_bits != 16:
        if traits.sliding_window:
            layer = {"hqq": "HQQQuantizedLayer", "quanto": "QuantoQuantizedLayer"}[stack.kv_backend]
            settings = ", ".join(f"{k}={v}" for k, v in cache_config(stack).items() if k != "backend")
            kwargs[traits.cache_argument] = Supplied("hybrid_cache", (
                f"cache = Cache(layers=[{layer}({settings}) if kind == 'full_attention' else "
                "DynamicSlidingWindowLayer(sliding_window=model.config.sliding_window) "
                "for kind in model.config.layer_types])  # a fresh one per generate() call",))
        else:
            kwargs["cache_implementation"] = Literal("quantized")
            kwargs["cache_config"] = Literal(cache_config(stack))
    if stack.speculation == "prompt_lookup":
        kwargs["prompt_lookup_num_tokens"] = Literal(stack.num_draft_tokens)
    elif stack.speculation == "draft":
        kwargs["assistant_model"] = Supplied("draft", (
            *DRAFT_SETUP,
            f"draft.generation_config.num_assistant_tokens = {stack.num_draft_tokens}",
            'draft.generation_config.num_assistant_tokens_schedule = "constant"',
            "draft.generation_config.assistant_confidence_threshold = 0.0"))
        if traits.cross_tokenizer:
            kwargs["tokenizer"] = Supplied("tokenizer", ("tokenizer = AutoTokenizer.from_pretrained(model_path)",))
            kwargs["assistant_tokenizer"] = Supplied("assistant_tokenizer", (
                "assistant_tokenizer = AutoTokenizer.from_pretrained(draft_path)",))
    if stack.compile:
        kwargs["cache_implementation"] = Literal("static")
        kwargs["compile_config"] = COMPILE
        kwargs["max_cache_len"] = Supplied("max_cache_len", (
            "max_cache_len = longest_prompt_tokens + max_new_tokens  # one shape: compiled once",))
    return kwargs


def stack_arguments(stack: Stack, reference: str, traits: ModelTraits = ModelTraits()) -> StackArguments:
    """The whole description: load and generate keywords, and notes (GPTQ loads through GPTQModel)."""
    notes = ()
    if stack.precision == "gptq":
        notes = ("GPTQ weights: GPTQModel.load(quantized_folder) instead of from_pretrained "
                 "(trials.models.quantized_weights)",)
    return StackArguments(load_arguments(stack.precision, reference), generate_arguments(stack, traits), notes,
                          stack.batch_size)


# ------------------------------------------------------------------------------ as code

def _render(value) -> str:
    if isinstance(value, Literal):
        return json.dumps(value.value) if isinstance(value.value, dict) else repr(value.value)
    if isinstance(value, Dtype):
        return f"torch.{TORCH_DTYPES[value.precision]}"
    if isinstance(value, Call):
        return value.variable or _call(value)
    if isinstance(value, Supplied):
        return {"draft": "draft", "hybrid_cache": "cache"}.get(value.name, value.name)
    return repr(value)


def _setup(value) -> list[str]:
    if isinstance(value, Supplied):
        return list(value.code)
    if isinstance(value, Call) and value.variable:
        return [f"{value.variable} = {_call(value)}",
                *(f"{value.variable}.{k} = {_render(v)}" for k, v in value.attributes)]
    return []


def _call(value: Call) -> str:
    return f"{value.name}({', '.join(f'{k}={_render(v)}' for k, v in value.kwargs)})"


def as_code(arguments: StackArguments) -> str:
    """The stack as the lines a user writes: setup, ``from_pretrained``, ``generate``."""
    lines = [line for value in arguments.generate.values() for line in _setup(value)]
    load = ", ".join(f"{k}={_render(v)}" for k, v in arguments.load.items())
    generate = ", ".join(f"{k}={_render(v)}" for k, v in arguments.generate.items())
    batch = ([f'inputs = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")  '
              f"# {arguments.batch_size} prompts per generate() call"] if arguments.batch_size > 1 else [])
    lines = [f"model = AutoModelForCausalLM.from_pretrained(model_path, {load})", *lines, *batch,
             f"model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens"
             f"{', ' + generate if generate else ''})"]
    return "\n".join([*lines, *(f"# {note}" for note in arguments.notes)])


def code_for(stack: Stack, reference: str) -> str:
    """The stack as a user's code, from its arguments alone (no model at hand: default traits)."""
    return as_code(stack_arguments(stack, reference))
