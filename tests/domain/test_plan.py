"""The context change's plan (catalog.domain.plan): the seed's rules and messages in the
seed's order, the engines' arguments, the longest-answer rule and the memory per profile."""

import json
import math
from dataclasses import asdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.domain.args import get_int
from catalog.domain.kv import kv_bytes
from catalog.domain.plan import (
    GiB,
    ChangeRequest,
    GPUClassInput,
    ModelInput,
    Plan,
    ProfileInput,
    card_need,
    default_max_output,
    plan_change,
    sglang_mem_fraction_static,
)
from catalog.domain.shape import Shape

# GPU classes as the catalog seeds them (catalog/migrations/0002_gpu_classes.py)
L4 = GPUClassInput("L4", 22.49, 22.0)
H200 = GPUClassInput("H200", 140.4, 139.9)
H100 = GPUClassInput("H100-80G", 79.65, 79.1)

# Llama-3.1-8B: 32 layers, 32 heads, 8 KV heads of 128, bf16 safetensors (4 files)
LLAMA_8B = Shape("llama", 32, 32, 8, 131072, 128, 128, weights_bytes=16_060_522_496, source_kind="hf")
# The same model as a Q4_K_M GGUF
LLAMA_8B_Q4 = Shape("llama", 32, 32, 8, 131072, 128, 128, weights_bytes=4_920_739_232, source_kind="gguf")
# DeepSeek-V3: 61 layers, MLA latent 512 + rope 64, 128 query heads; fp8 weights (163 files)
DEEPSEEK_V3 = Shape(
    "deepseek_v3", 61, 128, 128, 163840, 576, 0, mla=True, kv_lora_rank=512, rope_head_dim=64,
    weights_bytes=688_586_727_753, source_kind="hf",
)
# Qwen2.5-7B: 28 layers, 4 KV heads of 128: fewer KV heads than a tp of 8
QWEN_7B = Shape("qwen2", 28, 28, 4, 32768, 128, 128, weights_bytes=15_231_233_024, source_kind="hf")

NOTE = "its header could not be read (HTTP 404), so the memory it needs is not checked"


def profile(engine="vllm", args=(), *, name=None, gpu=L4, gpus=1, tp=1, pp=1, nodes=1, cpu=False, mem=0, surge=True):
    return ProfileInput(
        name=name or engine, engine=engine, args=tuple(args), gpu_class=None if cpu else gpu, gpus_per_node=gpus,
        tp=tp, pp=pp, nodes=nodes, cpu_only=cpu, min_memory_gb=mem, surge_possible=surge,
    )


def model(*profiles, context=8192, max_output=2048, declared=False, name="llama-8b"):
    return ModelInput(name, context, max_output, declared, tuple(profiles) or (profile(args=["--max-model-len", "8192"]),))


