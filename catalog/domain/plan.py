"""The context change: validation, engine arguments, and each profile's memory plan.

Pure Python, no Django: dataclasses in, dataclasses out. `plan_change` is the gateway's
`SetContext` (seed 000) without its effects: it decides what a change of a served model's
context (and longest answer) would do, or why it is refused, and the services apply it.

The memory model per card (`card_need`) and the source of each of its figures are
documented in docs/memory.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from catalog.domain.args import flag_name, get_arg, get_int, has_flag, set_arg
from catalog.domain.shape import Shape

from catalog.domain.kv import ENGINES, kv_bytes, kv_settings_from_args

GiB = 1 << 30
MiB = 1 << 20

MIN_CONTEXT = 256
MAX_TOKENS = 2**31 - 1  # engines keep a context in a 32-bit integer (llama.cpp's n_ctx is uint32_t)
MAX_SLOTS = 64

# Engine flags that carry the context, with the aliases the engines accept.
CTX_SIZE = ("--ctx-size", "-c")  # llama.cpp common/arg.cpp
PARALLEL = ("--parallel", "-np")
MAX_MODEL_LEN = ("--max-model-len",)  # vLLM
CONTEXT_LENGTH = ("--context-length",)  # SGLang
STRATA_CONTEXT = ("--context",)
FREETOKEN_CONTEXT = ("--max-seq-len-override",)
UBATCH = ("--ubatch-size", "-ub")
# Per engine, the flags a context change rewrites (and nothing else may).
CONTEXT_FLAGS = {
    "llamacpp": (CTX_SIZE, PARALLEL),
    "vllm": (MAX_MODEL_LEN,),
    "sglang": (CONTEXT_LENGTH,),
    "strata": (STRATA_CONTEXT,),
    "freetoken": (FREETOKEN_CONTEXT,),
}

NO_CARD_CHECK = {
    "strata": "strata's setup writes the engine's start script with the context at every start, "
    "and it sizes its KV and expert caches to the card itself: there is no card check to make here",
    "freetoken": "freetoken keeps its experts in RAM and streams them to the card, so the weights "
    "are not what has to fit there: there is no card check to make here",
}

# The memory model's figures; docs/memory.md gives the source of each.
VLLM_DEFAULT_UTILIZATION = 0.9  # SPEC §3; vLLM 0.33.0 itself defaults to 0.92 (vllm/config/cache.py)
VLLM_ACTIVATIONS = 3 * GiB // 2  # torch peak of vLLM's profiling run + its non-torch memory
VLLM_CUDA_GRAPHS = GiB // 2  # CUDA graph pool; 0 with --enforce-eager
LLAMACPP_COMPUTE_PER_UBATCH_TOKEN = MiB  # compute buffer: 512 MiB per card at the default n_ubatch 512
LLAMACPP_DEFAULT_UBATCH = 512
CPU_OVERHEAD = GiB  # the seed's 1 GiB on top of weights + KV on CPUs (plus weights/20)


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class ChangeRequest:
    tokens: int = 0  # 0 = not given
    slots: int = 0  # 0 = keep each llama.cpp profile's --parallel (at least 1)
    max_output: int = 0  # 0 = not given


@dataclass(frozen=True)
class GPUClassInput:
    name: str
    memory_gb: float  # the card's memory, GiB
    usable_gb: float  # what an engine can allocate on it, GiB (catalog data)


@dataclass(frozen=True)
class ProfileInput:
    name: str
    engine: str
    args: tuple[str, ...]
    gpu_class: GPUClassInput | None
    gpus_per_node: int
    tp: int
    pp: int
    nodes: int
    cpu_only: bool
    min_memory_gb: int
    surge_possible: bool = True  # the fleet says whether a node can hold a second copy during a restart


@dataclass(frozen=True)
class ModelInput:
    name: str
    context_length: int
    max_output: int
    declared: bool
    profiles: tuple[ProfileInput, ...]


@dataclass(frozen=True)
class Refusal:
    field: str  # "tokens", "slots", "max_output" or "model"
    message: str
    status: int = 400  # 404 for no such model

    def to_dict(self) -> dict:
        return {"field": self.field, "message": self.message, "status": self.status}


@dataclass(frozen=True)
class MemoryTerms:
    where: str  # "ram" or "card"
    weights_gb: float  # per card on cards, whole on RAM
    kv_gb: float
    state_gb: float
    reserve_gb: float
    need_gb: float
    cards: int  # 0 on RAM
    usable_gb: float | None  # the engine's budget per card; None when not known (or on RAM)
    fits: bool | None  # None when there is nothing to compare with
    text: str  # "12 GB of RAM", "31.2 GB a card of 2, of 78 usable"

    def to_dict(self) -> dict:
        return {
            "where": self.where,
            "weights_gb": _finite(self.weights_gb),
            "kv_gb": _finite(self.kv_gb),
            "state_gb": _finite(self.state_gb),
            "reserve_gb": _finite(self.reserve_gb),
            "need_gb": _finite(self.need_gb),
            "cards": self.cards,
            "usable_gb": _finite(self.usable_gb),
            "fits": self.fits,
            "text": self.text,
        }


@dataclass(frozen=True)
class ProfilePlan:
    profile: str
    engine: str
    args_before: tuple[str, ...]
    args_after: tuple[str, ...]
    changed_flags: tuple[str, ...]
    memory_before: MemoryTerms | None
    memory_after: MemoryTerms | None
    min_memory_gb_after: int
    restart: str  # "surge", "in_place" or "none"
    refusal: Refusal | None
    note: str

    def to_dict(self) -> dict:
        return {
            "profile": self.profile,
            "engine": self.engine,
            "args_before": list(self.args_before),
            "args_after": list(self.args_after),
            "changed_flags": list(self.changed_flags),
            "memory_before": self.memory_before.to_dict() if self.memory_before is not None else None,
            "memory_after": self.memory_after.to_dict() if self.memory_after is not None else None,
            "min_memory_gb_after": self.min_memory_gb_after,
            "restart": self.restart,
            "refusal": self.refusal.to_dict() if self.refusal is not None else None,
            "note": self.note,
        }


@dataclass(frozen=True)
class Plan:
    model: str
    context_before: int
    context_after: int
    max_output_before: int
    max_output_after: int
    output_only: bool
    trained: int  # 0 = not known
    slots: int  # as asked; 0 = each profile keeps its own
    profiles: tuple[ProfilePlan, ...]
    notes: tuple[str, ...]  # what could not be checked, each said once
    refusal: Refusal | None  # the first rule that failed, in the seed's order

    @property
    def ok(self) -> bool:
        return self.refusal is None

    def to_dict(self) -> dict:
        """JSON's form, as the API answers and a change records it (written out: the preview
        sends one on every keystroke, and dataclasses.asdict deep-copies)."""
        return {
            "model": self.model,
            "context_before": self.context_before,
            "context_after": self.context_after,
            "max_output_before": self.max_output_before,
            "max_output_after": self.max_output_after,
            "output_only": self.output_only,
            "trained": self.trained,
            "slots": self.slots,
            "profiles": [p.to_dict() for p in self.profiles],
            "notes": list(self.notes),
            "refusal": self.refusal.to_dict() if self.refusal is not None else None,
            "ok": self.refusal is None,
        }


def _finite(x: float | None) -> float | None:
    """Strict JSON has no Infinity: a need that large is shown as unknown."""
    return x if x is None or math.isfinite(x) else None


# ----------------------------------------------------------------------------- rules


def default_max_output(context: int, cap: int = 32768) -> int:
    """The longest answer a context gets by default: a quarter of it, at most cap."""
    quarter = max(context, 0) // 4
    return min(quarter, cap) if cap > 0 else quarter


def plan_change(
    model: ModelInput | None,
    shape: Shape | None,
    shape_note: str,
    request: ChangeRequest,
    *,
    name: str = "",
    default_max_output_cap: int = 32768,
) -> Plan:
    """What changing a model's context (and longest answer) would do, or why it is refused.

    shape is what sizes the model's context (None when it could not be read, shape_note
    then says why); the memory it needs is checked only when the shape and the weights'
    size are known. A refusal is the first rule that fails, in the seed's order."""
    tokens, slots, max_out = request.tokens, request.slots, request.max_output
    if model is None:
        return _refused_plan(name, None, request, Refusal("model", f"no model {name!r} in the catalog", 404))
    name = model.name
    refusal = None
    if model.declared:
        refusal = Refusal(
            "model",
            f"model {name!r} is declared in the cluster's settings: change its context there (llmgw ctl config edit)",
        )
    elif max_out < 0 or max_out > MAX_TOKENS:
        refusal = Refusal("max_output", f"the longest answer is a number of tokens, 0 to {MAX_TOKENS}")
    elif tokens == 0 and max_out > 0:
        return _max_output_only(model, shape, request)
    elif tokens < MIN_CONTEXT:
        refusal = Refusal("tokens", f"a context of at least {MIN_CONTEXT} tokens")
    elif tokens > MAX_TOKENS:
        refusal = Refusal("tokens", f"a context of at most {MAX_TOKENS} tokens")
    elif max_out > tokens:
        refusal = Refusal("max_output", f"an answer of {max_out} tokens does not fit a context of {tokens}")
    elif slots < 0 or slots > MAX_SLOTS:
        refusal = Refusal("slots", f"slots are 1 to {MAX_SLOTS} (0 keeps each profile's --parallel)")
    elif shape is not None and shape.trained_context > 0 and tokens > shape.trained_context:
        refusal = Refusal(
            "tokens",
            f"{name} was trained for {shape.trained_context} tokens; "
            "a longer context answers worse, and llama.cpp or vLLM refuses it",
        )
    if refusal is not None:
        return _refused_plan(name, model, request, refusal, shape)

    sized = shape if _can_size(shape) else None
    notes = _notes(shape, shape_note)
    profiles = tuple(_profile_plan(p, model, sized, tokens, slots) for p in model.profiles)
    # The seed's order: an engine that takes no context before any card that does not fit.
    refusals = [p.refusal for p in profiles if p.refusal is not None]
    engine_refusals = [r for r in refusals if r.field == "model"]
    refusal = (engine_refusals or refusals or [None])[0]

    return Plan(
        model=name,
        context_before=model.context_length,
        context_after=tokens,
        max_output_before=model.max_output,
        max_output_after=_longest_answer(model, request, default_max_output_cap),
        output_only=False,
        trained=shape.trained_context if shape else 0,
        slots=slots,
        profiles=profiles,
        notes=notes,
        refusal=refusal,
    )


