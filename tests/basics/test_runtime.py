import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest
from helpers.tiny_models import small_qwen2

from alignment.algo.logprobs import token_logprobs
from alignment.models.modeling import completion_logits, load_causal_lm, make_token_batch, save_model
from alignment.basics.runtime import contiguous_kernels, transparent_huge_pages_mode


def stride_kernels_on() -> bool:
    return paddle.get_flags(["FLAGS_use_stride_kernel"])["FLAGS_use_stride_kernel"]


def test_contiguous_kernels_are_scoped():
    before = stride_kernels_on()
    with contiguous_kernels():
        assert not stride_kernels_on()
    assert stride_kernels_on() == before


def test_gradient_with_contiguous_kernels_equals_the_default():
    model = small_qwen2(vocab_size=64, seed=5)
    batch = make_token_batch([[3, 4, 5], [6, 7]], np.array([[8, 9, 10], [11, 12, 0]]), np.array([[1, 1, 1], [1, 1, 0]], np.float32), 0)

    def gradient():
        token_logprobs(completion_logits(model, batch), batch.completion_ids).sum().backward()
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        model.clear_gradients()
        return grads

    default = gradient()
    with contiguous_kernels():
        contiguous = gradient()
    for a, b in zip(default, contiguous):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_saved_model_reloads_with_identical_logits_even_under_contiguous_kernels(tmp_path):
    # paddleformers' default (flex-checkpoint) save_pretrained writes corrupt weights under contiguous
    # kernels; save_model's format does not, and this holds it to an exact round trip.
    model = small_qwen2(vocab_size=64, seed=5)
    model.eval()
    with contiguous_kernels():
        save_model(model, str(tmp_path))
    reloaded = load_causal_lm(str(tmp_path))
    reloaded.eval()
    ids = paddle.to_tensor([[1, 2, 3, 4, 5, 6]])
    np.testing.assert_array_equal(model(ids)[0].numpy(), reloaded(ids)[0].numpy())


# A child that frees and re-allocates a 256 MB block, writing every page each time, and prints the page faults the
# second allocation cost (the first one's pages were fresh either way).
REFAULT_PROBE = """
import ctypes, resource, sys
sys.path.insert(0, {repo!r})
from alignment.basics.runtime import configure_cpu_runtime
configure_cpu_runtime()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 256 << 20
block = libc.malloc(size)
ctypes.memset(block, 1, size)
libc.free(block)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctypes.memset(libc.malloc(size), 1, size)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def probe_output(probe: str, environment: dict) -> str:
    """A probe's stdout, run as `python -c` with this checkout on its path, in this environment without MALLOC_*
    variables, plus `environment`."""
    probe = probe.format(repo=str(Path(__file__).resolve().parents[2]))
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", probe], env={**env, **environment}, capture_output=True, text=True, check=True)
    return done.stdout


def refaults(environment: dict) -> int:
    return int(probe_output(REFAULT_PROBE, environment).split()[-1])


def test_freed_memory_is_reused_without_page_faults_unless_the_user_set_malloc():
    """configure_cpu_runtime keeps glibc's freed blocks for the next allocation (_keep_freed_memory): 256 MB freed and
    taken again costs no fresh page (a page is 4 KB: 65,536 faults otherwise); a MALLOC_*_ variable the user exported
    leaves glibc's default, which maps and faults the whole block again."""
    assert refaults({}) < 1000
    assert refaults({"MALLOC_ARENA_MAX_": "8"}) > 60000


# A child that says its pid, calls restart_with_huge_pages, then writes a 256 MB block and says its pid again, its
# GLIBC_TUNABLES and how much of its memory is on transparent huge pages.
HUGE_PAGES_PROBE = """
import os, sys
sys.path.insert(0, {repo!r})
print("pid", os.getpid(), flush=True)
from alignment.basics.runtime import restart_with_huge_pages
restart_with_huge_pages()
block = bytearray(256 << 20)
huge = next(int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages:"))
print("pid", os.getpid(), os.environ.get("GLIBC_TUNABLES"), huge << 10)
"""


def huge_pages_probe(tunables: str) -> list:
    return [line.split() for line in probe_output(HUGE_PAGES_PROBE, {"GLIBC_TUNABLES": tunables}).splitlines()]


def test_the_process_restarts_itself_once_on_huge_pages_keeping_its_pid_and_the_users_tunables():
    if transparent_huge_pages_mode() == "never":
        pytest.skip("this kernel gives no transparent huge pages (/sys/kernel/mm/transparent_hugepage/enabled: never)")
    started, again, done = huge_pages_probe("glibc.malloc.tcache_count=7")  # the first line twice: one restart
    assert started[1] == again[1] == done[1]  # exec: the same process
    assert done[2] == "glibc.malloc.tcache_count=7:glibc.malloc.hugetlb=1"
    assert int(done[3]) >= 128 << 20  # most of the 256 MB block on 2 MB pages


def test_a_user_who_set_the_tunable_keeps_4kb_pages_and_no_restart():
    started, done = huge_pages_probe("glibc.malloc.hugetlb=0")  # the first line once: no restart
    assert started[1] == done[1] and done[2] == "glibc.malloc.hugetlb=0"
    if transparent_huge_pages_mode() != "always":  # where the kernel gives them unasked, the block may be on them
        assert done[3] == "0"
