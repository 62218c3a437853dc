"""Whether a node has room for a second copy of a replica during a restart (else: in place)."""

import pytest

from catalog.fleet import surge_possible
from catalog.models import GPUClass, Model, Node, Profile, Replica


@pytest.mark.django_db
def test_room_for_a_second_copy_per_profile_in_one_query(django_assert_num_queries):
    l4 = GPUClass.objects.get(name="L4")
    model = Model.objects.create(name="m")
    gpu2 = Profile.objects.create(model=model, name="gpu2", engine="vllm", gpu_class=l4, gpus_per_node=2)
    gpu1 = Profile.objects.create(model=model, name="gpu1", engine="vllm", gpu_class=l4, gpus_per_node=1)
    cpu = Profile.objects.create(model=model, name="cpu", engine="llamacpp", cpu_only=True, min_memory_gb=6)
    idle = Profile.objects.create(model=model, name="idle", engine="llamacpp", cpu_only=True, min_memory_gb=64)
    four_cards = Node.objects.create(name="l4x4", gpu_class=l4, gpu_count=4)
    box = Node.objects.create(name="box", ram_gb=16)
    Replica.objects.create(profile=gpu2, node=four_cards, state="ready")  # 2 cards taken
    Replica.objects.create(profile=gpu1, node=four_cards, state="ready")  # 3 taken: a second gpu2 copy needs 2
    Replica.objects.create(profile=gpu1, node=four_cards, state="stopped")  # does not count
    Replica.objects.create(profile=cpu, node=box, state="ready")
    with django_assert_num_queries(1):
        room = surge_possible([gpu2, gpu1, cpu, idle])
    assert room == {gpu2.id: False, gpu1.id: True, cpu.id: True, idle.id: True}
    Replica.objects.create(profile=cpu, node=box, state="draining")  # 12 of 16 GB taken
    assert surge_possible([cpu])[cpu.id] is False