def _longest_answer(model: ModelInput, request: ChangeRequest, cap: int) -> int:
    """SPEC §3: 0 or the old context's default becomes the new context's default, held to
    the new context; an explicit max_output wins."""
    if request.max_output > 0:
        return request.max_output
    out = model.max_output
    if out == 0 or out == default_max_output(model.context_length, cap):
        out = default_max_output(request.tokens, cap)
    return min(out, request.tokens)


def _refused_plan(name, model, request, refusal, shape=None) -> Plan:
    """A request refused before any profile is planned: nothing changes, so the "after"
    figures are the "before" ones (the refusal's message says what was asked)."""
    return Plan(
        model=name,
        context_before=model.context_length if model else 0,
        context_after=model.context_length if model else 0,
        max_output_before=model.max_output if model else 0,
        max_output_after=model.max_output if model else 0,
        output_only=False,
        trained=shape.trained_context if shape else 0,
        slots=0,
        profiles=(),
        notes=(),
        refusal=refusal,
    )


def _max_output_only(model: ModelInput, shape: Shape | None, request: ChangeRequest) -> Plan:
    """Only the catalog's longest answer changes (the router holds max_tokens to it); no
    engine reads it, so nothing restarts. Refused past the model's context."""
    max_out = request.max_output
    refusal = None
    if model.context_length > 0 and max_out > model.context_length:
        refusal = Refusal(
            "max_output",
            f"an answer of {max_out} tokens does not fit {model.name}'s context of "
            f"{model.context_length}: change the context with it",
        )
    profiles = tuple(
        ProfilePlan(
            profile=p.name,
            engine=p.engine,
            args_before=tuple(p.args),
            args_after=tuple(p.args),
            changed_flags=(),
            memory_before=None,
            memory_after=None,
            min_memory_gb_after=p.min_memory_gb,
            restart="none",
            refusal=None,
            note="only the longest answer changes: the engine keeps running as it is",
        )
        for p in model.profiles
    )
    return Plan(
        model=model.name,
        context_before=model.context_length,
        context_after=model.context_length,
        max_output_before=model.max_output,
        max_output_after=model.max_output if refusal else max_out,
        output_only=True,
        trained=shape.trained_context if shape else 0,
        slots=0,
        profiles=() if refusal else profiles,
        notes=(),
        refusal=refusal,
    )