def _json_form(value):
    """dataclasses.asdict's output as JSON holds it: lists, and no infinities."""
    if isinstance(value, dict):
        return {k: _json_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_form(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def plan(m=None, shape=LLAMA_8B, note="", **request):
    return plan_change(m if m is not None else model(), shape, note, ChangeRequest(**request), name="llama-8b")


# ----------------------------------------------------------------------------- the seed's rules


REFUSALS = [
    # (case, model, shape, request, field, status, words in the message)
    ("no such model", None, LLAMA_8B, {"tokens": 4096}, "model", 404, ["no model", "llama-8b", "catalog"]),
    ("declared", model(declared=True), LLAMA_8B, {"tokens": 4096}, "model", 400,
     ["llama-8b", "declared in the cluster's settings: change its context there"]),
    ("negative answer", model(), LLAMA_8B, {"tokens": 4096, "max_output": -1}, "max_output", 400,
     ["longest answer is a number of tokens"]),
    ("answer alone past the context", model(context=8192), LLAMA_8B, {"max_output": 9000}, "max_output", 400,
     ["an answer of 9000 tokens does not fit llama-8b's context of 8192", "change the context with it"]),
    ("short context", model(), LLAMA_8B, {"tokens": 255}, "tokens", 400, ["at least 256 tokens"]),
    ("nothing asked", model(), LLAMA_8B, {}, "tokens", 400, ["at least 256 tokens"]),
    ("answer past the new context", model(), LLAMA_8B, {"tokens": 4096, "max_output": 5000}, "max_output", 400,
     ["an answer of 5000 tokens does not fit a context of 4096"]),
    ("too many slots", model(), LLAMA_8B, {"tokens": 4096, "slots": 65}, "slots", 400, ["slots are 1 to 64"]),
    ("negative slots", model(), LLAMA_8B, {"tokens": 4096, "slots": -1}, "slots", 400, ["slots are 1 to 64"]),
    ("past the trained context", model(), LLAMA_8B, {"tokens": 131073}, "tokens", 400,
     ["llama-8b was trained for 131072 tokens", "llama.cpp or vLLM refuses it"]),
    ("an engine that takes no context", model(profile("ollama", name="local")), LLAMA_8B, {"tokens": 4096}, "model",
     400, ["a ollama profile (local) does not take a context this way"]),
    ("does not fit its cards", model(profile(args=["--max-model-len", "8192"], name="l4")), LLAMA_8B,
     {"tokens": 131072}, "tokens", 400,
     ["with 131072 tokens the l4 profile needs 33.0 GB on each of its 1 L4 cards", "more than the 20 GB they hold"]),
]


@pytest.mark.parametrize("case,m,shape,request_,field,status,words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusal(case, m, shape, request_, field, status, words):
    p = plan_change(m, shape, "", ChangeRequest(**request_), name="llama-8b")
    assert not p.ok
    assert (p.refusal.field, p.refusal.status) == (field, status)
    for w in words:
        assert w in p.refusal.message


ORDER = [
    # two rules fail; the seed's order says which one is reported
    ("declared before a bad answer", model(declared=True), {"tokens": 4096, "max_output": -1}, "model", "declared"),
    ("bad answer before a short context", model(), {"tokens": 10, "max_output": -5}, "max_output", "number of tokens"),
    ("answer alone before slots", model(), {"max_output": 100, "slots": 99}, None, ""),
    ("short context before slots", model(), {"tokens": 10, "slots": 99}, "tokens", "at least 256"),
    ("answer past the context before slots", model(), {"tokens": 300, "max_output": 400, "slots": 99}, "max_output",
     "400"),
    ("slots before the trained context", model(), {"tokens": 200000, "slots": 99}, "slots", "slots"),
    ("the trained context before the engines", model(profile("ollama")), {"tokens": 200000}, "tokens", "trained"),
    ("an engine before a card that does not fit",
     model(profile(args=[], name="small"), profile("ollama", name="odd")), {"tokens": 131072}, "model", "odd"),
]


@pytest.mark.parametrize("case,m,request_,field,words", ORDER, ids=[o[0] for o in ORDER])
def test_the_first_failing_rule_is_reported(case, m, request_, field, words):
    p = plan_change(m, LLAMA_8B, "", ChangeRequest(**request_), name="llama-8b")
    if field is None:
        assert p.ok and p.output_only
    else:
        assert p.refusal.field == field and words in p.refusal.message


def test_max_output_only_changes_the_catalog_alone():
    m = model(profile(args=["--max-model-len", "8192"]), profile("llamacpp", ["-c", "8192", "-np", "1"]))
    p = plan(m, tokens=0, max_output=1000, slots=5)
    assert p.ok and p.output_only
    assert (p.context_before, p.context_after, p.max_output_before, p.max_output_after) == (8192, 8192, 2048, 1000)
    assert [pp.restart for pp in p.profiles] == ["none", "none"]
    assert all(pp.args_after == pp.args_before and pp.changed_flags == () for pp in p.profiles)


def test_max_output_only_is_allowed_up_to_the_context_and_without_a_known_context():
    assert plan(model(context=8192), max_output=8192).ok
    assert plan(model(context=0), max_output=10**6).ok


def test_refused_plan_changes_nothing():
    p = plan(tokens=131073, slots=3)
    assert p.profiles == () and p.max_output_after == p.max_output_before == 2048
    assert p.context_after == p.context_before == 8192 and p.slots == 0
    assert p.to_dict()["ok"] is False


@pytest.mark.parametrize(
    "request_,field",
    [
        ({"tokens": 10**5000}, "tokens"),  # more digits than Python prints by default
        ({"tokens": 2**31}, "tokens"),
        ({"tokens": 4096, "slots": 10**5000}, "slots"),
        ({"tokens": 4096, "max_output": 10**5000}, "max_output"),
        ({"max_output": 10**5000}, "max_output"),
        ({"tokens": -(10**5000)}, "tokens"),
    ],
)
def test_huge_numbers_are_refused_and_serialised(request_, field):
    for shape in (None, LLAMA_8B, Shape("llama", 32, 32, 8, 0, 128, 128, weights_bytes=GiB)):
        p = plan(shape=shape, **request_)
        assert p.refusal.field == field
        json.dumps(p.to_dict(), allow_nan=False)


# ----------------------------------------------------------------------------- longest answer


def test_default_max_output_is_a_quarter_at_most_the_cap():
    assert default_max_output(8192) == 2048
    assert default_max_output(131072) == 32768
    assert default_max_output(1_000_000) == 32768
    assert default_max_output(1_000_000, cap=65536) == 65536
    assert default_max_output(0) == 0


LONGEST = [
    # (case, model's context, model's max_output, request, expected)
    ("no limit becomes the new default", 8192, 0, {"tokens": 32768}, 8192),
    ("the old default becomes the new default", 8192, 2048, {"tokens": 32768}, 8192),
    ("the old default, capped", 8192, 2048, {"tokens": 131072}, 32768),
    ("a custom answer stays", 8192, 1000, {"tokens": 32768}, 1000),
    ("a custom answer is held to the new context", 16384, 10000, {"tokens": 4096}, 4096),
    ("an explicit answer wins", 8192, 2048, {"tokens": 32768, "max_output": 3000}, 3000),
    ("an explicit answer wins over a custom one", 8192, 1000, {"tokens": 32768, "max_output": 32768}, 32768),
]


@pytest.mark.parametrize("case,ctx,out,request_,expected", LONGEST, ids=[c[0] for c in LONGEST])
def test_longest_answer(case, ctx, out, request_, expected):
    p = plan(model(profile(args=[]), context=ctx, max_output=out), shape=None, **request_)
    assert p.ok and p.max_output_after == expected


def test_longest_answer_default_cap_is_a_setting():
    p = plan_change(model(max_output=0), None, "", ChangeRequest(tokens=131072), default_max_output_cap=4096)
    assert p.max_output_after == 4096


# ----------------------------------------------------------------------------- engine arguments


def args_after(engine, args, **request_):
    p = plan(model(profile(engine, args), context=4096, max_output=0), shape=None, **request_)
    assert p.ok
    return p.profiles[0]


def test_llamacpp_pool_is_tokens_times_slots():
    pp = args_after("llamacpp", ["-m", "x.gguf", "--ctx-size", "4096", "--parallel", "1"], tokens=8192, slots=4)
    assert pp.args_after == ("-m", "x.gguf", "--ctx-size", "32768", "--parallel", "4")
    assert pp.changed_flags == ("--ctx-size", "--parallel")


def test_llamacpp_slots_0_keeps_the_profiles_parallel():
    pp = args_after("llamacpp", ["-c", "16384", "-np", "4"], tokens=8192)
    assert pp.args_after == ("-c", "32768", "-np", "4")
    assert pp.changed_flags == ("-c",)


def test_llamacpp_slots_0_without_parallel_is_one_slot_appended():
    pp = args_after("llamacpp", ["--ctx-size=4096"], tokens=8192)
    assert pp.args_after == ("--ctx-size=8192", "--parallel", "1")


def test_llamacpp_equals_form_and_alias_are_kept():
    pp = args_after("llamacpp", ["-c=4096", "--parallel=2", "--port", "8080"], tokens=4096, slots=3)
    assert pp.args_after == ("-c=12288", "--parallel=3", "--port", "8080")


@pytest.mark.parametrize(
    "engine,args,expected",
    [
        ("vllm", ["--model", "m", "--max-model-len=4096"], ("--model", "m", "--max-model-len=16384")),
        ("vllm", ["--model", "m"], ("--model", "m", "--max-model-len", "16384")),
        ("sglang", ["--context-length", "4096", "--tp", "2"], ("--context-length", "16384", "--tp", "2")),
        ("sglang", [], ("--context-length", "16384")),
        ("strata", ["--context", "4096"], ("--context", "16384")),
        ("strata", [], ("--context", "16384")),
        ("freetoken", ["--max-seq-len-override=4096"], ("--max-seq-len-override=16384",)),
        ("freetoken", ["--x"], ("--x", "--max-seq-len-override", "16384")),
    ],
)
def test_engine_context_flags(engine, args, expected):
    assert args_after(engine, args, tokens=16384).args_after == expected


def test_strata_and_freetoken_have_no_card_check():
    m = model(profile("strata", gpu=L4), profile("freetoken", gpu=L4), max_output=0)
    p = plan(m, tokens=131072)  # far more than one L4 would hold for Llama-3.1-8B
    assert p.ok
    for pp in p.profiles:
        assert pp.memory_after is None and pp.refusal is None and "no card check" in pp.note


def test_restart_policy():
    m = model(
        profile(args=["--max-model-len", "8192"], name="a"),
        profile(args=["--max-model-len", "8192"], name="b", surge=False),
        profile("sglang", ["--context-length", "16384"], name="c", gpu=H200),
    )
    p = plan(m, shape=None, tokens=16384)
    assert [pp.restart for pp in p.profiles] == ["surge", "in_place", "none"]
    assert "in place" in p.profiles[1].note


# ----------------------------------------------------------------------------- refusals and notes


def test_a_card_refusal_keeps_the_other_profiles_plans():
    m = model(profile(args=["--max-model-len", "8192"], name="l4"), profile(args=[], name="h200", gpu=H200))
    p = plan(m, tokens=131072)
    assert p.refusal.field == "tokens" and "l4 profile" in p.refusal.message
    l4, h200 = p.profiles
    assert l4.refusal == p.refusal and l4.memory_after.fits is False
    assert h200.refusal is None and h200.memory_after.fits is True
    assert h200.args_after == ("--max-model-len", "131072")


def test_the_shape_note_is_said_once_and_the_change_proceeds():
    m = model(profile(name="a"), profile("llamacpp", name="b"), profile("sglang", name="c", cpu=True))
    p = plan(m, shape=None, note=NOTE, tokens=131072)
    assert p.ok and p.notes == (NOTE,)
    assert all(pp.memory_after is None and NOTE not in pp.note for pp in p.profiles)


def test_unknown_weights_skip_the_memory_check_but_not_the_trained_context():
    no_weights = Shape("llama", 32, 32, 8, 131072, 128, 128)
    p = plan(shape=no_weights, tokens=131072)
    assert p.ok and len(p.notes) == 1 and "not checked" in p.notes[0]
    assert plan(shape=no_weights, tokens=131073).refusal.field == "tokens"


def test_an_unknown_cache_type_is_said_not_guessed():
    m = model(profile("llamacpp", ["-c", "8192", "-ctk", "q3_z"]))
    pp = plan(m, tokens=8192).profiles[0]
    assert pp.memory_after is None and "could not be sized" in pp.note and "q3_z" in pp.note


# ----------------------------------------------------------------------------- memory: worked examples


def test_llama_8b_on_one_l4_with_vllm():
    """bf16 Llama-3.1-8B: 14.96 GiB of weights, 128 KiB of KV a token (32 x 2 x 8 x 128 x 2 B).
    vLLM takes 0.9 of the card's 22.49 GiB (20.24) and keeps 2 GiB for activations and graphs."""
    m = model(profile(args=["--max-model-len", "8192"]))
    short = plan(m, tokens=8192).profiles[0]
    assert short.memory_before == short.memory_after  # same context, same memory
    mem = short.memory_after
    assert mem.weights_gb == pytest.approx(14.957, abs=1e-3)
    assert mem.kv_gb == 1.0 and mem.reserve_gb == 2.0 and mem.state_gb == 0
    assert mem.usable_gb == pytest.approx(22.49 * 0.9)
    assert mem.need_gb == pytest.approx(17.957, abs=1e-3) and mem.fits
    assert mem.text == "18.0 GB a card of 1, of 20 usable"

    long = plan(m, tokens=131072)
    mem = long.profiles[0].memory_after
    assert mem.kv_gb == 16.0 and mem.fits is False
    assert long.profiles[0].memory_before.kv_gb == 1.0  # before -> after can be shown


def test_llama_8b_on_one_l4_with_llamacpp():
    """llama.cpp uses the class's usable memory (22.0) and a 0.5 GiB compute buffer at n_ubatch 512."""
    m = model(profile("llamacpp", ["-c", "8192", "-np", "1"]))
    mem = plan(m, tokens=8192).profiles[0].memory_after
    assert (mem.kv_gb, mem.reserve_gb, mem.usable_gb) == (1.0, 0.5, 22.0)
    assert mem.text == "16.5 GB a card of 1, of 22 usable" and mem.fits
    big_ubatch = plan(model(profile("llamacpp", ["-c", "8192", "-ub", "2048"])), tokens=8192)
    assert big_ubatch.profiles[0].memory_after.reserve_gb == 2.0
    assert plan(m, tokens=131072).profiles[0].memory_after.fits is False


def test_llamacpp_spreads_layers_and_their_kv_over_all_its_cards():
    m = model(profile("llamacpp", ["-c", "65536"], gpus=2))
    mem = plan(m, tokens=65536).profiles[0].memory_after
    assert mem.cards == 2 and mem.kv_gb == 4.0  # 8 GiB over two cards
    assert mem.weights_gb == pytest.approx(16_060_522_496 / 2 / GiB)


def test_deepseek_v3_mla_on_8_h200_tp_8():
    """The MLA latent (576 values a layer, bf16) is one head every tp rank keeps whole: the KV
    is not split by tp, the weights are."""
    m = model(profile(args=["--max-model-len", "163840"], gpu=H200, gpus=8, tp=8), context=163840, max_output=0)
    p = plan(m, shape=DEEPSEEK_V3, tokens=163840)
    mem = p.profiles[0].memory_after
    total_kv = 61 * 576 * 2 * 163840  # vLLM: 10240 blocks of 16 tokens, one latent head
    assert kv_bytes(DEEPSEEK_V3, "vllm", 163840).kv == total_kv
    assert mem.cards == 8
    assert mem.kv_gb == pytest.approx(total_kv / GiB)  # 10.72 GiB on every card
    assert mem.weights_gb == pytest.approx(688_586_727_753 / 8 / GiB)  # 80.2 GiB
    assert mem.usable_gb == pytest.approx(140.4 * 0.9)
    assert mem.fits and p.ok
    assert mem.text == "92.9 GB a card of 8, of 126 usable"


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    """Qwen2.5-7B has 4 KV heads: tp 8 stores each head on two ranks, so a card holds a quarter
    of the KV, as with tp 4, not an eighth."""
    total = kv_bytes(QWEN_7B, "vllm", 32768).kv

    def kv_per_card(tp):
        m = model(profile(args=[], gpu=H100, gpus=tp, tp=tp), context=32768, max_output=0)
        return plan(m, shape=QWEN_7B, tokens=32768).profiles[0].memory_after.kv_gb

    assert kv_per_card(8) == pytest.approx(total / 4 / GiB)
    assert kv_per_card(4) == kv_per_card(8)
    assert kv_per_card(2) == pytest.approx(total / 2 / GiB)


def test_pipeline_stages_split_the_kv_mla_included():
    m = model(profile(args=[], gpu=H200, gpus=8, tp=8, pp=2, nodes=2), context=163840, max_output=0)
    mem = plan(m, shape=DEEPSEEK_V3, tokens=163840).profiles[0].memory_after
    assert mem.cards == 16
    assert mem.kv_gb == pytest.approx(61 * 576 * 2 * 163840 / 2 / GiB)


def test_cpu_only_ram_is_the_seeds_formula_rounded_up():
    """weights + KV + 1 GiB + weights/20: 4.58 + 1 + 1 + 0.23 GiB = 6.81 -> 7 GB."""
    m = model(profile("llamacpp", ["-c", "8192", "-np", "1"], cpu=True, mem=6))
    pp = plan(m, shape=LLAMA_8B_Q4, tokens=8192).profiles[0]
    assert pp.memory_after.where == "ram" and pp.memory_after.text == "7 GB of RAM"
    assert pp.memory_after.kv_gb == 1.0
    assert pp.memory_after.reserve_gb == pytest.approx((GiB + 4_920_739_232 // 20) / GiB)
    assert pp.min_memory_gb_after == 7
    four = plan(m, shape=LLAMA_8B_Q4, tokens=8192, slots=4).profiles[0]
    assert four.memory_after.kv_gb == 4.0 and four.min_memory_gb_after == 10  # 9.81 GiB


def test_vllm_gpu_memory_utilization_and_enforce_eager():
    m = model(profile(args=["--gpu-memory-utilization", "0.5", "--enforce-eager"]))
    mem = plan(m, tokens=8192).profiles[0].memory_after
    assert mem.usable_gb == pytest.approx(22.49 * 0.5) and mem.reserve_gb == 1.5  # no CUDA graphs
    assert mem.fits is False  # 17.46 GiB > 11.2


def test_sglang_budget_is_its_static_fraction():
    given_ = plan(model(profile("sglang", ["--mem-fraction-static", "0.85"], gpu=H100)), tokens=8192)
    assert given_.profiles[0].memory_after.usable_gb == pytest.approx(79.65 * 0.85)
    assert given_.profiles[0].memory_after.reserve_gb == 0
    computed = plan(model(profile("sglang", [], gpu=H100)), tokens=8192).profiles[0].memory_after
    assert computed.usable_gb == pytest.approx(79.65 * sglang_mem_fraction_static(79.65))


def test_sglang_default_fraction_follows_its_heuristic():
    # H100 80G: chunked prefill 8192, decode graphs up to 256:
    # 512 + 1.5 x 8192 + 128 + 2 x 256 + 256 = 13696 MB reserved of 81562
    assert sglang_mem_fraction_static(79.65) == round((79.65 * 1024 - 13696) / (79.65 * 1024), 3) == 0.832
    # L4: chunked prefill 4096, 48 graphs: 7136 MB of 23030
    assert sglang_mem_fraction_static(22.49) == 0.69
    # a card over 60 GiB keeps at least 10 GiB back
    assert sglang_mem_fraction_static(79.65, args=["--chunked-prefill-size", "2048", "--disable-cuda-graph"]) == (
        round((79.65 * 1024 - 10240) / (79.65 * 1024), 3)
    )


def test_card_need_without_a_gpu_class_has_no_verdict():
    mem = card_need("vllm", weights=GiB, kv=GiB, state=0, tp=1, pp=1, cards=1, kv_heads=8, mla=False, gpu=None)
    assert mem.fits is None and mem.usable_gb is None and mem.text == "4.0 GB a card of 1"


# ----------------------------------------------------------------------------- any ints


SHAPES = st.sampled_from([None, LLAMA_8B, DEEPSEEK_V3, Shape("llama", 32, 32, 8, 0, 128, 128, weights_bytes=GiB),
                          Shape("llama", 32, 32, 8, 0, 128, 128)])
ANY_INT = st.one_of(st.integers(), st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 256, 64, 65]))


@settings(max_examples=300, deadline=None)
@given(tokens=ANY_INT, slots=ANY_INT, max_output=ANY_INT, shape=SHAPES, declared=st.booleans())
def test_any_ints_give_a_plan_not_a_crash(tokens, slots, max_output, shape, declared):
    m = model(
        profile(args=["--max-model-len", "8192"]),
        profile("llamacpp", ["-c", "8192", "-np", "2"], gpus=2),
        profile("llamacpp", [], cpu=True),
        profile("sglang", [], gpu=H200, tp=8, gpus=8),
        profile("strata"),
        declared=declared,
    )
    p = plan_change(m, shape, NOTE if shape is None else "", ChangeRequest(tokens, slots, max_output))
    assert isinstance(p, Plan)
    json.dumps(p.to_dict(), allow_nan=False)
    assert p.to_dict() == {**_json_form(asdict(p)), "ok": p.ok}  # every field, written out by hand
    if p.ok and not p.output_only:
        assert 256 <= tokens
        for pp in p.profiles:
            if pp.engine == "llamacpp":
                assert get_int(pp.args_after, "-c", "--ctx-size") == tokens * get_int(pp.args_after, "-np", "--parallel") > 0
            else:
                assert str(tokens) in pp.args_after
        assert 0 < p.max_output_after <= tokens
        for pp in p.profiles:
            for mem in (pp.memory_before, pp.memory_after):
                assert mem is None or math.isfinite(mem.need_gb)


# ----------------------------------------------------------------------------- what a change leaves alone

# Flags the memory model reads, context flags, and values, in any order and either form.
MEMORY_FLAGS = [
    "-ctk", "--cache-type-k", "-ctv", "--cache-type-v", "-kvu", "--kv-unified", "-no-kvu", "--swa-full",
    "-ub", "--ubatch-size", "-b", "--batch-size", "--kv-cache-dtype", "--block-size", "--max-num-batched-tokens",
    "--gpu-memory-utilization", "--enforce-eager", "--mem-fraction-static", "--chunked-prefill-size",
    "--disable-cuda-graph",
]
CONTEXT_FLAG_NAMES = ["--ctx-size", "-c", "--parallel", "-np", "--max-model-len", "--context-length", "--context",
                      "--max-seq-len-override"]
ARG_TOKENS = st.one_of(
    st.sampled_from(MEMORY_FLAGS + CONTEXT_FLAG_NAMES),
    st.sampled_from(["q8_0", "f16", "fp8", "0.8", "512", "-1", "x", ""]),
    st.builds(lambda f, v: f"{f}={v}", st.sampled_from(MEMORY_FLAGS + CONTEXT_FLAG_NAMES), st.sampled_from(["q4_0", "0.7", "64", ""])),
)


@settings(max_examples=500, deadline=None)
@given(args=st.lists(ARG_TOKENS, max_size=10), tokens=st.integers(256, LLAMA_8B.trained_context), slots=st.integers(0, 64),
       engine=st.sampled_from(["llamacpp", "vllm", "sglang", "strata", "freetoken"]))
def test_a_change_names_the_flags_it_rewrote_and_leaves_what_the_memory_model_reads_alone(args, tokens, slots, engine):
    """The plan sizes a profile after the change with the engine settings read from its
    arguments before it (plan._profile_plan): a change rewrites only context flags."""
    from catalog.domain.args import flag_name, get_arg
    from catalog.domain.kv import kv_settings_from_args
    from catalog.domain.plan import CONTEXT_FLAGS, _engine_budget

    p = profile(engine, args, gpu=H100, gpus=2, tp=2)
    changed = plan_change(model(p), LLAMA_8B, "", ChangeRequest(tokens=tokens, slots=slots)).profiles[0]
    before, after = changed.args_before, changed.args_after
    # each flag said changed is the very name its new value is read from afterwards
    for name in changed.changed_flags:
        aliases = next(names for names in CONTEXT_FLAGS[engine] if name in names)
        assert flag_name(after, *aliases) == name and get_arg(after, *aliases) != get_arg(before, *aliases)
    assert kv_settings_from_args(engine, after) == kv_settings_from_args(engine, before)
    for mla in (False, True):
        assert _engine_budget(engine, H100, after, tp=2, pp=1, mla=mla) == _engine_budget(engine, H100, before, tp=2, pp=1, mla=mla)
