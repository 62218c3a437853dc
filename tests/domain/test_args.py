"""Property tests of the engines' argument rewriting (catalog.domain.args): set then get
returns the value, only the flag set changes, its form (`--flag value` / `--flag=value`)
and spelling (`-c` / `--ctx-size`) are kept, and an absent flag is appended."""

from hypothesis import assume, given
from hypothesis import strategies as st

from catalog.domain.args import get_arg, get_int, set_arg

CTX = ("--ctx-size", "-c")
PARALLEL = ("--parallel", "-np")
CONTEXT_NAMES = CTX + PARALLEL + ("--max-model-len", "--context-length", "--context", "--max-seq-len-override")

# Arguments an admin writes: other flags, their values, and the context flags in either form.
PLAIN = ["-m", "model.gguf", "--port", "8080", "--host", "0.0.0.0", "-ngl", "99", "--cont-batching", "-fa", "on",
     "--tensor-parallel-size", "2", "-ctk", "q8_0", "--chat-template=chatml", "--ctx-size-draft", "-cd", "--c", "c",
     "--", "", "=", "-c-", "--parallelism"]
# ...and flag names standing alone, a value missing (the last occurrence with a value is the one read)
BARE = ["-c", "--ctx-size", "-np", "--parallel", "--max-model-len", "--context"]
OTHER = st.sampled_from(PLAIN + BARE)
VALUES = st.integers(min_value=0, max_value=2**40).map(str)
JUNK = st.text(max_size=12)


@st.composite
def flag(draw, names=CONTEXT_NAMES):
    """One context flag, in either form, as one or two arguments."""
    name = draw(st.sampled_from(names))
    value = draw(VALUES)
    return [f"{name}={value}"] if draw(st.booleans()) else [name, value]


def arg_lists(names=CONTEXT_NAMES, junk=False, other=OTHER):
    piece = st.one_of(other.map(lambda a: [a]), flag(names), JUNK.map(lambda a: [a])) if junk else st.one_of(
        other.map(lambda a: [a]), flag(names)
    )
    return st.lists(piece, max_size=12).map(lambda parts: [a for p in parts for a in p])


NAME_SETS = st.sampled_from([CTX, PARALLEL, ("--max-model-len",), ("--context-length",), ("--context",)])


@given(args=arg_lists(junk=True), names=NAME_SETS, value=VALUES)
def test_set_then_get_returns_the_value(args, names, value):
    out = set_arg(args, value, *names)
    assert get_arg(out, *names) == value
    assert get_int(out, *names) == int(value)


@given(args=arg_lists(junk=True), names=NAME_SETS, value=VALUES)
def test_the_input_is_not_changed(args, names, value):
    before = list(args)
    set_arg(args, value, *names)
    assert args == before


@given(args=arg_lists(junk=True), names=NAME_SETS, value=VALUES)
def test_only_the_flag_changes(args, names, value):
    out = set_arg(args, value, *names)
    if get_arg(args, *names) is None:
        assert out == args + [names[0], value]  # absent: appended in the separate form
        return
    assert len(out) == len(args)
    changed = [i for i, (a, b) in enumerate(zip(args, out)) if a != b]
    assert len(changed) <= 1  # one element: the value, or the `--flag=value` argument
    for i in changed:
        was, now = args[i], out[i]
        if "=" in now and any(now.startswith(n + "=") for n in names):
            name = now.split("=", 1)[0]
            assert was.startswith(name + "=") and now == f"{name}={value}"  # same spelling, same form
        else:
            assert now == value and args[i - 1] in names  # the separate value of the flag
    # every other flag reads as before
    for other in (CTX, PARALLEL, ("--max-model-len",), ("--context-length",), ("--context",)):
        if set(other) & set(names):
            continue
        assert get_arg(out, *other) == get_arg(args, *other)


@given(
    prefix=arg_lists(names=("--max-model-len",), other=st.sampled_from(PLAIN)),
    suffix=arg_lists(names=("--max-model-len",), other=st.sampled_from(PLAIN)),
    name=st.sampled_from(CTX), eq=st.booleans(), old=VALUES, value=VALUES,
)
def test_form_and_spelling_are_kept(prefix, suffix, name, eq, old, value):
    written = [f"{name}={old}"] if eq else [name, old]
    out = set_arg(prefix + written + suffix, value, *CTX)
    assert out == prefix + ([f"{name}={value}"] if eq else [name, value]) + suffix


@given(args=arg_lists(names=("--max-model-len", "--context")), value=VALUES, slots=VALUES)
def test_absent_flags_are_appended(args, value, slots):
    assume(get_arg(args, *CTX) is None and get_arg(args, *PARALLEL) is None)
    out = set_arg(set_arg(args, value, *CTX), slots, *PARALLEL)
    assert out == args + ["--ctx-size", value, "--parallel", slots]


@given(args=arg_lists(junk=True), value=VALUES, slots=VALUES)
def test_both_llamacpp_flags_round_trip_together(args, value, slots):
    out = set_arg(set_arg(args, value, *CTX), slots, *PARALLEL)
    assert (get_arg(out, *CTX), get_arg(out, *PARALLEL)) == (value, slots)


@given(args=arg_lists(junk=True), names=NAME_SETS, value=VALUES)
def test_setting_twice_is_setting_once(args, names, value):
    once = set_arg(args, value, *names)
    assert set_arg(once, value, *names) == once


def test_the_last_occurrence_wins_as_in_the_engines():
    args = ["-c", "1024", "--ctx-size=2048"]
    assert get_arg(args, *CTX) == "2048"
    assert set_arg(args, "4096", *CTX) == ["-c", "1024", "--ctx-size=4096"]


def test_a_flag_without_its_value_is_not_read():
    assert get_arg(["--ctx-size"], *CTX) is None
    assert set_arg(["--ctx-size"], "8", *CTX) == ["--ctx-size", "--ctx-size", "8"]


def test_a_longer_flag_with_the_same_start_is_another_flag():
    args = ["--ctx-size-draft", "512", "-cd", "256"]
    assert get_arg(args, *CTX) is None
    assert set_arg(args, "8192", *CTX) == args + ["--ctx-size", "8192"]


def test_a_flag_is_never_taken_for_another_flags_value():
    args = ["-np", "--ctx-size", "4096"]  # -np lost its value
    assert get_arg(args, *CTX) == "4096" and get_arg(args, *PARALLEL) is None
    assert set_arg(args, "2", *PARALLEL) == args + ["--parallel", "2"]
    assert get_arg(["--seed", "-1"], "--seed") == "-1"  # a negative number is a value