def _can_size(shape: Shape | None) -> bool:
    return shape is not None and shape.weights_bytes > 0


def _notes(shape: Shape | None, shape_note: str) -> tuple[str, ...]:
    if _can_size(shape):
        return ()
    if shape_note:
        return (shape_note,)
    if shape is None:
        return ("its shape is not known, so the memory it needs is not checked",)
    return ("its files' sizes are not known, so the memory it needs is not checked",)


# ----------------------------------------------------------------------------- profiles


def _profile_plan(p: ProfileInput, model: ModelInput, shape: Shape | None, tokens: int, slots: int) -> ProfilePlan:
    before = tuple(p.args)
    args = list(p.args)
    if p.engine not in ENGINES:
        return ProfilePlan(
            profile=p.name,
            engine=p.engine,
            args_before=before,
            args_after=before,
            changed_flags=(),
            memory_before=None,
            memory_after=None,
            min_memory_gb_after=p.min_memory_gb,
            restart="none",
            refusal=Refusal("model", f"a {p.engine} profile ({p.name}) does not take a context this way"),
            note="",
        )

    # Each context flag's new value, written where and as the profile has it (else appended).
    if p.engine == "llamacpp":
        n = slots if slots > 0 else max(get_int(before, *PARALLEL), 1)
        new_values = ((CTX_SIZE, str(tokens * n)), (PARALLEL, str(n)))
        ctx_after, slots_after = tokens, n  # --ctx-size is the pool of all n slots
    else:
        new_values = ((CONTEXT_FLAGS[p.engine][0], str(tokens)),)
        ctx_after, slots_after = tokens, 1
    changed = []
    for names, value in new_values:
        if get_arg(before, *names) != value:
            changed.append(flag_name(before, *names) or names[0])
        args = set_arg(args, value, *names)
    after = tuple(args)

    notes = []
    memory_before = memory_after = None
    min_memory = p.min_memory_gb
    refusal = None
    if p.engine in NO_CARD_CHECK:
        notes.append(NO_CARD_CHECK[p.engine])
    elif shape is not None:
        ctx_before, slots_before = _context_of(p.engine, before, model.context_length)
        try:
            if ctx_before > 0:
                memory_before = _memory_now(p, shape, ctx_before, slots_before, before)
            # `before`, not `after`: the two differ only in context flags, which the memory
            # model does not read (context and slots are given), and the profile's own
            # arguments keep its engine settings cached from one keystroke to the next.
            memory_after = profile_memory(p, shape, ctx_after, slots_after, before)
        except ValueError as e:  # kv.KVError: e.g. a cache type the engine does not know
            memory_before = memory_after = None
            notes.append(f"its KV cache could not be sized ({e}), so the memory it needs is not checked")
        if memory_after is not None and memory_after.where == "ram":
            if math.isfinite(memory_after.need_gb):
                min_memory = int(memory_after.need_gb)
        elif memory_after is not None and memory_after.fits is False:
            refusal = Refusal(
                "tokens",
                f"with {tokens} tokens the {p.name} profile needs {memory_after.need_gb:.1f} GB on each of its "
                f"{memory_after.cards} {p.gpu_class.name} cards, more than the {memory_after.usable_gb:.0f} GB "
                "they hold: a shorter context, or the model on more cards",
            )

    if after == before:
        restart = "none"
    elif p.surge_possible:
        restart = "surge"
    else:
        restart = "in_place"
        notes.append("its nodes have no room for a second copy: each replica is replaced in place, one at a time")
    return ProfilePlan(
        profile=p.name,
        engine=p.engine,
        args_before=before,
        args_after=after,
        changed_flags=tuple(changed),
        memory_before=memory_before,
        memory_after=memory_after,
        min_memory_gb_after=min_memory,
        restart=restart,
        refusal=refusal,
        note="; ".join(notes),
    )


