"""The context request's plain path (catalog.api.serializers.plain_context_request) accepts
only what ContextRequestSerializer accepts, and reads it the same way: on any body it
takes, the serializer is valid with the same data; anything else goes to the serializer."""

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.api.serializers import INT_MAX, INT_MIN, ContextRequestSerializer, plain_context_request

NUMBERS = st.one_of(
    st.integers(min_value=INT_MIN - 2, max_value=INT_MAX + 2),
    st.sampled_from([INT_MIN, INT_MAX, 0, 256, 8192]),
    st.booleans(),
    st.floats(allow_nan=True),
    st.text(max_size=5),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
MESSAGES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["why", " padded ", "two\nlines", "nul\x00", "\ud800", "x" * 2000, "x" * 2001, " " * 3, ""]),
    st.integers(),
    st.booleans(),
    st.none(),
)
BODIES = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "tokens": NUMBERS,
            "slots": NUMBERS,
            "max_output": NUMBERS,
            "message": MESSAGES,
            "dry_run": st.one_of(st.booleans(), st.integers(0, 1), st.text(max_size=5), st.none()),
            "extra": st.integers(),
        },
    ),
    st.lists(st.integers(), max_size=2),
    st.text(max_size=5),
    st.none(),
)


@settings(max_examples=2000, deadline=None)
@given(body=BODIES)
def test_the_plain_path_agrees_with_the_serializer(body):
    plain = plain_context_request(body)
    if plain is None:
        return  # the serializer decides, as for any request
    serializer = ContextRequestSerializer(data=body)
    assert serializer.is_valid(), (body, serializer.errors)
    assert dict(serializer.validated_data) == plain


def test_the_plain_path_takes_what_the_cli_sends():
    assert plain_context_request({"tokens": 32768, "slots": 2, "dry_run": True, "message": "more room"}) == {
        "tokens": 32768, "slots": 2, "max_output": 0, "message": "more room", "dry_run": True,
    }
    assert plain_context_request({}) == {"tokens": 0, "slots": 0, "max_output": 0, "message": "", "dry_run": False}
