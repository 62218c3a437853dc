"""Declared models: loading the cluster's TOML file (SPEC §2.1)."""

import textwrap

import pytest
from django.core.management import CommandError, call_command

from catalog.models import Model, OriginFile, Profile

GOOD = """\
[[models]]
name = "mistral-7b"
context_length = 32768
max_output = 8192
origin = { repo = "mistralai/Mistral-7B-Instruct-v0.3", files = [ { path = "a.safetensors", size = 100 } ] }

[[models.profiles]]
name = "vllm-a10g"
engine = "vllm"
args = ["--max-model-len", "32768"]
gpu_class = "A10G"
gpus_per_node = 1

[[models.profiles]]
name = "cpu"
engine = "llamacpp"
cpu_only = true
args = ["-c", "32768"]

[[models]]
name = "tiny"
source = "tiny.gguf"
context_length = 2048
"""


@pytest.fixture
def cluster_file(tmp_path):
    def write(text):
        path = tmp_path / "cluster.toml"
        path.write_text(textwrap.dedent(text))
        return path

    return write


def snapshot():
    return (
        sorted(Model.objects.values_list("name", "context_length", "max_output", "declared", "source", "origin_repo")),
        sorted(Profile.objects.values_list("model__name", "name", "engine", "args", "gpu_class__name", "cpu_only")),
        sorted(OriginFile.objects.values_list("model__name", "path", "size")),
    )


@pytest.mark.django_db
def test_load_creates_declared_models_and_is_idempotent(cluster_file, capsys):
    path = cluster_file(GOOD)
    call_command("load_cluster", str(path))
    assert "created: mistral-7b, tiny" in capsys.readouterr().out
    first = snapshot()
    assert ("mistral-7b", 32768, 8192, True, "", "mistralai/Mistral-7B-Instruct-v0.3") in first[0]
    assert ("mistral-7b", "vllm-a10g", "vllm", ["--max-model-len", "32768"], "A10G", False) in first[1]
    assert first[2] == [("mistral-7b", "a.safetensors", 100)]

    call_command("load_cluster", str(path))
    assert "unchanged: mistral-7b, tiny" in capsys.readouterr().out
    assert snapshot() == first


@pytest.mark.django_db
def test_load_updates_what_changed_and_undeclares_what_left(cluster_file, capsys):
    call_command("load_cluster", str(cluster_file(GOOD)))
    changed = GOOD.replace('"-c", "32768"', '"-c", "16384"').split("[[models]]\nname = \"tiny\"")[0]
    call_command("load_cluster", str(cluster_file(changed)))
    out = capsys.readouterr().out
    assert "updated: mistral-7b" in out and "no longer declared: tiny" in out
    assert Profile.objects.get(model__name="mistral-7b", name="cpu").args == ["-c", "16384"]
    assert Model.objects.get(name="tiny").declared is False


@pytest.mark.django_db
def test_cluster_file_from_settings(cluster_file, settings):
    settings.LLMGW_CLUSTER_FILE = str(cluster_file(GOOD))
    call_command("load_cluster")
    assert Model.objects.filter(declared=True).count() == 2


BAD = [
    # (what is wrong, the text, the line named, words the error must contain)
    ("syntax", "[[models]]\nname = \n", 2, ["Invalid"]),
    ("unknown engine", GOOD.replace('engine = "vllm"', 'engine = "tgi"'), 9, ["vllm-a10g.engine", "'tgi'"]),
    ("unknown gpu class", GOOD.replace('gpu_class = "A10G"', 'gpu_class = "V100"'), 11, ["gpu_class", "V100"]),
    ("negative context", GOOD.replace("context_length = 2048", "context_length = -5"), 23, ["tiny.context_length", "at least 0"]),
    ("string context", GOOD.replace("context_length = 32768", 'context_length = "32k"'), 3, ["mistral-7b.context_length", "whole number"]),
    ("args not strings", GOOD.replace('args = ["-c", "32768"]', "args = [1, 2]"), 18, ["cpu.args", "list of strings"]),
    ("unknown field", GOOD.replace("gpus_per_node = 1", "gpus = 1"), 12, ["unknown field 'gpus'"]),
    ("duplicate model", GOOD.replace('name = "tiny"', 'name = "mistral-7b"'), 21, ["declared twice"]),
    ("answer over context", GOOD.replace("max_output = 8192", "max_output = 65536"), 4, ["does not fit a context of 32768"]),
    ("no source", GOOD.replace('source = "tiny.gguf"\n', ""), 20, ["needs a source"]),
    ("gpu profile without class", GOOD.replace('gpu_class = "A10G"\n', ""), 7, ["gpu_class or is cpu_only"]),
]


@pytest.mark.django_db
@pytest.mark.parametrize("what,text,line,words", BAD, ids=[b[0] for b in BAD])
def test_bad_file_names_line_and_field_and_changes_nothing(cluster_file, what, text, line, words):
    call_command("load_cluster", str(cluster_file(GOOD)))
    before = snapshot()
    path = cluster_file(text)
    with pytest.raises(CommandError) as e:
        call_command("load_cluster", str(path))
    message = str(e.value)
    assert f"{path}:{line}:" in message
    for word in words:
        assert word in message
    assert "nothing was changed" in message
    assert snapshot() == before


@pytest.mark.django_db
def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(CommandError, match="cannot read it"):
        call_command("load_cluster", str(tmp_path / "nope.toml"))
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe[[models]]")
    with pytest.raises(CommandError, match="not UTF-8"):
        call_command("load_cluster", str(bad))
    with pytest.raises(CommandError, match="no cluster file"):
        call_command("load_cluster")


@pytest.mark.django_db
def test_a_model_of_the_console_is_not_taken_over(cluster_file):
    Model.objects.create(name="tiny", source="other.gguf")
    with pytest.raises(CommandError, match="not declared"):
        call_command("load_cluster", str(cluster_file(GOOD)))
    assert Model.objects.get(name="tiny").source == "other.gguf"
    assert not Model.objects.filter(name="mistral-7b").exists()