def _context_of(engine: str, args: tuple[str, ...], fallback: int) -> tuple[int, int]:
    """(tokens one request may use, slots) as an engine's arguments give them; fallback
    (the model's context) where the flag is absent."""
    if engine == "llamacpp":
        slots = max(get_int(args, *PARALLEL), 1)
        pool = get_int(args, *CTX_SIZE)
        return (pool // slots if pool > 0 else fallback), slots
    names = MAX_MODEL_LEN if engine == "vllm" else CONTEXT_LENGTH
    value = get_int(args, *names)
    return (value if value > 0 else fallback), 1


# ----------------------------------------------------------------------------- memory


def _gib(n: float) -> float:
    try:
        return n / GiB
    except OverflowError:  # an int too large for a float: no card holds it
        return math.inf


def _get_float(args: Sequence[str], *names: str) -> float | None:
    value = get_arg(args, *names)
    try:
        f = float(value) if value is not None else None
    except ValueError:
        return None
    return f if f is not None and math.isfinite(f) else None


def profile_memory(p: ProfileInput, shape: Shape, context: int, slots: int, args: Sequence[str]) -> MemoryTerms:
    """A profile's memory with `context` tokens a request and `slots` at once: RAM for a
    CPU-only profile (the seed's formula), else the need per card (`card_need`).
    Raises kv.KVError (a ValueError) when the engine's arguments name a cache type it does not know."""
    args = tuple(args)
    sized = kv_bytes(shape, p.engine, context, slots, **_kv_settings(p.engine, args))
    kv, state = sized.kv, sized.state
    weights = shape.weights_bytes
    if p.cpu_only:
        reserve = CPU_OVERHEAD + weights // 20
        need = weights + kv + state + reserve
        gb = -(-need // GiB)  # rounded up to whole GB, in integers (no float overflow)
        return MemoryTerms(
            where="ram",
            weights_gb=_gib(weights),
            kv_gb=_gib(kv),
            state_gb=_gib(state),
            reserve_gb=_gib(reserve),
            need_gb=float(gb) if gb < 2**1000 else math.inf,
            cards=0,
            usable_gb=None,
            fits=None,
            text=f"{gb} GB of RAM",
        )
    return card_need(
        p.engine,
        weights=weights,
        kv=kv,
        state=state,
        tp=p.tp,
        pp=p.pp,
        cards=cards_of(p),
        kv_heads=shape.kv_heads,
        mla=shape.mla,
        gpu=p.gpu_class,
        args=args,
    )


@functools.lru_cache(maxsize=1024)
def _memory_now(p: ProfileInput, shape: Shape, context: int, slots: int, args: tuple[str, ...]) -> MemoryTerms:
    """profile_memory of a profile as it runs: the same on every keystroke of a preview."""
    return profile_memory(p, shape, context, slots, args)


def cards_of(p: ProfileInput) -> int:
    """The seed's count: cards a node × nodes, at least tp × pp."""
    return max(p.gpus_per_node, p.tp, 1) * max(p.nodes, p.pp, 1)


def kv_split(engine: str, *, tp: int, pp: int, cards: int, kv_heads: int, mla: bool) -> int:
    """Over how many cards one copy of the KV cache is spread.

    vLLM and SGLang shard KV heads over tensor-parallel ranks, max(1, kv_heads // tp) a
    rank, so tp ranks beyond kv_heads hold replicas; MLA's latent is one "head" that every
    rank keeps whole. Pipeline stages hold their own layers. llama.cpp spreads layers, and
    their KV, over all its cards (split mode layer and row)."""
    tp, pp = max(tp, 1), max(pp, 1)
    if engine == "llamacpp":
        return max(cards, 1)
    if mla:
        return pp
    heads = min(tp, kv_heads) if kv_heads > 0 else tp
    return max(heads, 1) * pp


def card_need(
    engine: str,
    *,
    weights: int,
    kv: int,
    state: int,
    tp: int,
    pp: int,
    cards: int,
    kv_heads: int,
    mla: bool,
    gpu: GPUClassInput | None,
    args: Sequence[str] = (),
) -> MemoryTerms:
    """The memory one card needs, and the engine's budget on it (docs/memory.md).

    need = weights / cards + KV / kv_split + state / kv_split + the engine's reserve;
    usable = the class's usable memory, or less where the engine takes a fraction of it."""
    cards = max(cards, 1)
    split = kv_split(engine, tp=tp, pp=pp, cards=cards, kv_heads=kv_heads, mla=mla)
    weights_gb = _gib(weights) / cards
    kv_gb = _gib(kv // split)
    state_gb = _gib(state // split)
    reserve_gb, usable_gb = _engine_budget(engine, gpu, tuple(args), tp=tp, pp=pp, mla=mla)
    need_gb = weights_gb + kv_gb + state_gb + reserve_gb
    text = f"{need_gb:.1f} GB a card of {cards}"
    fits = None
    if usable_gb is not None:
        text += f", of {usable_gb:.0f} usable"
        fits = need_gb <= usable_gb
    return MemoryTerms(
        where="card",
        weights_gb=weights_gb,
        kv_gb=kv_gb,
        state_gb=state_gb,
        reserve_gb=reserve_gb,
        need_gb=need_gb,
        cards=cards,
        usable_gb=usable_gb,
        fits=fits,
        text=text,
    )


# What the memory model reads from an engine's arguments, once per argument list: a preview
# plans the same profiles on every keystroke. (Cached values are only unpacked, never changed.)
_kv_settings = functools.lru_cache(maxsize=1024)(kv_settings_from_args)


@functools.lru_cache(maxsize=1024)
def _engine_budget(engine, gpu, args, *, tp, pp, mla) -> tuple[float, float | None]:
    """(reserve GB the engine needs beside weights and KV, GB it may use on a card)."""
    usable = gpu.usable_gb if gpu is not None and gpu.usable_gb > 0 else None
    memory = gpu.memory_gb if gpu is not None and gpu.memory_gb > 0 else None
    if engine == "vllm":
        util = _get_float(args, "--gpu-memory-utilization")
        util = VLLM_DEFAULT_UTILIZATION if util is None else util
        graphs = 0 if has_flag(args, "--enforce-eager") else VLLM_CUDA_GRAPHS
        if memory is not None:
            usable = min(memory * util, usable) if usable is not None else memory * util
        return _gib(VLLM_ACTIVATIONS + graphs), usable
    if engine == "sglang":
        frac = _get_float(args, "--mem-fraction-static")
        if memory is not None:
            if frac is None:
                frac = sglang_mem_fraction_static(memory, tp=tp, pp=pp, mla=mla, args=args)
            usable = min(memory * frac, usable) if usable is not None else memory * frac
        # Activations and CUDA graphs live outside the static fraction, which is the budget.
        return 0.0, usable
    # llama.cpp: compute buffers on every card, sized by the micro-batch.
    ubatch = get_int(args, *UBATCH) or LLAMACPP_DEFAULT_UBATCH
    return _gib(max(ubatch, 1) * LLAMACPP_COMPUTE_PER_UBATCH_TOKEN), usable


def sglang_mem_fraction_static(memory_gb: float, *, tp: int = 1, pp: int = 1, mla: bool = False, args=()) -> float:
    """SGLang's default --mem-fraction-static for a card of memory_gb GiB (its
    handle_gpu_memory_settings heuristic, reduced to the terms a profile carries)."""
    gpu_mb = memory_gb * 1024
    tp, pp = max(tp, 1), max(pp, 1)
    if gpu_mb < 20 * 1024:
        chunked, max_bs = 2048, 8
    elif gpu_mb < 35 * 1024:
        chunked, max_bs = 4096, 48 if tp < 4 else 160
    elif gpu_mb < 60 * 1024:
        chunked, max_bs = 4096, 32 if tp < 4 else 160
    elif gpu_mb < 160 * 1024:
        chunked, max_bs = 8192, 256 if tp < 4 else 512
    else:
        chunked, max_bs = 16384, 512
    chunked = get_int(args, "--chunked-prefill-size") or chunked
    graphs = 0.0
    if not has_flag(args, "--disable-cuda-graph"):
        graphs = max_bs * 2 + (1536 if mla else 256)  # decode graphs + prefill graphs
    reserved = 512 + max(chunked, 2048) * 1.5 + tp * pp / 8 * 1024 + graphs
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mb - reserved) / gpu_mb, 3) if gpu_mb > 0 else 0.95
