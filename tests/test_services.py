"""catalog.services: what a context change writes, when it queues its rollout, and what it refuses."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType

from catalog import services
from catalog.models import Change, Model, Profile
from tests.builders import make_model, use_shape

pytestmark = pytest.mark.django_db


@pytest.fixture
def model(monkeypatch):
    use_shape(monkeypatch)
    return make_model()


def history(model):
    ct = ContentType.objects.get_for_model(Model)
    return list(LogEntry.objects.filter(content_type=ct, object_id=str(model.pk)).order_by("id"))


def args_of(model):
    return {p.name: p.args for p in Profile.objects.filter(model=model)}


def test_request_change_writes_catalog_change_and_audit_and_enqueues_on_commit(
    model, operator, enqueued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        change = services.request_change(
            model.name, tokens=16384, slots=4, message="longer documents", user=operator, source="cli"
        )
        # Nothing is queued inside the transaction: a worker must not see an uncommitted change.
        assert enqueued == []
    for callback in callbacks:  # the commit
        callback()
    assert enqueued == [change.pk]

    model.refresh_from_db()
    assert model.context_length == 16384
    assert model.max_output == 4096  # it was the old context's default (a quarter): now the new one's
    args = args_of(model)
    assert args["gguf"][-4:] == ["--ctx-size", str(16384 * 4), "--parallel", "4"]
    assert args["vllm"][0] == "--max-model-len=16384"  # its '=' form is kept
    assert args["cpu"] == ["--ctx-size", str(16384 * 4), "--parallel", "4"]

    change.refresh_from_db()
    assert (change.state, change.kind, change.source, change.user, change.message) == (
        "queued",
        "context",
        "cli",
        operator,
        "longer documents",
    )
    assert change.request == {"tokens": 16384, "slots": 4, "max_output": 0}
    assert change.before["context_length"] == 8192 and change.after["context_length"] == 16384
    assert change.before["profiles"]["gguf"]["args"][-3] == str(8192 * 2)
    assert change.after["profiles"]["gguf"]["args"] == args["gguf"]
    assert change.after["profiles"]["gguf"]["memory"].endswith("usable")
    assert change.plan["context_after"] == 16384 and change.plan["ok"] is True
    assert change.steps.count() == 0  # the fleet helper's rollout writes those

    (entry,) = history(model)
    assert entry.user == operator
    text = entry.get_change_message()
    assert "operator via CLI" in text and "8192 → 16384" in text and "longer documents" in text


def test_a_longest_answer_of_its_own_is_kept_and_held_to_the_context(monkeypatch, operator, enqueued):
    use_shape(monkeypatch)
    model = make_model(context=8192, max_output=1000)
    services.request_change(model.name, tokens=16384, user=operator, source="api")
    model.refresh_from_db()
    assert model.max_output == 1000
    Change.objects.update(state="succeeded")
    services.request_change(model.name, tokens=512, user=operator, source="api")
    model.refresh_from_db()
    assert model.max_output == 512


def test_cpu_only_profile_gets_its_new_memory(model, operator, enqueued):
    before = Profile.objects.get(model=model, name="cpu").min_memory_gb
    change = services.request_change(model.name, tokens=32768, slots=1, user=operator, source="api")
    after = Profile.objects.get(model=model, name="cpu").min_memory_gb
    # 16 GiB weights + 32768 × 128 KiB (4 GiB) + 1 GiB + weights/20 (0.8 GiB): 22 GB, rounded up.
    assert (before, after) == (20, 22)
    assert change.before["profiles"]["cpu"]["min_memory_gb"] == 20
    assert change.after["profiles"]["cpu"]["min_memory_gb"] == 22
    assert change.after["profiles"]["cpu"]["memory"] == "22 GB of RAM"


def test_refused_change_writes_only_its_audit_row(model, operator, enqueued, django_capture_on_commit_callbacks):
    before_args = args_of(model)
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(services.Refused) as refused:
            services.request_change(model.name, tokens=65536, message="try", user=operator, source="api")
    assert enqueued == []
    assert refused.value.status == 400 and refused.value.field == "tokens"
    assert refused.value.message.startswith("llama-8b was trained for 32768 tokens")
    assert refused.value.plan.refusal is not None

    model.refresh_from_db()
    assert (model.context_length, model.max_output) == (8192, 2048)
    assert args_of(model) == before_args
    (row,) = Change.objects.filter(model=model)
    assert row == refused.value.change
    assert (row.state, row.user, row.message, row.error) == ("refused", operator, "try", refused.value.message)
    assert row.request["tokens"] == 65536 and row.plan["ok"] is False
    (entry,) = history(model)
    assert "refused" in entry.get_change_message() and "trained for 32768" in entry.get_change_message()


def test_a_card_that_does_not_hold_it_is_refused(model, operator, enqueued):
    with pytest.raises(services.Refused) as refused:
        services.request_change(model.name, tokens=32768, slots=64, user=operator, source="api")
    assert "the gguf profile needs" in refused.value.message and "A100-80G" in refused.value.message
    assert Model.objects.get(pk=model.pk).context_length == 8192


def test_declared_model_is_refused_with_the_seed_message(monkeypatch, operator, enqueued):
    use_shape(monkeypatch)
    model = make_model("declared-1", declared=True)
    with pytest.raises(services.Refused, match="is declared in the cluster's settings: change its context there"):
        services.request_change(model.name, tokens=4096, user=operator, source="api")


def test_max_output_only_changes_the_catalog_and_is_done_at_once(model, operator, enqueued, django_capture_on_commit_callbacks):
    before_args = args_of(model)
    with django_capture_on_commit_callbacks(execute=True):
        change = services.request_change(model.name, max_output=4000, message="longer answers", user=operator, source="api")
    assert enqueued == []
    assert (change.kind, change.state) == ("max_output", "succeeded")
    assert change.finished_at is not None
    model.refresh_from_db()
    assert (model.context_length, model.max_output) == (8192, 4000)
    assert args_of(model) == before_args
    assert change.before["max_output"] == 2048 and change.after["max_output"] == 4000
    (entry,) = history(model)
    assert "2048 → 4000" in entry.get_change_message()


def test_max_output_past_the_context_is_refused(model, operator, enqueued):
    with pytest.raises(services.Refused, match="change the context with it") as refused:
        services.request_change(model.name, max_output=9000, user=operator, source="api")
    assert refused.value.field == "max_output"
    assert Model.objects.get(pk=model.pk).max_output == 2048


def test_a_second_change_while_one_is_queued_is_a_conflict(model, operator, enqueued):
    first = services.request_change(model.name, tokens=16384, user=operator, source="api")
    with pytest.raises(services.Conflict) as conflict:
        services.request_change(model.name, tokens=4096, user=operator, source="api")
    assert conflict.value.status == 409 and conflict.value.change == first
    # A longest-answer change waits for it too: the catalog is being rolled out.
    with pytest.raises(services.Conflict):
        services.request_change(model.name, max_output=100, user=operator, source="api")
    assert Model.objects.get(pk=model.pk).context_length == 16384
    assert Change.objects.filter(model=model).count() == 1

    Change.objects.filter(pk=first.pk).update(state="succeeded")
    services.request_change(model.name, tokens=4096, user=operator, source="api")


def test_the_database_constraint_is_a_conflict_too(model, operator, enqueued, monkeypatch):
    """Were the check before it to miss (another transaction's row not yet visible), the
    partial unique index still says no, and the caller gets a Conflict, not an error."""
    other = Change.objects.create(model=model, kind="context", state="running", source="api")
    calls = []

    def active(model_id):
        calls.append(model_id)
        return None if len(calls) == 1 else other

    monkeypatch.setattr(services, "_active_change", active)
    with pytest.raises(services.Conflict) as conflict:
        services.request_change(model.name, tokens=16384, user=operator, source="api")
    assert conflict.value.change == other
    assert Model.objects.get(pk=model.pk).context_length == 8192  # rolled back with the failed insert


def test_rollback_goes_back_to_before(model, operator, enqueued):
    change = services.request_change(model.name, tokens=16384, max_output=3000, user=operator, source="api")
    Change.objects.filter(pk=change.pk).update(state="failed")
    back = services.rollback(change.pk, user=operator, source="console", message="it failed")
    assert (back.kind, back.state, back.rollback_of, back.source) == ("rollback", "queued", change, "console")
    change.refresh_from_db()
    assert change.state == "rolled_back"
    # It kept each profile's --parallel, and so does its rollback.
    assert back.request == {"tokens": 8192, "slots": 0, "max_output": 2048}
    assert back.message == "it failed"
    model.refresh_from_db()
    assert (model.context_length, model.max_output) == (8192, 2048)
    args = args_of(model)
    assert args["gguf"][-4:] == ["--ctx-size", str(8192 * 2), "--parallel", "2"]
    assert args["cpu"] == ["--ctx-size", "8192", "--parallel", "1"]
    assert args["vllm"][0] == "--max-model-len=8192"
    assert enqueued == []  # on commit, and this test's transaction never commits


def test_rollback_of_a_change_of_slots_sets_them_back(monkeypatch, operator, enqueued):
    use_shape(monkeypatch)
    model = make_model()
    Profile.objects.filter(model=model, name="cpu").update(args=["--ctx-size", "16384", "--parallel", "2"])
    change = services.request_change(model.name, tokens=4096, slots=8, user=operator, source="api")
    assert args_of(model)["gguf"][-4:] == ["--ctx-size", str(4096 * 8), "--parallel", "8"]
    Change.objects.filter(pk=change.pk).update(state="succeeded")
    back = services.rollback(change.pk, user=operator, source="api")
    assert back.request["slots"] == 2 and back.message == f"roll back change {change.pk}"
    assert args_of(model)["gguf"][-4:] == ["--ctx-size", str(8192 * 2), "--parallel", "2"]


def test_rollback_of_a_max_output_change_is_done_at_once(model, operator, enqueued):
    change = services.request_change(model.name, max_output=4000, user=operator, source="api")
    back = services.rollback(change.pk, user=operator, source="api")
    assert (back.kind, back.state) == ("rollback", "succeeded")
    assert Model.objects.get(pk=model.pk).max_output == 2048
    change.refresh_from_db()
    assert change.state == "rolled_back"


def test_rollback_of_nothing(model, operator, enqueued):
    with pytest.raises(services.NotFound):
        services.rollback(999999, user=operator, source="api")
    with pytest.raises(services.Refused):
        services.request_change(model.name, tokens=100, user=operator, source="api")
    refused = Change.objects.get(model=model, state="refused")
    with pytest.raises(services.ServiceError) as error:
        services.rollback(refused.pk, user=operator, source="api")
    assert error.value.status == 400


def test_without_the_permission_nothing_is_written(model, viewer, enqueued):
    assert not services.can_change_context(viewer)
    for kwargs in ({"tokens": 16384}, {"tokens": 100}, {"max_output": 100}):
        with pytest.raises(services.Forbidden) as forbidden:
            services.request_change(model.name, **kwargs, user=viewer, source="api")
        assert forbidden.value.status == 403
    with pytest.raises(services.Forbidden):
        services.request_change(model.name, tokens=16384, user=None, source="api")
    assert Change.objects.count() == 0 and history(model) == []
    model.refresh_from_db()
    assert model.context_length == 8192


def test_superuser_and_operator_may(admin_user, operator, viewer):
    assert services.can_change_context(admin_user)
    assert services.can_change_context(operator)
    assert not services.can_change_context(viewer)


def test_no_such_model(operator, enqueued):
    with pytest.raises(services.NotFound, match="no model 'nope' in the catalog"):
        services.request_change("nope", tokens=4096, user=operator, source="api")
    with pytest.raises(services.NotFound):
        services.preview("nope", tokens=4096)
    assert Change.objects.count() == 0


def test_preview_writes_nothing(model):
    plan = services.preview(model.name, tokens=16384, slots=2)
    assert plan.ok and plan.context_after == 16384
    assert {p.profile for p in plan.profiles} == {"gguf", "vllm", "cpu"}
    refused = services.preview(model.name, tokens=65536)
    assert refused.refusal.field == "tokens"
    assert Change.objects.count() == 0
    assert Model.objects.get(pk=model.pk).context_length == 8192


def test_model_input_costs_only_the_fleets_query_once_prefetched(model, django_assert_num_queries):
    loaded = services._models_for_planning().get(pk=model.pk)
    with django_assert_num_queries(1):  # room for a second copy, for every profile at once
        mi = services.model_input(loaded)
    assert [p.name for p in mi.profiles] == ["cpu", "gguf", "vllm"]
    assert mi.profiles[1].gpu_class.name == "A100-80G"


def test_a_shape_that_cannot_be_read_is_said_once_and_the_change_proceeds(monkeypatch, operator, enqueued):
    use_shape(monkeypatch, None, "its header could not be read (timed out), so the memory it needs is not checked")
    model = make_model()
    change = services.request_change(model.name, tokens=65536, user=operator, source="api")
    assert change.state == "queued"
    assert change.plan["notes"] == ["its header could not be read (timed out), so the memory it needs is not checked"]


def test_a_broker_down_leaves_the_change_queued_for_the_sweeper(model, operator, monkeypatch, caplog, django_capture_on_commit_callbacks):
    from kombu.exceptions import OperationalError

    from catalog import tasks

    def down(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(tasks.rollout, "apply_async", down)
    with django_capture_on_commit_callbacks(execute=True):
        change = services.request_change(model.name, tokens=16384, user=operator, source="api")
    change.refresh_from_db()
    assert change.state == "queued"
    assert f"change {change.pk}: the rollout could not be queued now" in caplog.text


def test_the_rollout_is_queued_with_the_change_id(model, operator, monkeypatch, django_capture_on_commit_callbacks):
    from catalog import tasks

    sent = []
    monkeypatch.setattr(tasks.rollout, "apply_async", lambda args, **kw: sent.append(args))
    with django_capture_on_commit_callbacks(execute=True):
        change = services.request_change(model.name, tokens=16384, user=operator, source="api")
    assert sent == [(change.pk,)]


def test_a_shape_reader_that_fails_is_a_note_not_an_error(monkeypatch, operator, enqueued):
    import catalog.shapes

    def broken(model):
        raise OSError("mirror unreachable")

    monkeypatch.setattr(catalog.shapes, "shape_of", broken)
    model = make_model()
    plan = services.preview(model.name, tokens=16384)
    assert plan.ok and plan.notes == ("its shape could not be read (mirror unreachable), so the memory it needs is not checked",)


def test_an_unknown_source_is_a_programming_error(model, operator, enqueued):
    with pytest.raises(ValueError, match="unknown source"):
        services.request_change(model.name, tokens=16384, user=operator, source="email")
    assert Change.objects.count() == 0


def test_the_admin_history_of_the_model_shows_who_what_and_why(model, operator, admin_user, client, enqueued):
    from django.urls import reverse

    services.request_change(model.name, tokens=16384, message="longer documents", user=operator, source="cli")
    Change.objects.update(state="succeeded")
    with pytest.raises(services.Refused):
        services.request_change(model.name, tokens=100, message="tiny", user=operator, source="api")
    client.force_login(admin_user)
    page = client.get(reverse("admin:catalog_model_history", args=[model.pk])).content.decode()
    assert "context 8192 → 16384" in page and "by operator via CLI" in page and "why: longer documents" in page
    assert "refused context change" in page and "a context of at least 256 tokens" in page and "why: tiny" in page
